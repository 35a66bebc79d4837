# kwarm: the two commands of the README.  CMake does the real build; this
# file only sequences set-up, build, run and test.
#
#   make run    install missing Debian packages (as root), build kwarmd,
#               kwarm and kwarm-compile (nothing else), start
#               kwarmd on a socket and cache under the build tree, warm the
#               embedded default (DeepSeek-V3.2) through it, fetch one
#               kernel, print the stats, stop the daemon
#   make test   the same set-up, then every test, in a normal build and in
#               an ASan/UBSan build, the Python client installed with pip
#               into a temporary venv and tested against kwarmd, then each
#               libFuzzer harness of tests/fuzz/ for FUZZ_SECONDS (when
#               clang has libFuzzer)

# gmake's "Entering/Leaving directory" lines would be half of make test's
# output (cmake --build runs gmake under us, which inherits MAKEFLAGS).
MAKEFLAGS  += --no-print-directory

BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
MODEL      ?= tests/fixtures/deepseek-v3.2-exp.json
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 20

PREFIX     ?= /usr/local
# Debian's python3 (the venv of make test needs python3-venv, and builds
# the client with Debian's setuptools and wheel: nothing is downloaded).
PYTHON     ?= /usr/bin/python3

# Prints how many ctest tests of build dir $(1) were skipped (a gpu_ suite
# without a CUDA driver, a root-only suite), from ctest's JUnit report.
skipped = echo "== $$(grep -o 'skipped="[0-9]*"' $(abspath $(1))/ctest.xml | \
  head -1 | tr -dc 0-9) tests skipped (ctest lists them above)"

.PHONY: all deps build build-asan run test clean install

all: build

deps:
	@scripts/deps.sh

$(BUILD)/Makefile: CMakeLists.txt
	cmake -S . -B $(BUILD) -DKW_WERROR=ON $(CMAKE_FLAGS) >/dev/null

build: deps $(BUILD)/Makefile
	cmake --build $(BUILD) -j$(JOBS)

build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DKW_WERROR=ON -DKW_SANITIZE=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build $(ASAN_BUILD) -j$(JOBS)

# The demo needs only the two programs and the compile worker: not every
# test and benchmark that `build` makes.
run: deps $(BUILD)/Makefile
	cmake --build $(BUILD) -j$(JOBS) --target kwarmd kwarm kwarm-compile
	@scripts/run-demo.sh $(BUILD) $(MODEL)

test: build build-asan
	@echo "== tests ($(BUILD))"
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) \
	  --output-junit $(abspath $(BUILD))/ctest.xml; \
	  s=$$?; $(call skipped,$(BUILD)); exit $$s
	@echo "== tests under ASan/UBSan ($(ASAN_BUILD))"
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j$(JOBS) \
	  --output-junit $(abspath $(ASAN_BUILD))/ctest.xml; \
	  s=$$?; $(call skipped,$(ASAN_BUILD)); exit $$s
	@echo "== Python client: pip install into a temporary venv, tests against kwarmd"
	@v=$$(mktemp -d /tmp/kwarm-venv.XXXXXX) && \
	  cp -r client/python $$v/src && \
	  $(PYTHON) -m venv --system-site-packages $$v/env && \
	  $$v/env/bin/python -m pip install -q --no-build-isolation --no-index $$v/src && \
	  KWARMD=$(abspath $(BUILD))/kwarmd KWARM_LIBRARY=$(abspath $(BUILD))/libkwarm.so $$v/env/bin/python -m unittest discover \
	    -s tests/python -t tests/python -v; \
	  s=$$?; rm -rf $$v; exit $$s
	@if echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n);' \
	     'int LLVMFuzzerTestOneInput(const char *d, unsigned long n)' \
	     '{ (void)d; (void)n; return 0; }' | \
	   clang -x c -fsanitize=fuzzer,address,undefined - \
	     -o /tmp/kw-fuzz-probe.$$$$ >/dev/null 2>&1; then \
	  rm -f /tmp/kw-fuzz-probe.$$$$; \
	  echo "== fuzzing, $(FUZZ_SECONDS) s per harness ($(FUZZ_BUILD))"; \
	  CC=clang cmake -S . -B $(FUZZ_BUILD) -DKW_WERROR=ON -DKW_FUZZ=ON \
	    -DKW_FUZZ_SECONDS=$(FUZZ_SECONDS) $(CMAKE_FLAGS) >/dev/null && \
	  cmake --build $(FUZZ_BUILD) -j$(JOBS) \
	    --target fuzz_proto fuzz_config fuzz_deploy && \
	  cd $(FUZZ_BUILD) && ctest -L fuzz --output-on-failure -j$(JOBS); \
	else \
	  rm -f /tmp/kw-fuzz-probe.$$$$; \
	  echo "== fuzzing skipped: clang with libFuzzer not found" \
	       "(Debian: clang libclang-rt-14-dev)"; \
	fi

install: deps
	cmake -S . -B $(BUILD) -DKW_WERROR=ON -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
