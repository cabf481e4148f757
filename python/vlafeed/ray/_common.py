"""Pieces both Ray datasources share (``vlafeed.ray.lerobot`` for LeRobot
datasets, ``vlafeed.ray.wds`` for WebDataset shards): the error type, Ray's
lazy import, the per-session ledger actor that records what read tasks
skipped or read, and engine arrays as Arrow columns.
"""
import numpy as np


class VlafeedRayError(RuntimeError):
    """A read task failed; the message names the task, its episodes and the file."""



def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - optional dependency
        raise ImportError("vlafeed.ray needs Ray: pip install 'vlafeed[ray]' (ray[data,train]==2.60.0)") from e
    return ray


# ---- skip ledger ---------------------------------------------------------------------------


def _ledger_class():
    ray = _ray()

    @ray.remote(num_cpus=0)
    class SkipLedger:
        """Collects what read tasks skipped and what each finished task read, per datasource."""

        def __init__(self):
            self.records = {}

        def _of(self, source):
            return self.records.setdefault(source, {"skipped": [], "tasks": []})

        def skip(self, source, record):
            self._of(source)["skipped"].append(record)

        def done(self, source, record):
            self._of(source)["tasks"].append(record)

        def report(self, source):
            entry = self._of(source)
            return {"skipped": list(entry["skipped"]), "tasks": list(entry["tasks"])}

    return SkipLedger


def _ledger():
    """The Ray session's one ledger actor (created on first use, shared by every datasource, so a
    new datasource does not start a new actor process)."""
    # Detached: a named actor that lives by reference counting dies when the first datasource
    # holding it is collected, even while a later datasource's tasks (which got it by name)
    # still report to it (seen in CI); the session's shutdown ends it.
    return _ledger_class().options(name="vlafeed_ray_ledger", namespace="vlafeed", get_if_exists=True,
                                   lifetime="detached").remote()


# ---- Arrow columns ------------------------------------------------------------------------


def _array_column(value):
    """An engine array as an Arrow column: plain for 0/1-D, a fixed-shape tensor column above."""
    import pyarrow as pa

    value = np.asarray(value)
    # pyarrow's fixed_shape_tensor wraps the engine's batch memory without a copy (Ray's
    # ArrowTensorArray.from_numpy copies it: 0.12 s per 177 MB block); Ray 2.60 reads it
    # in iter_batches / iter_torch_batches like its own tensor type.
    if value.ndim <= 1:
        return pa.array(value)
    if value.dtype == np.bool_:  # pyarrow tensors refuse bool: Ray's type (small masks)
        from ray.data.extensions import ArrowTensorArray
        return ArrowTensorArray.from_numpy(value)
    return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(value))
