"""A manifest.jsonl cannot point vlafeed.ShardLoader outside its base.

The shards must resolve under the manifest's folder (local) or URL prefix (http(s):// /
s3://). Refused at open with ValueError naming the manifest, the line, the shard and
why: '../x', an absolute path, 'sub/../../x', another host or a file:// URL with a
'?.tar' tail in a local manifest; a local path (a readable file on this machine), a
'..' and another host in a manifest served over http. The opt-in
(VF_WDS_ALLOW_OUTSIDE=1, read when the loader is created) reads them all. Shards under
the base, written relative or absolute, load without it. The check reads the text only:
a symbolic link inside the folder is followed (documented in docs/reliability.md).
"""
import json
import pathlib

import pytest

import vlafeed
from remote_server import RemoteServer
from wds_helpers import write_foundry_set


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.delenv("VF_WDS_ALLOW_OUTSIDE", raising=False)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """<root>/outside/shard_000000.tar (5 samples), and <root>/set/ (a folder for manifests, with sub/)."""
    base = tmp_path_factory.mktemp("wds_escape")
    write_foundry_set(base / "outside", shards=1, per_shard=5, seed=4)
    (base / "set" / "sub").mkdir(parents=True)
    return base


def manifest(path, *shards, n=5):
    path.write_text("\n".join(json.dumps({"shard": s, "num_sequences": n}) for s in shards))
    return path


def count(manifest_or_url):
    loader = vlafeed.ShardLoader(str(manifest_or_url), batch_size=5, output="numpy", shuffle=False)
    return sum(len(b["__key__"]) for b in loader)


def refused(manifest_or_url, shard, line, why):
    with pytest.raises(ValueError) as info:
        vlafeed.ShardLoader(str(manifest_or_url), batch_size=5, output="numpy")
    msg = str(info.value)
    assert f"{manifest_or_url}:{line}: shard \"{shard}\"" in msg and why in msg and "VF_WDS_ALLOW_OUTSIDE" in msg, msg


def local_cases(root):
    outside = root / "outside" / "shard_000000"
    return [("../outside/shard_000000", "'..'", True),
            (str(outside) + ".tar", "absolute path", True),
            ("sub/../../outside/shard_000000", "'..'", True),
            ("http://other-host.invalid/x.tar", "URL in a local manifest", False),
            ("file:///etc/passwd?.tar", "URL in a local manifest", False)]


def test_local_manifest_refuses_shards_outside_its_folder(root, monkeypatch):
    for i, (shard, why, readable) in enumerate(local_cases(root)):
        m = manifest(root / "set" / f"m{i}.jsonl", shard)
        refused(m, shard, 1, why)
        # on the second line, after a good shard, the line number follows
        m2 = root / "set" / f"m{i}b.jsonl"
        m2.write_text(json.dumps({"shard": "sub/ok", "num_sequences": 0}) + "\n" +
                      json.dumps({"shard": shard, "num_sequences": 5}))
        refused(m2, shard, 2, why)


def test_opt_in_reads_them(root, monkeypatch):
    monkeypatch.setenv("VF_WDS_ALLOW_OUTSIDE", "1")
    for i, (shard, why, readable) in enumerate(local_cases(root)):
        if readable:
            assert count(manifest(root / "set" / f"in{i}.jsonl", shard)) == 5, shard


def test_shards_under_the_folder_load(root, tmp_path):
    d = tmp_path / "own"
    m = write_foundry_set(d, shards=2, per_shard=3, seed=1)
    assert count(m) == 6
    absolute = manifest(d / "abs.jsonl", str(d / "shard_000000.tar"), "./shard_000001", n=3)
    assert count(absolute) == 6


def test_symlink_inside_the_folder_is_followed(root, tmp_path):
    d = tmp_path / "linked"
    d.mkdir()
    (d / "link.tar").symlink_to(root / "outside" / "shard_000000.tar")
    assert count(manifest(d / "manifest.jsonl", "link")) == 5


def test_remote_manifest_refuses_local_paths_and_other_hosts(root):
    local_file = root / "outside" / "shard_000000.tar"  # a real file on this machine
    with RemoteServer(root) as srv:
        other_host = f"http://localhost:{srv.port}/outside/shard_000000.tar"  # same server, another name
        cases = [(str(local_file), "local path in a remote manifest"),
                 ("file:///etc/passwd?.tar", "URL outside"),
                 (other_host, "URL outside"),
                 ("../outside/shard_000000", "'..'"),
                 ("%2e%2e/outside/shard_000000", "'..'")]
        for i, (shard, why) in enumerate(cases):
            manifest(root / "set" / f"r{i}.jsonl", shard)
            refused(srv.url(f"set/r{i}.jsonl"), shard, 1, why)
        # under its own prefix, written as a full URL or relative, it loads
        manifest(root / "outside" / "remote.jsonl", srv.url("outside/shard_000000.tar"))
        assert count(srv.url("outside/remote.jsonl")) == 5
        manifest(root / "outside" / "relative.jsonl", "shard_000000")
        assert count(srv.url("outside/relative.jsonl")) == 5


def test_remote_opt_in_reads_the_local_file(root, monkeypatch):
    monkeypatch.setenv("VF_WDS_ALLOW_OUTSIDE", "1")
    with RemoteServer(root) as srv:
        manifest(root / "set" / "r_local.jsonl", str(root / "outside" / "shard_000000.tar"))
        assert count(srv.url("set/r_local.jsonl")) == 5


def test_shard_loader_keyword_and_ray_tasks_outside_tmp(tmp_path):
    """ShardLoader(allow_outside_base=True) opts in per loader; a Ray read task's private manifest (in
    the temp folder, naming the user's shards by absolute path) is allowed, wherever the shards are."""
    import os
    import vlafeed
    from wds_helpers import write_foundry_set
    shards = write_foundry_set(tmp_path / "data", shards=2, per_shard=3).parent
    other = tmp_path / "elsewhere"
    other.mkdir()
    manifest = other / "manifest.jsonl"
    manifest.write_text("\n".join(json.dumps({"shard": str(shards / f"shard_{i:06d}.tar"), "num_sequences": 3})
                                  for i in range(2)))
    with pytest.raises(ValueError, match="outside"):
        vlafeed.ShardLoader(manifest, batch_size=3, output="numpy")
    loader = vlafeed.ShardLoader(manifest, batch_size=3, output="numpy", allow_outside_base=True)
    assert sum(len(b["__key__"]) for b in loader) == 6
    loader.close()
    assert "allow_outside_base=True" in (pathlib.Path(vlafeed.__file__).parent / "ray" / "wds.py").read_text()
    assert os.environ.get("VF_WDS_ALLOW_OUTSIDE") in (None, "", "0")
