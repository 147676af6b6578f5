/* test-keys.c — the API key file (server/keys.h): keys found with their tenant, role and limits,
 * plain and as sha256: (the digest of "abc" from FIPS 180-2), comments and blank lines, a tenant's
 * limits shared by its keys; wrong keys, prefixes and extensions of a key not found; every bad file
 * refused with its file and line: too few fields, an unknown role, a bad tenant, bad hex, a short
 * digest, a duplicate key (plain against its own digest too), limits that disagree, an unknown
 * limit, a negative one, a NUL byte, no keys; a missing file, a directory; --api-key's single admin. */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "keys.h"
#include "testutil.h"

static int parse(const char *text, zs_keys **k) { return zs_keys_parse(text, strlen(text), "keys.txt", k); }

static int found(const zs_keys *k, const char *key, zs_key_id *id) { return zs_keys_check(k, key, strlen(key), id); }

static void test_good(void) {
    const char *text = "# tenants\n"
                       "key-alice-1  alice  inference   rpm=60 tpm=1000\n"
                       "\n"
                       "key-alice-2\talice\tfinetune  # the same tenant, another role\n"
                       "sha256:BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD bob admin streams=2 jobs=1\r\n"
                       "   key-carol carol.team_1-x inference";
    zs_keys *k = NULL;
    CHECK(parse(text, &k) == 0, "a good file parses: %s", zs_errmsg());
    if (!k) return;
    CHECK(zs_keys_count(k) == 4, "4 keys (%d)", zs_keys_count(k));
    zs_key_id id;
    CHECK(found(k, "key-alice-1", &id) && !strcmp(id.tenant, "alice") && id.role == ZS_ROLE_INFERENCE && id.limits.rpm == 60 &&
              id.limits.tpm == 1000 && id.limits.streams == 0,
          "alice's first key: inference, rpm 60, tpm 1000");
    CHECK(found(k, "key-alice-2", &id) && id.role == ZS_ROLE_FINETUNE && id.limits.rpm == 60 && id.limits.tpm == 1000,
          "alice's second key: finetune, the tenant's limits from the other line");
    CHECK(found(k, "abc", &id) && !strcmp(id.tenant, "bob") && id.role == ZS_ROLE_ADMIN && id.limits.streams == 2 &&
              id.limits.jobs == 1,
          "a sha256: line (upper-case hex) finds the key whose digest it is");
    CHECK(found(k, "key-carol", &id) && !strcmp(id.tenant, "carol.team_1-x"), "leading blanks, no newline at the end");
    CHECK(!found(k, "key-alice", &id) && !found(k, "key-alice-12", &id) && !found(k, "", &id) && !found(k, "ABC", &id) &&
              !found(k, "key-alice-1 ", &id),
          "a prefix, an extension, empty, another case and a trailing blank are other keys");
    CHECK(!found(k, "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", &id),
          "the digest line itself is not a key");
    CHECK(zs_keys_check(k, "key-carolXX", 9, &id) && !strcmp(id.tenant, "carol.team_1-x"), "a key is its n bytes");
    zs_keys_free(k);
    CHECK(zs_role_parse("admin") == ZS_ROLE_ADMIN && zs_role_parse("Admin") == ZS_ROLE_NONE &&
              !strcmp(zs_role_name(ZS_ROLE_FINETUNE), "finetune"),
          "role names");
}

static void refused(const char *text, const char *want, const char *what) {
    zs_keys *k = NULL;
    int rc = zs_keys_parse(text, strlen(text) + (strstr(what, "NUL") ? 4 : 0), "keys.txt", &k);
    CHECK(rc == ZS_EFORMAT && !k && strstr(zs_errmsg(), want), "%s: refused with '%s' (%d: %s)", what, want, rc, zs_errmsg());
    zs_keys_free(k);
}

static void test_bad(void) {
    refused("k1 alice\n", "keys.txt:1: 2 fields", "two fields");
    refused("# c\nk1 alice root\n", "keys.txt:2: role 'root'", "an unknown role");
    refused("k1 al/ice inference\n", "keys.txt:1: tenant 'al/ice'", "a tenant with a slash");
    refused("k1 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa inference\n", "tenant", "a tenant too long");
    refused("sha256:zz7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad a admin\n", "keys.txt:1: sha256: 'zz'",
            "bad hex");
    refused("sha256:ba7816bf a admin\n", "64 hex digits (8 given)", "a short digest");
    refused("k1 a admin\nk2 b admin\nk1 c inference\n", "keys.txt:3: the same key as line 1", "a duplicate key");
    refused("abc a admin\nsha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad b admin\n",
            "keys.txt:2: the same key as line 1", "a key and its own digest");
    refused("k1 a admin rpm=5\nk2 a inference rpm=6\n", "keys.txt:2: tenant a's limits differ from line 1", "limits that disagree");
    refused("k1 a admin qps=5\n", "'qps=5' is not a limit", "an unknown limit");
    refused("k1 a admin rpm=-1\n", "limit rpm: '-1'", "a negative limit");
    refused("k1 a admin rpm=1x\n", "limit rpm: '1x'", "a limit that is not a number");
    refused("k1 a admin\0\0\0\0", "a NUL byte", "a NUL byte");
    refused("# only comments\n\n   \n", "no keys", "no keys");
    refused("", "no keys", "an empty file");
}

static void test_files(void) {
    char dir[4096], path[4200];
    if (tu_tmpdir(dir, sizeof dir, "keys") < 0) return;
    zs_keys *k = NULL;
    snprintf(path, sizeof path, "%s/none", dir);
    CHECK(zs_keys_load(path, &k) == ZS_ENOTFOUND && strstr(zs_errmsg(), "no such file"), "a missing file: %s", zs_errmsg());
    CHECK(zs_keys_load(dir, &k) == ZS_EFORMAT && strstr(zs_errmsg(), "not a regular file"), "a directory: %s", zs_errmsg());
    snprintf(path, sizeof path, "%s/keys", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("k-one t1 inference\nk-two t2 admin\n", f);
        fclose(f);
    }
    chmod(path, 0600);
    CHECK(zs_keys_load(path, &k) == 0 && zs_keys_count(k) == 2, "a file with two keys: %s", zs_errmsg());
    zs_key_id id;
    CHECK(k && found(k, "k-two", &id) && id.role == ZS_ROLE_ADMIN, "its admin key");
    zs_keys_free(k);
    f = fopen(path, "w");
    if (f) {
        fputs("k-one t1 inference\nk-two t2\n", f);
        fclose(f);
    }
    char want[4300];
    snprintf(want, sizeof want, "%s:2: 2 fields", path);
    CHECK(zs_keys_load(path, &k) == ZS_EFORMAT && strstr(zs_errmsg(), want), "the error names the file and line: %s", zs_errmsg());
    unlink(path);
    tu_rmdir(dir);
    CHECK(zs_keys_single("s3cret", &k) == 0 && found(k, "s3cret", &id) && id.role == ZS_ROLE_ADMIN && !strcmp(id.tenant, "admin") &&
              !found(k, "s3cre", &id),
          "--api-key: one admin key");
    zs_keys_free(k);
    CHECK(zs_keys_single("", &k) == ZS_EINVAL, "--api-key '' refused");
}

/* Who sees what a tenant owns (files, jobs, fine-tuned models). */
static void test_sees(void) {
    zs_key_id acme = {"acme", ZS_ROLE_FINETUNE, {0, 0, 0, 2}}, beta = {"beta", ZS_ROLE_INFERENCE, {0}};
    zs_key_id ops = {"ops", ZS_ROLE_ADMIN, {0}};
    CHECK(zs_key_sees(&acme, "acme") && !zs_key_sees(&beta, "acme") && !zs_key_sees(&acme, "acm") &&
              !zs_key_sees(&acme, "acme2"),
          "a tenant sees its own, not another's");
    CHECK(zs_key_sees(&ops, "acme") && zs_key_sees(NULL, "acme"), "an admin, and a server without keys, see everything");
    CHECK(zs_key_sees(&beta, NULL) && zs_key_sees(&beta, ""), "what has no owner is everyone's");
    CHECK(!strcmp(zs_key_owner(&acme), "acme") && !strcmp(zs_key_owner(NULL), ""), "the owner of what a caller makes");
}

int main(void) {
    zs_log_set_level(ZS_LOG_ERROR);
    test_good();
    test_bad();
    test_files();
    test_sees();
    return tu_finish("test-keys");
}
