"""Page-level reads (vf_pq_read_field_rows, issue 9): rows of one row group, decoding only the
pages that hold them. Checked against pyarrow on files pyarrow writes with small pages: flat and
nullable scalars, strings, lists (LeRobot's vector features), nested lists, structs, dictionary and
plain encodings, v1 and v2 data pages."""
import random
import struct

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
            if name in ("state", "nested") and first >= 1000:
                assert skipped > 0, (name, first, count)  # nor a repeated column's (rows from its levels)
            if count and first + count <= N // 2:
                assert decoded < all_pages, (name, first, count)  # nor any page after the range
            if (first, count) == (0, N):
                assert skipped == 0
    assert skipped_flat > 0
    # a few rows late in the group: one or two pages decoded, whatever the page version
    for name in ("index", "state", "nested", "label"):
        _, decoded, skipped = native.parquet_read_rows(str(path), name, 0, 4000, 10)
        assert skipped > 0 and decoded <= 2, (name, decoded, skipped)


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


# ---- rows that span pages ---------------------------------------------------------------------
# parquet-cpp (pyarrow) closes v1 pages at row boundaries, but older writers (parquet-mr before
# 1.12) did not: a page may start in the middle of a row. The file below is written by hand
# (Thrift compact protocol): one column list<int32> (required list, required elements; max
# repetition 1, max definition 1), uncompressed v1 pages of a fixed number of entries.


def _varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _zz(v):
    return _varint((v << 1) ^ (v >> 63))


class _Struct:
    def __init__(self):
        self.b, self.last = bytearray(), 0

    def field(self, fid, ftype, payload):
        d = fid - self.last
        self.b += bytes([(d << 4) | ftype]) if 0 < d <= 15 else bytes([ftype]) + _zz(fid)
        self.last = fid
        self.b += payload
        return self

    def i32(self, fid, v):
        return self.field(fid, 5, _zz(v))

    def i64(self, fid, v):
        return self.field(fid, 6, _zz(v))

    def str(self, fid, s):
        s = s.encode()
        return self.field(fid, 8, _varint(len(s)) + s)

    def struct(self, fid, st):
        return self.field(fid, 12, st.end())

    def list(self, fid, etype, items):
        head = bytes([(len(items) << 4) | etype]) if len(items) < 15 else bytes([0xF0 | etype]) + _varint(len(items))
        return self.field(fid, 9, head + b"".join(items))

    def end(self):
        return bytes(self.b) + b"\x00"


def _rle_levels(levels):
    """RLE runs only (bit width 1), with the 4-byte length prefix of v1 pages."""
    out, i = bytearray(), 0
    while i < len(levels):
        j = i
        while j < len(levels) and levels[j] == levels[i]:
            j += 1
        out += _varint((j - i) << 1) + bytes([levels[i]])
        i = j
    return struct.pack("<I", len(out)) + bytes(out)


def write_spanning_pages(path, rows, entries_per_page, levels=None, v2=False, num_rows_off=None):
    """levels: (rep, def, values) written as given instead of rows' (num_rows = rows). v2: DATA_PAGE_V2
    pages (levels uncompressed, no length prefixes); num_rows_off: {page: n} added to those pages'
    num_rows header field."""
    rep, dfn, vals = [], [], []
    for row in rows:
        if not row:
            rep.append(0), dfn.append(0)
        for k, v in enumerate(row):
            rep.append(0 if k == 0 else 1), dfn.append(1), vals.append(v)
    if levels is not None:
        rep, dfn, vals = levels
    body, vi, starts_mid = bytearray(b"PAR1"), 0, 0
    first = len(body)
    for page, lo in enumerate(range(0, len(rep), entries_per_page)):
        r, d = rep[lo:lo + entries_per_page], dfn[lo:lo + entries_per_page]
        nv = sum(d)
        values = struct.pack(f"<{nv}i", *vals[vi:vi + nv])
        vi += nv
        starts_mid += r[0] != 0
        if v2:
            rl, dl = _rle_levels(r)[4:], _rle_levels(d)[4:]
            payload = rl + dl + values
            num_rows = r.count(0) + (num_rows_off or {}).get(page, 0)
            dph = (_Struct().i32(1, len(r)).i32(2, len(r) - nv).i32(3, num_rows).i32(4, 0).i32(5, len(dl))
                   .i32(6, len(rl)).field(7, 2, b""))  # is_compressed = false
            header = _Struct().i32(1, 3).i32(2, len(payload)).i32(3, len(payload)).struct(8, dph).end()
        else:
            payload = _rle_levels(r) + _rle_levels(d) + values
            dph = _Struct().i32(1, len(r)).i32(2, 0).i32(3, 3).i32(4, 3)
            header = _Struct().i32(1, 0).i32(2, len(payload)).i32(3, len(payload)).struct(5, dph).end()
        body += header + payload
    size = len(body) - first
    schema = [
        _Struct().str(4, "schema").i32(5, 1).end(),
        _Struct().i32(3, 0).str(4, "v").i32(5, 1).i32(6, 3).end(),
        _Struct().i32(3, 2).str(4, "list").i32(5, 1).end(),
        _Struct().i32(1, 1).i32(3, 0).str(4, "element").end(),
    ]
    cmd = (_Struct().i32(1, 1).list(2, 5, [_zz(0), _zz(3)])
           .list(3, 8, [_varint(len(s)) + s for s in (b"v", b"list", b"element")])
           .i32(4, 0).i64(5, len(rep)).i64(6, size).i64(7, size).i64(9, first))
    chunk = _Struct().i64(2, first).struct(3, cmd).end()
    group = _Struct().list(1, 12, [chunk]).i64(2, size).i64(3, len(rows)).end()
    meta = (_Struct().i32(1, 1).list(2, 12, schema).i64(3, len(rows)).list(4, 12, [group])
            .str(6, "vlafeed test writer").end())
    path.write_bytes(bytes(body) + meta + struct.pack("<I", len(meta)) + b"PAR1")
    return starts_mid


@pytest.mark.parametrize("per_page", [7, 37, 64])
def test_rows_spanning_pages(tmp_path, per_page):
    rng = random.Random(per_page)
    rows = [[rng.randrange(-1000, 1000) for _ in range(rng.choice([0, 1, 5, 9, 23]))] for _ in range(400)]
    path = tmp_path / "span.parquet"
    assert write_spanning_pages(path, rows, per_page) > 0  # some pages begin mid-row
    assert pq.read_table(path).column("v").to_pylist() == rows  # pyarrow reads the file as written
    got, _, _ = native.parquet_read_rows(str(path), "v", 0, 0, len(rows))
    assert got == rows
    late = 0
    for first in list(range(0, 400, 13)) + [399]:
        for count in (1, 2, 17, 400 - first):
            count = min(count, 400 - first)
            got, decoded, skipped = native.parquet_read_rows(str(path), "v", 0, first, count)
            assert got == rows[first:first + count], (first, count)
            late += skipped if first > 200 else 0
    assert late > 0


def test_continuing_an_empty_list_is_refused(tmp_path):
    """Levels that continue a list the entry before left empty have no meaning: an error naming
    the column and page, whole or ranged, not a value glued onto an earlier list (which the
    reader used to do; the fuzzer found whole and ranged reads disagreeing on such a file)."""
    path = tmp_path / "bad.parquet"
    # row 0 = [5], row 1 = [] (definition 0), then an entry with repetition 1 "continuing" row 1
    write_spanning_pages(path, [[5], []], 64, levels=([0, 0, 1], [1, 0, 1], [5, 6]))
    for read in (lambda: native.parquet_read(str(path)), lambda: native.parquet_read_rows(str(path), "v", 0, 1, 1)):
        with pytest.raises(native.VlafeedError, match=r"column 'v.list.element', row group 0, page 0: level entry 2 "
                                                      r"continues a list \(repetition level 1\)"):
            read()


def test_v2_num_rows_must_agree_with_the_levels(tmp_path):
    """A ranged read counts a skipped v2 page's rows from its repetition levels; a header whose
    num_rows says otherwise is an error naming the column and page, not rows shifted silently."""
    rows = [[i, i + 1] for i in range(40)]
    path = tmp_path / "v2.parquet"
    write_spanning_pages(path, rows, 20, v2=True)
    assert pq.read_table(path).column("v").to_pylist() == rows  # pyarrow reads the hand-written v2 pages
    got, _, skipped = native.parquet_read_rows(str(path), "v", 0, 30, 5)
    assert got == rows[30:35] and skipped > 0
    write_spanning_pages(path, rows, 20, v2=True, num_rows_off={0: 1})  # page 0: 10 rows, header says 11
    with pytest.raises(native.VlafeedError, match=r"column 'v.list.element', row group 0, page 0: DATA_PAGE_V2 "
                                                  r"header says 11 rows, its repetition levels start 10"):
        native.parquet_read_rows(str(path), "v", 0, 30, 5)
