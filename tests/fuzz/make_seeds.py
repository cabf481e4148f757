#!/usr/bin/env python3
"""Writes the fuzz seed corpora into OUT/<fuzz target name>/.

Each tests/fuzz/seeds_<target>.py defines `write_seeds(out_dir)`; this runs
them all. Seeds are generated (pyarrow, the shared fixtures) so the repo keeps
no binary corpus.
"""
import importlib.util
import pathlib
import sys


def main():
    out = pathlib.Path(sys.argv[1])
    here = pathlib.Path(__file__).resolve().parent
    for script in sorted(here.glob("seeds_*.py")):
        target = "fuzz_" + script.stem[len("seeds_"):]
        spec = importlib.util.spec_from_file_location(script.stem, script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        dest = out / target
        dest.mkdir(parents=True, exist_ok=True)
        module.write_seeds(dest)
        print(f"seeds: {target}: {len(list(dest.iterdir()))} files")


if __name__ == "__main__":
    main()
