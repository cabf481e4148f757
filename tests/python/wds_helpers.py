"""Shard writers shared by the WebDataset reader tests and the benchmark."""
import io
import json
import tarfile

import numpy as np
from PIL import Image


def jpeg_bytes(rgb, quality=90):
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def png_bytes(rgb):
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def npz_bytes(arrays, compressed=True):
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def write_manifest(directory, counts, with_tar=False):
    """manifest.jsonl as VLA Foundry writes it: stems, lines joined by \\n, no trailing newline."""
    lines = [json.dumps({"shard": f"shard_{i:06d}" + (".tar" if with_tar else ""), "num_sequences": n})
             for i, n in enumerate(counts)]
    path = directory / "manifest.jsonl"
    path.write_text("\n".join(lines))
    return path


def foundry_sample(rng, key, t, cams=("top", "wrist"), offsets=(-1, 0), size=(32, 24), steps=4):
    """Members of one VLA Foundry robotics sample, in its member order."""
    w, h = size
    members = []
    for off in offsets:
        for cam in cams:
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            members.append((f"{key}.{cam}_t{off}.jpg", jpeg_bytes(img, 95)))
    arrays = {"observation.state": rng.normal(size=(steps, 6)).astype(np.float32),
              "action": rng.normal(size=(steps, 2)).astype(np.float32),
              "past_mask": np.arange(steps) < 1, "future_mask": np.arange(steps) >= 1}
    members.append((f"{key}.lowdim.npz", npz_bytes(arrays)))
    meta = {"camera_names": list(cams), "anchor_relative_idx": 1, "episode_index": "0", "frame_index": str(t)}
    members.append((f"{key}.metadata.json", json.dumps(meta, indent=2).encode()))
    members.append((f"{key}.language_instructions.json", json.dumps({"original": "pick"}).encode()))
    return members


def write_tar(path, members, fmt=tarfile.USTAR_FORMAT):
    """A tar of (name, bytes) members written with Python's tarfile (mode 0644, uid/gid 0, mtime 0)."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))


def write_foundry_set(directory, shards=3, per_shard=5, seed=0, with_tar=False):
    """A VLA Foundry-style shard set: shard_NNNNNN.tar + manifest.jsonl with stems."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    counts = []
    for s in range(shards):
        members = []
        for i in range(per_shard):
            members += foundry_sample(rng, f"{s:02d}{i:030x}", i)
        write_tar(directory / f"shard_{s:06d}.tar", members)
        counts.append(per_shard)
    return write_manifest(directory, counts, with_tar)
