#!/usr/bin/env bash
# build-docs.sh: builds the documentation site (docs/, mkdocs.yml) into
# build-docs/site with `mkdocs build --strict`: any warning (a broken link or
# anchor, a page missing from the nav, a docstring griffe cannot parse) fails.
#
# The tools live in their own venv, build-docs/venv (git-ignored through
# /build*/), so the main Python environment is never touched. They are
# installed, pinned to the versions the site was tested with, only when
# missing or at other versions; otherwise this takes a few seconds.
# The API pages are read from python/ by griffe, statically: neither the
# extension nor torch or Ray needs to be importable.
#
# Usage: scripts/build-docs.sh [extra mkdocs build arguments]
# PY names the interpreter that creates the venv (default python3).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
PY=${PY:-python3}
venv="$here/build-docs/venv"
pins=("mkdocs==1.6.1" "mkdocstrings==1.0.8" "mkdocstrings-python==2.0.11" "griffelib==2.4.1"
      "mkdocs-autorefs==1.4.5" "mkdocs-material==9.8.2")
stamp="$venv/.vlafeed-docs-pins"

if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "${pins[*]}" ] ||
   ! "$venv/bin/python" -c 'import mkdocs, mkdocstrings, mkdocstrings_handlers.python, material' 2>/dev/null; then
  echo "build-docs: installing ${pins[*]} into $venv"
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}"
  echo "${pins[*]}" > "$stamp"
fi

NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict -d "$here/build-docs/site" "$@"
echo "build-docs: site in build-docs/site (open build-docs/site/index.html)"
