"""Map mode over data files written with one big row group (pyarrow's and
LeRobot's converter layout): a miss decodes the row group once and keeps
every episode lying inside it (a row-group cache at episode granularity,
bounded by table_cache_bytes), instead of decoding the whole row group again
for each episode a random batch touches. Counted through stats(): row groups
decoded and table reads; values checked against pyarrow."""
import glob
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

import vlafeed

import lerobot_reference as R


@pytest.fixture(scope="module")
def datasets(cli, tmp_path_factory):
    base = tmp_path_factory.mktemp("rgcache")
    per_episode = R.make_sample_dataset(cli, base / "per-episode", codec="h264", episodes=12, cameras=1,
                                        size="64x48", min_length=20, max_length=40, seed=5)
    one_group = base / "one-group"
    shutil.copytree(per_episode, one_group)
    for f in glob.glob(str(one_group / "data" / "*" / "*.parquet")):
        pq.write_table(pq.read_table(f), f, row_group_size=1 << 30)
        assert pq.ParquetFile(f).num_row_groups == 1
    return per_episode, one_group


def epoch(root, **kw):
    loader = vlafeed.Loader(str(root), mode="map", batch_size=8, keys=["action", "index"], rank=0, world_size=1,
                            output="numpy", **kw)
    index, action = [], []
    for b in loader:
        index.extend(b["index"].tolist())
        action.extend(b["action"])
    st = loader.stats()
    loader.close()
    return index, np.array(action), st


def truth(root):
    t = pq.read_table(str(next((root / "data").rglob("*.parquet"))), columns=["index", "action"])
    return {i: np.array(a, dtype=np.float32) for i, a in zip(t.column("index").to_pylist(),
                                                              t.column("action").to_pylist())}


def assert_exact(index, action, want):
    """Every row once, each action equal to pyarrow's."""
    assert sorted(index) == sorted(want)
    for i, a in zip(index, action):
        assert np.array_equal(a, want[i]), i


def test_one_big_row_group_is_decoded_once(datasets):
    per_episode, one_group = datasets
    want = truth(one_group)
    # One assembler thread: with two, the second may miss while the first is
    # still reading the footer, and read its own episode alone (2 decodes).
    index, action, st = epoch(one_group, threads=1)
    assert sorted(index) == sorted(want)
    for i, a in zip(index, action):
        assert np.array_equal(a, want[i]), i
    # 12 episodes, random positions: the first miss decodes the file's only
    # row group and keeps all 12 episodes (under the 65,536-row budget).
    assert st["table_row_groups"] == 1 and st["table_reads"] == 1
    assert st["table_episodes"] == 12
    # With the default threads, at most one decode per thread.
    _, _, st_mt = epoch(one_group)
    assert st_mt["table_row_groups"] <= 4
    # One row group per episode: nothing shares a row group, one decode each.
    index2, _, st2 = epoch(per_episode, threads=1)
    assert sorted(index2) == sorted(want)
    assert st2["table_row_groups"] == 12


def test_a_small_cache_still_gives_exact_rows(datasets):
    _, one_group = datasets
    want = truth(one_group)
    index, action, st = epoch(one_group, table_cache_bytes=2048, table_disk_cache=False)
    assert_exact(index, action, want)
    # A row group that does not fit in a quarter of the cache is not taken
    # whole: each miss reads it again for its own episode (the behaviour for
    # files written as one huge row group; page-level reads keep that to the
    # episode's pages), every row still right.
    assert st["table_evictions"] > 0 and st["table_row_groups"] > 1


@pytest.fixture(scope="module")
def small_pages(datasets, tmp_path_factory):
    """The one-row-group layout with small plain-encoded data pages (pyarrow falls back from
    dictionary to plain pages once a column's dictionary passes 1 MiB, as in a big converter file)."""
    _, one_group = datasets
    root = tmp_path_factory.mktemp("pages") / "small-pages"
    shutil.copytree(one_group, root)
    for f in glob.glob(str(root / "data" / "*" / "*.parquet")):
        pq.write_table(pq.read_table(f), f, row_group_size=1 << 30, data_page_size=512, use_dictionary=False,
                       write_batch_size=16)
        assert pq.ParquetFile(f).num_row_groups == 1
    return root


def test_a_miss_in_a_big_row_group_decodes_only_its_pages(small_pages):
    """Page-level reads: a row group too big to keep whole is read for one episode's rows only;
    the pages before and after them are not decoded (counted), and every row is still exact."""
    want = truth(small_pages)
    index, action, st = epoch(small_pages, table_cache_bytes=2048, table_disk_cache=False)
    assert_exact(index, action, want)
    assert st["table_row_groups"] > 1 and st["table_pages_skipped"] > 0


@pytest.mark.parametrize("mode", ["stream", "pool"])
def test_a_rank_decodes_only_its_share_of_a_big_row_group(small_pages, mode):
    """Three ranks over one file written as a single row group: each decodes only the pages of
    its own episodes (counted against one loader over everything), the later ranks skip the pages
    before theirs unread, and together they deliver every row, exact."""
    want = truth(small_pages)

    def run(rank, world):
        loader = vlafeed.Loader(str(small_pages), mode=mode, batch_size=8, keys=["action", "index"], rank=rank,
                                world_size=world, shuffle=False, output="numpy", partition="episode")
        seen = []
        for b in loader:
            for i, a in zip(b["index"].tolist(), b["action"]):
                assert np.array_equal(a, want[i]), i
                seen.append(i)
        st = loader.stats()
        loader.close()
        return seen, st

    seen_all, whole = run(0, 1)
    assert sorted(seen_all) == sorted(want) and whole["table_pages_skipped"] == 0
    seen = []
    for rank in range(3):
        got, st = run(rank, 3)
        seen += got
        assert st["table_pages_decoded"] < whole["table_pages_decoded"], (rank, st, whole)
        if rank > 0:
            assert st["table_pages_skipped"] > 0, (rank, st)
    assert set(seen) == set(want)


@pytest.mark.parametrize("dictionary", [False, True])
def test_page_index_over_pyarrow_pages(datasets, tmp_path_factory, monkeypatch, dictionary):
    """The page index (issue 26): every chunk gets one (the size threshold lowered for these
    small files) and a miss jumps to the page of its episode's rows. pyarrow's v1 pages of list
    columns do not tell their rows, so the index counts them from the repetition levels; rows
    straddling pages, dictionary pages decoded only for dictionary-encoded pages. Every row of a
    shuffled epoch through a 2 KiB row cache equals pyarrow's."""
    _, one_group = datasets
    root = tmp_path_factory.mktemp("pindex") / f"pages-{dictionary}"
    shutil.copytree(one_group, root)
    for f in glob.glob(str(root / "data" / "*" / "*.parquet")):
        pq.write_table(pq.read_table(f), f, row_group_size=1 << 30, data_page_size=256, use_dictionary=dictionary,
                       write_batch_size=8, dictionary_pagesize_limit=512)
    monkeypatch.setenv("VF_PQ_PAGE_INDEX_MIN_BYTES", "1")
    want = truth(root)
    index, action, st = epoch(root, table_cache_bytes=2048, seed=3, threads=1, table_disk_cache=False)  # one thread: counts exact
    assert_exact(index, action, want)
    assert st["table_pages_skipped"] > 0
    # Without the index (threshold above the files): the same rows, and no fewer pages decoded
    # (the index mostly saves reading, decompressing and counting the pages before a range,
    # which the counters do not show; tests/c/test_pq_cache.c checks that it is built and used).
    monkeypatch.setenv("VF_PQ_PAGE_INDEX_MIN_BYTES", str(1 << 40))
    index2, action2, st2 = epoch(root, table_cache_bytes=2048, seed=3, threads=1, table_disk_cache=False)
    assert index2 == index and np.array_equal(action2, action)
    assert st["table_pages_decoded"] <= st2["table_pages_decoded"]
