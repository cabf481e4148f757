# vlafeed: the two commands are `make demo` and `make test`; both install
# what they need (scripts/install-deps.sh) and build first.
PY ?= python3
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
CMAKE_FLAGS ?=

.PHONY: all deps build build-asan build-tsan build-fuzz python py-inplace py312-inplace test test-c test-asan test-tsan fuzz test-py docs demo bench clean lerobot06

all: build

deps:
	@scripts/install-deps.sh

build: deps
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	cmake --build build -j $(JOBS)

build-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DVF_SANITIZE=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build-asan -j $(JOBS)

# ThreadSanitizer: only the library and the tests that race teardown against
# work in flight (TSan is slow; the other suites run under ASan + UBSan).
TSAN_TESTS = test_close test_base_runtime test_video_cache test_filecache test_dataset_scale test_http_cancel test_table_disk_loader
build-tsan: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVF_TSAN=ON -DVF_TOOLS=OFF $(CMAKE_FLAGS) >/dev/null
	cmake --build build-tsan -j $(JOBS) --target $(TSAN_TESTS)

build-fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVF_FUZZ=ON -DVF_TESTS=OFF -DVF_TOOLS=OFF >/dev/null
	cmake --build build-fuzz -j $(JOBS)

# The Python package (CPython extension + the vlafeed command on PATH).
python: deps
	$(PY) -m pip install -q --no-build-isolation .

test-c: build
	ctest --test-dir build --output-on-failure -j $(JOBS)

test-asan: build-asan
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS)

test-tsan: build-tsan
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --test-dir build-tsan --output-on-failure -j $(JOBS) -R '^($(subst $() ,|,$(TSAN_TESTS)))$$'

fuzz: build-fuzz
	scripts/run-fuzzers.sh build-fuzz $(FUZZ_SECONDS)

# The extension built in place (build-py/ -> python/vlafeed/_native/), for tests.
py-inplace: deps
	cmake -S . -B build-py -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVF_PYTHON=ON -DVF_TESTS=OFF -DVF_TOOLS=OFF >/dev/null
	cmake --build build-py -j $(JOBS)
	cp build-py/_core*.so python/vlafeed/_native/

# The same extension for LeRobot 0.6's venv (Python 3.12), built with its
# interpreter into build-py312/ and copied next to the 3.11 one: both ABIs
# (_core.cpython-311-*.so, _core.cpython-312-*.so) sit in python/vlafeed/_native/,
# so PYTHONPATH=python imports vlafeed in either interpreter (the tests that run
# lerobot-train on vlafeed's classes need it).
PY312 ?= build-lerobot/venv312/bin/python
py312-inplace: deps
	@if [ ! -x "$(PY312)" ]; then echo "py312-inplace: no $(PY312) (make lerobot06)"; exit 1; fi
	cmake -S . -B build-py312 -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVF_PYTHON=ON -DVF_TESTS=OFF -DVF_TOOLS=OFF \
	  -DPython_EXECUTABLE=$(abspath $(PY312)) >/dev/null
	cmake --build build-py312 -j $(JOBS)
	cp build-py312/_core*.so python/vlafeed/_native/

# Upstream LeRobot 0.6 + Ray Data in build-lerobot/venv312 (Python 3.12, torch
# 2.11 CUDA build from PyPI: ~2.5 GB of downloads, ~5.6 GB on disk, 5-11 min
# the first time, seconds once installed). make test installs it unless
# VF_LEROBOT06=0; if the install fails (no network, no disk), the upstream
# parity tests skip with the reason printed instead of failing the suite.
lerobot06:
	tests/python/install_lerobot06.sh

test-py: py-inplace build
	@if [ "$(VF_LEROBOT06)" != 0 ]; then tests/python/install_lerobot06.sh || \
	  echo "make test: the LeRobot 0.6 venv could not be installed (see above); the upstream parity tests will skip"; fi
	@if [ "$(VF_LEROBOT06)" != 0 ] && [ -x "$(PY312)" ]; then $(MAKE) --no-print-directory py312-inplace || \
	  echo "make test: vlafeed did not build for $(PY312); the lerobot-train tests will skip"; fi
	PYTHONPATH=$(CURDIR)/python VF_CLI=$(CURDIR)/build/vlafeed $(PY) -m pytest -q tests/python

# The documentation site (MkDocs + mkdocstrings, API pages from the docstrings)
# built with warnings as errors into build-docs/site.
docs:
	scripts/build-docs.sh

test: test-c test-asan test-tsan fuzz test-py docs
	@echo "make test: all suites passed"

demo: python build
	scripts/demo.sh

clean:
	rm -rf build build-asan build-tsan build-fuzz build-python build-py build-py312 build-docs tests/fuzz/work python/vlafeed/_native/*.so
