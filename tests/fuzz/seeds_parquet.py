"""Seeds for fuzz_parquet: small pyarrow files of varied shapes (codecs,
page versions, dictionary on/off, nested lists with nulls, structs,
strings, every integer width, float16, booleans, byte-stream-split) plus
a few real LeRobot data files from the shared fixtures. Everything is
written into out_dir only; the repository keeps no binary corpus."""
import pathlib
import shutil

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "lerobot-g1-v21" / "data" / "chunk-000"


def _tables():
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    n = 24
    yield "scalars", pa.table({
        "i8": pa.array([None if i % 5 == 0 else i - 12 for i in range(n)], pa.int8()),
        "u16": pa.array(range(n), pa.uint16()),
        "i64": pa.array(rng.integers(-1000, 1000, n)),
        "f16": pa.array(rng.standard_normal(n).astype(np.float16)),
        "f32": pa.array(rng.standard_normal(n).astype(np.float32)),
        "b": pa.array([i % 3 == 0 for i in range(n)]),
        "s": pa.array(["", "a", "ü", None] * (n // 4)),
        "fsb": pa.array([bytes([i]) * 3 for i in range(n)], pa.binary(3)),
    })
    yield "nested", pa.table({
        "l": pa.array([None, [], [1, None, 3], [4]] * (n // 4), pa.list_(pa.int32())),
        "ll": pa.array([[[1.0], None, []], None, [[None, 2.5]], []] * (n // 4),
                       pa.list_(pa.list_(pa.float64()))),
        "st": pa.array([{"bytes": b"x", "path": "p"}, None, {"bytes": None, "path": "q"}] * (n // 3),
                       pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 4).astype(np.float32)), 4),
    })


def write_seeds(out_dir):
    import pyarrow.parquet as pq

    out = pathlib.Path(out_dir)
    k = 0
    for name, table in _tables():
        for codec in ("none", "snappy", "zstd", "gzip"):
            for version in ("1.0", "2.0"):
                for dictionary in (True, False):
                    pq.write_table(table, out / f"{name}-{codec}-{version}-{int(dictionary)}.parquet",
                                   compression=codec, data_page_version=version, use_dictionary=dictionary,
                                   row_group_size=10, data_page_size=64, write_batch_size=4)
                    k += 1
    pq.write_table(next(_tables())[1].select(["f32", "i64"]), out / "bss.parquet", use_dictionary=False,
                   use_byte_stream_split=True)
    for i, path in enumerate(sorted(FIXTURES.glob("*.parquet"))[:3]):
        shutil.copy(path, out / f"fixture-{i}.parquet")
