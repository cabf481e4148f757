"""One Loader / ShardLoader iterated from two threads: the second thread gets a
RuntimeError naming the thread that holds the pass, never a deadlock (before:
the second pass's set_epoch waited forever behind the first thread's wait in
the engine queue, in every mode, or moved the first thread's pass to another
epoch). Iterating from one thread after another, and passes abandoned in one
thread or held by a thread that has ended, stay fine."""
import subprocess
import sys
import textwrap
import threading

import pytest

import vlafeed

from wds_helpers import write_foundry_set


@pytest.fixture(scope="module")
def sample(tmp_path_factory, cli):
    root = tmp_path_factory.mktemp("threads") / "ds"
    subprocess.run([cli, "make-sample", str(root), "--episodes", "3", "--cameras", "1", "--size", "64x48",
                    "--codec", "h264"], check=True, capture_output=True)
    return root


def second_thread_during_a_pass(make_loader):
    """Thread A starts a pass and holds it (one batch taken, the rest to come); thread B then
    iterates the same loader and calls set_epoch. Returns what B raised; A's pass must still end
    with every batch of its epoch."""
    loader = make_loader()
    per_epoch = len(loader)
    started, release = threading.Event(), threading.Event()
    errors, a_batches = [], []

    def first():
        it = iter(loader)
        a_batches.append(next(it))
        started.set()
        release.wait(30)
        a_batches.extend(it)

    def second():
        for call in (lambda: [b for b in loader], lambda: loader.set_epoch(5)):
            try:
                call()
            except RuntimeError as e:
                errors.append(e)

    a = threading.Thread(target=first, name="first-consumer")
    a.start()
    assert started.wait(30)
    b = threading.Thread(target=second, name="second-consumer")
    b.start()
    b.join(30)
    assert not b.is_alive(), "the second thread hangs"
    release.set()
    a.join(60)
    assert not a.is_alive()
    assert len(a_batches) == per_epoch  # A's pass was left alone
    loader.close()
    return errors


@pytest.mark.parametrize("mode", ["stream", "map", "pool"])
def test_second_thread_is_refused_not_deadlocked(sample, mode):
    errors = second_thread_during_a_pass(lambda: vlafeed.Loader(sample, mode=mode, batch_size=4, keys=["action"],
                                                                output="numpy", prefetch=1))
    assert len(errors) == 2
    assert all("already being iterated by thread 'first-consumer'" in str(e) for e in errors)
    assert "one thread at a time" in str(errors[0])


def test_shard_loader_second_thread_is_refused(tmp_path):
    manifest = write_foundry_set(tmp_path / "shards", shards=2, per_shard=6)
    errors = second_thread_during_a_pass(lambda: vlafeed.ShardLoader(manifest, batch_size=2, output="numpy"))
    assert len(errors) == 2 and all("ShardLoader is already being iterated" in str(e) for e in errors)


def test_one_thread_after_another_and_abandoned_passes(sample):
    loader = vlafeed.Loader(sample, mode="stream", batch_size=4, keys=["action"], output="numpy", shuffle=False)
    key = "action"
    first = [b[key].tolist() for b in loader]
    got = []
    t = threading.Thread(target=lambda: got.extend(b[key].tolist() for b in loader))
    t.start()
    t.join(60)
    assert got and len(got) == len(first)          # the next epoch, from another thread
    for _ in range(3):                             # a pass abandoned after one batch frees the loader
        next(iter(loader))
    held = []

    def hold():                                    # a pass left open by a thread that then ends
        it = iter(loader)
        next(it)
        held.append(it)

    t = threading.Thread(target=hold)
    t.start()
    t.join(60)
    assert len(list(loader)) == len(loader)        # does not hold the loader any more
    loader.close()


@pytest.mark.parametrize("prefetch", [0, 2])
def test_shard_loader_close_from_another_thread_while_iterating(tmp_path, prefetch):
    """close() from another thread while next_batch runs: the running call finishes and raises
    ValueError (or the pass ends), the loader is freed after it, never under it. Before, this
    crashed (SIGSEGV / heap corruption with prefetch=0, a bare MemoryError otherwise): run in a
    child process so a crash is a failure, not the end of the test run."""
    manifest = write_foundry_set(tmp_path / "shards", shards=4, per_shard=40)
    code = textwrap.dedent(f"""
        import threading, time, vlafeed
        outcomes = []
        for trial in range(20):
            loader = vlafeed.ShardLoader({str(manifest)!r}, batch_size=2, output="numpy", prefetch={prefetch},
                                         shuffle=False)
            started = threading.Event()

            def consume():
                try:
                    for i, _ in enumerate(loader):
                        started.set()
                    outcomes.append("ended")
                except ValueError as e:
                    assert "closed" in str(e), e
                    outcomes.append("closed")

            t = threading.Thread(target=consume)
            t.start()
            started.wait(30)
            time.sleep(0.001 * (trial % 5))
            loader.close()
            t.join(60)
            assert not t.is_alive()
            try:
                loader.close()            # twice is fine
                next(iter(loader))
            except ValueError as e:
                assert "closed" in str(e)
        print("ok", sorted(set(outcomes)))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.startswith("ok")
