/*
 * mix.h — per-tensor type selection of a quantization run ("mixes" such as Q4_K_M), ported from
 * llama.cpp's llama_model_quantize (src/llama-quant.cpp at commit 34af94cd9) for the Llama
 * family, so `tern quantize` picks exactly the tensor types llama-quantize picks:
 *
 *   - only tensors of >= 2 dims whose name ends in "weight" and is not a norm (etc.) are
 *     quantized; the rest keep their type (1-D tensors stay f32);
 *   - output.weight (and token_embd.weight when embeddings are tied) gets q6_K, or q8_0 when
 *     ne0 is not a multiple of the target's block (or the target is q8_0);
 *   - the *_K_M/_S/_L mixes raise attn_v / ffn_down / attn_output on "use_more_bits" layers;
 *   - IQ4_NL / IQ4_XS raise attn_v to q5_K when n_head / n_head_kv >= 4, and the first eighth
 *     of ffn_down to q5_K without an imatrix; TQ1_0 / TQ2_0 give token_embd q4_K; MXFP4_MOE
 *     puts expert tensors in mxfp4 and everything else in q8_0 (a dense model: all q8_0 —
 *     --pure gives mxfp4 everywhere);
 *   - shapes whose ne0 is not a multiple of the block fall back (q4_K -> q5_0, q6_K -> q8_0,
 *     q2_K/q3_K/tq1_0/tq2_0 -> q4_0, q5_K -> q5_1, iq4_xs -> iq4_nl; f16 if even the fallback
 *     does not fit).
 *
 * The counters (i_attention_wv, i_ffn_down, ...) advance in the order tensors are visited, so
 * the caller must visit them in llama.cpp's order: tn_qmix_sort (non-layer tensors first, then
 * by layer number, ties by name) — which is also the tensor order of the output file.
 *
 * Pure functions of their inputs; no I/O, no allocation except in tn_qmix_sort's caller array.
 */
#ifndef TN_QUANT_MIX_H
#define TN_QUANT_MIX_H

#include "tensor/dtype.h"

/* llama_ftype values (general.file_type). */
typedef enum tn_ftype {
    TN_FTYPE_ALL_F32 = 0,
    TN_FTYPE_MOSTLY_F16 = 1,
    TN_FTYPE_MOSTLY_Q4_0 = 2,
    TN_FTYPE_MOSTLY_Q4_1 = 3,
    TN_FTYPE_MOSTLY_Q8_0 = 7,
    TN_FTYPE_MOSTLY_Q5_0 = 8,
    TN_FTYPE_MOSTLY_Q5_1 = 9,
    TN_FTYPE_MOSTLY_Q2_K = 10,
    TN_FTYPE_MOSTLY_Q3_K_S = 11,
    TN_FTYPE_MOSTLY_Q3_K_M = 12,
    TN_FTYPE_MOSTLY_Q3_K_L = 13,
    TN_FTYPE_MOSTLY_Q4_K_S = 14,
    TN_FTYPE_MOSTLY_Q4_K_M = 15,
    TN_FTYPE_MOSTLY_Q5_K_S = 16,
    TN_FTYPE_MOSTLY_Q5_K_M = 17,
    TN_FTYPE_MOSTLY_Q6_K = 18,
    TN_FTYPE_MOSTLY_IQ2_XXS = 19,
    TN_FTYPE_MOSTLY_IQ2_XS = 20,
    TN_FTYPE_MOSTLY_Q2_K_S = 21,
    TN_FTYPE_MOSTLY_IQ3_XS = 22,
    TN_FTYPE_MOSTLY_IQ3_XXS = 23,
    TN_FTYPE_MOSTLY_IQ1_S = 24,
    TN_FTYPE_MOSTLY_IQ4_NL = 25,
    TN_FTYPE_MOSTLY_IQ3_S = 26,
    TN_FTYPE_MOSTLY_IQ3_M = 27,
    TN_FTYPE_MOSTLY_IQ2_S = 28,
    TN_FTYPE_MOSTLY_IQ2_M = 29,
    TN_FTYPE_MOSTLY_IQ4_XS = 30,
    TN_FTYPE_MOSTLY_IQ1_M = 31,
    TN_FTYPE_MOSTLY_BF16 = 32,
    TN_FTYPE_MOSTLY_TQ1_0 = 36,
    TN_FTYPE_MOSTLY_TQ2_0 = 37,
    TN_FTYPE_MOSTLY_MXFP4_MOE = 38, /* expert (3-D) tensors mxfp4, the rest q8_0 */
    /* tern any-bit files: file_type is not a llama.cpp value; tern writes this one. */
    TN_FTYPE_TERN = 1024,
} tn_ftype;

/* Parses a llama-quantize type name case-insensitively ("q4_k_m", "Q8_0", "f16"). */
bool tn_ftype_from_name(const char *name, tn_ftype *out);
/* Canonical name ("Q4_K_M"), or NULL. */
const char *tn_ftype_name(tn_ftype f);
/* The default tensor type of a file type (llama_ftype_get_default_type); false if none. */
bool tn_ftype_default_type(tn_ftype f, tn_dtype *out);

/* What the selection needs to know about the model. */
typedef struct tn_qmix_model {
    bool falcon;         /* general.architecture == "falcon"                                   */
    bool is_70b;         /* llama with 80 layers and GQA (llama.cpp's LLM_TYPE_70B)            */
    int n_layer;         /* block_count                                                         */
    int n_head, n_head_kv;
    int n_expert;        /* 0 if dense                                                          */
    int n_expert_used;   /* expert_used_count (top k), 0 if dense                               */
} tn_qmix_model;

/* Per-tensor override hook: returns a dtype id to force for this tensor name, or -1. */
typedef int (*tn_qmix_override_fn)(void *user, const char *name);

typedef struct tn_qmix_opts {
    int output_type;          /* forced type of output.weight, -1 = mix default               */
    int token_embd_type;      /* forced type of token_embd.weight, -1 = mix default           */
    bool pure;                /* no mix: every quantizable tensor gets the default type      */
    bool leave_output;        /* keep output.weight as it is                                 */
    bool has_imatrix;         /* an importance matrix is used (changes q4_0/q5_0 ffn_down)   */
    tn_qmix_override_fn override; /* --tensor-type REGEX=TYPE, may be NULL                    */
    void *override_user;
} tn_qmix_opts;

typedef struct tn_qmix_tensor {
    const char *name;
    int n_dims;
    int64_t ne[4];
    uint32_t type;            /* current type                                                */
} tn_qmix_tensor;

typedef struct tn_qmix_choice {
    uint32_t type;            /* type to write                                               */
    bool quantizable;         /* tensor_allows_quantization                                  */
    bool fallback;            /* shape forced a fallback type                                */
    bool manual;              /* an override pattern matched                                 */
    uint32_t wanted;          /* type before the fallback                                    */
} tn_qmix_choice;

/* Orders n tensor names as llama.cpp's weights_map (blk.N numeric, non-layer first, then name):
 * writes a permutation into idx. */
void tn_qmix_sort(const char *const *names, size_t n, size_t *idx);

/* Chooses the type of every tensor (given in tn_qmix_sort order). default_type is the file
 * type's default tensor type (or a tern type). out[n]. */
void tn_qmix_plan(tn_ftype ftype, tn_dtype default_type, const tn_qmix_model *m, const tn_qmix_opts *o,
                  const tn_qmix_tensor *t, size_t n, tn_qmix_choice *out);

/* llama-quantize's tensor_requires_imatrix: a tensor of type t (not token_embd / output) can
 * only be written with importance data — iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, and
 * q2_K in a Q2_K_S file. */
bool tn_qmix_requires_imatrix(const char *name, uint32_t t, tn_ftype ftype);

/* Budgeted choice of types (tern quantize --target-bpw). Tensor i has n_cand[i] >= 1 candidate
 * types with sizes bits[i][c] (in bits, non-decreasing in c) and errors err[i][c]. Starting from
 * every tensor's first candidate, it repeatedly applies the upgrade (tensor i: current c -> any
 * c' > c) with the largest error reduction per added bit that still fits in `budget` bits, until
 * none fits or helps. Writes choice[i]; returns false (choice = the first candidates) when even the
 * first candidates exceed the budget. Deterministic (ties go to the lower tensor index). */
bool tn_qmix_allocate(size_t n, const int *n_cand, const double *const *bits, const double *const *err, double budget,
                      int *choice);

#endif
