"""WebDataset shards as a Ray Data dataset, decoded by vlafeed's C shard
reader inside each read task (exported as ``vlafeed.ray.WdsDatasource`` and
``vlafeed.ray.read_wds``).

    import ray, vlafeed.ray
    source = vlafeed.ray.WdsDatasource("/data/wds/shards/manifest.jsonl", shards_per_task=4)
    source.meta["num_samples"], source.meta["fields"]
    ds = ray.data.read_datasource(source)          # or vlafeed.ray.read_wds(manifest, ...)
    for batch in ds.iter_torch_batches(batch_size=64, collate_fn=vlafeed.ray.TorchCollate()):
        batch["top_t0"]                            # uint8 [64, H, W, 3]

What happens where:

- On the driver, a relative manifest path is made absolute (the tasks run in
  worker processes with their own working directory), and the constructor
  reads the manifest and the first sample of the first non-empty shard (to
  learn the fields and the decoded size of a row); nothing else. Every task
  delivers those fields (or ``fields=``), so all blocks have the same
  columns and a task whose first shard is missing or damaged is handled by
  ``on_error`` like any other. The read tasks are runs of ``shards_per_task``
  consecutive shards in manifest order; each task's BlockMetadata carries
  its rows (the manifest's ``num_sequences``), its decoded size in bytes
  (rows x the first sample's decoded bytes) and its shard files.
- Each read task lists its shards (by their resolved path or URL) in a
  private manifest and runs ``vlafeed.ShardLoader`` over it with rank 0 of 1
  pinned, no shuffle (Ray shuffles blocks or rows itself:
  ``random_shuffle``, ``local_shuffle_buffer_size``), ``output="numpy"``.
  Each engine batch of at most ``rows_per_block`` samples becomes an Arrow
  table: images and ``.npy`` / ``.npz`` arrays as fixed-shape tensor
  columns over the batch memory, string ``.npy`` arrays as str (0-d) or
  lists of str, as ShardLoader reads them (an object ``.npy`` needs pickle
  and is refused as bad input, naming the shard, key and field), ``.cls``
  as int64, ``.txt``, ``__key__``
  and ``__shard__`` as strings, ``.json`` fields as their JSON text (Arrow
  has no column type for arbitrary JSON values), ``.pth`` as the
  serialized bytes (``torch.save`` of what ``torch.load`` read, so
  ``torch.load(io.BytesIO(row[field]), weights_only=True)`` gives it back).
- Every sample is read exactly once per pass over the dataset (Ray re-runs a
  failed task whole, so a retried task's rows are not repeated: the failed
  attempt's blocks are discarded by Ray).

Errors: bad input raises ``VlafeedRayError`` naming the task, its shards and
the reader's message (which names the shard, member and key). With
``on_error="skip"`` the reader leaves out bad samples (or the rest of a
damaged shard), counts them, and the task records the counts in the
session's ledger actor: ``source.skipped()`` lists them per task.
"""
import functools
import json
import os
import resource
import tempfile
import time
import uuid

import numpy as np

from vlafeed.data.lerobot_compat import is_url
from vlafeed.data.wds import convert_batch
from vlafeed.ray import _common

__all__ = ["WdsDatasource", "read_wds"]


def _torch_bytes(obj):
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _column(name, value):
    import pyarrow as pa

    if isinstance(value, np.ndarray) and value.dtype.kind in "US":
        # a .npy of strings (ShardLoader stacks them into a '<U' / 'S' array): one str (or bytes) per
        # row, or nested lists of them for arrays of one or more dimensions
        return pa.array(value.tolist())
    if isinstance(value, list):
        if name.endswith(".pth"):
            # ShardLoader loaded the checkpoints (torch.load, weights_only); Arrow holds them serialized
            return pa.array([None if v is None else _torch_bytes(v) for v in value], type=pa.binary())
        if all(v is None or isinstance(v, str) for v in value):
            return pa.array(value, type=pa.string())
        if all(v is None or isinstance(v, (bytes, bytearray)) for v in value):
            return pa.array(value, type=pa.binary())
        return pa.array([None if v is None else json.dumps(v) for v in value], type=pa.string())
    return _common._array_column(value)


def _arrow_table(batch):
    import pyarrow as pa

    names = list(batch)
    return pa.Table.from_arrays([_column(n, batch[n]) for n in names], names=names)


def _task_manifest(shards):
    fd, path = tempfile.mkstemp(prefix="vlafeed-ray-wds-", suffix=".jsonl")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(json.dumps({"shard": url, "num_sequences": int(n)}) for _, url, n in shards))
    return path


def _read_task(spec, task):
    """Runs in a Ray worker: yields Arrow tables of at most rows_per_block rows for `task`."""
    import vlafeed

    t0, wall0 = time.process_time(), time.perf_counter()
    names = [s[0] for s in task["shards"]]
    where = f"vlafeed.ray wds task {task['id']} (shards {', '.join(names)} of {spec['manifest']})"
    manifest = _task_manifest(task["shards"])
    delivered = 0
    loader = None
    try:
        loader = vlafeed.ShardLoader(manifest, batch_size=spec["rows_per_block"], seed=0, shuffle=False,
                                     drop_last=False, rank=0, world_size=1, shuffle_buffer=0,
                                     fields=spec["fields"], image_format=spec["image_format"],
                                     resize=spec["resize"], on_error=spec["on_error"], threads=spec["threads"],
                                     output="numpy", prefetch=spec["prefetch"],
                                     # the task's private manifest lists the shards by the resolved paths or
                                     # URLs the driver already checked against the user's manifest
                                     allow_outside_base=True)
        for batch in loader:
            table = _arrow_table(batch)
            delivered += table.num_rows
            yield table
        stats = loader.stats()
    except vlafeed.VlafeedError as e:
        raise _common.VlafeedRayError(f"{where}: {e}") from e
    except (OSError, ValueError) as e:
        raise _common.VlafeedRayError(f"{where}: {e}") from e
    finally:
        if loader is not None:
            loader.close()
        os.unlink(manifest)
    ledger = spec.get("ledger")
    if ledger is not None:
        skipped = int(stats.get("skipped_samples", 0)) + int(stats.get("skipped_shards", 0))
        if skipped or delivered != task["rows"]:
            record = {"task": task["id"], "shards": names, "rows": int(task["rows"] - delivered),
                      "skipped_samples": int(stats.get("skipped_samples", 0)),
                      "skipped_shards": int(stats.get("skipped_shards", 0)),
                      "error": "; ".join(str(m) for m in stats.get("skip_messages", []))[:4000]}
            _common._ray().get(ledger.skip.remote(spec["source_id"], record))
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        record = {"task": task["id"], "pid": os.getpid(), "rows": delivered,
                  "skipped_rows": int(task["rows"] - delivered), "cpu_s": time.process_time() - t0,
                  "wall_s": time.perf_counter() - wall0, "peak_rss_bytes": peak_kb * 1024}
        _common._ray().get(ledger.done.remote(spec["source_id"], record))


def _datasource_base():
    from ray.data.datasource import Datasource
    return Datasource


class WdsDatasource(_datasource_base()):
    """WebDataset shards listed by a manifest.jsonl (local path, http(s):// or s3:// URL) as a
    Ray Data source.

    Arguments:
      manifest: the manifest (``shard`` entries with or without ``.tar``).
      shards_per_task: consecutive shards per read task (default 1).
      rows_per_block: the most samples in one output block (default 128).
      fields, image_format ("uint8_hwc" default, or "float_chw"), resize ((w, h)),
        threads (decode threads per task, default 1), prefetch (engine
        batches assembled ahead inside a task, default 1): as for
        vlafeed.ShardLoader, applied in C inside each task.
      on_error: "raise" (default) or "skip" (bad samples left out, counted per
        task in ``skipped()``).
      report: keep the ledger of finished tasks (``report()``), default on.
    """

    def __init__(self, manifest, *, shards_per_task=1, rows_per_block=128, fields=None, image_format="uint8_hwc",
                 resize=None, threads=1, prefetch=1, on_error="raise", report=True):
        import vlafeed

        super().__init__()
        if int(shards_per_task) < 1:
            raise ValueError(f"shards_per_task must be >= 1, not {shards_per_task!r}")
        if int(rows_per_block) < 1:
            raise ValueError(f"rows_per_block must be >= 1, not {rows_per_block!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        # the read tasks run in worker processes with their own working directory: a relative
        # manifest (and so its shards) is resolved here, on the driver
        self.manifest = os.fspath(manifest)
        if not is_url(self.manifest):
            self.manifest = os.path.abspath(self.manifest)
        self.shards_per_task = int(shards_per_task)
        self.rows_per_block = int(rows_per_block)
        self.on_error = on_error
        self._want_report = bool(report) or on_error == "skip"
        self._ledger = None
        self._source_id = uuid.uuid4().hex
        probe = vlafeed.ShardLoader(self.manifest, batch_size=1, shuffle=False, rank=0, world_size=1,
                                    shuffle_buffer=0, fields=fields, image_format=image_format, resize=resize,
                                    threads=1, output="numpy", prefetch=0)
        try:
            self._shards = [tuple(s) for s in probe.shards]
            raw = probe._native.next_batch()
            first = None if raw is None else convert_batch(raw, "numpy")
        finally:
            probe.close()
        if first is None:
            raise ValueError(f"{self.manifest}: the shards hold no samples")
        # Every task delivers the fields (member suffixes) of this first sample. Left to itself, a task
        # would take those of its own first sample: columns could differ between blocks, and a task whose
        # first shard is missing would fail at once, even under on_error="skip".
        learned = ",".join(dict.fromkeys(column[1] for column in raw["columns"]))
        self._row_bytes = max(8, sum(np.asarray(v).nbytes // max(1, len(v)) if not isinstance(v, list)
                                     else sum(len(str(x)) for x in v) for v in first.values()))
        self._fields = fields if fields is not None else sorted(
            k for k in first if not k.startswith("__"))
        self._spec_fields = learned if fields is None else (fields if isinstance(fields, str) else ",".join(fields))
        self._image_format, self._resize, self._threads, self._prefetch = image_format, resize, threads, prefetch
        self.meta = {"manifest": self.manifest, "num_shards": len(self._shards),
                     "num_samples": int(sum(n for _, _, n in self._shards)), "fields": list(self._fields),
                     "row_bytes": int(self._row_bytes)}

    def read_tasks_plan(self):
        """The read tasks as dicts: id, shards [(name, url, num_sequences)], rows."""
        out = []
        for i in range(0, len(self._shards), self.shards_per_task):
            group = self._shards[i:i + self.shards_per_task]
            out.append({"id": len(out), "shards": group, "rows": int(sum(n for _, _, n in group))})
        return out

    def get_name(self):
        return "VlafeedWebDataset"

    def estimate_inmemory_data_size(self):
        return self.meta["num_samples"] * self._row_bytes

    def _ensure_ledger(self):
        if self._want_report and self._ledger is None:
            self._ledger = _common._ledger()
        return self._ledger

    def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
        from ray.data.block import BlockMetadata
        from ray.data.datasource import ReadTask

        spec = {"manifest": self.manifest, "rows_per_block": self.rows_per_block, "fields": self._spec_fields,
                "image_format": self._image_format, "resize": None if self._resize is None else tuple(self._resize),
                "on_error": self.on_error, "threads": self._threads, "prefetch": self._prefetch,
                "ledger": self._ensure_ledger(), "source_id": self._source_id}
        tasks = []
        for task in self.read_tasks_plan():
            metadata = BlockMetadata(num_rows=task["rows"], size_bytes=task["rows"] * self._row_bytes,
                                     input_files=[url for _, url, _ in task["shards"]], exec_stats=None)
            tasks.append(ReadTask(functools.partial(_read_task, spec, task), metadata,
                                  per_task_row_limit=per_task_row_limit))
        return tasks

    def report(self):
        """{"skipped": [{task, shards, rows, error}], "tasks": [{task, pid, rows, skipped_rows, cpu_s,
        wall_s, peak_rss_bytes}]} from every read task run so far."""
        if self._ledger is None:
            return {"skipped": [], "tasks": []}
        return _common._ray().get(self._ledger.report.remote(self._source_id))

    def skipped(self):
        return self.report()["skipped"]

    def skipped_rows(self):
        return sum(r["rows"] for r in self.skipped())


def read_wds(manifest, *, ray_remote_args=None, override_num_blocks=None, concurrency=None, **kwargs):
    """ray.data.Dataset over WebDataset shards, decoded by vlafeed inside each read task; kwargs go
    to WdsDatasource, the rest to ray.data.read_datasource."""
    ray = _common._ray()
    source = WdsDatasource(manifest, **kwargs)
    return ray.data.read_datasource(source, ray_remote_args=ray_remote_args,
                                    override_num_blocks=override_num_blocks, concurrency=concurrency)
