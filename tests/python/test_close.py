"""Closing a loader (issue 10): from another thread while one iterates, with
views of a batch still alive, and iterating or calling after close: every
case ends in a clean ValueError or in valid data, never a hang or a crash.
Every case runs in a child process under a timeout, so a hang is a failure."""
import os
import pathlib
import subprocess
import sys

import pytest

import damage

ROOT = pathlib.Path(__file__).resolve().parents[2]

CHILD = r'''
import sys, threading, time
import torch
import vlafeed
root, mode = sys.argv[1], sys.argv[2]
kw = dict(batch_size=4, threads=2, mode=mode)

# 1. Views of a batch outlive close(); calls after close raise ValueError.
l = vlafeed.Loader(root, **kw)
it = iter(l)
batch = next(it)
view = batch["action"]
expected = view.clone()
l.close()
l.close()  # twice is fine
assert torch.equal(view, expected)
for call in (lambda: next(it), lambda: l.set_epoch(1), lambda: l.state_dict(), lambda: list(l),
             lambda: l.get_items([0])):
    try:
        call()
    except ValueError as e:
        assert "closed" in str(e), e
    else:
        raise AssertionError("a call after close() succeeded")

# 2. close() from another thread while this one iterates, many times.
for attempt in range(20):
    l = vlafeed.Loader(root, **kw)
    outcome = []
    def consume():
        try:
            for epoch in range(100):
                l.set_epoch(epoch)
                for b in l:
                    float(b["action"].sum())
            outcome.append("finished")
        except ValueError as e:
            outcome.append(str(e))
    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.002 * attempt)
    l.close()
    t.join(60)
    assert not t.is_alive(), "the iterating thread hangs after close()"
    assert outcome and ("closed" in outcome[0] or outcome[0] == "finished"), outcome
print("ok")
'''


@pytest.fixture(scope="module")
def sample(cli, tmp_path_factory):
    return damage.make_sample(cli, tmp_path_factory.mktemp("close") / "base", episodes=4, size="64x48",
                              min_length=12, max_length=24)


@pytest.mark.parametrize("mode", ["stream", "map", "pool"])
def test_close_cases(sample, mode):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, "-c", CHILD, str(sample), mode], capture_output=True, text=True,
                       timeout=240, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
