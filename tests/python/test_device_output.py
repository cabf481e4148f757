"""device= (batches as CUDA tensors): what can be proven without a GPU, and the real thing when there is one.

The device step (vlafeed.torch.device.DeviceFeeder) talks to the device through a small backend. Here a CPU
backend stands in for CUDA, with copies and kernels that run only when their event completes, which they
never do on their own (as late as a GPU could be): a copy reads its pinned host slot at completion time, and
records it when the slot changed since the copy was issued. So these tests show that

- a host slot is never refilled before its copy's event completed (and a feeder that skips the wait is
  caught), while the engine's pool reuses its buffers (prefetch 1);
- batches come out in order with the values of the loader without a device: images assembled as uint8 and
  converted (uint8 -> float32, mean_std / min_max normalization) by table lookup equal the engine's float
  output bit for bit, for LeRobot datasets and shards, through Mix, and through DataLoader workers;
- the resume state is that of the last batch handed out, though the feeder reads ahead;
- device="cuda" without CUDA fails naming the device and what torch reports; None and "cpu" change nothing.

test_real_cuda runs the same comparisons on a GPU and skips, saying why, without one.
"""
import contextlib
import gc
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import vlafeed  # noqa: E402
import vlafeed.torch  # noqa: E402
from vlafeed.torch import device as vdevice  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import wds_helpers  # noqa: E402

CAMS = ("observation.images.cam0", "observation.images.cam1")
NORMS = [None,
         {CAMS[0]: "mean_std", "observation.state": "mean_std"},
         {CAMS[0]: "min_max", CAMS[1]: "mean_std", "action": "min_max"}]


class LateEvent:
    def __init__(self, ops):
        self.ops, self.done = ops, False


class LateCopies:
    """A CPU stand-in for CudaCopies whose copies and kernels run only when their event completes (in
    stream order), which happens only on synchronize() or complete_all(). A copy reads its host slot when
    it runs, and notes the slot changed since the copy was issued (a slot refilled too early)."""

    def __init__(self):
        self.ops, self.events, self.corrupted, self.syncs, self.handed = [], [], [], 0, 0

    def host_buffer(self, nbytes):
        return torch.empty(nbytes, dtype=torch.uint8)

    def side(self):
        return contextlib.nullcontext()

    def copy_async(self, host):
        out, issued = torch.empty_like(host), host.clone()

        def run():
            if not torch.equal(host, issued):
                self.corrupted.append(len(self.events))
            out.copy_(host)
        self.ops.append(run)
        return out

    def empty(self, shape, dtype):
        return torch.full(shape, float("nan"), dtype=dtype) if dtype.is_floating_point else \
            torch.empty(shape, dtype=dtype)

    def launch(self, fn, *args):
        self.ops.append(lambda: fn(*args))

    def record(self):
        event = LateEvent(self.ops)
        self.ops = []
        self.events.append(event)
        return event

    def query(self, event):
        return event.done

    def synchronize(self, event):
        self.syncs += 1
        for e in self.events:
            if not e.done:
                for op in e.ops:
                    op()
                e.done = True
            if e is event:
                return

    def hand_over(self, event, tensors):
        self.handed += 1   # the consumer's stream would wait on the GPU; the host goes on

    def complete_all(self):
        if self.events:
            self.synchronize(self.events[-1])


def same_batches(ref, got):
    assert len(ref) == len(got)
    for i, (r, g) in enumerate(zip(ref, got)):
        assert list(r) == list(g), i
        for k in r:
            if isinstance(r[k], torch.Tensor):
                g_k = g[k].cpu()
                assert (r[k].dtype, tuple(r[k].shape)) == (g_k.dtype, tuple(g_k.shape)), (i, k)
                assert torch.equal(r[k], g_k), (i, k, (r[k].double() - g_k.double()).abs().max())
            else:
                assert r[k] == g[k], (i, k)


@pytest.fixture(scope="module")
def root(cli, tmp_path_factory):
    """4 episodes of 8..14 frames, 2 cameras of 48x32 (stats for every feature)."""
    path = tmp_path_factory.mktemp("device") / "ds"
    r = subprocess.run([cli, "make-sample", path, "--episodes", "4", "--codec", "h264", "--size", "48x32",
                        "--fps", "10", "--min-length", "8", "--max-length", "14", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return path


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return wds_helpers.write_foundry_set(tmp_path_factory.mktemp("device-wds"), shards=3, per_shard=5)


OPTS = dict(batch_size=5, seed=3, threads=1, prefetch=1)


# ---- validation and unchanged behaviour ----------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: the error is for machines without")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_names_device_and_torch(root, manifest, device):
    for make in (lambda: vlafeed.Loader(root, device=device),
                 lambda: vlafeed.ShardLoader(manifest, device=device),
                 lambda: vlafeed.Mix([vlafeed.Loader(root)], [1], batch_size=4, device=device),
                 lambda: vlafeed.torch.IterableDataset(root, device=device),
                 lambda: vlafeed.torch.ShardIterableDataset(manifest, device=device)):
        with pytest.raises(RuntimeError) as e:
            make()
        message = str(e.value)
        assert repr(device) in message and "needs CUDA" in message, message
        assert torch.__version__ in message, message   # what torch reports


def test_bad_device_values(root):
    with pytest.raises(ValueError, match="only CUDA devices"):
        vlafeed.Loader(root, device="meta")
    with pytest.raises(ValueError, match="not a device torch knows"):
        vlafeed.Loader(root, device="gpu7")
    with pytest.raises(ValueError, match="needs output='torch'"):
        vlafeed.Loader(root, device=LateCopies(), output="numpy")
    with pytest.raises(ValueError, match="depth"):
        vdevice.DeviceFeeder([], LateCopies(), depth=0)


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu")])
def test_cpu_or_none_is_unchanged(root, device):
    ref = list(vlafeed.Loader(root, normalize=NORMS[1], **OPTS))
    loader = vlafeed.Loader(root, normalize=NORMS[1], device=device, **OPTS)
    assert loader.device is None and loader.device_conversions() == {}
    got = list(loader)
    same_batches(ref, got)
    assert got[0][CAMS[0]].dtype == torch.float32
    assert got[0][CAMS[0]].data_ptr() != 0 and got[0][CAMS[0]].device.type == "cpu"


# ---- equivalence: device-side conversion == the engine's float output -------------------------------


@pytest.mark.parametrize("normalize", NORMS)
@pytest.mark.parametrize("resize", [None, (32, 16)])
def test_lerobot_device_batches_equal_engine_float(root, normalize, resize):
    ref = list(vlafeed.Loader(root, normalize=normalize, resize=resize, **OPTS))
    backend = LateCopies()
    loader = vlafeed.Loader(root, normalize=normalize, resize=resize, device=backend, **OPTS)
    assert sorted(loader.device_conversions()) == sorted(CAMS)   # images convert on the device
    got = list(loader)
    backend.complete_all()
    same_batches(ref, got)
    assert backend.corrupted == [] and backend.handed == len(ref)


def test_uint8_images_cross_as_uint8(root):
    """image_format='uint8' with a device: nothing to convert, uint8 on the device."""
    ref = list(vlafeed.Loader(root, image_format="uint8", **OPTS))
    backend = LateCopies()
    loader = vlafeed.Loader(root, image_format="uint8", device=backend, **OPTS)
    assert loader.device_conversions() == {}
    got = list(loader)
    backend.complete_all()
    same_batches(ref, got)


def test_conversion_table_is_the_engine_arithmetic():
    """The tables: v / 255 in float32 (LeRobot engine), v * (1/255) (shard reader); mean_std and min_max
    in float32 in the engine's order; and the lookup on CPU tensors gives table[channel, value]."""
    v = np.arange(256, dtype=np.float32)
    assert np.array_equal(vdevice.image_table("divide")[0], v / np.float32(255))
    assert np.array_equal(vdevice.image_table("reciprocal")[0], v * np.float32(1 / 255))
    mean, std = [0.4, 0.5, 0.6], [0.2, 0.0, 0.3]
    t = vdevice.image_table("divide", "mean_std", mean, std)
    x = v / np.float32(255)
    assert np.array_equal(t[1], (x - np.float32(0.5)) / (np.float32(0.0) + np.float32(1e-8)))
    lo, hi = [0.0, 0.1, 0.2], [1.0, 0.9, 0.8]
    t = vdevice.image_table("divide", "min_max", lo, hi)
    assert np.array_equal(t[2], (x - np.float32(0.2)) / ((np.float32(0.8) - np.float32(0.2)) + np.float32(1e-8))
                          * np.float32(2) - np.float32(1))
    conv = vdevice.ImageConversion(vdevice.image_table("divide", "mean_std", mean, [0.2, 0.25, 0.3]))
    raw = torch.randint(0, 256, (2, 3, 3, 5, 4), dtype=torch.uint8)
    out = conv(raw)
    expect = torch.from_numpy(np.take_along_axis(conv.table.numpy()[None, None, :, :, None],
                                                 raw.numpy().reshape(2, 3, 3, 20, 1).astype(np.int64), 3))
    assert torch.equal(out, expect.reshape(2, 3, 3, 5, 4))
    hwc = vdevice.ImageConversion(vdevice.image_table("reciprocal"), hwc=True)
    img = torch.randint(0, 256, (2, 5, 4, 3), dtype=torch.uint8)
    assert torch.equal(hwc(img), img.permute(0, 3, 1, 2).float() * np.float32(1 / 255))


@pytest.mark.parametrize("resize", [None, (20, 16)])
def test_shard_device_batches_equal_reader_float(manifest, resize):
    ref = list(vlafeed.ShardLoader(manifest, batch_size=4, image_format="float_chw", resize=resize))
    backend = LateCopies()
    loader = vlafeed.ShardLoader(manifest, batch_size=4, image_format="float_chw", resize=resize, device=backend)
    got = list(loader)
    backend.complete_all()
    same_batches(ref, got)
    assert sorted(loader.device_conversions()) == ["top_t-1", "top_t0", "wrist_t-1", "wrist_t0"]
    assert backend.corrupted == []


# ---- ordering: slots, pool reuse, order ------------------------------------------------------------


def test_slot_never_refilled_before_its_copy_completed(root):
    """Copies that never complete on their own: the feeder waits on a slot's event before refilling it,
    no copy reads a changed slot, and the values are those of the loader without a device, while the
    engine (prefetch 1, one thread) reuses its pool buffers for the batches the feeder let go."""
    ref = list(vlafeed.Loader(root, normalize=NORMS[2], **OPTS))
    backend = LateCopies()
    loader = vlafeed.Loader(root, normalize=NORMS[2], device=backend, **OPTS)
    addresses = []

    def host():
        for batch in loader.host_batches():
            addresses.append(batch[CAMS[0]].data_ptr())
            yield batch
    feeder = vdevice.DeviceFeeder(host(), backend, loader.device_conversions())
    got = list(feeder)
    assert len(set(addresses)) < len(addresses), "the engine did not reuse a buffer: nothing was tested"
    assert feeder.host_waits == backend.syncs == len(ref) - (feeder.depth + 1)   # every refill waited
    backend.complete_all()
    assert backend.corrupted == []
    same_batches(ref, got)


class NoWaitFeeder(vdevice.DeviceFeeder):
    """A broken feeder that refills a slot without waiting for its copy: the test must catch it."""

    def _slot_for(self, nbytes):
        slot = self._slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(self._slots)
        slot.copied = None
        if slot.buffer is None or slot.buffer.numel() < nbytes:
            slot.buffer = self.backend.host_buffer(max(nbytes, vdevice.ALIGN))
        return slot


def test_the_late_backend_catches_a_feeder_that_does_not_wait(root):
    ref = list(vlafeed.Loader(root, image_format="uint8", **OPTS))
    backend = LateCopies()
    got = list(NoWaitFeeder(vlafeed.Loader(root, image_format="uint8", **OPTS), backend))
    backend.complete_all()
    assert backend.corrupted, "a slot refilled before its copy ran went unnoticed"
    with pytest.raises(AssertionError):
        same_batches(ref, got)


def test_feeder_hands_out_in_order_with_depth(root):
    for depth in (1, 2, 4):
        batches = [{"i": torch.full((3,), k, dtype=torch.int64), "name": [str(k)]} for k in range(9)]
        backend = LateCopies()
        got = list(vdevice.DeviceFeeder(iter(batches), backend, depth=depth))
        backend.complete_all()
        assert [int(b["i"][0]) for b in got] == list(range(9))
        assert [b["name"] for b in got] == [[str(k)] for k in range(9)]
        assert len(backend.events) == 2 * 9   # copied + ready per batch


# ---- resume: the state of what the caller got -----------------------------------------------------


def test_state_is_that_of_the_last_batch_handed_out(root):
    plain = vlafeed.Loader(root, **OPTS)
    states = []
    for b in plain:
        states.append(plain.state_dict())
    backend = LateCopies()
    loader = vlafeed.Loader(root, device=backend, **OPTS)
    it = iter(loader)
    assert loader.state_dict()["samples_consumed"] == 0
    for k in range(3):
        next(it)
        assert loader.state_dict() == states[k]
    it.close()    # left early: the feeder had read ahead; the engine is put back at batch 3
    assert loader.state_dict() == states[2]
    rest = list(vlafeed.Loader(root, state=loader.state_dict(), **OPTS))
    ref = list(vlafeed.Loader(root, **OPTS))
    assert len(rest) == len(ref) - 3
    same_batches(ref[3:], rest)


def test_mix_on_device_equals_mix_on_host(root):
    """Sources with their own image normalization (per-row tables by dataset_index), a pass left early
    and a new one that continues the stream."""
    def sources(device):
        return [vlafeed.Loader(root, batch_size=4, seed=1, threads=1, normalize={CAMS[0]: "mean_std"}, device=device),
                vlafeed.Loader(root, batch_size=3, seed=2, threads=1, device=device)]
    ref_mix = vlafeed.Mix(sources(None), [0.6, 0.4], batch_size=5, window=10)
    ref = [b for _, b in zip(range(8), ref_mix)]
    backend = LateCopies()
    mix = vlafeed.Mix(sources(backend), [0.6, 0.4], batch_size=5, window=10, device=backend)
    it = iter(mix)
    got = [next(it) for _ in range(5)]
    state = mix.state_dict()
    it.close()
    assert mix.state_dict() == state
    got += [b for _, b in zip(range(3), mix)]
    backend.complete_all()
    same_batches(ref, got)
    assert backend.corrupted == []


def test_mix_refuses_a_source_on_another_device(root):
    with pytest.raises(ValueError, match="delivers its batches on"):
        vlafeed.Mix([vlafeed.Loader(root, device=LateCopies())], [1], batch_size=4, device=LateCopies())


# ---- DataLoader workers: host batches in the workers, the device step in the main process -----------


def test_dataloader_workers_move_in_the_main_process(root, manifest):
    norm = {CAMS[0]: "mean_std"}
    ref = list(vlafeed.Loader(root, batch_size=4, num_consumers=2, normalize=norm))
    backend = LateCopies()
    ds = vlafeed.torch.IterableDataset(root, batch_size=4, normalize=norm, device=backend)
    dl = vlafeed.torch.DataLoader(ds, num_workers=2)
    got = list(dl)
    backend.complete_all()
    same_batches(ref, got)
    assert dl.state_dict()["samples_consumed"] == sum(len(b["index"]) for b in ref)
    with pytest.raises(RuntimeError, match="moves them"):
        list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1))
    gc.collect()
    got = list(vlafeed.torch.to_device(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)))
    backend.complete_all()
    same_batches(ref, got)

    sref = list(vlafeed.ShardLoader(manifest, batch_size=4, num_consumers=2, image_format="float_chw"))
    backend = LateCopies()
    sds = vlafeed.torch.ShardIterableDataset(manifest, batch_size=4, image_format="float_chw", device=backend)
    got = list(vlafeed.torch.to_device(torch.utils.data.DataLoader(sds, batch_size=None, num_workers=2)))
    backend.complete_all()
    same_batches(sref, got)


# ---- a real GPU -------------------------------------------------------------------------------------


def cuda_reason():
    if torch.cuda.is_available():
        return None
    return (f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) reports "
            f"torch.cuda.is_available() False")


@pytest.mark.skipif(cuda_reason() is not None, reason=cuda_reason() or "")
def test_real_cuda(root, manifest):
    for normalize in NORMS:
        ref = list(vlafeed.Loader(root, normalize=normalize, **OPTS))
        loader = vlafeed.Loader(root, normalize=normalize, device="cuda:0", **OPTS)
        got = []
        for b in loader:
            assert all(v.device.type == "cuda" for v in b.values() if isinstance(v, torch.Tensor))
            got.append(b)
            torch.cuda._sleep(1_000_000)   # a long kernel on the consumer stream: the next copies overlap it
        torch.cuda.synchronize()
        same_batches(ref, got)
    sref = list(vlafeed.ShardLoader(manifest, batch_size=4, image_format="float_chw"))
    got = list(vlafeed.ShardLoader(manifest, batch_size=4, image_format="float_chw", device="cuda"))
    torch.cuda.synchronize()
    same_batches(sref, got)


def test_an_error_comes_after_the_batches_before_it():
    """The feeder reads ahead, but a source's error reaches the caller where it would without a device."""
    def source():
        for k in range(4):
            yield {"i": torch.full((2,), k)}
        raise ValueError("bad batch 4")
    backend = LateCopies()
    feeder = vdevice.DeviceFeeder(source(), backend, depth=3)
    got = [next(feeder) for _ in range(4)]
    backend.complete_all()
    assert [int(b["i"][0]) for b in got] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="bad batch 4"):
        next(feeder)
    with pytest.raises(StopIteration):
        next(feeder)


def test_ray_train_worker_loader_takes_device(root, monkeypatch):
    """vlafeed.ray.loader_for_train_worker passes device= on; "auto" is the worker's device from Ray Train
    (host memory when Ray gave it no GPU)."""
    pytest.importorskip("ray.train")
    import ray.train
    import ray.train.torch
    import vlafeed.ray

    class Context:
        def get_world_rank(self):
            return 0

        def get_world_size(self):
            return 1
    monkeypatch.setattr(ray.train, "get_context", lambda: Context())
    monkeypatch.setattr(ray.train.torch, "get_device", lambda: torch.device("cpu"))
    assert vlafeed.ray.loader_for_train_worker(root, device="auto", batch_size=5).device is None
    backend = LateCopies()
    loader = vlafeed.ray.loader_for_train_worker(root, device=backend, **OPTS)
    assert loader.device is backend
    got = list(loader)
    backend.complete_all()
    same_batches(list(vlafeed.Loader(root, rank=0, world_size=1, **OPTS)), got)
