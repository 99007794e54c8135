# The two commands that do everything on a fresh Debian 12 machine:
#   make demo   installs what is missing, builds, trains on Fashion-MNIST (distribute-train)
#   make test   installs what is missing, builds, runs every test
# Sanitizer runs (CI runs both): make test-asan, make test-tsan.

JOBS ?= $(shell nproc)
CTEST_FLAGS ?= --output-on-failure -j $(JOBS)

.PHONY: all setup build demo test test-asan test-tsan ci clean

all: build

setup:
	@bash scripts/setup.sh

build: setup
	cmake --preset release
	cmake --build --preset release -j $(JOBS)

demo: build
	./build/release/tools/distribute-train

test: build
	ctest --preset release $(CTEST_FLAGS)

test-asan: setup
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan $(CTEST_FLAGS)

test-tsan: setup
	cmake --preset tsan
	cmake --build --preset tsan -j $(JOBS)
	ctest --preset tsan $(CTEST_FLAGS)

ci: test test-asan test-tsan

clean:
	rm -rf build
