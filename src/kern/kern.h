/*
 * kern.h — kernel contracts and the per-type kernel table.
 *
 * A weight type t is multiplied against activations quantized to tn_dtype_get(t)->vec_dot_type
 * (ggml's scheme: q4_0/q5_0/q8_0 x q8_0, q4_1/q5_1 x q8_1, k-quants x q8_K; f16 x f16,
 * bf16 x bf16, f32 x f32). The table is filled with scalar references first and then overridden
 * by the best ISA the CPU has (BLIS style: src/kern/<isa>/register.c fills its entries), once.
 *
 * Kernel names: tn_k_<op>_<wtype>[_<atype>]__<isa>, same file names in every ISA folder.
 * Every optimized kernel has a scalar reference it is parity-tested against (tests/kern/).
 */
#ifndef TN_KERN_KERN_H
#define TN_KERN_KERN_H

#include "core/cpu.h"
#include "quant/tq.h"
#include "tensor/dtype.h"

/* *s = dot(w[0..k), x[0..k)); w in the weight type, x in its vec_dot_type; k % block == 0. */
typedef void (*tn_vec_dot_fn)(int64_t k, float *s, const void *w, const void *x);
/* Converts k floats into a row of the slot's type (activation quantization); k % block == 0. */
typedef void (*tn_from_float_fn)(const float *x, void *y, int64_t k);
/* Converts a row of the slot's type into k floats. */
typedef void (*tn_to_float_fn)(const void *x, float *y, int64_t k);
/* Tile product: y[j*ldy + i] = dot(row i of w, row j of x) for 0 <= i < m, 0 <= j < n.
 * Rows of w are w_rb bytes apart, rows of x (already in vec_dot_type) x_rb bytes apart. */
typedef void (*tn_gemm_fn)(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, size_t x_rb,
                           float *y, int64_t ldy);

typedef struct tn_kern_slot {
    tn_vec_dot_fn vec_dot;
    tn_gemm_fn gemm;
    tn_from_float_fn from_float;
    tn_to_float_fn to_float;
    /* gemm is a row-streaming kernel for n <= gemm_nrow (0 = 1: decode only): the matmul driver
     * gives it whole thread ranges for such n instead of cache blocks */
    int32_t gemm_nrow;
    /* ISA each entry came from, for `tern info` */
    tn_isa vec_dot_isa, gemm_isa, from_float_isa, to_float_isa;
} tn_kern_slot;

/* Attention of nh query heads over T cached positions with an online softmax — llama.cpp's CPU
 * flash-attention numerics, so greedy outputs agree:
 *   s_t = scale * (q · K_t);  out = sum_t softmax(s)_t V_t
 * Head j's query is q + j * hd and its output out + j * hd (hd floats); it reads kv head j / rep
 * (rep query heads per kv head, grouped-query attention): position t's K row is
 * K + (j / rep) * hd + row(t) * ldkv (likewise V), f16, where row(t) = t for a contiguous cache
 * (blocks == NULL) or blocks[t / block_rows] * block_rows + t % block_rows for a paged one. Heads
 * are independent; several per call let a kernel share the K / V rows of a group and overlap the
 * heads' serial accumulations.
 * With acc16 (ggml's per-query path) q is rounded to f16 for the dot products and the V
 * accumulator is kept in f16 (rounded after every update, y = f16(fma(v, w, y))); without (ggml's
 * tiled path for >= 64 queries) everything is f32. scratch holds 2 * hd * nh floats. */
typedef void (*tn_attn_fn)(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, const uint16_t *K,
                           const uint16_t *V, int64_t ldkv, const int32_t *blocks, int64_t block_rows, float scale,
                           bool acc16, float *out, float *scratch);

/* tn_attn_fn with soft-capped scores (gemma2's attn_logit_softcapping, cap > 0), in ggml's order:
 *   s_t = cap * tanh((scale / cap) * (q · K_t))
 * The scalar reference and AVX-512 (the plain kernel's, with tanh on each 16 scores); AVX2 tables
 * keep the reference (a family's per-layer choice; llama's path does not pay for it). */
typedef void (*tn_attn_softcap_fn)(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, const uint16_t *K,
                                   const uint16_t *V, int64_t ldkv, const int32_t *blocks, int64_t block_rows,
                                   float scale, float cap, bool acc16, float *out, float *scratch);

/* tn_attn_fn over a cache whose K rows are of type tk and V rows of type tv (each TN_F16, TN_Q8_0
 * or TN_Q4_0; hd % 32 == 0 for the quantized ones), k_rb / v_rb bytes apart; K and V point at the
 * first kv head's first block, kv head g is hd values (whole blocks) further. The quantized rows
 * are read directly, in llama.cpp's flash-attention arithmetic for such caches:
 *   K quantized: q is quantized to q8_0 (the table's q8_0 activation quantizer, ggml's from_float
 *     of the vec_dot type) and s_t = scale * vec_dot(K_t, q8(q)) (q4_0 x q8_0 or q8_0 x q8_0);
 *     K f16: as tn_attn_fn (q rounded to f16 with acc16);
 *   V quantized: the V accumulator is f32 whatever acc16 (acc += v_t * w, v_t dequantized);
 *     V f16: as tn_attn_fn (f16 accumulator with acc16).
 * cap > 0 soft-caps the scores as tn_attn_softcap_fn does; cap == 0: none. scratch as tn_attn_fn. */
typedef void (*tn_attn_q_fn)(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int32_t tk,
                             const void *K, size_t k_rb, int32_t tv, const void *V, size_t v_rb, const int32_t *blocks,
                             int64_t block_rows, float scale, float cap, bool acc16, float *out, float *scratch);

/* Attention over a cache whose K is per-channel (quant/kc.h, tqc<kbits>: groups of TN_KC_ROWS = 16
 * positions, which must be the cache's block_rows) with the newest keys in f16: keys t < Q,
 * Q = T - T % 16 (complete groups), are read from K (rows k_rb bytes apart, kv head g at
 * tn_kc_row_bytes(kbits, g * hd) from K), keys Q <= t < T from the window — position t's f16 K row
 * at Kw + (t % W) * ldw, kv head g hd values further (W >= T - Q). V rows (type tv, as
 * tn_attn_q_fn) are all in the cache. Scores: complete groups s_t = scale * sum_c q_c (d_c q_tc +
 * m_c); window keys as tn_attn_fn's f16 K (q rounded to f16 with acc16); V and the softmax as
 * tn_attn_q_fn; cap > 0 soft-caps. hd % 32 == 0, hd <= TN_KC_MAX_HD. scratch as tn_attn_fn. */
#define TN_KC_MAX_HD 512
typedef void (*tn_attn_kc_fn)(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int kbits, const void *K,
                              size_t k_rb, const uint16_t *Kw, int64_t ldw, int64_t W, int32_t tv, const void *V,
                              size_t v_rb, const int32_t *blocks, float scale, float cap, bool acc16, float *out,
                              float *scratch);

/* Row of position t in a (possibly paged) cache; see tn_attn_fn. */
static inline int64_t tn_kv_row(const int32_t *blocks, int64_t block_rows, int64_t t) {
    return blocks ? (int64_t)blocks[t / block_rows] * block_rows + t % block_rows : t;
}

/* Byte offset of kv head g in a K / V cache row of type t (TN_F16, TN_Q8_0, TN_Q4_0; hd values a
 * head, whole blocks for the quantized types). */
static inline size_t tn_kv_head_off(int32_t t, int64_t hd, int64_t g) {
    const tn_dtype_traits *tr = tn_dtype_get((uint32_t)t);
    return (size_t)(g * hd / tr->blck_size) * tr->type_size;
}

/* rows[i] = tn_kv_row(blocks, block_rows, t0 + i) for i < n, with one division (not one a key). */
static inline void tn_kv_rows(const int32_t *blocks, int64_t block_rows, int64_t t0, int n, int64_t *rows) {
    if (!blocks) {
        for (int i = 0; i < n; i++) rows[i] = t0 + i;
        return;
    }
    int64_t bi = t0 / block_rows, off = t0 % block_rows;
    for (int i = 0; i < n; i++) {
        rows[i] = (int64_t)blocks[bi] * block_rows + off;
        if (++off == block_rows) off = 0, bi++;
    }
}

/* SwiGLU in place: g[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i], i < n. The reference
 * (scalar/attn.c) uses libm's expf; vector versions an exp within 2 ulp (parity-tested). */
typedef void (*tn_swiglu_fn)(float *g, const float *u, int64_t n);
/* GeGLU in place (Gemma's gelu_pytorch_tanh, ggml's gelu): g[i] = 0.5 g (1 + tanh(y)) u[i] with
 * y = sqrt(2/pi) (g + 0.044715 g^3). The reference (scalar/attn.c) uses libm's tanhf; vector
 * versions the identity 0.5 (1 + tanh(y)) = 1 / (1 + exp(-2y)) with their exp (parity-tested). */
typedef tn_swiglu_fn tn_geglu_fn;

/* Weight quantization into a tern any-bit type: k floats (k % G == 0) into k / G blocks, with the
 * importance of each column or NULL. The reference is quant/tq.c tn_tq_quantize_row; vector
 * versions give the same bytes (tests/quantize/test_tq.c). */
typedef void (*tn_tq_quantize_fn)(const tn_tq_params *p, const float *x, void *y, int64_t k, const float *imatrix);

/* One slot per dtype id below TN_DTYPE_SLOT_COUNT (ggml ids, then tern's tq ids from
 * TN_DTYPE_TERN_BASE), plus the non-type-specific kernels. */
typedef struct tn_kern_table {
    tn_kern_slot slot[TN_DTYPE_SLOT_COUNT];
    tn_attn_fn attn;
    tn_isa attn_isa;
    tn_attn_softcap_fn attn_softcap;
    tn_attn_q_fn attn_q; /* a quantized KV cache (either of K, V not f16) */
    tn_attn_kc_fn attn_kc; /* a per-channel K cache (the scalar reference on every ISA) */
    tn_isa attn_q_isa;
    tn_swiglu_fn swiglu;
    tn_isa swiglu_isa;
    tn_geglu_fn geglu;
    tn_isa geglu_isa;
    tn_tq_quantize_fn tq_quantize;
    tn_isa tq_quantize_isa;
} tn_kern_table;

/* The table for the CPU's ISA (after the TERN_ISA cap); built once, thread-safe. */
const tn_kern_table *tn_kern(void);
/* The table as it would be at a given ISA level (for parity tests and benchmarks); NULL if the
 * CPU cannot run that level. Built once per level. */
const tn_kern_table *tn_kern_at(tn_isa isa);

/* Fillers, one per ISA folder: set the entries that ISA implements, leave the rest. */
void tn_kern_register_scalar(tn_kern_table *t);
void tn_kern_register_avx2(tn_kern_table *t);
void tn_kern_register_avx512(tn_kern_table *t);

/* Attention kernels (src/kern/<isa>/attn.c). */
void tn_kern_register_attn_scalar(tn_kern_table *t);
void tn_kern_register_attn_avx2(tn_kern_table *t);
void tn_kern_register_attn_avx512(tn_kern_table *t);
/* Attention over a quantized KV cache (src/kern/avx2/attn_q.c, src/kern/avx512/attn_q.c). */
void tn_kern_register_attn_q_avx2(tn_kern_table *t);
void tn_kern_register_attn_q_avx512(tn_kern_table *t);

/* tern any-bit (tq) kernels (src/kern/<isa>/tq.c); called after the ISA's main filler. */
void tn_kern_register_tq_scalar(tn_kern_table *t);
void tn_kern_register_tq_avx2(tn_kern_table *t);
void tn_kern_register_tq_avx512(tn_kern_table *t);
/* tern codebook (vq) kernels (src/kern/<isa>/vq.c); called after the tq kernels. The avx512
 * ones need AVX512-VBMI and VNNI (registered only on CPUs that have both). */
void tn_kern_register_vq_scalar(tn_kern_table *t);
void tn_kern_register_vq_avx2(tn_kern_table *t);
void tn_kern_register_vq_avx512(tn_kern_table *t);
/* Decode (n == 1) kernels wrapping the avx512 gemm of q4_0/q8_0/q4_K/q6_K (src/kern/avx512/gemv.c); called last. */
void tn_kern_register_gemv_avx512(tn_kern_table *t);
/* Tile products for the load-time layouts (quant/repack.h; src/kern/avx512/gemm_r16.c). */
void tn_kern_register_repack_avx512(tn_kern_table *t);
/* The same for q4_K_r16 / q6_K_r16 x q8_K (src/kern/avx512/gemm_rk16.c). */
void tn_kern_register_repack_k_avx512(tn_kern_table *t);
/* q4_K / q5_K / q6_K batched gemm from the file layout (expert slices, not repacked at load): 16-row
 * groups interleaved on the fly into the r16 layout and run through the r16 tile kernels
 * (src/kern/avx512/gemm_ktile.c); wraps the slot's gemm, after tn_kern_register_repack_k_avx512. */
void tn_kern_register_ktile_avx512(tn_kern_table *t);
/* The interleave it uses: nb blocks (k = nb * 256) of 16 rows of type ft (q4_K, q5_K, q6_K) at w, rows
 * w_rb bytes apart (w_rb * 16 < 2^31), into nb r16 chunks at dst — tn_repack_r16's bytes (AVX512-VBMI). */
void tn_k_interleave_r16_k__avx512(tn_dtype ft, const void *w, size_t w_rb, int64_t nb, void *dst);
/* Lookup-table decode for the tq1 *_l32 layouts (src/kern/avx512/tq1_lut.c); after the tq kernels. */
void tn_kern_register_l32_avx512(tn_kern_table *t);

/* Generic gemm built on a slot's vec_dot (the reference tile product). */
void tn_gemm_by_vec_dot(tn_vec_dot_fn dot, int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                        size_t x_rb, float *y, int64_t ldy);

#endif
