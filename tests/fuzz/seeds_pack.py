"""Seeds for fuzz_pack: a few packable inputs (window, max_tokens, lengths) and one of each error."""
import struct


def write_seeds(out_dir):
    cases = {
        "by_hand": (0, 10, [5, 3, 8, 2, 7, 1]),
        "windowed": (3, 10, [5, 3, 8, 2, 7, 1]),
        "mixed": (4, 256, [37, 5, 60, 12, 33, 64, 1, 20, 48, 9, 200, 256]),
        "too_long": (0, 8, [3, 9]),
        "zero": (0, 8, [0]),
        "no_rows": (0, 0, [1]),
    }
    for name, (window, max_tokens, lengths) in cases.items():
        (out_dir / name).write_bytes(struct.pack("<BH", window, max_tokens) +
                                     b"".join(struct.pack("<h", n) for n in lengths))
