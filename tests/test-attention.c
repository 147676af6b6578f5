/* test-attention.c — the CPU attention over the paged KV cache (kernels/cpu/attention.c):
 * random q/k/v in a real zs_kvcache with four sequences of 1, 17, 300 and 1030 positions (block
 * tables interleaved), GQA ratios 1 and 4, head dims 64, 128, 72 and 8:
 *   - within tolerance of a double-precision reference;
 *   - BIT FOR BIT equal to a scalar loop of the documented order (attention.h), so a change of
 *     the order fails here;
 *   - batch invariance, bitwise: each token computed alone equals the same token in the mixed
 *     batch;
 *   - the generic and the AVX2+FMA kernels give the same bits (when the CPU has AVX2);
 *   - the same checks (but the double reference) again in child processes with ZS_THREADS=1, 2 and 3, which also check that
 *     the batch's output hashes to the parent's;
 *   - errors for bad shapes. */
#include "attention.h"
#include "common.h"
#include "kvcache.h"
#include "ops.h"
#include "testutil.h"

static uint64_t rng;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53) - 0.5f;
}

#define NSEQ 4
static const int seq_len[NSEQ] = {1, 17, 300, 1030};

/* the documented order, scalar */
static float doc_dot(const float *q, const float *k, int hd) {
    float l[8] = {0};
    int d8 = hd & ~7;
    for (int d = 0; d < d8; d += 8)
        for (int i = 0; i < 8; i++) l[i] = fmaf(q[d + i], k[d + i], l[i]);
    float s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (int d = d8; d < hd; d++) s = fmaf(q[d], k[d], s);
    return s;
}

typedef struct {
    int nh, nkv, hd;
    zs_kvcache *kv;
    zs_att_seq views[NSEQ];
    const float **ptrs;
    int T, *seq, *pos;
    float *q;
} rig;

static void rig_open(rig *r, int nh, int nkv, int hd) {
    memset(r, 0, sizeof *r);
    r->nh = nh; r->nkv = nkv; r->hd = hd;
    int kvd = nkv * hd, nblk = 0;
    for (int s = 0; s < NSEQ; s++) nblk += (seq_len[s] + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    int rc = zs_kv_init(2, kvd, nblk + 3, NSEQ + 1, 1040, &r->kv);
    CHECK(rc == 0, "kv init: %s", zs_errmsg());
    if (rc) exit(1);
    int slot;
    zs_kv_seq_open(r->kv, &slot); /* an unused slot first: the sequences are not slot 0.. */
    int ids[NSEQ];
    for (int s = 0; s < NSEQ; s++) zs_kv_seq_open(r->kv, &ids[s]);
    /* reserve a block at a time, round robin, so the block tables interleave */
    for (int len = ZS_KV_BLOCK;; len += ZS_KV_BLOCK) {
        int more = 0;
        for (int s = 0; s < NSEQ; s++)
            if (zs_kv_seq_len(r->kv, ids[s]) < seq_len[s]) {
                CHECK(zs_kv_seq_reserve(r->kv, ids[s], ZS_MIN(len, seq_len[s])) == 0, "reserve");
                more = 1;
            }
        if (!more) break;
    }
    r->ptrs = calloc((size_t)2 * nblk, sizeof *r->ptrs);
    int used = 0;
    for (int s = 0; s < NSEQ; s++) {
        for (int l = 0; l < 2; l++)
            for (int p = 0; p < seq_len[s]; p++) {
                float *k = zs_kv_k(r->kv, l, ids[s], p), *v = zs_kv_v(r->kv, l, ids[s], p);
                for (int e = 0; e < kvd; e++) { k[e] = 2.0f * frand(); v[e] = frand(); }
            }
        int n = (seq_len[s] + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
        const float **kp = r->ptrs + used, **vp = kp + n;
        for (int j = 0; j < n; j++) {
            kp[j] = zs_kv_k(r->kv, 1, ids[s], j * ZS_KV_BLOCK);
            vp[j] = zs_kv_v(r->kv, 1, ids[s], j * ZS_KV_BLOCK);
        }
        used += 2 * n;
        r->views[s] = (zs_att_seq){kp, vp};
    }
    /* the batch: seq 3's last 40 positions (a prefill chunk), a decode token of each of the
     * others, a few scattered positions, in mixed order */
    r->seq = malloc(64 * sizeof(int));
    r->pos = malloc(64 * sizeof(int));
    int T = 0;
    r->seq[T] = 2; r->pos[T++] = 299;
    for (int p = 990; p < 1030; p++) { r->seq[T] = 3; r->pos[T++] = p; }
    r->seq[T] = 0; r->pos[T++] = 0;
    r->seq[T] = 1; r->pos[T++] = 16;
    r->seq[T] = 3; r->pos[T++] = 0;
    r->seq[T] = 3; r->pos[T++] = 513;
    r->seq[T] = 2; r->pos[T++] = 15;
    r->seq[T] = 2; r->pos[T++] = 16;
    r->seq[T] = 1; r->pos[T++] = 7;
    r->T = T;
    size_t qd = (size_t)nh * hd;
    r->q = malloc((size_t)T * qd * 4);
    for (size_t i = 0; i < (size_t)T * qd; i++) r->q[i] = 2.0f * frand();
}

static void rig_close(rig *r) {
    zs_kv_free(r->kv);
    free(r->ptrs); free(r->seq); free(r->pos); free(r->q);
}

static const float *krow(const rig *r, int s, int j) {
    return r->views[s].k[j / ZS_KV_BLOCK] + (size_t)(j % ZS_KV_BLOCK) * r->nkv * r->hd;
}
static const float *vrow(const rig *r, int s, int j) {
    return r->views[s].v[j / ZS_KV_BLOCK] + (size_t)(j % ZS_KV_BLOCK) * r->nkv * r->hd;
}

static uint64_t hash(const float *x, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < n * 4; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int count_diff(const float *a, const float *b, size_t n) {
    int d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], 4) != 0;
    return d;
}

static uint64_t check_config(int nh, int nkv, int hd, int with_double) {
    rig r;
    rig_open(&r, nh, nkv, hd);
    int T = r.T, group = nh / nkv, kvd = nkv * hd;
    size_t qd = (size_t)nh * hd, n = (size_t)T * qd;
    float *out = malloc(n * 4), *doc = malloc(n * 4), *one = malloc(qd * 4), *alt = malloc(n * 4);
    double maxerr = 0;
    float *p = malloc(1040 * 4);
    double *pd = malloc(1040 * sizeof(double));
    float scale = 1.0f / sqrtf((float)hd);

    int rc = zs_op_attention(out, r.q, T, r.seq, r.pos, r.views, nh, nkv, hd, kvd, ZS_KV_BLOCK, ZS_ATT_AUTO);
    CHECK(rc == 0, "attention: %s", zs_errmsg());

    for (int i = 0; i < T; i++)
        for (int h = 0; h < nh; h++) {
            int s = r.seq[i], P = r.pos[i], kh = h / group;
            const float *q = r.q + (size_t)i * qd + (size_t)h * hd;
            /* documented order */
            for (int j = 0; j <= P; j++) p[j] = doc_dot(q, krow(&r, s, j) + (size_t)kh * hd, hd) * scale;
            zs_op_softmax(p, P + 1);
            float *o = doc + (size_t)i * qd + (size_t)h * hd;
            for (int e = 0; e < hd; e++) {
                float x = 0.0f;
                for (int j = 0; j <= P; j++) x = fmaf(p[j], vrow(&r, s, j)[(size_t)kh * hd + e], x);
                o[e] = x;
            }
            if (!with_double) continue;
            /* double precision */
            double m = -INFINITY, sum = 0;
            for (int j = 0; j <= P; j++) {
                const float *k = krow(&r, s, j) + (size_t)kh * hd;
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)q[e] * k[e];
                pd[j] = d / sqrt((double)hd);
                m = pd[j] > m ? pd[j] : m;
            }
            for (int j = 0; j <= P; j++) sum += (pd[j] = exp(pd[j] - m));
            for (int e = 0; e < hd; e++) {
                double x = 0;
                for (int j = 0; j <= P; j++) x += pd[j] / sum * vrow(&r, s, j)[(size_t)kh * hd + e];
                double err = fabs(x - out[(size_t)i * qd + (size_t)h * hd + e]);
                maxerr = err > maxerr ? err : maxerr;
            }
        }
    if (with_double) {
        fprintf(stderr, "nh %d nkv %d hd %d: max |out - double reference| %.3g\n", nh, nkv, hd, maxerr);
        CHECK(maxerr < 1e-6, "nh %d nkv %d hd %d: max |out - double reference| %.3g", nh, nkv, hd, maxerr);
    }
    int dd = count_diff(out, doc, n);
    CHECK(dd == 0, "nh %d nkv %d hd %d: %d of %zu elements differ from the documented order", nh, nkv, hd, dd, n);

    /* each token alone */
    int bad = 0;
    for (int i = 0; i < T; i++) {
        rc = zs_op_attention(one, r.q + (size_t)i * qd, 1, r.seq + i, r.pos + i, r.views, nh, nkv, hd, kvd,
                             ZS_KV_BLOCK, ZS_ATT_AUTO);
        bad += rc != 0 || count_diff(one, out + (size_t)i * qd, qd) != 0;
    }
    CHECK(bad == 0, "nh %d nkv %d hd %d: %d of %d tokens alone differ from the batch", nh, nkv, hd, bad, T);
    /* the prefill chunk of seq 3 on its own, in two halves */
    rc = zs_op_attention(alt, r.q + qd, 20, r.seq + 1, r.pos + 1, r.views, nh, nkv, hd, kvd, ZS_KV_BLOCK,
                         ZS_ATT_AUTO);
    rc |= zs_op_attention(alt + 20 * qd, r.q + 21 * qd, 20, r.seq + 21, r.pos + 21, r.views, nh, nkv, hd, kvd,
                          ZS_KV_BLOCK, ZS_ATT_AUTO);
    CHECK(rc == 0 && count_diff(alt, out + qd, 40 * qd) == 0, "nh %d nkv %d hd %d: the chunk in halves", nh,
          nkv, hd);

    /* generic vs AVX2 */
    rc = zs_op_attention(alt, r.q, T, r.seq, r.pos, r.views, nh, nkv, hd, kvd, ZS_KV_BLOCK, ZS_ATT_GENERIC);
    CHECK(rc == 0 && count_diff(alt, out, n) == 0, "nh %d nkv %d hd %d: the generic kernel gives the same bits",
          nh, nkv, hd);
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        rc = zs_op_attention(alt, r.q, T, r.seq, r.pos, r.views, nh, nkv, hd, kvd, ZS_KV_BLOCK, ZS_ATT_AVX2);
        CHECK(rc == 0 && count_diff(alt, out, n) == 0, "nh %d nkv %d hd %d: the AVX2 kernel gives the same bits",
              nh, nkv, hd);
    } else {
        fprintf(stderr, "no AVX2+FMA here: the AVX2 kernel is not compared\n");
    }
    uint64_t hh = hash(out, n);
    free(out); free(doc); free(one); free(alt); free(p); free(pd);
    rig_close(&r);
    return hh;
}

static const int configs[][3] = {{4, 4, 64}, {8, 2, 128}, {16, 4, 64}, {4, 1, 72}, {3, 3, 8}, {4, 1, 12}};
#define NCONF (int)(sizeof configs / sizeof configs[0])

int main(int argc, char **argv) {
    uint64_t h[NCONF];
    for (int c = 0; c < NCONF; c++) {
        rng = 0x9E3779B97F4A7C15ull + (uint64_t)c;
        h[c] = check_config(configs[c][0], configs[c][1], configs[c][2], argc < 2);
    }
    if (argc < 2) {
        rig r;
        rng = 1;
        rig_open(&r, 4, 2, 16);
        float o[64 * 4];
        CHECK_ERR(zs_op_attention(o, r.q, 1, r.seq, r.pos, r.views, 4, 3, 16, 48, ZS_KV_BLOCK, 0), "bad shape");
        CHECK_ERR(zs_op_attention(o, r.q, 1, r.seq, r.pos, r.views, 4, 2, 16, 16, ZS_KV_BLOCK, 0), "bad shape");
        rig_close(&r);
        /* the same bits with 1, 2 and 3 threads */
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        CHECK(n > 0, "readlink /proc/self/exe");
        if (n > 0) {
            self[n] = 0;
            char hs[NCONF * 17 + 1] = "";
            for (int c = 0; c < NCONF; c++) snprintf(hs + c * 17, 18, "%016llx,", (unsigned long long)h[c]);
            const char *threads[] = {"1", "2", "3"};
            for (int i = 0; i < 3; i++) {
                char cmd[4600];
                snprintf(cmd, sizeof cmd, "ZS_THREADS=%s '%s' %s", threads[i], self, hs);
                int rc = system(cmd);
                CHECK(rc == 0, "ZS_THREADS=%s: the same checks and the same bits (exit %d)", threads[i], rc);
            }
        }
    } else {
        for (int c = 0; c < NCONF; c++) {
            char want[18];
            snprintf(want, sizeof want, "%016llx,", (unsigned long long)h[c]);
            CHECK(strncmp(argv[1] + c * 17, want, 17) == 0, "config %d: the output bits of the parent", c);
        }
    }
    return tu_finish(argc < 2 ? "test-attention" : "test-attention (child)");
}
