/* fuzz-peft.c — libFuzzer harness for PEFT adapters (engine/model/lora.c): adapter_config.json and
 * adapter_model.safetensors loaded with zs_lora_load against a tiny llama base that
 * LLVMFuzzerInitialize writes with init-model (2 layers, dim 16, GQA 2/1, ffn 32) into a
 * per-process directory in /dev/shm. Input: a 4-byte little-endian length L, then L bytes of
 * adapter_config.json, then the safetensors file (both written into that directory). A loaded
 * adapter is checked against the base, every target of every layer is applied to a row of
 * inputs (the PEFT-layout path, then the frozen f32 and bf16 copies), and it is freed.
 * Seeds: tests/fuzz/corpus/peft (adapters zs_lora_save wrote for that base: all seven targets,
 * attention only, rsLoRA). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "init-cmd.h"
#include "init-model.h"
#include "lora.h"
#include "model.h"
#include "fuzz-util.h"

#define FZ_MAX_INPUT (1 << 20)

/* the base; fuzz-peft's seeds were made for exactly these flags */
static char *fz_base_args[] = {"--arch", "llama", "--layers", "2", "--dim", "16", "--heads", "2",
                               "--kv-heads", "1", "--ffn", "32", "--vocab", "300", "--context",
                               "16", "--seed", "3", "--random-norms"};

static char fz_dir[64], fz_base[128], fz_ad[128];
static zs_model *fz_model;
static volatile uint64_t sink;


static void fz_cleanup(void) {
    zs_model_free(fz_model);
    fz_model = NULL;
    fz_remove(fz_ad);
    fz_remove(fz_base);
    rmdir(fz_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    zs_log_set_level(ZS_LOG_ERROR);
    fz_scratch_make(fz_dir, sizeof fz_dir, "peft");
    snprintf(fz_base, sizeof fz_base, "%s/base", fz_dir);
    snprintf(fz_ad, sizeof fz_ad, "%s/adapter", fz_dir);
    atexit(fz_cleanup);
    int n = (int)(sizeof fz_base_args / sizeof *fz_base_args);
    char *av[32];
    memcpy(av, fz_base_args, sizeof fz_base_args);
    av[n] = "--out";
    av[n + 1] = fz_base;
    zs_init_opts io;
    const char *o;
    int help;
    if (zs_init_cmd_parse(n + 2, av, &io, &o, &help) < 0 || zs_init_model_write(&io, fz_base) < 0 ||
        zs_model_open(fz_base, NULL, &fz_model) < 0) {
        fprintf(stderr, "fuzz-peft: cannot make the base: %s\n", zs_errmsg());
        abort();
    }
    if (mkdir(fz_ad, 0755) != 0) abort();
    return 0;
}


/* y += scale·B·A·x for every target of every layer, on two rows */
static void fz_apply(const zs_lora *l) {
    float x[2 * 64], y[2 * 64], scratch[2 * 64 * 4];
    for (int i = 0; i < 2 * 64; i++) x[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    for (int layer = 0; layer < zs_lora_n_layers(l); layer++)
        for (int t = 0; t < ZS_LORA_NT; t++) {
            int in = 0, out = 0;
            if (zs_lora_dims(l, t, &in, &out) != 0 || !zs_lora_A_const(l, layer, t)) continue;
            if (in > 64 || out > 64 || zs_lora_apply_scratch(l, 2) > sizeof scratch / sizeof *scratch)
                __builtin_trap(); /* the base's shapes bound these */
            memset(y, 0, sizeof y);
            zs_lora_apply(l, layer, t, y, x, 2, scratch);
            for (int i = 0; i < 2 * out; i++) sink += y[i] == y[i];
        }
}

static void fz_use(zs_lora *l) {
    if (zs_lora_check_base(l, fz_model) != 0) __builtin_trap(); /* it was loaded for this base */
    const zs_lora_params *p = zs_lora_get_params(l);
    if (p->r < 1 || !(p->targets & ZS_LORA_ALL) || (p->targets & ~ZS_LORA_ALL)) __builtin_trap();
    if (zs_lora_apply_scratch(l, 2) != (size_t)2 * (size_t)p->r) __builtin_trap();
    size_t n;
    const float *d = zs_lora_data_const(l, &n);
    if (n == 0 || n != zs_lora_param_count(l)) __builtin_trap();
    sink += d[0] == d[n - 1];
    sink += isfinite(zs_lora_scale(l));
    fz_apply(l);
    zs_lora *c = NULL;
    if (zs_lora_new_like(l, &c) == 0) {
        if (zs_lora_copy(c, l) != 0) __builtin_trap();
        if (zs_lora_freeze(c, 1) == 0) fz_apply(c);
        zs_lora_free(c);
    }
    if (zs_lora_freeze(l, 0) == 0) fz_apply(l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4 || size > FZ_MAX_INPUT) return 0;
    uint32_t cl = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                  (uint32_t)data[3] << 24;
    if (cl > size - 4) cl = (uint32_t)(size - 4);
    fz_write(fz_ad, "adapter_config.json", data + 4, cl);
    fz_write(fz_ad, "adapter_model.safetensors", data + 4 + cl, size - 4 - cl);
    zs_lora *l = NULL;
    int rc = zs_lora_load(fz_ad, fz_model, &l);
    if (rc < 0) {
        if (l || zs_errmsg()[0] == 0) __builtin_trap(); /* every failure carries a message */
    } else {
        fz_use(l);
        zs_lora_free(l);
    }
    return 0;
}
