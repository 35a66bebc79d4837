# kwarm: the two commands of the README.  CMake does the real build; this
# file only sequences set-up, build, run and test.
#
#   make run    install missing Debian packages (as root), build, start
#               kwarmd on a socket and cache under the build tree, warm the
#               embedded default (DeepSeek-V3.2) through it, fetch one
#               kernel, print the stats, stop the daemon
#   make test   the same set-up, then every test, in a normal build and in
#               an ASan/UBSan build

BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
MODEL      ?= tests/fixtures/deepseek-v3.2-exp.json

PREFIX     ?= /usr/local

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

run: build
	@scripts/run-demo.sh $(BUILD) $(MODEL)

test: build build-asan
	@echo "== tests ($(BUILD))"
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)
	@echo "== tests under ASan/UBSan ($(ASAN_BUILD))"
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j$(JOBS)

install: deps
	cmake -S . -B $(BUILD) -DKW_WERROR=ON -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
