/* matmul-q8act-pack.h — the packed prefill kernel of the integer matmul path, included by
 * matmul-q8act-x86.h after matmul-q8act-kern.h for each weight format (same KA_* macros).
 * Not a public header.
 *
 * For T >= 4 activation rows, weight rows are taken 8 at a time (a panel) and repacked once
 * per call into a scratch buffer, as ggml's repack.cpp does with its stored blocks: the block
 * values become unsigned bytes (plus PK_UOFF), interleaved four bytes per row, so that one
 * 32-byte load holds the same four values of 8 rows and one vpdpbusd (or maddubs + madd)
 * against four broadcast activation bytes advances 8 rows at once; the scales and mins of the
 * 8 rows sit beside them as vectors. Each output lane is then one row's chain of matmul-q8act-
 * kern.h, and S, the block's exact integer sum, is the same integer however it is formed:
 *   S = Σ_h sc_h · (Σ_{i ∈ h} u_i·q_i − PK_OFF · Σ_{i ∈ h} q_i)     (h: the scale groups)
 * so the results are the row kernel's bits. 2 panels × KA_PT tokens are computed together.
 *
 * KA_DEC adds the decode kernel over the blocks as stored (one activation row: nothing to
 * repack for): one row at a time, 8 blocks at once. */

#if (KA_PACK || KA_DEC) && KA_FMT >= ZS_KA_Q5_K
#error "the packed and decode kernels know Q8_0 .. Q6_K only"
#endif
#define PK_BYTES (KA_FMT == ZS_KA_Q8_0 ? 34 : KA_FMT == ZS_KA_Q4_0 ? 18 : KA_FMT == ZS_KA_Q4_1 ? 20 : \
                  KA_FMT == ZS_KA_Q5_0 ? 22 : KA_FMT == ZS_KA_Q5_1 ? 24 : KA_FMT == ZS_KA_Q4_K ? 144 : 210)
#define PK_NG (KA_FMT == ZS_KA_Q4_K || KA_FMT == ZS_KA_Q6_K ? 8 : 1)
#define PK_K (PK_NG == 8)
#define PK_MIN (KA_FMT == ZS_KA_Q4_1 || KA_FMT == ZS_KA_Q5_1 || KA_FMT == ZS_KA_Q4_K)
/* added to the stored value to make it an unsigned byte, and subtracted back through the sums */
#define PK_UOFF (KA_FMT == ZS_KA_Q8_0 ? 128 : KA_FMT == ZS_KA_Q6_K ? 32 : 0)
#define PK_OFF (KA_FMT == ZS_KA_Q4_0 ? 8 : KA_FMT == ZS_KA_Q5_0 ? 16 : PK_UOFF)
/* a packed block of 8 rows: d[8], m[8] (min formats), sc[16][8] (K: per 16 values), mn[8][8]
 * (Q4_K), then the values: PK_NG groups × 8 four-byte steps × 8 rows × 4 bytes */
#define PK_SC_AT 64
#define PK_MN_AT (PK_SC_AT + (PK_K ? 512 : 0))
#define PK_U_AT (PK_MN_AT + (KA_FMT == ZS_KA_Q4_K ? 256 : 0))
#define PK_BLK (PK_U_AT + PK_NG * 256)
/* the row kernel's offset (Q8_0 and Q6_K unpack to signed values there) and scales */
#define PK_ROFF (KA_FMT == ZS_KA_Q4_0 ? 8 : KA_FMT == ZS_KA_Q5_0 ? 16 : 0)
#define PK_SCALED (KA_FMT == ZS_KA_Q4_K || KA_FMT == ZS_KA_Q6_K)

#if KA_PACK

/* packs rows W[0..7] (rb bytes apart), nsb blocks, into P */
static void KA_NAME(pack)(uint8_t *P, const uint8_t *W, size_t rb, int nsb) {
    for (int sb = 0; sb < nsb; sb++) {
        uint8_t *B = P + (size_t)sb * PK_BLK;
        float *d = (float *)B, *m = (float *)(B + 32);
        int32_t *sc = (int32_t *)(B + PK_SC_AT), *mn = (int32_t *)(B + PK_MN_AT);
        KA_NAME(ctx) c[8];
        for (int r = 0; r < 8; r++) {
            KA_NAME(prep)(W + (size_t)r * rb + (size_t)sb * PK_BYTES, &c[r]);
            d[r] = c[r].d;
            if (PK_MIN) m[r] = c[r].m;
#if KA_FMT == ZS_KA_Q4_K
            for (int h = 0; h < 16; h++) sc[h * 8 + r] = c[r].scv[h >> 1];
            for (int g = 0; g < 8; g++) mn[g * 8 + r] = c[r].mn2[2 * g];
#elif KA_FMT == ZS_KA_Q6_K
            for (int h = 0; h < 16; h++) sc[h * 8 + r] = c[r].scv[(h & 1) * 8 + (h >> 1)];
#endif
        }
        (void)sc;
        (void)mn;
        for (int g = 0; g < PK_NG; g++) {
            __m256i v[8];
            for (int r = 0; r < 8; r++) {
                __m256i w = (__m256i)KA_W(W + (size_t)r * rb + (size_t)sb * PK_BYTES, g);
                v[r] = PK_UOFF ? _mm256_add_epi8(w, _mm256_set1_epi8((char)PK_UOFF)) : w;
            }
            /* 8 rows × 8 four-byte steps -> 8 steps × 8 rows */
            __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
            __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
            __m256i t4 = _mm256_unpacklo_epi32(v[4], v[5]), t5 = _mm256_unpackhi_epi32(v[4], v[5]);
            __m256i t6 = _mm256_unpacklo_epi32(v[6], v[7]), t7 = _mm256_unpackhi_epi32(v[6], v[7]);
            __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
            __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
            __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
            __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
            __m256i *o = (__m256i *)(B + PK_U_AT + (size_t)g * 256);
            _mm256_store_si256(o + 0, _mm256_permute2x128_si256(u0, u4, 0x20));
            _mm256_store_si256(o + 1, _mm256_permute2x128_si256(u1, u5, 0x20));
            _mm256_store_si256(o + 2, _mm256_permute2x128_si256(u2, u6, 0x20));
            _mm256_store_si256(o + 3, _mm256_permute2x128_si256(u3, u7, 0x20));
            _mm256_store_si256(o + 4, _mm256_permute2x128_si256(u0, u4, 0x31));
            _mm256_store_si256(o + 5, _mm256_permute2x128_si256(u1, u5, 0x31));
            _mm256_store_si256(o + 6, _mm256_permute2x128_si256(u2, u6, 0x31));
            _mm256_store_si256(o + 7, _mm256_permute2x128_si256(u3, u7, 0x31));
        }
    }
}

/* NP packed panels (P, PK_BLK·nsb bytes apart) × NT activation rows t.. ; corr: per activation
 * row, the integer subtracted per scale group (−PK_OFF·Σq: one per block of 32, one per 16 for a
 * K-quant), and for Q4_K the sums of 32 */
static inline __attribute__((always_inline)) void KA_NAME(ptile)(float *y, int ldy, const zs_q8a *a, int t,
                                                                 const uint8_t *P, size_t pstride, int nsb,
                                                                 const int32_t *corr, int ncorr, const int NP,
                                                                 const int NT) {
    __m256 acc[2][4][8], mac[2][4][8]; /* the eight chains of each output lane */
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *cr[4];
#pragma GCC unroll 4
    for (int u = 0; u < NT; u++) {
        xq[u] = a->q + (size_t)(t + u) * a->in;
        xd[u] = a->d + (size_t)(t + u) * a->nb;
        cr[u] = corr + (size_t)u * ncorr;
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++)
            for (int l = 0; l < 8; l++) acc[p][u][l] = mac[p][u][l] = _mm256_setzero_ps();
    }
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *B[2];
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) B[p] = P + (size_t)p * pstride + (size_t)sb * PK_BLK;
        __m256i S[2][4];
#if !PK_K
#pragma GCC unroll 4
        for (int u = 0; u < NT; u++) {
            __m256i z = PK_OFF ? _mm256_set1_epi32(cr[u][sb]) : _mm256_setzero_si256();
#pragma GCC unroll 2
            for (int p = 0; p < NP; p++) S[p][u] = z;
        }
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            __m256i w[2];
#pragma GCC unroll 2
            for (int p = 0; p < NP; p++) w[p] = _mm256_load_si256((const __m256i *)(B[p] + PK_U_AT) + c);
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++) {
                int32_t x4;
                memcpy(&x4, xq[u] + (size_t)sb * 32 + 4 * c, 4);
                __m256i bx = _mm256_set1_epi32(x4);
#pragma GCC unroll 2
                for (int p = 0; p < NP; p++) S[p][u] = ZS_AKA(dpbusd)(S[p][u], w[p], bx);
            }
        }
#else
#pragma GCC unroll 4
        for (int u = 0; u < NT; u++)
#pragma GCC unroll 2
            for (int p = 0; p < NP; p++) S[p][u] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            /* the two halves of 16 (Q6_K: a scale and an offset sum each; Q4_K: one scale) */
            __m256i D[2][4];
#pragma GCC unroll 2
            for (int hh = 0; hh < 2; hh++) {
#pragma GCC unroll 4
                for (int u = 0; u < NT; u++) {
                    __m256i z = PK_OFF ? _mm256_set1_epi32(cr[u][sb * 24 + 2 * g + hh]) : _mm256_setzero_si256();
#pragma GCC unroll 2
                    for (int p = 0; p < NP; p++)
                        if (KA_FMT == ZS_KA_Q6_K || hh == 0) D[p][u] = z;
                }
#pragma GCC unroll 4
                for (int c = 4 * hh; c < 4 * hh + 4; c++) {
                    __m256i w[2];
#pragma GCC unroll 2
                    for (int p = 0; p < NP; p++)
                        w[p] = _mm256_load_si256((const __m256i *)(B[p] + PK_U_AT + (size_t)g * 256) + c);
#pragma GCC unroll 4
                    for (int u = 0; u < NT; u++) {
                        int32_t x4;
                        memcpy(&x4, xq[u] + (size_t)sb * 256 + (size_t)g * 32 + 4 * c, 4);
                        __m256i bx = _mm256_set1_epi32(x4);
#pragma GCC unroll 2
                        for (int p = 0; p < NP; p++) D[p][u] = ZS_AKA(dpbusd)(D[p][u], w[p], bx);
                    }
                }
                if (KA_FMT == ZS_KA_Q6_K || hh == 1) {
#pragma GCC unroll 2
                    for (int p = 0; p < NP; p++) {
                        __m256i scv = _mm256_load_si256((const __m256i *)(B[p] + PK_SC_AT) + 2 * g + hh);
#pragma GCC unroll 4
                        for (int u = 0; u < NT; u++) S[p][u] = _mm256_add_epi32(S[p][u], _mm256_mullo_epi32(scv, D[p][u]));
                    }
                }
            }
        }
#endif
#pragma GCC unroll 4
        for (int u = 0; u < NT; u++) {
            __m256 xdv = _mm256_set1_ps(xd[u][sb]);
#pragma GCC unroll 2
            for (int p = 0; p < NP; p++) {
                __m256 dv = _mm256_mul_ps(_mm256_load_ps((const float *)B[p]), xdv);
                __m256 *al = &acc[p][u][sb & 7], *ml = &mac[p][u][sb & 7];
                *al = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(S[p][u]), *al);
                (void)ml;
#if KA_FMT == ZS_KA_Q4_K
                __m256i mv = _mm256_setzero_si256();
                for (int g = 0; g < 8; g++)
                    mv = _mm256_add_epi32(mv, _mm256_mullo_epi32(_mm256_load_si256((const __m256i *)(B[p] + PK_MN_AT) + g),
                                                                 _mm256_set1_epi32(cr[u][sb * 24 + 16 + g])));
                __m256 coef = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(_mm256_load_ps((const float *)(B[p] + 32)), xdv));
                *ml = _mm256_fmadd_ps(coef, _mm256_cvtepi32_ps(mv), *ml);
#elif PK_MIN
                *ml = _mm256_fmadd_ps(_mm256_load_ps((const float *)(B[p] + 32)),
                                      _mm256_set1_ps(a->s[(size_t)(t + u) * a->nb + sb]), *ml);
#endif
            }
        }
    }
#pragma GCC unroll 4
    for (int u = 0; u < NT; u++)
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) {
            __m256 v = ZS_AKA(tree)(acc[p][u]);
#if PK_MIN
            v = _mm256_add_ps(v, ZS_AKA(tree)(mac[p][u]));
#endif
            _mm256_storeu_ps(y + (size_t)u * ldy + 8 * p, v);
        }
    (void)mac;
    (void)cr;
}

/* the rows of W in whole panels (returns how many: a multiple of 8; 0 when the scratch buffer
 * cannot be had) for the activation rows t0 .. t0+T-1 */
static int KA_NAME(packed)(float *y, int ldy, const zs_q8a *a, int t0, int T, const uint8_t *W, int R) {
    int nsb = a->nb, R8 = R & ~7;
    if (R8 == 0) return 0;
    size_t rb = (size_t)nsb * PK_BYTES, pstride = (size_t)nsb * PK_BLK;
    /* per activation row: blocks of 32 one correction each; K-quants 16 corrections and 8 sums of
     * 32 per super-block (24 ints) */
    int ncorr = PK_K ? nsb * 24 : nsb;
    size_t need = 2 * pstride + (size_t)T * ncorr * 4;
    uint8_t *buf = zs_scratch_get(ZS_SCRATCH_PACK, need);
    if (!buf) return 0;
    int32_t *corr = (int32_t *)(buf + 2 * pstride);
    for (int t = 0; t < T; t++) {
        int32_t *c = corr + (size_t)t * ncorr;
        const int8_t *q = a->q + (size_t)(t0 + t) * a->in;
        if (!PK_K) {
            const int32_t *qs = a->qsum ? a->qsum + (size_t)(t0 + t) * a->nb : NULL;
            for (int b = 0; b < nsb; b++) {
                int s = 0;
                if (qs) s = qs[b];
                else
                    for (int i = 0; i < 32; i++) s += q[32 * b + i];
                c[b] = -PK_OFF * s;
            }
        } else {
            const int16_t *bs = a->bs + (size_t)(t0 + t) * (a->in / 16);
            for (int b = 0; b < nsb; b++) {
                for (int h = 0; h < 16; h++) c[24 * b + h] = -PK_OFF * bs[16 * b + h];
                for (int g = 0; g < 8; g++) c[24 * b + 16 + g] = bs[16 * b + 2 * g] + bs[16 * b + 2 * g + 1];
            }
        }
    }
    int j = 0;
    for (; j + 16 <= R8; j += 16) {
        KA_NAME(pack)(buf, W + (size_t)j * rb, rb, nsb);
        KA_NAME(pack)(buf + pstride, W + (size_t)(j + 8) * rb, rb, nsb);
        int t = 0;
        for (; t + KA_PT <= T; t += KA_PT)
            KA_NAME(ptile)(y + (size_t)t * ldy + j, ldy, a, t0 + t, buf, pstride, nsb, corr + (size_t)t * ncorr, ncorr, 2, KA_PT);
        for (; t < T; t++)
            KA_NAME(ptile)(y + (size_t)t * ldy + j, ldy, a, t0 + t, buf, pstride, nsb, corr + (size_t)t * ncorr, ncorr, 2, 1);
    }
    if (j < R8) {
        KA_NAME(pack)(buf, W + (size_t)j * rb, rb, nsb);
        int t = 0;
        for (; t + KA_PT <= T; t += KA_PT)
            KA_NAME(ptile)(y + (size_t)t * ldy + j, ldy, a, t0 + t, buf, pstride, nsb, corr + (size_t)t * ncorr, ncorr, 1, KA_PT);
        for (; t < T; t++)
            KA_NAME(ptile)(y + (size_t)t * ldy + j, ldy, a, t0 + t, buf, pstride, nsb, corr + (size_t)t * ncorr, ncorr, 1, 1);
        j += 8;
    }
    return j;
}
#endif

#if KA_DEC
/* decode (one activation row): one weight row at a time (a single stream: measured faster than
 * 8 rows side by side), 8 blocks at a time, their integer lanes reduced across blocks into one
 * vector of the 8 blocks' S, then the row's chain over them in order */
#define KA_SIGNED (KA_FMT == ZS_KA_Q8_0 || KA_FMT == ZS_KA_Q6_K)
#define KA_SCALED PK_SCALED
/* block sb's 8 int32 lanes of S */
static inline __attribute__((always_inline)) zs_ka_i32 KA_NAME(dlanes)(const uint8_t *b, const KA_NAME(ctx) *c,
                                                                      const int8_t *xq, int sb, const zs_ka_i32 *xo) {
    const zs_ka_i16 one = (zs_ka_i16){0} + 1;
    zs_ka_i32 z = {0};
#if PK_ROFF
    z = xo ? xo[sb] : -PK_ROFF * KA_XSUM(*(const zs_ka_i8u *)(xq + (size_t)sb * 32));
#else
    (void)xo;
#endif
#pragma GCC unroll 8
    for (int g = 0; g < PK_NG; g++)
        z = KA_DOT(z, KA_W(b, g), *(const zs_ka_i8u *)(xq + ((size_t)sb * PK_NG + g) * 32),
                   PK_SCALED ? KA_PICK(c->scv, g) : one);
    return z;
}

/* the f16 at byte off of 8 consecutive blocks from b, as 8 floats (built in registers: narrow
 * stores reloaded as a vector would stall store forwarding) */
static inline __attribute__((always_inline)) __m256 KA_NAME(h8)(const uint8_t *b, int off) {
    uint16_t h[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) memcpy(&h[k], b + (size_t)k * PK_BYTES + off, 2);
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], (short)h[4], (short)h[5],
                                          (short)h[6], (short)h[7]));
}

/* one row: 8 blocks at a time, their integer lanes reduced across blocks into the 8 blocks' S,
 * which advance the eight chains in one instruction; the last blocks (fewer than 8) lane by lane */
static inline __attribute__((always_inline)) void KA_NAME(drow)(float *y, const zs_q8a *a, int t, const uint8_t *w,
                                                                const zs_ka_i32 *xo) {
    int nsb = a->nb, sb0 = 0;
    const int8_t *xq = a->q + (size_t)t * a->in;
    const float *xd = a->d + (size_t)t * a->nb;
    __m256 acc = _mm256_setzero_ps(), mac = _mm256_setzero_ps();
    for (; sb0 + 8 <= nsb; sb0 += 8) {
        const uint8_t *b0 = w + (size_t)sb0 * PK_BYTES;
        KA_NAME(ctx) c[8];
        zs_ka_i32 is[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            KA_NAME(prep)(b0 + (size_t)k * PK_BYTES, &c[k]);
            is[k] = KA_NAME(dlanes)(b0 + (size_t)k * PK_BYTES, &c[k], xq, sb0 + k, xo);
        }
        __m256 xdv = _mm256_loadu_ps(xd + sb0);
        __m256 dd = _mm256_mul_ps(KA_NAME(h8)(b0, KA_FMT == ZS_KA_Q6_K ? 208 : 0), xdv);
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(ZS_AKA(isum8)(is)), acc);
#if KA_FMT == ZS_KA_Q4_K
        const int16_t *bs = a->bs + (size_t)t * (a->in / 16) + (size_t)sb0 * 16;
        __m256i mv = _mm256_setr_epi32(KA_MSUM(c[0].mn2, bs), KA_MSUM(c[1].mn2, bs + 16), KA_MSUM(c[2].mn2, bs + 32),
                                       KA_MSUM(c[3].mn2, bs + 48), KA_MSUM(c[4].mn2, bs + 64), KA_MSUM(c[5].mn2, bs + 80),
                                       KA_MSUM(c[6].mn2, bs + 96), KA_MSUM(c[7].mn2, bs + 112));
        __m256 coef = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(KA_NAME(h8)(b0, 2), xdv));
        mac = _mm256_fmadd_ps(coef, _mm256_cvtepi32_ps(mv), mac);
#elif PK_MIN
        mac = _mm256_fmadd_ps(KA_NAME(h8)(b0, 2), _mm256_loadu_ps(a->s + (size_t)t * a->nb + sb0), mac);
#endif
    }
    if (sb0 < nsb) { /* chains past the row's last block are left as they are */
        float al[8], ml[8];
        _mm256_storeu_ps(al, acc);
        _mm256_storeu_ps(ml, mac);
        for (int sb = sb0; sb < nsb; sb++) {
            const uint8_t *b = w + (size_t)sb * PK_BYTES;
            KA_NAME(ctx) c;
            KA_NAME(prep)(b, &c);
            int l = sb - sb0;
            al[l] = __builtin_fmaf(c.d * xd[sb], (float)KA_ISUM(KA_NAME(dlanes)(b, &c, xq, sb, xo)), al[l]);
#if KA_FMT == ZS_KA_Q4_K
            const int16_t *bs = a->bs + (size_t)t * (a->in / 16) + (size_t)sb * 16;
            ml[l] = __builtin_fmaf(-(c.m * xd[sb]), (float)KA_MSUM(c.mn2, bs), ml[l]);
#elif PK_MIN
            ml[l] = __builtin_fmaf(c.m, a->s[(size_t)t * a->nb + sb], ml[l]);
#endif
        }
        acc = _mm256_loadu_ps(al);
        mac = _mm256_loadu_ps(ml);
    }
    float v = zs_ka_hsum((zs_ka_f32)acc);
#if PK_MIN
    v = v + zs_ka_hsum((zs_ka_f32)mac);
#endif
    *y = v;
}

static int KA_NAME(dec)(float *y, const zs_q8a *a, int t, const uint8_t *W, int R) {
    int nsb = a->nb;
    size_t rb = (size_t)nsb * PK_BYTES;
    /* the offset's lane sums of the activation blocks, once for all rows */
    zs_ka_i32 *xo = NULL;
#if PK_ROFF
    const int8_t *xq = a->q + (size_t)t * a->in;
    if (R > 1 && (xo = zs_scratch_get(ZS_SCRATCH_PACK, (size_t)nsb * sizeof *xo)))
        for (int sb = 0; sb < nsb; sb++) xo[sb] = -PK_ROFF * KA_XSUM(*(const zs_ka_i8u *)(xq + (size_t)sb * 32));
#endif
    for (int j = 0; j < R; j++) KA_NAME(drow)(y + j, a, t, W + (size_t)j * rb, xo);
    return R;
}
#undef KA_SIGNED
#undef KA_SCALED
#endif
#undef PK_BYTES
#undef PK_NG
#undef PK_K
#undef PK_MIN
#undef PK_UOFF
#undef PK_OFF
#undef PK_SC_AT
#undef PK_MN_AT
#undef PK_U_AT
#undef PK_BLK
#undef PK_ROFF
#undef PK_SCALED
