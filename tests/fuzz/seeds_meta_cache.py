"""Seeds for fuzz_meta_cache: metadata cache entries (src/dataset/meta_cache.c's
layout, little-endian as written on x86-64/aarch64) with 0-3 cameras, with and
without a tasks column, with null lists and null items, plus a truncated one.
Each seed is one byte of camera count followed by the cache file."""
import struct
import zlib

MAGIC = b"VFMETAC\n"
VERSION = 1
BOM = 0x01020304
STRING, BINARY = 1, 2  # the task items' type as the file stores it


def pad8(b):
    return b + b"\0" * (-len(b) % 8)


def i64s(values):
    return struct.pack(f"<{len(values)}q", *values)


def f64s(values):
    return struct.pack(f"<{len(values)}d", *values)


def entry(rows, cameras, tasks=None, item_type=STRING, list_valid=None, items_valid=None):
    ident = b"/data/ds/meta/episodes/chunk-000/file-000.parquet\0episode_index\nlength"
    flags = 0
    items, data, list_offsets, item_offsets = [], b"", [0], [0]
    if tasks is not None:
        flags = 1 | (2 if list_valid else 0) | (4 if items_valid else 0)
        for row in tasks:
            for s in row:
                data += s
                item_offsets.append(len(data))
                items.append(s)
            list_offsets.append(len(items))
    body = i64s([rows, cameras, flags, item_type if tasks is not None else 0, len(items), len(data)])
    for k in range(6):
        body += i64s([k * 100 + i for i in range(rows)])
    for c in range(cameras):
        body += i64s([0] * rows) + i64s([c + i // 4 for i in range(rows)])
        body += f64s([0.1 * i for i in range(rows)]) + f64s([0.1 * i + 0.1 for i in range(rows)])
    if tasks is not None:
        body += i64s(list_offsets) + i64s(item_offsets)
        if list_valid:
            body += pad8(bytes(list_valid))
        if items_valid:
            body += pad8(bytes(items_valid))
        body += pad8(data)
    head = MAGIC + struct.pack("<II5Q", VERSION, BOM, 1234, 5, 6, 7, 8) + b"\xab" * 32
    head += struct.pack("<QQ", len(ident), len(body))
    rest = pad8(ident) + body
    crc = zlib.crc32(head + struct.pack("<I", 0) + rest)  # all but the CRC field itself
    return head + struct.pack("<II", crc, 0) + rest


def write_seeds(out_dir):
    cases = {
        "no_tasks_1cam": (1, entry(5, 1)),
        "no_rows": (3, entry(0, 3)),
        "tasks_3cam": (3, entry(4, 3, [[b"pick"], [b"pick", b"place"], [], [b"cup"]])),
        "tasks_nulls": (2, entry(3, 2, [[b"a"], [], [b"b", b"c"]], list_valid=[1, 0, 1], items_valid=[1, 0, 1])),
        "binary_items": (0, entry(2, 0, [[b"\x00\xff"], [b"x"]], item_type=BINARY)),
    }
    for name, (cameras, data) in cases.items():
        (out_dir / name).write_bytes(bytes([cameras]) + data)
    cameras, data = cases["tasks_3cam"]
    (out_dir / "truncated").write_bytes(bytes([cameras]) + data[: len(data) // 2])
