"""Map mode's page-level table reads (issue 26, part 3): a random episode of a
big column chunk is read from the page holding it (through the chunk's page
index, which also keeps the decoded dictionary), decoding only the values of
its rows. Rows must equal pyarrow's whatever the writer's layout: with and
without pyarrow's own page index (write_page_index), tiny and huge row
groups, many small pages, dictionary or plain encoding, vector (repeated)
columns; and across evictions of the loader's open data files (tiny bounds
from the environment). stats() counts the footers decoded."""
import glob
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

import vlafeed

import lerobot_reference as R

KEYS = ["action", "observation.state", "index"]


@pytest.fixture(scope="module")
def base(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("mappages")
    return R.make_sample_dataset(cli, root / "base", codec="h264", episodes=14, cameras=1, size="64x48",
                                 min_length=30, max_length=60, seed=11)


def rewrite(base, out, **write_options):
    """A copy of base whose data files pyarrow rewrote with write_options."""
    if not out.exists():
        shutil.copytree(base, out)
        for f in glob.glob(str(out / "data" / "*" / "*.parquet")):
            pq.write_table(pq.read_table(f), f, **write_options)
    return out


def truth(root):
    rows = {}
    for f in sorted((root / "data").rglob("*.parquet")):
        t = pq.read_table(str(f), columns=KEYS)
        for i, a, s in zip(t.column("index").to_pylist(), t.column("action").to_pylist(),
                           t.column("observation.state").to_pylist()):
            rows[i] = (np.array(a, dtype=np.float32), np.array(s, dtype=np.float32))
    return rows


def epoch(root, **kw):
    """One map-mode epoch, tabular only; the table cache small enough that
    misses read single episodes (not whole row groups), so reads start past
    a chunk's first row."""
    kw.setdefault("table_cache_bytes", 4096)
    kw.setdefault("table_disk_cache", False)  # the Parquet reads themselves (test_table_disk_cache.py: the other path)
    loader = vlafeed.Loader(str(root), mode="map", batch_size=8, keys=KEYS, rank=0, world_size=1,
                            output="numpy", seed=3, **kw)
    got = {}
    n = 0
    for b in loader:
        for i, a, s in zip(b["index"].tolist(), b["action"], b["observation.state"]):
            got[i] = (a.copy(), s.copy())
            n += 1
    st = loader.stats()
    loader.close()
    return got, n, st


def assert_rows(root, got, n):
    want = truth(root)
    assert n == len(want) and sorted(got) == sorted(want)
    for i, (a, s) in want.items():
        assert np.array_equal(got[i][0], a), ("action", i)
        assert np.array_equal(got[i][1], s), ("observation.state", i)


LAYOUTS = {
    # one row group, pages of a few rows, pyarrow's dictionary encoding
    "one-group-small-pages": dict(row_group_size=1 << 30, data_page_size=256),
    # the same with pyarrow's offset/column index written into the file
    "one-group-page-index": dict(row_group_size=1 << 30, data_page_size=256, write_page_index=True),
    # plain encoding (no dictionary), small pages
    "one-group-plain": dict(row_group_size=1 << 30, data_page_size=256, use_dictionary=False),
    # tiny row groups (a few rows each, episodes spanning many of them)
    "tiny-row-groups": dict(row_group_size=7, data_page_size=256),
    # pyarrow's defaults: one row group, one page per column
    "one-group-default": dict(row_group_size=1 << 30),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_rows_equal_pyarrow(base, layout, monkeypatch):
    root = rewrite(base, base.parent / layout, **LAYOUTS[layout])
    # A page index for every chunk, however small (the default is 128 KiB).
    monkeypatch.setenv("VF_PQ_PAGE_INDEX_MIN_BYTES", "1")
    got, n, st = epoch(root)
    assert_rows(root, got, n)
    if layout.startswith("one-group") and layout != "one-group-default":
        # random single-episode reads of a chunk of many pages skip pages
        assert st["table_pages_skipped"] > 0
    assert st["table_files_opened"] >= 1 and st["table_file_evictions"] == 0


@pytest.mark.parametrize("layout", ["one-group-small-pages", "tiny-row-groups"])
def test_rows_equal_pyarrow_across_file_evictions(base, layout, monkeypatch):
    root = rewrite(base, base.parent / layout, **LAYOUTS[layout])
    monkeypatch.setenv("VF_PQ_PAGE_INDEX_MIN_BYTES", "1")
    # Every data file is closed as soon as a read gives it back: each read
    # decodes the footer again and rebuilds the page index and dictionary.
    monkeypatch.setenv("VF_TABLE_FILES_BYTES", "1")
    got, n, st = epoch(root, threads=1)
    assert_rows(root, got, n)
    assert st["table_file_evictions"] > 0
    assert st["table_files_opened"] == st["table_file_evictions"] + st["table_files_open"]
    assert st["table_files_opened"] >= st["table_reads"]


def test_footer_decoded_once_per_file_per_epoch(base, monkeypatch):
    root = rewrite(base, base.parent / "one-group-small-pages", **LAYOUTS["one-group-small-pages"])
    monkeypatch.setenv("VF_PQ_PAGE_INDEX_MIN_BYTES", "1")
    files = len(list((root / "data").rglob("*.parquet")))
    got, n, st = epoch(root, threads=1)
    assert_rows(root, got, n)
    # many reads (the table cache holds almost nothing), one footer per file
    assert st["table_reads"] > files
    assert st["table_files_opened"] == files
    assert st["table_files_open"] == files and st["table_file_evictions"] == 0
    # the page indexes and dictionaries are held with the open files
    assert st["table_files_bytes"] > 0
    # with the bound at one file's worth of nothing, every read reopens
    monkeypatch.setenv("VF_TABLE_FILES_BYTES", "1")
    _, _, st2 = epoch(root, threads=1)
    assert st2["table_files_opened"] >= st2["table_reads"] > files


def test_corrupt_dictionary_page_is_reported(base, monkeypatch, tmp_path):
    """A damaged page read through the page index still fails with the
    file and column named (nothing is taken from a kept dictionary or index
    of another file)."""
    root = rewrite(base, base.parent / "one-group-small-pages", **LAYOUTS["one-group-small-pages"])
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    f = sorted((bad / "data").rglob("*.parquet"))[0]
    md = pq.ParquetFile(str(f)).metadata
    col = [md.row_group(0).column(i) for i in range(md.num_columns)
           if md.row_group(0).column(i).path_in_schema.startswith("action")][0]
    data = bytearray(f.read_bytes())
    start = col.dictionary_page_offset or col.data_page_offset
    end = col.data_page_offset + col.total_compressed_size
    for k in range(start + 40, end, 97):  # damage the chunk's payloads, leaving some headers readable
        data[k] ^= 0x5A
    f.write_bytes(bytes(data))
    monkeypatch.setenv("VF_PQ_PAGE_INDEX_MIN_BYTES", "1")
    with pytest.raises(Exception) as e:
        epoch(bad, threads=1)
    msg = str(e.value)
    assert f.name in msg and "action" in msg, msg


def test_dictionaries_dropped_before_files_are_closed(base, monkeypatch):
    """Over the open files' byte bound, the kept dictionaries go first: the
    files (footers, page indexes) stay open while they fit, and rows stay
    exact as dictionaries are decoded again."""
    root = rewrite(base, base.parent / "one-group-small-pages", **LAYOUTS["one-group-small-pages"])
    monkeypatch.setenv("VF_PQ_PAGE_INDEX_MIN_BYTES", "1")
    files = len(list((root / "data").rglob("*.parquet")))
    _, _, full = epoch(root, threads=1)
    assert full["table_file_trims"] == 0
    # a bound between the footers and page indexes alone and everything
    # (the dictionaries of these small files are a few KiB)
    monkeypatch.setenv("VF_TABLE_FILES_BYTES", str(full["table_files_bytes"] - 1))
    got, n, st = epoch(root, threads=1)
    assert_rows(root, got, n)
    assert st["table_file_trims"] > 0
    assert st["table_file_evictions"] == 0 and st["table_files_opened"] == files


def test_table_that_fits_is_read_in_file_order(base):
    """When the loader's whole table fits in the row cache, a miss in a big
    row group also takes the episodes around it in its file (one run, as in
    stream mode) instead of one random episode per miss; when it does not
    fit, each miss reads its own episode. Rows equal pyarrow's either way."""
    root = rewrite(base, base.parent / "one-group-small-pages", **LAYOUTS["one-group-small-pages"])
    import json
    info = json.loads((root / "meta" / "info.json").read_text())
    row_bytes = sum(int(np.prod(info["features"][k]["shape"])) * (4 if "float" in info["features"][k]["dtype"] else 8)
                    for k in KEYS)
    table = info["total_frames"] * row_bytes
    episodes = info["total_episodes"]
    # between a quarter and three quarters of the cache: the row group is
    # too big to take whole as a row group, the table fits
    got, n, fits = epoch(root, threads=1, table_cache_bytes=2 * table)
    assert_rows(root, got, n)
    assert fits["table_reads"] == 1 and fits["table_episodes"] == episodes
    got, n, small = epoch(root, threads=1, table_cache_bytes=table // 2)
    assert_rows(root, got, n)
    assert small["table_reads"] >= episodes - 1
