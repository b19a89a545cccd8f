/* The conv body of K zoo LeNets, one image and one teacher at a time, the whole way in cache:
 * conv1 + bias -> 2x2 max-pool -> ReLU -> conv2 + bias -> 2x2 max-pool -> ReLU.
 *
 * Both convolutions have 16 output channels and 5x5 kernels, so one 16-float vector is one
 * pixel's channels: every multiply-add is an AVX-512 FMA of a broadcast input value and a
 * weight vector. conv1's map never leaves the registers (the four conv outputs of a pool window
 * are accumulated together and maxed there); the pooled map (12x12x16 floats at 28 px, 9 KB)
 * stays in L1 for conv2. Why: oneDNN's conv1 writes a 4x bigger map that goes through L3 to
 * its max-pool (profiled in stacked.py). Max-pool before ReLU is exact (they commute).
 *
 * Built at first use by native.py (cc -O3 -march=native); without AVX-512 the 16-vector
 * accumulators spill (10x slower, measured), so the build refuses and stacked.py uses oneDNN.
 */
#ifndef __AVX512F__
#error "the LeNet kernel needs AVX-512"
#endif
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int v16i __attribute__((vector_size(64)));

static inline v16 vmax(v16 a, v16 b) {
    v16i m = a > b;
    return (v16)(((v16i)a & m) | ((v16i)b & ~m));
}
static inline v16 bc(float s) { return (v16){s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }

/* ``nb`` pool windows of conv1 from row ``ph``, column ``pw``: 4 nb accumulators. Always
 * inlined with a constant ``nb``, so the loops unroll and the accumulators live in registers. */
static inline __attribute__((always_inline)) void conv1_windows(
        const float *x, int cin, int H, int W, const v16 *w1, v16 b1, v16 *p, int PW, int pad2,
        int ph, int pw, const int nb) {
    v16 a[2][4];
    for (int j = 0; j < nb; j++)
        for (int d = 0; d < 4; d++) a[j][d] = bc(0.f);
    for (int c = 0; c < cin; c++) {
        const float *xc = x + (long)c * H * W;
        for (int kh = 0; kh < 5; kh++) {
            const float *r0 = xc + (2 * ph + kh) * W + 2 * pw, *r1 = r0 + W;
            for (int kw = 0; kw < 5; kw++) {
                v16 w = w1[(c * 5 + kh) * 5 + kw];
                for (int j = 0; j < nb; j++) {
                    a[j][0] += bc(r0[2 * j + kw]) * w;
                    a[j][1] += bc(r0[2 * j + kw + 1]) * w;
                    a[j][2] += bc(r1[2 * j + kw]) * w;
                    a[j][3] += bc(r1[2 * j + kw + 1]) * w;
                }
            }
        }
    }
    for (int j = 0; j < nb; j++) {
        v16 m = vmax(vmax(a[j][0], a[j][1]), vmax(a[j][2], a[j][3])) + b1;
        p[(ph + pad2) * PW + pw + j + pad2] = vmax(m, bc(0.f));
    }
}

/* Pooled conv1 of one image, ``x`` (cin, H, W) already padded, weights ``w1`` (cin, 5, 5) of
 * vectors; writes the interior of ``p`` ((Ph + 2 pad2) x (Pw + 2 pad2) vectors, border zero).
 * Two windows at a time (8 accumulators), an odd last one alone. */
static void conv1_pool(const float *x, int cin, int H, int W, const v16 *w1, v16 b1, v16 *p,
                       int Ph, int Pw, int pad2) {
    int PW = Pw + 2 * pad2;
    for (int ph = 0; ph < Ph; ph++) {
        int pw = 0;
        for (; pw + 2 <= Pw; pw += 2) conv1_windows(x, cin, H, W, w1, b1, p, PW, pad2, ph, pw, 2);
        for (; pw < Pw; pw++) conv1_windows(x, cin, H, W, w1, b1, p, PW, pad2, ph, pw, 1);
    }
}

/* ``nb`` pool windows of conv2 from pooled row ``qh``, column ``qw``: 2 rows x 2 nb conv
 * outputs. Always inlined with a constant ``nb`` (as conv1_windows). */
#define NB 4
static inline __attribute__((always_inline)) void conv2_windows(
        const float *pf, int PW, const v16 *w2, v16 b2, v16 *out, int Qw, int qh, int qw,
        const int nb) {
    v16 a[2][2 * NB];
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 2 * nb; j++) a[r][j] = bc(0.f);
    for (int kh = 0; kh < 5; kh++)
        for (int kw = 0; kw < 5; kw++) {
            const v16 *wk = w2 + (kh * 5 + kw) * 16;
            const float *s0 = pf + ((long)(2 * qh + kh) * PW + 2 * qw + kw) * 16;
            const float *s1 = s0 + (long)PW * 16;
            for (int ci = 0; ci < 16; ci++) {
                v16 w = wk[ci];
                for (int j = 0; j < 2 * nb; j++) {
                    a[0][j] += bc(s0[j * 16 + ci]) * w;
                    a[1][j] += bc(s1[j * 16 + ci]) * w;
                }
            }
        }
    for (int j = 0; j < nb; j++) {
        v16 m = vmax(vmax(a[0][2 * j], a[0][2 * j + 1]), vmax(a[1][2 * j], a[1][2 * j + 1])) + b2;
        out[qh * Qw + qw + j] = vmax(m, bc(0.f));
    }
}

/* Pooled conv2: ``p`` (PH, PW) vectors of 16 input channels, weights ``w2`` (5, 5, 16) of
 * vectors; ``out`` (Qh, Qw) vectors. Blocks of NB = 4 windows: 16 accumulators, one weight
 * load per 16 FMAs (2 windows: 5 % slower, 3: 17 %); the windows left over one at a time. */
static void conv2_pool(const v16 *p, int PW, const v16 *w2, v16 b2, v16 *out, int Qh, int Qw) {
    const float *pf = (const float *)p;
    for (int qh = 0; qh < Qh; qh++) {
        int qw = 0;
        for (; qw + NB <= Qw; qw += NB) conv2_windows(pf, PW, w2, b2, out, Qw, qh, qw, NB);
        for (; qw < Qw; qw++) conv2_windows(pf, PW, w2, b2, out, Qw, qh, qw, 1);
    }
}

/* x (B, cin, H, W), padded for conv1; w1 (K, cin, 5, 5, 16); b1 (K, 16); w2 (K, 5, 5, 16, 16)
 * as (kh, kw, ci, co); b2 (K, 16); scratch (Ph + 2 pad2)(Pw + 2 pad2) x 16 floats, 64-byte
 * aligned like every array here; out (B, K, Qh, Qw, 16): features in (h, w, c) order.
 * Returns 0, or -1 when a map would be empty. */
int mrtf_lenet_features(const float *x, int B, int cin, int H, int W, const float *w1,
                        const float *b1, const float *w2, const float *b2, int K, int pad2,
                        float *scratch, float *out) {
    int Ph = (H - 4) / 2, Pw = (W - 4) / 2;
    int PH = Ph + 2 * pad2, PW = Pw + 2 * pad2;
    int Qh = (PH - 4) / 2, Qw = (PW - 4) / 2;
    if (Ph < 1 || Pw < 1 || Qh < 1 || Qw < 1) return -1;
    v16 *p = (v16 *)scratch;
    memset(p, 0, sizeof(v16) * PH * PW);
    const v16 *W1 = (const v16 *)w1, *B1 = (const v16 *)b1;
    const v16 *W2 = (const v16 *)w2, *B2 = (const v16 *)b2;
    v16 *o = (v16 *)out;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < K; t++) {
            conv1_pool(x + (long)b * cin * H * W, cin, H, W, W1 + (long)t * cin * 25, B1[t], p,
                       Ph, Pw, pad2);
            conv2_pool(p, PW, W2 + (long)t * 400, B2[t], o + ((long)b * K + t) * Qh * Qw, Qh, Qw);
        }
    return 0;
}
