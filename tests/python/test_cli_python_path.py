"""`vlafeed quantize` / `vlafeed rl` run Python; which vlafeed they import: the
source tree's package only when it holds a built extension (make py-inplace),
else the installed one. A fresh clone after `make demo` has the package
installed in site-packages and a python/ folder without an extension: putting
that folder on PYTHONPATH (as the command used to) shadowed the installed
package and the commands failed. The command's exec code is compiled here
against a stand-in source tree, and the installed package is stood in for by
a site directory added after PYTHONPATH (where site-packages sits)."""
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    work = tmp_path_factory.mktemp("clipath")
    tree = work / "clone" / "python"
    (tree / "vlafeed" / "_native").mkdir(parents=True)
    (tree / "vlafeed" / "__init__.py").write_text("raise ImportError('the source tree without a built extension')\n")
    main = work / "main.c"
    main.write_text(
        '#include <string.h>\n'
        'int vf_cmd_rl(int argc, char **argv);\n'
        'int vf_cli_is(const char *arg, const char *name, const char *alias)\n'
        '{ return !strcmp(arg, name) || (alias && !strcmp(arg, alias)); }\n'
        'int main(int argc, char **argv) { return vf_cmd_rl(argc - 1, argv + 1); }\n')
    exe = work / "vlafeed-rl"
    subprocess.run([cc, "-std=c11", "-I", str(REPO / "tools"), "-I", str(REPO / "include"), "-I", str(REPO / "src"),
                    f'-DVF_SOURCE_PYTHON_DIR="{tree}"', str(REPO / "tools" / "cmd_quantize.c"), str(main), "-o",
                    str(exe)], check=True, capture_output=True)
    site_dir = work / "site"
    site_dir.mkdir()
    installed = pathlib.Path(__import__("vlafeed").__file__).resolve().parents[1]
    (site_dir / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(installed)!r})\n")
    return exe, tree, site_dir


def run(exe, site_dir):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site_dir), VF_PYTHON=sys.executable)
    return subprocess.run([str(exe), "rl", "--help"], capture_output=True, text=True, env=env, timeout=300)


def test_unbuilt_source_tree_leaves_the_installed_package_in_charge(harness):
    pytest.importorskip("torch")
    exe, tree, site_dir = harness
    r = run(exe, site_dir)
    assert r.returncode == 0, r.stderr
    assert "usage: vlafeed rl" in r.stdout


def test_built_source_tree_comes_first(harness):
    exe, tree, site_dir = harness
    so = tree / "vlafeed" / "_native" / ("_core" + sysconfig.get_config_var("EXT_SUFFIX"))
    so.write_bytes(b"")
    try:
        r = run(exe, site_dir)
    finally:
        so.unlink()
    assert r.returncode != 0 and "the source tree without a built extension" in r.stderr
