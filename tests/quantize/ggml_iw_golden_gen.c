/*
 * ggml_iw_golden_gen.c — NOT part of the build. Regenerates the golden table of test_quant_iw.c
 * by running llama.cpp's own importance-weighted quantizers (ggml's quantize_<t> with
 * quant_weights, i.e. quantize_row_<t>_impl: what llama-quantize --imatrix runs) on the inputs of
 * tests/quant/quant_data.h with the importance vectors iw_fill() below.
 *
 * Build against a llama.cpp checkout at commit 34af94cd9 (G = its ggml/ folder), baseline x86-64,
 * no FMA contraction (as ggml-base is built on x86-64):
 *
 *   cc -O2 -std=gnu11 -ffp-contract=off -I$G/include -I$G/src -I$G/src/ggml-cpu -Itests/quant \
 *      -Itests/quantize tests/quantize/ggml_iw_golden_gen.c $G/src/ggml-quants.c -lm -o gen
 *   ./gen > golden.inc      (then paste the table into test_quant_iw.c)
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-common.h"
#include "ggml-impl.h"
#include "ggml-quants.h"
#include "iw_data.h"

/* ---- the few ggml symbols ggml-quants.c needs, outside ggml.c -------------------------------- */
float ggml_table_f32_f16[1 << 16];
void ggml_abort(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "ggml_abort %s:%d %s\n", file, line, fmt);
    abort();
}
const char *ggml_type_name(enum ggml_type type) { (void)type; return "?"; }
size_t ggml_type_size(enum ggml_type type) { (void)type; abort(); }

typedef size_t (*qfn)(const float *, void *, int64_t, int64_t, const float *);
static const struct {
    const char *name;
    enum ggml_type type;
    size_t block_bytes;
    int block_len;
    qfn q;
} types[] = {
    {"q2_K", GGML_TYPE_Q2_K, sizeof(block_q2_K), QK_K, quantize_q2_K}, {"q3_K", GGML_TYPE_Q3_K, sizeof(block_q3_K), QK_K, quantize_q3_K},
    {"q4_K", GGML_TYPE_Q4_K, sizeof(block_q4_K), QK_K, quantize_q4_K}, {"q5_K", GGML_TYPE_Q5_K, sizeof(block_q5_K), QK_K, quantize_q5_K},
    {"q6_K", GGML_TYPE_Q6_K, sizeof(block_q6_K), QK_K, quantize_q6_K}, {"q4_0", GGML_TYPE_Q4_0, sizeof(block_q4_0), QK4_0, quantize_q4_0},
    {"q4_1", GGML_TYPE_Q4_1, sizeof(block_q4_1), QK4_1, quantize_q4_1}, {"q5_0", GGML_TYPE_Q5_0, sizeof(block_q5_0), QK5_0, quantize_q5_0},
    {"q5_1", GGML_TYPE_Q5_1, sizeof(block_q5_1), QK5_1, quantize_q5_1}, {"q8_0", GGML_TYPE_Q8_0, sizeof(block_q8_0), QK8_0, quantize_q8_0},
};
#define N_TYPES (int)(sizeof types / sizeof types[0])

size_t ggml_row_size(enum ggml_type type, int64_t ne) {
    for (int t = 0; t < N_TYPES; t++)
        if (types[t].type == type) return (size_t)(ne / types[t].block_len) * types[t].block_bytes;
    abort();
}

int main(void) {
    for (int i = 0; i < (1 << 16); i++) ggml_table_f32_f16[i] = GGML_COMPUTE_FP16_TO_FP32((ggml_fp16_t)i);
    static float x[IW_ROWS * IW_COLS], w[IW_COLS];
    static uint8_t q[IW_ROWS * IW_COLS * 2];
    printf("static const iw_golden iw_golden_rows[] = {\n");
    for (int t = 0; t < N_TYPES; t++)
        for (int p = 0; p < TQ_N_PATTERNS; p++)
            for (int v = 0; v < IW_N_IMAT; v++) {
                tq_fill(p, 1, x, IW_ROWS * IW_COLS);
                iw_fill(v, w);
                memset(q, 0, sizeof q);
                const size_t n = types[t].q(x, q, IW_ROWS, IW_COLS, w);
                printf("    {\"%s\", %d, %d, UINT64_C(0x%016llx)},\n", types[t].name, p, v, (unsigned long long)tq_fnv1a(q, n));
            }
    printf("};\n");
    return 0;
}
