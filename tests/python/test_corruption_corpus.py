"""The corruption corpus (issue 10): damaged variants of one make-sample
dataset (tests/python/corpus_variants.py), each with its exact expected
outcome: correct data (every item equal to the undamaged dataset's), a clean
error at open naming the file (and key/episode), or the damaged episodes
refused item by item with an error naming file and episode while every other
item is served exactly. `vlafeed info` must agree: exit 0 only when loading
is correct, and `vlafeed decode-check --thorough` exits non-zero whenever
loading fails or an episode is refused. No crash, no hang (every FIFO case
runs in a child process under a timeout), no wrong frame."""
import os
import pathlib
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import vlafeed

import damage
from corpus_variants import VARIANTS, BASE_OPTIONS, Ok, OpenError, EpisodeError

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base(cli, tmp_path_factory):
    root = damage.make_sample(cli, tmp_path_factory.mktemp("corpus") / "base", **BASE_OPTIONS)
    ds = vlafeed.LeRobotDataset(root, output="numpy")
    items = [ds[i] for i in range(len(ds))]
    return root, items


def run_cli(cli, *args):
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=120)


def same_item(got, want, exact_video=True, left_out=()):
    want = {k: v for k, v in want.items() if k not in left_out}
    assert list(got) == list(want)
    for key, value in want.items():
        if key == damage.CAM and not exact_video:
            continue
        if isinstance(value, str):
            assert got[key] == value, key
        else:
            np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(value), err_msg=key)


def load_outcome(root, n_items):
    """Opens the dataset and reads every item: (open_error, {i: item or exception})."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ds = vlafeed.LeRobotDataset(root, output="numpy")
        except Exception as e:  # noqa: BLE001 - the type is asserted by the caller
            return e, {}
    results = {}
    for i in range(len(ds)):
        try:
            results[i] = ds[i]
        except Exception as e:  # noqa: BLE001
            results[i] = e
    return None, results


def load_in_child(root):
    code = (f"import vlafeed\nds = vlafeed.LeRobotDataset({str(root)!r})\n"
            "print([sorted(ds[i]) for i in range(len(ds))][:1])")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)


def served_otherwise(root):
    """The LoaderWarnings that opening the dataset in Python gives."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        vlafeed.LeRobotDataset(root, output="numpy")
    return [w for w in got if issubclass(w.category, vlafeed.LoaderWarning)]


def episode_of(base_items, i):
    return int(base_items[i]["episode_index"])


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant(cli, base, tmp_path, name):
    base_root, base_items = base
    v = VARIANTS[name]
    root = damage.copy(base_root, tmp_path / "ds")
    v.mutate(root)
    expect = v.expect
    info = run_cli(cli, "info", root)
    info_text = info.stdout + info.stderr
    assert info.returncode in (0, 1, 2), info_text  # never a crash
    thorough = run_cli(cli, "decode-check", "--thorough", "--quiet", root)
    assert thorough.returncode in (0, 1, 3), thorough.stdout + thorough.stderr

    if v.fifo:
        r = load_in_child(root)
        assert isinstance(expect, OpenError)
        assert r.returncode != 0 and re.search(expect.pattern, r.stderr), r.stderr
        assert info.returncode != 0 and thorough.returncode != 0
        return

    open_error, results = load_outcome(root, len(base_items))
    if isinstance(expect, Ok):
        assert open_error is None, f"{name}: {open_error!r}"
        assert len(results) == len(base_items)
        for i, got in results.items():
            assert not isinstance(got, Exception), f"{name}: item {i}: {got!r}"
            same_item(got, base_items[i], exact_video=v.needs.get("exact", True), left_out=expect.left_out)
        assert info.returncode == expect.info_rc, info_text
        if expect.note:
            assert expect.note in info_text, info_text
        if expect.forbid:
            assert expect.forbid not in info_text, info_text
            assert "warning" not in info_text.split("problems", 1)[-1].lower().replace("0 warnings", ""), info_text
        assert thorough.returncode == (expect.info_rc if expect.check_rc is None else expect.check_rc), thorough.stdout
        # the Python user hears of it exactly when decode-check says it is served otherwise
        assert (thorough.returncode == 3) == bool(served_otherwise(root)), thorough.stdout
    elif isinstance(expect, OpenError):
        if open_error is None:
            served = [i for i, got in results.items() if not isinstance(got, Exception)]
            assert not served, f"{name}: items {served[:5]} were served"
            open_error = results[0]
        assert re.search(expect.pattern, str(open_error)), f"{name}: {open_error!r}"
        assert info.returncode != 0 or thorough.returncode != 0, info_text
        assert thorough.returncode != 0, thorough.stdout
    else:
        assert isinstance(expect, EpisodeError)
        assert open_error is None, f"{name}: {open_error!r}"
        for i, got in results.items():
            ep = episode_of(base_items, i)
            if ep in expect.episodes:
                assert isinstance(got, Exception), f"{name}: item {i} of refused episode {ep} was served"
                assert re.search(expect.pattern, str(got)), f"{name}: item {i}: {got!r}"
            else:
                assert not isinstance(got, Exception), f"{name}: item {i}: {got!r}"
                # a re-encoded file ("exact": False): its pixels differ, the rest must not
                same_item(got, base_items[i], exact_video=v.needs.get("exact", True))
        assert thorough.returncode == 1, thorough.stdout
        if v.needs.get("info_blind"):
            # Damage inside the data pages that the footer statistics cannot
            # show: `info` reads no page, `decode-check --thorough` reads them all.
            assert any(f"episode {e}" in thorough.stdout for e in expect.episodes), thorough.stdout
        else:
            assert info.returncode == 1, info_text
            assert any(f"episode {e}" in info_text for e in expect.episodes), info_text


def test_corpus_is_large_enough():
    assert len(VARIANTS) >= 50


# ---- the same variants through the Loader in each mode ------------------------------------------

MODES = ("stream", "map", "pool")


def loader_samples(root, mode, on_error):
    """(error or None, {index: sample}) of one epoch of a Loader (batch 4, no shuffle)."""
    got = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            loader = vlafeed.Loader(root, mode=mode, batch_size=4, shuffle=False, output="numpy", threads=2,
                                    on_error=on_error)
            for batch in loader:
                for k, index in enumerate(batch["index"].tolist()):
                    got[int(index)] = {key: value[k] if not isinstance(value, list) else value[k]
                                       for key, value in batch.items()}
            skipped = loader.stats()["skipped"]
            loader.close()
        except Exception as e:  # noqa: BLE001 - the caller asserts the type and message
            return e, got, 0
    return None, got, skipped


@pytest.fixture(scope="module")
def base_loader_samples(base):
    root, _ = base
    return {mode: loader_samples(root, mode, "raise")[1] for mode in MODES}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(n for n in VARIANTS if not VARIANTS[n].fifo))
def test_variant_through_the_loader(base, base_loader_samples, tmp_path, name, mode):
    """Every variant in stream, map and pool mode: the same outcome as LeRobotDataset. Ok: every
    sample of the epoch equal to the undamaged one. OpenError: the open or the epoch fails with the
    message. EpisodeError: on_error="raise" fails naming file and episode; on_error="skip" serves
    every sample of the other episodes exactly and counts the refused ones as skipped."""
    base_root, base_items = base
    want = base_loader_samples[mode]
    v = VARIANTS[name]
    root = damage.copy(base_root, tmp_path / "ds")
    v.mutate(root)
    expect = v.expect
    exact = v.needs.get("exact", True)

    def same(got_sample, want_sample, left_out=()):
        for key, value in want_sample.items():
            if key in left_out or (key == damage.CAM and not exact):
                continue
            if isinstance(value, str):
                assert got_sample[key] == value, key
            else:
                np.testing.assert_array_equal(np.asarray(got_sample[key]), np.asarray(value), err_msg=key)
        assert not set(left_out) & set(got_sample)

    error, got, _ = loader_samples(root, mode, "raise")
    if isinstance(expect, Ok):
        assert error is None, f"{name} ({mode}): {error!r}"
        assert sorted(got) == sorted(want)
        for index, sample in want.items():
            same(got[index], sample, expect.left_out)
    elif isinstance(expect, OpenError):
        assert error is not None, f"{name} ({mode}): the epoch was served"
        assert re.search(expect.pattern, str(error)), f"{name} ({mode}): {error!r}"
    else:
        assert error is not None and re.search(expect.pattern, str(error)), f"{name} ({mode}): {error!r}"
        refused = {i for i, item in enumerate(base_items) if int(item["episode_index"]) in expect.episodes}
        error, got, skipped = loader_samples(root, mode, "skip")
        assert error is None, f"{name} ({mode}, skip): {error!r}"
        assert set(got) == set(want) - refused, f"{name} ({mode}, skip)"
        assert skipped == len(refused)
        for index in got:
            same(got[index], want[index])
