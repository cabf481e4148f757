"""Seeds for fuzz_wds: small tars in the layouts the reader meets (ustar, pax
long names, GNU long names, webdataset.TarWriter-like members with npy, npz,
jpg, png, json), written with Python's tarfile, numpy and PIL."""
import io
import tarfile

import numpy as np


def tar_bytes(members, fmt):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_seeds(out_dir):
    npy = io.BytesIO()
    np.save(npy, np.arange(6, dtype=np.float32).reshape(2, 3))
    npz = io.BytesIO()
    np.savez_compressed(npz, a=np.ones((2, 2), np.float64), mask=np.array([True, False]))
    stored = io.BytesIO()
    np.savez(stored, b=np.arange(3, dtype=np.int64))
    members = [("k1.x.npy", npy.getvalue()), ("k1.lowdim.npz", npz.getvalue()), ("k1.meta.json", b"{}"),
               ("k2.x.npy", npy.getvalue()), ("k2.lowdim.npz", stored.getvalue()), ("__meta__", b"m")]
    try:
        from PIL import Image
        img = Image.fromarray(np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3))
        jpg, png = io.BytesIO(), io.BytesIO()
        img.save(jpg, format="JPEG")
        img.save(png, format="PNG")
        members += [("k3.top_t0.jpg", jpg.getvalue()), ("k3.depth.PNG", png.getvalue())]
    except ImportError:
        pass
    # a .npy whose header stops right after a key's colon: CI's fuzz_wds
    # found a one-byte read past the member there (in sample 0, which the
    # target reads rather than skips)
    cut = b"{'descr':"
    members.insert(3, ("k1.cut.npy", b"\x93NUMPY\x01\x00" + bytes([len(cut), 0]) + cut))
    long_key = "dir." + "d" * 120 + "/key"
    (out_dir / "ustar.tar").write_bytes(tar_bytes(members, tarfile.USTAR_FORMAT))
    (out_dir / "pax.tar").write_bytes(tar_bytes(members + [(long_key + ".txt", b"long")], tarfile.PAX_FORMAT))
    (out_dir / "gnu.tar").write_bytes(tar_bytes(members + [(long_key + ".txt", b"long")], tarfile.GNU_FORMAT))
