/*
 * test_quant_models.c — the definitive bit-exactness check: llama.cpp's llama-quantize produced
 * stories260K-{F16,Q8_0,Q4_0,Q4_K_M,Q2_K}.gguf from the same F32 weights as stories260K-F32.gguf.
 * For every tensor of a quantized file whose type tern has a reference quantizer for, quantizing
 * the F32 tensor's rows with tern's reference must give the file's bytes exactly.
 *
 * The model is tiny (n_embd 64, n_ff 172), so llama-quantize falls back from k-quants to q5_0 /
 * q4_0 / q8_0 / f16 for rows that are not whole super-blocks: these files exercise q8_0, q4_0,
 * q5_0 and f16; k-quants are covered by test_quant_golden.c. The test also requires that each
 * file contributes at least one compared tensor of its expected types, so a silent "nothing
 * compared" cannot pass.
 *
 * Exits 77 (skipped) when $TERN_SHARED_DIR/models does not exist.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "fmt/gguf.h"
#include "quant/quant.h"

static char g_dir[4200]; /* .../models/stories260K */

static tn_gguf *open_model(const char *variant) {
    char path[4400];
    snprintf(path, sizeof path, "%s/stories260K-%s.gguf", g_dir, variant);
    tn_gguf *g = NULL;
    const tern_status st = tn_gguf_open(path, true, &g);
    if (st != TERN_OK) fprintf(stderr, "open %s: %s\n", path, tern_last_error());
    assert_int_equal(st, TERN_OK);
    return g;
}

/* Compares every tensor of `variant` that tern can quantize with its re-quantized F32 source.
 * expect lists types that must be compared at least once (terminated by -1). */
static void check_variant(const char *variant, const int *expect) {
    tn_gguf *f32 = open_model("F32");
    tn_gguf *q = open_model(variant);
    int compared[TN_DTYPE_GGML_COUNT] = {0};
    int mismatched = 0;
    for (uint64_t i = 0; i < q->n_tensors; i++) {
        const tn_gguf_tensor *tq = &q->tensors[i];
        if (tq->type == TN_F32) continue; /* norms stay f32: a copy, nothing to learn */
        const tn_gguf_tensor *ts = tn_gguf_find_tensor(f32, tq->name);
        assert_non_null(ts);
        assert_int_equal(ts->type, TN_F32);
        assert_memory_equal(ts->ne, tq->ne, sizeof ts->ne);

        /* Re-quantize the source rows (ne[0] per row, the rest flattened). */
        const int64_t n_per_row = ts->ne[0];
        const int64_t nrows = ts->ne[1] * ts->ne[2] * ts->ne[3];
        uint8_t *buf = malloc(tq->nbytes + 1);
        assert_non_null(buf);
        /* The mapping is only 1-byte aligned in general; copy the floats out. */
        float *src = malloc((size_t)(n_per_row * nrows) * sizeof(float));
        assert_non_null(src);
        memcpy(src, ts->data, (size_t)(n_per_row * nrows) * sizeof(float));
        const size_t n = tn_quantize_rows_ref((tn_dtype)tq->type, src, buf, nrows, n_per_row);
        if (n == 0) {
            fprintf(stderr, "%s: %s has type %s, no reference quantizer (not compared)\n", variant, tq->name,
                    tn_dtype_name(tq->type));
        } else {
            assert_int_equal(n, tq->nbytes);
            if (memcmp(buf, tq->data, n) != 0) {
                size_t at = 0;
                while (buf[at] == tq->data[at]) at++;
                fprintf(stderr, "%s: %s (%s, %lld x %lld): first differing byte %zu: tern %02x, llama.cpp %02x\n",
                        variant, tq->name, tn_dtype_name(tq->type), (long long)n_per_row, (long long)nrows, at,
                        buf[at], tq->data[at]);
                mismatched++;
            }
            compared[tq->type]++;
        }
        free(src);
        free(buf);
    }
    fprintf(stderr, "stories260K-%s:", variant);
    for (int t = 0; t < TN_DTYPE_GGML_COUNT; t++)
        if (compared[t]) fprintf(stderr, " %d x %s", compared[t], tn_dtype_name((uint32_t)t));
    fprintf(stderr, " tensors compared, %d mismatched\n", mismatched);
    for (const int *e = expect; *e >= 0; e++) assert_true(compared[*e] > 0);
    assert_int_equal(mismatched, 0);
    tn_gguf_free(q);
    tn_gguf_free(f32);
}

static void test_f16(void **state) {
    (void)state;
    const int expect[] = {TN_F16, -1};
    check_variant("F16", expect);
}

static void test_q8_0(void **state) {
    (void)state;
    const int expect[] = {TN_Q8_0, TN_F16, -1};
    check_variant("Q8_0", expect);
}

static void test_q4_0(void **state) {
    (void)state;
    const int expect[] = {TN_Q4_0, TN_Q8_0, -1};
    check_variant("Q4_0", expect);
}

static void test_q4_k_m(void **state) {
    (void)state;
    const int expect[] = {TN_Q5_0, TN_Q8_0, -1};
    check_variant("Q4_K_M", expect);
}

static void test_q2_k(void **state) {
    (void)state;
    const int expect[] = {TN_Q4_0, TN_Q8_0, -1};
    check_variant("Q2_K", expect);
}

int main(void) {
    /* Skip (77) without the shared models folder; everything after that must be present. */
    const char *shared = getenv("TERN_SHARED_DIR");
    char models[4096];
    struct stat st;
    snprintf(models, sizeof models, "%s/models", shared ? shared : "");
    if (!shared || stat(models, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "test_quant_models: %s not found, skipping\n", models);
        return 77;
    }
    snprintf(g_dir, sizeof g_dir, "%s/stories260K", models);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16), cmocka_unit_test(test_q8_0), cmocka_unit_test(test_q4_0),
        cmocka_unit_test(test_q4_k_m), cmocka_unit_test(test_q2_k),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
