/*
 * tq.c (scalar) — kernel-table entries of tern's any-bit types: one wrapper per (bits, group,
 * asym) around the references in quant/tq.c. These are what the AVX2 / AVX-512 kernels are
 * parity-tested against (tests/quantize/test_tq.c).
 */
#include "kern/kern.h"
#include "kern/tq_list.inc"
#include "quant/tq.h"

#define TQ_SCALAR(b, g, a)                                                                                          \
    static void tq_dot_##b##_##g##_##a(int64_t k, float *s, const void *w, const void *x) {                        \
        const tn_tq_params p = {b, g, a};                                                                           \
        *s = tn_tq_vec_dot_ref(&p, k, w, x);                                                                        \
    }                                                                                                               \
    static void tq_gemm_##b##_##g##_##a(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, \
                                        size_t x_rb, float *y, int64_t ldy) {                                       \
        tn_gemm_by_vec_dot(tq_dot_##b##_##g##_##a, k, m, n, w, w_rb, x, x_rb, y, ldy);                              \
    }                                                                                                               \
    static void tq_to_##b##_##g##_##a(const void *x, float *y, int64_t k) {                                         \
        const tn_tq_params p = {b, g, a};                                                                           \
        tn_tq_dequantize_row(&p, x, y, k);                                                                          \
    }                                                                                                               \
    static void tq_from_##b##_##g##_##a(const float *x, void *y, int64_t k) {                                       \
        const tn_tq_params p = {b, g, a};                                                                           \
        tn_tq_quantize_row(&p, x, y, k, NULL);                                                                      \
    }
TN_TQ_LIST(TQ_SCALAR)

void tn_kern_register_tq_scalar(tn_kern_table *t) {
#define TQ_REG(b, g, a)                                                                                             \
    {                                                                                                               \
        const tn_tq_params p = {b, g, a};                                                                           \
        tn_kern_slot *s = &t->slot[tn_tq_dtype(&p)];                                                                \
        s->vec_dot = tq_dot_##b##_##g##_##a;                                                                        \
        s->gemm = tq_gemm_##b##_##g##_##a;                                                                          \
        s->to_float = tq_to_##b##_##g##_##a;                                                                        \
        s->from_float = tq_from_##b##_##g##_##a;                                                                    \
        s->vec_dot_isa = s->gemm_isa = s->to_float_isa = s->from_float_isa = TN_ISA_SCALAR;                         \
    }
    TN_TQ_LIST(TQ_REG)
    t->tq_quantize = tn_tq_quantize_row;
    t->tq_quantize_isa = TN_ISA_SCALAR;
#undef TQ_REG
}
