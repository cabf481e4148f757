"""Seeds for fuzz_table_cache: table cache files (src/dataset/table_cache.c's
layout on the header of src/dataset/meta_cache.c, little-endian as written on
x86-64/aarch64) with 0, 1 and 3 entries and one or two columns (float32 and
int64, various widths), each with its checksummed length and CRC set as a
store sets them, plus a truncated one. Each seed is the cache file itself."""
import struct
import zlib

MAGIC = b"VFTABLE\n"
VERSION = 1
BOM = 0x01020304
F32, I64 = 0, 1
HEADER = 112
CRC_AT = 104


def pad8(b):
    return b + b"\0" * (-len(b) % 8)


def i64s(values):
    return struct.pack(f"<{len(values)}q", *values)


def column_values(kind, width, rows, seed):
    n = rows * width
    if kind == F32:
        return pad8(struct.pack(f"<{n}f", *[seed + 0.5 * i for i in range(n)]))
    return i64s([seed * 1000 + i for i in range(n)])


def table_file(columns, episodes):
    """columns: [(type, width)]; episodes: [(row_offset, length, episode_index, from_index)] in file order."""
    rows = sum(length for _, length, _, _ in episodes)
    # The values, column after column; each column padded to 8 bytes.
    raw = [column_values(kind, width, rows, c + 1) for c, (kind, width) in enumerate(columns)]
    entries = b""
    start = 0
    for row_offset, length, episode_index, from_index in episodes:
        # An episode's CRC: its slice of each column, in column order.
        crc = 0
        for (kind, width), values in zip(columns, raw):
            row = width * (4 if kind == F32 else 8)
            crc = zlib.crc32(values[start * row:(start + length) * row], crc)
        entries += i64s([row_offset, length, start, episode_index, from_index, crc])
        start += length
    ident = pad8(b"/data/ds/data/chunk-000/file-000.parquet\0observation.state\naction")
    ident_len = len(b"/data/ds/data/chunk-000/file-000.parquet\0observation.state\naction")
    counts = i64s([len(columns), len(episodes), rows])
    for kind, width in columns:
        counts += i64s([kind, width])
    covered = ident + counts + entries  # all multiples of 8
    body = counts + entries + b"".join(raw)
    head = MAGIC + struct.pack("<II5Q", VERSION, BOM, 4096, 5, 6, 7, 8) + b"\xcd" * 32
    head += struct.pack("<QQ", ident_len, len(body))
    tail = struct.pack("<I", len(covered) // 8)
    # The CRC: the header without its own field, then the covered bytes.
    crc = zlib.crc32(head + tail + covered)
    return head + struct.pack("<I", crc) + tail + ident + body


def write_seeds(out_dir):
    cases = {
        "empty_1col": table_file([(F32, 3)], []),
        "one_entry_2col": table_file([(F32, 3), (I64, 1)], [(0, 4, 0, 0)]),
        "three_entries_2col": table_file([(F32, 2), (I64, 1)], [(5, 2, 3, 100), (7, 3, 4, 102), (20, 1, 9, 105)]),
        "three_entries_i64_wide": table_file([(I64, 5)], [(0, 1, 0, 0), (1, 1, 1, 1), (10, 2, 2, 2)]),
        "odd_f32_rows": table_file([(I64, 1), (F32, 1)], [(0, 3, 7, 30)]),
    }
    for name, data in cases.items():
        (out_dir / name).write_bytes(data)
    data = cases["three_entries_2col"]
    (out_dir / "truncated").write_bytes(data[: len(data) - 13])
