/* pinned.c — the pinned host staging pool: one mmap'd, 4096-aligned region cut into slots,
 * optionally registered with a device backend through hooks, with thread-safe acquire/release. */
#define _GNU_SOURCE
#include "pinned.h"

#include "common.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#define ZS_PINNED_ALIGN 4096

struct zs_pinned {
    unsigned char *base;
    size_t slot_bytes; /* rounded up to 4096 */
    size_t total;
    int n;
    int n_free;
    int *free_stack;       /* indices of free slots, n_free valid entries */
    unsigned char *held;   /* held[i] = 1 while slot i is acquired */
    zs_pinned_hooks hooks; /* hooks used at registration (for unreg at free) */
    int registered;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static pthread_mutex_t zs_hooks_mu = PTHREAD_MUTEX_INITIALIZER;
static zs_pinned_hooks zs_hooks; /* zero: no hooks */

void zs_pinned_set_hooks(const zs_pinned_hooks *h) {
    pthread_mutex_lock(&zs_hooks_mu);
    if (h) zs_hooks = *h;
    else memset(&zs_hooks, 0, sizeof zs_hooks);
    pthread_mutex_unlock(&zs_hooks_mu);
}

int zs_pinned_init(size_t slot_bytes, int n_slots, zs_pinned **out) {
    if (!out) return zs_err(ZS_EINVAL, "pinned pool: out is NULL");
    if (slot_bytes == 0 || n_slots <= 0)
        return zs_err(ZS_EINVAL, "pinned pool: need slot_bytes > 0 and n_slots > 0 (got %zu, %d)",
                      slot_bytes, n_slots);
    if (slot_bytes > SIZE_MAX - ZS_PINNED_ALIGN)
        return zs_err(ZS_ERANGE, "pinned pool: slot size %zu too large", slot_bytes);
    size_t sb = ZS_ALIGN_UP(slot_bytes, (size_t)ZS_PINNED_ALIGN), total;
    if (zs_mul_size(sb, (size_t)n_slots, &total) < 0)
        return zs_err(ZS_ERANGE, "pinned pool: %d slots of %zu bytes overflow", n_slots, sb);

    zs_pinned *p = calloc(1, sizeof *p);
    if (!p) return zs_err(ZS_ENOMEM, "pinned pool: out of memory");
    p->free_stack = malloc((size_t)n_slots * sizeof *p->free_stack);
    p->held = calloc((size_t)n_slots, 1);
    if (!p->free_stack || !p->held) {
        free(p->free_stack);
        free(p->held);
        free(p);
        return zs_err(ZS_ENOMEM, "pinned pool: out of memory");
    }
    int flags = MAP_ANONYMOUS | MAP_PRIVATE;
    const char *np = getenv("ZS_PINNED_NO_POPULATE");
    if (!(np && *np && strcmp(np, "0") != 0)) flags |= MAP_POPULATE;
    void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (base == MAP_FAILED) {
        int e = errno;
        free(p->free_stack);
        free(p->held);
        free(p);
        return zs_err(e == ENOMEM ? ZS_ENOMEM : ZS_EIO,
                      "pinned pool: mmap of %zu bytes (%d slots x %zu) failed: %s", total, n_slots,
                      sb, strerror(e));
    }
    p->base = base;
    p->slot_bytes = sb;
    p->total = total;
    p->n = n_slots;
    p->n_free = n_slots;
    /* Stack order so that slot 0 is handed out first. */
    for (int i = 0; i < n_slots; i++) p->free_stack[i] = n_slots - 1 - i;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);

    pthread_mutex_lock(&zs_hooks_mu);
    p->hooks = zs_hooks;
    pthread_mutex_unlock(&zs_hooks_mu);
    if (p->hooks.reg) {
        int rc = p->hooks.reg(p->base, p->total);
        if (rc != 0) {
            int code = rc < 0 ? rc : ZS_EDEVICE;
            p->hooks.unreg = NULL; /* nothing to unregister */
            zs_pinned_free(p);
            return zs_err_prefix(code, "pinned pool: registering %zu bytes failed", total);
        }
        p->registered = 1;
    }
    *out = p;
    return 0;
}

void zs_pinned_free(zs_pinned *p) {
    if (!p) return;
    if (p->registered && p->hooks.unreg) p->hooks.unreg(p->base);
    munmap(p->base, p->total);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->free_stack);
    free(p->held);
    free(p);
}

int zs_pinned_count(const zs_pinned *p) { return p ? p->n : 0; }

size_t zs_pinned_slot_bytes(const zs_pinned *p) { return p ? p->slot_bytes : 0; }

void *zs_pinned_slot(const zs_pinned *p, int i) {
    if (!p || i < 0 || i >= p->n) return NULL;
    return p->base + (size_t)i * p->slot_bytes;
}

int zs_pinned_acquire(zs_pinned *p, int wait, int *slot) {
    if (!p || !slot) return zs_err(ZS_EINVAL, "pinned pool: NULL argument to acquire");
    pthread_mutex_lock(&p->mu);
    while (p->n_free == 0) {
        if (!wait) {
            pthread_mutex_unlock(&p->mu);
            return zs_err(ZS_EBUSY, "pinned pool: all %d slots are in use", p->n);
        }
        pthread_cond_wait(&p->cv, &p->mu);
    }
    int s = p->free_stack[--p->n_free];
    ZS_ASSERT(!p->held[s]);
    p->held[s] = 1;
    pthread_mutex_unlock(&p->mu);
    *slot = s;
    return 0;
}

void zs_pinned_release(zs_pinned *p, int slot) {
    ZS_ASSERT(p && slot >= 0 && slot < p->n);
    pthread_mutex_lock(&p->mu);
    ZS_ASSERT(p->held[slot]); /* releasing a slot that is not held: a caller bug */
    p->held[slot] = 0;
    p->free_stack[p->n_free++] = slot;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

int zs_pinned_free_count(zs_pinned *p) {
    if (!p) return 0;
    pthread_mutex_lock(&p->mu);
    int n = p->n_free;
    pthread_mutex_unlock(&p->mu);
    return n;
}
