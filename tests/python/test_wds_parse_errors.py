"""Shard members parsed in Python (.json, .txt, .pth, .npy) that cannot be
parsed: the error names the shard, the sample's key and the field (before: a
bare JSONDecodeError / UnicodeDecodeError / UnpicklingError / ValueError naming
nothing), and on_error="skip" leaves that sample out of every column and
counts it in stats() (before: it raised even under "skip")."""
import io
import re

import numpy as np
import pytest

import vlafeed
from wds_helpers import write_manifest, write_tar

torch = pytest.importorskip("torch")


def good_members(key, i):
    buf = io.BytesIO()
    np.save(buf, np.full(3, i, dtype=np.float32))
    tbuf = io.BytesIO()
    torch.save(torch.tensor([i]), tbuf)
    return [(f"{key}.meta.json", f'{{"i": {i}}}'.encode()), (f"{key}.caption.txt", f"sample {i}".encode()),
            (f"{key}.state.npy", buf.getvalue()), (f"{key}.extra.pth", tbuf.getvalue())]


BAD = {
    "meta.json": b'{"i": ',                              # truncated JSON
    "caption.txt": b"\xff\xfe not utf-8",                 # undecodable text
    "state.npy": None,                                    # an object array (needs pickle; the C reader refuses it)
    "extra.pth": b"not a torch file",                     # not a torch checkpoint
}


def shard_set(tmp_path, bad_field):
    members = []
    for i in range(6):
        key = f"s{i:03d}"
        ms = good_members(key, i)
        if i == 2:
            if bad_field == "state.npy":
                buf = io.BytesIO()
                np.save(buf, np.array([{"x": 1}], dtype=object), allow_pickle=True)
                data = buf.getvalue()
            else:
                data = BAD[bad_field]
            ms = [(n, data if n.endswith(bad_field) else d) for n, d in ms]
        members += ms
    d = tmp_path / bad_field.replace(".", "_")
    d.mkdir()
    write_tar(d / "shard_000000.tar", members)
    return write_manifest(d, [6])


@pytest.mark.parametrize("bad_field", sorted(BAD))
def test_unparsable_member_named_and_skippable(tmp_path, bad_field):
    manifest = shard_set(tmp_path, bad_field)
    loader = vlafeed.ShardLoader(manifest, batch_size=3, shuffle=False, output="numpy")
    with pytest.raises(vlafeed.VlafeedError) as e:
        list(loader)
    message = str(e.value)
    assert "shard_000000" in message and "s002" in message and bad_field in message, message
    if bad_field != "state.npy":   # parsed in Python
        assert re.search(re.escape(f"sample 's002': field '{bad_field}': cannot parse"), message)
    loader.close()

    loader = vlafeed.ShardLoader(manifest, batch_size=3, shuffle=False, output="torch", on_error="skip")
    batches = list(loader)
    keys = [k for b in batches for k in b["__key__"]]
    assert keys == ["s000", "s001", "s003", "s004", "s005"]
    first = batches[0]
    assert len(first["meta.json"]) == len(first["caption.txt"]) == len(first["__shard__"]) == 2
    assert first["state.npy"].shape == (2, 3) and first["state.npy"][:, 0].tolist() == [0.0, 1.0]
    st = loader.stats()
    assert st["skipped_samples"] == 1 and any("s002" in m for m in st["skip_messages"])
    loader.close()
