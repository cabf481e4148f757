# vlafeed: the two commands are `make demo` and `make test`; both install
# what they need (scripts/install-deps.sh) and build first.
PY ?= python3
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
CMAKE_FLAGS ?=

.PHONY: all deps build build-asan build-fuzz python py-inplace test test-c test-asan fuzz test-py demo bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	cmake --build build -j $(JOBS)

build-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DVF_SANITIZE=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build-asan -j $(JOBS)

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

fuzz: build-fuzz
	scripts/run-fuzzers.sh build-fuzz $(FUZZ_SECONDS)

# The extension built in place (build-py/ -> python/vlafeed/), for tests.
py-inplace: deps
	cmake -S . -B build-py -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVF_PYTHON=ON -DVF_TESTS=OFF -DVF_TOOLS=OFF >/dev/null
	cmake --build build-py -j $(JOBS)
	cp build-py/_native*.so python/vlafeed/

test-py: py-inplace build
	PYTHONPATH=$(CURDIR)/python VF_CLI=$(CURDIR)/build/vlafeed $(PY) -m pytest -q tests/python

test: test-c test-asan fuzz test-py
	@echo "make test: all suites passed"

demo: python build
	scripts/demo.sh

clean:
	rm -rf build build-asan build-fuzz build-python build-py tests/fuzz/work python/vlafeed/*.so
