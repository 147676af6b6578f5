/* safetensors-write.c — safetensors writer: streams a header and tensor data to <path>.tmp and
 * publishes it atomically (fflush, fsync, rename, fsync of the directory). Used by conversion,
 * init-model and checkpoint consolidation. See safetensors.h. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "safetensors.h"

struct zs_st_writer {
    char *path, *tmp;
    FILE *f;
    char **names;     /* per declared tensor, for messages */
    uint64_t *ends;   /* cumulative end offset of each tensor */
    size_t n;
    uint64_t total, written;
    int failed;
};

static void w_free(zs_st_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    for (size_t i = 0; i < w->n; i++) free(w->names[i]);
    free(w->names);
    free(w->ends);
    free(w->path);
    free(w->tmp);
    free(w);
}

static int w_errno_code(int e) {
    if (e == ENOSPC || e == EDQUOT) return ZS_ENOSPC;
    if (e == EACCES || e == EPERM || e == EROFS) return ZS_EPERM;
    if (e == ENOENT || e == ENOTDIR) return ZS_ENOTFOUND;
    return ZS_EIO;
}

/* Builds the header JSON (unpadded) into *out (malloc'd); fills w->names/ends/total. */
static int w_header(zs_st_writer *w, const zs_st_decl *decls, size_t n, const char *meta,
                    char **out) {
    const char *path = w->path;
    json_t *root = json_object();
    if (!root) return zs_err(ZS_ENOMEM, "%s: out of memory", path);
    int rc = 0;
    if (meta) {
        json_error_t je;
        json_t *m = json_loads(meta, JSON_REJECT_DUPLICATES, &je);
        if (!m) {
            rc = zs_err(ZS_EINVAL, "%s: metadata is not valid JSON (%s)", path, je.text);
            goto fail;
        }
        const char *k;
        json_t *v;
        int ok = json_is_object(m);
        if (ok) {
            json_object_foreach(m, k, v) {
                if (!json_is_string(v)) ok = 0;
            }
        }
        if (!ok) {
            json_decref(m);
            rc = zs_err(ZS_EINVAL, "%s: metadata must be a JSON object of string values", path);
            goto fail;
        }
        json_object_set_new(root, "__metadata__", m);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const zs_st_decl *d = &decls[i];
        if (!d->name || !*d->name || !strcmp(d->name, "__metadata__")) {
            rc = zs_err(ZS_EINVAL, "%s: tensor %zu has an empty or reserved name", path, i);
            goto fail;
        }
        if (json_object_get(root, d->name)) {
            rc = zs_err(ZS_EINVAL, "%s: tensor '%s' declared twice", path, d->name);
            goto fail;
        }
        if ((unsigned)d->dtype >= ZS_DTYPE_ELEM_COUNT) {
            rc = zs_err(ZS_EINVAL, "%s: tensor '%s' has an invalid dtype (%d)", path, d->name,
                        (int)d->dtype);
            goto fail;
        }
        if (d->ndim < 0 || d->ndim > 4) {
            rc = zs_err(ZS_EINVAL, "%s: tensor '%s' has %d dimensions (0..4 allowed)", path,
                        d->name, d->ndim);
            goto fail;
        }
        size_t bytes = zs_dtype_size(d->dtype);
        json_t *shape = json_array(), *offs = json_array(), *e = json_object();
        if (!shape || !offs || !e) {
            json_decref(shape);
            json_decref(offs);
            json_decref(e);
            rc = zs_err(ZS_ENOMEM, "%s: out of memory", path);
            goto fail;
        }
        json_object_set_new(e, "dtype", json_string(zs_dtype_name(d->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(root, d->name, e);
        for (int k = 0; k < d->ndim; k++) {
            if (d->shape[k] < 0 || (uint64_t)d->shape[k] > SIZE_MAX ||
                zs_mul_size(bytes, (size_t)d->shape[k], &bytes) < 0) {
                rc = zs_err(ZS_EINVAL, "%s: tensor '%s' has a negative or too large shape", path,
                            d->name);
                goto fail;
            }
            json_array_append_new(shape, json_integer(d->shape[k]));
        }
        if ((uint64_t)bytes > (uint64_t)INT64_MAX - off) {
            rc = zs_err(ZS_ERANGE, "%s: total tensor size overflows", path);
            goto fail;
        }
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += bytes;
        json_array_append_new(offs, json_integer((json_int_t)off));
        w->names[i] = strdup(d->name);
        if (!w->names[i]) {
            rc = zs_err(ZS_ENOMEM, "%s: out of memory", path);
            goto fail;
        }
        w->n = i + 1;
        w->ends[i] = off;
    }
    w->total = off;
    *out = json_dumps(root, JSON_COMPACT); /* jansson keeps insertion order */
    if (!*out) rc = zs_err(ZS_ENOMEM, "%s: out of memory", path);
fail:
    json_decref(root);
    return rc;
}

int zs_st_writer_open(const char *path, const zs_st_decl *decls, size_t n,
                      const char *metadata_json, zs_st_writer **out) {
    if (!path || !out || (n && !decls)) return zs_err(ZS_EINVAL, "zs_st_writer_open: NULL argument");
    zs_st_writer *w = calloc(1, sizeof *w);
    if (!w) return zs_err(ZS_ENOMEM, "%s: out of memory", path);
    size_t pl = strlen(path);
    w->path = strdup(path);
    w->tmp = malloc(pl + 5);
    w->names = calloc(n ? n : 1, sizeof *w->names);
    w->ends = calloc(n ? n : 1, sizeof *w->ends);
    if (!w->path || !w->tmp || !w->names || !w->ends) {
        w_free(w);
        return zs_err(ZS_ENOMEM, "%s: out of memory", path);
    }
    memcpy(w->tmp, path, pl);
    memcpy(w->tmp + pl, ".tmp", 5);

    char *hdr = NULL;
    int rc = w_header(w, decls, n, metadata_json, &hdr);
    if (rc < 0) {
        w_free(w);
        return rc;
    }
    size_t hl = strlen(hdr), padded = ZS_ALIGN_UP(hl, 8);
    int fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0) close(fd);
        free(hdr);
        rc = zs_err(w_errno_code(e), "%s: cannot create: %s", w->tmp, strerror(e));
        if (fd >= 0) unlink(w->tmp);
        w_free(w);
        return rc;
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(le, 1, 8, w->f) == 8 && fwrite(hdr, 1, hl, w->f) == hl;
    for (size_t i = hl; ok && i < padded; i++) ok = fputc(' ', w->f) != EOF;
    free(hdr);
    if (!ok) {
        int e = errno;
        rc = zs_err(w_errno_code(e), "%s: cannot write header: %s", w->tmp, strerror(e));
        zs_st_writer_abort(w);
        return rc;
    }
    *out = w;
    return 0;
}

int zs_st_writer_write(zs_st_writer *w, const void *data, size_t nbytes) {
    if (!w) return zs_err(ZS_EINVAL, "zs_st_writer_write: NULL writer");
    if (w->failed) return zs_err(ZS_EINVAL, "%s: writer already failed", w->path);
    if (nbytes == 0) return 0;
    if (!data) return zs_err(ZS_EINVAL, "%s: zs_st_writer_write: NULL data", w->path);
    if ((uint64_t)nbytes > w->total - w->written) {
        w->failed = 1;
        return zs_err(ZS_EINVAL,
                      "%s: writing %zu more bytes would exceed the %" PRIu64 " declared data "
                      "bytes (%" PRIu64 " already written)", w->path, nbytes, w->total, w->written);
    }
    if (fwrite(data, 1, nbytes, w->f) != nbytes) {
        int e = errno;
        w->failed = 1;
        return zs_err(w_errno_code(e), "%s: write failed: %s", w->tmp, strerror(e));
    }
    w->written += nbytes;
    return 0;
}

void zs_st_writer_abort(zs_st_writer *w) {
    if (!w) return;
    if (w->f) {
        fclose(w->f);
        w->f = NULL;
    }
    unlink(w->tmp);
    w_free(w);
}

int zs_st_writer_close(zs_st_writer *w) {
    if (!w) return zs_err(ZS_EINVAL, "zs_st_writer_close: NULL writer");
    int rc = 0;
    if (w->failed) {
        rc = zs_err(ZS_EINVAL, "%s: writer failed earlier; file not written", w->path);
    } else if (w->written < w->total) {
        size_t i = 0;
        while (i < w->n && w->ends[i] <= w->written) i++;
        rc = zs_err(ZS_EINVAL,
                    "%s: only %" PRIu64 " of %" PRIu64 " declared data bytes written (tensor '%s' "
                    "incomplete)", w->path, w->written, w->total, i < w->n ? w->names[i] : "?");
    } else if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) {
        int e = errno;
        rc = zs_err(w_errno_code(e), "%s: cannot flush: %s", w->tmp, strerror(e));
    } else {
        FILE *f = w->f;
        w->f = NULL;
        if (fclose(f) != 0) {
            int e = errno;
            rc = zs_err(w_errno_code(e), "%s: cannot close: %s", w->tmp, strerror(e));
        } else if (rename(w->tmp, w->path) != 0) {
            int e = errno;
            rc = zs_err(w_errno_code(e), "%s: cannot rename %s into place: %s", w->path, w->tmp,
                        strerror(e));
        } else {
            /* Make the rename durable; not every file system supports fsync on a directory. */
            char *dir = strdup(w->path);
            if (dir) {
                char *sl = strrchr(dir, '/');
                const char *dp = sl ? (sl == dir ? "/" : (*sl = 0, dir)) : ".";
                int dfd = open(dp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (dfd >= 0) {
                    (void)fsync(dfd);
                    close(dfd);
                }
                free(dir);
            }
            w_free(w);
            return 0;
        }
    }
    zs_st_writer_abort(w);
    return rc;
}
