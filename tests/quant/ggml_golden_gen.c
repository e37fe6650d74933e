/*
 * ggml_golden_gen.c — NOT part of the build. Regenerates the golden tables of
 * test_quant_golden.c by running llama.cpp's own reference code (ggml-quants.c and the generic
 * dot products of ggml-cpu/quants.c) on the inputs of quant_data.h.
 *
 * Build against a llama.cpp checkout at commit 34af94cd9 (G = its ggml/ folder), baseline x86-64,
 * no FMA contraction (as ggml-base is built on x86-64):
 *
 *   cc -O2 -std=gnu11 -ffp-contract=off -I$G/include -I$G/src -I$G/src/ggml-cpu -Itests/quant \
 *      tests/quant/ggml_golden_gen.c $G/src/ggml-quants.c $G/src/ggml-cpu/quants.c -lm -o gen
 *   ./gen > golden.inc      (then paste the two tables into test_quant_golden.c)
 *
 * Output buffers are zeroed before quantizing: ggml leaves q8_K's bsums unwritten for all-zero
 * super-blocks, tern writes zeros there.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-common.h"
#include "ggml-cpu/quants.h"
#include "ggml-impl.h"
#include "ggml-quants.h"
#include "quant_data.h"

/* ---- the few ggml symbols ggml-quants.c / quants.c need, outside ggml.c ---------------------- */
float ggml_table_f32_f16[1 << 16];
void ggml_abort(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "ggml_abort %s:%d %s\n", file, line, fmt);
    abort();
}
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void)type; (void)ne; abort(); }
const char *ggml_type_name(enum ggml_type type) { (void)type; return "?"; }
size_t ggml_type_size(enum ggml_type type) { (void)type; abort(); }

typedef void (*quant_fn)(const float *, void *, int64_t);
typedef void (*deq_fn)(const void *, float *, int64_t);
typedef void (*dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);

#define Q(name) (quant_fn)quantize_row_##name##_ref
#define D(name) (deq_fn)dequantize_row_##name

static const struct {
    const char *name;
    size_t block_bytes;
    int block_len;
    quant_fn quant;
    deq_fn deq;
    dot_fn dot;       /* against act */
    const char *act;  /* activation type name */
} types[] = {
    {"q4_0", sizeof(block_q4_0), QK4_0, Q(q4_0), D(q4_0), ggml_vec_dot_q4_0_q8_0_generic, "q8_0"},
    {"q4_1", sizeof(block_q4_1), QK4_1, Q(q4_1), D(q4_1), ggml_vec_dot_q4_1_q8_1_generic, "q8_1"},
    {"q5_0", sizeof(block_q5_0), QK5_0, Q(q5_0), D(q5_0), ggml_vec_dot_q5_0_q8_0_generic, "q8_0"},
    {"q5_1", sizeof(block_q5_1), QK5_1, Q(q5_1), D(q5_1), ggml_vec_dot_q5_1_q8_1_generic, "q8_1"},
    {"q8_0", sizeof(block_q8_0), QK8_0, Q(q8_0), D(q8_0), ggml_vec_dot_q8_0_q8_0_generic, "q8_0"},
    {"q8_1", sizeof(block_q8_1), QK8_1, Q(q8_1), NULL, NULL, NULL},
    {"q2_K", sizeof(block_q2_K), QK_K, Q(q2_K), D(q2_K), ggml_vec_dot_q2_K_q8_K_generic, "q8_K"},
    {"q3_K", sizeof(block_q3_K), QK_K, Q(q3_K), D(q3_K), ggml_vec_dot_q3_K_q8_K_generic, "q8_K"},
    {"q4_K", sizeof(block_q4_K), QK_K, Q(q4_K), D(q4_K), ggml_vec_dot_q4_K_q8_K_generic, "q8_K"},
    {"q5_K", sizeof(block_q5_K), QK_K, Q(q5_K), D(q5_K), ggml_vec_dot_q5_K_q8_K_generic, "q8_K"},
    {"q6_K", sizeof(block_q6_K), QK_K, Q(q6_K), D(q6_K), ggml_vec_dot_q6_K_q8_K_generic, "q8_K"},
    {"q8_K", sizeof(block_q8_K), QK_K, Q(q8_K), D(q8_K), NULL, NULL},
};
#define N_TYPES (int)(sizeof types / sizeof types[0])
#define N 1024

static int find(const char *name) {
    for (int t = 0; t < N_TYPES; t++)
        if (!strcmp(types[t].name, name)) return t;
    abort();
}

static void quantize(int t, const float *x, void *buf) {
    memset(buf, 0, (size_t)(N / types[t].block_len) * types[t].block_bytes);
    types[t].quant(x, buf, N);
}

int main(void) {
    for (int i = 0; i < (1 << 16); i++) ggml_table_f32_f16[i] = GGML_COMPUTE_FP16_TO_FP32((ggml_fp16_t)i);
    static float x[N], y[N], act[N];
    static uint8_t qw[N * 2], qa[N * 2];

    /* Quantized bytes and dequantized floats, per type and pattern (seed 1). */
    printf("static const tq_golden_row tq_golden_quant[] = {\n");
    for (int t = 0; t < N_TYPES; t++) {
        for (int p = 0; p < TQ_N_PATTERNS; p++) {
            tq_fill(p, 1, x, N);
            quantize(t, x, qw);
            const uint64_t hq = tq_fnv1a(qw, (size_t)(N / types[t].block_len) * types[t].block_bytes);
            uint64_t hd = 0;
            if (types[t].deq) {
                types[t].deq(qw, y, N);
                hd = tq_fnv1a(y, sizeof y);
            }
            printf("    {\"%s\", %d, UINT64_C(0x%016llx), UINT64_C(0x%016llx)},\n", types[t].name, p,
                   (unsigned long long)hq, (unsigned long long)hd);
        }
    }
    printf("};\n\n");

    /* Dot products: weights from pattern p (seed 1), activations from pattern 0 (seed 2), over
     * k = N and k = one block; the float result's bits. */
    printf("static const tq_golden_dot tq_golden_dots[] = {\n");
    for (int t = 0; t < N_TYPES; t++) {
        if (!types[t].dot) continue;
        const int a = find(types[t].act);
        tq_fill(0, 2, act, N);
        quantize(a, act, qa);
        for (int p = 0; p < TQ_N_PATTERNS; p++) {
            tq_fill(p, 1, x, N);
            quantize(t, x, qw);
            float s_all, s_one;
            types[t].dot(N, &s_all, 0, qw, 0, qa, 0, 1);
            types[t].dot(types[t].block_len, &s_one, 0, qw, 0, qa, 0, 1);
            uint32_t b_all, b_one;
            memcpy(&b_all, &s_all, 4);
            memcpy(&b_one, &s_one, 4);
            printf("    {\"%s\", %d, 0x%08xu, 0x%08xu}, /* %.9g %.9g */\n", types[t].name, p, b_all, b_one, s_all, s_one);
        }
    }
    printf("};\n");
    return 0;
}
