/* audit.h — the audit log: one JSON line per admin or fine-tuning action (who, what, when, the
 * result), appended to a file under --data-dir (audit.jsonl). A line:
 *   {"time":"2026-12-05T22:41:07.123Z","tenant":"acme","role":"finetune","remote":"127.0.0.1",
 *    "method":"POST","path":"/v1/fine_tuning/jobs","status":200,"result":"ok","object":"ftjob-..."}
 * tenant and role are null when no known key was given; object is the id an action made, when it
 * made one; result is "ok" below 400, else the error's code (or "error").
 *
 * Each line goes out in one write(2) on an O_APPEND descriptor, so lines from several threads (or
 * processes) never interleave, and the file is only ever appended to. Ownership: the zs_audit owns
 * its descriptor. Thread-safety: zs_audit_write from any thread. */
#ifndef ZS_AUDIT_H
#define ZS_AUDIT_H

typedef struct zs_audit zs_audit;

typedef struct {
    const char *tenant, *role; /* NULL: unknown caller */
    const char *remote;        /* client address, or NULL */
    const char *method, *path;
    int status;
    const char *result; /* NULL: "ok" below 400, "error" otherwise */
    const char *object; /* NULL: none */
} zs_audit_rec;

/* Opens (creating, mode 0600) path for appending. ZS_EIO naming the path. */
int  zs_audit_open(const char *path, zs_audit **out);
void zs_audit_close(zs_audit *a);
/* Appends one line; a failed write is logged once per run and returned (ZS_EIO). */
int  zs_audit_write(zs_audit *a, const zs_audit_rec *rec);
/* The file's path. */
const char *zs_audit_path(const zs_audit *a);

#endif
