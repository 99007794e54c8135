# The two commands that do everything on a fresh Debian 12 machine:
#   make demo   installs what is missing, builds, trains on Fashion-MNIST (distribute-train)
#   make test   installs what is missing, builds, runs every test
# Sanitizer runs (CI runs both): make test-asan, make test-tsan.
# The layers' include rules alone (make test checks them first): make check-layers.
# Format and clang-tidy (CI runs it): make lint; apply the format: make format.
# Fuzzing (CI runs a minute): make fuzz [FUZZ_SECONDS=3600] [FUZZ_SEED=0].

JOBS ?= $(shell nproc)
CTEST_FLAGS ?= --output-on-failure -j $(JOBS)

FUZZ_SECONDS ?= 60
# CI fuzzes from a fixed seed, so that a failure there is a change's, not
# luck's; FUZZ_SEED=0 lets libFuzzer pick one (long runs).
FUZZ_SEED ?= 1

.PHONY: all setup build demo test check-layers lint format test-asan test-tsan fuzz ci clean

all: build

setup:
	@bash scripts/setup.sh

build: setup
	cmake --preset release
	cmake --build --preset release -j $(JOBS)

demo: build
	./build/release/tools/distribute-train

test: check-layers build
	ctest --preset release $(CTEST_FLAGS)

# Includes run down the layers, and backends are reached through comm/backend.h.
check-layers:
	@bash scripts/check_layers.sh

# .clang-format and .clang-tidy, on every C++ file and translation unit.
lint: build
	JOBS=$(JOBS) bash scripts/lint.sh build/release

format: setup
	git ls-files '*.cc' '*.h' | xargs clang-format -i

test-asan: setup
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan $(CTEST_FLAGS)

test-tsan: setup
	cmake --preset tsan
	cmake --build --preset tsan -j $(JOBS)
	ctest --preset tsan $(CTEST_FLAGS)

# libFuzzer (clang) with ASan+UBSan: replays the corpus kept in fuzz/corpus/api,
# then fuzzes for FUZZ_SECONDS; new inputs go to build/fuzz/corpus, a failing
# input to build/fuzz/crash-* (docs/reliability.md).
fuzz: setup
	cmake --preset fuzz
	cmake --build --preset fuzz -j $(JOBS)
	mkdir -p build/fuzz/corpus
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 build/fuzz/fuzz/api_fuzzer \
	  -max_total_time=$(FUZZ_SECONDS) -seed=$(FUZZ_SEED) -timeout=30 -print_final_stats=1 -artifact_prefix=build/fuzz/ \
	  build/fuzz/corpus fuzz/corpus/api

ci: test test-asan test-tsan fuzz

clean:
	rm -rf build
