/* fuzz-dsconfig.c — libFuzzer harness for the DeepSpeed config parser (engine/runtime/dsconfig.c):
 * the input is parsed from memory with zs_dsconfig_parse_rep (unknown and ignored keys counted
 * by callbacks, which check the key they get), and when it parses, the result goes through the
 * helpers a command calls on it: zs_zero_opts_check, the batch resolution for a few world sizes,
 * zs_zero_opts_report_unused for every command kind, a merge into a fresh set and the offload
 * names. Seeds: tests/fuzz/corpus/dsconfig (ZeRO stages 1-3, nvme offload, fp16 loss scaling,
 * bf16, optimizer and scheduler blocks). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "dsconfig.h"

#define FZ_MAX_INPUT (256 * 1024)

static volatile uint64_t sink;

static void fz_key(const char *origin, const char *key) {
    if (!origin || !key) __builtin_trap(); /* "" is a valid (unknown) JSON key */
    sink += strlen(key) + strlen(origin);
}

static void fz_unknown(void *ud, const char *origin, const char *key) {
    (*(int *)ud)++;
    fz_key(origin, key);
}

static void fz_ignored(void *ud, const char *origin, const char *key, const char *instead) {
    (*(int *)ud)++;
    fz_key(origin, key);
    if (!instead) __builtin_trap();
    sink += strlen(instead);
}

static void fz_use(const zs_zero_opts *o) {
    if (zs_zero_opts_check(o, "fuzz") < 0 && zs_errmsg()[0] == 0) __builtin_trap();
    static const int worlds[] = {1, 2, 3, 8, 1 << 20};
    for (size_t i = 0; i < sizeof worlds / sizeof *worlds; i++) {
        int micro = 0, accum = 0;
        int64_t tb = 0;
        if (zs_zero_opts_resolve_batch(o, worlds[i], &micro, &accum, &tb) == 0) {
            if (micro < 1 || accum < 1 || tb < 1) __builtin_trap();
            if ((int64_t)micro * accum * worlds[i] != tb) __builtin_trap();
        }
        sink += zs_zero_opts_check_batch(o, worlds[i]) == 0;
    }
    int n = 0;
    for (unsigned uses = 0; uses < 8; uses++) zs_zero_opts_report_unused(o, "fuzz", uses, fz_ignored, &n);
    zs_zero_opts m;
    zs_zero_opts_init(&m);
    zs_zero_opts_merge(&m, o);
    if (m.zero_stage != o->zero_stage || m.offload_param != o->offload_param ||
        strcmp(m.nvme_path, o->nvme_path) || strcmp(m.optimizer_type, o->optimizer_type))
        __builtin_trap();
    if (memchr(o->nvme_path, 0, sizeof o->nvme_path) == NULL ||
        memchr(o->optimizer_nvme_path, 0, sizeof o->optimizer_nvme_path) == NULL ||
        memchr(o->optimizer_type, 0, sizeof o->optimizer_type) == NULL)
        __builtin_trap();
    sink += strlen(zs_offload_name(o->offload_param)) + strlen(zs_offload_name(o->offload_optimizer));
    sink += (uint64_t)n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return 0;
    zs_log_set_level(ZS_LOG_ERROR);
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    zs_zero_opts o;
    int n = 0;
    int rc = zs_dsconfig_parse_rep(text, "fuzz.json", fz_unknown, fz_ignored, &n, &o);
    if (rc < 0) {
        if (zs_errmsg()[0] == 0) __builtin_trap(); /* every failure carries a message */
    } else {
        fz_use(&o);
        /* the same text parses the same through the plain entry point (callbacks to the log) */
        zs_zero_opts p;
        if (zs_dsconfig_parse_ex(text, "fuzz.json", fz_unknown, &n, &p) != 0) __builtin_trap();
        if (p.zero_stage != o.zero_stage || p.micro_batch != o.micro_batch) __builtin_trap();
    }
    free(text);
    return 0;
}
