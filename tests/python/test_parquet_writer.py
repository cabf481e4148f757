"""The C Parquet writer (vlafeed._native.parquet_write) checked against pyarrow.

Every file written here is read back with pyarrow.parquet and compared value
for value and type for type: all scalar types and integer widths, float16,
strings (non-ASCII too), binary, nested lists, structs, nulls and empty lists,
across codecs x data page versions x dictionary on/off x tiny pages x several
row groups, plus randomized tables (hypothesis). Footer details are checked
too: statistics (against pyarrow's own for the same data), key-value
metadata, row-group layout, dictionary fallback, and the pages themselves
(read with a small Thrift compact decoder below, independent of the writer).
"""
import json
import math
import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

native = pytest.importorskip("vlafeed._native")


# ---------------------------------------------------------------------------
# type strings -> pyarrow types and expected Python values

def parse_type(s):
    """Parses a writer type string into a nested tuple tree."""
    s = s.strip()
    if s.startswith("list<") and s.endswith(">"):
        return ("list", parse_type(s[5:-1]))
    if s.startswith("struct<") and s.endswith(">"):
        body, fields, depth, start = s[7:-1], [], 0, 0
        for i, ch in enumerate(body + ","):
            if ch == "<":
                depth += 1
            elif ch == ">":
                depth -= 1
            elif ch == "," and depth == 0:
                name, _, t = body[start:i].partition(":")
                fields.append((name.strip(), parse_type(t)))
                start = i + 1
        return ("struct", fields)
    return ("scalar", s)


PA_SCALARS = {
    "bool": pa.bool_(), "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
    "uint8": pa.uint8(), "uint16": pa.uint16(), "uint32": pa.uint32(), "uint64": pa.uint64(),
    "float16": pa.float16(), "float32": pa.float32(), "float64": pa.float64(), "string": pa.string(),
    "binary": pa.binary(),
}


def pa_type(t):
    if isinstance(t, str):
        t = parse_type(t)
    kind, arg = t
    if kind == "list":
        return pa.list_(pa_type(arg))
    if kind == "struct":
        return pa.struct([(name, pa_type(sub)) for name, sub in arg])
    return PA_SCALARS[arg]


def expected(t, v):
    """What pyarrow should give back for value v written as type t."""
    if isinstance(t, str):
        t = parse_type(t)
    if v is None:
        return None
    kind, arg = t
    if kind == "list":
        return [expected(arg, x) for x in v]
    if kind == "struct":
        return {name: expected(sub, v.get(name)) for name, sub in arg}
    if arg == "float32":
        return float(np.float32(v))
    if arg == "float16":
        return float(np.float16(v))
    if arg in ("float64",):
        return float(v)
    return v


def write(path, columns, **kw):
    native.parquet_write(str(path), columns, **kw)
    return str(path)


def assert_roundtrip(path, columns):
    table = pq.read_table(path)
    assert table.column_names == [c[0] for c in columns]
    for name, type_string, values in columns:
        field = table.schema.field(name)
        assert field.type == pa_type(type_string), (name, field.type)
        got = table.column(name).to_pylist()
        want = [expected(type_string, v) for v in values]
        assert got == want, name
    return table


# ---------------------------------------------------------------------------
# a small independent reader of page headers (Thrift compact protocol)

class Compact:
    def __init__(self, data, pos=0):
        self.data, self.pos = data, pos

    def byte(self):
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self):
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return result

    def zigzag(self):
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def value(self, ctype):
        if ctype in (1, 2):
            return ctype == 1
        if ctype == 3:
            return struct.unpack("b", bytes([self.byte()]))[0]
        if ctype in (4, 5, 6):
            return self.zigzag()
        if ctype == 7:
            self.pos += 8
            return struct.unpack("<d", self.data[self.pos - 8:self.pos])[0]
        if ctype == 8:
            n = self.varint()
            self.pos += n
            return bytes(self.data[self.pos - n:self.pos])
        if ctype == 9:
            header = self.byte()
            n, etype = header >> 4, header & 0x0F
            if n == 15:
                n = self.varint()
            if etype in (1, 2):
                return [self.byte() == 1 for _ in range(n)]
            return [self.value(etype) for _ in range(n)]
        if ctype == 12:
            return self.struct()
        raise ValueError(f"compact type {ctype}")

    def struct(self):
        fields, last = {}, 0
        while True:
            header = self.byte()
            if header == 0:
                return fields
            ctype, delta = header & 0x0F, header >> 4
            fid = last + delta if delta else self.zigzag()
            fields[fid] = self.value(ctype)
            last = fid


def read_pages(path, row_group, column):
    """[(page_type, header dict, body bytes)] of one column chunk."""
    meta = pq.ParquetFile(path).metadata.row_group(row_group).column(column)
    data = open(path, "rb").read()
    pos = meta.dictionary_page_offset if meta.has_dictionary_page else meta.data_page_offset
    pages, seen = [], 0
    while seen < meta.num_values or not pages:
        reader = Compact(data, pos)
        header = reader.struct()
        body = data[reader.pos:reader.pos + header[3]]
        pages.append((header[1], header, body))
        pos = reader.pos + header[3]
        if header[1] == 0:
            seen += header[5][1]
        elif header[1] == 3:
            seen += header[8][1]
        if header[1] in (0, 3) and meta.num_values == 0:
            break
    assert pos <= meta.data_page_offset + meta.total_compressed_size + 1
    return pages


# ---------------------------------------------------------------------------
# the table used by the settings matrix

ROWS = 10

MATRIX_COLUMNS = [
    ("b", "bool", [True, False, None, True, True, False, None, False, True, True]),
    ("i8", "int8", [-128, 127, 0, None, -1, 5, 5, 5, 100, -100]),
    ("i16", "int16", [-32768, 32767, None, 0, 1, 2, 3, -4, 5, 6]),
    ("i32", "int32", [-2**31, 2**31 - 1, 0, None, 7, 7, 7, 7, 7, 1]),
    ("i64", "int64", [-2**63, 2**63 - 1, None, 0, 1, 1, 2, 3, 5, 8]),
    ("u8", "uint8", [0, 255, 128, None, 1, 2, 3, 4, 5, 6]),
    ("u16", "uint16", [0, 65535, None, 40000, 1, 2, 3, 4, 5, 6]),
    ("u32", "uint32", [0, 2**32 - 1, 2**31, None, 1, 2, 3, 4, 5, 6]),
    ("u64", "uint64", [0, 2**64 - 1, 2**63, None, 1, 2, 3, 4, 5, 6]),
    ("f16", "float16", [1.5, -0.0, 65504.0, None, float("inf"), 0.000061035156, -2.0, 0.1, 3.0, 1e-7]),
    ("f32", "float32", [0.1, -1.5, None, 3.4e38, -0.0, 1e-45, 2.0, 2.0, 2.0, float("-inf")]),
    ("f64", "float64", [0.1, None, -1e308, 5e-324, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0]),
    ("s", "string", ["", "a", None, "héllo wörld", "日本語テキスト", "🤖 robot", "a" * 300, "x", "x", "tab\tnul\0"]),
    ("bin", "binary", [b"", b"\x00\x01\xff", None, b"abc", bytes(range(256)), b"x", b"x", b"y", b"\x00", b"z"]),
    ("lf", "list<float32>", [[1.0, 2.0, 3.0], [], None, [None, 4.5], [0.0] * 6, [1.0], [], [2.0, None], None, [7.0]]),
    ("li", "list<int64>", [[1], [2, 3], [], None, [None], [4, 5, 6], [], [], [7], [8]]),
    ("ls", "list<string>", [["a", "ü"], [], None, [None, ""], ["task one", "task two"], ["x"], [], [None], ["é"], []]),
    ("lll", "list<list<list<float64>>>", [
        [[[0.5]], [[0.25]], [[0.125]]], None, [], [[]], [None], [[None]], [[[]]], [[[1.0, None, 2.0], []], None],
        [[[3.0]]], [[[4.0], [5.0, 6.0]]]]),
    ("lli8", "list<list<int8>>", [[[1, 2], [3]], [[], None], None, [], [[-128]], [[127, 0]], [[1]], [None], [[None]], [[]]]),
    ("img", "struct<bytes:binary,path:string>", [
        {"bytes": b"\x89PNG", "path": "frame-000000.png"}, None, {"bytes": None, "path": None},
        {"bytes": b"", "path": "é.png"}, {"bytes": b"a", "path": None}, {"bytes": None, "path": "p"},
        {"bytes": b"b", "path": "q"}, None, {"bytes": b"c", "path": "r"}, {"bytes": b"d", "path": "s"}]),
    ("nest", "struct<a:int16,b:list<string>,c:struct<d:float64>>", [
        {"a": 1, "b": ["x"], "c": {"d": 1.0}}, None, {"a": None, "b": None, "c": None},
        {"a": 2, "b": [], "c": {"d": None}}, {"a": 3, "b": [None, "y"], "c": {"d": 2.5}},
        {"a": 4, "b": ["z"], "c": {"d": 3.5}}, {"a": 5, "b": [], "c": None}, None,
        {"a": -6, "b": ["w", "v"], "c": {"d": -1.0}}, {"a": 7, "b": None, "c": {"d": 0.0}}]),
    ("lst", "list<struct<k:string,v:int32>>", [
        [{"k": "a", "v": 1}, {"k": "b", "v": None}], [], None, [None], [{"k": None, "v": 3}],
        [{"k": "c", "v": 4}], [], [{"k": "d", "v": 5}, None], None, [{"k": "e", "v": 6}]]),
    ("allnull", "float64", [None] * ROWS),
    ("emptylists", "list<int32>", [[]] * ROWS),
]

CODECS = ["uncompressed", "snappy", "gzip", "zstd"]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("page_version", [1, 2])
@pytest.mark.parametrize("dictionary", [True, False])
@pytest.mark.parametrize("page_size", [1 << 20, 16])
def test_matrix_roundtrip(tmp_path, codec, page_version, dictionary, page_size):
    sizes = [3, 0, 6, 1] if page_size == 16 else None
    path = write(tmp_path / "m.parquet", MATRIX_COLUMNS, codec=codec, data_page_version=page_version,
                 dictionary=dictionary, page_size=page_size, row_group_sizes=sizes)
    assert_roundtrip(path, MATRIX_COLUMNS)
    f = pq.ParquetFile(path)
    md = f.metadata
    assert md.num_rows == ROWS
    assert md.num_row_groups == (len(sizes) if sizes else 1)
    for i, size in enumerate(sizes or [ROWS]):
        assert md.row_group(i).num_rows == size
        assert f.read_row_group(i).num_rows == size
        for j in range(md.num_columns):
            col = md.row_group(i).column(j)
            assert col.compression == ("UNCOMPRESSED" if codec == "uncompressed" else codec.upper())
            # BOOLEAN has no dictionary; nor has a chunk without values.
            values = col.statistics.num_values if col.statistics is not None else 0
            assert col.has_dictionary_page == (dictionary and col.physical_type != "BOOLEAN" and values > 0)
            pages = read_pages(path, i, j)
            kinds = {p[0] for p in pages}
            assert kinds <= {0, 2, 3}
            assert (3 if page_version == 2 else 0) in kinds
            assert (0 if page_version == 2 else 3) not in kinds
    # Tiny pages: a PLAIN int64 chunk of 6 rows takes 3 pages of 16 bytes.
    if page_size == 16 and not dictionary:
        pages = read_pages(path, 2, [c[0] for c in MATRIX_COLUMNS].index("i64"))
        assert sum(1 for p in pages if p[0] in (0, 3)) >= 3


def test_pages_cut_at_page_size(tmp_path):
    values = list(range(1000))
    for version in (1, 2):
        path = write(tmp_path / f"p{version}.parquet", [("x", "int64", values), ("l", "list<int32>", [[i, i] for i in values])],
                     dictionary=False, codec="uncompressed", page_size=256, data_page_version=version)
        assert_roundtrip(path, [("x", "int64", values), ("l", "list<int32>", [[i, i] for i in values])])
        pages = read_pages(path, 0, 0)
        data_pages = [p for p in pages if p[0] in (0, 3)]
        # 8000 bytes of values at 256 bytes a page: about 32 pages, each at
        # most one value past the limit.
        assert 28 <= len(data_pages) <= 40
        assert sum(p[1][5 if version == 1 else 8][1] for p in data_pages) == 1000
        for _, header, _ in data_pages:
            assert header[2] <= 256 + 8 + 64  # values + levels
        if version == 2:
            list_pages = [p for p in read_pages(path, 0, 1) if p[0] == 3]
            # v2 pages hold whole rows: num_rows * 2 == num_values
            assert all(h[8][3] * 2 == h[8][1] for _, h, _ in list_pages)
            assert sum(h[8][3] for _, h, _ in list_pages) == 1000


def test_gzip_framing_and_v2_uncompressed_levels(tmp_path):
    path = write(tmp_path / "g.parquet", [("x", "list<int64>", [[i] * 3 for i in range(100)])], codec="gzip",
                 data_page_version=2, dictionary=False)
    (_, header, body), = [p for p in read_pages(path, 0, 0) if p[0] == 3]
    v2 = header[8]
    levels = v2[5] + v2[6]
    assert v2.get(7, True) is True  # is_compressed
    assert body[levels:levels + 2] == b"\x1f\x8b"  # gzip member after the raw levels
    path = write(tmp_path / "g1.parquet", [("x", "int64", list(range(100)))], codec="gzip")
    pages = read_pages(path, 0, 0)
    assert all(body[:2] == b"\x1f\x8b" for _, _, body in pages)


# ---------------------------------------------------------------------------
# types


@pytest.mark.parametrize("type_string,values,arrow_type", [
    ("bool", [True, None, False], pa.bool_()),
    ("int8", [-128, 127, None], pa.int8()),
    ("int16", [-32768, 32767, None], pa.int16()),
    ("int32", [-2**31, 2**31 - 1, None], pa.int32()),
    ("int64", [-2**63, 2**63 - 1, None], pa.int64()),
    ("uint8", [0, 255, None], pa.uint8()),
    ("uint16", [0, 65535, None], pa.uint16()),
    ("uint32", [0, 2**32 - 1, None], pa.uint32()),
    ("uint64", [0, 2**64 - 1, None], pa.uint64()),
    ("float16", [0.5, -65504.0, None], pa.float16()),
    ("float32", [0.5, -1.0, None], pa.float32()),
    ("float64", [0.5, -1.0, None], pa.float64()),
    ("string", ["ünï", "", None], pa.string()),
    ("binary", [b"\x00", b"", None], pa.binary()),
    ("list<float32>", [[1.0], [], None], pa.list_(pa.float32())),
    ("list<list<list<float64>>>", [[[[1.0]]], [[]], None], pa.list_(pa.list_(pa.list_(pa.float64())))),
    ("struct<bytes:binary,path:string>", [{"bytes": b"x", "path": "p"}, None, {"bytes": None, "path": None}],
     pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
])
def test_arrow_types(tmp_path, type_string, values, arrow_type):
    path = write(tmp_path / "t.parquet", [("c", type_string, values)])
    table = pq.read_table(path)
    assert table.schema.field("c").type == arrow_type
    assert table.schema.field("c").nullable
    assert table.column("c").to_pylist() == [expected(type_string, v) for v in values]


def test_parquet_schema_annotations(tmp_path):
    cols = [("i8", "int8", [1]), ("u16", "uint16", [1]), ("u32", "uint32", [1]), ("u64", "uint64", [1]),
            ("i32", "int32", [1]), ("h", "float16", [1.0]), ("s", "string", ["a"]), ("l", "list<float32>", [[1.0]])]
    schema = pq.ParquetFile(write(tmp_path / "a.parquet", cols)).schema
    by_path = {schema.column(i).path: schema.column(i) for i in range(len(schema))}
    assert by_path["i8"].physical_type == "INT32" and by_path["i8"].converted_type == "INT_8"
    assert str(by_path["i8"].logical_type) == "Int(bitWidth=8, isSigned=true)"
    assert by_path["u16"].converted_type == "UINT_16"
    assert by_path["u32"].physical_type == "INT32" and by_path["u32"].converted_type == "UINT_32"
    assert by_path["u64"].physical_type == "INT64" and by_path["u64"].converted_type == "UINT_64"
    assert by_path["i32"].converted_type == "NONE"
    assert by_path["h"].physical_type == "FIXED_LEN_BYTE_ARRAY" and by_path["h"].length == 2
    assert str(by_path["h"].logical_type) == "Float16"
    assert by_path["s"].converted_type == "UTF8" and str(by_path["s"].logical_type) == "String"
    leaf = by_path["l.list.element"]
    assert (leaf.max_definition_level, leaf.max_repetition_level) == (3, 1)
    assert leaf.physical_type == "FLOAT"
    assert "optional group field_id=-1 l (List)" in str(schema)
    assert "repeated group field_id=-1 list" in str(schema)


def test_nan_and_signed_zero(tmp_path):
    nan = float("nan")
    path = write(tmp_path / "n.parquet", [("d", "float64", [nan, 1.0, None, -2.0]), ("f", "float32", [nan, nan, None, nan])])
    table = pq.read_table(path)
    d = table.column("d").to_pylist()
    assert math.isnan(d[0]) and d[1:] == [1.0, None, -2.0]
    assert all(math.isnan(x) for x in table.column("f").to_pylist() if x is not None)
    md = pq.ParquetFile(path).metadata.row_group(0)
    assert (md.column(0).statistics.min, md.column(0).statistics.max) == (-2.0, 1.0)
    assert not md.column(1).statistics.has_min_max  # only NaN: no bounds
    path = write(tmp_path / "z.parquet", [("z", "float64", [0.0, 3.0]), ("zz", "float32", [-5.0, -0.0])])
    md = pq.ParquetFile(path).metadata.row_group(0)
    assert math.copysign(1.0, md.column(0).statistics.min) == -1.0  # zero minimum written as -0.0
    assert math.copysign(1.0, md.column(1).statistics.max) == 1.0   # zero maximum written as +0.0


# ---------------------------------------------------------------------------
# statistics against pyarrow's own


def test_statistics_match_pyarrow(tmp_path):
    cols = [c for c in MATRIX_COLUMNS if c[0] != "f16"]  # pyarrow gives float16 bounds as raw bytes
    ours = pq.ParquetFile(write(tmp_path / "ours.parquet", cols, row_group_sizes=[4, 6])).metadata
    table = pa.table({name: pa.array(values, pa_type(t)) for name, t, values in cols})
    for rg, (start, length) in enumerate([(0, 4), (4, 6)]):
        theirs_path = str(tmp_path / f"theirs{rg}.parquet")
        pq.write_table(table.slice(start, length), theirs_path, store_schema=False)
        theirs = pq.ParquetFile(theirs_path).metadata.row_group(0)
        mine = ours.row_group(rg)
        assert mine.num_columns == theirs.num_columns
        for j in range(mine.num_columns):
            a, b = mine.column(j), theirs.column(j)
            assert a.path_in_schema == b.path_in_schema
            assert a.num_values == b.num_values, a.path_in_schema
            sa, sb = a.statistics, b.statistics
            assert sa.null_count == sb.null_count, a.path_in_schema
            assert sa.has_min_max == sb.has_min_max, a.path_in_schema
            if sa.has_min_max:
                assert (sa.min, sa.max) == (sb.min, sb.max), a.path_in_schema


def test_float16_statistics(tmp_path):
    path = write(tmp_path / "h.parquet", [("h", "float16", [1.5, None, -3.0, float("nan"), 0.0])])
    s = pq.ParquetFile(path).metadata.row_group(0).column(0).statistics
    assert np.frombuffer(s.min, "<f2")[0] == np.float16(-3.0)
    assert np.frombuffer(s.max, "<f2")[0] == np.float16(1.5)
    assert s.null_count == 1


def test_integer_statistics_and_filters(tmp_path):
    cols = [("u64", "uint64", [2**64 - 1, 5, 2**63]), ("u8", "uint8", [200, 3, 255]), ("i8", "int8", [-5, 7, 0]),
            ("s", "string", ["b", "ä", "a"])]
    path = write(tmp_path / "s.parquet", cols)
    md = pq.ParquetFile(path).metadata.row_group(0)
    assert (md.column(0).statistics.min, md.column(0).statistics.max) == (5, 2**64 - 1)
    assert (md.column(1).statistics.min, md.column(1).statistics.max) == (3, 255)
    assert (md.column(2).statistics.min, md.column(2).statistics.max) == (-5, 7)
    assert (md.column(3).statistics.min, md.column(3).statistics.max) == ("a", "ä")


# ---------------------------------------------------------------------------
# dictionary


def test_dictionary_fallback_to_plain(tmp_path):
    n = 200_000  # 1.6 MB of distinct doubles: past the 1 MiB dictionary limit
    values = [i * 0.5 + 0.25 for i in range(n)]
    path = write(tmp_path / "d.parquet", [("x", "float64", values), ("k", "int64", [i % 7 for i in range(n)])],
                 codec="uncompressed")
    table = pq.read_table(path)
    assert table.column("x").to_pylist() == values
    col = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert col.has_dictionary_page
    dict_bytes = col.data_page_offset - col.dictionary_page_offset
    assert 1 << 20 <= dict_bytes < (1 << 20) + 4096
    pages = read_pages(path, 0, 0)
    assert pages[0][0] == 2 and pages[0][1][7][1] * 8 <= (1 << 20) + 8
    encodings = [p[1][5][2] for p in pages if p[0] == 0]
    assert 8 in encodings and 0 in encodings  # RLE_DICTIONARY pages, then PLAIN ones
    assert encodings.index(0) > 0 and all(e == 0 for e in encodings[encodings.index(0):])
    # The low-cardinality column stays dictionary encoded: 7 entries of 8 bytes.
    pages = read_pages(path, 0, 1)
    assert pages[0][0] == 2 and pages[0][1][7][1] == 7
    assert all(p[1][5][2] == 8 for p in pages[1:])


def test_dictionary_off_has_no_dictionary_page(tmp_path):
    path = write(tmp_path / "p.parquet", [("x", "string", ["a", "a", "b"])], dictionary=False)
    col = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert not col.has_dictionary_page and col.dictionary_page_offset is None
    assert "RLE_DICTIONARY" not in col.encodings
    assert [p[1][5][2] for p in read_pages(path, 0, 0)] == [0]


# ---------------------------------------------------------------------------
# metadata and layout


def test_kv_metadata_roundtrip(tmp_path):
    big = json.dumps({"features": {f"f{i}": {"dtype": "float32", "shape": [6]} for i in range(2000)}})
    kv = {"huggingface": big, "note": "naïve ✓", "empty": ""}
    path = write(tmp_path / "kv.parquet", [("x", "int64", [1])], kv=kv)
    md = pq.ParquetFile(path).metadata.metadata
    assert md == {k.encode(): v.encode() for k, v in kv.items()}
    assert pq.read_table(path).schema.metadata[b"huggingface"] == big.encode()


def test_file_metadata_is_sane(tmp_path):
    path = write(tmp_path / "m.parquet", MATRIX_COLUMNS, row_group_sizes=[5, 5], created_by="vlafeed test")
    md = pq.ParquetFile(path).metadata
    assert md.created_by == "vlafeed test"
    assert md.format_version == "2.6"
    assert md.num_columns == 28  # 24 fields; img, nest and lst have 2, 3 and 2 leaves
    assert md.num_rows == 10 and md.num_row_groups == 2
    size = os.path.getsize(path)
    prev_end = 4
    for i in range(2):
        rg = md.row_group(i)
        assert rg.total_byte_size > 0
        for j in range(rg.num_columns):
            col = rg.column(j)
            start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
            assert start == prev_end  # chunks are contiguous, in column order
            prev_end = start + col.total_compressed_size
            assert col.num_values >= 5
            assert col.is_stats_set
    assert prev_end < size
    default = pq.ParquetFile(write(tmp_path / "d.parquet", [("x", "int64", [1])])).metadata
    assert default.created_by.startswith("vlafeed version ")


def test_empty_table_and_zero_row_groups(tmp_path):
    path = write(tmp_path / "e.parquet", [("x", "int64", []), ("l", "list<string>", [])])
    table = assert_roundtrip(path, [("x", "int64", []), ("l", "list<string>", [])])
    assert table.num_rows == 0
    path = write(tmp_path / "z.parquet", [("x", "int64", [1, 2])], row_group_sizes=[0, 2, 0])
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    assert pq.read_table(path).column("x").to_pylist() == [1, 2]


# ---------------------------------------------------------------------------
# LeRobot-shaped files


FPS = 30
EPISODES = [5, 7, 3]


def lerobot_features():
    vec = {"feature": {"dtype": "float32", "_type": "Value"}, "length": 6, "_type": "List"}
    scalar = lambda dtype: {"dtype": dtype, "_type": "Value"}  # noqa: E731
    return {"info": {"features": {
        "action": vec, "observation.state": vec, "timestamp": scalar("float32"), "frame_index": scalar("int64"),
        "episode_index": scalar("int64"), "index": scalar("int64"), "task_index": scalar("int64")}}}


def lerobot_data_columns():
    action, state, ts, frame, episode, index, task = [], [], [], [], [], [], []
    g = 0
    for e, length in enumerate(EPISODES):
        for k in range(length):
            action.append([float(np.float32(0.01 * (g + j))) for j in range(6)])
            state.append([float(np.float32(-0.5 * g + j)) for j in range(6)])
            ts.append(float(np.float32(k / FPS)))
            frame.append(k)
            episode.append(e)
            index.append(g)
            task.append(e % 2)
            g += 1
    return [("action", "list<float32>", action), ("observation.state", "list<float32>", state),
            ("timestamp", "float32", ts), ("frame_index", "int64", frame), ("episode_index", "int64", episode),
            ("index", "int64", index), ("task_index", "int64", task)]


def test_lerobot_data_file(tmp_path):
    cols = lerobot_data_columns()
    features = json.dumps(lerobot_features())
    path = write(tmp_path / "file-000.parquet", cols, row_group_sizes=EPISODES, kv={"huggingface": features})
    table = assert_roundtrip(path, cols)
    assert table.schema.field("action").type == pa.list_(pa.float32())
    assert table.schema.field("timestamp").type == pa.float32()
    # float32 timestamps are bit-exact float32(frame_index / fps)
    ts = table.column("timestamp").to_numpy()
    assert ts.dtype == np.float32
    frames = table.column("frame_index").to_numpy()
    assert np.array_equal(ts, (frames / FPS).astype(np.float32))
    f = pq.ParquetFile(path)
    assert json.loads(f.metadata.metadata[b"huggingface"]) == lerobot_features()
    schema = f.schema
    assert [schema.column(i).path for i in range(len(schema))] == [
        "action.list.element", "observation.state.list.element", "timestamp", "frame_index", "episode_index",
        "index", "task_index"]
    # One row group per episode, with episode_index / index bounds in the footer.
    start = 0
    for e, length in enumerate(EPISODES):
        rg = f.metadata.row_group(e)
        assert rg.num_rows == length
        ep = rg.column(4).statistics
        idx = rg.column(5).statistics
        assert (ep.min, ep.max, ep.null_count) == (e, e, 0)
        assert (idx.min, idx.max) == (start, start + length - 1)
        assert rg.column(0).compression == "SNAPPY"
        start += length
    # Predicate pushdown uses those statistics.
    sub = pq.read_table(path, filters=[("episode_index", "=", 1)])
    assert sub.column("frame_index").to_pylist() == list(range(EPISODES[1]))
    # Fixed-size vectors come back row-major.
    flat = table.column("action").combine_chunks().flatten().to_numpy()
    assert flat.reshape(-1, 6).shape == (sum(EPISODES), 6)
    # A FixedSizeList cast (what HF datasets does from the features) works.
    assert table.column("action").cast(pa.list_(pa.float32(), 6)).type == pa.list_(pa.float32(), 6)


def test_lerobot_episodes_and_tasks_files(tmp_path):
    n = len(EPISODES)
    starts = np.cumsum([0] + EPISODES[:-1]).tolist()
    cols = [
        ("episode_index", "int64", list(range(n))),
        ("tasks", "list<string>", [["Pick the orange cube and place it in the box"], ["Stack ✓"], ["a", "b"]]),
        ("length", "int64", EPISODES),
        ("data/chunk_index", "int64", [0] * n),
        ("data/file_index", "int64", [0] * n),
        ("dataset_from_index", "int64", starts),
        ("dataset_to_index", "int64", [s + l for s, l in zip(starts, EPISODES)]),
        ("videos/observation.images.front/from_timestamp", "float64", [s / FPS for s in starts]),
        ("videos/observation.images.front/to_timestamp", "float64", [(s + l) / FPS for s, l in zip(starts, EPISODES)]),
        ("stats/action/min", "list<float64>", [[0.1 * i] * 6 for i in range(n)]),
        ("stats/frame_index/min", "list<int64>", [[0]] * n),
        ("stats/action/count", "list<int64>", [[l] for l in EPISODES]),
        ("stats/observation.images.front/mean", "list<list<list<float64>>>",
         [[[[0.691]], [[0.699]], [[0.685]]] for _ in range(n)]),
        ("meta/episodes/chunk_index", "int64", [0] * n),
        ("meta/episodes/file_index", "int64", [0] * n),
    ]
    path = write(tmp_path / "episodes.parquet", cols)
    assert_roundtrip(path, cols)
    schema = pq.ParquetFile(path).schema
    image_stat = [schema.column(i) for i in range(len(schema))
                  if schema.column(i).path.startswith("stats/observation.images.front/mean")][0]
    assert (image_stat.max_definition_level, image_stat.max_repetition_level) == (7, 3)
    tasks = [("task_index", "int64", [0, 1]), ("task", "string", ["Pick the orange cube", "Stack ✓"])]
    path = write(tmp_path / "tasks.parquet", tasks)
    table = assert_roundtrip(path, tasks)
    assert table.schema.field("task").type == pa.string()


def test_numpy_inputs(tmp_path):
    vectors = np.arange(24, dtype=np.float32).reshape(4, 6) / 7
    cols = [("v", "list<float32>", vectors), ("i", "int64", np.arange(4, dtype=np.int64)),
            ("u", "uint8", np.array([0, 1, 254, 255], dtype=np.uint8)), ("b", "bool", np.array([True, False] * 2)),
            ("h", "float16", np.array([0.5, 1.5, -2.0, 65504.0], dtype=np.float16))]
    table = pq.read_table(write(tmp_path / "np.parquet", cols))
    assert np.array_equal(np.stack(table.column("v").to_numpy(zero_copy_only=False)), vectors)
    assert table.column("i").to_pylist() == [0, 1, 2, 3]
    assert table.column("u").to_pylist() == [0, 1, 254, 255]
    assert table.column("b").to_pylist() == [True, False, True, False]
    assert table.column("h").to_numpy().tolist() == [0.5, 1.5, -2.0, 65504.0]


# ---------------------------------------------------------------------------
# errors


def test_errors(tmp_path):
    p = str(tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="field 'b' has 2 rows but field 'a' has 3"):
        native.parquet_write(p, [("a", "int64", [1, 2, 3]), ("b", "int64", [1, 2])])
    with pytest.raises(ValueError, match="cannot parse type 'list<int64'"):
        native.parquet_write(p, [("a", "list<int64", [])])
    with pytest.raises(ValueError, match="cannot parse type 'int128'"):
        native.parquet_write(p, [("a", "int128", [])])
    with pytest.raises(ValueError, match="column 'a': value 128 out of range for int8"):
        native.parquet_write(p, [("a", "int8", [1, 128])])
    with pytest.raises(ValueError, match="out of range for uint64"):
        native.parquet_write(p, [("a", "uint64", [-1])])
    with pytest.raises(TypeError, match="column 'a': str expected, got bytes"):
        native.parquet_write(p, [("a", "string", [b"x"])])
    with pytest.raises(TypeError, match="column 'a': list expected"):
        native.parquet_write(p, [("a", "list<int64>", ["abc"])])
    with pytest.raises(ValueError, match="keys that are not fields"):
        native.parquet_write(p, [("a", "struct<x:int64>", [{"y": 1}])])
    with pytest.raises(native.VlafeedError, match="codec LZ4_RAW is not supported"):
        native.parquet_write(p, [("a", "int64", [1])], codec="lz4")
    with pytest.raises(ValueError, match="unknown codec"):
        native.parquet_write(p, [("a", "int64", [1])], codec="bogus")
    with pytest.raises(ValueError, match="data_page_version must be 1 or 2"):
        native.parquet_write(p, [("a", "int64", [1])], data_page_version=3)
    with pytest.raises(ValueError, match="row_group_sizes add up to 2"):
        native.parquet_write(p, [("a", "int64", [1, 2, 3])], row_group_sizes=[1, 1])
    with pytest.raises(ValueError, match="no fields"):
        native.parquet_write(p, [])
    with pytest.raises(FileNotFoundError, match="cannot create"):
        native.parquet_write(str(tmp_path / "missing" / "x.parquet"), [("a", "int64", [1])])
    # Nothing was left behind by any of the failures.
    assert os.listdir(tmp_path) == []


def test_failed_write_keeps_previous_file(tmp_path):
    p = str(tmp_path / "x.parquet")
    write(p, [("a", "int64", [1, 2])])
    with pytest.raises(ValueError):
        native.parquet_write(p, [("a", "int64", [1, 2]), ("b", "int64", [1])])
    assert pq.read_table(p).column("a").to_pylist() == [1, 2]
    assert os.listdir(tmp_path) == ["x.parquet"]


# ---------------------------------------------------------------------------
# randomized tables

try:
    from hypothesis import given, settings, strategies as st
except ImportError:  # pragma: no cover - hypothesis is in scripts/install-deps.sh
    st = None

if st is None:
    def test_random_tables_roundtrip():
        pytest.skip("hypothesis is not installed")
else:
    SCALARS = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
               "float64", "string", "binary"]

    NAMES = st.text(alphabet="abcdefghij._/ü", min_size=1, max_size=6)

    def struct_string(fields):
        return "struct<" + ",".join(f"{n}:{t}" for n, t in fields) + ">"

    TYPES = st.recursive(
        st.sampled_from(SCALARS),
        lambda inner: st.one_of(
            inner.map(lambda t: f"list<{t}>"),
            st.lists(st.tuples(st.text(alphabet="abcdefgh", min_size=1, max_size=4), inner), min_size=1, max_size=3,
                     unique_by=lambda f: f[0]).map(struct_string)),
        max_leaves=4)

    def value_strategy(t):
        if isinstance(t, str):
            t = parse_type(t)
        kind, arg = t
        if kind == "list":
            inner = st.lists(value_strategy(arg), max_size=5)
        elif kind == "struct":
            inner = st.fixed_dictionaries({name: value_strategy(sub) for name, sub in arg})
        else:
            bits = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
            if arg in bits:
                inner = st.integers(-2 ** (bits[arg] - 1), 2 ** (bits[arg] - 1) - 1)
            elif arg.startswith("uint"):
                inner = st.integers(0, 2 ** int(arg[4:]) - 1)
            elif arg == "bool":
                inner = st.booleans()
            elif arg == "float16":
                inner = st.floats(width=16, allow_nan=False)
            elif arg == "float32":
                inner = st.floats(width=32, allow_nan=False)
            elif arg == "float64":
                inner = st.floats(allow_nan=False)
            elif arg == "string":
                inner = st.text(max_size=8)
            else:
                inner = st.binary(max_size=8)
        return st.one_of(st.none(), inner)

    @st.composite
    def tables(draw):
        ncols = draw(st.integers(1, 4))
        nrows = draw(st.integers(0, 25))
        names = draw(st.lists(NAMES, min_size=ncols, max_size=ncols, unique=True))
        cols = []
        for name in names:
            t = draw(TYPES)
            values = draw(st.lists(value_strategy(t), min_size=nrows, max_size=nrows))
            cols.append((name, t, values))
        cuts = sorted(draw(st.lists(st.integers(0, nrows), max_size=3)))
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [nrows])]
        options = {
            "codec": draw(st.sampled_from(CODECS)),
            "data_page_version": draw(st.sampled_from([1, 2])),
            "dictionary": draw(st.booleans()),
            "page_size": draw(st.sampled_from([1, 7, 64, 1 << 20])),
            "row_group_sizes": sizes,
        }
        return cols, options

    @settings(max_examples=150, deadline=None)
    @given(tables())
    def test_random_tables_roundtrip(tmp_path_factory, data):
        cols, options = data
        path = tmp_path_factory.mktemp("h") / "r.parquet"
        write(path, cols, **options)
        assert_roundtrip(str(path), cols)
        md = pq.ParquetFile(str(path)).metadata
        assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == options["row_group_sizes"]
