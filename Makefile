# servelab — build, test and run.
#
#   make            build bin/servelab (portable: no -march=native)
#   make run        build and open the lab on its default model
#   make test       install missing packages, build, run every test
#   make check      the same tests under AddressSanitizer + UBSan (build/check)
#   make bench      servelab bench on stories110m (BENCH_ARGS="--json --threads 2")
#   make lessons    every Lua lesson headless with its full-size scenarios (minutes)
#   make deps       install missing Debian packages (root) or print the command
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

PKGS      := ncursesw lua5.4 cmocka
DEB_PKGS  := build-essential pkg-config libncurses-dev liblua5.4-dev libcmocka-dev tmux

WARNINGS := -Wall -Wextra -Wshadow -Wpointer-arith -Wstrict-prototypes -Wmissing-prototypes -Wvla
ifdef CI
WARNINGS += -Werror
endif

# pkg-config is queried lazily so that `make deps` works before the packages exist.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs ncursesw lua5.4 2>/dev/null)
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
NVCC_FLAGS := -O2 -std=c++17 -Xcompiler -Wall \
  -gencode arch=compute_80,code=sm_80 -gencode arch=compute_89,code=sm_89 \
  -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90

# ---- sources, by layer (DESIGN.md: kernels <- engine <- lab) --------------
KERNEL_SRCS := $(wildcard kernels/cpu/*.c)
ENGINE_SRCS := $(wildcard engine/*.c)
LAB_SRCS    := $(filter-out lab/main.c,$(wildcard lab/*.c))
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

TEST_SRCS    := $(wildcard tests/*/test_*.c)
TEST_SUPPORT := $(patsubst %.c,$(BUILD)/obj/%.o,tests/test_support.c)
TEST_BINS    := $(patsubst %.c,$(BUILD)/%,$(TEST_SRCS))

ifeq ($(BUILD),build/release)
SERVELAB := bin/servelab
else
SERVELAB := $(BUILD)/bin/servelab
endif

# Keep intermediate objects (test_support.o) instead of rebuilding them.
.SECONDARY:

.PHONY: all run test check deps models install clean check-pkgs tests-build test-run bench lessons gpu-programs
all: check-pkgs $(SERVELAB)

check-pkgs:
	@missing=""; for p in $(PKGS); do pkg-config --exists $$p 2>/dev/null || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "servelab: missing libraries:$$missing — run 'make deps' (or: apt-get install $(DEB_PKGS))" >&2; exit 1; fi

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(PKG_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -I. -c $< -o $@

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(CORE_LIB): $(CORE_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/tests/cuda/%: tests/cuda/%.c $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -MMD -MP -o $@ $< $(CORE_LIB) $(LDLIBS)

gpu-programs: $(GPU_PROGRAMS)

$(SERVELAB): $(MAIN_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(ALL_CFLAGS) -o $@ $^ $(PKG_LIBS) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(TEST_SUPPORT) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(PKG_CFLAGS) $(LDFLAGS) -MMD -MP -o $@ $< $(TEST_SUPPORT) $(LIB) $(CMOCKA_LIBS) $(PKG_LIBS) $(LDLIBS)

tests-build: check-pkgs $(SERVELAB) $(TEST_BINS) $(GPU_PROGRAMS)

# Runs every test binary from the repository root; prints each cmocka summary
# and one total line. Exits non-zero when any test failed or crashed.
test-run: tests-build
	@SERVELAB_BIN=$(SERVELAB) sh scripts/run-tests.sh $(TEST_BINS) $(GPU_TEST_BINS)
	@$(if $(GPU_TEST_BINS),,echo "GPU tests NOT RUN: built without CUDA (CUDA=$(CUDA))")

test: deps
	@$(MAKE) --no-print-directory test-run

# Sanitizers instrument the host C code; CUDA stays off there because the
# CUDA runtime and ASan's shadow memory do not mix without extra options.
check: deps
	@$(MAKE) --no-print-directory BUILD=build/check SANITIZE=1 CUDA=0 test-run

# Every lesson headless with lab.full set: the full-size measurements (the
# memory-bound medium preset) that `make test` leaves out to stay fast.
lessons: all
	@status=0; for f in lessons/*.lua; do \
	    $(SERVELAB) lesson run $$f --headless --full --time-limit 900 --memory-limit 1GiB || status=1; \
	done; exit $$status

# The dashboard on the default model (stories260K when ../shared or
# ./models has it, else small).
run: all
	$(SERVELAB)

# The performance harness (README: Bench); the build is the portable one.
BENCH_ARGS ?=
bench: all
	$(SERVELAB) bench $(BENCH_ARGS)

deps:
	@sh scripts/deps.sh $(DEB_PKGS)

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
