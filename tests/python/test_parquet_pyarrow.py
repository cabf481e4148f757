"""The C Parquet reader against pyarrow, value for value.

A corpus is generated with pyarrow in tmp_path (every codec, data page v1
and v2, dictionary on/off and a forced dictionary->PLAIN fallback, tiny
pages, several row groups, nulls at every nesting level, empty and null
lists, nested lists, fixed-size lists, structs, every integer width,
float16, strings, binary), plus legacy list layouts pyarrow cannot write
(built here with a minimal Thrift writer), plus the 100 real LeRobot data
files of the shared fixtures. Every column of every file, whole and per
row group, must equal `pyarrow.parquet.read_table(...).column(c).to_pylist()`.
"""
import math
import random
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vlafeed import _native

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


# ---- comparison -------------------------------------------------------------


def same(a, b):
    """Equality that treats NaN as equal to NaN and keeps bool/int apart."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def assert_matches_pyarrow(path, check_row_groups=True):
    table = pq.read_table(path)
    ours = _native.parquet_read(str(path))
    assert list(ours) == table.column_names
    for name in table.column_names:
        expected = table.column(name).to_pylist()
        got = ours[name]
        assert len(got) == len(expected), name
        if not same(got, expected):
            bad = next(i for i, (x, y) in enumerate(zip(got, expected)) if not same(x, y))
            raise AssertionError(f"{path}: column {name!r} row {bad}: {got[bad]!r} != {expected[bad]!r}")
    if check_row_groups:
        f = pq.ParquetFile(path)
        for g in range(f.num_row_groups):
            rg = f.read_row_group(g)
            mine = _native.parquet_read(str(path), row_group=g)
            for name in rg.column_names:
                assert same(mine[name], rg.column(name).to_pylist()), (path, g, name)
    return table


# ---- corpus -------------------------------------------------------------------


def scalar_table(n, seed=0):
    rng = random.Random(seed)

    def maybe(v, p=0.15):
        return None if rng.random() < p else v

    ints = {}
    for bits in (8, 16, 32, 64):
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        ints[f"i{bits}"] = pa.array([maybe(rng.choice([lo, hi, 0, rng.randint(lo, hi)])) for _ in range(n)],
                                    getattr(pa, f"int{bits}")())
        ints[f"u{bits}"] = pa.array([maybe(rng.choice([0, 2 ** bits - 1, rng.randint(0, 2 ** bits - 1)])) for _ in range(n)],
                                    getattr(pa, f"uint{bits}")())
    words = ["", "a", "héllo", "日本語", "emoji 🤖", "x" * 300, "tab\tnew\nline"]
    cols = dict(ints)
    cols["b"] = pa.array([maybe(rng.random() < 0.5) for _ in range(n)], pa.bool_())
    cols["f16"] = pa.array([maybe(np.float16(rng.uniform(-1000, 1000))) for _ in range(n)], pa.float16())
    cols["f32"] = pa.array([maybe(rng.uniform(-1, 1)) for _ in range(n)], pa.float32())
    cols["f64"] = pa.array([maybe(rng.uniform(-1e300, 1e300)) for _ in range(n)], pa.float64())
    cols["s"] = pa.array([maybe(rng.choice(words) + str(rng.randint(0, 5))) for _ in range(n)], pa.string())
    cols["s_empty"] = pa.array([maybe("") for _ in range(n)], pa.string())
    cols["bin"] = pa.array([maybe(bytes(rng.randrange(256) for _ in range(rng.randint(0, 20)))) for _ in range(n)],
                           pa.binary())
    cols["fsb"] = pa.array([maybe(bytes(rng.randrange(256) for _ in range(5))) for _ in range(n)], pa.binary(5))
    cols["req"] = pa.array(list(range(n)), pa.int64())
    schema = pa.schema([pa.field(k, v.type, nullable=(k != "req")) for k, v in cols.items()])
    return pa.table(cols, schema=schema)


def nested_table(n, seed=1):
    rng = random.Random(seed)

    def maybe(v, p=0.15):
        return None if rng.random() < p else v

    def int_list():
        return maybe([maybe(rng.randint(-5, 5)) for _ in range(rng.choice([0, 0, 1, 2, 5]))])

    def deep():
        return maybe([maybe([maybe([maybe(rng.uniform(-1, 1)) for _ in range(rng.randint(0, 3))])
                             for _ in range(rng.randint(0, 3))]) for _ in range(rng.randint(0, 3))])

    image_t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rec_t = pa.struct([("a", pa.int32()), ("tags", pa.list_(pa.string()))])
    outer_t = pa.struct([("inner", pa.struct([("x", pa.float64()), ("y", pa.int16())])), ("name", pa.string())])
    return pa.table({
        "ints": pa.array([int_list() for _ in range(n)], pa.list_(pa.int32())),
        "deep": pa.array([deep() for _ in range(n)], pa.list_(pa.list_(pa.list_(pa.float64())))),
        "vec": pa.array([maybe([rng.uniform(-1, 1) for _ in range(6)]) for _ in range(n)],
                        pa.list_(pa.float32(), 6)),
        "vec_req": pa.array([[rng.uniform(-1, 1) for _ in range(3)] for _ in range(n)], pa.list_(pa.float32(), 3)),
        "image": pa.array([maybe({"bytes": maybe(bytes([rng.randrange(256)]) * rng.randint(0, 4)),
                                  "path": maybe(f"img_{i}.png")}) for i in range(n)], image_t),
        "records": pa.array([maybe([maybe({"a": maybe(rng.randint(0, 9)),
                                           "tags": maybe([maybe(rng.choice(["p", "q", ""]))
                                                          for _ in range(rng.randint(0, 2))])})
                                    for _ in range(rng.randint(0, 3))]) for _ in range(n)], pa.list_(rec_t)),
        "outer": pa.array([maybe({"inner": maybe({"x": maybe(rng.random()), "y": maybe(rng.randint(-100, 100))}),
                                  "name": maybe(rng.choice(["n1", "n2"]))}) for _ in range(n)], outer_t),
        "strs": pa.array([maybe([maybe(rng.choice(["", "ab", "ü"])) for _ in range(rng.randint(0, 4))])
                          for _ in range(n)], pa.list_(pa.string())),
        "large": pa.array([maybe([rng.randint(0, 3)] * rng.randint(0, 3)) for _ in range(n)],
                          pa.large_list(pa.int64())),
        "bools": pa.array([maybe([maybe(rng.random() < 0.5) for _ in range(rng.randint(0, 4))]) for _ in range(n)],
                          pa.list_(pa.bool_())),
    })


def lerobot_table(episodes=3, frames=50, dim=26, seed=2):
    rng = np.random.default_rng(seed)
    n = episodes * frames
    frame = np.tile(np.arange(frames), episodes)
    ep = np.repeat(np.arange(episodes), frames)
    state = rng.standard_normal((n, dim)).astype(np.float32)
    return pa.table({
        "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), dim),
        "action": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * dim).astype(np.float32)), dim),
        "timestamp": pa.array((frame / 30.0).astype(np.float32)),
        "frame_index": pa.array(frame, pa.int64()),
        "episode_index": pa.array(ep, pa.int64()),
        "index": pa.array(np.arange(n), pa.int64()),
        "task_index": pa.array(ep % 2, pa.int64()),
    })


CODECS = ["none", "snappy", "gzip", "zstd"]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
@pytest.mark.parametrize("dictionary", [True, False])
def test_codecs_page_versions_dictionary(tmp_path, codec, page_version, dictionary):
    table = pa.concat_tables([scalar_table(700, seed=3)]).append_column("nest", nested_table(700, seed=4).column("deep"))
    path = tmp_path / f"t_{codec}_{page_version}_{dictionary}.parquet"
    pq.write_table(table, path, compression=codec, data_page_version=page_version, use_dictionary=dictionary,
                   row_group_size=300, data_page_size=512, write_batch_size=64)
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups == 3
    expected_codec = "UNCOMPRESSED" if codec == "none" else codec.upper()
    info = _native.parquet_info(str(path))
    assert {c["codec"] for g in info["row_groups"] for c in g["columns"]} == {expected_codec}
    assert_matches_pyarrow(path)


def test_many_pages_per_chunk(tmp_path):
    path = tmp_path / "pages.parquet"
    pq.write_table(nested_table(3000, seed=5), path, data_page_size=128, write_batch_size=16, row_group_size=1000)
    # Make sure the file really has many pages per column chunk.
    col = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert col.total_compressed_size > 10 * 128
    assert_matches_pyarrow(path)


def test_dictionary_fallback_to_plain_mid_chunk(tmp_path):
    rng = np.random.default_rng(7)
    n = 20000
    table = pa.table({
        "f": pa.array(rng.standard_normal(n).astype(np.float32)),
        "d": pa.array(rng.standard_normal(n)),
        "s": pa.array([f"value-{i}-{rng.integers(1 << 30)}" for i in range(n)]),
        "low": pa.array(rng.integers(0, 4, n)),
        "v": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 8).astype(np.float32)), 8),
    })
    for version in ("1.0", "2.0"):
        path = tmp_path / f"fallback_{version}.parquet"
        pq.write_table(table, path, dictionary_pagesize_limit=2048, data_page_size=4096, data_page_version=version)
        rg = pq.ParquetFile(path).metadata.row_group(0)
        for i in (0, 1, 2, 4):
            encodings = set(rg.column(i).encodings)
            assert "PLAIN" in encodings and "RLE_DICTIONARY" in encodings, encodings
            assert rg.column(i).has_dictionary_page
        assert_matches_pyarrow(path)


def test_nulls_at_every_level(tmp_path):
    table = nested_table(2000, seed=8)
    for version in ("1.0", "2.0"):
        path = tmp_path / f"nested_{version}.parquet"
        pq.write_table(table, path, data_page_version=version, row_group_size=700, data_page_size=1024)
        assert_matches_pyarrow(path)
    # Whole-column null and empty-list edge cases.
    edge = pa.table({
        "all_null": pa.array([None] * 10, pa.list_(pa.int32())),
        "all_empty": pa.array([[]] * 10, pa.list_(pa.int32())),
        "null_elems": pa.array([[None, None]] * 10, pa.list_(pa.int32())),
        "all_null_scalar": pa.array([None] * 10, pa.float64()),
        "null_struct": pa.array([None] * 10, pa.struct([("a", pa.int8())])),
    })
    path = tmp_path / "edge.parquet"
    pq.write_table(edge, path)
    assert_matches_pyarrow(path)


def test_empty_table_and_empty_row_groups(tmp_path):
    table = scalar_table(0)
    path = tmp_path / "empty.parquet"
    pq.write_table(table, path)
    assert _native.parquet_info(str(path))["num_rows"] == 0
    ours = _native.parquet_read(str(path))
    assert all(v == [] for v in ours.values())
    assert set(ours) == set(table.column_names)


def test_integer_widths_and_types_resolved(tmp_path):
    path = tmp_path / "types.parquet"
    pq.write_table(scalar_table(300), path)
    info = _native.parquet_info(str(path))
    types = {leaf["path"][0]: leaf["type"] for leaf in info["leaves"]}
    for bits in (8, 16, 32, 64):
        assert types[f"i{bits}"] == f"int{bits}"
        assert types[f"u{bits}"] == f"uint{bits}"
    assert types["f16"] == "float16" and types["s"] == "string" and types["bin"] == "binary"
    assert types["fsb"] == "fixed_binary" and types["b"] == "bool"
    assert_matches_pyarrow(path)


def test_levels_match_pyarrow_schema(tmp_path):
    path = tmp_path / "levels.parquet"
    pq.write_table(nested_table(50), path)
    schema = pq.ParquetFile(path).schema
    info = _native.parquet_info(str(path))
    assert len(info["leaves"]) == len(schema)
    for i, leaf in enumerate(info["leaves"]):
        col = schema.column(i)
        assert leaf["max_def"] == col.max_definition_level, col.path
        assert leaf["max_rep"] == col.max_repetition_level, col.path
        assert ".".join(leaf["path"]) == col.path


def test_byte_stream_split(tmp_path):
    rng = np.random.default_rng(9)
    table = pa.table({"f": pa.array(rng.standard_normal(1000).astype(np.float32)),
                      "d": pa.array(rng.standard_normal(1000)),
                      "i": pa.array(rng.integers(-1000, 1000, 1000), pa.int32()),
                      "h": pa.array(rng.standard_normal(1000).astype(np.float16))})
    path = tmp_path / "bss.parquet"
    pq.write_table(table, path, use_dictionary=False, use_byte_stream_split=True)
    assert_matches_pyarrow(path)


def test_unsupported_encoding_error_is_clear(tmp_path):
    table = pa.table({"x": pa.array(range(100), pa.int64())})
    path = tmp_path / "delta.parquet"
    pq.write_table(table, path, use_dictionary=False, column_encoding={"x": "DELTA_BINARY_PACKED"})
    with pytest.raises(_native.VlafeedError) as e:
        _native.parquet_read(str(path))
    assert "DELTA_BINARY_PACKED" in str(e.value) and "delta.parquet" in str(e.value) and "'x'" in str(e.value)


@pytest.mark.parametrize("codec,name", [("lz4", "LZ4_RAW"), ("brotli", "BROTLI")])
def test_unsupported_codec_error_names_codec(tmp_path, codec, name):
    path = tmp_path / f"{codec}.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), path, compression=codec)
    _native.parquet_info(str(path))  # the footer itself is readable
    with pytest.raises(_native.VlafeedError) as e:
        _native.parquet_read(str(path))
    assert name in str(e.value) and "not supported" in str(e.value)


def test_non_compliant_nested_names(tmp_path):
    # pyarrow's older layout: repeated group "list" with element named "item".
    path = tmp_path / "item.parquet"
    pq.write_table(nested_table(300, seed=10), path, use_compliant_nested_type=False)
    assert any(leaf["path"][-1] == "item" for leaf in _native.parquet_info(str(path))["leaves"])
    assert_matches_pyarrow(path)


def test_lerobot_like_file_and_projection(tmp_path):
    table = lerobot_table(episodes=5, frames=40)
    path = tmp_path / "episodes.parquet"
    pq.write_table(table, path, row_group_size=40, compression="snappy")
    assert_matches_pyarrow(path)
    cols = _native.parquet_read(str(path), columns=["index", "observation.state"])
    assert list(cols) == ["index", "observation.state"]
    assert cols["index"] == list(range(200))
    with pytest.raises(KeyError):
        _native.parquet_read(str(path), columns=["nope"])
    with pytest.raises(IndexError):
        _native.parquet_read(str(path), row_group=5)
    # Row-group selection by statistics: one row group per episode.
    assert _native.parquet_select_row_groups(str(path), "episode_index", 2, 3) == [2, 3]
    assert _native.parquet_select_row_groups(str(path), "index", 39, 40) == [0, 1]
    assert _native.parquet_select_row_groups(str(path), "index", 1000, 2000) == []
    meta = pq.ParquetFile(path).metadata
    info = _native.parquet_info(str(path))
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(5).statistics
        assert info["row_groups"][g]["columns"][5]["min"] == stats.min
        assert info["row_groups"][g]["columns"][5]["max"] == stats.max
    with pytest.raises(ValueError):
        _native.parquet_select_row_groups(str(path), "observation.state", 0, 1)


def test_large_random_table(tmp_path):
    rng = np.random.default_rng(11)
    n = 60000
    table = pa.table({
        "a": pa.array(rng.integers(-(1 << 62), 1 << 62, n)),
        "b": pa.array(np.where(rng.random(n) < 0.1, np.nan, rng.standard_normal(n))),
        "c": pa.array(rng.integers(0, 1000, n).astype(np.int16)),
        "d": pa.array([None if x < 0.05 else int(x * 1e6) for x in rng.random(n)], pa.uint32()),
        "v": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 16).astype(np.float32)), 16),
    })
    path = tmp_path / "large.parquet"
    pq.write_table(table, path, row_group_size=25000)
    assert_matches_pyarrow(path)


# ---- legacy list layouts (hand-written file) ------------------------------------


class ThriftWriter:
    """Just enough of the Thrift compact protocol to write a footer."""

    def __init__(self):
        self.out = bytearray()
        self.last = [0]

    def varint(self, v):
        while True:
            b = v & 0x7F
            v >>= 7
            if v:
                self.out.append(b | 0x80)
            else:
                self.out.append(b)
                return

    def field(self, fid, ftype):
        delta = fid - self.last[-1]
        if 0 < delta <= 15:
            self.out.append(delta << 4 | ftype)
        else:
            self.out.append(ftype)
            self.varint((fid << 1) ^ (fid >> 63))
        self.last[-1] = fid

    def i32(self, fid, v):
        self.field(fid, 5)
        self.varint((v << 1) ^ (v >> 63))

    def i64(self, fid, v):
        self.field(fid, 6)
        self.varint((v << 1) ^ (v >> 63))

    def binary(self, fid, data):
        if isinstance(data, str):
            data = data.encode()
        self.field(fid, 8)
        self.varint(len(data))
        self.out += data

    def list_begin(self, fid, etype, n):
        self.field(fid, 9)
        if n < 15:
            self.out.append(n << 4 | etype)
        else:
            self.out.append(0xF0 | etype)
            self.varint(n)

    def struct_begin(self, fid=None):
        if fid is not None:
            self.field(fid, 12)
        self.last.append(0)

    def struct_end(self):
        self.out.append(0)
        self.last.pop()


def rle_bitpacked(levels, width):
    """Levels as one bit-packed run of the RLE/bit-packed hybrid."""
    groups = (len(levels) + 7) // 8
    padded = list(levels) + [0] * (groups * 8 - len(levels))
    bits = 0
    for i, v in enumerate(padded):
        bits |= v << (i * width)
    out = bytearray()
    w = ThriftWriter()
    w.varint(groups << 1 | 1)
    out += w.out
    out += bits.to_bytes(groups * width, "little")
    return bytes(out)


def plain(values, physical):
    if physical == 1:
        return b"".join(struct.pack("<i", v) for v in values)
    if physical == 2:
        return b"".join(struct.pack("<q", v) for v in values)
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def write_legacy_file(path, schema, columns, num_rows):
    """schema: pre-order list of (name, repetition, physical or None,
    num_children, converted or None); columns: per leaf (path, physical,
    max_def, max_rep, entries [(rep, def, value-or-None)])."""
    body = bytearray(b"PAR1")
    chunks = []
    for col_path, physical, max_def, max_rep, entries in columns:
        page = bytearray()
        if max_rep:
            lv = rle_bitpacked([e[0] for e in entries], max_rep.bit_length())
            page += struct.pack("<I", len(lv)) + lv
        if max_def:
            lv = rle_bitpacked([e[1] for e in entries], max_def.bit_length())
            page += struct.pack("<I", len(lv)) + lv
        page += plain([e[2] for e in entries if e[1] == max_def], physical)
        h = ThriftWriter()
        h.struct_begin()
        h.i32(1, 0)
        h.i32(2, len(page))
        h.i32(3, len(page))
        h.struct_begin(5)
        h.i32(1, len(entries))
        h.i32(2, 0)
        h.i32(3, 3)
        h.i32(4, 3)
        h.struct_end()
        h.struct_end()
        offset = len(body)
        body += h.out + page
        chunks.append((col_path, physical, len(entries), offset, len(h.out) + len(page)))
    t = ThriftWriter()
    t.struct_begin()
    t.i32(1, 1)
    t.list_begin(2, 12, len(schema))
    for name, rep, physical, nchildren, converted in schema:
        t.struct_begin()
        if physical is not None:
            t.i32(1, physical)
        if rep is not None:
            t.i32(3, rep)
        t.binary(4, name)
        if nchildren:
            t.i32(5, nchildren)
        if converted is not None:
            t.i32(6, converted)
        t.struct_end()
    t.i64(3, num_rows)
    t.list_begin(4, 12, 1)
    t.struct_begin()
    t.list_begin(1, 12, len(chunks))
    for col_path, physical, nvalues, offset, size in chunks:
        t.struct_begin()
        t.i64(2, offset)
        t.struct_begin(3)
        t.i32(1, physical)
        t.list_begin(2, 5, 2)
        t.varint(0)
        t.varint(6)  # encodings PLAIN, RLE (zigzag 0, 3)
        t.list_begin(3, 8, len(col_path))
        for p in col_path:
            t.varint(len(p.encode()))
            t.out += p.encode()
        t.i32(4, 0)
        t.i64(5, nvalues)
        t.i64(6, size)
        t.i64(7, size)
        t.i64(9, offset)
        t.struct_end()
        t.struct_end()
    t.i64(2, sum(c[4] for c in chunks))
    t.i64(3, num_rows)
    t.struct_end()
    t.binary(6, "vlafeed legacy test writer")
    t.struct_end()
    body += t.out + struct.pack("<I", len(t.out)) + b"PAR1"
    path.write_bytes(bytes(body))


REQ, OPT, REP = 0, 1, 2
INT32, INT64, BYTES = 1, 2, 6
UTF8, LIST = 0, 3


def test_legacy_two_level_lists(tmp_path):
    schema = [
        ("schema", None, None, 6, None),
        ("legacy_ints", REP, INT32, 0, None),                      # bare repeated primitive
        ("two_level", OPT, None, 1, LIST), ("element", REP, INT32, 0, None),
        ("arr", OPT, None, 1, LIST), ("array", REP, None, 1, None), ("item", OPT, INT32, 0, None),
        ("tup", OPT, None, 1, LIST), ("tup_tuple", REP, None, 1, None), ("s", REQ, BYTES, 0, UTF8),
        ("rg", REP, None, 2, None), ("a", OPT, INT32, 0, None), ("b", OPT, BYTES, 0, UTF8),
        ("outer", REP, None, 1, None), ("inner", REP, INT64, 0, None),
    ]
    columns = [
        (["legacy_ints"], INT32, 1, 1, [(0, 1, 1), (1, 1, 2), (0, 0, None), (0, 1, 3), (0, 1, 4), (1, 1, 5), (1, 1, 6)]),
        (["two_level", "element"], INT32, 2, 1, [(0, 2, 7), (0, 0, None), (0, 1, None), (0, 2, 8), (1, 2, 9)]),
        (["arr", "array", "item"], INT32, 3, 1, [(0, 3, 1), (1, 2, None), (0, 1, None), (0, 0, None), (0, 3, 2)]),
        (["tup", "tup_tuple", "s"], BYTES, 2, 1, [(0, 2, b"a"), (0, 2, b"b"), (1, 2, b"c"), (0, 0, None), (0, 1, None)]),
        (["rg", "a"], INT32, 2, 1, [(0, 2, 1), (0, 0, None), (0, 1, None), (1, 2, 3), (0, 0, None)]),
        (["rg", "b"], BYTES, 2, 1, [(0, 2, b"x"), (0, 0, None), (0, 2, b"y"), (1, 1, None), (0, 0, None)]),
        (["outer", "inner"], INT64, 2, 2, [(0, 2, 1), (2, 2, 2), (1, 1, None), (0, 0, None), (0, 2, 3), (0, 0, None)]),
    ]
    path = tmp_path / "legacy.parquet"
    write_legacy_file(path, schema, columns, num_rows=4)
    table = assert_matches_pyarrow(path)
    # The shapes are what the LIST spec's compatibility rules say.
    assert table.column("legacy_ints").to_pylist() == [[1, 2], [], [3], [4, 5, 6]]
    assert table.column("two_level").to_pylist() == [[7], None, [], [8, 9]]
    assert table.column("arr").to_pylist() == [[{"item": 1}, {"item": None}], [], None, [{"item": 2}]]
    assert table.column("tup").to_pylist() == [[{"s": "a"}], [{"s": "b"}, {"s": "c"}], None, []]


# ---- property test -----------------------------------------------------------------

leaf_types = st.sampled_from([pa.int8(), pa.uint16(), pa.int32(), pa.int64(), pa.float32(), pa.float64(),
                              pa.string(), pa.binary(), pa.bool_(), pa.float16()])


def arrow_types(depth=2):
    if depth == 0:
        return leaf_types
    inner = arrow_types(depth - 1)
    return st.one_of(leaf_types, inner.map(pa.list_),
                     st.lists(inner, min_size=1, max_size=3).map(
                         lambda ts: pa.struct([(f"f{i}", t) for i, t in enumerate(ts)])))


def values_for(t, draw, rows):
    def one(t):
        if draw(st.integers(0, 9)) == 0:
            return None
        if pa.types.is_list(t):
            return [one(t.value_type) for _ in range(draw(st.integers(0, 3)))]
        if pa.types.is_struct(t):
            return {t.field(i).name: one(t.field(i).type) for i in range(t.num_fields)}
        if pa.types.is_boolean(t):
            return draw(st.booleans())
        if pa.types.is_integer(t):
            info = np.iinfo(t.to_pandas_dtype())
            return draw(st.integers(int(info.min), int(info.max)))
        if pa.types.is_float16(t):
            return float(np.float16(draw(st.floats(-60000, 60000))))
        if pa.types.is_floating(t):
            return draw(st.floats(allow_nan=False, width=32 if t == pa.float32() else 64))
        if pa.types.is_string(t):
            return draw(st.text(max_size=6))
        return draw(st.binary(max_size=6))
    return [one(t) for _ in range(rows)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_property_random_schemas(tmp_path, data):
    types = data.draw(st.lists(arrow_types(), min_size=1, max_size=4))
    rows = data.draw(st.integers(0, 40))
    cols = {}
    for i, t in enumerate(types):
        vals = values_for(t, data.draw, rows)
        if pa.types.is_float16(t):
            vals = [None if v is None else np.float16(v) for v in vals]
        cols[f"c{i}"] = pa.array(vals, t)
    table = pa.table(cols)
    opts = data.draw(st.fixed_dictionaries({
        "compression": st.sampled_from(CODECS),
        "data_page_version": st.sampled_from(["1.0", "2.0"]),
        "use_dictionary": st.booleans(),
        "row_group_size": st.integers(1, 50),
        "data_page_size": st.sampled_from([64, 1 << 20]),
    }))
    path = tmp_path / "prop.parquet"
    pq.write_table(table, path, write_batch_size=8, **opts)
    try:
        back = pq.read_table(path)
    except pa.ArrowInvalid:
        # pyarrow 26 cannot always read back what it wrote. The oracle itself
        # fails there, so the example says nothing about our reader.
        assume(False)
    if back.num_rows != rows:
        # Seen in CI: a 1-row list<bool> column holding one null list, in
        # tiny v2 pages, reads back as 0 rows although the footer says 1.
        # The oracle contradicts its own footer; ours must still give the
        # footer's row count, and the example is not compared further.
        assert pq.ParquetFile(path).metadata.num_rows == rows
        assert all(len(v) == rows for v in _native.parquet_read(str(path)).values())
        assume(False)
    assert_matches_pyarrow(path)


def test_random_nested_tiny_pages(tmp_path):
    """Seeded sweep: nested lists and nullable scalars over tiny pages and
    row groups, every codec, page version and dictionary setting (PLAIN
    pages after the first go through the direct-decompression path)."""
    rng = random.Random(1)

    def one(depth):
        if rng.random() < 0.1:
            return None
        if depth == 0:
            return rng.randint(-5, 5)
        return [one(depth - 1) for _ in range(rng.randint(0, 3))]

    path = tmp_path / "sweep.parquet"
    for _ in range(200):
        rows = rng.randint(0, 15)
        table = pa.table({
            "ll": pa.array([one(2) for _ in range(rows)], pa.list_(pa.list_(pa.int32()))),
            "l": pa.array([one(1) for _ in range(rows)], pa.list_(pa.int64())),
            "d": pa.array([one(0) for _ in range(rows)], pa.float64()),
        })
        pq.write_table(table, path, write_batch_size=8, compression=rng.choice(CODECS),
                       data_page_version=rng.choice(["1.0", "2.0"]), use_dictionary=rng.random() < 0.5,
                       row_group_size=rng.randint(1, 5), data_page_size=rng.choice([64, 1 << 20]))
        assert_matches_pyarrow(path, check_row_groups=False)


# ---- real files and corrupt input ------------------------------------------------------


def test_all_fixture_data_files(g1_dir):
    files = sorted((g1_dir / "data" / "chunk-000").glob("*.parquet"))
    assert len(files) == 100
    for path in files:
        table = assert_matches_pyarrow(path, check_row_groups=False)
        info = _native.parquet_info(str(path))
        assert info["num_rows"] == table.num_rows
        assert info["created_by"].startswith("parquet-cpp-arrow")
        assert set(info["kv"]) == {"huggingface", "ARROW:schema"}
        assert [leaf["max_def"] for leaf in info["leaves"]] == [3, 3, 1, 1, 1, 1, 1]
        assert [leaf["max_rep"] for leaf in info["leaves"]] == [1, 1, 0, 0, 0, 0, 0]


def test_corrupt_files_raise_with_the_path(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(lerobot_table(1, 30), good)
    data = good.read_bytes()
    cases = {
        "trunc.parquet": data[: len(data) // 2],
        "nomagic.parquet": b"XXXX" + data[4:],
        "tail.parquet": data[:-4] + b"PARX",
        "footer_len.parquet": data[:-8] + struct.pack("<I", len(data)) + b"PAR1",
        "tiny.parquet": b"PAR1PAR1",
    }
    for name, blob in cases.items():
        p = tmp_path / name
        p.write_bytes(blob)
        with pytest.raises(_native.VlafeedError) as e:
            _native.parquet_read(str(p))
        assert name in str(e.value)
    with pytest.raises(FileNotFoundError):
        _native.parquet_read(str(tmp_path / "missing.parquet"))


def test_int96_is_a_clear_error(tmp_path):
    path = tmp_path / "int96.parquet"
    pq.write_table(pa.table({"t": pa.array([0, 1], pa.timestamp("ns")), "x": [1, 2]}), path,
                   use_deprecated_int96_timestamps=True)
    assert [leaf["physical"] for leaf in _native.parquet_info(str(path))["leaves"]] == ["INT96", "INT64"]
    assert _native.parquet_read(str(path), columns=["x"]) == {"x": [1, 2]}
    with pytest.raises(_native.VlafeedError) as e:
        _native.parquet_read(str(path), columns=["t"])
    assert "INT96" in str(e.value) and "not supported" in str(e.value)


# ---- the `vlafeed parquet` command ------------------------------------------------------


def test_cli_parquet(tmp_path, cli):
    import json
    import subprocess

    path = tmp_path / "cli.parquet"
    table = nested_table(20, seed=12)
    pq.write_table(table, path, row_group_size=8)
    out = subprocess.run([cli, "parquet", str(path), "--json", "--head", "50"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["num_rows"] == 20 and len(doc["row_groups"]) == 3
    for name in ("ints", "strs", "records", "outer"):
        assert doc["head"][name] == table.column(name).to_pylist(), name
    text = subprocess.run([cli, "parquet", str(path), "--schema"], capture_output=True, text=True)
    assert text.returncode == 0 and "max_def 7, max_rep 3" in text.stdout  # deep.list.element.list...
    one = subprocess.run([cli, "parquet", str(path), "--column", "ints", "--head", "2"], capture_output=True,
                         text=True)
    assert one.returncode == 0 and "ints[1]" in one.stdout and "strs[" not in one.stdout
    assert subprocess.run([cli, "parquet", "--help"], capture_output=True, text=True).stdout.startswith("usage:")
    assert subprocess.run([cli, "parquet"], capture_output=True).returncode == 2
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really PAR1")
    res = subprocess.run([cli, "parquet", str(bad)], capture_output=True, text=True)
    assert res.returncode == 1 and "bad.parquet" in res.stderr
    res = subprocess.run([cli, "parquet", str(path), "--column", "nope"], capture_output=True, text=True)
    assert res.returncode == 1 and "nope" in res.stderr


def test_map_reads_as_list_of_key_value_structs(tmp_path):
    path = tmp_path / "map.parquet"
    values = [[("a", 1), ("b", None)], None, [], [("c", 3)]]
    pq.write_table(pa.table({"m": pa.array(values, pa.map_(pa.string(), pa.int32()))}), path)
    expected = [None if row is None else [{"key": k, "value": v} for k, v in row] for row in values]
    assert _native.parquet_read(str(path))["m"] == expected


def test_null_list_bool_in_tiny_v2_page(tmp_path):
    """The CI example where pyarrow 26 reads back 0 rows from a file whose
    footer says 1: one null list<bool> row in a v2 page. We give the footer's
    row, and it is null, as written."""
    path = tmp_path / "one_null_list.parquet"
    pq.write_table(pa.table({"c0": pa.array([None], pa.list_(pa.bool_()))}), path, write_batch_size=8,
                   compression="none", data_page_version="2.0", use_dictionary=False, row_group_size=1,
                   data_page_size=64)
    assert pq.ParquetFile(path).metadata.num_rows == 1
    assert _native.parquet_read(str(path))["c0"] == [None]
    # Written as v1 instead, pyarrow reads it back and agrees with us.
    pq.write_table(pa.table({"c0": pa.array([None], pa.list_(pa.bool_()))}), path, data_page_version="1.0")
    assert assert_matches_pyarrow(path).column("c0").to_pylist() == [None]
