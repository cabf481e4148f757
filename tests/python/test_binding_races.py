"""Thread races on every Python binding, in repeated trials (issue 25): each
object either serves several threads correctly or refuses the second one with
a RuntimeError naming the holder, never a crash, a hang or a wrong value.
Loader and ShardLoader closing from another thread, and two threads
iterating one Loader or ShardLoader, are in test_close.py and
test_loader_threads.py; this file covers the rest:

- LeRobotDataset: items read from 4 threads at once equal the items read
  alone (the map loader under it is shared);
- one native Dataset shared by two Loaders iterated in two threads: each
  yields its whole epoch, equal to a run alone;
- Mix: a second thread iterating (or resuming) a Mix whose pass another thread
  holds gets RuntimeError, and the first pass is not disturbed;
- batches handed to another thread and read there after their loader is
  closed keep their values;
- Dataset.problems / info() read while other threads read items.

Every trial that could crash runs in a child process under a timeout, so a
segfault or a hang is a test failure, not a lost run."""
import os
import pathlib
import random
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import vlafeed
from vlafeed import _native

import damage

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRIALS = 5


@pytest.fixture(scope="module")
def sample(cli, tmp_path_factory):
    return damage.make_sample(cli, tmp_path_factory.mktemp("races") / "ds", episodes=3, cameras=2, size="64x48",
                              min_length=10, max_length=16)


def equal(a, b):
    assert sorted(a) == sorted(b)
    for k, v in b.items():
        if isinstance(v, str):
            assert a[k] == v, k
        else:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(v), err_msg=k)


def run_threads(target, n):
    errors = []

    def guarded(i):
        try:
            target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a thread hangs"
    if errors:
        raise errors[0]


def test_lerobot_dataset_items_from_four_threads(sample):
    ds = vlafeed.LeRobotDataset(sample, output="numpy")
    ref = [ds[i] for i in range(len(ds))]
    for trial in range(TRIALS):
        def reader(k):
            rng = random.Random(trial * 10 + k)
            for _ in range(60):
                i = rng.randrange(len(ds))
                equal(ds[i], ref[i])
        run_threads(reader, 4)


def test_one_dataset_two_loaders_two_threads(sample):
    native = _native.Dataset(str(sample))

    def epoch(seed):
        loader = vlafeed.Loader(native, batch_size=4, seed=seed, shuffle=True, output="numpy")
        out = [b["index"].tolist() for b in loader]
        loader.close()
        return out
    alone = {s: epoch(s) for s in (1, 2)}
    for _ in range(TRIALS):
        got = {}
        run_threads(lambda k: got.__setitem__(k + 1, epoch(k + 1)), 2)
        assert got == alone


class Counting:
    """A pure-Python Mix source (no guard of its own): batches of 4 counting up."""

    def __init__(self, start):
        self.start, self.epoch, self.taken = start, 0, 0

    def __iter__(self):
        for k in range(self.taken, 50):
            self.taken = k + 1
            yield {"x": np.arange(4, dtype=np.int64) + self.start + 4 * k}
        self.taken = 0

    def set_epoch(self, epoch):
        self.epoch, self.taken = epoch, 0

    def state_dict(self):
        return {"epoch": self.epoch, "taken": self.taken}

    def load_state_dict(self, state):
        self.epoch, self.taken = state["epoch"], state["taken"]


def test_mix_second_thread_is_refused():
    for _ in range(TRIALS):
        mix = vlafeed.Mix([Counting(0), Counting(10_000)], weights=[0.5, 0.5], batch_size=4, window=8, seed=0)
        ref = vlafeed.Mix([Counting(0), Counting(10_000)], weights=[0.5, 0.5], batch_size=4, window=8, seed=0)
        it = iter(mix)
        first = [next(it)["x"].tolist() for _ in range(3)]
        state = mix.state_dict()
        refused = []

        def other(_):
            for call in (lambda: next(iter(mix)), lambda: mix.set_epoch(3), lambda: mix.load_state_dict(state)):
                with pytest.raises(RuntimeError, match="already being iterated by thread"):
                    call()
                refused.append(True)
        run_threads(other, 1)
        assert len(refused) == 3
        rest = [next(it)["x"].tolist() for _ in range(3)]
        rit = iter(ref)
        assert first + rest == [next(rit)["x"].tolist() for _ in range(6)]


CHILD = r'''
import queue, sys, threading, warnings
import numpy as np
import vlafeed
root = sys.argv[1]
warnings.simplefilter("ignore")
for trial in range(10):
    # Batches handed to a consumer thread through a queue, the loader closed while the consumer
    # still reads them: their values stay.
    loader = vlafeed.Loader(root, batch_size=4, threads=2, prefetch=2, output="numpy")
    q, sums, expect = queue.Queue(), [], []
    def consume():
        while True:
            b = q.get()
            if b is None:
                return
            sums.append(int(b["index"].sum()))
    t = threading.Thread(target=consume)
    t.start()
    for k, b in enumerate(loader):
        expect.append(int(b["index"].sum()))
        q.put(b)
        if k == 3 + trial % 3:
            break
    loader.close()
    q.put(None)
    t.join(60)
    assert not t.is_alive() and sums == expect, (sums, expect)

    # problems / info() / episodes read while two threads read items of the same dataset.
    ds = vlafeed.LeRobotDataset(root, output="numpy")
    native = ds.native_dataset
    stop = threading.Event()
    def items():
        i = 0
        while not stop.is_set():
            ds[i % len(ds)]
            i += 1
    readers = [threading.Thread(target=items) for _ in range(2)]
    for r in readers:
        r.start()
    for _ in range(20):
        assert native.problems == [] and native.info()["total_episodes"] == 3 and len(native.episodes) == 3
    stop.set()
    for r in readers:
        r.join(60)
        assert not r.is_alive()
print("ok")
'''


def test_batches_across_threads_and_metadata_reads_in_a_child(sample):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, "-c", CHILD, str(sample)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout[-2000:], r.stderr[-4000:])


FORK_CHILD = r'''
import gc, os, sys, warnings
import vlafeed
warnings.simplefilter("ignore")
manifest, root = sys.argv[1], sys.argv[2]
shards = vlafeed.ShardLoader(manifest, batch_size=2, prefetch=2, threads=2, output="numpy")
loader = vlafeed.Loader(root, batch_size=2, threads=2, output="numpy")
it, lit = iter(shards), iter(loader)
next(it), next(lit)          # the producer and the engine threads are running
pid = os.fork()
if pid == 0:                 # the child holds copies of both loaders without their threads
    code = 0
    for name, obj in (("ShardLoader", it), ("Loader", lit)):
        try:
            next(obj)
            code = 3         # a forked copy must not serve
        except Exception as e:  # noqa: BLE001
            if "fork" not in str(e):
                print(name, repr(e), file=sys.stderr)
                code = 4
    del shards, loader, it, lit
    gc.collect()             # dropping the copies must neither join the parent's threads nor crash
    os._exit(code)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
print(sum(1 for _ in it) >= 0, sum(1 for _ in lit) >= 0)   # the parent's loaders go on
'''


def test_forked_copies_are_refused_and_dropped_safely(sample, tmp_path):
    """A process forked while a ShardLoader's producer and a Loader's engine threads run (as a
    DataLoader worker is): the child's copies refuse to serve, naming fork, and dropping them neither
    joins threads that do not exist in the child nor crashes (a worker once segfaulted when an
    inherited ShardLoader was collected); the parent's loaders go on."""
    from wds_helpers import write_foundry_set
    manifest = write_foundry_set(tmp_path / "shards", shards=2, per_shard=6)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, "-c", FORK_CHILD, str(manifest), str(sample)], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "child 0" in r.stdout, (r.stdout, r.stderr[-3000:])
