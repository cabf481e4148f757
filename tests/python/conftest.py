"""Shared pytest fixtures: paths to the shared fixtures and to the built
`vlafeed` command. The extension is imported from python/ (in-place build,
`make py-inplace`) or from the installed package."""
import atexit
import os
import pathlib
import shutil
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT.parent / "shared" / "fixtures"

# Datasets the tests open cache their decoded metadata (docs/scale.md,
# "Opening big metadata"): in a scratch folder of this session, never in the
# user's ~/.cache. Set at import, so every subprocess inherits it.
_META_CACHE_DIR = tempfile.mkdtemp(prefix="vf-test-cache-")
os.environ["VF_CACHE_DIR"] = _META_CACHE_DIR
atexit.register(shutil.rmtree, _META_CACHE_DIR, True)


@pytest.fixture(scope="session")
def fixtures_dir():
    if not FIXTURES.is_dir():
        pytest.skip(f"shared fixtures not found at {FIXTURES}")
    return FIXTURES


@pytest.fixture(scope="session")
def g1_dir(fixtures_dir):
    return fixtures_dir / "lerobot-g1-v21"


@pytest.fixture(scope="session")
def cli():
    """Path of the vlafeed command: $VF_CLI, build/vlafeed, or PATH."""
    for candidate in (os.environ.get("VF_CLI"), str(ROOT / "build" / "vlafeed"), shutil.which("vlafeed")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("vlafeed command not built (run make build)")


@pytest.fixture(scope="module")
def moto_endpoint():
    """URL of a moto S3 server on loopback (one per test module); skips without moto."""
    try:
        from moto.server import ThreadedMotoServer
    except Exception as e:  # pragma: no cover - depends on the environment
        pytest.skip(f"moto is not installed: {e}")
    try:
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
    except Exception as e:  # pragma: no cover
        print(f"moto server cannot start: {e}")
        pytest.skip(f"moto server cannot start: {e}")
    yield f"http://{host}:{port}"
    server.stop()
