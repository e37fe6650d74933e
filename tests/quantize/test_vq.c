/*
 * test_vq.c — tern's codebook type vq2 (quant/vq.h): format, quantizer, kernels.
 *   - traits: name, id, 70-byte blocks, the 4-byte row header and 1 KiB tail in the sizes;
 *   - decode: hand-built rows (random codebook, indices, scales) decoded by the library equal the
 *     test's own reading of the bit layout in docs/formats.md;
 *   - the scalar dot equals a double dot of the test's decode and the q8_K activations' values;
 *   - every ISA's vec_dot and gemm (n = 1..9 columns, k = 1..131 blocks, views of a few rows) match
 *     that double dot to float rounding, with a general codebook, a sign-symmetric one (entry
 *     128 + k = -entry k: the AVX-512 kernel's half-table path; -128 pairs included), one that is
 *     symmetric but for one byte (must take the general path), and rows of two tensors (one
 *     symmetric codebook, one not) in one call;
 *   - quantizer: Gaussian rows of mixed magnitude quantize below the relative MSE of the optimal
 *     2-bit scalar (Lloyd-Max) quantizer of a Gaussian, 0.1175 — a 4-D codebook must beat it — and
 *     above the rate-distortion bound at 2.1875 bits, 2^-4.375; an importance vector lowers the
 *     importance-weighted error; same input and seed -> same bytes; every row header is right;
 *     the fitted codebook is sign-symmetric (the format's promise for tern's files);
 *   - error feedback with a Hessian (tn_vq_gptq_*): on correlated inputs the layer's output error,
 *     measured through the inputs themselves, is well below the diagonal-only quantizer's with the
 *     same codebook; split rows give the same bytes; bad Hessians are refused;
 *   - GGUF: a written vq2 tensor reads back with its codebook; a wrong row header is refused.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/fp16.h"
#include "fmt/gguf.h"
#include "kern/kern.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/vq.h"

static uint64_t g_rng = 987654321;
static uint32_t urand(void) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(g_rng >> 33);
}
static float frand(void) { return (float)(urand() & 0xFFFFFF) / 16777216.0f * 2 - 1; }
static double grand(void) { /* Box-Muller */
    double u = (urand() + 1.0) / 2147483649.0, v = (urand() + 0.5) / 2147483648.0;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* A random tensor of `rows` rows of k weights in the vq2 layout (rows then codebook); cb_kind 0:
 * a random codebook, 1: sign-symmetric (entry 128 + e = -entry e, wrapping: -(-128) is -128),
 * 2: symmetric but for the last byte, 3: symmetric, and the rows from 6 on point at a second,
 * random codebook after it (rows of two tensors at one stride: a kernel must follow each row's
 * header, and pair only rows of one codebook). */
static uint8_t *make_tensor_cb(int64_t k, int64_t rows, size_t *rb_out, int cb_kind) {
    const size_t rb = tn_dtype_row_size(TN_VQ2, k), n = tn_dtype_tensor_size(TN_VQ2, k, rows);
    assert_int_equal(n, rb * (size_t)rows + 1024);
    uint8_t *t = malloc(n + 1024);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = t + (size_t)r * rb;
        const uint32_t off = (uint32_t)((size_t)(rows - r) * rb + (cb_kind == 3 && r >= 6 ? 1024 : 0));
        memcpy(row, &off, 4); /* little-endian host */
        for (size_t i = 4; i < rb; i++) row[i] = (uint8_t)urand();
        for (int64_t b = 0; b < k / 256; b++) { /* sane fp16 scales */
            const uint16_t d = tn_fp32_to_fp16(0.001f + 0.01f * fabsf(frand()));
            memcpy(row + 4 + (size_t)b * 70, &d, 2);
        }
    }
    uint8_t *cb = t + (size_t)rows * rb;
    for (int i = 0; i < 2048; i++) cb[i] = (uint8_t)(urand() % 255 + 1); /* no zero entries */
    if (cb_kind) {
        cb[0] = 0x80; /* a -128 entry, whose negation wraps to itself */
        for (int p = 0; p < 4; p++)
            for (int e = 0; e < 128; e++) cb[256 * p + 128 + e] = (uint8_t)(0u - cb[256 * p + e]);
        if (cb_kind == 2) cb[1023] ^= 1;
    }
    *rb_out = rb;
    return t;
}
static uint8_t *make_tensor(int64_t k, int64_t rows, size_t *rb_out) { return make_tensor_cb(k, rows, rb_out, 0); }

/* The test's reading of the layout (docs/formats.md): weight 64p + j of block b of the row. */
static double weight_at(const uint8_t *row, int64_t b, int p, int j) {
    uint32_t off;
    memcpy(&off, row, 4);
    const int8_t *cb = (const int8_t *)(row + off);
    const uint8_t *blk = row + 4 + 70 * b;
    uint16_t dh;
    memcpy(&dh, blk, 2);
    const int g = j / 8, s = (blk[2 + g / 2] >> (4 * (g % 2))) & 15;
    return (double)tn_fp16_to_fp32(dh) * (2 * s + 1) * cb[256 * p + blk[6 + j]];
}

static void test_traits(void **st) {
    (void)st;
    tn_dtype t;
    assert_true(tn_dtype_from_name("VQ2", &t));
    assert_int_equal(t, TN_VQ2);
    assert_int_equal(TN_VQ2, 1088);
    assert_false(tn_dtype_is_internal(TN_VQ2));
    const tn_dtype_traits *tr = tn_dtype_get(TN_VQ2);
    assert_string_equal(tr->name, "vq2");
    assert_int_equal(tr->blck_size, 256);
    assert_int_equal(tr->type_size, 70);
    assert_int_equal(tr->vec_dot_type, TN_Q8_K);
    assert_int_equal(tn_dtype_row_size(TN_VQ2, 2048), 4 + 8 * 70);
    assert_int_equal(tn_dtype_row_size(TN_VQ2, 100), 0);
    assert_int_equal(tn_dtype_tensor_size(TN_VQ2, 512, 3), 3 * (4 + 140) + 1024);
    assert_int_equal(tn_dtype_tensor_size(TN_Q8_0, 64, 3), 3 * 68);
    assert_null(tn_dtype_get(TN_VQ2 + 1));
}

static void test_decode(void **st) {
    (void)st;
    size_t rb;
    const int64_t k = 3 * 256, rows = 5;
    uint8_t *t = make_tensor(k, rows, &rb);
    float y[3 * 256];
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = t + (size_t)r * rb;
        tn_kern_at(TN_ISA_SCALAR)->slot[TN_VQ2].to_float(row, y, k);
        for (int64_t b = 0; b < 3; b++)
            for (int p = 0; p < 4; p++)
                for (int j = 0; j < 64; j++) assert_float_equal(y[256 * b + 64 * p + j], weight_at(row, b, p, j), 0);
    }
    free(t);
}

/* sum of weight * activation in double, from the test's decode and q8_K's d * q */
static double dot_ref(const uint8_t *row, const block_q8_K *x, int64_t k) {
    double s = 0;
    for (int64_t b = 0; b < k / 256; b++)
        for (int p = 0; p < 4; p++)
            for (int j = 0; j < 64; j++) s += weight_at(row, b, p, j) * (double)x[b].d * x[b].qs[64 * p + j];
    return s;
}
static double dot_abs(const uint8_t *row, const block_q8_K *x, int64_t k) {
    double s = 0;
    for (int64_t b = 0; b < k / 256; b++)
        for (int p = 0; p < 4; p++)
            for (int j = 0; j < 64; j++) s += fabs(weight_at(row, b, p, j) * (double)x[b].d * x[b].qs[64 * p + j]);
    return s;
}

static void test_kernels(void **st) {
    (void)st;
    static const int64_t nblk[] = {1, 2, 3, 4, 7, 8, 13, 37, 131}; /* 131: past the gemm's kept biases */
    const tn_isa isas[] = {TN_ISA_SCALAR, TN_ISA_AVX2, TN_ISA_AVX512};
    int checked = 0;
    const size_t nn = sizeof nblk / sizeof nblk[0];
    for (size_t ib = 0; ib < 4 * nn; ib++) {
        const int64_t k = nblk[ib % nn] * 256, rows = 11, ncol = 9;
        const int cb_kind = (int)(ib / nn); /* general, sign-symmetric, symmetric but for a byte, two codebooks */
        size_t rb;
        uint8_t *t = make_tensor_cb(k, rows, &rb, cb_kind);
        const size_t xb = (size_t)(k / 256) * sizeof(block_q8_K);
        block_q8_K *x = malloc(xb * (size_t)ncol);
        float *xf = malloc(sizeof(float) * (size_t)k);
        for (int64_t c = 0; c < ncol; c++) {
            for (int64_t i = 0; i < k; i++) xf[i] = frand() * (1 + (i % 7 == 0) * 5.0f);
            tn_kern_at(TN_ISA_SCALAR)->slot[TN_Q8_K].from_float(xf, (uint8_t *)x + xb * (size_t)c, k);
        }
        for (size_t a = 0; a < sizeof isas / sizeof isas[0]; a++) {
            const tn_kern_table *kt = tn_kern_at(isas[a]);
            if (!kt) continue;
            for (int64_t r = 0; r < rows; r++) {
                const uint8_t *row = t + (size_t)r * rb;
                const block_q8_K *x0 = x;
                float s;
                kt->slot[TN_VQ2].vec_dot(k, &s, row, x0);
                const double tol = 1e-6 * dot_abs(row, x0, k) + 1e-30;
                if (!(fabs(s - dot_ref(row, x0, k)) <= tol))
                    fail_msg("vec_dot isa %d codebook %d k=%lld row %lld: %.9g vs %.9g", (int)isas[a], cb_kind, (long long)k, (long long)r, s,
                             dot_ref(row, x0, k));
            }
            /* gemm on a view of rows 2..10 (the header finds the codebook from any row) and n = 1..9 */
            for (int64_t n = 1; n <= ncol; n++) {
                const int64_t m = rows - 2, ldy = m + 3;
                float *y = malloc(sizeof(float) * (size_t)(ldy * n));
                kt->slot[TN_VQ2].gemm(k, m, n, t + 2 * rb, rb, x, xb, y, ldy);
                for (int64_t c = 0; c < n; c++)
                    for (int64_t i = 0; i < m; i++) {
                        const uint8_t *row = t + (size_t)(i + 2) * rb;
                        const block_q8_K *xc = (const block_q8_K *)((const uint8_t *)x + xb * (size_t)c);
                        const double ref = dot_ref(row, xc, k), tol = 1e-6 * dot_abs(row, xc, k) + 1e-30;
                        if (!(fabs(y[c * ldy + i] - ref) <= tol))
                            fail_msg("gemm isa %d codebook %d k=%lld n=%lld (%lld,%lld): %.9g vs %.9g", (int)isas[a], cb_kind, (long long)k,
                                     (long long)n, (long long)i, (long long)c, y[c * ldy + i], ref);
                        checked++;
                    }
                free(y);
            }
        }
        free(t), free(x), free(xf);
    }
    printf("vq2 kernels: %d gemm outputs checked; avx2 kernel %s; avx512 kernel %s\n", checked,
           tn_kern_at(TN_ISA_AVX2) && tn_kern_at(TN_ISA_AVX2)->slot[TN_VQ2].gemm_isa == TN_ISA_AVX2 ? "tested" : "not on this CPU",
           tn_kern_at(TN_ISA_AVX512) && tn_kern_at(TN_ISA_AVX512)->slot[TN_VQ2].vec_dot_isa == TN_ISA_AVX512 ? "tested"
                                                                                                         : "not on this CPU");
}

/* Quantizes rows x rows ne0 with imp (or NULL); returns the tensor bytes (caller frees). */
static uint8_t *quantize(const float *x, int64_t rows, int64_t ne0, const float *imp, uint64_t seed) {
    int8_t cb[1024];
    assert_int_equal(tn_vq_fit_codebook(x, rows, ne0, imp, seed, cb), TERN_OK);
    const size_t rb = tn_dtype_row_size(TN_VQ2, ne0), n = tn_dtype_tensor_size(TN_VQ2, ne0, rows);
    uint8_t *q = malloc(n);
    for (int64_t r = 0; r < rows; r++) tn_vq_quantize_row(cb, x + r * ne0, q + (size_t)r * rb, ne0, r, rows, imp);
    memcpy(q + n - 1024, cb, 1024);
    return q;
}

/* sum imp * (w - q)^2 / sum imp * w^2 over the tensor, with the test's decode */
static double rel_err(const float *x, const uint8_t *q, int64_t rows, int64_t ne0, const float *imp) {
    const size_t rb = tn_dtype_row_size(TN_VQ2, ne0);
    double e = 0, w = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < ne0 / 256; b++)
            for (int p = 0; p < 4; p++)
                for (int j = 0; j < 64; j++) {
                    const int64_t c = 256 * b + 64 * p + j;
                    const double h = imp ? imp[c] : 1.0, v = x[r * ne0 + c];
                    const double d = v - weight_at(q + (size_t)r * rb, b, p, j);
                    e += h * d * d, w += h * v * v;
                }
    return e / w;
}

static void test_quantizer(void **st) {
    (void)st;
    const int64_t rows = 96, ne0 = 512;
    float *x = malloc(sizeof(float) * (size_t)(rows * ne0)), *imp = malloc(sizeof(float) * (size_t)ne0);
    for (int64_t r = 0; r < rows; r++) {
        const double rs = 0.01 * (1 + r % 5); /* rows of different magnitude share the codebook */
        for (int64_t c = 0; c < ne0; c++) x[r * ne0 + c] = (float)(rs * grand());
    }
    for (int64_t c = 0; c < ne0; c++) imp[c] = c % 16 == 3 ? 50.0f : 0.5f + (float)(c % 5);
    uint8_t *q = quantize(x, rows, ne0, NULL, 7);
    const double e = rel_err(x, q, rows, ne0, NULL);
    printf("vq2 relative MSE on Gaussian rows: %.4f (Lloyd-Max 2-bit scalar 0.1175, bound at 2.1875 bits %.4f)\n", e,
           pow(2, -4.375));
    assert_true(e < 0.1175);
    assert_true(e > pow(2, -4.375));
    /* headers */
    const size_t rb = tn_dtype_row_size(TN_VQ2, ne0);
    for (int64_t r = 0; r < rows; r++) {
        uint32_t off;
        memcpy(&off, q + (size_t)r * rb, 4);
        assert_int_equal(off, (size_t)(rows - r) * rb);
    }
    /* the codebook is sign-symmetric: entry 128 + e = -entry e, component by component */
    const int8_t *cb = (const int8_t *)(q + (size_t)rows * rb);
    for (int p = 0; p < 4; p++)
        for (int e = 0; e < 128; e++) assert_int_equal(cb[256 * p + 128 + e], -cb[256 * p + e]);
    /* determinism */
    uint8_t *q2 = quantize(x, rows, ne0, NULL, 7);
    assert_memory_equal(q, q2, tn_dtype_tensor_size(TN_VQ2, ne0, rows));
    /* importance: the weighted error drops when the quantizer knows the weights */
    uint8_t *qi = quantize(x, rows, ne0, imp, 7);
    const double ew = rel_err(x, q, rows, ne0, imp), ewi = rel_err(x, qi, rows, ne0, imp);
    printf("vq2 importance-weighted relative MSE: %.4f without the importance, %.4f with\n", ew, ewi);
    assert_true(ewi < 0.9 * ew);
    /* an all-zero tensor quantizes to zeros, not NaN */
    memset(x, 0, sizeof(float) * (size_t)(rows * ne0));
    uint8_t *qz = quantize(x, 4, ne0, NULL, 1);
    float y[512];
    tn_kern()->slot[TN_VQ2].to_float(qz, y, ne0);
    for (int i = 0; i < ne0; i++) assert_true(y[i] == 0.0f);
    free(x), free(imp), free(q), free(q2), free(qi), free(qz);
}

/* sum over the calibration rows of |x (w - q)|^2 for every weight row: the layer's output error,
 * computed from the inputs X themselves (not from H) with the test's decode of q */
static double out_err(const float *X, int64_t m, const float *x, const uint8_t *q, int64_t rows, int64_t ne0) {
    const size_t rb = tn_dtype_row_size(TN_VQ2, ne0);
    double *d = malloc(sizeof(double) * (size_t)ne0), e = 0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < ne0 / 256; b++)
            for (int p = 0; p < 4; p++)
                for (int j = 0; j < 64; j++) {
                    const int64_t c = b * 256 + 64 * p + j;
                    d[c] = x[r * ne0 + c] - weight_at(q + (size_t)r * rb, b, p, j);
                }
        for (int64_t i = 0; i < m; i++) {
            double y = 0;
            for (int64_t c = 0; c < ne0; c++) y += X[i * ne0 + c] * d[c];
            e += y * y;
        }
    }
    free(d);
    return e;
}

/* Error feedback with the layer's Hessian: inputs with correlated columns (a random mixing of a
 * few strong directions, one column never active), H = X^T X; the output error measured through
 * X must drop well below the diagonal-only quantizer's with the same codebook; split rows give
 * the same bytes; a bad Hessian is refused. */
static void test_gptq(void **st) {
    (void)st;
    const int64_t rows = 40, ne0 = 512, m = 2048, rk = 48, dead = 77;
    float *X = malloc(sizeof(float) * (size_t)(m * ne0)), *M = malloc(sizeof(float) * (size_t)(rk * ne0));
    float *x = malloc(sizeof(float) * (size_t)(rows * ne0)), *H = calloc((size_t)(ne0 * ne0), sizeof(float));
    for (int64_t i = 0; i < rk * ne0; i++) M[i] = (float)grand();
    for (int64_t i = 0; i < m; i++) {
        double z[48]; /* this row's latent factors, of falling strength */
        for (int64_t k = 0; k < rk; k++) z[k] = grand() / (1.0 + 0.2 * (double)k);
        for (int64_t c = 0; c < ne0; c++) {
            double v = grand(); /* each column's own noise + the shared directions */
            for (int64_t k = 0; k < rk; k++) v += M[k * ne0 + c] * z[k];
            X[i * ne0 + c] = c == dead ? 0.0f : (float)v;
        }
    }
    for (int64_t a = 0; a < ne0; a++) /* upper triangle in double: an independent computation */
        for (int64_t b = a; b < ne0; b++) {
            double h = 0;
            for (int64_t i = 0; i < m; i++) h += (double)X[i * ne0 + a] * X[i * ne0 + b];
            H[a * ne0 + b] = (float)h;
        }
    for (int64_t i = 0; i < rows * ne0; i++) x[i] = (float)(0.02 * grand());
    tn_vq_gptq *g = NULL;
    assert_int_equal(tn_vq_gptq_create(H, ne0, 0.01f, &g), TERN_OK);
    const float *hd = tn_vq_gptq_diag(g);
    assert_true(hd[dead] == 0.0f && hd[3] == H[3 * ne0 + 3]);
    /* the diagonal-only quantizer, importance = diag H, and its codebook */
    uint8_t *qd = quantize(x, rows, ne0, hd, 11);
    const size_t n = tn_dtype_tensor_size(TN_VQ2, ne0, rows);
    int8_t cb[1024];
    memcpy(cb, qd + n - 1024, 1024);
    tn_vq_gptq_set_codebook(g, cb);
    uint8_t *qg = malloc(n), *qs = malloc(n);
    tn_vq_gptq_quantize_rows(g, x, qg, 0, rows, rows);
    memcpy(qg + n - 1024, cb, 1024);
    tn_vq_gptq_quantize_rows(g, x, qs, 0, 7, rows);
    tn_vq_gptq_quantize_rows(g, x, qs, 7, 23, rows);
    tn_vq_gptq_quantize_rows(g, x, qs, 23, rows, rows);
    memcpy(qs + n - 1024, cb, 1024);
    assert_memory_equal(qg, qs, n);
    const size_t rb = tn_dtype_row_size(TN_VQ2, ne0);
    for (int64_t r = 0; r < rows; r++) {
        uint32_t off;
        memcpy(&off, qg + (size_t)r * rb, 4);
        assert_int_equal(off, (size_t)(rows - r) * rb);
    }
    const double ed = out_err(X, m, x, qd, rows, ne0), eg = out_err(X, m, x, qg, rows, ne0);
    double ref = 0; /* the output's own size, for scale */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < m; i += 8) {
            double y = 0;
            for (int64_t c = 0; c < ne0; c++) y += X[i * ne0 + c] * x[r * ne0 + c];
            ref += 8 * y * y;
        }
    printf("vq2 output error / output: %.4f with diag(H) only, %.4f with error feedback (%.2fx lower)\n", ed / ref,
           eg / ref, ed / eg);
    assert_true(isfinite(eg));
    assert_true(eg < 0.5 * ed);
    tn_vq_gptq_free(g);
    /* a Hessian with a NaN or a negative diagonal is refused */
    H[5 * ne0 + 5] = NAN;
    assert_int_equal(tn_vq_gptq_create(H, ne0, 0.01f, &g), TERN_ERR_FORMAT);
    assert_null(g);
    H[5 * ne0 + 5] = -1.0f;
    assert_int_equal(tn_vq_gptq_create(H, ne0, 0.01f, &g), TERN_ERR_FORMAT);
    assert_int_equal(tn_vq_gptq_create(H, 300, 0.01f, &g), TERN_ERR_INVALID_ARG);
    free(X), free(M), free(x), free(H), free(qd), free(qg), free(qs);
}

static void test_gguf(void **st) {
    (void)st;
    size_t rb;
    const int64_t k = 512, rows = 3;
    uint8_t *t = make_tensor(k, rows, &rb);
    const size_t n = tn_dtype_tensor_size(TN_VQ2, k, rows);
    for (int bad = 0; bad < 2; bad++) {
        if (bad) t[rb] ^= 1; /* row 1's header */
        tn_gguf_writer *w;
        assert_int_equal(tn_gguf_writer_create(&w), TERN_OK);
        const int64_t ne[2] = {k, rows};
        assert_int_equal(tn_gguf_add_tensor(w, "m.weight", TN_VQ2, 2, ne, t), TERN_OK);
        uint8_t *buf;
        size_t size;
        assert_int_equal(tn_gguf_write_mem(w, NULL, NULL, &buf, &size), TERN_OK);
        tn_gguf_writer_free(w);
        tn_gguf *g = NULL;
        tern_status s = tn_gguf_parse(buf, size, &g);
        if (bad) {
            assert_int_equal(s, TERN_ERR_FORMAT);
            assert_non_null(strstr(tern_last_error(), "header"));
            tn_free(buf);
            continue;
        }
        assert_int_equal(s, TERN_OK);
        assert_int_equal(g->tensors[0].nbytes, n);
        assert_memory_equal(g->tensors[0].data, t, n);
        float y[512];
        tn_kern()->slot[TN_VQ2].to_float(g->tensors[0].data + rb, y, k);
        for (int p = 0; p < 4; p++)
            for (int j = 0; j < 64; j++) assert_float_equal(y[64 * p + j], weight_at(t + rb, 0, p, j), 0);
        tn_gguf_free(g);
        tn_free(buf);
    }
    free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traits), cmocka_unit_test(test_decode), cmocka_unit_test(test_kernels),
        cmocka_unit_test(test_quantizer), cmocka_unit_test(test_gptq), cmocka_unit_test(test_gguf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
