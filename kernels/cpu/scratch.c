/* scratch.c — per-thread scratch buffers of the CPU kernels (scratch.h), kept under a pthread
 * key so that a thread's buffers are freed when it exits (rank threads come and go). */
#include "scratch.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    void *p[ZS_SCRATCH_SLOTS];
    size_t cap[ZS_SCRATCH_SLOTS];
} scratch_set;

static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void set_free(void *v) {
    scratch_set *s = v;
    for (int i = 0; i < ZS_SCRATCH_SLOTS; i++) free(s->p[i]);
    free(s);
}
static void key_init(void) { (void)pthread_key_create(&g_key, set_free); }

void *zs_scratch_get(int slot, size_t n) {
    if (slot < 0 || slot >= ZS_SCRATCH_SLOTS) return NULL;
    pthread_once(&g_once, key_init);
    scratch_set *s = pthread_getspecific(g_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) return NULL;
        if (pthread_setspecific(g_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap[slot] < n) {
        size_t cap = n + n / 2;
        void *p = NULL;
        if (posix_memalign(&p, 64, cap) != 0) return NULL;
        free(s->p[slot]);
        s->p[slot] = p;
        s->cap[slot] = cap;
    }
    return s->p[slot];
}
