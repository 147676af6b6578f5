/* fuzz-config.c — libFuzzer harness for the config.json reader (engine/model/config.c):
 * zs_config_parse on the input, and, when it parses, the derived helpers over every layer, a
 * zs_config_override with a second JSON object, and zs_config_write's own read-back check
 * (into a per-process directory in /dev/shm). Input: config.json text, optionally followed by
 * a line "\n#override\n" and the override object. Seeds: tests/fuzz/corpus/config (the
 * init-model configs of every family) and the fixtures' config.json (fuzz-config.seeds). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "fuzz-checks.h"
#include "fuzz-util.h"

#define FZ_MAX_INPUT (256 * 1024)
#define FZ_SEP "\n#override\n"

static char fz_dir[64];
static char fz_path[128];

static void fz_cleanup(void) { fz_remove(fz_dir); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    zs_log_set_level(ZS_LOG_ERROR);
    fz_scratch_make(fz_dir, sizeof fz_dir, "config");
    snprintf(fz_path, sizeof fz_path, "%s/config.json", fz_dir);
    atexit(fz_cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    char *ov = strstr(text, FZ_SEP);
    if (ov) {
        *ov = 0;
        ov += strlen(FZ_SEP);
    }
    zs_model_config *c = malloc(sizeof *c);
    if (!c) {
        free(text);
        return 0;
    }
    int rc = zs_config_parse(text, "fuzz", c);
    if (rc < 0) {
        if (zs_errmsg()[0] == 0) __builtin_trap(); /* every failure carries a message */
    } else {
        fz_check_config(c);
        /* writable configs must read back as they are (zs_config_write checks it itself) */
        if (zs_config_write(c, fz_path) == 0) {
            zs_model_config *b = malloc(sizeof *b);
            if (b && zs_config_load(fz_dir, b) != 0) __builtin_trap();
            if (b && (b->family != c->family || b->n_layers != c->n_layers || b->dim != c->dim))
                __builtin_trap();
            free(b);
            unlink(fz_path);
        }
        if (ov) {
            rc = zs_config_override(c, ov, "fuzz-override");
            if (rc == 0) fz_check_config(c);
            else if (zs_errmsg()[0] == 0) __builtin_trap();
        }
    }
    free(c);
    free(text);
    return 0;
}
