"""Seeds for fuzz_wds_manifest: manifest.jsonl texts as VLA Foundry and
vlafeed write them, and the hostile lines the parser refuses (escapes,
absolute paths, URLs, bad counts), each behind the byte that picks where
the manifest lives (see fuzz_wds_manifest.c: low 7 bits the place, high bit
the allow_outside_base opt-in)."""
import json

LINES = {
    "stems": "\n".join(json.dumps({"shard": f"shard_{i:06d}", "num_sequences": 10 + i}) for i in range(3)),
    "tar_names": "\n".join(json.dumps({"shard": f"shard_{i:06d}.tar", "num_sequences": 5}) for i in range(2)) + "\n",
    "blank_lines": '\n{"shard": "a", "num_sequences": 1}\n\n\n{"shard": "b", "num_sequences": 0, "extra": [1, 2]}\n',
    "dotdot": '{"shard": "../secret", "num_sequences": 1}',
    "dotdot_escaped": '{"shard": "%2e%2e/x", "num_sequences": 1}\n{"shard": "a\\\\..\\\\b", "num_sequences": 2}',
    "absolute": '{"shard": "/etc/passwd", "num_sequences": 1}',
    "url": '{"shard": "http://elsewhere/x.tar", "num_sequences": 1}\n{"shard": "file:///x", "num_sequences": 1}',
    "count_1e9": '{"shard": "a", "num_sequences": 1e9}',
    "count_huge": '{"shard": "a", "num_sequences": 9223372036854775807}\n{"shard": "b", "num_sequences": 5}',
    "count_negative": '{"shard": "a", "num_sequences": -1}',
    "count_string": '{"shard": "a", "num_sequences": "7"}',
    "missing_shard": '{"num_sequences": 3}',
    "empty_shard": '{"shard": "", "num_sequences": 3}',
    "not_json": '{"shard": "a", "num_sequences": 3\n',
    "array_line": '[1, 2, 3]',
    "nul_in_name": '{"shard": "a\\u0000b", "num_sequences": 1}',
}


def write_seeds(out_dir):
    for name, text in LINES.items():
        for place in (0, 3):
            for opt_in in (0, 0x80):
                (out_dir / f"{name}_{place}_{opt_in:x}").write_bytes(bytes([place | opt_in]) + text.encode())
