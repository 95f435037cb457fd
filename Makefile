# Tandem build. `make` builds everything into build/ (libraries in build/lib,
# programs in build/bin, tests in build/tests); `make test` installs missing
# Debian packages (as root), builds the normal and the ASan+UBSan trees and runs
# the whole suite; `make demo` trains the GPT on 2 ranks.
#
# Optional parts are detected with pkg-config and reported once:
#   OpenBLAS (libopenblas-dev): fast matrix products in src/nn (portable loops otherwise)
#   cJSON    (libcjson-dev):    the training config file (src/train)
#   zlib     (zlib1g-dev):      gzip'd Fashion-MNIST IDX files (src/nn data loader)
# Required: libsodium (libsodium-dev) for the core's connection authentication
# (src/net/auth.c: HMAC-SHA-256 challenge-response on every store and TCP
# connection). It is not optional: without it a job could not keep strangers
# out, so the build stops with the package to install. Otherwise the core
# (src/base, src/net, src/comm) needs only libc and pthreads.

BUILD   ?= build
SAN     ?= 0
CC      ?= cc
ifeq ($(CC),cc)
CC := gcc
endif
OPT     ?= -O3 -march=native
CFLAGS_BASE := -std=gnu11 -g $(OPT) -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes \
               -fno-strict-aliasing -pthread -Iinclude -Isrc -MMD -MP -fPIC
ifeq ($(SAN),1)
CFLAGS_BASE += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDSAN := -fsanitize=address,undefined
endif

PKG := pkg-config
HAVE_OPENBLAS := $(shell $(PKG) --exists openblas 2>/dev/null && echo 1 || echo 0)
HAVE_CJSON    := $(shell $(PKG) --exists libcjson 2>/dev/null && echo 1 || echo 0)
HAVE_ZLIB     := $(shell $(PKG) --exists zlib 2>/dev/null && echo 1 || echo 0)

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

CFLAGS  := $(CFLAGS_BASE) $(OPT_CFLAGS) $(EXTRA_CFLAGS)
LDLIBS  := $(OPT_LIBS) -lm -lpthread $(LDSAN)

LIB_SRCS   := $(sort $(shell find src -name '*.c'))
TOOL_SRCS  := $(sort $(wildcard tools/*.c examples/*.c))
TEST_SRCS  := $(sort $(shell find tests -name 'test_*.c'))
TESTLIB_SRCS := $(sort $(wildcard tests/common/*.c))

LIB_OBJS   := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)
TESTLIB_OBJS := $(TESTLIB_SRCS:%.c=$(BUILD)/obj/%.o)
TOOLS      := $(patsubst %.c,$(BUILD)/bin/%,$(notdir $(TOOL_SRCS)))
TESTS      := $(patsubst %.c,$(BUILD)/tests/%,$(notdir $(TEST_SRCS)))
LIBA       := $(BUILD)/lib/libtandem.a
LIBSO      := $(BUILD)/lib/libtandem.so

.PHONY: all test demo clean deps bench report-config
all: report-config $(LIBA) $(LIBSO) $(TOOLS) $(TESTS)

report-config:
	@echo "tandem config: openblas=$(HAVE_OPENBLAS) cjson=$(HAVE_CJSON) zlib=$(HAVE_ZLIB) san=$(SAN) build=$(BUILD)"
	@if [ "$(HAVE_OPENBLAS)" = 0 ]; then echo "tandem config: OpenBLAS not found: src/nn uses its portable matmul (slower). apt-get install libopenblas-dev"; fi
	@if [ "$(HAVE_CJSON)" = 0 ]; then echo "tandem config: cJSON not found: --config files are refused. apt-get install libcjson-dev"; fi

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

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

define TEST_RULE
$(BUILD)/tests/$(basename $(notdir $(1))): $(BUILD)/obj/$(1:.c=.o) $(TESTLIB_OBJS) $(LIBA)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -o $$@ $$< $(TESTLIB_OBJS) $(LIBA) $$(LDLIBS)
endef
$(foreach t,$(TEST_SRCS),$(eval $(call TEST_RULE,$(t))))

deps:
	@scripts/install-deps

# The whole suite: normal build, then the same tests built with ASan+UBSan.
test: deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory all BUILD=build/asan SAN=1 OPT="-O1 -march=native"
	@tests/run.sh

demo: deps
	@$(MAKE) --no-print-directory all
	@scripts/demo

bench: all
	@bench/run.sh

clean:
	rm -rf build

-include $(LIB_OBJS:.o=.d) $(TESTLIB_OBJS:.o=.d) $(TOOL_SRCS:%.c=$(BUILD)/obj/%.d) $(TEST_SRCS:%.c=$(BUILD)/obj/%.d)
