# Thin wrapper over CMake. `make demo` builds and runs the main job; `make test`
# builds and runs every test, then again under ASan + UBSan.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps build demo test test-fast test-sanitize test-install bench fuzz clean

all: build

deps:
	@./scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WERROR=ON $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# The demo needs the tool and its worker only: not the tests, benchmarks or library.
demo: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target kiln kiln-worker
	./$(BUILD)/kiln demo

test-fast: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

$(ASAN_BUILD)/build.ninja: | deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_WERROR=ON -DKILN_SANITIZE=ON -DKILN_BENCH=OFF $(CMAKE_FLAGS)

# intercept_tls_get_addr=0: the sanitizer runtime of GCC 13 and older can take a
# dynamic TLS block (a dlopen'd kernel's, OpenBLAS's) for an old glibc's header
# and read past it; the leak check's tracer then dies at exit ("Tracer caught
# signal 11") after a test has passed. With it off, a block pointed to only from
# dynamic TLS would be reported as a leak, never hidden.
test-sanitize: deps $(ASAN_BUILD)/build.ninja
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:intercept_tls_get_addr=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

# The installed package: cmake --install into a temporary prefix, then the
# standalone example built against it runs a packed artifact.
test-install: build
	./scripts/test-install.sh $(BUILD)

test: test-fast test-sanitize test-install

bench: build
	./$(BUILD)/bench/kiln_bench_dispatch
	./$(BUILD)/bench/kiln_bench_workers

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz

# Coverage-guided fuzzing of the expression, spec, program and artifact parsers (clang's libFuzzer).
# New inputs land in build-fuzz/corpus-*; `make fuzz-merge` folds them into fuzz/corpus.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= expr spec program artifact
build-fuzz/build.ninja: | deps
	@./scripts/install-deps.sh --fuzz
	CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_FUZZ=ON \
	  -DKILN_TESTS=OFF -DKILN_BENCH=OFF \
	  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"

fuzz: build-fuzz/build.ninja
	cmake --build build-fuzz -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	for t in $(FUZZ_TARGETS); do mkdir -p build-fuzz/corpus-$$t; \
	  ./build-fuzz/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=$$( [ $$t = artifact ] && echo 65536 || echo 4096) -timeout=20 build-fuzz/corpus-$$t fuzz/corpus/$$t || exit 1; done

fuzz-merge:
	for t in $(FUZZ_TARGETS); do ./build-fuzz/fuzz/fuzz_$$t -merge=1 fuzz/corpus/$$t build-fuzz/corpus-$$t; done
