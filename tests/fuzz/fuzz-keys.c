/* fuzz-keys.c — libFuzzer harness for the API key file (server/keys.c, --api-key-file): each input
 * is parsed (zs_keys_parse). A file that parses has at least one key, and every line's key is
 * found again with that line's tenant and role: a plain KEY by itself, a sha256: line by the
 * digest of nothing we know, so only its presence in the count. Parsing twice gives the same
 * result. A file that does not parse leaves an error message naming the file. Built and run by
 * `make fuzz` (tests/fuzz/run.sh); seeds: tests/fuzz/corpus/keys/. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "keys.h"

#define MAX_INPUT (16u << 10)

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    zs_log_set_level(ZS_LOG_ERROR);
    return 0;
}

/* Each line's KEY TENANT ROLE, split as keys.c does (blanks, tabs and CRs; '#' to the end). */
static void check_lines(const zs_keys *k, const char *text, size_t len) {
    char *buf = malloc(len + 1);
    if (!buf) return;
    memcpy(buf, text, len);
    buf[len] = 0;
    int n = 0;
    for (char *p = buf, *nl; p < buf + len; p = nl ? nl + 1 : buf + len) {
        nl = strchr(p, '\n');
        if (nl) *nl = 0;
        char *hash = strchr(p, '#');
        if (hash) *hash = 0;
        char *save = NULL, *f[3] = {0};
        int nf = 0;
        for (char *t = strtok_r(p, " \t\r", &save); t && nf < 3; t = strtok_r(NULL, " \t\r", &save)) f[nf++] = t;
        if (nf == 0) continue;
        if (nf < 3) __builtin_trap(); /* the parser accepted a line with too few fields */
        n++;
        if (!strncmp(f[0], "sha256:", 7)) continue;
        zs_key_id id;
        if (!zs_keys_check(k, f[0], strlen(f[0]), &id)) __builtin_trap();
        if (strcmp(id.tenant, f[1]) || id.role != zs_role_parse(f[2])) __builtin_trap();
    }
    if (n != zs_keys_count(k)) __builtin_trap();
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > MAX_INPUT) return 0;
    zs_keys *k = NULL, *k2 = NULL;
    int rc = zs_keys_parse((const char *)data, size, "fuzz.keys", &k);
    int rc2 = zs_keys_parse((const char *)data, size, "fuzz.keys", &k2);
    if ((rc == 0) != (rc2 == 0)) __builtin_trap();
    if (rc == 0) {
        if (!k || zs_keys_count(k) < 1 || zs_keys_count(k) != zs_keys_count(k2)) __builtin_trap();
        check_lines(k, (const char *)data, size);
    } else if (k || !strstr(zs_errmsg(), "fuzz.keys")) {
        if (rc != ZS_ENOMEM) __builtin_trap();
    }
    zs_keys_free(k);
    zs_keys_free(k2);
    return 0;
}
