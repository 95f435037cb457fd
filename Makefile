# Tandem build. `make` builds everything into build/ (libraries in build/lib,
# programs in build/bin, tests in build/tests); `make test` installs missing
# Debian packages (as root), builds the normal and the ASan+UBSan trees and runs
# the whole suite; `make demo` trains the GPT on 2 ranks.
#
# Optional parts are detected with pkg-config and reported once:
#   OpenBLAS (libopenblas-dev): fast matrix products in src/nn (portable loops otherwise)
#   cJSON    (libcjson-dev):    the training config file (src/train)
#   zlib     (zlib1g-dev):      gzip'd Fashion-MNIST IDX files (src/nn data loader)
#   CUDA     (a toolkit with nvcc; scripts/install-cuda): the GPU engine,
#            every file in a folder named cuda/ (src/device/cuda, src/nn/cuda,
#            src/train/cuda); HAVE_CUDA=0 leaves it out even when found
# Required: libsodium (libsodium-dev) for the core's connection authentication
# (src/net/auth.c: HMAC-SHA-256 challenge-response on every store and TCP
# connection). It is not optional: without it a job could not keep strangers
# out, so the build stops with the package to install. Otherwise the core
# (src/base, src/net, src/comm) needs only libc and pthreads.

# `make` alone builds the library, programs and tests (the emulator's rules
# below come first in the file, so the default goal is named).
.DEFAULT_GOAL := all
BUILD   ?= build
SAN     ?= 0
CC      ?= cc
ifeq ($(CC),cc)
CC := gcc
endif
OPT     ?= -O3
# The instruction set everything is compiled for: baseline x86-64 (SSE2),
# what Debian's amd64 packages assume, so that the library and programs run
# on any x86-64 machine. It comes after OPT, so that an OPT carrying
# -march=native (an old habit) cannot make the library unportable. The hot
# kernels are compiled once more per CPU level below (KERNEL_SRCS) and the
# level is chosen at run time (src/base/cpu.c; TANDEM_CPU).
ARCH    ?= -march=x86-64 -mtune=generic
CFLAGS_BASE := -std=gnu11 -g $(OPT) $(ARCH) -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes \
               -fno-strict-aliasing -pthread -Iinclude -Isrc -MMD -MP -fPIC
ifeq ($(SAN),1)
CFLAGS_BASE += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDSAN := -fsanitize=address,undefined
endif

PKG := pkg-config
HAVE_OPENBLAS := $(shell $(PKG) --exists openblas 2>/dev/null && echo 1 || echo 0)
HAVE_CJSON    := $(shell $(PKG) --exists libcjson 2>/dev/null && echo 1 || echo 0)
HAVE_ZLIB     := $(shell $(PKG) --exists zlib 2>/dev/null && echo 1 || echo 0)
HAVE_URING    := $(shell $(PKG) --exists liburing 2>/dev/null && echo 1 || echo 0)

HAVE_SODIUM   := $(shell $(PKG) --exists libsodium 2>/dev/null && echo 1 || echo 0)
# `make test` and `make demo` install it first (deps), then build in a sub-make.
ifneq ($(HAVE_SODIUM),1)
ifeq ($(filter deps clean test demo,$(MAKECMDGOALS)),)
$(error libsodium not found (required: it authenticates every connection of a job). apt-get install libsodium-dev, or run scripts/install-deps as root)
endif
endif

OPT_CFLAGS := $(shell $(PKG) --cflags libsodium 2>/dev/null)
OPT_LIBS   := $(shell $(PKG) --libs libsodium 2>/dev/null)
ifeq ($(HAVE_OPENBLAS),1)
OPT_CFLAGS += -DTD_HAVE_OPENBLAS=1 $(shell $(PKG) --cflags openblas)
OPT_LIBS   += $(shell $(PKG) --libs openblas)
endif
ifeq ($(HAVE_CJSON),1)
OPT_CFLAGS += -DTD_HAVE_CJSON=1 $(shell $(PKG) --cflags libcjson)
OPT_LIBS   += $(shell $(PKG) --libs libcjson)
endif
ifeq ($(HAVE_ZLIB),1)
OPT_CFLAGS += -DTD_HAVE_ZLIB=1 $(shell $(PKG) --cflags zlib)
OPT_LIBS   += $(shell $(PKG) --libs zlib)
endif
# liburing (liburing-dev): io_uring for NVMe offload (src/train/offload/aio.c); without it a pread/pwrite thread pool
ifeq ($(HAVE_URING),1)
OPT_CFLAGS += -DTD_HAVE_URING=1 $(shell $(PKG) --cflags liburing)
OPT_LIBS   += $(shell $(PKG) --libs liburing)
endif

# ---- CUDA (issue 18) ----
# The toolkit: CUDA_HOME if set, else the nvcc on PATH, else /usr/local/cuda
# (NVIDIA's installs; the GPU machines), else scripts/install-cuda's prefix
# (Debian's CUDA 11.8, for CI). Programs and the library are linked to its
# cudart and cuBLASLt with an rpath, so they run without LD_LIBRARY_PATH; on
# a machine without a GPU (or without the driver's libcuda) they run too, and
# td_device_open("cuda") says why there is no device. The emulator tree
# (CUDA_EMU=1, `make cuda-emu`) uses no toolkit at all.
CUDA_PREFIX_DEBIAN := /opt/tandem-cuda-11.8
CUDA_EMU ?= 0
ifeq ($(CUDA_EMU),1)
HAVE_CUDA := 0
endif
ifeq ($(origin CUDA_HOME),undefined)
CUDA_HOME := $(firstword $(patsubst %/bin/nvcc,%,$(realpath $(shell command -v nvcc 2>/dev/null))) \
               $(patsubst %/bin/nvcc,%,$(wildcard /usr/local/cuda/bin/nvcc $(CUDA_PREFIX_DEBIAN)/bin/nvcc)))
endif
NVCC := $(if $(CUDA_HOME),$(wildcard $(CUDA_HOME)/bin/nvcc))
HAVE_CUDA ?= $(if $(NVCC),1,0)
ifeq ($(HAVE_CUDA),1)
ifeq ($(NVCC),)
$(error HAVE_CUDA=1 but no nvcc in CUDA_HOME=$(CUDA_HOME): set CUDA_HOME to a CUDA toolkit, or run scripts/install-cuda)
endif
CUDA_VERSION := $(shell $(NVCC) --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
CUDA_MAJOR   := $(firstword $(subst ., ,$(CUDA_VERSION)))
# lib64 in NVIDIA's layout (a link to targets/x86_64-linux/lib), lib in the
# pip wheels' layout
CUDA_LIBDIR  := $(firstword $(wildcard $(CUDA_HOME)/lib64/libcudart.so $(CUDA_HOME)/lib/libcudart.so \
                  $(CUDA_HOME)/targets/x86_64-linux/lib/libcudart.so))
CUDA_LIBDIR  := $(patsubst %/,%,$(dir $(CUDA_LIBDIR)))
# nvcc 11 refuses gcc 12 and newer (Debian 12's): give it g++-11 or clang-14
# (whose -Wall flags every unused static function of CUDA 11.8's bf16 header).
ifeq ($(shell [ "$(CUDA_MAJOR)" -lt 12 ] 2>/dev/null && echo old),old)
NVCC_CCBIN ?= $(firstword $(shell for c in g++-11 clang-14; do command -v $$c; done 2>/dev/null))
NVCC_HOST_WARN := ,-Wno-unused-function
endif
# sm_90: the H100/H200 (HOPPER.md), and its PTX so that newer GPUs JIT it.
CUDA_ARCH  ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS  := -std=c++17 -g -lineinfo -O3 $(CUDA_ARCH) $(if $(NVCC_CCBIN),-ccbin $(NVCC_CCBIN)) \
              -Xcompiler -fPIC,-Wall$(NVCC_HOST_WARN),-fno-strict-aliasing -Iinclude -Isrc -DTD_HAVE_CUDA=1 -MMD -MP \
              $(NVCC_EXTRA)
CUDA_CFLAGS := -DTD_HAVE_CUDA=1 -isystem $(CUDA_HOME)/include
# cuBLASLt is not linked: src/nn/cuda/matmul.cu loads it at the first product
# (dlopen through this run path), so that CPU-only runs do not map its 540 MB.
CUDA_LIBS   := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcudart -ldl -lstdc++
endif

CFLAGS  := $(CFLAGS_BASE) $(OPT_CFLAGS) $(CUDA_CFLAGS) $(EXTRA_CFLAGS)
LDLIBS  := $(OPT_LIBS) $(CUDA_LIBS) -lm -lpthread $(LDSAN)

# Kernel files: compiled once per CPU level, with that level's flags and
# -DTD_LEVEL=<level> (their functions get a _<level> suffix: nn_kernels.h),
# and chosen at run time (kernels.c). Nothing else is compiled with more
# than ARCH: tests/base/check_levels.sh checks the objects for that.
KERNEL_SRCS := src/nn/matmul.c src/nn/matmul_bf16.c src/nn/layers.c src/nn/layers_bf16.c src/nn/attention_bf16.c src/nn/kernels_level.c src/base/reduce.c src/base/reduce_level.c
LEVELS      := generic avx2 avx512 avx512bf16
# (-Wno-psabi: the kernels' 16-lane vectors are wider than a register below
# AVX-512; gcc warns about their argument ABI when it clones a static helper,
# but static functions never cross an ABI boundary.)
LEVEL_FLAGS_generic := -Wno-psabi
LEVEL_FLAGS_avx2    := -mavx2 -mfma -mf16c -Wno-psabi
LEVEL_FLAGS_avx512  := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512dq -mavx512vl
# avx512 plus vdpbf16ps / vcvtne2ps2bf16 (src/nn/matmul_bf16.c)
LEVEL_FLAGS_avx512bf16 := $(LEVEL_FLAGS_avx512) -mavx512bf16
# Every file that needs CUDA lives in a folder named cuda/ (src/device/cuda,
# src/nn/cuda, src/train/cuda; tests/cuda): compiled only when CUDA is on,
# that is in a CUDA build or in the emulator tree (CUDA_EMU, below).
CUDA_C_SRCS    := $(sort $(shell find src -path '*/cuda/*' -name '*.c'))
CUDA_CU_SRCS   := $(sort $(shell find src -path '*/cuda/*' -name '*.cu'))
CUDA_TEST_SRCS := $(sort $(wildcard tests/cuda/test_*.c))
LIB_SRCS   := $(filter-out $(KERNEL_SRCS) $(CUDA_C_SRCS),$(sort $(shell find src -name '*.c')))
TOOL_SRCS  := $(sort $(wildcard tools/*.c examples/*.c))
TEST_SRCS  := $(filter-out $(CUDA_TEST_SRCS),$(sort $(shell find tests -name 'test_*.c')))
TESTLIB_SRCS := $(sort $(wildcard tests/common/*.c))

LIB_OBJS   := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o) \
              $(foreach l,$(LEVELS),$(KERNEL_SRCS:%.c=$(BUILD)/obj/%.$(l).o))

# Defined before the emulator block below: make expands prerequisites as it
# reads them, and an emulator test that named $(LIBA) before this line got an
# empty prerequisite, linked while the archive was still being written
# (undefined cuda* symbols, seen once in a clean `make test`).
LIBA       := $(BUILD)/lib/libtandem.a
LIBSO      := $(BUILD)/lib/libtandem.so

# ---- the CUDA emulator tree (issue 18; tests/cudaemu/) ----
# `make cuda-emu` builds build/cudaemu: the whole library with CUDA on, where
# the CUDA runtime is tests/cudaemu's CPU emulator: .cu files are compiled by
# g++ as C++ with tests/cudaemu/include/cuda_emu.h forced in, C files in cuda/
# folders see its cuda_runtime.h. The tree is built with ASan+UBSan, so that
# a kernel's out-of-bounds access is reported like any other. Its tests
# (tests/cudaemu/test_*.cu, tests/cuda/test_*.c) run in tests/cudaemu.suite.
ifeq ($(CUDA_EMU),1)
CXX ?= g++
EMU_INC      := -Itests/cudaemu/include
CFLAGS       += -DTD_HAVE_CUDA=1 -DTD_CUDA_EMU=1 $(EMU_INC)
# -ftls-model=initial-exec: threadIdx and the other per-thread emulator
# state are read in every kernel statement; the -fPIC default
# (general-dynamic) made each read a __tls_get_addr call, which ASan
# intercepts. The emulator tree links programs only, so the static TLS
# model is safe.
EMU_CXXFLAGS := -x c++ -std=c++17 -g $(OPT) $(ARCH) -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas -fno-exceptions -fno-rtti \
                -fno-strict-aliasing -pthread -fPIC -ftls-model=initial-exec -Iinclude -Isrc $(EMU_INC) -DTD_HAVE_CUDA=1 -DTD_CUDA_EMU=1 -MMD -MP \
                $(if $(filter 1,$(SAN)),-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
EMU_TEST_CU  := $(sort $(wildcard tests/cudaemu/test_*.cu))
LIB_SRCS     += $(CUDA_C_SRCS)
EMU_RT_SRCS  := $(sort $(wildcard tests/cudaemu/*.cc))
LIB_OBJS     += $(CUDA_C_SRCS:%.c=$(BUILD)/obj/%.o) $(CUDA_CU_SRCS:%.cu=$(BUILD)/obj/%.o) $(EMU_RT_SRCS:%.cc=$(BUILD)/obj/%.o)
TEST_SRCS    += $(CUDA_TEST_SRCS)
LDLIBS       += -lstdc++
CUDA_TESTS   := $(patsubst %.c,$(BUILD)/tests/%,$(notdir $(CUDA_TEST_SRCS))) \
                $(patsubst %.cu,$(BUILD)/tests/%,$(notdir $(EMU_TEST_CU)))

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -include cuda_emu.h -c $< -o $@
$(BUILD)/obj/tests/cudaemu/%.o: tests/cudaemu/%.cc
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
$(patsubst %.cu,$(BUILD)/tests/%,$(notdir $(EMU_TEST_CU))): $(BUILD)/tests/%: $(BUILD)/obj/tests/cudaemu/%.o $(LIBA)
	@mkdir -p $(dir $@)
	$(CXX) -pthread -o $@ $< $(LIBA) $(LDLIBS)
.SECONDARY: $(EMU_TEST_CU:%.cu=$(BUILD)/obj/%.o)
-include $(CUDA_CU_SRCS:%.cu=$(BUILD)/obj/%.d) $(EMU_TEST_CU:%.cu=$(BUILD)/obj/%.d) $(EMU_RT_SRCS:%.cc=$(BUILD)/obj/%.d)
endif

cuda-emu:
	@$(MAKE) --no-print-directory CUDA_EMU=1 BUILD=build/cudaemu SAN=1 OPT="-O1" cuda-emu-tree
cuda-emu-tree: report-config $(LIBA) $(CUDA_TESTS) $(BUILD)/tests/test_device $(BUILD)/tests/test_gpt_device $(BUILD)/tests/test_pipeline_train $(BUILD)/tests/test_tp $(BUILD)/bin/train-gpt $(BUILD)/bin/tandemrun \
               $(BUILD)/tests/test_device_coll $(BUILD)/tests/test_device_select $(BUILD)/tests/fake_nccl/libnccl.so.2
# A test double of libnccl.so.2 (tests/comm/fake_nccl.c), so that the NCCL
# path of the device collectives runs in the emulator tree; plain C, no
# sanitizer (it is dlopen'd by the sanitized programs).
$(BUILD)/tests/fake_nccl/libnccl.so.2: tests/comm/fake_nccl.c
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -g -O1 -Wall -Wextra -Wno-unused-parameter -shared -fPIC -o $@ $< -lrt
TESTLIB_OBJS := $(TESTLIB_SRCS:%.c=$(BUILD)/obj/%.o)
TOOLS      := $(patsubst %.c,$(BUILD)/bin/%,$(notdir $(TOOL_SRCS)))
TESTS      := $(patsubst %.c,$(BUILD)/tests/%,$(notdir $(TEST_SRCS)))
ifeq ($(HAVE_CUDA),1)
# A CUDA build: the cuda/ folders' sources join the library, tests/cuda's
# tests the tests.
# (nvcc's objects first in a tree that compiles them, last in one that copies
# them from another tree: see NVCC_SHARE_FROM below)
LIB_SRCS   += $(CUDA_C_SRCS)
ifeq ($(NVCC_SHARE_FROM),)
LIB_OBJS   := $(CUDA_CU_SRCS:%.cu=$(BUILD)/obj/%.o) $(LIB_OBJS) $(CUDA_C_SRCS:%.c=$(BUILD)/obj/%.o)
else
LIB_OBJS   += $(CUDA_C_SRCS:%.c=$(BUILD)/obj/%.o) $(CUDA_CU_SRCS:%.cu=$(BUILD)/obj/%.o)
endif
TEST_SRCS  += $(CUDA_TEST_SRCS)
TESTS      += $(patsubst %.c,$(BUILD)/tests/%,$(notdir $(CUDA_TEST_SRCS)))
endif

.PHONY: all native test demo clean deps bench report-config fuzz fuzz-build cuda-emu cuda-emu-tree
all: native
# everything but the Python part (python/Makefile.inc adds it to all)
native: report-config $(LIBA) $(LIBSO) $(TOOLS) $(TESTS)

report-config:
	@echo "tandem config: openblas=$(HAVE_OPENBLAS) cjson=$(HAVE_CJSON) zlib=$(HAVE_ZLIB) uring=$(HAVE_URING) san=$(SAN) build=$(BUILD)"
	@if [ "$(HAVE_URING)" = 0 ]; then echo "tandem config: liburing not found: NVMe offload uses its pread/pwrite threads. apt-get install liburing-dev"; fi
	@if [ "$(HAVE_OPENBLAS)" = 0 ]; then echo "tandem config: OpenBLAS not found: src/nn uses its portable matmul (slower). apt-get install libopenblas-dev"; fi
	@if [ "$(HAVE_CJSON)" = 0 ]; then echo "tandem config: cJSON not found: --config files are refused. apt-get install libcjson-dev"; fi
ifeq ($(HAVE_CUDA),1)
	@echo "tandem config: cuda=1 (nvcc $(CUDA_VERSION) at $(NVCC)$(if $(NVCC_CCBIN), with host compiler $(NVCC_CCBIN)), sm_90)"
else ifeq ($(CUDA_EMU),1)
	@echo "tandem config: cuda=emulator (tests/cudaemu: CUDA sources compiled as C++ and run on the CPU)"
else ifneq ($(NVCC),)
	@echo "tandem config: cuda=0 (HAVE_CUDA=0 given; nvcc at $(NVCC) left unused)"
else
	@echo "tandem config: cuda=0 (CUDA toolkit not found: the GPU engine is not built; scripts/install-cuda as root, or CUDA_HOME=<toolkit>)"
endif

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

define LEVEL_RULE
$$(BUILD)/obj/%.$(1).o: %.c
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -DTD_LEVEL=$(1) $$(LEVEL_FLAGS_$(1)) -c $$< -o $$@
endef
$(foreach l,$(LEVELS),$(eval $(call LEVEL_RULE,$(l))))

ifeq ($(HAVE_CUDA),1)
# .cu files: device code and their extern "C" launchers, by nvcc. The ASan
# tree compiles them unsanitized (nvcc's host pass and device code cannot
# carry -fsanitize); the C files around them are sanitized as usual.
#
# So the ASan tree's nvcc objects are the plain tree's, byte for byte: the
# flags carry neither SAN nor OPT. `make test` builds both trees at once and
# gives the ASan tree NVCC_SHARE_FROM=build: it copies build/obj's object
# when that was compiled by the same nvcc command (the .cmd file beside it)
# from sources no newer than it, and compiles its own otherwise (nvcc took
# 71 s of CPU per tree, 55 s of it flash_attention.cu, timed with nvcc 13.0).
# One lock per object (flock) keeps a copy from reading an object while it
# is written; the plain tree compiles these objects first and the ASan tree
# reaches them last (LIB_OBJS' order above), so the copy seldom waits.
NVCC_CMD := $(NVCC) $(NVCCFLAGS)
ifeq ($(NVCC_SHARE_FROM),)
$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	flock $@.lock sh -c 'rm -f $(@:.o=.cmd) && $(NVCC_CMD) -c $< -o $@ && echo "$(NVCC_CMD)" >$(@:.o=.cmd)'
else
$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@) $(dir $(NVCC_SHARE_FROM)/obj/$*)
	@flock $(NVCC_SHARE_FROM)/obj/$*.o.lock sh -c 's=$(NVCC_SHARE_FROM)/obj/$*; \
	  if [ -f $$s.o ] && [ "$$(cat $$s.cmd 2>/dev/null)" = "$(NVCC_CMD)" ] && [ -z "$$(find $^ -newer $$s.o)" ]; then \
	    echo "cp $$s.o $@ (the same nvcc command, sources no newer)"; \
	    cp $$s.o $@ && sed "1s|^[^:]*:|$@:|" $$s.d >$(@:.o=.d); \
	  else echo "$(NVCC_CMD) -c $< -o $@"; $(NVCC_CMD) -c $< -o $@; fi'
endif
-include $(CUDA_CU_SRCS:%.cu=$(BUILD)/obj/%.d)
endif

$(LIBA): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIBSO): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(CC) -shared -o $@ $^ $(LDLIBS)

# Every program and test is one .c file linked against the static library.
vpath %.c tools examples $(sort $(dir $(TEST_SRCS)))
$(BUILD)/bin/%: $(BUILD)/obj/tools/%.o $(LIBA)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LIBA) $(LDLIBS)
$(BUILD)/bin/%: $(BUILD)/obj/examples/%.o $(LIBA)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LIBA) $(LDLIBS)
# Reached only through the pattern rules above, these objects are
# intermediate files that make deletes after linking; then every later make
# (make install after make) finds them missing and relinks build/bin.
.SECONDARY: $(patsubst %.c,$(BUILD)/obj/%.o,$(TOOL_SRCS))

define TEST_RULE
$(BUILD)/tests/$(basename $(notdir $(1))): $(BUILD)/obj/$(1:.c=.o) $(TESTLIB_OBJS) $(LIBA)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -o $$@ $$< $(TESTLIB_OBJS) $(LIBA) $$(LDLIBS)
endef
$(foreach t,$(TEST_SRCS),$(eval $(call TEST_RULE,$(t))))

deps:
	@scripts/install-deps

# `make test` and `make demo` build with one job per core unless the caller
# chose -j: the three trees of `make test` took ~6 minutes one file at a time.
NPROC := $(shell nproc 2>/dev/null || echo 2)
PAR    = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(NPROC))

# The whole suite: the four trees (normal, ASan+UBSan, fuzz harnesses, CUDA
# emulator) and every suite line, the lines starting while the trees build
# (in the clean-clone CI at 0602bba the suite waited 226 s for all four).
# build/ builds first with every core: all lines use it (its tools, and
# most lines are its own); its Python package's c10d extension (about a
# minute of torch headers, used by the lines of build/python only) is left
# to the next step. The other trees and that extension follow at once, under
# one job limit (one tree's serial stretches leave no core idle) and at nice
# 10 beside build/'s lines: they take the CPU those lines leave (waiting on
# timeouts, heartbeats, start-up), and the lines' time bounds see little
# of them. Each tree leaves its exit status in build/.ready/<tree> and
# build/.ready/done marks the end: tests/run.sh (TREES_READY) starts a line
# once its trees are there, the lone lines first (build/'s, then the ASan
# tree's once it is built), beside the builds. Each tree says how long it took.
TEST_TREES := test-tree-c10d test-tree-asan test-tree-emu test-tree-fuzz
.PHONY: test-tree-normal $(TEST_TREES)
test: deps
	@rm -rf build/.ready && mkdir -p build/.ready
	@{ $(MAKE) --no-print-directory $(PAR) test-tree-normal && \
	   nice -n 10 $(MAKE) --no-print-directory $(PAR) -k $(TEST_TREES); touch build/.ready/done; } & \
	  TREES_READY=build/.ready tests/run.sh; rc=$$?; wait; exit $$rc
# test-tree-NAME: builds the tree, says how long it took and leaves its exit
# status in build/.ready/NAME (written whole, then renamed: tests/run.sh
# reads it while the other trees build)
tree_done = rc=$$?; echo $$rc >build/.ready/.$(1) && mv build/.ready/.$(1) build/.ready/$(1); \
  [ $$rc = 0 ] && echo "make test: $(2) built in $$(( $$(date +%s) - t0 )) s"; exit $$rc
test-tree-normal:
	@t0=$$(date +%s); $(MAKE) --no-print-directory native python-base report-python; $(call tree_done,build,build/)
test-tree-c10d:
	@t0=$$(date +%s); $(MAKE) --no-print-directory python-c10d; $(call tree_done,c10d,build/python's c10d extension)
test-tree-asan:
	@t0=$$(date +%s); $(MAKE) --no-print-directory all BUILD=build/asan SAN=1 OPT="-O1" NVCC_SHARE_FROM=build; \
	  $(call tree_done,asan,build/asan)
test-tree-emu:
	@t0=$$(date +%s); $(MAKE) --no-print-directory cuda-emu; $(call tree_done,cudaemu,build/cudaemu)
test-tree-fuzz:
	@t0=$$(date +%s); $(MAKE) --no-print-directory fuzz-build; $(call tree_done,fuzz,build/fuzz)

demo: deps
	@$(MAKE) --no-print-directory $(PAR) all
	@scripts/demo

bench: all
	@bench/run.sh

clean:
	rm -rf build

# ---- fuzzing (issue 7, item 9) ----
# One libFuzzer harness per parser that reads bytes from a peer, a file or
# the user: tests/fuzz/fuzz_<target>.c becomes build/fuzz/fuzz_<target>.
# Everything here is built by clang with ASan + UBSan and coverage
# instrumentation, into its own tree (build/fuzz/obj), so that clang objects
# never mix with the gcc trees above. `make fuzz` builds the harnesses
# and runs each for FUZZ_SECONDS (tests/fuzz/run.sh: saved crashes first, then
# fuzzing from the seed corpus tests/fuzz/corpus/<target>/); the suite
# (tests/fuzz.suite) runs each for 10 s. Needs clang and libclang-rt-14-dev.
FUZZ_BUILD    := build/fuzz
FUZZ_CC       ?= clang
FUZZ_SECONDS  ?= 60
FUZZ_SRCS     := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_TARGETS  := $(patsubst tests/fuzz/fuzz_%.c,%,$(FUZZ_SRCS))
FUZZ_BINS     := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)
# (CPU only: the parsers under test never touch a device)
FUZZ_LIB_OBJS := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(filter-out $(CUDA_C_SRCS),$(LIB_SRCS))) \
                 $(foreach l,$(LEVELS),$(KERNEL_SRCS:%.c=$(FUZZ_BUILD)/obj/%.$(l).o))
FUZZ_LIBA     := $(FUZZ_BUILD)/libtandem-fuzz.a
FUZZ_CFLAGS   := -std=gnu11 -g -O1 $(ARCH) -Wall -Wextra -Wno-unused-parameter -fno-strict-aliasing \
                 -pthread -Iinclude -Isrc -MMD -MP -fno-omit-frame-pointer \
                 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fsanitize=fuzzer-no-link \
                 $(OPT_CFLAGS)

fuzz-build: $(FUZZ_BINS)
.SECONDARY: $(FUZZ_SRCS:%.c=$(FUZZ_BUILD)/obj/%.o)

$(FUZZ_BUILD)/obj/%.o: %.c
	@command -v $(FUZZ_CC) >/dev/null || { echo "fuzz: $(FUZZ_CC) not found: apt-get install clang libclang-rt-14-dev"; exit 1; }
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

# the per-CPU-level kernel objects, as in the library (KERNEL_SRCS)
define FUZZ_LEVEL_RULE
$$(FUZZ_BUILD)/obj/%.$(1).o: %.c
	@mkdir -p $$(dir $$@)
	$$(FUZZ_CC) $$(FUZZ_CFLAGS) -DTD_LEVEL=$(1) $$(LEVEL_FLAGS_$(1)) -c $$< -o $$@
endef
$(foreach l,$(LEVELS),$(eval $(call FUZZ_LEVEL_RULE,$(l))))

$(FUZZ_LIBA): $(FUZZ_LIB_OBJS)
	rm -f $@ && ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: $(FUZZ_BUILD)/obj/tests/fuzz/fuzz_%.o $(FUZZ_LIBA)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_LIBA) $(OPT_LIBS) -lm -lpthread

# Every target runs even when an earlier one failed; the exit status says
# whether any did.
fuzz: fuzz-build
	@rc=0; for t in $(FUZZ_TARGETS); do tests/fuzz/run.sh $$t $(FUZZ_SECONDS) || rc=1; done; exit $$rc

-include $(LIB_OBJS:.o=.d) $(TESTLIB_OBJS:.o=.d) $(TOOL_SRCS:%.c=$(BUILD)/obj/%.d) $(TEST_SRCS:%.c=$(BUILD)/obj/%.d)
-include $(FUZZ_LIB_OBJS:.o=.d) $(FUZZ_SRCS:%.c=$(FUZZ_BUILD)/obj/%.d)

# Python bindings: a separate section, see python/Makefile.inc.
include python/Makefile.inc
