/*
 * dtype.h — tensor element types (ids equal to ggml's where the format is ggml's) and their
 * static traits: block length, bytes per block, name, and the activation type a weight type is
 * multiplied against in dot products (ggml's vec_dot_type). Kernels live in src/kern/; this file
 * only describes.
 *
 * tern-only types get ids from TN_DTYPE_TERN_BASE upward (a reserved high range).
 */
#ifndef TN_TENSOR_DTYPE_H
#define TN_TENSOR_DTYPE_H

#include "core/base.h"

typedef enum tn_dtype {
    TN_F32 = 0,
    TN_F16 = 1,
    TN_Q4_0 = 2,
    TN_Q4_1 = 3,
    TN_Q5_0 = 6,
    TN_Q5_1 = 7,
    TN_Q8_0 = 8,
    TN_Q8_1 = 9,
    TN_Q2_K = 10,
    TN_Q3_K = 11,
    TN_Q4_K = 12,
    TN_Q5_K = 13,
    TN_Q6_K = 14,
    TN_Q8_K = 15,
    TN_IQ2_XXS = 16,
    TN_IQ2_XS = 17,
    TN_IQ3_XXS = 18,
    TN_IQ1_S = 19,
    TN_IQ4_NL = 20,
    TN_IQ3_S = 21,
    TN_IQ2_S = 22,
    TN_IQ4_XS = 23,
    TN_I8 = 24,
    TN_I16 = 25,
    TN_I32 = 26,
    TN_IQ1_M = 29,
    TN_BF16 = 30,
    TN_TQ1_0 = 34, /* ggml's ternary types, not tern's tq<b>g<G> (ids from TN_DTYPE_TERN_BASE) */
    TN_TQ2_0 = 35,
    TN_MXFP4 = 39,
    TN_DTYPE_GGML_COUNT = 43, /* ids below this are ggml's namespace */
    TN_DTYPE_TERN_BASE = 1024, /* tern-only types: 1024 + ... (any-bit quant, quant/tq.h)    */
    TN_DTYPE_TQ_COUNT = 64,    /* tq<b>g<G>[a]: ids 1024 .. 1087                              */
    /* tern's vector-quantized codebook types (quant/vq.h): ids 1088 .. 1091 reserved */
    TN_DTYPE_VQ_BASE = TN_DTYPE_TERN_BASE + TN_DTYPE_TQ_COUNT,
    TN_VQ2 = TN_DTYPE_VQ_BASE, /* 4-vectors, 256-entry int8 codebook per tensor, ~2.2 bpw      */
    TN_DTYPE_VQ_COUNT = 4,
    /* In-memory layouts made at load time (never in files: the GGUF reader and writer refuse them,
     * tn_dtype_from_name does not know them). Their ids may change between versions. */
    TN_DTYPE_INTERNAL_BASE = TN_DTYPE_VQ_BASE + TN_DTYPE_VQ_COUNT,
    TN_Q4_0_R16 = TN_DTYPE_INTERNAL_BASE, /* q4_0 with 16 rows interleaved (src/quant/repack.h) */
    TN_TQ4G32_R16,                        /* tq4g32 .. tq4g256 (symmetric), likewise           */
    TN_TQ4G64_R16,
    TN_TQ4G128_R16,
    TN_TQ4G256_R16,
    TN_Q8_0_R16,                          /* q8_0 with 16 rows interleaved, codes + 128       */
    TN_TQ1G32_L32,                        /* tq1g32 .. tq1g256a with 32 rows interleaved for the */
    TN_TQ1G32A_L32,                       /* lookup-table kernel (src/quant/repack.h); order as  */
    TN_TQ1G64_L32,                        /* the tq ids: group 32, 64, 128, 256, sym then asym   */
    TN_TQ1G64A_L32,
    TN_TQ1G128_L32,
    TN_TQ1G128A_L32,
    TN_TQ1G256_L32,
    TN_TQ1G256A_L32,
    TN_Q4_K_R16,                          /* q4_K / q5_K / q6_K with 16 rows interleaved,     */
    TN_Q5_K_R16,                          /* scales rearranged for the kernel                 */
    TN_Q6_K_R16,                          /* (src/quant/repack.h)                              */
    TN_IQ4_XS_R16,                        /* iq4_xs with 16 rows interleaved (repack.h)        */
    TN_IQ2_XXS_P3,                        /* iq2_xxs / iq2_xs / iq2_s with the grid entries   */
    TN_IQ2_XS_P3,                         /* expanded into 2-bit magnitude and 1-bit sign     */
    TN_IQ2_S_P3,                          /* planes (106 bytes a block; src/quant/repack.h)   */
    TN_IQ3_XXS_P4,                        /* iq3_xxs / iq3_s likewise, a 4-bit code a weight  */
    TN_IQ3_S_P4,                          /* (138 bytes a block)                              */
    TN_IQ1_S_P2,                          /* iq1_s / iq1_m likewise, a 2-bit code a weight    */
    TN_IQ1_M_P2,                          /* (78 bytes a block)                               */
    TN_IQ4_NL_R16,                        /* iq4_nl with 16 rows interleaved (as q4_0_r16)     */
    TN_TQ2_0_R16,                         /* tq2_0 with 16 rows interleaved (repack.h)         */
    TN_TQ1_0_R16,                         /* tq1_0 expanded to tq2_0_r16's chunks (66 bytes a  */
                                          /* block against 54; repack.h)                       */
    TN_TQC2,                              /* per-channel K rows of the KV cache, b = 2, 3, 4    */
    TN_TQC3,                              /* (quant/kc.h; 4 b + 8 bytes per 32 values; never a  */
    TN_TQC4,                              /* tensor type: no kernel slot functions)             */
    TN_DTYPE_C16_BASE, /* tq<b>g<G>[a]_c16, b = 2..8: the tq ids' order (index = tq id - 1024; the
                        * b = 1 ids are unused) — rows with each 512-code super-step rearranged for
                        * the decode kernels (src/quant/repack.h) */
    TN_DTYPE_SLOT_COUNT = TN_DTYPE_C16_BASE + TN_DTYPE_TQ_COUNT, /* ids a kernel slot exists for */
} tn_dtype;

typedef struct tn_dtype_traits {
    const char *name;     /* ggml's lower-case name, e.g. "q4_K"; NULL for unknown ids  */
    int64_t blck_size;    /* elements per block (1 for plain types)                      */
    size_t type_size;     /* bytes per block                                             */
    bool is_quantized;
    bool supported;       /* tern can compute with it (load/dequantize/dot)              */
    tn_dtype vec_dot_type;/* activation format for dot products with this weight type    */
} tn_dtype_traits;

/* Codebook types only (quant/vq.h; 0 for every other type): bytes before a row's blocks (a row
 * header), and bytes after a tensor's rows (its codebook), both counted in file sizes. */
static inline size_t tn_dtype_row_hdr(uint32_t t) { return t >= TN_DTYPE_VQ_BASE && t < TN_DTYPE_VQ_BASE + TN_DTYPE_VQ_COUNT ? 4 : 0; }
static inline size_t tn_dtype_tensor_tail(uint32_t t) {
    return t >= TN_DTYPE_VQ_BASE && t < TN_DTYPE_VQ_BASE + TN_DTYPE_VQ_COUNT ? 1024 : 0;
}

/* Traits of id t, or NULL if t is not a type tern knows at all (any id is safe to pass). */
const tn_dtype_traits *tn_dtype_get(uint32_t t);
/* True for the in-memory-only layouts (TN_DTYPE_INTERNAL_BASE ..). */
static inline bool tn_dtype_is_internal(uint32_t t) { return t >= TN_DTYPE_INTERNAL_BASE && t < TN_DTYPE_SLOT_COUNT; }
/* Name for messages: known name, or "type#<id>" written into a static thread-local buffer. */
const char *tn_dtype_name(uint32_t t);
/* Parses a name case-insensitively ("Q4_K", "f16"); returns false if unknown. */
bool tn_dtype_from_name(const char *name, tn_dtype *out);
/* Bytes of one row of ne0 elements (with the row header of codebook types); 0 if ne0 is not a
 * multiple of the block length or overflows. */
size_t tn_dtype_row_size(tn_dtype t, int64_t ne0);
/* Bytes of a tensor of `rows` rows of ne0 elements: rows * row size + the type's tensor tail
 * (the codebook of codebook types); 0 on a bad ne0 or overflow (and for rows == 0). */
size_t tn_dtype_tensor_size(tn_dtype t, int64_t ne0, int64_t rows);

#endif
