"""Shard writers shared by the WebDataset reader tests and the benchmark."""
import io
import json
import struct
import tarfile
import zlib

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



# ---- bombs: small files that declare huge contents (test_wds_bombs.py) ----------------------------------

_MIB = 1 << 20


def deflate_with_zeros(pieces, level=6):
    """Raw deflate of `pieces` (bytes, or an int: that many zero bytes) without compressing every zero
    byte: after a full flush deflate starts afresh, so one compressed MiB of zeros is repeated.
    Returns (deflate bytes, crc32, adler32, uncompressed length)."""
    zeros = bytes(_MIB)
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    zero_block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    out, crc, adler, length = [], 0, 1, 0
    for piece in pieces:
        if isinstance(piece, int):
            whole, rest = divmod(piece, _MIB)
            out.append(zero_block * whole)
            for _ in range(whole):
                crc = zlib.crc32(zeros, crc)
            s1, s2 = adler & 0xFFFF, adler >> 16  # adler32 over zeros: s2 grows by s1 per byte
            adler = ((s2 + s1 * whole * _MIB) % 65521) << 16 | s1
            length += whole * _MIB
            piece = bytes(rest)
        c = zlib.compressobj(level, zlib.DEFLATED, -15)
        out.append(c.compress(piece) + c.flush(zlib.Z_FULL_FLUSH))
        crc = zlib.crc32(piece, crc)
        adler = zlib.adler32(piece, adler)
        length += len(piece)
    out.append(b"\x03\x00")  # an empty final block
    return b"".join(out), crc, adler, length


def gzip_with_zeros(pieces):
    """A gzip file of `pieces` (as deflate_with_zeros)."""
    data, crc, _, length = deflate_with_zeros(pieces)
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + data + struct.pack("<II", crc, length & 0xFFFFFFFF)


def _png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_of_zeros(width, height, bit_depth=8, color_type=0):
    """A valid PNG of width x height black pixels (gray by default), a few hundred KB even when huge."""
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color_type]
    row = 1 + (width * channels * bit_depth + 7) // 8
    data, _, adler, _ = deflate_with_zeros([row * height], level=9)
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    plte = _png_chunk(b"PLTE", bytes(3 * (1 << bit_depth))) if color_type == 3 else b""
    idat = b"\x78\xda" + data + struct.pack(">I", adler)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + plte + _png_chunk(b"IDAT", idat) + \
        _png_chunk(b"IEND", b"")


def jpeg_declaring(width, height):
    """A small JPEG whose frame header (SOF0) declares width x height: the bytes of a 16x16 image."""
    data = bytearray(jpeg_bytes(np.full((16, 16, 3), 128, np.uint8)))
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def npz_with_zeros(name, shape, dtype="<f4"):
    """An .npz (a zip, deflated) holding one array of zeros named `name`, written without building it."""
    header = f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    npy_header = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode()
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    data, crc, _, length = deflate_with_zeros([npy_header, nbytes])
    fname = (name + ".npy").encode()
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, crc, len(data), length, len(fname), 0) + fname
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, crc, len(data), length,
                          len(fname), 0, 0, 0, 0, 0, 0) + fname
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), len(local) + len(data), 0)
    return local + data + central + end


def tar_header(name, size):
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")


def write_tar_with_holes(path, members):
    """A tar of (name, data) members where data may be an int: that many zero bytes left as a hole in
    the file (a 1 GiB member costs no disk and no time to write)."""
    with open(path, "wb") as f:
        for name, data in members:
            size = data if isinstance(data, int) else len(data)
            f.write(tar_header(name, size))
            if isinstance(data, int):
                f.seek(size, io.SEEK_CUR)
            else:
                f.write(data)
            f.write(bytes(-size % 512))
        f.write(bytes(1024))


def gnu_sparse_member(name, real_size, chunk=b"x" * 512):
    """A GNU sparse ('S') tar member: `chunk` stored at the end of a file of real_size bytes (the rest is a
    hole the reader fills with zeros). Returns the header and data blocks."""
    header = bytearray(512)
    def put(offset, width, text):
        header[offset:offset + len(text)] = text
    def octal(offset, width, value):
        put(offset, width, b"%0*o\0" % (width - 1, value))
    put(0, 100, name.encode())
    octal(100, 8, 0o644)
    octal(108, 8, 0)
    octal(116, 8, 0)
    octal(124, 12, len(chunk))
    octal(136, 12, 0)
    header[156:157] = b"S"
    put(257, 8, b"ustar  \0")
    octal(386, 12, real_size - len(chunk))  # sparse[0].offset
    octal(398, 12, len(chunk))              # sparse[0].numbytes
    octal(483, 12, real_size)               # realsize
    header[148:156] = b" " * 8
    put(148, 8, b"%06o\0 " % sum(header))
    return bytes(header) + chunk + bytes(-len(chunk) % 512)
