/*
 * registry.c — builds the kernel tables: scalar references first, then each ISA level up to the
 * requested one overrides what it implements.
 */
#include <pthread.h>
#include <string.h>

#include "kern/kern.h"

static tn_kern_table tn_tables[TN_ISA_COUNT];
static pthread_once_t tn_once = PTHREAD_ONCE_INIT;
static tn_isa tn_max_isa;

static void tn_kern_build(void) {
    /* tn_cpu_isa() already applies the TERN_ISA cap; for tn_kern_at we need the hardware max. */
    const tn_cpu *c = tn_cpu_get();
    tn_max_isa = TN_ISA_SCALAR;
    if (c->avx2 && c->fma && c->f16c) tn_max_isa = TN_ISA_AVX2;
    if (tn_max_isa == TN_ISA_AVX2 && c->avx512f && c->avx512bw && c->avx512vl && c->avx512dq) tn_max_isa = TN_ISA_AVX512;
    for (int lvl = 0; lvl <= (int)tn_max_isa; lvl++) {
        tn_kern_table *t = &tn_tables[lvl];
        memset(t, 0, sizeof *t);
        tn_kern_register_scalar(t);
        tn_kern_register_attn_scalar(t);
        tn_kern_register_tq_scalar(t);
        tn_kern_register_vq_scalar(t);
        if (lvl >= TN_ISA_AVX2) {
            tn_kern_register_avx2(t);
            tn_kern_register_attn_avx2(t);
            tn_kern_register_attn_q_avx2(t);
            tn_kern_register_tq_avx2(t);
            tn_kern_register_vq_avx2(t);
        }
        if (lvl >= TN_ISA_AVX512) {
            tn_kern_register_avx512(t);
            tn_kern_register_attn_avx512(t);
            tn_kern_register_attn_q_avx512(t);
            tn_kern_register_tq_avx512(t);
            tn_kern_register_vq_avx512(t);
            tn_kern_register_gemv_avx512(t);
            tn_kern_register_repack_avx512(t);
            tn_kern_register_repack_k_avx512(t);
            tn_kern_register_ktile_avx512(t);
            tn_kern_register_l32_avx512(t);
        }
    }
}

const tn_kern_table *tn_kern_at(tn_isa isa) {
    pthread_once(&tn_once, tn_kern_build);
    if ((int)isa < 0 || isa > tn_max_isa) return NULL;
    return &tn_tables[isa];
}

const tn_kern_table *tn_kern(void) { return tn_kern_at(tn_cpu_isa()); }

void tn_gemm_by_vec_dot(tn_vec_dot_fn dot, int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                        size_t x_rb, float *y, int64_t ldy) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++)
            dot(k, &y[j * ldy + i], (const uint8_t *)w + (size_t)i * w_rb, (const uint8_t *)x + (size_t)j * x_rb);
}
