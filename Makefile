# servelab — build, test and run.
#
#   make            build bin/servelab (portable: no -march=native)
#   make run        install missing packages, build and open the lab on its default model
#   make test       install missing packages, build, run every test
#   make check      the same tests under AddressSanitizer + UBSan + LeakSanitizer (build/check)
#   make fuzz       install clang if missing, build the libFuzzer harnesses of
#                   tests/fuzz (build/fuzz, clang + ASan + UBSan) and run each
#                   for FUZZ_SECONDS (default 20); fails on any crash, leak or
#                   sanitizer report (reproducers in build/fuzz/artifacts/)
#   make fuzz-build only build them (build/fuzz/bin/fuzz_*)
#   make bench      servelab bench on stories110m (BENCH_ARGS="--json --threads 2")
#   make lessons    every Lua lesson headless with its full-size scenarios (minutes)
#   make mutants    the mutation test: each scripts/mutants/*.mutant built into a scratch tree and
#                   run against every lesson with the audit (docs/mutants.md); MUTANTS="a b" picks
#                   some, MUTANTS_ARGS="--quick" stops at the first lesson that catches each
#   make deps       install the lab's missing Debian packages (root) or print the command
#   make test-deps  the same for what only the tests need (cmocka, tmux, curl, node, npm, openai)
#   JOBS=N          jobs for the build (default: every core; -jN works too); V=1: full commands
#   make models     fetch stories260K/stories15M into ./models (needs internet)
#   make install    PREFIX=/usr/local DESTDIR=
#   CUDA=auto|0|1   build kernels/cuda when nvcc is found / never / always
#
# CFLAGS are strict (-Wall -Wextra) everywhere and -Werror when CI is set.

CC       ?= cc
NVCC     ?= nvcc
PREFIX   ?= /usr/local
DESTDIR  ?=
CUDA     ?= auto
BUILD    ?= build/release
SANITIZE ?= 0

# The lab's libraries and Debian packages (make run), and what only the
# tests add (make test, make check). An entry PACKAGE:PROGRAM counts as
# present when PROGRAM is on the PATH (a nodejs from elsewhere brings npm).
PKGS          := ncursesw lua5.4 jansson libmicrohttpd libcurl
TEST_PKGS     := cmocka
DEB_PKGS      := build-essential pkg-config libncurses-dev liblua5.4-dev libjansson-dev libmicrohttpd-dev libcurl4-openssl-dev
TEST_DEB_PKGS := libcmocka-dev tmux curl:curl git:git nodejs:node npm:npm

# Parallel builds by default: every core unless -j was given. Only the
# top-level make adds it; a sub-make ($(MAKE)) shares its jobserver.
JOBS ?= $(shell nproc 2>/dev/null || echo 1)
ifeq ($(MAKELEVEL),0)
ifeq ($(filter -j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(JOBS)
endif
endif

WARNINGS := -Wall -Wextra -Wshadow -Wpointer-arith -Wstrict-prototypes -Wmissing-prototypes -Wvla
ifdef CI
WARNINGS += -Werror
endif

# pkg-config is queried lazily so that `make deps` works before the packages exist.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CMOCKA_CFLAGS = $(shell pkg-config --cflags cmocka 2>/dev/null)
CMOCKA_LIBS = $(shell pkg-config --libs cmocka 2>/dev/null)

CFLAGS   ?= -O2 -g
# -falign-loops=32: the scalar fp32 dot product (llama2.c's order, a 4-cycle
# add chain) ran 1.7x slower when an unrelated change moved its loop across a
# 32-byte boundary (stories260K decode, Xeon with AVX-512); aligned loops
# keep kernel speed independent of where the linker happens to put them.
ALL_CFLAGS := -std=c11 -D_GNU_SOURCE $(CFLAGS) -falign-loops=32 $(WARNINGS) -I. -pthread
LDLIBS   := -lm -pthread

ifeq ($(SANITIZE),1)
ALL_CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS    += -fsanitize=address,undefined
endif

# ---- CUDA: decided once, here -------------------------------------------
ifeq ($(CUDA),auto)
  USE_CUDA := $(if $(shell command -v $(NVCC) 2>/dev/null),1,0)
else ifeq ($(CUDA),1)
  USE_CUDA := 1
  ifeq ($(shell command -v $(NVCC) 2>/dev/null),)
    $(error CUDA=1 but '$(NVCC)' is not on the PATH; install the CUDA Toolkit or use CUDA=0)
  endif
else
  USE_CUDA := 0
endif

CUDA_HOME ?= $(patsubst %/bin/,%,$(dir $(shell command -v $(NVCC) 2>/dev/null)))
# The GPUs the CUDA code is compiled for. The four cost ~59 s of CPU per
# build here (cuda_attention.cu 24 s, cuda_matmul.cu 17 s; PTX for
# compute_90 alone: cuda_attention.cu 5.6 s); a build that only has to show
# the code still compiles may pass NVCC_GENCODE=-gencode=arch=compute_90,code=compute_90.
NVCC_GENCODE ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_89,code=sm_89 \
  -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCC_FLAGS := -O2 -std=c++17 -Xcompiler -Wall $(NVCC_GENCODE)

# ---- sources, by layer (docs/design.md: base <- kernels <- engine <- lab) --
# base/ (errors, arenas) is the one layer every other may include.
KERNEL_SRCS := $(wildcard base/*.c) $(wildcard kernels/cpu/*.c)
ENGINE_SRCS := $(wildcard engine/*.c)
LAB_SRCS    := $(filter-out lab/main.c,$(wildcard lab/*.c lab/*/*.c))
ifeq ($(USE_CUDA),1)
  CUDA_SRCS := $(wildcard kernels/cuda/*.cu)
  ALL_CFLAGS += -DSERVELAB_CUDA=1
  # cuBLAS / cuBLASLt ship as shared libraries only; the rpath finds them
  # where the toolkit is, without LD_LIBRARY_PATH.
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcudart_static -ldl -lrt -lstdc++
  # The GPU equivalence test and benchmark (tests/cuda): plain programs, not
  # cmocka tests; without a device the test says "GPU tests NOT RUN" and
  # exits 77, which scripts/run-tests.sh reports as not run, never as passed.
  GPU_TEST_BINS := $(BUILD)/tests/cuda/gpu_equivalence
  GPU_PROGRAMS  := $(GPU_TEST_BINS) $(BUILD)/tests/cuda/gpu_bench
else
  CUDA_SRCS :=
  KERNEL_SRCS += kernels/cuda/cuda_absent.c
  GPU_TEST_BINS :=
  GPU_PROGRAMS  :=
endif

LIB_OBJS  := $(patsubst %.c,$(BUILD)/obj/%.o,$(KERNEL_SRCS) $(ENGINE_SRCS) $(LAB_SRCS)) \
             $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CUDA_SRCS))
MAIN_OBJ  := $(BUILD)/obj/lab/main.o
LIB       := $(BUILD)/libservelab.a
# kernels + engine only (no ncurses / Lua): what the GPU programs link, so
# that a GPU machine without the lab's packages can build them.
CORE_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(KERNEL_SRCS) $(ENGINE_SRCS)) \
             $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CUDA_SRCS))
CORE_LIB  := $(BUILD)/libservelab_core.a

TEST_SRCS    := $(wildcard tests/*/test_*.c tests/*/*/test_*.c)
TEST_SUPPORT := $(patsubst %.c,$(BUILD)/obj/%.o,tests/test_support.c)
TEST_BINS    := $(patsubst %.c,$(BUILD)/%,$(TEST_SRCS))

ifeq ($(BUILD),build/release)
SERVELAB := bin/servelab
else
SERVELAB := $(BUILD)/bin/servelab
endif

# Keep intermediate objects (test_support.o) instead of rebuilding them.
.SECONDARY:

.PHONY: mutants all run test check deps test-deps models install clean check-pkgs check-test-pkgs tests-build test-run bench lessons gpu-programs \
        fuzz fuzz-build fuzz-run fuzz-deps
all: check-pkgs $(SERVELAB)

check-pkgs:
	@missing=""; for p in $(PKGS); do pkg-config --exists $$p 2>/dev/null || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "servelab: missing libraries:$$missing — run 'make deps' (or: apt-get install $(DEB_PKGS))" >&2; exit 1; fi

check-test-pkgs: check-pkgs
	@missing=""; for p in $(TEST_PKGS); do pkg-config --exists $$p 2>/dev/null || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "servelab: missing test libraries:$$missing — run 'make test-deps' (or: apt-get install $(filter-out %:%,$(TEST_DEB_PKGS)))" >&2; exit 1; fi

# V=1 prints each command in full; by default one short line per file.
ifeq ($(V),1)
Q :=
say = @:
else
Q := @
say = @printf '  %-6s %s\n' $(1) $(2)
endif

# Order-only on check-pkgs: a parallel build names the missing libraries
# before any compiler says a header is missing.
$(BUILD)/obj/%.o: %.c | check-pkgs
	@mkdir -p $(dir $@)
	$(call say,CC,$@)
	$(Q)$(CC) $(ALL_CFLAGS) $(PKG_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.c | check-test-pkgs
	@mkdir -p $(dir $@)
	$(call say,CC,$@)
	$(Q)$(CC) $(ALL_CFLAGS) $(PKG_CFLAGS) $(CMOCKA_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)
	$(Q)$(NVCC) $(NVCC_FLAGS) -I. -c $< -o $@

# The slowest objects are listed first so that a parallel build starts them
# first and they do not finish alone at the end (at -j2 the always-inline
# AVX-512 int8 kernels take 36 s of CPU, the CUDA files 20-25 s each with 4
# gencodes); the archives keep the order of LIB_OBJS / CORE_OBJS.
SLOW_OBJS := $(foreach p,%/matmul_int_avx512.o %/cuda_matmul.cu.o %/cuda_attention.cu.o %/attention_avx2.o \
               %/matmul_a8_avx512.o %.cu.o,$(filter $(p),$(LIB_OBJS)))

$(LIB): $(SLOW_OBJS) $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(call say,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $(LIB_OBJS)

$(CORE_LIB): $(SLOW_OBJS) $(CORE_OBJS)
	@mkdir -p $(dir $@)
	$(call say,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $(CORE_OBJS)

$(BUILD)/tests/cuda/%: tests/cuda/%.c $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) -MMD -MP -o $@ $< $(CORE_LIB) $(LDLIBS)

gpu-programs: $(GPU_PROGRAMS)

$(SERVELAB): $(MAIN_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $(ALL_CFLAGS) -o $@ $^ $(PKG_LIBS) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(TEST_SUPPORT) $(LIB) | check-test-pkgs
	@mkdir -p $(dir $@)
	$(call say,TEST,$@)
	$(Q)$(CC) $(ALL_CFLAGS) $(PKG_CFLAGS) $(CMOCKA_CFLAGS) $(LDFLAGS) -MMD -MP -o $@ $< $(TEST_SUPPORT) $(LIB) $(CMOCKA_LIBS) $(PKG_LIBS) $(LDLIBS)

tests-build: check-test-pkgs $(SERVELAB) $(TEST_BINS) $(GPU_PROGRAMS)

# Runs every test binary from the repository root, TEST_JOBS at a time
# (default: every core), each line streamed with its program's name; then
# the failures by name, the ten slowest programs and one total line (the
# last). Logs: $(BUILD)/test-logs/. Exits non-zero when any test failed.
# First every lesson once, clean (scripts/clean-lessons.sh into
# $(BUILD)/clean-lessons): test_lesson_cli and test_fault_matrix read those
# runs (SERVELAB_CLEAN_LESSONS) instead of making their own.
# SERVELAB_AUDIT=1: every engine built without a deliberate fault checks
# each step against independent counts (engine/audit.h).
# SERVELAB_CACHE_DIR: the machine profile (lab.machine(), servelab machine)
# is cached inside the build, so a test never reads or writes the user's
# ~/.cache/servelab; the first lesson that asks measures it (about 0.7 s).
CLEAN_LESSONS := $(BUILD)/clean-lessons
TEST_CACHE_DIR := $(abspath $(BUILD))/cache
test-run: tests-build
	@$(if $(GPU_TEST_BINS),,echo "GPU tests NOT RUN: built without CUDA (CUDA=$(CUDA))")
	@SERVELAB_CACHE_DIR=$(TEST_CACHE_DIR) SERVELAB_AUDIT=1 sh scripts/clean-lessons.sh $(SERVELAB) $(CLEAN_LESSONS) $(if $(filter 1,$(SANITIZE)),900,60)
	@SERVELAB_CACHE_DIR=$(TEST_CACHE_DIR) SERVELAB_AUDIT=1 TEST_LOG_DIR=$(BUILD)/test-logs SERVELAB_BIN=$(SERVELAB) SERVELAB_CLEAN_LESSONS=$(CLEAN_LESSONS) \
	    sh scripts/run-tests.sh $(TEST_BINS) $(GPU_TEST_BINS)

test: deps test-deps
	@$(MAKE) --no-print-directory test-run

# Sanitizers instrument the host C code; CUDA stays off there because the
# CUDA runtime and ASan's shadow memory do not mix without extra options.
# LeakSanitizer is ASan's default on Linux; detect_leaks=1 says so rather
# than relying on it (a leak fails the test binary that made it).
#
# The machine profile the lessons judge against (lab.machine()) describes
# the machine, so the uninstrumented build measures it: measured by the
# sanitized kernels it read 10 GB/s and 18 GFLOP/s (ridge 1.7 FLOP/B against
# 3.7), which put a prefill's 27.4 FLOP/B and a speculative pass's 2.3 on
# the wrong side of the ridge and turned lesson 08's why1 and lesson 11's
# spec-crossover on a clean engine.
check: deps test-deps
	@$(MAKE) --no-print-directory all
	@mkdir -p build/check && SERVELAB_CACHE_DIR=$(abspath build/check)/cache $(SERVELAB) machine --remeasure >/dev/null
	@ASAN_OPTIONS=detect_leaks=1:$(ASAN_OPTIONS) $(MAKE) --no-print-directory BUILD=build/check SANITIZE=1 CUDA=0 test-run

# Every lesson headless with lab.full set: the full-size measurements (the
# memory-bound medium preset) that `make test` leaves out to stay fast.
lessons: all
	@status=0; for f in lessons/*.lua; do \
	    $(SERVELAB) lesson run $$f --headless --full --time-limit 900 --memory-limit 1GiB || status=1; \
	done; exit $$status

# The project's own mutants (scripts/mutants.sh, docs/mutants.md): on demand,
# never part of make test; it builds into build/mutants and leaves the tree as it was.
MUTANTS ?=
MUTANTS_ARGS ?=
mutants: all
	@sh scripts/mutants.sh $(MUTANTS_ARGS) $(MUTANTS)

# The dashboard on the default model (stories260K when ../shared or
# ./models has it, else small).
run: deps
	@$(MAKE) --no-print-directory all
	$(SERVELAB)

# The performance harness (README: Bench); the build is the portable one.
BENCH_ARGS ?=
bench: all
	$(SERVELAB) bench $(BENCH_ARGS)

deps:
	@sh scripts/deps.sh $(DEB_PKGS)

# What only the tests need: cmocka, tmux, curl, git, node and npm, and the
# official OpenAI client pinned by tests/serve/package-lock.json (npm ci;
# without the network test_serve_clients then says NOT RUN and why).
test-deps:
	@sh scripts/deps.sh $(TEST_DEB_PKGS)
	@sh scripts/deps.sh --npm tests/serve

# ---- fuzzing: libFuzzer harnesses (tests/fuzz/fuzz_*.c) -------------------
# Each harness links the project compiled again with clang into build/fuzz
# (never the gcc objects), with coverage for libFuzzer and ASan + UBSan
# (every UBSan report aborts). A run keeps what it finds under build/fuzz:
# the growing corpus in build/fuzz/corpus/NAME (the committed seeds in
# tests/fuzz/corpus/NAME are only read), crash reproducers in
# build/fuzz/artifacts/NAME-*, the log in build/fuzz/NAME.log.
# FUZZ_FLAGS adds libFuzzer options (e.g. FUZZ_FLAGS=-jobs=2).
FUZZ_CC       ?= clang
FUZZ_SECONDS  ?= 20
FUZZ_TIMEOUT  ?= 30
FUZZ_FLAGS    ?=
FUZZ_BUILD    := build/fuzz
FUZZ_DEB_PKGS := clang libclang-rt-14-dev
FUZZ_NAMES    := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BINS     := $(patsubst %,$(FUZZ_BUILD)/bin/%,$(FUZZ_NAMES))
# CPU kernels only (the CUDA stubs), as with CUDA=0.
FUZZ_SRCS     := $(wildcard base/*.c) $(wildcard kernels/cpu/*.c) kernels/cuda/cuda_absent.c $(ENGINE_SRCS) $(LAB_SRCS)
FUZZ_OBJS     := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(FUZZ_SRCS))
FUZZ_LIB      := $(FUZZ_BUILD)/libservelab.a
FUZZ_SUPPORT  := $(FUZZ_BUILD)/obj/tests/fuzz/support.o
# The project's sources get the same warnings, but never -Werror here: clang
# warns about things gcc does not, and the gcc builds (make test, make check)
# are where CI=1 holds the sources to no warnings. The harnesses themselves
# (tests/fuzz) do get -Werror under CI.
FUZZ_SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS   := -std=c11 -D_GNU_SOURCE -O1 -g -fno-omit-frame-pointer -I. -pthread
FUZZ_OBJ_SANITIZE = $(FUZZ_SANITIZE)

# clang takes over ten minutes on the always-inline AVX-512 int8 kernels
# with ASan + UBSan (three with ASan alone, 15 s without): that one file
# gets coverage only. Its scalar twin (matmul_int.c) is fully instrumented.
$(FUZZ_BUILD)/obj/kernels/cpu/matmul_int_avx512.o: FUZZ_OBJ_SANITIZE :=

$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_OBJ_SANITIZE) $(filter-out -Werror,$(WARNINGS)) -fsanitize=fuzzer-no-link \
	    $(PKG_CFLAGS) -MMD -MP -c $< -o $@

$(FUZZ_BUILD)/obj/tests/fuzz/%.o: tests/fuzz/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_SANITIZE) $(WARNINGS) -fsanitize=fuzzer-no-link $(PKG_CFLAGS) -MMD -MP -c $< -o $@

$(FUZZ_LIB): $(FUZZ_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(FUZZ_BUILD)/bin/%: tests/fuzz/%.c $(FUZZ_SUPPORT) $(FUZZ_LIB)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_SANITIZE) $(WARNINGS) -fsanitize=fuzzer $(PKG_CFLAGS) -MMD -MP -o $@ $< \
	    $(FUZZ_SUPPORT) $(FUZZ_LIB) $(PKG_LIBS) -lm -pthread

fuzz-deps:
	@sh scripts/deps.sh $(DEB_PKGS) $(FUZZ_DEB_PKGS)

fuzz-build: check-pkgs $(FUZZ_BINS)

# Every harness for FUZZ_SECONDS, as many at a time as there are cores
# (scripts/fuzz-run.sh says how and why).
fuzz-run: fuzz-build
	@sh scripts/fuzz-run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TIMEOUT) "$(FUZZ_FLAGS)" $(FUZZ_NAMES)

fuzz: fuzz-deps
	@$(MAKE) --no-print-directory fuzz-run

models:
	@sh scripts/fetch-models.sh models

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/servelab
	install -m 755 $(SERVELAB) $(DESTDIR)$(PREFIX)/bin/servelab
	@if [ -d lessons ]; then cp -R lessons $(DESTDIR)$(PREFIX)/share/servelab/; fi
	@if [ -d quiz ]; then cp -R quiz $(DESTDIR)$(PREFIX)/share/servelab/; fi

clean:
	rm -rf build bin

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
-include $(shell find $(FUZZ_BUILD) -name '*.d' 2>/dev/null)
