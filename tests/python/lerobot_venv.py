"""Finding upstream LeRobot 0.6's interpreter (build-lerobot/venv312) for the tests that run
LeRobot's own code: test_lerobot_surface.py and test_lerobot_train_upstream.py.

LeRobot 0.6 needs Python 3.12 and torch < 2.12, so it lives in its own venv
(tests/python/install_lerobot06.sh; VF_LEROBOT_PYTHON names another
interpreter). Those tests skip, with the reason printed, when it is absent.
"""
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VENV312 = ROOT / "build-lerobot" / "venv312" / "bin" / "python"


def env(tmp, **extra):
    """The environment LeRobot runs in: no Hub, its caches under tmp."""
    e = dict(os.environ)
    e.update(HF_HOME=str(Path(tmp) / "hf-home"), HF_LEROBOT_HOME=str(Path(tmp) / "lerobot-home"),
             HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled")
    e.update(extra)
    return e


def lerobot06_python(tmp):
    """(interpreter, None) or (None, why not)."""
    cand = os.environ.get("VF_LEROBOT_PYTHON") or str(VENV312)
    if not os.path.isfile(cand):
        return None, f"no LeRobot 0.6 interpreter at {cand} (run tests/python/install_lerobot06.sh)"
    r = subprocess.run([cand, "-c", "import importlib.metadata as m, sys; import lerobot.datasets; "
                        "v = m.version('lerobot'); print(v); sys.exit(0 if v.startswith('0.6') else 3)"],
                       capture_output=True, text=True, env=env(tmp), timeout=300)
    if r.returncode != 0:
        return None, f"LeRobot 0.6 does not import in {cand}: {(r.stderr or r.stdout).strip()[-400:]}"
    return cand, None
