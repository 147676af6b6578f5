/* lora-kern-body.h — LoRA's down and up row kernels for one element type LKERN_E of the serving
 * copies (suffix LKERN_S), included twice by lora-kern.h (see there for the arithmetic). Not a
 * public header. */
#define LK_CAT2(a, b) a##_##b
#define LK_CAT(a, b) LK_CAT2(a, b)
#define LK_X(a) LKERN_NAME(a)
#define LK_FN(x) LK_X(LK_CAT(x, LKERN_S))
#define LK_LD(p) LK_FN(ld)(p)
#define LK_EL(p) LK_FN(el)(p)

/* u[i][0..r) = s · At·x[i] for n <= 4 rows: lanes of 8 ranks, 2 vectors per row and sweep */
static void LK_FN(down4)(float *const *u, const float *const *x, int n, const LKERN_E *At, int in, int r, float s) {
    int k0 = 0;
    for (; k0 + 16 <= r; k0 += 16) {
        zs_lv8 a[4][2];
        for (int i = 0; i < 4; i++) a[i][0] = a[i][1] = (zs_lv8){0};
        for (int j = 0; j < in; j++) {
            const LKERN_E *p = At + (size_t)j * r + k0;
            zs_lv8 b0 = LK_LD(p), b1 = LK_LD(p + 8);
            for (int i = 0; i < n; i++) {
                zs_lv8 xv = LKERN_NAME(splat)(x[i][j]);
                a[i][0] = LKERN_VFMA(xv, b0, a[i][0]);
                a[i][1] = LKERN_VFMA(xv, b1, a[i][1]);
            }
        }
        for (int i = 0; i < n; i++)
            for (int l = 0; l < 8; l++) {
                u[i][k0 + l] = a[i][0][l] * s;
                u[i][k0 + 8 + l] = a[i][1][l] * s;
            }
    }
    for (; k0 + 8 <= r; k0 += 8) {
        zs_lv8 a[4] = {{0}, {0}, {0}, {0}};
        for (int j = 0; j < in; j++) {
            zs_lv8 b0 = LK_LD(At + (size_t)j * r + k0);
            for (int i = 0; i < n; i++) a[i] = LKERN_VFMA(LKERN_NAME(splat)(x[i][j]), b0, a[i]);
        }
        for (int i = 0; i < n; i++)
            for (int l = 0; l < 8; l++) u[i][k0 + l] = a[i][l] * s;
    }
    for (; k0 < r; k0++)
        for (int i = 0; i < n; i++) {
            float a = 0.0f;
            for (int j = 0; j < in; j++) a = __builtin_fmaf(x[i][j], LK_EL(At + (size_t)j * r + k0), a);
            u[i][k0] = a * s;
        }
}

/* y[o0..o1) += u·Bt for one row: lanes of 8 outputs, 4 vectors per sweep over the ranks */
static void LK_FN(up)(float *y, const float *u, const LKERN_E *Bt, int r, int out, int o0, int o1) {
    int o = o0;
    for (; o + 32 <= o1; o += 32) {
        zs_lv8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int k = 0; k < r; k++) {
            zs_lv8 uv = LKERN_NAME(splat)(u[k]);
            const LKERN_E *p = Bt + (size_t)k * out + o;
            a0 = LKERN_VFMA(uv, LK_LD(p), a0);
            a1 = LKERN_VFMA(uv, LK_LD(p + 8), a1);
            a2 = LKERN_VFMA(uv, LK_LD(p + 16), a2);
            a3 = LKERN_VFMA(uv, LK_LD(p + 24), a3);
        }
        for (int l = 0; l < 8; l++) {
            y[o + l] += a0[l]; y[o + 8 + l] += a1[l]; y[o + 16 + l] += a2[l]; y[o + 24 + l] += a3[l];
        }
    }
    for (; o + 8 <= o1; o += 8) {
        zs_lv8 a0 = {0};
        for (int k = 0; k < r; k++) a0 = LKERN_VFMA(LKERN_NAME(splat)(u[k]), LK_LD(Bt + (size_t)k * out + o), a0);
        for (int l = 0; l < 8; l++) y[o + l] += a0[l];
    }
    for (; o < o1; o++) {
        float a = 0.0f;
        for (int k = 0; k < r; k++) a = __builtin_fmaf(u[k], LK_EL(Bt + (size_t)k * out + o), a);
        y[o] += a;
    }
}

#undef LK_CAT2
#undef LK_CAT
#undef LK_FN
#undef LK_X
#undef LK_LD
#undef LK_EL
