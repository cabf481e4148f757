"""Each warning reaches the user once: through Python's warnings when Python
is in charge (the engine does not also print it on stderr), a warning about
the whole epoch from rank 0 only, and the engine's own stderr lines once per
process. (Before, every rank printed the drop_last warning twice: once from
the engine on stderr, once as a LoaderWarning.)"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def sample(tmp_path_factory, cli):
    root = tmp_path_factory.mktemp("warn") / "ds"
    subprocess.run([cli, "make-sample", str(root), "--episodes", "3", "--cameras", "1", "--size", "64x48",
                    "--codec", "h264"], check=True, capture_output=True)
    return root


def run_ranks(sample, world_size, drop_last, loaders_per_rank=1):
    """One process per rank, as torchrun starts them: each builds its loaders and reports the
    LoaderWarnings it saw; returns [(warnings, stderr)] per rank."""
    code = textwrap.dedent(f"""
        import json, sys, warnings
        import vlafeed
        from vlafeed.data.loader import LoaderWarning
        seen = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", LoaderWarning)
            for _ in range({loaders_per_rank}):
                loader = vlafeed.Loader({str(sample)!r}, mode="stream", batch_size=4, keys=["action"],
                                        rank=int(sys.argv[1]), world_size={world_size}, drop_last={drop_last},
                                        output="numpy")
                loader.set_epoch(1)
                loader.close()
        print(json.dumps([str(w.message) for w in caught if issubclass(w.category, LoaderWarning)]))
    """)
    out = []
    for rank in range(world_size):
        r = subprocess.run([sys.executable, "-c", code, str(rank)], capture_output=True, text=True,
                           env={**os.environ, "VF_LOG": "warn"})
        assert r.returncode == 0, r.stderr
        out.append((json.loads(r.stdout.strip().splitlines()[-1]), r.stderr))
    return out


def test_global_warning_once_from_rank_zero_and_never_on_stderr(sample):
    ranks = run_ranks(sample, world_size=3, drop_last=True, loaders_per_rank=2)
    (w0, err0), *others = ranks
    assert len(w0) == 2 and all("drop_last drops" in m for m in w0)   # one per loader, rank 0
    for w, err in others:
        assert w == []                                                # same text on every rank: rank 0 says it
    for _, err in ranks:
        assert "drop_last drops" not in err                           # not printed a second time by the engine


def test_uneven_split_without_drop_last(sample):
    ranks = run_ranks(sample, world_size=7, drop_last=False)
    assert [len(w) for w, _ in ranks] == [1] + [0] * 6
    assert "does not divide" in ranks[0][0][0]


def test_rank_specific_warning_on_its_rank(sample):
    """A consumer without samples is about one rank: each rank that has one says so."""
    code = textwrap.dedent(f"""
        import warnings, vlafeed
        from vlafeed.data.loader import LoaderWarning
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", LoaderWarning)
            loader = vlafeed.Loader({str(sample)!r}, mode="pool", batch_size=4, keys=["action"], rank=1,
                                    world_size=2, num_consumers=60000, output="numpy")
        print(sum("get no samples" in str(w.message) for w in caught))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "1"
    assert "get no samples" not in r.stderr
