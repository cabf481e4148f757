"""The binding's settings tables (python/vlafeed/_native/settings.h).

Proves, for each kind of setting the tables hold (an index-able count with a
minimum, a C int, a long long, a masked unsigned, a truth value, a float, a
name among choices, a (width, height) pair, a dict of entries, a structured
value with its own parser, a path, a str, a str or None, a typed object),
that a good value reaches the engine (seen through a getter, the state or
the batches) and that a bad one raises the text the binding has always
raised: naming the setting where the binding's own checks speak, getargs'
texts (argument number, function name) where the conversion fails. Unknown,
doubled and missing arguments are refused naming them.
"""
import math
import re
import subprocess

import numpy as np
import pytest

native = pytest.importorskip("vlafeed._native")
from wds_helpers import foundry_sample, write_manifest, write_tar  # noqa: E402

LOADER_RANGE = "batch_size must be >= 1; prefetch, shuffle_buffer, episode_pool_size and decoder_cache_entries >= 0"
WDS_RANGE = "batch_size must be >= 1, shuffle_buffer, prefetch and epoch >= 0"


@pytest.fixture(scope="module")
def root(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("settings") / "ds"
    r = subprocess.run([cli, "make-sample", str(root), "--episodes", "3", "--codec", "h264", "--size", "32x32",
                        "--fps", "10", "--min-length", "5", "--max-length", "8", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return str(root)


@pytest.fixture(scope="module")
def ds(root):
    return native.Dataset(root)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    d = tmp_path_factory.mktemp("settings_wds")
    rng = np.random.default_rng(0)
    for s in range(2):
        write_tar(d / f"shard_{s:06d}.tar", [m for t in range(4) for m in foundry_sample(rng, f"k{s}_{t}", t)])
    return str(write_manifest(d, [4, 4], with_tar=True))


def raises(exc, text):
    return pytest.raises(exc, match="^" + re.escape(text) + "$")


def loader(ds, **kw):
    kw.setdefault("mode", "map")
    return native.Loader(ds, **kw)


def first_batch(ld):
    return next(iter(ld))


# ---- Loader(): one good and one bad value per kind of setting ------------------------------


def test_count_with_minimum(ds):
    ld = loader(ds, batch_size=4)
    assert ld.num_batches == math.ceil(ld.num_samples / 4) and ld.get_state()["batch_size"] == 4
    for name, bad in [("batch_size", 0), ("prefetch", -1), ("shuffle_buffer", -1), ("episode_pool_size", -1),
                      ("decoder_cache_entries", -1)]:
        with raises(ValueError, LOADER_RANGE):
            loader(ds, **{name: bad})
    with raises(TypeError, "'str' object cannot be interpreted as an integer"):
        loader(ds, batch_size="4")
    with raises(OverflowError, "Python int too large to convert to C ssize_t"):
        loader(ds, prefetch=2**64)


def test_choice(ds):
    assert loader(ds, mode="stream", partition="episode").get_state()["partition"] == "episode"
    assert loader(ds, mode=None).get_state()["mode"] == "map"  # None: the default
    assert first_batch(loader(ds, image_format="uint8"))["observation.images.cam0"].dtype == "uint8"
    with raises(ValueError, "mode: unknown value 'walk'"):
        loader(ds, mode="walk")
    with raises(TypeError, "partition must be a string"):
        loader(ds, partition=1)
    with raises(ValueError, "image_format: unknown value 'float_chw'"):
        loader(ds, image_format="float_chw")
    with raises(ValueError, "on_error: unknown value 'ignore'"):
        loader(ds, on_error="ignore")


def test_integers(ds):
    st = loader(ds, seed=7, epoch=3, world_size=2, rank=1, drop_last=True, shuffle=False).get_state()
    assert (st["seed"], st["epoch"], st["world_size"], st["drop_last"], st["shuffle"]) == (7, 3, 2, True, False)
    assert loader(ds, seed=-1).get_state()["seed"] == 2**64 - 1  # 'K' masks
    with raises(TypeError, "Loader() argument 4 must be int, not str"):
        loader(ds, seed="7")
    with raises(TypeError, "Loader() argument 31 must be int, not float"):
        loader(ds, prefetch_cache_bytes=1.5)
    with raises(OverflowError, "signed integer is greater than maximum"):
        loader(ds, threads=2**31)
    with raises(ValueError, "loader: rank 5 must be in [0, world_size 1)"):  # the engine's check
        loader(ds, rank=5)

    class NoTruth:
        def __bool__(self):
            raise RuntimeError("no truth")

    with raises(RuntimeError, "no truth"):
        loader(ds, shuffle=NoTruth())


def test_float_and_width_height(ds):
    cam = first_batch(loader(ds, resize=(16, 8), tolerance_s=0.01))["observation.images.cam0"]
    assert tuple(cam.shape)[-2:] == (8, 16)
    with raises(TypeError, "must be real number, not str"):
        loader(ds, tolerance_s="0.01")
    with raises(TypeError, "resize must be (width, height)"):
        loader(ds, resize=(16, 8, 3))


def test_entries_and_parsed(ds, tmp_path):
    batch = first_batch(loader(ds, keys=["action", "observation.state"], renames={"action": "act"},
                               normalize={"observation.state": "mean_std"}))
    assert "act" in batch and "action" not in batch and "observation.images.cam0" not in batch
    assert len(first_batch(loader(ds, delta_timestamps={"action": [0.0, 0.1]}))["action"].shape) == 3
    for kw, exc, text in [
        (dict(renames=3), TypeError, "renames must be a dict {dataset key: new name}"),
        (dict(renames={"action": 3}), TypeError, "renames keys and values must be strings"),
        (dict(normalize={"action": "nope"}), ValueError, "normalize mode: unknown value 'nope'"),
        (dict(normalize={"action": 1}), TypeError, "normalize mode must be a string"),
        (dict(keys=3), TypeError, "keys must be a list of feature names"),
        (dict(keys=[3]), TypeError, "keys must be strings"),
        (dict(delta_timestamps=[0.1]), TypeError, "delta_timestamps must be a dict {key: [seconds, ...]}"),
        (dict(delta_timestamps={3: [0.0]}), TypeError, "delta_timestamps keys must be strings"),
        (dict(state=[]), TypeError, "a loader state is a dict (from state_dict())"),
        (dict(state={"mode": "map"}), KeyError, "\"loader state: missing key 'version'\""),
        (dict(prefetch_cache_dir=3), TypeError, "expected str, bytes or os.PathLike object, not int"),
    ]:
        with raises(exc, text):
            loader(ds, **kw)
    first = loader(ds, batch_size=4, seed=1)
    next(iter(first))
    resumed = loader(ds, batch_size=4, seed=1, state=first.get_state(), prefetch_cache_dir=str(tmp_path))
    assert resumed.batches_delivered == 1


def test_arguments(ds):
    with raises(TypeError, "'nope' is an invalid keyword argument for Loader()"):
        native.Loader(ds, nope=1)
    with raises(TypeError, "Loader() missing required argument 'dataset' (pos 1)"):
        native.Loader()
    with raises(TypeError, "Loader() takes at most 1 positional argument (2 given)"):
        native.Loader(ds, "map")
    with raises(TypeError, "argument for Loader() given by name ('dataset') and position (1)"):
        native.Loader(ds, dataset=ds)
    with raises(TypeError, "Loader() argument 1 must be vlafeed._native.Dataset, not str"):
        native.Loader("ds")


# ---- the other tables: loader_state / plan_report, WdsLoader, Dataset ------------------------


def test_state_and_plan_settings(ds):
    st = native.loader_state(ds, epoch=1, batches=2, mode="map", batch_size=4, seed=3)
    assert (st["epoch"], st["samples_consumed"], st["seed"]) == (1, 8, 3)
    assert native.resolve_state(ds, resume=st, mode="map", batch_size=4, seed=3)["samples_consumed"] == 8
    assert '"world_size"' in native.plan_report(ds, world_size=2, workers=2)
    with raises(ValueError, "batch_size must be >= 1; shuffle_buffer and episode_pool_size >= 0"):
        native.loader_state(ds, batch_size=0)
    with raises(ValueError, "plan: world_size, workers, batch_size and episode_pool_size must be >= 1; "
                            "shuffle_buffer and epoch >= 0"):
        native.plan_report(ds, workers=0)
    with raises(ValueError, "plan: rank and worker go together"):
        native.plan_report(ds, rank=0)
    with raises(TypeError, "resolve_state: a state (resume=) is required"):
        native.resolve_state(ds)
    with raises(TypeError, "'nope' is an invalid keyword argument for loader_state()"):
        native.loader_state(ds, nope=1)


def test_wds_settings(manifest):
    w = native.WdsLoader(manifest, batch_size=3, shuffle=False, fields="lowdim.npz", image_format="float32",
                         epoch=1, prefetch=0)
    batch = w.next_batch()
    assert [c[1] for c in batch["columns"]] and all(c[1].startswith("lowdim.npz") for c in batch["columns"])
    assert w.get_state()["epoch"] == 1 and w.num_batches == 3
    for kw, exc, text in [
        (dict(batch_size=0), ValueError, WDS_RANGE),
        (dict(epoch=-1), ValueError, WDS_RANGE),
        (dict(image_format="rgb"), ValueError, "image_format must be 'uint8_hwc' or 'float_chw', not 'rgb'"),
        (dict(on_error="ignore"), ValueError, "on_error must be 'raise' or 'skip'"),
        (dict(fields=3), TypeError, "argument 12 must be str or None, not int"),
        (dict(seed="1"), TypeError, "argument 3 must be int, not str"),
        (dict(resize=(1, 2, 3)), TypeError, "resize must be (width, height)"),
        (dict(state={}), ValueError, "state is not a ShardLoader state (kind != 'wds')"),
        (dict(nope=1), TypeError, "'nope' is an invalid keyword argument for this function"),
    ]:
        with raises(exc, text):
            native.WdsLoader(manifest, **kw)
    with raises(TypeError, "function missing required argument 'manifest' (pos 1)"):
        native.WdsLoader()


def test_dataset_settings(root):
    assert native.Dataset(root, [0, 2], on_metadata_error="warn", check_videos=0).num_episodes == 2
    assert native.dataset_info(root, check_data=False)["total_episodes"] == 3
    assert native.plan(root, world_size=2)
    with raises(ValueError, 'on_metadata_error must be "raise" or "warn", not "maybe"'):
        native.Dataset(root, on_metadata_error="maybe")
    with raises(TypeError, "Dataset() argument 3 must be str, not int"):
        native.Dataset(root, on_metadata_error=1)
    with raises(TypeError, "expected str, bytes or os.PathLike object, not int"):
        native.Dataset(3)
    with raises(TypeError, "'nope' is an invalid keyword argument for dataset_info()"):
        native.dataset_info(root, nope=1)


def test_python_loader_takes_resize_as_a_list(root):
    """vlafeed.Loader(resize=[w, h]) (as a YAML or JSON config gives it) works like a tuple (it used to
    reach the binding as a list and fail with SystemError)."""
    import vlafeed
    cam = native.Dataset(root).camera_keys[0]
    for resize in ([16, 8], (16, 8)):
        loader = vlafeed.Loader(root, mode="map", batch_size=2, keys=[cam], resize=resize, image_format="uint8",
                                output="numpy", shuffle=False)
        frames = next(iter(loader))[cam]
        assert frames.shape[-2:] == (8, 16)
        loader.close()


@pytest.mark.parametrize("form", ["loader", "wds"])
def test_state_integers_never_wrap(root, tmp_path, form):
    """A state's integers are taken in their field's range or refused naming the key: 2**64 + k, a
    negative unsigned, a 32-bit field given 2**32 + 1 (it became 1), a bool where a count belongs (the ShardLoader form
    used to wrap them modulo 2**64); a ShardLoader state of an unknown version is refused."""
    import vlafeed
    from wds_helpers import write_foundry_set
    if form == "loader":
        make = lambda **kw: vlafeed.Loader(root, mode="stream", batch_size=2, output="numpy", **kw)  # noqa: E731
        who = "loader state"
    else:
        manifest = write_foundry_set(tmp_path / "shards", shards=2, per_shard=4)
        make = lambda **kw: vlafeed.ShardLoader(manifest, batch_size=2, output="numpy", **kw)  # noqa: E731
        who = "shard loader state"
    ld = make()
    next(iter(ld))
    good = ld.state_dict()
    ld.close()
    for key, bad, exc in [("seed", 2 ** 64 + 5, ValueError), ("seed", -1, ValueError),
                          ("samples_consumed", 2 ** 63, ValueError), ("world_size", 2 ** 32 + 1, ValueError),
                          ("version", 2 ** 32 + 2, ValueError), ("epoch", True, TypeError),
                          ("samples_consumed", "2", TypeError)]:
        with pytest.raises(exc, match=re.escape(f"{who}: '{key}'")):
            make(state=dict(good, **{key: bad}))
    if form == "wds":
        for version in (0, 4, 99):  # the build reads versions 1 to 3
            with pytest.raises(ValueError, match=f"version {version} is not one this build reads"):
                make(state=dict(good, version=version))
    resumed = make(state=good)   # the good state still resumes
    assert next(iter(resumed)) is not None
    resumed.close()


def test_dataset_problems_are_the_info_documents():
    """Dataset.problems lists what info() lists under "problems", without building the document."""
    import pathlib
    fixture = pathlib.Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "lerobot-g1-v21"
    if not fixture.exists():
        pytest.skip(f"no fixture at {fixture}")
    d = native.Dataset(str(fixture), on_metadata_error="warn")
    keys = ("severity", "file", "episode", "column", "message")
    assert d.problems and [{k: p[k] for k in keys} for p in d.problems] == \
        [{k: p[k] for k in keys} for p in d.info()["problems"]]
