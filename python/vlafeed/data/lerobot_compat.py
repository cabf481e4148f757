"""LeRobot 0.6's metadata surface on top of vlafeed's engine objects.

What a LeRobot training script touches on ``dataset.meta`` and on the dataset
itself, with LeRobot's names, types and dtypes (lerobot-format.md):

- ``info``: info.json as LeRobot's ``DatasetInfo`` (``DatasetInfo`` here),
  ``features`` its features (dtype, shape as a tuple, names, info), so
  ``lerobot.policies.utils.dataset_to_policy_features`` works on them;
- ``tasks``: a pandas DataFrame indexed by the task string, column
  ``task_index``; ``episodes``: the full episodes table with LeRobot's
  column names (stats columns dropped, as LeRobot's loader drops them);
- ``stats`` with LeRobot's dtypes (``count`` and integer features' min/max
  as int64, the rest float64);
- ``robot_type``, ``repo_id``, ``revision``, ``chunks_size``, ``data_path``,
  ``video_path``, ``get_data_file_path``, ``get_video_file_path``,
  ``get_task_index``.

repo_id resolution (no Hub access here): a path or URL is the root itself; a
plain id is looked up under $HF_LEROBOT_HOME (default
~/.cache/huggingface/lerobot) and otherwise refused with a clear error.
"""
import copy
import dataclasses
import json
import os
import pathlib
import urllib.parse
import urllib.request

import numpy as np

# LeRobot 0.6's constants (lerobot/datasets/utils.py, language.py, configs/video.py).
CODEBASE_VERSION = "v3.0"
DEFAULT_CHUNK_SIZE = 1000
DEFAULT_DATA_FILE_SIZE_IN_MB = 100
DEFAULT_VIDEO_FILE_SIZE_IN_MB = 200
DEFAULT_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DEFAULT_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
LANGUAGE_COLUMNS = ("language_persistent", "language_events")
DEPTH_UNITS = ("m", "mm")
DEFAULT_DEPTH_UNIT = "mm"
DEFAULT_TOOLS = [{
    "type": "function",
    "function": {
        "name": "say",
        "description": "Speak a short utterance to the user via the TTS executor.",
        "parameters": {"type": "object",
                       "properties": {"text": {"type": "string", "description": "The verbatim text to speak."}},
                       "required": ["text"]},
    },
}]


@dataclasses.dataclass
class DatasetInfo:
    """meta/info.json as LeRobot 0.6's ``DatasetInfo``: the same fields, defaults and
    ``to_dict()``; attribute access (``info.fps``) and dict access (``info["fps"]``,
    ``"fps" in info``, ``info.get``) both work, as in LeRobot (without its deprecation
    warning). Keys LeRobot does not model (v2.1's ``total_videos``, ...) are kept apart:
    readable like the fields, left out of ``to_dict()`` as LeRobot drops them, and in
    ``as_json()`` (the file's whole content)."""

    codebase_version: str
    fps: int
    features: dict
    total_episodes: int = 0
    total_frames: int = 0
    total_tasks: int = 0
    chunks_size: int = DEFAULT_CHUNK_SIZE
    data_files_size_in_mb: int = DEFAULT_DATA_FILE_SIZE_IN_MB
    video_files_size_in_mb: int = DEFAULT_VIDEO_FILE_SIZE_IN_MB
    data_path: str = DEFAULT_DATA_PATH
    video_path: str = DEFAULT_VIDEO_PATH
    robot_type: str = None
    splits: dict = dataclasses.field(default_factory=dict)
    tools: list = None

    def __post_init__(self):
        for ft in self.features.values():
            if isinstance(ft.get("shape"), list):
                ft["shape"] = tuple(ft["shape"])
        object.__setattr__(self, "_extra", {})

    @classmethod
    def from_json(cls, raw, native=None):
        """From info.json's dict; where there is none (an s3:// root, whose JSON the engine reads
        itself), from the engine's view of it."""
        raw = copy.deepcopy(raw) if isinstance(raw, dict) else {}
        if not isinstance(raw.get("features"), dict):  # damaged: the engine's view (it opened the dataset)
            raw.pop("features", None)
        if native is not None:
            raw.setdefault("codebase_version", native.info().get("codebase_version") or CODEBASE_VERSION)
            raw.setdefault("fps", native.fps)
            raw.setdefault("features", {name: {"dtype": f["dtype"], "shape": list(f["shape"]), "names": None}
                                        for name, f in native.features.items()})
            raw.setdefault("total_episodes", native.total_episodes)
            raw.setdefault("total_frames", native.total_frames)
            raw.setdefault("total_tasks", len(native.tasks))
        known = {f.name for f in dataclasses.fields(cls)}
        info = cls(**{k: v for k, v in raw.items() if k in known})
        info._extra.update({k: v for k, v in raw.items() if k not in known})
        return info

    def __getattr__(self, name):  # only for names that are not fields: the file's other keys
        extra = self.__dict__.get("_extra", {})
        if name in extra:
            return extra[name]
        raise AttributeError(f"info.json has no key {name!r}")

    def to_dict(self):
        """LeRobot's: the fields as a JSON-ready dict (shapes as lists, tools dropped when unset)."""
        d = dataclasses.asdict(self)
        for ft in d["features"].values():
            if isinstance(ft.get("shape"), tuple):
                ft["shape"] = list(ft["shape"])
        if d.get("tools") is None:
            d.pop("tools", None)
        return d

    def as_json(self):
        """info.json's whole content: the fields plus the keys LeRobot does not model."""
        return {**self.to_dict(), **copy.deepcopy(self._extra)}

    def __getitem__(self, key):
        try:
            return getattr(self, key)
        except AttributeError as err:
            raise KeyError(key) from err

    def __setitem__(self, key, value):
        if not hasattr(self, key):
            raise KeyError(f"DatasetInfo has no field '{key}'")
        if key in self._extra:
            self._extra[key] = value
        else:
            setattr(self, key, value)

    def __contains__(self, key):
        return hasattr(self, key)

    def get(self, key, default=None):
        try:
            return getattr(self, key)
        except AttributeError:
            return default

    def keys(self):
        return list(self.as_json())


def write_info(info, root):
    """meta/info.json from a DatasetInfo, as LeRobot's write_info writes it (``to_dict()``, indent 4)."""
    path = pathlib.Path(root) / "meta" / "info.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(info.to_dict(), f, indent=4, ensure_ascii=False)


def refuse_hub_only(repo_type="dataset", force_cache_sync=False, **ignored):
    """A clear error for LeRobot keywords that only mean something with Hub access."""
    if repo_type not in ("dataset", "bucket"):
        raise ValueError(f"repo_type must be 'dataset' or 'bucket', got {repo_type!r}")
    if repo_type == "bucket":
        raise NotImplementedError("repo_type='bucket' streams from a Hugging Face Storage Bucket; vlafeed does not "
                                  "reach the Hub: pass root= with a local folder or an http(s):// or s3:// URL")
    if force_cache_sync:
        raise NotImplementedError("force_cache_sync=True re-downloads the dataset from the Hugging Face Hub, which "
                                  "vlafeed does not do; it reads the files at root as they are")


def root_path(root):
    """LeRobot's root type: a pathlib.Path; a URL stays a str (a Path would fold its //)."""
    if root is None or is_url(os.fspath(root)):
        return root
    return pathlib.Path(root)


def is_depth_feature(ft):
    info = ft.get("info") or {}
    video_info = ft.get("video_info") or {}
    return bool(info.get("is_depth_map", False) or info.get("video.is_depth_map", False)
                or video_info.get("video.is_depth_map", False))


def check_depth_unit(unit):
    if unit not in DEPTH_UNITS:
        raise ValueError(f"depth_output_unit must be one of {DEPTH_UNITS}, got {unit!r}")


def is_url(text):
    return isinstance(text, str) and "://" in text


def lerobot_home():
    return pathlib.Path(os.environ.get("HF_LEROBOT_HOME", pathlib.Path.home() / ".cache/huggingface/lerobot"))


def resolve_root(repo_id, root):
    """(root string, repo_id) from LeRobot's (repo_id, root) arguments."""
    if root is not None:
        return os.fspath(root), repo_id
    if repo_id is None:
        raise TypeError("LeRobotDataset needs a root (a dataset folder or URL) or a repo_id")
    if isinstance(repo_id, os.PathLike) or is_url(repo_id) or os.path.isdir(str(repo_id)):
        return os.fspath(repo_id), None
    local = lerobot_home() / str(repo_id)
    if (local / "meta" / "info.json").is_file():
        return str(local), repo_id
    raise FileNotFoundError(
        f"repo_id {repo_id!r}: no local copy at {local} (vlafeed does not download from the Hugging Face Hub; "
        f"pass root= with the dataset folder or an http(s):// or s3:// URL)")


def read_json(root, rel):
    if is_url(root):
        url = root.rstrip("/") + "/" + rel
        if url.startswith("s3://"):
            return None  # the engine reads s3 itself; the raw JSON is not needed for loading
        with urllib.request.urlopen(url, timeout=60) as r:  # noqa: S310 - the caller's own dataset URL
            return json.loads(r.read())
    path = pathlib.Path(root) / rel
    with open(path, "rb") as f:  # the engine's open already refused non-regular files
        return json.loads(f.read())


def lerobot_stats(native_stats, features):
    out = {}
    for feature, per in native_stats.items():
        dtype = (features.get(feature) or {}).get("dtype", "float32")
        integer = dtype.startswith("int") or dtype.startswith("uint") or dtype == "bool"
        out[feature] = {}
        for name, values in per.items():
            arr = np.asarray(values, dtype=np.float64)
            if name == "count" or (integer and name in ("min", "max")):
                arr = arr.astype(np.int64)
            out[feature][name] = arr
    return out


class EpisodesTable:
    """The episodes table as LeRobot's ``meta.episodes`` offers it: column
    access (``table["dataset_from_index"]`` -> list), row access
    (``table[i]`` -> dict), ``len``, iteration over rows, ``column_names``,
    ``to_pandas()``."""

    def __init__(self, columns):
        self._columns = columns
        self._len = len(next(iter(columns.values()))) if columns else 0

    @property
    def column_names(self):
        return list(self._columns)

    @property
    def num_rows(self):
        return self._len

    def __len__(self):
        return self._len

    def __getitem__(self, key):
        if isinstance(key, str):
            if key not in self._columns:
                raise KeyError(f"meta.episodes has no column {key!r} (columns: {', '.join(self._columns)})")
            return list(self._columns[key])
        if isinstance(key, slice):
            return {k: list(v[key]) for k, v in self._columns.items()}
        i = int(key)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"episode row {key} out of range ({self._len} episodes)")
        return {k: v[i] for k, v in self._columns.items()}

    def __iter__(self):
        for i in range(self._len):
            yield self[i]

    def to_pandas(self):
        import pandas as pd
        return pd.DataFrame(self._columns)

    def __repr__(self):
        return f"EpisodesTable(num_rows={self._len}, columns={self.column_names})"


def _remote_episode_files(root, chunks_size):
    """Columns of each meta/episodes/chunk-CCC/file-FFF.parquet of a remote v3.0 root, read through
    the engine's HTTP/S3 layer. A remote root cannot be listed portably, so the files are taken in
    LeRobot's order (file_index rolls into the next chunk at chunks_size) until one is absent."""
    from vlafeed import _native
    out = []
    chunk = 0
    while True:
        found = 0
        for i in range(max(1, int(chunks_size))):
            url = f"{root.rstrip('/')}/meta/episodes/chunk-{chunk:03d}/file-{i:03d}.parquet"
            try:
                out.append(_native.parquet_read(url))
            except FileNotFoundError:
                break
            found += 1
        if found == 0:
            return out
        chunk += 1


def episodes_table(root, info_json, native_all_episodes):
    """The full table: from meta/episodes/*.parquet (v3, local or remote) with stats
    columns dropped, else from the engine's view with LeRobot's names."""
    info_json = info_json or {}
    if is_url(root) and info_json.get("codebase_version", "").startswith("v3"):
        files = _remote_episode_files(root, info_json.get("chunks_size", DEFAULT_CHUNK_SIZE))
        if files:
            keep = [c for c in files[0] if not c.startswith("stats/")]
            return EpisodesTable({c: [v for f in files for v in f.get(c, [None] * len(next(iter(f.values()))))]
                                  for c in keep})
    if not is_url(root) and info_json.get("codebase_version", "").startswith("v3"):
        import pyarrow.parquet as pq
        files = sorted((pathlib.Path(root) / "meta" / "episodes").glob("*/*.parquet"))
        if files:
            import pyarrow as pa
            tables = [pq.read_table(f) for f in files]
            table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
            keep = [c for c in table.column_names if not c.startswith("stats/")]
            return EpisodesTable({c: table.column(c).to_pylist() for c in keep})
    cols = {"episode_index": [], "length": [], "dataset_from_index": [], "dataset_to_index": []}
    for e in native_all_episodes:
        cols["episode_index"].append(e["episode_index"])
        cols["length"].append(e["length"])
        cols["dataset_from_index"].append(e["from_index"])
        cols["dataset_to_index"].append(e["to_index"])
    return EpisodesTable(cols)


def tasks_frame(task_strings):
    import pandas as pd
    return pd.DataFrame({"task_index": np.arange(len(task_strings), dtype=np.int64)},
                        index=pd.Index(list(task_strings), name="task"))


def format_path(template, **values):
    return template.format(**values)


def aggregate_feature_stats(stats_ft_list):
    """One feature's statistics over several parts (LeRobot's): min of mins, max of maxes, the
    count-weighted mean, the pooled std (parallel variance), summed counts, count-weighted
    quantiles (q01, ...) where every part has them."""
    means = np.stack([s["mean"] for s in stats_ft_list])
    variances = np.stack([s["std"] ** 2 for s in stats_ft_list])
    counts = np.stack([s["count"] for s in stats_ft_list])
    total_count = counts.sum(axis=0)
    while counts.ndim < means.ndim:
        counts = np.expand_dims(counts, axis=-1)
    total_mean = (means * counts).sum(axis=0) / total_count
    total_variance = ((variances + (means - total_mean) ** 2) * counts).sum(axis=0) / total_count
    out = {"min": np.min(np.stack([s["min"] for s in stats_ft_list]), axis=0),
           "max": np.max(np.stack([s["max"] for s in stats_ft_list]), axis=0),
           "mean": total_mean, "std": np.sqrt(total_variance), "count": total_count}
    for q_key in [k for k in stats_ft_list[0] if k.startswith("q") and k[1:].isdigit()]:
        if all(q_key in s for s in stats_ft_list):
            out[q_key] = (np.stack([s[q_key] for s in stats_ft_list]) * counts).sum(axis=0) / total_count
    return out


def aggregate_stats(stats_list):
    """LeRobot's aggregate_stats: aggregate_feature_stats per feature, features in first-seen order."""
    keys = []
    for stats in stats_list:
        keys += [k for k in stats if k not in keys]
    return {k: aggregate_feature_stats([s[k] for s in stats_list if k in s]) for k in keys}
