"""Page-level reads (vf_pq_read_field_rows, issue 9): rows of one row group, decoding only the
pages that hold them. Checked against pyarrow on files pyarrow writes with small pages: flat and
nullable scalars, strings, lists (LeRobot's vector features), nested lists, structs, dictionary and
plain encodings, v1 and v2 data pages."""
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vlafeed import _native as native

N = 5000


def make_table(seed=0):
    rng = np.random.default_rng(seed)
    idx = np.arange(N, dtype=np.int64)
    maybe = [None if i % 7 == 3 else float(i) * 0.5 for i in range(N)]
    return pa.table({
        "index": idx,
        "episode_index": idx // 200,
        "timestamp": (idx % 200).astype(np.float32) / 30,
        "maybe": pa.array(maybe, type=pa.float64()),
        "label": pa.array([f"task {i % 13}" if i % 11 else None for i in range(N)], type=pa.string()),
        "state": pa.array([rng.random(6, dtype=np.float32) for _ in range(N)], type=pa.list_(pa.float32())),
        "ragged": pa.array([list(range(i % 5)) if i % 9 else None for i in range(N)], type=pa.list_(pa.int64())),
        "nested": pa.array([[[i, i + 1], [i + 2]] if i % 4 else [] for i in range(N)],
                           type=pa.list_(pa.list_(pa.int32()))),
        "pair": pa.array([{"a": i, "b": f"s{i % 3}"} if i % 6 else None for i in range(N)],
                         type=pa.struct([("a", pa.int64()), ("b", pa.string())])),
    })


def as_python(column):
    return [None if v is None else v for v in column.to_pylist()]


def close(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(a - b) <= 1e-6 * max(1.0, abs(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("dictionary", [True, False])
def test_rows_match_pyarrow(tmp_path, version, dictionary):
    table = make_table()
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=N, data_page_size=2048, data_page_version=version, write_batch_size=64,
                   use_dictionary=dictionary, write_statistics=True)
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups == 1
    rng = random.Random(7)
    ranges = [(0, N), (0, 1), (N - 1, 1), (1234, 200), (4800, 200), (2500, 0)]
    ranges += [(lo, rng.randrange(1, N - lo + 1)) for lo in (rng.randrange(N) for _ in range(12))]
    skipped_flat = 0
    for name in table.column_names:
        want_all = as_python(table.column(name))
        _, all_pages, none = native.parquet_read_rows(str(path), name, 0, 0, N)
        assert none == 0 and all_pages > 1, (name, all_pages)
        for first, count in ranges:
            got, decoded, skipped = native.parquet_read_rows(str(path), name, 0, first, count)
            assert decoded + skipped <= all_pages, (name, first, count)
            want = want_all[first:first + count]
            assert len(got) == count, (name, first, count)
            bad = [i for i, (g, w) in enumerate(zip(got, want)) if not close(g, w)]
            assert not bad, (name, first, count, bad[:3], got[bad[0]], want[bad[0]])
            if name == "index" and first >= 1000:
                skipped_flat += skipped
                assert skipped > 0, (first, count)  # a flat column's earlier pages are not decoded
            if count and first + count <= N // 2:
                assert decoded < all_pages, (name, first, count)  # nor any page after the range
            if (first, count) == (0, N):
                assert skipped == 0
    assert skipped_flat > 0
    # v2 pages tell their rows: repeated columns skip pages too
    if version == "2.0":
        _, decoded, skipped = native.parquet_read_rows(str(path), "state", 0, 4000, 10)
        assert skipped > 0 and decoded <= 2


def test_rows_errors(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(make_table(), path, row_group_size=2000, data_page_size=2048)
    with pytest.raises(IndexError, match=r"rows \[1990, \+20\) outside row group 0 \(2000 rows\)"):
        native.parquet_read_rows(str(path), "index", 0, 1990, 20)
    with pytest.raises(IndexError, match="row group 3 out of range"):
        native.parquet_read_rows(str(path), "index", 3, 0, 1)
    with pytest.raises(KeyError, match="no column 'nope'"):
        native.parquet_read_rows(str(path), "nope", 0, 0, 1)
    # later row groups: ranges are relative to the group
    got, _, _ = native.parquet_read_rows(str(path), "index", 2, 10, 3)
    assert got == [4010, 4011, 4012]


def test_damaged_page_after_range_is_not_read(tmp_path):
    """A page past the range is never fetched: damage there does not fail the read, and a read
    that reaches it names the file, column and page."""
    path = tmp_path / "t.parquet"
    table = pa.table({"index": np.arange(N, dtype=np.int64)})
    pq.write_table(table, path, row_group_size=N, data_page_size=1024, use_dictionary=False,
                   compression="none")
    raw = bytearray(path.read_bytes())
    # the last data page's values: overwrite the header magic of its page with garbage
    tail = raw.rfind((N - 1).to_bytes(8, "little"))
    assert tail > 0
    page = raw.rfind(b"\x15\x00\x15", 0, tail)  # page header: type=DATA_PAGE(0), sizes ...
    assert page > 0
    raw[page:page + 3] = b"\xff\xff\xff"
    path.write_bytes(bytes(raw))
    got, _, _ = native.parquet_read_rows(str(path), "index", 0, 0, 100)
    assert got == list(range(100))
    with pytest.raises(native.VlafeedError, match=r"column 'index', row group 0: page \d+: page header"):
        native.parquet_read_rows(str(path), "index", 0, N - 10, 10)
