"""LeRobot 0.6's metadata surface on top of vlafeed's engine objects.

What a LeRobot training script touches on ``dataset.meta`` and on the dataset
itself, with LeRobot's names, types and dtypes (lerobot-format.md):

- ``features``: info.json's features (dtype, shape as a tuple, names, info),
  so ``lerobot.policies.utils.dataset_to_policy_features`` works on them;
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
import json
import os
import pathlib
import urllib.parse
import urllib.request

import numpy as np

DEFAULT_CHUNK_SIZE = 1000


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


def lerobot_features(info_json, native_features):
    """info.json's features with LeRobot's keys; shapes as tuples."""
    out = {}
    raw = (info_json or {}).get("features", {})
    for name, f in native_features.items():
        src = raw.get(name, {})
        ft = {"dtype": f["dtype"], "shape": tuple(f["shape"]), "names": src.get("names")}
        if "info" in src:
            ft["info"] = src["info"]
        ft["kind"] = f.get("kind")
        out[name] = ft
    return out


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
