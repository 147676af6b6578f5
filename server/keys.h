/* keys.h — API keys with tenants and roles (--api-key-file, --api-key): who is calling, and what
 * they may do. A key file has one key per line, `KEY TENANT ROLE [LIMIT=N ...]`, fields separated by
 * whitespace; `#` starts a comment. KEY is the key itself or `sha256:` and the 64 hex digits of its
 * SHA-256; either way only the digest is kept. ROLE is inference (completions, chat, embeddings,
 * tokenize, models), finetune (those, plus files, jobs and the tenant's own fine-tuned models) or
 * admin (everything). The limits are the tenant's: rpm (requests a minute), tpm (tokens a minute),
 * streams (requests at once), jobs (fine-tuning jobs queued or running at once); 0 or absent: none.
 * A tenant's lines must agree. http.c enforces rpm, tpm and streams (quota.h), ftjobs.c jobs (429
 * jobs_limit). Every error names the file and line.
 *
 * Tenants own what they make: files, fine-tuning jobs and their models record the tenant of the
 * key that made them, and only that tenant and admins see them (zs_key_sees).
 *
 * Ownership: a zs_keys is immutable once loaded; the caller frees it. Thread-safety: lookups on one
 * zs_keys from any thread. */
#ifndef ZS_KEYS_H
#define ZS_KEYS_H

#include <stddef.h>

typedef enum { ZS_ROLE_NONE = 0, ZS_ROLE_INFERENCE = 1, ZS_ROLE_FINETUNE = 2, ZS_ROLE_ADMIN = 3 } zs_role;

#define ZS_TENANT_MAX 64

typedef struct {
    long rpm, tpm, streams, jobs; /* 0: no limit */
} zs_key_limits;

/* Who a key belongs to. */
typedef struct {
    char tenant[ZS_TENANT_MAX];
    zs_role role;
    zs_key_limits limits;
} zs_key_id;

typedef struct zs_keys zs_keys;

/* Loads a key file (see above). ZS_ENOTFOUND, ZS_EPERM (cannot read it), ZS_EFORMAT with
 * "FILE:LINE: ..." for a bad line, a duplicate key, limits that disagree for one tenant, or a file
 * without keys. A file others may read gets a warning. */
int  zs_keys_load(const char *path, zs_keys **out);
/* One admin key, tenant "admin" (--api-key). */
int  zs_keys_single(const char *key, zs_keys **out);
/* Parses text as a key file's content (name: what errors call it). */
int  zs_keys_parse(const char *text, size_t len, const char *name, zs_keys **out);
void zs_keys_free(zs_keys *k);
int  zs_keys_count(const zs_keys *k);
/* Finds the key presented (n bytes): 1 and *id, or 0. Its time does not depend on which entry
 * matches or how many bytes of a digest agree. */
int  zs_keys_check(const zs_keys *k, const char *key, size_t n, zs_key_id *id);

/* Whether the caller who (NULL: no keys are configured) sees what owner owns: yes without keys, for
 * an admin, for an owner that is NULL or "" (made while no keys were configured, or shared with
 * every tenant) and for the owner's own tenant. Thread-safe. */
int zs_key_sees(const zs_key_id *who, const char *owner);
/* The owner of what who makes: its tenant, or "" without keys. */
const char *zs_key_owner(const zs_key_id *who);

const char *zs_role_name(zs_role r);
/* "inference", "finetune", "admin" -> the role; ZS_ROLE_NONE for anything else. */
zs_role zs_role_parse(const char *s);

#endif
