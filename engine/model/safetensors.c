/* safetensors.c — safetensors reader: opens a checkpoint file or directory (single file or
 * shards + model.safetensors.index.json), mmaps each file read-only, validates every header
 * entry (dtype, shape, offsets, overlaps) with overflow-checked arithmetic, and serves tensors
 * by name through a hash table. See safetensors.h for ownership and thread-safety. */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* 100 MB: anything larger is absurd */
#define ST_MAX_INDEX ((off_t)256 * 1024 * 1024)

typedef struct {
    char *path;
    uint8_t *map;
    size_t size;
    uint64_t header_len;
    int64_t mtime_sec, mtime_nsec;
} st_file;

struct zs_st_set {
    char *origin; /* directory (or file) the set was opened from, for messages */
    st_file *files;
    size_t nfiles, files_cap;
    zs_st_tensor *t;
    size_t n, t_cap;
    size_t *slots; /* open addressing: tensor index + 1, 0 = empty */
    size_t slot_mask;
};

/* ---------- small helpers ---------- */

static char *st_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

static uint64_t st_fnv(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define ST_FNV_INIT 0xcbf29ce484222325ULL

static void st_fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

static int st_errno_code(int e) {
    if (e == ENOENT || e == ENOTDIR) return ZS_ENOTFOUND;
    if (e == EACCES || e == EPERM) return ZS_EPERM;
    if (e == ENOMEM) return ZS_ENOMEM;
    return ZS_EIO;
}

/* Strict safetensors dtype names (zs_dtype_parse also accepts torch spellings). */
static int st_dtype(const char *s, zs_dtype *out) {
    if (!strcmp(s, "F32")) *out = ZS_F32;
    else if (!strcmp(s, "F16")) *out = ZS_F16;
    else if (!strcmp(s, "BF16")) *out = ZS_BF16;
    else return ZS_EUNSUPPORTED;
    return 0;
}

static zs_st_set *st_new(const char *origin) {
    zs_st_set *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->origin = strdup(origin);
    if (!s->origin) {
        free(s);
        return NULL;
    }
    return s;
}

void zs_st_close(zs_st_set *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) free((void *)s->t[i].name);
    for (size_t i = 0; i < s->nfiles; i++) {
        if (s->files[i].map) munmap(s->files[i].map, s->files[i].size);
        free(s->files[i].path);
    }
    free(s->files);
    free(s->t);
    free(s->slots);
    free(s->origin);
    free(s);
}

/* ---------- one file ---------- */

/* Opens, checks and maps path as file number s->nfiles. */
static int st_map(zs_st_set *s, const char *path) {
    if (s->nfiles == s->files_cap) {
        size_t cap = s->files_cap ? s->files_cap * 2 : 4;
        st_file *nf = realloc(s->files, cap * sizeof *nf);
        if (!nf) return zs_err(ZS_ENOMEM, "%s: out of memory", path);
        s->files = nf;
        s->files_cap = cap;
    }
    st_file *f = &s->files[s->nfiles];
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return zs_err(ZS_ENOMEM, "%s: out of memory", path);
    s->nfiles++; /* from here zs_st_close frees it */

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zs_err(st_errno_code(errno), "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return zs_err(ZS_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return zs_err(ZS_EFORMAT, "%s: not a regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return zs_err(ZS_EFORMAT,
                      "%s: file too short (%lld bytes) to be safetensors: it needs at least the "
                      "8-byte header length", path, (long long)st.st_size);
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return zs_err(ZS_ERANGE, "%s: file too large to map", path);
    }
    f->size = (size_t)st.st_size;
    f->mtime_sec = (int64_t)st.st_mtim.tv_sec;
    f->mtime_nsec = (int64_t)st.st_mtim.tv_nsec;
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) {
        f->size = 0;
        return zs_err(st_errno_code(e), "%s: cannot mmap: %s", path, strerror(e));
    }
    f->map = m;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | f->map[i];
    if (hl > (uint64_t)(f->size - 8))
        return zs_err(ZS_EFORMAT,
                      "%s: header length %" PRIu64 " is larger than the file (%zu bytes): "
                      "truncated or not a safetensors file", path, hl, f->size);
    if (hl > ST_MAX_HEADER)
        return zs_err(ZS_EFORMAT,
                      "%s: header length %" PRIu64 " is absurd (over 100 MB): not a safetensors "
                      "file", path, hl);
    if (hl < 2)
        return zs_err(ZS_EFORMAT, "%s: header length %" PRIu64 " is too small for a JSON header",
                      path, hl);
    f->header_len = hl;
    return 0;
}

static int st_push(zs_st_set *s, const zs_st_tensor *t) {
    if (s->n == s->t_cap) {
        size_t cap = s->t_cap ? s->t_cap * 2 : 64;
        zs_st_tensor *nt = realloc(s->t, cap * sizeof *nt);
        if (!nt) return ZS_ENOMEM;
        s->t = nt;
        s->t_cap = cap;
    }
    s->t[s->n++] = *t;
    return 0;
}

/* Validates one header entry; fills t (except name) on success. */
static int st_entry(const st_file *f, const char *name, json_t *v, zs_st_tensor *t) {
    const char *path = f->path;
    if (!json_is_object(v))
        return zs_err(ZS_EFORMAT, "%s: header entry for tensor '%s' is not a JSON object", path,
                      name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!jd) return zs_err(ZS_EFORMAT, "%s: tensor '%s' has no 'dtype'", path, name);
    if (!json_is_string(jd))
        return zs_err(ZS_EFORMAT, "%s: tensor '%s': 'dtype' is not a string", path, name);
    if (!js) return zs_err(ZS_EFORMAT, "%s: tensor '%s' has no 'shape'", path, name);
    if (!json_is_array(js))
        return zs_err(ZS_EFORMAT, "%s: tensor '%s': 'shape' is not an array", path, name);
    if (!jo) return zs_err(ZS_EFORMAT, "%s: tensor '%s' has no 'data_offsets'", path, name);
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return zs_err(ZS_EFORMAT, "%s: tensor '%s': 'data_offsets' is not an array of 2 integers",
                      path, name);

    zs_dtype dt;
    if (st_dtype(json_string_value(jd), &dt) < 0)
        return zs_err(ZS_EUNSUPPORTED,
                      "%s: tensor '%s' has unsupported dtype '%s' (supported: F32, F16, BF16)",
                      path, name, json_string_value(jd));

    size_t nd = json_array_size(js);
    if (nd > 4)
        return zs_err(ZS_EUNSUPPORTED, "%s: tensor '%s' has %zu dimensions (at most 4 supported)",
                      path, name, nd);
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = (int)nd;
    size_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d))
            return zs_err(ZS_EFORMAT, "%s: tensor '%s': shape[%zu] is not an integer", path, name,
                          i);
        json_int_t x = json_integer_value(d);
        if (x < 0)
            return zs_err(ZS_EFORMAT, "%s: tensor '%s': shape[%zu] is negative (%lld)", path,
                          name, i, (long long)x);
        t->shape[i] = (int64_t)x;
        if ((unsigned long long)x > SIZE_MAX || zs_mul_size(numel, (size_t)x, &numel) < 0)
            return zs_err(ZS_EFORMAT, "%s: tensor '%s': shape is too large", path, name);
    }
    size_t nbytes;
    if (zs_mul_size(numel, zs_dtype_size(dt), &nbytes) < 0)
        return zs_err(ZS_EFORMAT, "%s: tensor '%s': shape is too large", path, name);

    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_integer(jb) || !json_is_integer(je))
        return zs_err(ZS_EFORMAT, "%s: tensor '%s': 'data_offsets' is not an array of 2 integers",
                      path, name);
    json_int_t b = json_integer_value(jb), e = json_integer_value(je);
    uint64_t data_size = (uint64_t)f->size - 8 - f->header_len;
    if (b < 0 || e < b)
        return zs_err(ZS_EFORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] are invalid", path,
                      name, (long long)b, (long long)e);
    if ((uint64_t)e > data_size)
        return zs_err(ZS_EFORMAT,
                      "%s: tensor '%s': data_offsets [%lld, %lld] out of range of the data section "
                      "(%" PRIu64 " bytes): file truncated?", path, name, (long long)b,
                      (long long)e, data_size);
    if ((uint64_t)(e - b) != (uint64_t)nbytes) {
        char sh[128];
        st_fmt_shape(sh, sizeof sh, t->ndim, t->shape);
        return zs_err(ZS_EFORMAT,
                      "%s: tensor '%s': data_offsets [%lld, %lld] hold %lld bytes but shape %s of "
                      "%s needs %zu (size mismatch)", path, name, (long long)b, (long long)e,
                      (long long)(e - b), sh, zs_dtype_name(dt), nbytes);
    }
    t->data = f->map + 8 + f->header_len + (size_t)b;
    t->nbytes = nbytes;
    t->file = f->path;
    return 0;
}

static int st_cmp_data(const void *a, const void *b) {
    const zs_st_tensor *x = a, *y = b;
    uintptr_t p = (uintptr_t)x->data, q = (uintptr_t)y->data;
    if (p != q) return p < q ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Maps path and appends its tensors (sorted by offset, overlaps rejected). */
static int st_add_file(zs_st_set *s, const char *path) {
    int rc = st_map(s, path);
    if (rc < 0) return rc;
    st_file *f = &s->files[s->nfiles - 1];
    json_error_t je;
    json_t *root = json_loadb((const char *)f->map + 8, (size_t)f->header_len,
                              JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return zs_err(ZS_EFORMAT, "%s: header is not valid JSON (line %d, column %d: %s)", path,
                      je.line, je.column, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return zs_err(ZS_EFORMAT, "%s: header is not a JSON object", path);
    }
    size_t first = s->n;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) continue;
        zs_st_tensor t;
        rc = st_entry(f, key, v, &t);
        if (rc < 0) break;
        t.name = strdup(key);
        if (!t.name || st_push(s, &t) < 0) {
            free((void *)t.name);
            rc = zs_err(ZS_ENOMEM, "%s: out of memory", path);
            break;
        }
    }
    json_decref(root);
    if (rc < 0) return rc;
    size_t cnt = s->n - first;
    if (cnt > 1) qsort(s->t + first, cnt, sizeof *s->t, st_cmp_data);
    const uint8_t *base = f->map + 8 + f->header_len;
    for (size_t i = first + 1; i < s->n; i++) {
        const zs_st_tensor *a = &s->t[i - 1], *b = &s->t[i];
        size_t ab = (size_t)((const uint8_t *)a->data - base),
               bb = (size_t)((const uint8_t *)b->data - base);
        if (a->nbytes && b->nbytes && ab + a->nbytes > bb)
            return zs_err(ZS_EFORMAT,
                          "%s: tensors '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap in the data "
                          "section", path, a->name, ab, ab + a->nbytes, b->name, bb,
                          bb + b->nbytes);
    }
    return 0;
}

/* Builds the name hash; rejects duplicate names (possible only across shards). */
static int st_index(zs_st_set *s) {
    size_t cap = 16;
    while (cap < s->n * 2) {
        if (cap > SIZE_MAX / 4) return zs_err(ZS_ENOMEM, "%s: too many tensors", s->origin);
        cap *= 2;
    }
    s->slots = calloc(cap, sizeof *s->slots);
    if (!s->slots) return zs_err(ZS_ENOMEM, "%s: out of memory", s->origin);
    s->slot_mask = cap - 1;
    for (size_t i = 0; i < s->n; i++) {
        const char *nm = s->t[i].name;
        size_t h = (size_t)st_fnv(ST_FNV_INIT, nm, strlen(nm)) & s->slot_mask;
        while (s->slots[h]) {
            const zs_st_tensor *o = &s->t[s->slots[h] - 1];
            if (!strcmp(o->name, nm))
                return zs_err(ZS_EFORMAT, "%s: tensor '%s' appears twice: in %s and in %s",
                              s->origin, nm, o->file, s->t[i].file);
            h = (h + 1) & s->slot_mask;
        }
        s->slots[h] = i + 1;
    }
    return 0;
}

int zs_st_open_file(const char *path, zs_st_set **out) {
    if (!path || !out) return zs_err(ZS_EINVAL, "zs_st_open_file: NULL argument");
    zs_st_set *s = st_new(path);
    if (!s) return zs_err(ZS_ENOMEM, "%s: out of memory", path);
    int rc = st_add_file(s, path);
    if (rc == 0) rc = st_index(s);
    if (rc < 0) {
        zs_st_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* ---------- directories ---------- */

/* Appends src to the NUL-terminated buf, truncating. */
static void st_append(char *buf, size_t cap, const char *src) {
    size_t a = strlen(buf), b = strlen(src);
    if (a + 1 >= cap) return;
    if (b > cap - 1 - a) b = cap - 1 - a;
    memcpy(buf + a, src, b);
    buf[a + b] = 0;
}

static int st_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int st_cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int st_open_index(zs_st_set *s, const char *dir, const char *ipath) {
    struct stat st;
    if (stat(ipath, &st) == 0 && st.st_size > ST_MAX_INDEX)
        return zs_err(ZS_EFORMAT, "%s: index file is absurdly large (%lld bytes)", ipath,
                      (long long)st.st_size);
    json_error_t je;
    json_t *root = json_load_file(ipath, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return zs_err(ZS_EFORMAT, "%s: not valid JSON (line %d, column %d: %s)", ipath, je.line,
                      je.column, je.text);
    int rc = 0;
    char **shards = NULL;
    size_t nshards = 0;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(root)) {
        rc = zs_err(ZS_EFORMAT, "%s: not a JSON object", ipath);
        goto done;
    }
    if (!wm) {
        rc = zs_err(ZS_EFORMAT, "%s: 'weight_map' missing", ipath);
        goto done;
    }
    if (!json_is_object(wm)) {
        rc = zs_err(ZS_EFORMAT, "%s: 'weight_map' is not a JSON object", ipath);
        goto done;
    }
    if (json_object_size(wm) == 0) {
        rc = zs_err(ZS_EFORMAT, "%s: 'weight_map' is empty", ipath);
        goto done;
    }
    shards = calloc(json_object_size(wm), sizeof *shards);
    if (!shards) {
        rc = zs_err(ZS_ENOMEM, "%s: out of memory", ipath);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *fn = json_is_string(v) ? json_string_value(v) : NULL;
        if (!fn || !*fn || strchr(fn, '/') || !strcmp(fn, ".") || !strcmp(fn, "..")) {
            rc = zs_err(ZS_EFORMAT, "%s: weight_map entry for tensor '%s' is not a plain file name",
                        ipath, key);
            goto done;
        }
        size_t k = 0;
        while (k < nshards && strcmp(shards[k], fn)) k++;
        if (k == nshards) shards[nshards++] = (char *)fn; /* borrowed from root */
    }
    qsort(shards, nshards, sizeof *shards, st_cmp_str);
    for (size_t k = 0; k < nshards; k++) {
        char *p = st_join(dir, shards[k]);
        if (!p) {
            rc = zs_err(ZS_ENOMEM, "%s: out of memory", ipath);
            goto done;
        }
        rc = st_add_file(s, p);
        free(p);
        if (rc == ZS_ENOTFOUND) {
            zs_err_prefix(rc, "%s: shard file '%s' listed in the index is missing", ipath,
                          shards[k]);
            goto done;
        }
        if (rc < 0) goto done;
    }
    rc = st_index(s);
    if (rc < 0) goto done;
    json_object_foreach(wm, key, v) {
        const char *fn = json_string_value(v);
        const zs_st_tensor *t = zs_st_find(s, key);
        const char *tf = t ? strrchr(t->file, '/') : NULL;
        tf = tf ? tf + 1 : t ? t->file : NULL;
        if (!t || strcmp(tf, fn)) {
            rc = zs_err(ZS_EFORMAT, "%s: tensor '%s' is listed in the index for shard '%s' but "
                        "absent from it%s%s", ipath, key, fn, t ? "; it is in " : "",
                        t ? t->file : "");
            goto done;
        }
    }
done:
    free(shards);
    json_decref(root);
    return rc;
}

int zs_st_open_dir(const char *dir, zs_st_set **out) {
    if (!dir || !out) return zs_err(ZS_EINVAL, "zs_st_open_dir: NULL argument");
    struct stat st;
    if (stat(dir, &st) != 0)
        return zs_err(st_errno_code(errno), "%s: cannot open model directory: %s", dir,
                      strerror(errno));
    if (!S_ISDIR(st.st_mode)) return zs_err(ZS_EINVAL, "%s: not a directory", dir);

    zs_st_set *s = st_new(dir);
    if (!s) return zs_err(ZS_ENOMEM, "%s: out of memory", dir);
    int rc = 0;
    char *single = st_join(dir, "model.safetensors");
    char *index = st_join(dir, "model.safetensors.index.json");
    char *found = NULL;
    if (!single || !index) {
        rc = zs_err(ZS_ENOMEM, "%s: out of memory", dir);
    } else if (st_is_file(single)) {
        rc = st_add_file(s, single);
        if (rc == 0) rc = st_index(s);
    } else if (st_is_file(index)) {
        rc = st_open_index(s, dir, index);
    } else {
        DIR *d = opendir(dir);
        if (!d) {
            rc = zs_err(st_errno_code(errno), "%s: cannot read directory: %s", dir,
                        strerror(errno));
        } else {
            size_t count = 0;
            char names[256] = "";
            struct dirent *de;
            while ((de = readdir(d))) {
                size_t l = strlen(de->d_name);
                if (l <= 12 || strcmp(de->d_name + l - 12, ".safetensors")) continue;
                char *p = st_join(dir, de->d_name);
                if (!p) {
                    rc = zs_err(ZS_ENOMEM, "%s: out of memory", dir);
                    break;
                }
                if (!st_is_file(p)) {
                    free(p);
                    continue;
                }
                count++;
                st_append(names, sizeof names, count > 1 ? ", " : "");
                st_append(names, sizeof names, de->d_name);
                free(found);
                found = p;
            }
            closedir(d);
            if (rc == 0 && count == 0)
                rc = zs_err(ZS_ENOTFOUND,
                            "%s: no checkpoint found (no model.safetensors, "
                            "model.safetensors.index.json or other *.safetensors file)", dir);
            else if (rc == 0 && count > 1)
                rc = zs_err(ZS_EFORMAT,
                            "%s: %zu .safetensors files (%s) but no model.safetensors.index.json "
                            "to say how they fit together", dir, count, names);
            else if (rc == 0) {
                rc = st_add_file(s, found);
                if (rc == 0) rc = st_index(s);
            }
        }
    }
    free(found);
    free(single);
    free(index);
    if (rc < 0) {
        zs_st_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* ---------- queries ---------- */

size_t zs_st_count(const zs_st_set *s) { return s ? s->n : 0; }

const zs_st_tensor *zs_st_at(const zs_st_set *s, size_t i) {
    return s && i < s->n ? &s->t[i] : NULL;
}

const zs_st_tensor *zs_st_find(const zs_st_set *s, const char *name) {
    if (!s || !name || !s->slots) return NULL;
    size_t h = (size_t)st_fnv(ST_FNV_INIT, name, strlen(name)) & s->slot_mask;
    while (s->slots[h]) {
        const zs_st_tensor *t = &s->t[s->slots[h] - 1];
        if (!strcmp(t->name, name)) return t;
        h = (h + 1) & s->slot_mask;
    }
    return NULL;
}

int zs_st_get(const zs_st_set *s, const char *name, int ndim, const int64_t *shape,
              const zs_st_tensor **out) {
    if (!s || !name || !out) return zs_err(ZS_EINVAL, "zs_st_get: NULL argument");
    const zs_st_tensor *t = zs_st_find(s, name);
    if (!t) return zs_err(ZS_ENOTFOUND, "%s: tensor '%s' not found", s->origin, name);
    if (shape) {
        int ok = ndim == t->ndim;
        for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
        if (!ok) {
            char a[128], b[128];
            st_fmt_shape(a, sizeof a, t->ndim, t->shape);
            if (ndim < 0 || ndim > 4) snprintf(b, sizeof b, "%d dimensions", ndim);
            else st_fmt_shape(b, sizeof b, ndim, shape);
            return zs_err(ZS_ESHAPE, "%s: tensor '%s' has shape %s, expected %s", t->file, name,
                          a, b);
        }
    }
    *out = t;
    return 0;
}

void zs_st_release(const zs_st_set *s, const zs_st_tensor *t) {
    if (!s || !t || !t->nbytes) return;
    for (size_t i = 0; i < s->nfiles; i++) {
        const st_file *f = &s->files[i];
        uintptr_t lo = (uintptr_t)f->map, p = (uintptr_t)t->data;
        if (!f->map || p < lo || p - lo > f->size || t->nbytes > f->size - (p - lo)) continue;
        long pg = sysconf(_SC_PAGESIZE);
        uintptr_t mask = (uintptr_t)(pg > 0 ? pg : 4096) - 1;
        uintptr_t a = p & ~mask, e = p + t->nbytes;
        /* Private, never-written, read-only pages: dropping them is always safe (they are
         * re-read from the file), so rounding outward over neighbours only costs a refault. */
        madvise((void *)a, e - a, MADV_DONTNEED);
        return;
    }
}

int zs_st_fingerprint(const zs_st_set *s, char *buf, size_t cap) {
    if (!s || !buf || cap < 17)
        return zs_err(ZS_EINVAL, "zs_st_fingerprint: buffer needs at least 17 bytes");
    uint64_t h = ST_FNV_INIT;
    for (size_t i = 0; i < s->nfiles; i++) {
        const st_file *f = &s->files[i];
        const char *base = strrchr(f->path, '/');
        base = base ? base + 1 : f->path;
        h = st_fnv(h, base, strlen(base) + 1);
        uint64_t v[4] = {(uint64_t)f->size, (uint64_t)f->mtime_sec, (uint64_t)f->mtime_nsec,
                         f->header_len};
        for (int k = 0; k < 4; k++) {
            uint8_t le[8];
            for (int j = 0; j < 8; j++) le[j] = (uint8_t)(v[k] >> (8 * j));
            h = st_fnv(h, le, 8);
        }
        h = st_fnv(h, f->map + 8, (size_t)f->header_len);
    }
    snprintf(buf, cap, "%016" PRIx64, h);
    return 0;
}
