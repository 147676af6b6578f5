/* lora-merge.c — `zeroserve export --merge`: a LoRA adapter folded into its base as a plain
 * Hugging Face model directory (zs_lora_merge_export, declared in lora.h).
 *
 * What is written: every safetensors file of the base (one file or the shards of an index), byte
 * for byte (the same header, so the same tensor names, order, offsets and __metadata__), except
 * the data of each adapted projection W [out, in], which becomes W + scale·B·A: each element's
 * B·A dot product accumulated in double over the rank, added to W (widened to f32, exact) in
 * double, rounded once to f32 and then, for an f16 / bf16 W, to W's dtype with zs_convert (round
 * to nearest even). Every other regular file of the base directory is copied as it is
 * (config.json, tokenizer*.json, generation_config.json, special_tokens_map.json, chat templates,
 * model.safetensors.index.json, ...), except weights in other formats (*.bin, *.pt, *.pth, *.gguf,
 * ...: they would hold the unmerged base) and subdirectories, which are left out with a warning.
 * A marker file, zeroserve-merge.json, records the base, the adapter and its parameters.
 *
 * Publishing: everything goes into out_dir.tmp (each file fsync'd, then the directory), which is
 * renamed to out_dir. An existing out_dir is replaced only when it is empty or holds the marker
 * (a previous export): it is renamed to out_dir.old, the new one renamed into place, and the old
 * one's top-level files removed (a subdirectory someone added keeps out_dir.old in place, with a
 * warning). Any other existing out_dir is refused before anything is written, as is a leftover
 * out_dir.tmp / out_dir.old without the marker. Not thread-safe with another export to the same
 * out_dir; otherwise reentrant. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fileio.h"
#include "lora.h"
#include "model.h"
#include "safetensors.h"

#define MERGE_MARKER "zeroserve-merge.json"

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int has_file(const char *dir, const char *name) {
    char p[2 * PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* 1: dir has no entry besides . and .. ; 0: it has some; < 0: cannot read it */
static int dir_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return zs_err(zs_errno_code(errno), "%s: cannot read: %s", dir, strerror(errno));
    struct dirent *de;
    int empty = 1;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) empty = 0;
    closedir(d);
    return empty;
}

/* a directory this code may remove or replace: empty, or holding our marker */
static int ours_or_empty(const char *dir) {
    int e = dir_empty(dir);
    if (e < 0) return e;
    return e || has_file(dir, MERGE_MARKER);
}

/* Removes the top-level regular files of one of our directories, then the directory. A
 * subdirectory (not ours) keeps it: warned, not an error. */
static int remove_ours(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return zs_err(zs_errno_code(errno), "%s: cannot read: %s", dir, strerror(errno));
    struct dirent *de;
    char p[2 * PATH_MAX];
    int kept = 0, rc = 0;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && (S_ISREG(sb.st_mode) || S_ISLNK(sb.st_mode))) {
            if (unlink(p) != 0 && rc == 0) rc = zs_err(zs_errno_code(errno), "%s: cannot remove: %s", p, strerror(errno));
        } else {
            kept = 1;
        }
    }
    closedir(d);
    if (rc < 0) return rc;
    if (kept) {
        zs_log_warn("export --merge: %s holds a subdirectory that is not ours; left in place", dir);
        return 0;
    }
    if (rmdir(dir) != 0) return zs_err(zs_errno_code(errno), "%s: cannot remove: %s", dir, strerror(errno));
    return 0;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* weights in a format this export does not rewrite (copying them would ship the unmerged base) */
static int other_weights(const char *name) {
    static const char *const ext[] = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5",
                                      ".msgpack", ".onnx", ".npz", ".pkl", NULL};
    size_t n = strlen(name);
    for (int i = 0; ext[i]; i++) {
        size_t k = strlen(ext[i]);
        if (n >= k && !strcmp(name + n - k, ext[i])) return 1;
    }
    return 0;
}

/* Copies src to dst (created, fsync'd). */
static int copy_file(const char *src, const char *dst) {
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return zs_err(zs_errno_code(errno), "%s: cannot open: %s", src, strerror(errno));
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        int e = errno;
        close(in);
        return zs_err(zs_errno_code(e), "%s: cannot create: %s", dst, strerror(e));
    }
    static const size_t CH = 1 << 20;
    char *buf = malloc(CH);
    int rc = buf ? 0 : zs_err(ZS_ENOMEM, "out of memory");
    off_t off = 0;
    while (rc == 0) {
        ssize_t k = read(in, buf, CH);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) rc = zs_err(zs_errno_code(errno), "%s: read failed: %s", src, strerror(errno));
        if (k <= 0) break;
        int w = zs_pwrite_all(out, buf, (size_t)k, off);
        if (w < 0) rc = zs_err(zs_errno_code(-w), "%s: write failed: %s", dst, strerror(-w));
        off += k;
    }
    free(buf);
    if (rc == 0 && fsync(out) != 0) rc = zs_err(zs_errno_code(errno), "%s: cannot flush: %s", dst, strerror(errno));
    close(in);
    if (close(out) != 0 && rc == 0) rc = zs_err(zs_errno_code(errno), "%s: cannot close: %s", dst, strerror(errno));
    return rc;
}

/* byte offset in its file of every tensor of one safetensors file (its header parsed again; the
 * reader validated the file at open) */
static int st_header(const char *path, json_t **hdr, uint64_t *data0) {
    FILE *f = fopen(path, "rb");
    if (!f) return zs_err(zs_errno_code(errno), "%s: cannot open: %s", path, strerror(errno));
    uint8_t le[8];
    uint64_t n = 0;
    int rc = fread(le, 1, 8, f) == 8 ? 0 : zs_err(ZS_EFORMAT, "%s: truncated header", path);
    for (int i = 0; i < 8; i++) n |= (uint64_t)le[i] << (8 * i);
    char *text = rc == 0 && n < (1u << 30) ? malloc(n) : NULL;
    if (rc == 0 && !text) rc = zs_err(ZS_EFORMAT, "%s: header of %llu bytes", path, (unsigned long long)n);
    if (rc == 0 && fread(text, 1, n, f) != n) rc = zs_err(ZS_EFORMAT, "%s: truncated header", path);
    fclose(f);
    if (rc == 0) {
        json_error_t je;
        *hdr = json_loadb(text, n, 0, &je);
        if (!*hdr) rc = zs_err(ZS_EFORMAT, "%s: header is not JSON (%s)", path, je.text);
        *data0 = 8 + n;
    }
    free(text);
    return rc;
}

/* W + scale·B·A into dst (W's dtype), see the top of the file */
static int merged_tensor(const zs_st_tensor *w, const zs_lora *l, int layer, int t, void *dst) {
    int in, out, r = zs_lora_get_params(l)->r;
    zs_lora_dims(l, t, &in, &out);
    size_t n = (size_t)in * (size_t)out;
    float *wf = malloc(n * sizeof(float));
    double *acc = malloc((size_t)in * sizeof(double));
    if (!wf || !acc) {
        free(wf);
        free(acc);
        return zs_err(ZS_ENOMEM, "export --merge: out of memory for %s", w->name);
    }
    if (w->dtype == ZS_F32) memcpy(wf, w->data, n * sizeof(float)); /* the mapping may be unaligned */
    else zs_to_f32(wf, w->data, w->dtype, n);
    const float *A = zs_lora_A_const(l, layer, t), *B = zs_lora_B_const(l, layer, t);
    double s = (double)zs_lora_scale(l);
    for (int o = 0; o < out; o++) {
        for (int i = 0; i < in; i++) acc[i] = 0;
        for (int k = 0; k < r; k++) {
            double b = (double)B[(size_t)o * r + k];
            const float *a = A + (size_t)k * in;
            for (int i = 0; i < in; i++) acc[i] += b * (double)a[i];
        }
        float *row = wf + (size_t)o * in;
        for (int i = 0; i < in; i++) row[i] = (float)((double)row[i] + s * acc[i]);
    }
    if (w->dtype == ZS_F32) memcpy(dst, wf, n * sizeof(float));
    else zs_convert(dst, w->dtype, wf, ZS_F32, n);
    free(wf);
    free(acc);
    return 0;
}

typedef struct {
    const zs_st_tensor *t;
    int layer, target;
} merge_item;

/* Writes one safetensors file of the base into tmp: its bytes, then the merged tensors over it. */
static int write_shard(const char *src, const char *tmp, const merge_item *items, int n_items, const zs_lora *l) {
    char dst[2 * PATH_MAX];
    snprintf(dst, sizeof dst, "%s/%s", tmp, base_name(src));
    int rc = copy_file(src, dst);
    if (rc < 0) return rc;
    json_t *hdr = NULL;
    uint64_t data0 = 0;
    int fd = -1;
    void *buf = NULL;
    for (int i = 0; rc == 0 && i < n_items; i++) {
        const zs_st_tensor *t = items[i].t;
        if (strcmp(t->file, src)) continue;
        if (!hdr && (rc = st_header(src, &hdr, &data0)) < 0) break;
        json_t *offs = json_object_get(json_object_get(hdr, t->name), "data_offsets");
        uint64_t a = (uint64_t)json_integer_value(json_array_get(offs, 0)), b = (uint64_t)json_integer_value(json_array_get(offs, 1));
        if (!json_is_array(offs) || b - a != t->nbytes) {
            rc = zs_err(ZS_EFORMAT, "%s: tensor '%s': data_offsets do not match its size", src, t->name);
            break;
        }
        if (fd < 0 && (fd = open(dst, O_WRONLY | O_CLOEXEC)) < 0) {
            rc = zs_err(zs_errno_code(errno), "%s: cannot open: %s", dst, strerror(errno));
            break;
        }
        free(buf);
        if (!(buf = malloc(t->nbytes))) {
            rc = zs_err(ZS_ENOMEM, "export --merge: out of memory for %s", t->name);
            break;
        }
        if ((rc = merged_tensor(t, l, items[i].layer, items[i].target, buf)) < 0) break;
        int w = zs_pwrite_all(fd, buf, t->nbytes, (off_t)(data0 + a));
        if (w < 0) rc = zs_err(zs_errno_code(-w), "%s: write failed: %s", dst, strerror(-w));
    }
    free(buf);
    json_decref(hdr);
    if (fd >= 0) {
        if (rc == 0 && fsync(fd) != 0) rc = zs_err(zs_errno_code(errno), "%s: cannot flush: %s", dst, strerror(errno));
        if (close(fd) != 0 && rc == 0) rc = zs_err(zs_errno_code(errno), "%s: cannot close: %s", dst, strerror(errno));
    }
    return rc;
}

/* the adapted tensors of the checkpoint: (tensor, layer, target), checked against the model */
static int plan_items(const zs_model *m, const zs_st_set *st, const zs_lora *l, merge_item **out, int *n_out) {
    const zs_model_config *c = zs_model_config_get(m);
    unsigned targets = zs_lora_get_params(l)->targets;
    merge_item *it = calloc((size_t)c->n_layers * ZS_LORA_NT + 1, sizeof *it);
    if (!it) return zs_err(ZS_ENOMEM, "out of memory");
    int n = 0;
    for (int layer = 0; layer < c->n_layers; layer++)
        for (int t = 0; t < ZS_LORA_NT; t++) {
            if (!(targets >> t & 1)) continue;
            zs_slot_source s;
            int in, o, rc = zs_model_slot_source(m, zs_bucket_layer(layer), zs_lora_target_role(t), &s);
            zs_lora_dims(l, t, &in, &o);
            if (rc == 0 && (s.kind != ZS_SRC_COPY || s.ndim != 2 || s.shape[0] != o || s.shape[1] != in))
                rc = zs_err(ZS_EUNSUPPORTED, "%s: layer %d %s is not stored as one [%d, %d] tensor; merging it is not "
                            "supported", zs_model_dir(m), layer, zs_lora_target_name(t), o, in);
            if (rc == ZS_ENOTFOUND) rc = zs_err(rc, "%s: layer %d has no %s", zs_model_dir(m), layer, zs_lora_target_name(t));
            const zs_st_tensor *x = NULL;
            if (rc == 0) {
                int64_t shape[2] = {o, in};
                rc = zs_st_get(st, s.name, 2, shape, &x);
            }
            if (rc < 0) {
                free(it);
                return rc;
            }
            it[n++] = (merge_item){x, layer, t};
        }
    *out = it;
    *n_out = n;
    return 0;
}

static int write_marker(const char *tmp, const char *base_dir, const char *adapter_dir, const zs_lora *l, int n_items) {
    const zs_lora_params *p = zs_lora_get_params(l);
    char rb[PATH_MAX], ra[PATH_MAX], path[2 * PATH_MAX];
    json_t *j = json_object(), *tm = json_array();
    for (int t = 0; t < ZS_LORA_NT; t++)
        if (p->targets >> t & 1) json_array_append_new(tm, json_string(zs_lora_target_name(t)));
    json_object_set_new(j, "written_by", json_string("zeroserve export --merge"));
    json_object_set_new(j, "base", json_string(realpath(base_dir, rb) ? rb : base_dir));
    json_object_set_new(j, "adapter", json_string(realpath(adapter_dir, ra) ? ra : adapter_dir));
    json_object_set_new(j, "r", json_integer(p->r));
    json_object_set_new(j, "lora_alpha", json_real(p->alpha));
    json_object_set_new(j, "use_rslora", json_boolean(p->rslora));
    json_object_set_new(j, "scale", json_real(zs_lora_scale(l)));
    json_object_set_new(j, "target_modules", tm);
    json_object_set_new(j, "merged_tensors", json_integer(n_items));
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    if (!text) return zs_err(ZS_ENOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/" MERGE_MARKER, tmp);
    int rc = zs_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* Copies base_dir's other files (see the top of the file); names of the checkpoint's own
 * safetensors files are in st. */
static int copy_others(const char *base_dir, const char *tmp) {
    DIR *d = opendir(base_dir);
    if (!d) return zs_err(zs_errno_code(errno), "%s: cannot read: %s", base_dir, strerror(errno));
    struct dirent *de;
    int rc = 0;
    char src[2 * PATH_MAX], dst[2 * PATH_MAX];
    while (rc == 0 && (de = readdir(d))) {
        const char *n = de->d_name;
        if (n[0] == '.' || !strcmp(n, MERGE_MARKER)) continue;
        snprintf(src, sizeof src, "%s/%s", base_dir, n);
        struct stat sb;
        if (stat(src, &sb) != 0) continue;
        if (!S_ISREG(sb.st_mode)) {
            if (S_ISDIR(sb.st_mode)) zs_log_warn("export --merge: %s: a subdirectory; not copied", src);
            continue;
        }
        if (other_weights(n)) {
            size_t k = strlen(n);
            if (!(k > 12 && !strcmp(n + k - 12, ".safetensors")))
                zs_log_warn("export --merge: %s: weights in another format; not copied (they would not be merged)", src);
            continue; /* the checkpoint's safetensors are written by write_shard */
        }
        snprintf(dst, sizeof dst, "%s/%s", tmp, n);
        rc = copy_file(src, dst);
    }
    closedir(d);
    return rc;
}

/* out_dir's state before anything is written: 0 absent, 1 present and replaceable */
static int check_out(const char *out_dir, const char *tmp, const char *old) {
    struct stat sb;
    const char *p[3] = {tmp, old, out_dir};
    for (int i = 0; i < 3; i++) {
        if (lstat(p[i], &sb) != 0) {
            if (errno == ENOENT) continue;
            return zs_err(zs_errno_code(errno), "%s: %s", p[i], strerror(errno));
        }
        if (!S_ISDIR(sb.st_mode)) return zs_err(ZS_EINVAL, "%s exists and is not a directory; give another --out", p[i]);
        int ok = ours_or_empty(p[i]);
        if (ok < 0) return ok;
        if (!ok)
            return zs_err(ZS_EINVAL, "%s exists, is not empty and was not written by `export --merge` (it has no %s); "
                          "give another --out or remove it", p[i], MERGE_MARKER);
    }
    return is_dir(out_dir);
}

int zs_lora_merge_export(const char *base_dir, const char *adapter_dir, const char *out_dir_arg) {
    if (!base_dir || !adapter_dir || !out_dir_arg || !*out_dir_arg)
        return zs_err(ZS_EINVAL, "export --merge: the base, the adapter and the output directory are required");
    char out_dir[PATH_MAX], tmp[PATH_MAX + 8], old[PATH_MAX + 8];
    if (strlen(out_dir_arg) >= sizeof out_dir) return zs_err(ZS_EINVAL, "%s: path too long", out_dir_arg);
    strcpy(out_dir, out_dir_arg);
    for (size_t k = strlen(out_dir); k > 1 && out_dir[k - 1] == '/'; k--) out_dir[k - 1] = 0;
    snprintf(tmp, sizeof tmp, "%s.tmp", out_dir);
    snprintf(old, sizeof old, "%s.old", out_dir);

    /* the base: a Hugging Face directory, not GGUF */
    struct stat sb;
    if (stat(base_dir, &sb) != 0) return zs_err(zs_errno_code(errno), "%s: %s", base_dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) {
        char magic[4] = {0};
        FILE *f = fopen(base_dir, "rb");
        size_t k = f ? fread(magic, 1, 4, f) : 0;
        if (f) fclose(f);
        if (k == 4 && !memcmp(magic, "GGUF", 4))
            return zs_err(ZS_EUNSUPPORTED, "%s is a GGUF file: export --merge needs the base as a Hugging Face "
                          "directory (config.json + safetensors); merge into the model the GGUF was made from, "
                          "then convert the result", base_dir);
        return zs_err(ZS_EINVAL, "%s is not a model directory", base_dir);
    }
    if (!has_file(base_dir, "config.json")) {
        DIR *d = opendir(base_dir);
        struct dirent *de;
        int gguf = 0;
        while (d && (de = readdir(d))) {
            size_t k = strlen(de->d_name);
            gguf |= k > 5 && !strcmp(de->d_name + k - 5, ".gguf");
        }
        if (d) closedir(d);
        if (gguf)
            return zs_err(ZS_EUNSUPPORTED, "%s holds a GGUF model: export --merge needs a Hugging Face base "
                          "(config.json + safetensors)", base_dir);
    }
    char rb[PATH_MAX], ro[PATH_MAX], ra[PATH_MAX];
    if (realpath(base_dir, rb) && realpath(out_dir, ro) && !strcmp(rb, ro))
        return zs_err(ZS_EINVAL, "export --merge: the output directory %s is the base itself", out_dir);
    if (realpath(adapter_dir, ra) && realpath(out_dir, ro) && !strcmp(ra, ro))
        return zs_err(ZS_EINVAL, "export --merge: the output directory %s is the adapter itself", out_dir);

    int present = check_out(out_dir, tmp, old);
    if (present < 0) return present;

    zs_model *m = NULL;
    zs_lora *l = NULL;
    zs_st_set *st = NULL;
    merge_item *items = NULL;
    int n_items = 0, rc;
    if ((rc = zs_model_open(base_dir, NULL, &m)) < 0) return rc;
    if ((rc = zs_lora_load(adapter_dir, m, &l)) < 0) goto done;
    if ((rc = zs_st_open_dir(base_dir, &st)) < 0) goto done;
    if ((rc = plan_items(m, st, l, &items, &n_items)) < 0) goto done;

    if (is_dir(tmp) && (rc = remove_ours(tmp)) < 0) goto done; /* a crashed export's leftovers */
    if (mkdir(tmp, 0755) != 0) {
        rc = zs_err(zs_errno_code(errno), "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    /* the marker first: a crash from here on leaves a tmp that the next export recognises */
    rc = write_marker(tmp, base_dir, adapter_dir, l, n_items);
    const char *prev = NULL;
    for (size_t i = 0; rc == 0 && i < zs_st_count(st); i++) {
        const char *f = zs_st_at(st, i)->file;
        int seen = prev && !strcmp(prev, f);
        for (size_t j = 0; !seen && j < i; j++) seen = !strcmp(zs_st_at(st, j)->file, f);
        prev = f;
        if (!seen) rc = write_shard(f, tmp, items, n_items, l);
    }
    if (rc == 0) rc = copy_others(base_dir, tmp);
    if (rc == 0) rc = zs_fsync_dir(tmp);
    if (rc < 0) goto done;

    /* publish */
    int moved = 0;
    if (present) {
        if (is_dir(old) && (rc = remove_ours(old)) < 0) goto done;
        if (is_dir(old)) {
            rc = zs_err(ZS_EINVAL, "%s is in the way (it holds a subdirectory); remove it", old);
            goto done;
        }
        if (rename(out_dir, old) != 0) {
            rc = zs_err(zs_errno_code(errno), "%s: cannot move aside to %s: %s", out_dir, old, strerror(errno));
            goto done;
        }
        moved = 1;
    }
    if (rename(tmp, out_dir) != 0) {
        rc = zs_err(zs_errno_code(errno), "%s: cannot rename to %s: %s", tmp, out_dir, strerror(errno));
        if (moved) (void)rename(old, out_dir);
        goto done;
    }
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", out_dir);
    char *sl = strrchr(parent, '/');
    (void)zs_fsync_dir(sl ? (sl == parent ? "/" : (*sl = 0, parent)) : ".");
    if (moved) (void)remove_ours(old); /* a failure here leaves only a stale copy, named in the log */
    zs_log_debug("export --merge: %d tensors merged (r %d, scale %g) -> %s", n_items, zs_lora_get_params(l)->r,
                (double)zs_lora_scale(l), out_dir);
done:
    if (rc < 0 && is_dir(tmp) && has_file(tmp, MERGE_MARKER)) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zs_errmsg());
        (void)remove_ours(tmp);
        zs_err(rc, "%s", msg); /* keep the first error's message */
    }
    free(items);
    zs_st_close(st);
    zs_lora_free(l);
    zs_model_free(m);
    return rc;
}
