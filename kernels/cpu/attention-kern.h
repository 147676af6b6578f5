/* attention-kern.h — the inner loops of the CPU attention, included by attention.c once per
 * (build, cache element type): the generic build (ATT_FMA8 fuses lane by lane with fmaf) and the
 * AVX2+FMA one (ATT_FMA8 is vfmadd), each for f32, f16 and bf16 keys/values. Every multiply-add
 * is an explicit fused one and every sum is written out in its order, so all builds give the same
 * bits, and a 16-bit cache (its elements widened exactly by KV_LD8 / KV_LD1 as they are loaded,
 * never written back as f32) gives the bits of an f32 cache of the widened values. One call does
 * one task: the rows (query token, head) of one tile of one sequence's tokens that share one kv
 * head, over that head's keys block by block (a block of K or V is read once per tile from L2 and
 * reused by all its rows from L1). The order of each element is documented in attention.h; tiling
 * only interleaves independent elements. With a sliding window (att_task.window) each row's keys
 * start at att_first_key, and blocks no row of the tile sees are skipped unread; the soft-cap is
 * ops.c's zs_op_softcap on each row's visible scores. Needs att_task, att_first_key,
 * att_block_seen, zs_v8, ATT_FMA8, KERN_NAME and
 *   KV_T        the cache's element type (float, or uint16_t holding f16 / bf16 bits)
 *   KV_LD8(p)   the 8 elements at p (const KV_T *) widened, as a zs_v8
 *   KV_LD1(p)   the element at p widened, as a float
 * defined. Not a public header. */

static inline zs_v8 KERN_NAME(ld)(const float *p) { return *(const zs_v8u *)p; }
static inline void KERN_NAME(st)(float *p, zs_v8 v) { *(zs_v8u *)p = v; }
static inline float KERN_NAME(hsum)(zs_v8 a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* s[c * lds + j] = dot(q_c, k_j) · scale for rows c < nr (nr <= 2) and keys j < nk of one block
 * (key j's row at k + j * ks). */
static void KERN_NAME(qk)(float *s, size_t lds, const float *const *q, int nr, const KV_T *k, size_t ks, int nk,
                          int hd, float scale) {
    int d8 = hd & ~7;
    const float *q0 = q[0], *q1 = nr > 1 ? q[1] : q[0];
    int j = 0;
    for (; j + 4 <= nk; j += 4) {
        const KV_T *k0 = k + (size_t)j * ks, *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;
        zs_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
        for (int d = 0; d < d8; d += 8) {
            zs_v8 x0 = KERN_NAME(ld)(q0 + d), x1 = KERN_NAME(ld)(q1 + d);
            zs_v8 u0 = KV_LD8(k0 + d), u1 = KV_LD8(k1 + d);
            zs_v8 u2 = KV_LD8(k2 + d), u3 = KV_LD8(k3 + d);
            a0 = ATT_FMA8(x0, u0, a0); a1 = ATT_FMA8(x0, u1, a1);
            a2 = ATT_FMA8(x0, u2, a2); a3 = ATT_FMA8(x0, u3, a3);
            b0 = ATT_FMA8(x1, u0, b0); b1 = ATT_FMA8(x1, u1, b1);
            b2 = ATT_FMA8(x1, u2, b2); b3 = ATT_FMA8(x1, u3, b3);
        }
        float r[8] = {KERN_NAME(hsum)(a0), KERN_NAME(hsum)(a1), KERN_NAME(hsum)(a2), KERN_NAME(hsum)(a3),
                      KERN_NAME(hsum)(b0), KERN_NAME(hsum)(b1), KERN_NAME(hsum)(b2), KERN_NAME(hsum)(b3)};
        for (int d = d8; d < hd; d++) {
            float w0 = KV_LD1(k0 + d), w1 = KV_LD1(k1 + d), w2 = KV_LD1(k2 + d), w3 = KV_LD1(k3 + d);
            r[0] = __builtin_fmaf(q0[d], w0, r[0]); r[1] = __builtin_fmaf(q0[d], w1, r[1]);
            r[2] = __builtin_fmaf(q0[d], w2, r[2]); r[3] = __builtin_fmaf(q0[d], w3, r[3]);
            r[4] = __builtin_fmaf(q1[d], w0, r[4]); r[5] = __builtin_fmaf(q1[d], w1, r[5]);
            r[6] = __builtin_fmaf(q1[d], w2, r[6]); r[7] = __builtin_fmaf(q1[d], w3, r[7]);
        }
        for (int c = 0; c < 4; c++) s[j + c] = r[c] * scale;
        if (nr > 1)
            for (int c = 0; c < 4; c++) s[lds + j + c] = r[4 + c] * scale;
    }
    for (; j < nk; j++) {
        const KV_T *k0 = k + (size_t)j * ks;
        for (int c = 0; c < nr; c++) {
            const float *qc = q[c];
            zs_v8 a0 = {0};
            for (int d = 0; d < d8; d += 8) a0 = ATT_FMA8(KERN_NAME(ld)(qc + d), KV_LD8(k0 + d), a0);
            float r = KERN_NAME(hsum)(a0);
            for (int d = d8; d < hd; d++) r = __builtin_fmaf(qc[d], KV_LD1(k0 + d), r);
            s[(size_t)c * lds + j] = r * scale;
        }
    }
}

/* o[e] = fma(p[j], v_j[e], o[e]) for keys j < nk of one block in order (v_j at v + j * vs). */
static void KERN_NAME(pv)(float *o, const float *p, const KV_T *v, size_t vs, int nk, int hd) {
    int d8 = hd & ~7, d = 0;
    for (; d + 32 <= d8; d += 32) {
        zs_v8 o0 = KERN_NAME(ld)(o + d), o1 = KERN_NAME(ld)(o + d + 8);
        zs_v8 o2 = KERN_NAME(ld)(o + d + 16), o3 = KERN_NAME(ld)(o + d + 24);
        for (int j = 0; j < nk; j++) {
            const KV_T *vj = v + (size_t)j * vs + d;
            zs_v8 w = {p[j], p[j], p[j], p[j], p[j], p[j], p[j], p[j]};
            o0 = ATT_FMA8(w, KV_LD8(vj), o0);
            o1 = ATT_FMA8(w, KV_LD8(vj + 8), o1);
            o2 = ATT_FMA8(w, KV_LD8(vj + 16), o2);
            o3 = ATT_FMA8(w, KV_LD8(vj + 24), o3);
        }
        KERN_NAME(st)(o + d, o0); KERN_NAME(st)(o + d + 8, o1);
        KERN_NAME(st)(o + d + 16, o2); KERN_NAME(st)(o + d + 24, o3);
    }
    for (; d < d8; d += 8) {
        zs_v8 o0 = KERN_NAME(ld)(o + d);
        for (int j = 0; j < nk; j++) {
            zs_v8 w = {p[j], p[j], p[j], p[j], p[j], p[j], p[j], p[j]};
            o0 = ATT_FMA8(w, KV_LD8(v + (size_t)j * vs + d), o0);
        }
        KERN_NAME(st)(o + d, o0);
    }
    for (; d < hd; d++) {
        float x = o[d];
        for (int j = 0; j < nk; j++) x = __builtin_fmaf(p[j], KV_LD1(v + (size_t)j * vs + d), x);
        o[d] = x;
    }
}

/* One task: rows r = ti * group + g (tile token ti, head kh * group + g); s: nrows * lds floats,
 * s[r * lds + j - base] the score of key j (base: the first position of the first block any row
 * of the tile sees), lds >= the tile's largest key position + 1 - base. A row's keys are the run
 * c0..ce-1 (att_row_keys) and, for a tree token, the visible part of its path: after the scores,
 * the path's scores are moved down to follow the run's (in place, in order: each moves to a
 * lower or the same index), so the softmax and the weighted sum see the one list of keys in
 * order, as they see c0..pos of a causal token. */
static void KERN_NAME(task)(const att_task *t, float *s, size_t lds) {
    int hd = t->hd, B = t->block, group = t->group, nrows = t->nt * group, W = t->window, base = t->base;
    size_t ks = (size_t)t->kv_stride, koff = (size_t)t->kh * hd;
    const zs_att_seq *sq = t->sq;
    int maxk = 0;
    for (int ti = 0; ti < t->nt; ti++) {
        int c0, ce, ke;
        att_row_keys(t, t->tok[ti], &c0, &ce, &ke);
        maxk = ke > maxk ? ke : maxk;
    }
    /* scores: block by block, every row against the block's keys (rows past their own keys, or
     * with a window past this block, compute a few scores they never use); with a window, a
     * block no row of the tile sees is not read */
    for (int b0 = base; b0 <= maxk; b0 += B) {
        if (W > 0 && !att_block_seen(t, b0, B)) continue;
        int nk = maxk + 1 - b0 < B ? maxk + 1 - b0 : B;
        const KV_T *kb = (const KV_T *)sq->k[b0 / B] + koff;
        for (int r = 0; r < nrows; r += 2) {
            int nr = nrows - r < 2 ? nrows - r : 2;
            const float *qr[2];
            for (int c = 0; c < nr; c++) {
                int ti = (r + c) / group, h = t->kh * group + (r + c) % group;
                qr[c] = t->q + (size_t)t->tok[ti] * t->qd + (size_t)h * hd;
            }
            KERN_NAME(qk)(s + (size_t)r * lds + (b0 - base), lds, qr, nr, kb, ks, nk, hd, t->scale);
        }
    }
    /* each row's visible keys (the run, then a tree token's path moved down after it):
     * soft-capped (ops.c, the same function for every build), then the softmax */
    for (int r = 0; r < nrows; r++) {
        int ti = r / group, h = t->kh * group + r % group, tok = t->tok[ti], c0, ce, ke;
        att_row_keys(t, tok, &c0, &ce, &ke);
        float *sr = s + (size_t)r * lds + (c0 - base);
        int n = ce - c0;
        if (t->tr && t->tr->depth[tok] > 0) {
            int k0, m = att_path(t, tok, t->path, &k0);
            for (int k = 0; k < m; k++) sr[n + k] = s[(size_t)r * lds + (t->tr->slot[t->path[k0 + k]] - base)];
            n += m;
        }
        if (t->softcap > 0.0f) zs_op_softcap(sr, (size_t)n, t->softcap);
        zs_op_softmax(sr, n);
        float *o = t->out + (size_t)tok * t->qd + (size_t)h * hd;
        for (int e = 0; e < hd; e++) o[e] = 0.0f;
    }
    /* weighted sum of values: block by block, each row over its run c0..ce-1 */
    for (int b0 = base; b0 < maxk + 1; b0 += B) {
        if (W > 0 && !att_block_seen(t, b0, B)) continue;
        const KV_T *vb = (const KV_T *)sq->v[b0 / B] + koff;
        for (int r = 0; r < nrows; r++) {
            int ti = r / group, h = t->kh * group + r % group, tok = t->tok[ti], c0, ce, ke;
            att_row_keys(t, tok, &c0, &ce, &ke);
            if (ce <= b0 || c0 >= b0 + B || c0 >= ce) continue;
            int j0 = c0 > b0 ? c0 : b0, j1 = ce < b0 + B ? ce : b0 + B;
            KERN_NAME(pv)(t->out + (size_t)tok * t->qd + (size_t)h * hd, s + (size_t)r * lds + (j0 - c0) + (c0 - base),
                          vb + (size_t)(j0 - b0) * ks, ks, j1 - j0, hd);
        }
    }
    /* then a tree token's path, in order (its weights follow the run's in the row) */
    if (!t->tr) return;
    for (int r = 0; r < nrows; r++) {
        int ti = r / group, h = t->kh * group + r % group, tok = t->tok[ti], c0, ce, ke;
        if (t->tr->depth[tok] == 0) continue;
        att_row_keys(t, tok, &c0, &ce, &ke);
        int k0, m = att_path(t, tok, t->path, &k0);
        const float *pr = s + (size_t)r * lds + (c0 - base) + (ce - c0);
        for (int k = 0; k < m; k++) {
            int j = t->tr->slot[t->path[k0 + k]];
            const KV_T *vj = (const KV_T *)sq->v[j / B] + koff + (size_t)(j % B) * ks;
            KERN_NAME(pv)(t->out + (size_t)tok * t->qd + (size_t)h * hd, pr + k, vj, ks, 1, hd);
        }
    }
}
