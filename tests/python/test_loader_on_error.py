"""vlafeed.Loader's on_error policy on damaged datasets (issue 10).

Variants of the corruption corpus (corpus_variants.py) whose open succeeds
but whose samples of some episodes cannot be read (a video episode refused
by the open-time index check, a video file missing, data rows missing):

  * on_error="raise" (the default): iterating raises the variant's error,
    which names the file and the episode;
  * on_error="skip": the loader yields exactly the undamaged run's samples
    minus those of the refused episodes, in the same order, each value equal
    to the undamaged dataset's; stats() counts the skipped samples by file,
    episode and column, loader.skipped lists each, and one LoaderWarning
    per (file, episode) is given;
  * a resume state taken mid-epoch under "skip" continues exactly: the
    resumed loader yields what the uninterrupted one yielded after it.
"""
import re
import warnings

import numpy as np
import pytest

import vlafeed
import vlafeed.loader
from vlafeed import _native

import damage
from corpus_variants import BASE_OPTIONS, VARIANTS, EpisodeError

# name -> the column the skips are attributed to (None: table rows)
CASES = {
    "episodes_video_spans_swapped": damage.CAM,
    "video_shortened": damage.CAM,
    "video_missing": damage.CAM,
    "data_rows_dropped": None,
}
BATCH = 5


@pytest.fixture(scope="module")
def base(cli, tmp_path_factory):
    root = damage.make_sample(cli, tmp_path_factory.mktemp("on-error") / "base", **BASE_OPTIONS)
    return root, run(root, "raise")


def loader(root, on_error, mode="map", **kw):
    return vlafeed.Loader(str(root), mode=mode, batch_size=BATCH, seed=7, threads=2, output="numpy",
                          on_error=on_error, **kw)


def rows(batches):
    """[(index, {key: value})] of every sample of the batches, in order."""
    out = []
    for b in batches:
        for i in range(len(b["index"])):
            out.append((int(b["index"][i]), {k: (v[i] if isinstance(v, list) else np.array(v[i])) for k, v in b.items()}))
    return out


def run(root, on_error, mode="map", **kw):
    with loader(root, on_error, mode, **kw) as ld:
        return rows(list(ld))


def damaged(base_root, tmp_path, name):
    root = damage.copy(base_root, tmp_path / "ds")
    VARIANTS[name].mutate(root)
    return root


def test_the_cases_are_corpus_episode_errors():
    for name in CASES:
        assert isinstance(VARIANTS[name].expect, EpisodeError), name


@pytest.mark.parametrize("name", sorted(CASES))
def test_raise_is_the_default_and_names_file_and_episode(base, tmp_path, name):
    root = damaged(base[0], tmp_path, name)
    expect = VARIANTS[name].expect
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ld = vlafeed.Loader(str(root), mode="map", batch_size=BATCH, seed=7, output="numpy")
    with pytest.raises(Exception) as e:  # VlafeedError, or FileNotFoundError for a missing file
        for _ in ld:
            pass
    assert re.search(expect.pattern, str(e.value)), str(e.value)
    ld.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_skip_serves_every_other_sample_exactly_and_counts(base, tmp_path, name):
    base_root, want_all = base
    root = damaged(base_root, tmp_path, name)
    bad = VARIANTS[name].expect.episodes
    want = [(i, item) for i, item in want_all if int(item["episode_index"]) not in bad]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ld = loader(root, "skip")
        got_batches = list(ld)
    got = rows(got_batches)
    assert [i for i, _ in got] == [i for i, _ in want]
    for (i, g), (_, w) in zip(got, want):
        assert list(g) == list(w)
        for key in w:
            if isinstance(w[key], str):
                assert g[key] == w[key], (i, key)
            else:
                np.testing.assert_array_equal(g[key], w[key], err_msg=f"{name}: index {i} {key}")
    assert all(len(b["index"]) > 0 for b in got_batches)  # a batch left empty is not yielded

    n_bad = len(want_all) - len(want)
    st = ld.stats()
    assert st["samples"] == len(want) and st["batches"] == len(got_batches)
    assert st["skipped"] == n_bad and len(ld.skipped) == n_bad
    want_by_ep = {}
    for _, item in want_all:
        e = int(item["episode_index"])
        if e in bad:
            want_by_ep[e] = want_by_ep.get(e, 0) + 1
    assert st["skipped_by_episode"] == want_by_ep
    column = CASES[name] or "(table rows)"
    assert st["skipped_by_column"] == {column: n_bad}
    [(file, count)] = st["skipped_by_file"].items()
    assert count == n_bad
    wanted_file = damage.VIDEO_FILE if CASES[name] else damage.DATA_FILE
    assert file == str(root / wanted_file)
    for k in ld.skipped:
        assert k["episode_index"] in bad and k["file"] == file
        assert re.search(VARIANTS[name].expect.pattern, k["message"]), k["message"]
    skip_warnings = [w for w in caught if "on_error=\"skip\"" in str(w.message)]
    assert len(skip_warnings) == len(bad)
    assert all(issubclass(w.category, vlafeed.loader.LoaderWarning) for w in skip_warnings)
    ld.close()


@pytest.mark.parametrize("mode", ["map", "stream", "pool"])
def test_skip_resumes_exactly(base, tmp_path, mode):
    root = damaged(base[0], tmp_path, "episodes_video_spans_swapped")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = loader(root, "skip", mode)
        batches = [b for b in full]
        whole = rows(batches)
        full.close()
        assert len(batches) >= 6
        # Stop after 4 batches (some of them cut short by skips), resume in a new loader.
        first = loader(root, "skip", mode)
        it = iter(first)
        head = rows([next(it) for _ in range(4)])
        state = first.state_dict()
        first.close()
        second = loader(root, "skip", mode, state=state)
        tail = rows(list(second))
        skipped_after = second.stats()["skipped"]
        second.close()
    assert [i for i, _ in head + tail] == [i for i, _ in whole]
    assert skipped_after > 0 or mode != "map"  # map order: the refused episodes' rows are spread over the epoch
    for (i, g), (_, w) in zip(head + tail, whole):
        np.testing.assert_array_equal(g[damage.CAM], w[damage.CAM], err_msg=f"index {i}")


def test_get_items_raises_even_under_skip(base, tmp_path):
    root = damaged(base[0], tmp_path, "episodes_from_past_end")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ld = loader(root, "skip")
        items = ld.get_items([0])
        assert int(items["episode_index"][0]) == 0
        last = ld.num_samples - 1  # episode 3, refused
        with pytest.raises(Exception, match="episode 3"):
            ld.get_items([last])
        ld.close()


def test_unknown_policy_is_refused(base):
    with pytest.raises(ValueError, match="on_error"):
        vlafeed.Loader(str(base[0]), on_error="ignore")
    ds = _native.Dataset(str(base[0]))
    with pytest.raises(ValueError, match="on_error"):
        _native.Loader(ds, on_error="ignore")
