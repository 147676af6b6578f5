/* matmul-bwd-kern.h — the inner kernel of the training backward's matrix products (dx += dy·W and
 * dW += dyᵀ·x in ops-backward.c), included by ops-backward.c (generic build) and
 * matmul-bwd-avx2.c (compiled for AVX2+FMA). One call adds to Y[r,c] the sum of A(r,k)·B[k,c]
 * over its K values of k as ONE chain of fused multiply-adds per element, in k order, from zero:
 *     s = 0;  for k = 0 .. K-1: s = fma(A(r,k), B[k,c], s);  Y[r,c] = Y[r,c] + s
 * (the caller cuts a long k into blocks at fixed places and calls once per block, in order).
 * Vector lanes are separate elements (there is no horizontal sum) and the register tiles only
 * interleave independent chains, so every element's bits are a fixed function of its inputs:
 * they do not depend on the tiling, on which thread runs which block or on how many threads
 * there are, and both builds give the same bits (the generic build fuses lane by lane with
 * fmaf, which is slow only on CPUs without FMA). The blocked entry point copies ("packs") the
 * operands into contiguous tiles first; packing moves data only, it changes no operation.
 * Not a public header. */
#include <stddef.h>

#ifndef ZS_BKERN_TYPES
#define ZS_BKERN_TYPES
typedef float zs_bv8 __attribute__((vector_size(32)));
typedef float zs_bv8u __attribute__((vector_size(32), aligned(4), may_alias)); /* unaligned access */
#endif

#ifndef KERN_VFMA
/* no vector FMA in this build: the same correctly rounded a*b+c, lane by lane */
static inline zs_bv8 KERN_NAME(vfma)(zs_bv8 a, zs_bv8 b, zs_bv8 c) {
    zs_bv8 r;
    for (int l = 0; l < 8; l++) r[l] = __builtin_fmaf(a[l], b[l], c[l]);
    return r;
}
#define KERN_VFMA(a, b, c) KERN_NAME(vfma)(a, b, c)
#endif

static inline zs_bv8 KERN_NAME(ld)(const float *p) { return *(const zs_bv8u *)p; }
static inline void KERN_NAME(st)(float *p, zs_bv8 v) { *(zs_bv8u *)p = v; }
static inline zs_bv8 KERN_NAME(splat)(float s) { return (zs_bv8){s, s, s, s, s, s, s, s}; }
/* *p += v for 8 floats */
static inline void KERN_NAME(add)(float *p, zs_bv8 v) { KERN_NAME(st)(p, KERN_NAME(ld)(p) + v); }

/* Y[r*ldy + c] for r < M, c < N, with A(r,k) = a[r*ars + k*acs] and B[k,c] = b[k*ldb + c].
 * Register tiles of 6 rows x 16 columns (12 accumulators), then 1 x 16, 6 x 8, 1 x 8, and the
 * last N % 8 columns one element at a time: all the same chain per element. (Unpacked: used
 * for the rows and columns that do not fill a packed tile, and for small products.) */
static void KERN_NAME(update)(float *y, ptrdiff_t ldy, const float *a, ptrdiff_t ars, ptrdiff_t acs,
                              const float *b, ptrdiff_t ldb, int M, int N, int K) {
#define VF KERN_VFMA
#define LD KERN_NAME(ld)
#define SP KERN_NAME(splat)
#define Z ((zs_bv8){0})
    int c = 0;
    for (; c + 16 <= N; c += 16) {
        int r = 0;
        for (; r + 6 <= M; r += 6) {
            float *y0 = y + (ptrdiff_t)r * ldy + c, *y1 = y0 + ldy, *y2 = y1 + ldy, *y3 = y2 + ldy,
                  *y4 = y3 + ldy, *y5 = y4 + ldy;
            const float *a0 = a + (ptrdiff_t)r * ars, *a1 = a0 + ars, *a2 = a1 + ars, *a3 = a2 + ars,
                        *a4 = a3 + ars, *a5 = a4 + ars;
            zs_bv8 c00 = Z, c01 = Z, c10 = Z, c11 = Z, c20 = Z, c21 = Z, c30 = Z, c31 = Z, c40 = Z, c41 = Z,
                   c50 = Z, c51 = Z;
            const float *bk = b + c;
            for (int k = 0; k < K; k++, bk += ldb) {
                ptrdiff_t ko = (ptrdiff_t)k * acs;
                zs_bv8 b0 = LD(bk), b1 = LD(bk + 8), s;
                s = SP(a0[ko]); c00 = VF(s, b0, c00); c01 = VF(s, b1, c01);
                s = SP(a1[ko]); c10 = VF(s, b0, c10); c11 = VF(s, b1, c11);
                s = SP(a2[ko]); c20 = VF(s, b0, c20); c21 = VF(s, b1, c21);
                s = SP(a3[ko]); c30 = VF(s, b0, c30); c31 = VF(s, b1, c31);
                s = SP(a4[ko]); c40 = VF(s, b0, c40); c41 = VF(s, b1, c41);
                s = SP(a5[ko]); c50 = VF(s, b0, c50); c51 = VF(s, b1, c51);
            }
            KERN_NAME(add)(y0, c00); KERN_NAME(add)(y0 + 8, c01);
            KERN_NAME(add)(y1, c10); KERN_NAME(add)(y1 + 8, c11);
            KERN_NAME(add)(y2, c20); KERN_NAME(add)(y2 + 8, c21);
            KERN_NAME(add)(y3, c30); KERN_NAME(add)(y3 + 8, c31);
            KERN_NAME(add)(y4, c40); KERN_NAME(add)(y4 + 8, c41);
            KERN_NAME(add)(y5, c50); KERN_NAME(add)(y5 + 8, c51);
        }
        for (; r < M; r++) {
            float *y0 = y + (ptrdiff_t)r * ldy + c;
            const float *a0 = a + (ptrdiff_t)r * ars;
            zs_bv8 c00 = Z, c01 = Z;
            const float *bk = b + c;
            for (int k = 0; k < K; k++, bk += ldb) {
                zs_bv8 s = SP(a0[(ptrdiff_t)k * acs]);
                c00 = VF(s, LD(bk), c00);
                c01 = VF(s, LD(bk + 8), c01);
            }
            KERN_NAME(add)(y0, c00); KERN_NAME(add)(y0 + 8, c01);
        }
    }
    for (; c + 8 <= N; c += 8) {
        int r = 0;
        for (; r + 6 <= M; r += 6) {
            float *y0 = y + (ptrdiff_t)r * ldy + c, *y1 = y0 + ldy, *y2 = y1 + ldy, *y3 = y2 + ldy,
                  *y4 = y3 + ldy, *y5 = y4 + ldy;
            const float *a0 = a + (ptrdiff_t)r * ars, *a1 = a0 + ars, *a2 = a1 + ars, *a3 = a2 + ars,
                        *a4 = a3 + ars, *a5 = a4 + ars;
            zs_bv8 c0 = Z, c1 = Z, c2 = Z, c3 = Z, c4 = Z, c5 = Z;
            const float *bk = b + c;
            for (int k = 0; k < K; k++, bk += ldb) {
                ptrdiff_t ko = (ptrdiff_t)k * acs;
                zs_bv8 b0 = LD(bk);
                c0 = VF(SP(a0[ko]), b0, c0); c1 = VF(SP(a1[ko]), b0, c1); c2 = VF(SP(a2[ko]), b0, c2);
                c3 = VF(SP(a3[ko]), b0, c3); c4 = VF(SP(a4[ko]), b0, c4); c5 = VF(SP(a5[ko]), b0, c5);
            }
            KERN_NAME(add)(y0, c0); KERN_NAME(add)(y1, c1); KERN_NAME(add)(y2, c2);
            KERN_NAME(add)(y3, c3); KERN_NAME(add)(y4, c4); KERN_NAME(add)(y5, c5);
        }
        for (; r < M; r++) {
            float *y0 = y + (ptrdiff_t)r * ldy + c;
            const float *a0 = a + (ptrdiff_t)r * ars;
            zs_bv8 c0 = Z;
            const float *bk = b + c;
            for (int k = 0; k < K; k++, bk += ldb) c0 = VF(SP(a0[(ptrdiff_t)k * acs]), LD(bk), c0);
            KERN_NAME(add)(y0, c0);
        }
    }
    for (; c < N; c++)
        for (int r = 0; r < M; r++) {
            float *yp = y + (ptrdiff_t)r * ldy + c, acc = 0.0f;
            const float *a0 = a + (ptrdiff_t)r * ars;
            for (int k = 0; k < K; k++) acc = __builtin_fmaf(a0[(ptrdiff_t)k * acs], b[(ptrdiff_t)k * ldb + c], acc);
            *yp += acc;
        }
#undef VF
#undef LD
#undef SP
#undef Z
}

/* One 6 x 16 tile of Y from a packed panel of B (bp[k*16 + c] = B[k,c]) and A(r,k) =
 * ap[r*ars + k*acs]: either packed (ars = 1, acs = 6) or rows of A read in place (acs = 1). */
static inline void KERN_NAME(tile)(float *y, ptrdiff_t ldy, const float *ap, ptrdiff_t ars, ptrdiff_t acs,
                                   const float *bp, int K) {
#define Z ((zs_bv8){0})
    float *y0 = y, *y1 = y0 + ldy, *y2 = y1 + ldy, *y3 = y2 + ldy, *y4 = y3 + ldy, *y5 = y4 + ldy;
    const float *a0 = ap, *a1 = a0 + ars, *a2 = a1 + ars, *a3 = a2 + ars, *a4 = a3 + ars, *a5 = a4 + ars;
    zs_bv8 c00 = Z, c01 = Z, c10 = Z, c11 = Z, c20 = Z, c21 = Z, c30 = Z, c31 = Z, c40 = Z, c41 = Z,
           c50 = Z, c51 = Z;
    for (int k = 0; k < K; k++, bp += 16) {
        ptrdiff_t ko = (ptrdiff_t)k * acs;
        zs_bv8 b0 = KERN_NAME(ld)(bp), b1 = KERN_NAME(ld)(bp + 8), s;
        s = KERN_NAME(splat)(a0[ko]); c00 = KERN_VFMA(s, b0, c00); c01 = KERN_VFMA(s, b1, c01);
        s = KERN_NAME(splat)(a1[ko]); c10 = KERN_VFMA(s, b0, c10); c11 = KERN_VFMA(s, b1, c11);
        s = KERN_NAME(splat)(a2[ko]); c20 = KERN_VFMA(s, b0, c20); c21 = KERN_VFMA(s, b1, c21);
        s = KERN_NAME(splat)(a3[ko]); c30 = KERN_VFMA(s, b0, c30); c31 = KERN_VFMA(s, b1, c31);
        s = KERN_NAME(splat)(a4[ko]); c40 = KERN_VFMA(s, b0, c40); c41 = KERN_VFMA(s, b1, c41);
        s = KERN_NAME(splat)(a5[ko]); c50 = KERN_VFMA(s, b0, c50); c51 = KERN_VFMA(s, b1, c51);
    }
    KERN_NAME(add)(y0, c00); KERN_NAME(add)(y0 + 8, c01);
    KERN_NAME(add)(y1, c10); KERN_NAME(add)(y1 + 8, c11);
    KERN_NAME(add)(y2, c20); KERN_NAME(add)(y2 + 8, c21);
    KERN_NAME(add)(y3, c30); KERN_NAME(add)(y3 + 8, c31);
    KERN_NAME(add)(y4, c40); KERN_NAME(add)(y4 + 8, c41);
    KERN_NAME(add)(y5, c50); KERN_NAME(add)(y5 + 8, c51);
#undef Z
}

/* As update(), for one block: the whole 16-column panels of B are packed into pb
 * (16*(N/16)*K floats) and so are the whole 6-row tiles of A into pa (6*(M/6)*K floats) unless
 * A's rows are contiguous (acs = 1: read in place), and they run through tile(); the rows and
 * columns left over go through update(). pa or pb NULL: all of it through update(). */
static void KERN_NAME(block)(float *y, ptrdiff_t ldy, const float *a, ptrdiff_t ars, ptrdiff_t acs,
                             const float *b, ptrdiff_t ldb, int M, int N, int K, float *pa, float *pb) {
    int Mt = M / 6 * 6, Nt = N / 16 * 16;
    if (!pa || !pb || Mt == 0 || Nt == 0) {
        KERN_NAME(update)(y, ldy, a, ars, acs, b, ldb, M, N, K);
        return;
    }
    /* A with contiguous rows (acs = 1) is read in place; otherwise packed, reading along its
     * contiguous direction so that the prefetcher keeps up */
    if (acs != 1) {
        for (int k = 0; k < K; k++) {
            const float *s = a + (ptrdiff_t)k * acs;
            for (int r = 0; r < Mt; r += 6) {
                float *d = pa + (size_t)r * K + (size_t)k * 6;
                for (int i = 0; i < 6; i++) d[i] = s[(ptrdiff_t)(r + i) * ars];
            }
        }
    }
    for (int k = 0; k < K; k++) {
        const float *s = b + (ptrdiff_t)k * ldb;
        float *d = pb + (size_t)k * 16;
        for (int c = 0; c < Nt; c += 16, d += (size_t)16 * K) {
            KERN_NAME(st)(d, KERN_NAME(ld)(s + c));
            KERN_NAME(st)(d + 8, KERN_NAME(ld)(s + c + 8));
        }
    }
    for (int c = 0; c < Nt; c += 16)
        for (int r = 0; r < Mt; r += 6)
            if (acs == 1)
                KERN_NAME(tile)(y + (ptrdiff_t)r * ldy + c, ldy, a + (ptrdiff_t)r * ars, ars, 1, pb + (size_t)c * K, K);
            else
                KERN_NAME(tile)(y + (ptrdiff_t)r * ldy + c, ldy, pa + (size_t)r * K, 1, 6, pb + (size_t)c * K, K);
    if (Mt < M) KERN_NAME(update)(y + (ptrdiff_t)Mt * ldy, ldy, a + (ptrdiff_t)Mt * ars, ars, acs, b, ldb, M - Mt, Nt, K);
    if (Nt < N) KERN_NAME(update)(y + Nt, ldy, a, ars, acs, b + Nt, ldb, M, N - Nt, K);
}
