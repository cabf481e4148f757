"""Map mode's table cache on disk (src/dataset/table_cache.c, rows.c): when
the table does not fit in the row cache, the first miss in a data file
decodes the rows of all its episodes once, stores them under
$VF_CACHE_DIR/table, and every later miss (this run or the next) reads the
episode's slice back with a per-episode checksum. Rows are checked against
pyarrow; each test points VF_CACHE_DIR at its own folder."""
import glob
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import vlafeed

import lerobot_reference as R

KEYS = ["action", "index", "observation.state"]


@pytest.fixture(scope="module")
def base(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("tdisk") / "ds"
    R.make_sample_dataset(cli, root, codec="h264", episodes=14, cameras=1, size="64x48", min_length=20,
                          max_length=40, seed=11)
    return root


@pytest.fixture
def ds(base, tmp_path):
    """A private copy (tests rewrite data files)."""
    root = tmp_path / "ds"
    shutil.copytree(base, root)
    return root


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("VF_CACHE_DIR", str(d))
    monkeypatch.delenv("VF_TABLE_CACHE", raising=False)
    return d


def entries(cache):
    return sorted(glob.glob(str(cache / "table" / "*.vftable")))


def data_files(root):
    return sorted(glob.glob(str(root / "data" / "*" / "*.parquet")))


def epoch(root, mode="map", **kw):
    kw.setdefault("table_cache_bytes", 2048)  # far below the table: every episode misses
    loader = vlafeed.Loader(str(root), mode=mode, batch_size=8, keys=KEYS, rank=0, world_size=1, output="numpy",
                            seed=4, threads=1, **kw)
    got = {}
    for b in loader:
        for i, a, s in zip(b["index"].tolist(), b["action"], b["observation.state"]):
            assert i not in got, "a row twice"
            got[i] = (np.array(a), np.array(s))
    st = loader.stats()
    loader.close()
    return got, st


def truth(root):
    want = {}
    for f in data_files(root):
        t = pq.read_table(f, columns=["index", "action", "observation.state"])
        for i, a, s in zip(t.column("index").to_pylist(), t.column("action").to_pylist(),
                           t.column("observation.state").to_pylist()):
            want[i] = (np.array(a, np.float32), np.array(s, np.float32))
    return want


def assert_exact(got, want):
    assert sorted(got) == sorted(want)
    for i, (a, s) in got.items():
        assert np.array_equal(a, want[i][0]) and np.array_equal(s, want[i][1]), i


def test_built_once_then_read_back_exactly(ds, cache):
    want = truth(ds)
    got, st = epoch(ds)
    assert_exact(got, want)
    nfiles = len(data_files(ds))
    assert st["table_disk_builds"] == nfiles and st["table_disk_files"] == nfiles
    assert len(entries(cache)) == nfiles
    # the build is one read per data file; everything else came off the disk cache
    assert st["table_reads"] == nfiles
    assert st["table_disk_episodes"] >= st["table_episodes"] - nfiles
    assert st["table_disk_bytes"] == sum(os.path.getsize(e) for e in entries(cache))
    # A second loader (a later run) decodes nothing.
    got2, st2 = epoch(ds)
    assert_exact(got2, want)
    assert st2["table_disk_builds"] == 0 and st2["table_reads"] == 0 and st2["table_row_groups"] == 0
    assert st2["table_disk_episodes"] == st2["table_episodes"] > 0


def test_when_it_is_not_used(ds, cache, monkeypatch):
    want = truth(ds)
    # off by setting
    got, st = epoch(ds, table_disk_cache=False)
    assert_exact(got, want)
    assert st["table_disk_episodes"] == 0 and not entries(cache)
    # auto, and the table fits in the row cache: read whole in file order instead
    got, st = epoch(ds, table_cache_bytes=0)
    assert_exact(got, want)
    assert st["table_disk_builds"] == 0 and not entries(cache)
    # stream mode never uses it
    got, st = epoch(ds, mode="stream")
    assert_exact(got, want)
    assert st["table_disk_builds"] == 0 and not entries(cache)
    # off by environment
    monkeypatch.setenv("VF_TABLE_CACHE", "0")
    got, st = epoch(ds)
    assert_exact(got, want)
    assert st["table_disk_builds"] == 0 and not entries(cache)
    # forced on, although the table fits
    monkeypatch.delenv("VF_TABLE_CACHE")
    got, st = epoch(ds, table_cache_bytes=0, table_disk_cache=True)
    assert_exact(got, want)
    assert st["table_disk_builds"] == len(data_files(ds)) and entries(cache)


def test_a_rewritten_data_file_is_never_served_stale(ds, cache):
    epoch(ds)
    assert entries(cache)
    f = data_files(ds)[0]
    t = pq.read_table(f)
    i = t.schema.get_field_index("action")
    col = t.column("action").combine_chunks()
    moved = pc.add(col.flatten(), pa.scalar(1.0, pa.float32()))
    t = t.set_column(i, t.schema.field(i), pa.ListArray.from_arrays(col.offsets, moved).cast(col.type))
    pq.write_table(t, f)
    want = truth(ds)
    got, st = epoch(ds)
    assert_exact(got, want)  # the new values, not the cached ones
    assert st["table_disk_builds"] == 1


def flip(path, offset):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_damaged_cache_files_fall_back_to_parquet(ds, cache, capfd):
    want = truth(ds)
    epoch(ds)
    files = entries(cache)
    capfd.readouterr()
    # A byte of the column values (the end of the file): that episode's
    # checksum fails, it is read from Parquet, one warning names the entry.
    for e in files:
        flip(e, os.path.getsize(e) - 9)
    got, st = epoch(ds)
    assert_exact(got, want)
    err = capfd.readouterr().err
    assert "checksum mismatch" in err and "table cache" in err
    assert st["table_reads"] >= 1
    # A byte of the checksummed start (the last entry): the entry is a miss
    # and is rebuilt, with a warning.
    for e in entries(cache):
        with open(e, "rb") as fh:
            covered = int.from_bytes(fh.read(112)[108:112], "little") * 8
        flip(e, 112 + covered - 3)
    got, st = epoch(ds)
    assert_exact(got, want)
    assert st["table_disk_builds"] == len(data_files(ds))
    assert "decoding the file again" in capfd.readouterr().err
    # Garbage in place of an entry: same.
    for e in entries(cache):
        with open(e, "wb") as fh:
            fh.write(b"\0" * 50)
    got, st = epoch(ds)
    assert_exact(got, want)
    assert st["table_disk_builds"] == len(data_files(ds))


def test_an_unwritable_cache_folder_costs_nothing(ds, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("VF_CACHE_DIR", str(blocker))
    want = truth(ds)
    got, st = epoch(ds)
    assert_exact(got, want)
    assert st["table_disk_builds"] == 0 and st["table_disk_episodes"] == 0


def test_another_selection_of_episodes_builds_again(ds, cache):
    """An entry holds the episodes the loader that built it selected; a loader
    selecting others of the same file builds the file again (the newest
    selection is kept), and every row is right either way."""
    want = truth(ds)
    firsts = {}
    for f in data_files(ds):
        t = pq.read_table(f, columns=["episode_index", "index"])
        for e, i in zip(t.column("episode_index").to_pylist(), t.column("index").to_pylist()):
            firsts.setdefault(e, []).append(i)
    some = sorted(firsts)[::2]
    got, st = epoch(ds, episodes=some)
    assert_exact(got, {i: want[i] for e in some for i in firsts[e]})
    assert st["table_disk_builds"] == len(data_files(ds))
    got, st = epoch(ds)  # every episode: the entries lack half of them
    assert_exact(got, want)
    assert st["table_disk_builds"] == len(data_files(ds)) and st["table_reads"] == len(data_files(ds))
    got, st = epoch(ds)  # and now they hold them all
    assert_exact(got, want)
    assert st["table_disk_builds"] == 0 and st["table_reads"] == 0
    got, st = epoch(ds, episodes=some)  # a subset of what an entry holds: served as it is
    assert st["table_disk_builds"] == 0 and st["table_reads"] == 0


CHILD = r'''
import json, sys
sys.path[:0] = sys.argv[3].split(":")
import vlafeed
loader = vlafeed.Loader(sys.argv[1], mode="map", batch_size=8, keys=["action", "index"], rank=0, world_size=1,
                        output="numpy", seed=int(sys.argv[2]), threads=2, table_cache_bytes=2048)
n = sum(len(b["index"]) for b in loader)
st = loader.stats()
print(json.dumps(dict(n=n, builds=st["table_disk_builds"], reads=st["table_reads"])))
'''


def test_processes_building_together_build_each_file_once(ds, cache):
    """DataLoader workers or a node's ranks: several processes start on an
    empty cache at once; the entry's lock file lets one build each data
    file, the others wait and read it. Each build holds on for 1.5 s
    (VF_TEST_TABLE_BUILD_DELAY_MS) so that the processes surely overlap."""
    import json
    import subprocess
    import sys
    path = os.pathsep.join(p for p in sys.path if p)
    env = dict(os.environ, VF_TEST_TABLE_BUILD_DELAY_MS="1500")
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(ds), str(seed), path], stdout=subprocess.PIPE,
                              text=True, env=env) for seed in (1, 2, 3)]
    outs = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(o["n"] == sum(1 for _ in truth(ds)) for o in outs)
    assert sum(o["builds"] for o in outs) == len(data_files(ds))
    assert len(entries(cache)) == len(data_files(ds))
