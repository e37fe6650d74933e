/*
 * backend.c — the CUDA backend's C side (device queries and peaks: device.c): weight upload (the split layout of
 * kern_cuda.h for the code-path types), the GPU's KV cache and scratch, and the forward pass as a
 * sequence of kernel launches on one stream — the same steps, in the same order, as forward.c.
 *
 * Matrix products: up to TN_CU_GEMV_MAXN tokens use the GEMV kernels (decode); larger batches
 * dequantize the weight to fp16 and multiply with cuBLAS (fp32 accumulation).
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda.h"
#include "cuda/kern_cuda.h"
#include "core/fp16.h"
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/ops.h"
#include "quant/iq_grid.h"
#include "quant/tq.h"
#include "quant/vq.h"

enum { W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN, W_N };

/* A layer on the GPU. Where Wq, Wk, Wv share a type their rows are uploaded as one matrix (qkv:
 * one GEMV per token instead of three), likewise Wgate and Wup (gu); w[] then holds only Wo and
 * Wdown. */
typedef struct {
    float *attn_norm, *ffn_norm, *bq, *bk, *bv, *bqkv, *q_norm, *k_norm;
    float *attn_post_norm, *ffn_post_norm; /* gemma: the products normed before the residual add */
    tn_cw w[W_N];
    tn_cw qkv, gu;
    bool fused_qkv, fused_gu;
    /* mixture of experts (the layer has a router): each expert matrix as one matrix of every
     * expert's rows (expert e's gate|up rows e 2 ff_exp .., its down rows e n_embd ..; egu when
     * gate and up share a type, else eg and eu); a shared expert (qwen2moe) likewise, with its
     * f32 gate vector */
    bool moe, shexp;
    tn_cw router, egu, eg, eu, edown;
    bool fused_egu;
    tn_cw sgu, sg, su, sdown;
    bool fused_sgu;
    float *sgate;
    /* gpt-oss: attention sinks [n_head], Wo's bias, the router's bias, the experts' biases
     * ([n_expert][rows] of egu — gate and up interleaved per expert as its rows — or of eg, eu,
     * and of edown) */
    float *sinks, *bo, *brouter, *egu_b, *eg_b, *eu_b, *edown_b;
    bool qk_full; /* olmoe: q_norm / k_norm over the whole q and k rows, not per head */
} tn_cu_layer;

struct tn_cuda_ctx {
    int dev;
    cudaStream_t st;
    cublasHandle_t blas;
    int32_t n_layers; /* on the GPU */
    bool has_output;  /* every layer on the GPU: final norm and logits too */
    tn_cu_layer *L;
    tn_cw output;
    float *output_norm;
    void **allocs;
    size_t n_allocs, cap_allocs;
    uint64_t bytes;
    const void *iq_grid[6]; /* the codebook i-quants' grids on the device, uploaded at first use */
    /* scratch for n_batch tokens */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *logits;
    /* mixture of experts: router logits [n][n_expert], routed rows' inputs and outputs
     * [n n_expert_used][n_embd], each routed row's token and each slot's row and weight
     * (d_moe: tok [R], row [R], w [R] as floats' bits; h_moe its pinned staging) */
    float *rl, *xg, *ey;
    int32_t *d_moe, *h_moe;
    /* batches up to the GEMV kernels' size (one-token steps; any batch in a batch-invariant
     * context) route on the GPU (tn_cu_moe_route, expert GEMVs over (token, slot) pairs): no
     * synchronisation, a CUDA graph for one-token steps, and a token's experts computed the same
     * way whatever its batch; larger batches, or every batch where a layer's shapes or routing do
     * not allow it or TERN_CUDA_MOE_HOST=1, route on the host */
    bool moe_dev;
    tn_cq xq;
    uint16_t *xh, *wh; /* fp16 activations, fp16 weight tile for the GEMM path */
    int64_t wh_elems;
    uint8_t *Kc, *Vc;  /* layer il's rows at loff[il]: rows of k_rb / v_rb bytes (kern_cuda.h tn_cu_kv) */
    tn_cu_kv kv;       /* the cache's types, row bytes and rotation (rot_sign on the device) */
    uint16_t *Kw;      /* per-channel K: [n_layers][kc_nseq][kc_w][kv_dim] f16 windows (kern_cuda.h tn_cu_kv) */
    int32_t *d_ints;   /* a step's integers (step_ints) */
    float *d_cs;       /* [n][n_rot] */
    float *d_cs_swa;   /* [n][n_rot]: sliding-window layers' own RoPE base and scale (gemma3) */
    int64_t tbl_cap;
    int64_t *loff;     /* [n_layers + 1] first cache row of each layer (a sliding-window layer: kv_ring rows, or
                          kv_swa_blocks blocks of its own pool) */
    /* pinned host staging */
    float *h_x, *h_cs, *h_cs_swa;
    int32_t *h_ints;
    const void *q_src, *h_src; /* activations currently quantized / converted (NULL: none) */
    int cuerr;
    /* one-token decode as a CUDA graph (captured at the first such step; every input it reads
     * lives in the device buffers above, so one graph serves every position) */
    bool use_graph;
    /* one-token steps: RoPE and the cache store done by the attention kernel (TERN_CUDA_FUSE_ROPE=0
     * or TERN_CUDA_FUSE=0: k_rope_store first) */
    bool fuse_rope;
    /* one-token steps: the RMSNorm after Wo and after Wdown done by the product's last block
     * (tn_cu_tail; d_cnt its block count) instead of a launch of its own (TERN_CUDA_FUSE_NORM=0 or
     * TERN_CUDA_FUSE=0: the norm kernel) */
    bool fuse_norm;
    /* one-token steps: the gate|up product writes act(gate) up itself (and its q8 blocks, by its
     * last block) instead of a GLU launch (TERN_CUDA_FUSE_GLU=0 or TERN_CUDA_FUSE=0: the GLU kernel) */
    bool fuse_glu;
    int *d_cnt;
    /* flash-decoding (kern_cuda.h tn_cu_attn_sched): batches of up to 8 tokens, and batches of up to
     * asched.tokens tokens of as many sequences (tern serve's decode steps), split each (token,
     * head)'s positions across asched.splits blocks (chosen per step: enough blocks for the device,
     * no more than the batch's chunks; TERN_CUDA_ATTN_SPLIT=N: at most N, 1: never); part NULL:
     * never (contexts of one chunk); other batches (prompts) in query tiles where att_tile
     * (TERN_CUDA_ATTN_TILE=0: a block per (token, head)) */
    tn_cu_attn_sched asched;
    int att_max, sms;
    bool att_tile;
    /* one-token steps as one persistent kernel (TERN_CUDA_PERSIST=1, tn_cu_persist): its layers on
     * the device (d_players), layer 0 on the host, the grid barrier's two counters, its grid
     * (TERN_CUDA_PERSIST_GRID blocks; 0: as many as fit at once) */
    bool persist;
    tn_cu_player *d_players, h_player0;
    unsigned *d_bar;
    int persist_grid;
    /* the GEMV kernels (batch-invariant) up to this many tokens, fp16 + cuBLAS above: code-path
     * types 64, float-path types TN_CU_GEMV_MAXN; batch-invariant contexts (tern serve) and
     * TERN_CUDA_PREFILL=gemv: no limit; TERN_CUDA_PREFILL=cublas: TN_CU_GEMV_MAXN for both */
    int64_t tile_max_code, tile_max_float;
    cudaGraph_t graph;
    cudaGraphExec_t graph_exec;
    int graph_S; /* the attention splits the graph was captured with */
    /* TERN_CUDA_PROFILE=1: every launch between two events, summed per label, printed to stderr
     * when the context is freed (no graph then: its launches are not timed one by one) */
    bool prof;
    cudaEvent_t *ev;
    const char **ev_label;
    int n_ev, cap_ev;
    struct {
        const char *label;
        double ms;
        long calls;
    } pt[32];
    int n_pt;
    long prof_passes, prof_tokens;
    double prof_wall_ms;
};

static void prof_print(const tn_cuda_ctx *g);

bool tn_cuda_persistent(const tn_cuda_ctx *g) { return g && g->persist; }
int tn_cuda_attn_splits(const tn_cuda_ctx *g) { return g ? TN_MAX(g->asched.splits, 1) : 1; }

static const char *tn_cu_errstr(int e) { return cudaGetErrorString((cudaError_t)e); }

static double tn_cu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool tn_cuda_built(void) { return true; }

/* A whole-number setting from the environment (tuning and A/B switches), or def. */
static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end = NULL;
    const long x = strtol(v, &end, 10);
    return end && *end == '\0' && x >= 0 && x <= 1024 ? (int)x : def;
}

/* GEMV blocks per multiprocessor by default (TERN_CUDA_GEMV_BPS; 0: a block per row group, which
 * measured best on the H200: capped grids walking their rows lose more than the overlap gains) */
#define TN_CUDA_GEMV_BPS 0

/* The device kind of file type t (kern_cuda.h), or -1 for a type the GPU does not run. */
static int cw_kind_of(tn_dtype t) {
    switch ((int)t) {
    case TN_F32: return TN_CW_F32;
    case TN_F16: return TN_CW_F16;
    case TN_BF16: return TN_CW_BF16;
    case TN_Q4_K: return TN_CW_Q4_K;
    case TN_Q6_K: return TN_CW_Q6_K;
    case TN_Q5_K: return TN_CW_Q5_K;
    case TN_Q2_K: return TN_CW_Q2_K;
    case TN_Q3_K: return TN_CW_Q3_K;
    case TN_IQ4_XS: return TN_CW_IQ4_XS;
    case TN_IQ4_NL: return TN_CW_IQ4_NL;
    case TN_MXFP4: return TN_CW_MXFP4;
    case TN_IQ2_XXS: return TN_CW_IQ2_XXS;
    case TN_IQ2_XS: return TN_CW_IQ2_XS;
    case TN_IQ2_S: return TN_CW_IQ2_S;
    case TN_IQ3_XXS: return TN_CW_IQ3_XXS;
    case TN_IQ3_S: return TN_CW_IQ3_S;
    case TN_IQ1_S: return TN_CW_IQ1_S;
    case TN_IQ1_M: return TN_CW_IQ1_M;
    case TN_TQ1_0: return TN_CW_TQ1_0;
    case TN_TQ2_0: return TN_CW_TQ2_0;
    case TN_Q4_0: return TN_CW_Q4_0;
    case TN_Q8_0: return TN_CW_Q8_0;
    case TN_Q5_0: return TN_CW_Q5_0;
    case TN_VQ2: return TN_CW_VQ2;
    case TN_Q4_1: /* tq4g32a */
    case TN_Q5_1: return TN_CW_TQ; /* tq5g32a once qh moves */
    default: return tn_tq_is(t) ? TN_CW_TQ : -1;
    }
}

const char *tn_cuda_kernel_name(tn_dtype t) {
    const int kind = cw_kind_of(t);
    if (kind < 0) return NULL;
    if (tn_cw_is_code(kind))
        return "split layout; decode: dp4a GEMV on q8 activations (one template over widths); batches above 8 tokens: int8 "
               "tensor-core GEMM with the GEMV's bits (sm_80+)";
    if (kind >= TN_CW_IQ2_XXS && kind <= TN_CW_IQ1_M)
        return "file layout, codebook grid on the device; decode: f32 GEMV dequantizing in registers; prefill: fp16 dequant + cuBLAS";
    if (kind == TN_CW_VQ2)
        return "blocks in 72-byte slots, the matrix's codebook as floats on the device; decode: f32 GEMV, 8 lookups a lane; "
               "prefill: fp16 dequant + cuBLAS";
    if (kind == TN_CW_IQ4_NL || kind == TN_CW_MXFP4)
        return "codes then scales per row; decode: f32 GEMV dequantizing in registers; prefill: fp16 dequant + cuBLAS";
    return "file layout; decode: f32 GEMV dequantizing in registers; prefill: fp16 dequant + cuBLAS";
}

/* ---- allocation ------------------------------------------------------------------------------ */

static void *dalloc(tn_cuda_ctx *g, size_t bytes, bool *ok) {
    if (!*ok) return NULL;
    if (g->n_allocs == g->cap_allocs) {
        size_t nc = g->cap_allocs ? 2 * g->cap_allocs : 64;
        void **na = tn_realloc(g->allocs, nc * sizeof *na);
        if (!na) return *ok = false, NULL;
        g->allocs = na;
        g->cap_allocs = nc;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        tn_err(TERN_ERR_NOMEM, "cuda: cannot allocate %.1f MiB of device memory (%.1f MiB held): %s",
               (double)bytes / 1048576.0, (double)g->bytes / 1048576.0, cudaGetErrorString(e));
        return *ok = false, NULL;
    }
    g->allocs[g->n_allocs++] = p;
    g->bytes += bytes;
    return p;
}

static void *dupload(tn_cuda_ctx *g, const void *src, size_t bytes, bool *ok) {
    void *p = dalloc(g, bytes, ok);
    if (p && cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaGetLastError();
        *ok = false;
        tn_err(TERN_ERR_IO, "cuda: upload of %zu bytes failed", bytes);
        return NULL;
    }
    return p;
}

/* ---- weights ----------------------------------------------------------------------------------- */

/* The grid of codebook i-quant kind (iq1_s and iq1_m share one) on the device, uploaded once per
 * context. */
static const void *iq_grid(tn_cuda_ctx *g, int kind, bool *ok) {
    static const struct {
        int kind, slot;
        const void *grid;
        size_t bytes;
    } G[] = {{TN_CW_IQ2_XXS, 0, tn_iq2xxs_grid, sizeof tn_iq2xxs_grid}, {TN_CW_IQ2_XS, 1, tn_iq2xs_grid, sizeof tn_iq2xs_grid},
             {TN_CW_IQ2_S, 2, tn_iq2s_grid, sizeof tn_iq2s_grid},       {TN_CW_IQ3_XXS, 3, tn_iq3xxs_grid, sizeof tn_iq3xxs_grid},
             {TN_CW_IQ3_S, 4, tn_iq3s_grid, sizeof tn_iq3s_grid},       {TN_CW_IQ1_S, 5, tn_iq1s_grid, sizeof tn_iq1s_grid},
             {TN_CW_IQ1_M, 5, tn_iq1s_grid, sizeof tn_iq1s_grid}};
    for (size_t i = 0; i < sizeof G / sizeof G[0]; i++)
        if (G[i].kind == kind) {
            if (!g->iq_grid[G[i].slot]) g->iq_grid[G[i].slot] = dupload(g, G[i].grid, G[i].bytes, ok);
            return g->iq_grid[G[i].slot];
        }
    return NULL;
}

static tern_status upload_weight(tn_cuda_ctx *g, const tn_tensor *t, tn_cw *w) {
    memset(w, 0, sizeof *w);
    const int64_t k = t->ne[0], m = t->ne[1] ? t->ne[1] : 1;
    w->m = m;
    w->k = k;
    bool ok = true;
    tn_tq_params tp = {0, 0, false};
    w->kind = cw_kind_of(t->type);
    switch ((int)t->type) {
    case TN_Q4_0: tp = (tn_tq_params){4, 32, false}; break;
    case TN_Q8_0: tp = (tn_tq_params){8, 32, false}; break;
    case TN_Q5_0: tp = (tn_tq_params){5, 32, false}; break;
    case TN_Q4_1: tp = (tn_tq_params){4, 32, true}; break; /* x = d q + m: tq4g32a */
    case TN_Q5_1: tp = (tn_tq_params){5, 32, true}; break; /* tq5g32a once qh moves */
    default:
        if (w->kind >= 0 && !tn_cw_is_code(w->kind)) break; /* the float path: the file's blocks */
        if (tn_tq_is(t->type)) {
            tn_tq_params_of(t->type, &tp);
            break;
        }
        if (tn_dtype_is_internal(t->type))
            return tn_err(TERN_ERR_UNSUPPORTED, "cuda: tensor '%s' is in the in-memory layout %s: load the model with repack off",
                          t->name, tn_dtype_name(t->type));
        return tn_err(TERN_ERR_UNSUPPORTED,
                      "cuda: tensor '%s' has type %s, which the CUDA backend does not run (F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
                      "Q5_0, Q5_1, Q2_K .. Q6_K, the i-quants IQ1_S .. IQ4_XS, MXFP4, TQ1_0, TQ2_0 and tern's tq<b>g<G> and vq2: "
                      "run it on the CPU)",
                      t->name, tn_dtype_name(t->type));
    }
    const int64_t blck = tn_dtype_get(t->type)->blck_size; /* elements per file block */
    if ((tn_cw_is_code(w->kind) && k % tp.group != 0) || (!tn_cw_is_code(w->kind) && blck > 1 && k % blck != 0))
        return tn_err(TERN_ERR_UNSUPPORTED, "cuda: tensor '%s': row length %lld is not a multiple of the kernels' block",
                      t->name, (long long)k);
    if (w->kind == TN_CW_Q6_K || w->kind == TN_CW_Q3_K) { /* each block in a slot of 8-byte aligned parts */
        const size_t bb = w->kind == TN_CW_Q6_K ? 210 : 110, stride = w->kind == TN_CW_Q6_K ? TN_CU_Q6K_STRIDE : TN_CU_Q3K_STRIDE;
        const int64_t nb = k / 256;
        w->row_bytes = (size_t)nb * stride;
        uint8_t *buf = tn_calloc((size_t)m, w->row_bytes);
        if (!buf) return tn_err(TERN_ERR_NOMEM, "cuda: out of host memory padding '%s'", t->name);
        for (int64_t i = 0; i < m * nb; i++) memcpy(buf + (size_t)i * stride, (const uint8_t *)t->data + (size_t)i * bb, bb);
        w->data = dupload(g, buf, w->row_bytes * (size_t)m, &ok);
        tn_free(buf);
        return ok ? TERN_OK : tn_err_prefix(TERN_ERR_NOMEM, "cuda: tensor '%s'", t->name);
    }
    if (w->kind == TN_CW_VQ2) { /* blocks in 72-byte slots without the row headers; the codebook as floats */
        const size_t rb_file = tn_dtype_row_size(t->type, k);
        const int64_t nb = k / TN_VQ_QK;
        if (t->nbytes < rb_file * (size_t)m + TN_VQ_CB_BYTES)
            return tn_err(TERN_ERR_FORMAT, "cuda: tensor '%s' (vq2): %zu bytes, fewer than its rows and codebook", t->name, t->nbytes);
        w->row_bytes = (size_t)nb * TN_CU_VQ2_STRIDE;
        uint8_t *buf = tn_calloc((size_t)m, w->row_bytes);
        float *cbf = tn_malloc(sizeof(float) * TN_VQ_CB_BYTES);
        if (!buf || !cbf) {
            tn_free(buf), tn_free(cbf);
            return tn_err(TERN_ERR_NOMEM, "cuda: out of host memory rearranging '%s'", t->name);
        }
        const int8_t *cb = tn_vq_codebook(t->data); /* every row's header names the one after the rows */
        for (int i = 0; i < TN_VQ_CB_BYTES; i++) cbf[i] = (float)cb[i];
        for (int64_t r = 0; r < m; r++) {
            const uint8_t *src = (const uint8_t *)t->data + (size_t)r * rb_file + TN_VQ_HDR;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *dst = buf + (size_t)r * w->row_bytes + (size_t)b * TN_CU_VQ2_STRIDE;
                const uint8_t *blk = src + (size_t)b * sizeof(block_vq2);
                memcpy(dst, blk, 6);              /* d, sc[4] */
                memcpy(dst + 8, blk + 6, TN_VQ_NV); /* qs[64]   */
            }
        }
        w->data = dupload(g, buf, w->row_bytes * (size_t)m, &ok);
        w->grid = dupload(g, cbf, sizeof(float) * TN_VQ_CB_BYTES, &ok);
        tn_free(buf), tn_free(cbf);
        return ok ? TERN_OK : tn_err_prefix(TERN_ERR_NOMEM, "cuda: tensor '%s'", t->name);
    }
    if (w->kind == TN_CW_IQ4_NL || w->kind == TN_CW_MXFP4) { /* a row: its blocks' codes, then their scales */
        const size_t hdr = w->kind == TN_CW_IQ4_NL ? 2 : 1, bb = hdr + 16; /* iq4_nl: d, qs[16]; mxfp4: e, qs[16] */
        const int64_t nb = k / 32;
        w->row_bytes = ((size_t)nb * bb + 15) / 16 * 16;
        uint8_t *buf = tn_calloc((size_t)m, w->row_bytes);
        if (!buf) return tn_err(TERN_ERR_NOMEM, "cuda: out of host memory rearranging '%s'", t->name);
        for (int64_t r = 0; r < m; r++) {
            const uint8_t *src = (const uint8_t *)t->data + (size_t)(r * nb) * bb;
            uint8_t *dst = buf + (size_t)r * w->row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                memcpy(dst + b * 16, src + (size_t)b * bb + hdr, 16);
                memcpy(dst + nb * 16 + b * (int64_t)hdr, src + (size_t)b * bb, hdr);
            }
        }
        w->data = dupload(g, buf, w->row_bytes * (size_t)m, &ok);
        tn_free(buf);
        return ok ? TERN_OK : tn_err_prefix(TERN_ERR_NOMEM, "cuda: tensor '%s'", t->name);
    }
    if (!tn_cw_is_code(w->kind)) {
        if (w->kind >= TN_CW_IQ2_XXS && w->kind <= TN_CW_IQ1_M && !(w->grid = iq_grid(g, w->kind, &ok)))
            return tn_err_prefix(TERN_ERR_NOMEM, "cuda: the grid of '%s'", t->name);
        w->row_bytes = tn_dtype_row_size(t->type, k);
        w->data = dupload(g, t->data, w->row_bytes * (size_t)m, &ok);
        return ok ? TERN_OK : tn_err_prefix(TERN_ERR_NOMEM, "cuda: tensor '%s'", t->name);
    }
    /* split layout: headers out into d (and mn), codes back to back */
    w->bits = tp.bits;
    w->group = tp.group;
    w->asym = tp.asym;
    const int64_t nb = k / tp.group;
    const size_t hdr = tp.asym ? 4 : 2, cb = (size_t)tp.group * (size_t)tp.bits / 8;
    /* q5_0 / q5_1 store qh[4] before qs[16]; tq5's planes are the 4-bit one first */
    const bool q5 = t->type == TN_Q5_0 || t->type == TN_Q5_1;
    const size_t bb = hdr + cb, rb_file = (size_t)nb * bb;
    w->row_bytes = (size_t)nb * cb;
    uint8_t *codes = tn_malloc((size_t)m * w->row_bytes);
    uint16_t *d = tn_malloc((size_t)(m * nb) * 2), *mn = tp.asym ? tn_malloc((size_t)(m * nb) * 2) : NULL;
    if (!codes || !d || (tp.asym && !mn)) {
        tn_free(codes), tn_free(d), tn_free(mn);
        return tn_err(TERN_ERR_NOMEM, "cuda: out of host memory splitting '%s'", t->name);
    }
    for (int64_t r = 0; r < m; r++) {
        const uint8_t *src = (const uint8_t *)t->data + (size_t)r * rb_file;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = src + (size_t)b * bb;
            memcpy(&d[r * nb + b], blk, 2);
            if (tp.asym) memcpy(&mn[r * nb + b], blk + 2, 2);
            uint8_t *dst = codes + (size_t)r * w->row_bytes + (size_t)b * cb;
            if (q5) memcpy(dst, blk + hdr + 4, 16), memcpy(dst + 16, blk + hdr, 4);
            else memcpy(dst, blk + hdr, cb);
        }
    }
    w->data = dupload(g, codes, (size_t)m * w->row_bytes, &ok);
    w->d = dupload(g, d, (size_t)(m * nb) * 2, &ok);
    if (tp.asym) w->mn = dupload(g, mn, (size_t)(m * nb) * 2, &ok);
    tn_free(codes), tn_free(d), tn_free(mn);
    return ok ? TERN_OK : tn_err_prefix(TERN_ERR_NOMEM, "cuda: tensor '%s'", t->name);
}

static float *upload_f32(tn_cuda_ctx *g, const tn_tensor *t, bool *ok) {
    if (!t->data) return NULL;
    if (t->type != TN_F32) {
        *ok = false;
        tn_err(TERN_ERR_UNSUPPORTED, "cuda: tensor '%s' must be f32", t->name);
        return NULL;
    }
    return dupload(g, t->data, t->nbytes, ok);
}

/* Matrices a, b[, c] of one type and row length as one matrix of their rows stacked (file bytes
 * concatenated), uploaded; false (nothing uploaded) when their types or row lengths differ. */
static tern_status upload_stacked(tn_cuda_ctx *g, const tn_tensor *const *ts, int nt, tn_cw *w, bool *fused) {
    *fused = false;
    size_t bytes = 0;
    int64_t rows = 0;
    if (tn_vq_is(ts[0]->type)) return TERN_OK; /* a codebook each: uploaded apart */
    for (int i = 0; i < nt; i++) {
        if (ts[i]->type != ts[0]->type || ts[i]->ne[0] != ts[0]->ne[0]) return TERN_OK;
        bytes += ts[i]->nbytes;
        rows += ts[i]->ne[1];
    }
    uint8_t *buf = tn_malloc(bytes);
    if (!buf) return TERN_OK; /* no host memory for the copy: upload them apart */
    size_t off = 0;
    for (int i = 0; i < nt; i++) memcpy(buf + off, ts[i]->data, ts[i]->nbytes), off += ts[i]->nbytes;
    tn_tensor T = *ts[0];
    T.ne[1] = rows;
    T.data = buf;
    T.nbytes = bytes;
    tern_status s = upload_weight(g, &T, w);
    tn_free(buf);
    *fused = s == TERN_OK;
    return s;
}

/* A 3-D expert matrix [n_expert][rows][k] as one matrix of every expert's rows; with b (up beside
 * gate a, of the same type and row length) interleaved per expert into *ab (expert e's a rows then
 * its b rows: one gate|up matrix per expert, as a dense layer's gu) and *fused set; otherwise a into
 * *wa (or *ab when b is NULL) and b into *wb. */
static tern_status upload_experts(tn_cuda_ctx *g, const tn_tensor *a, const tn_tensor *b, tn_cw *ab, tn_cw *wa, tn_cw *wb, bool *fused) {
    const int64_t ne = a->ne[2] > 0 ? a->ne[2] : 1;
    if (b) {
        tn_tensor *v = tn_malloc(sizeof *v * (size_t)(2 * ne));
        const tn_tensor **ts = tn_malloc(sizeof *ts * (size_t)(2 * ne));
        tern_status s = TERN_OK;
        if (!v || !ts) s = tn_err(TERN_ERR_NOMEM, "cuda: out of host memory");
        for (int64_t e = 0; !s && e < ne; e++) {
            v[2 * e] = tn_expert_view(a, e), v[2 * e + 1] = tn_expert_view(b, e);
            ts[2 * e] = &v[2 * e], ts[2 * e + 1] = &v[2 * e + 1];
        }
        if (!s) s = upload_stacked(g, ts, (int)(2 * ne), ab, fused);
        tn_free(v);
        tn_free(ts);
        if (s || *fused) return s;
    }
    tn_tensor T = *a;
    T.ne[1] = a->ne[1] * ne, T.ne[2] = 1;
    tern_status s = upload_weight(g, &T, b ? wa : ab);
    if (s || !b) return s;
    T = *b;
    T.ne[1] = b->ne[1] * (b->ne[2] > 0 ? b->ne[2] : 1), T.ne[2] = 1;
    return upload_weight(g, &T, wb);
}

/* Rows r0 .. r0 + nr - 1 of w as a matrix of their own (an expert of a stacked expert matrix). */
static tn_cw cw_rows(const tn_cw *w, int64_t r0, int64_t nr) {
    tn_cw v = *w;
    v.m = nr;
    v.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    if (tn_cw_is_code(w->kind)) {
        const int64_t nbr = w->k / w->group;
        v.d = w->d + r0 * nbr;
        if (w->mn) v.mn = w->mn + r0 * nbr;
    }
    return v;
}

/* ---- context ------------------------------------------------------------------------------------ */


/* Everything g holds on the device and the host, not g itself. */
static void ctx_release(tn_cuda_ctx *g) {
    cudaSetDevice(g->dev);
    if (g->st) cudaStreamSynchronize(g->st);
    for (size_t i = 0; i < g->n_allocs; i++) cudaFree(g->allocs[i]);
    if (g->prof) prof_print(g);
    for (int i = 0; g->ev && i < g->cap_ev; i++) cudaEventDestroy(g->ev[i]);
    tn_free(g->ev);
    tn_free(g->ev_label);
    if (g->graph_exec) cudaGraphExecDestroy(g->graph_exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    if (g->blas) cublasDestroy(g->blas);
    if (g->st) cudaStreamDestroy(g->st);
    cudaFreeHost(g->h_x);
    cudaFreeHost(g->h_cs);
    cudaFreeHost(g->h_cs_swa);
    cudaFreeHost(g->h_ints);
    cudaFreeHost(g->h_moe);
    cudaGetLastError();
    tn_free(g->allocs);
    tn_free(g->L);
    tn_free(g->loff);
}

void tn_cuda_ctx_free(tn_cuda_ctx *g) {
    if (!g) return;
    ctx_release(g);
    tn_free(g);
}

/* A step's integers, host (h_ints) and device (d_ints) alike: STEP_INTS arrays of n, then the
 * block tables. One layout for both sides and for the copy between them. */
#define STEP_INTS 7
typedef struct step_ints {
    int32_t *pos, *kvrow, *toff, *orow, *wseq, *kvrow_swa, *toff_swa, *tbl;
} step_ints;
static step_ints ints_at(int32_t *base, int64_t n) {
    step_ints a = {base, base + n, base + 2 * n, base + 3 * n, base + 4 * n, base + 5 * n, base + 6 * n, base + STEP_INTS * n};
    return a;
}
/* Halves of a layer's per-channel K windows (every sequence's kc_w rows of kv_dim). */
static size_t kw_layer(const tern_ctx *c) { return (size_t)c->kc_nseq * (size_t)c->kc_w * (size_t)c->hp.n_head_kv * (size_t)c->hp.head_dim; }
static int64_t ints_needed(const tern_ctx *c, int64_t tbl) { return STEP_INTS * (int64_t)c->n_batch + tbl; }

/* Whether the one-token steps of every MoE layer on the GPU can route there: softmax gating of at
 * most 512 experts and 32 slots, and expert matrices the pair GEMVs take (code types: rows of
 * whole q8 blocks; float types: of whole groups of 8), the GLU's output in whole q8 blocks. */
static bool moe_dev_ok(const tn_cuda_ctx *g, const tn_hparams *hp) {
    if (hp->family->mla || hp->n_expert > 512 || hp->n_expert_used > 32 ||
        hp->n_ff_exp % 32 != 0 || hp->n_embd % 32 != 0)
        return false;
    for (int32_t il = 0; il < g->n_layers; il++) {
        const tn_cu_layer *L = &g->L[il];
        if (!L->moe) continue;
        const tn_cw *ws[3] = {L->fused_egu ? &L->egu : &L->eg, L->fused_egu ? &L->egu : &L->eu, &L->edown};
        for (int i = 0; i < 3; i++)
            if (ws[i]->k % (tn_cw_is_code(ws[i]->kind) ? 32 : 8) != 0) return false;
    }
    return true;
}

/* Attention scores q.k * scale (the family's, or 1/sqrt(hd)); soft-capped (gemma2, *cap > 0): scale
 * / cap, then cap * tanh, as the CPU computes them. */
static float attn_scale(const tn_hparams *hp, float *cap) {
    *cap = hp->attn_softcap > 0 ? hp->attn_softcap : 0.0f;
    return (hp->attn_scale > 0 ? hp->attn_scale : 1.0f / sqrtf((float)hp->head_dim)) / (*cap > 0 ? *cap : 1.0f);
}
/* The gated activation of the family's FFN (kern_cuda.h TN_CU_SILU ..). */
static int glu_act(const tn_hparams *hp) {
    return hp->ffn == TN_FFN_GEGLU ? TN_CU_GELU : hp->ffn == TN_FFN_SWIGLU_OAI ? TN_CU_SWIGLU_OAI : TN_CU_SILU;
}

/* The persistent kernel's arguments for a one-token step (the buffers never move; the step's
 * positions, cache rows and block tables, pos .. tbl, are the caller's to set). */
static tn_cu_persist_args persist_args(const tn_cuda_ctx *g, const tern_ctx *c) {
    const tn_hparams *hp = &c->hp;
    const int64_t hd = hp->head_dim;
    tn_cu_persist_args a = {0};
    a.L = g->d_players;
    a.n_layers = g->n_layers;
    a.x = g->x, a.q = g->q, a.att = g->att, a.h = g->hb2, a.xb = g->xb;
    a.xq = g->xq;
    a.out_norm = g->output_norm;
    a.out_q8 = tn_cw_is_code(g->output.kind) && g->output.k % 32 == 0;
    a.d = hp->n_embd, a.ff = hp->n_ff;
    a.n_head = hp->n_head, a.n_head_kv = hp->n_head_kv, a.hd = (int)hd;
    a.neox = hp->rope_mode == TN_ROPE_NEOX;
    a.act = glu_act(hp);
    a.eps = hp->rms_eps;
    a.scale = attn_scale(hp, &a.cap);
    a.kv = g->kv;
    a.sched = g->asched;
    a.bar = g->d_bar;
    return a;
}

/* TERN_CUDA_PERSIST=1: one-token steps as one persistent kernel where every layer is a dense block
 * the kernel runs (qkv and gate|up fused, no post norms, whole-row q/k norms or experts; the four
 * matrices of one code kind throughout: tn_cu_persist's contract); else launch by launch. */
static void persist_setup(tn_cuda_ctx *g, const tern_ctx *c, bool *ok) {
    const tn_hparams *hp = &c->hp;
    if (env_int("TERN_CUDA_PERSIST", 0) == 0 || !g->has_output || g->n_layers < 1 || c->kc_bits || c->kv_ring || c->kv_swa_blocks)
        return;
    tn_cu_player *P = tn_calloc((size_t)g->n_layers, sizeof *P);
    if (!P) return;
    bool fit = true;
    for (int32_t il = 0; il < g->n_layers && fit; il++) {
        const tn_cu_layer *L = &g->L[il];
        fit = L->fused_qkv && L->fused_gu && !L->moe && !L->attn_post_norm && !L->ffn_post_norm && !L->qk_full;
        if (!fit) break;
        const bool swa = tn_hp_layer_swa(hp, il);
        P[il] = (tn_cu_player){L->qkv, L->w[W_O], L->gu, L->w[W_DOWN], L->bqkv, L->bo, L->attn_norm, L->ffn_norm,
                               L->q_norm, L->k_norm, L->sinks,
                               g->Kc + (size_t)g->loff[il] * c->k_rb, g->Vc + (size_t)g->loff[il] * c->v_rb,
                               swa ? g->d_cs_swa : g->d_cs, tn_hp_layer_rope(hp, il) ? hp->n_rot : 0, swa ? hp->n_swa : 0};
        const tn_cw *ws[4] = {&P[il].qkv, &P[il].wo, &P[il].gu, &P[il].down};
        const tn_cw *w0[4] = {&P[0].qkv, &P[0].wo, &P[0].gu, &P[0].down};
        for (int i = 0; i < 4; i++) /* L0's kind and shapes (the kernel's template and stage layouts) */
            fit = fit && ws[i]->kind == w0[0]->kind && ws[i]->bits == w0[0]->bits && ws[i]->asym == w0[0]->asym &&
                  ws[i]->m == w0[i]->m && ws[i]->k == w0[i]->k;
    }
    if (fit) {
        g->d_bar = dalloc(g, 2 * sizeof(unsigned), ok);
        g->d_players = dupload(g, P, sizeof *P * (size_t)g->n_layers, ok);
        if (*ok) cudaMemset(g->d_bar, 0, 2 * sizeof(unsigned));
        g->h_player0 = P[0];
        const tn_cu_persist_args a = persist_args(g, c);
        g->persist = *ok && tn_cu_persist_check(&a, &P[0]) == 0;
        g->persist_grid = env_int("TERN_CUDA_PERSIST_GRID", 0);
    }
    tn_free(P);
}

tern_status tn_cuda_ctx_create(tern_ctx *c, int32_t ngl, tn_cuda_ctx **out) {
    *out = NULL;
    /* its kernels read f16, q8_0, q4_0 and tq2..tq8 K/V rows, and per-channel tqc2..4 K */
    const int32_t kvt[2] = {c->type_k, c->type_v};
    int cut[2];
    for (int i = 0; i < 2; i++) {
        cut[i] = kvt[i] == TN_F16 ? TN_CU_KV_F16 : kvt[i] == TN_Q8_0 ? TN_CU_KV_Q8_0 : kvt[i] == TN_Q4_0 ? TN_CU_KV_Q4_0 : -1;
        for (int b = 2; b <= 8; b++)
            if (kvt[i] == TERN_KV_TQ(b)) cut[i] = TN_CU_KV_TQ(b);
        if (i == 0 && c->kc_bits) cut[i] = TN_CU_KV_TQC(c->kc_bits);
        if (cut[i] < 0)
            return tn_err(TERN_ERR_UNSUPPORTED,
                          "cuda: %s cache type %s runs on the CPU only (the GPU keeps f16, q8_0, q4_0, tq2 .. tq8 or (K) tqc2 .. tqc4)",
                          i ? "V" : "K", tern_kv_type_name(kvt[i]) ? tern_kv_type_name(kvt[i]) : tn_dtype_name((uint32_t)kvt[i]));
    }
    const char *why = NULL;
    if (tn_cuda_device_count(&why) < 1) return tn_err(TERN_ERR_UNSUPPORTED, "cuda: no usable device (%s)", why);
    const tern_model *m = c->model;
    const tn_hparams *hp = &c->hp;
    if (ngl < 0 || ngl > hp->n_layer) ngl = hp->n_layer;
    if (hp->head_dim > 256) return tn_err(TERN_ERR_UNSUPPORTED, "cuda: head size %d above 256", hp->head_dim);
    /* the block the GPU runs: llama's, with qwen2's biases, qwen3's and gemma3's per-head q/k norms,
     * smollm3's NoPE layers, gemma's GeGLU, post norms, sliding windows and soft caps, phi3's fused
     * matrices (bound as row slices) and LongRoPE (the host's RoPE tables); the rest is refused */
    if (hp->family && hp->family->mla) /* its latent KV cache and absorbed projections are CPU-only */
        return tn_err(TERN_ERR_UNSUPPORTED, "cuda: architecture %s (multi-head latent attention) does not run on the GPU yet; "
                      "run it on the CPU", hp->family->name);
    const bool arch_ok = hp->arch == TN_ARCH_LLAMA || hp->arch == TN_ARCH_QWEN2 || hp->arch == TN_ARCH_QWEN3 ||
                         hp->arch == TN_ARCH_SMOLLM3 || hp->arch == TN_ARCH_GEMMA3 || hp->arch == TN_ARCH_GEMMA2 ||
                         hp->arch == TN_ARCH_PHI3 || hp->arch == TN_ARCH_QWEN3MOE || hp->arch == TN_ARCH_QWEN2MOE ||
                         hp->arch == TN_ARCH_GPT_OSS || hp->arch == TN_ARCH_OLMOE;
    if (!arch_ok ||
        (hp->ffn != TN_FFN_SWIGLU && hp->ffn != TN_FFN_GEGLU && hp->ffn != TN_FFN_SWIGLU_OAI))
        return tn_err(TERN_ERR_UNSUPPORTED,
                      "cuda: architecture %s does not run on the GPU yet (llama, qwen2, qwen3, smollm3, gemma2, gemma3, phi3, qwen3moe, "
                      "qwen2moe, gpt-oss, olmoe do); "
                      "run it on the CPU",
                      hp->family ? hp->family->name : "?");
    tn_cuda_ctx *g = tn_calloc(1, sizeof *g);
    if (!g) return tn_err(TERN_ERR_NOMEM, "cuda: out of memory");
    g->dev = 0;
    g->n_layers = ngl;
    g->has_output = ngl == hp->n_layer;
    tern_status s = TERN_OK;
    if (cudaSetDevice(g->dev) != cudaSuccess || cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking) != cudaSuccess) {
        s = tn_err(TERN_ERR_UNSUPPORTED, "cuda: cannot use device 0: %s", cudaGetErrorString(cudaGetLastError()));
        goto fail;
    }
    if (cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS) {
        g->blas = NULL;
        s = tn_err(TERN_ERR_UNSUPPORTED, "cuda: cuBLAS initialisation failed");
        goto fail;
    }
    cublasSetStream(g->blas, g->st);
    g->L = tn_calloc((size_t)(ngl ? ngl : 1), sizeof *g->L);
    if (!g->L) {
        s = tn_err(TERN_ERR_NOMEM, "cuda: out of memory");
        goto fail;
    }
    bool ok = true;
    int64_t max_k = hp->n_embd, max_mk = 0;
    for (int32_t il = 0; il < ngl && ok; il++) {
        const tn_layer *L = &m->layers[il];
        tn_cu_layer *G = &g->L[il];
        const tn_tensor *R = L->w;
        const tn_tensor *ts[W_N] = {&R[TN_ROLE_ATTN_Q],   &R[TN_ROLE_ATTN_K], &R[TN_ROLE_ATTN_V], &R[TN_ROLE_ATTN_OUT],
                                    &R[TN_ROLE_FFN_GATE], &R[TN_ROLE_FFN_UP], &R[TN_ROLE_FFN_DOWN]};
        /* a block the GPU path does not run yet is refused by name, not computed wrongly */
        static const int unsupported[] = {TN_ROLE_FFN_EXP_PROBS_B};
        for (size_t u = 0; u < sizeof unsupported / sizeof unsupported[0]; u++)
            if (R[unsupported[u]].data) {
                s = tn_err(TERN_ERR_UNSUPPORTED, "cuda: tensor '%s' (%s): this block is not on the GPU yet; run on the CPU",
                           R[unsupported[u]].name, tn_roles[unsupported[u]].name);
                goto fail;
            }
        if ((s = upload_stacked(g, ts, 3, &G->qkv, &G->fused_qkv))) goto fail;
        G->moe = tn_layer_moe(L);
        if (G->moe) { /* the router, the experts, a shared expert; no dense gate, up, down */
            if ((s = upload_weight(g, &R[TN_ROLE_FFN_GATE_INP], &G->router)) ||
                (s = upload_experts(g, &R[TN_ROLE_FFN_GATE_EXPS], &R[TN_ROLE_FFN_UP_EXPS], &G->egu, &G->eg, &G->eu, &G->fused_egu)) ||
                (s = upload_experts(g, &R[TN_ROLE_FFN_DOWN_EXPS], NULL, &G->edown, NULL, NULL, NULL)))
                goto fail;
            const int64_t ffe = hp->n_ff_exp;
            const tn_tensor *gb = &R[TN_ROLE_FFN_GATE_EXPS_B], *ub = &R[TN_ROLE_FFN_UP_EXPS_B], *db = &R[TN_ROLE_FFN_DOWN_EXPS_B];
            if (gb->data || ub->data || db->data) { /* gpt-oss: every expert matrix with its biases */
                const int64_t ne = hp->n_expert;
                if (!gb->data || !ub->data || !db->data || gb->type != TN_F32 || ub->type != TN_F32 || gb->ne[0] != ffe ||
                    ub->ne[0] != ffe || (gb->ne[1] > 0 ? gb->ne[1] : 1) != ne || (ub->ne[1] > 0 ? ub->ne[1] : 1) != ne) {
                    s = tn_err(TERN_ERR_UNSUPPORTED, "cuda: layer %d: expert biases must be f32 [%lld][%d] on gate, up and down", il,
                               (long long)ffe, (int)ne);
                    goto fail;
                }
                if (G->fused_egu) { /* interleaved as egu's rows: expert e's gate biases, then its up biases */
                    float *bb = tn_malloc(sizeof(float) * (size_t)(2 * ffe * ne));
                    if (!bb) {
                        s = tn_err(TERN_ERR_NOMEM, "cuda: out of host memory");
                        goto fail;
                    }
                    for (int64_t e = 0; e < ne; e++) {
                        memcpy(bb + 2 * ffe * e, (const float *)gb->data + ffe * e, sizeof(float) * (size_t)ffe);
                        memcpy(bb + 2 * ffe * e + ffe, (const float *)ub->data + ffe * e, sizeof(float) * (size_t)ffe);
                    }
                    G->egu_b = dupload(g, bb, sizeof(float) * (size_t)(2 * ffe * ne), &ok);
                    tn_free(bb);
                } else {
                    G->eg_b = upload_f32(g, gb, &ok);
                    G->eu_b = upload_f32(g, ub, &ok);
                }
                G->edown_b = upload_f32(g, db, &ok);
            }
            G->brouter = upload_f32(g, &R[TN_ROLE_FFN_GATE_INP_B], &ok);
            max_k = TN_MAX(max_k, ffe);
            /* an expert's gate|up (2 ffe rows of n_embd) as the largest matrix cuBLAS gets in one piece */
            max_mk = TN_MAX(max_mk, TN_MAX(2 * ffe * hp->n_embd, G->router.m * G->router.k));
            G->shexp = tn_layer_shexp(L);
            if (G->shexp) {
                const tn_tensor *sh[3] = {&R[TN_ROLE_FFN_GATE_SHEXP], &R[TN_ROLE_FFN_UP_SHEXP], &R[TN_ROLE_FFN_DOWN_SHEXP]};
                if ((s = upload_stacked(g, sh, 2, &G->sgu, &G->fused_sgu))) goto fail;
                if ((!G->fused_sgu && ((s = upload_weight(g, sh[0], &G->sg)) || (s = upload_weight(g, sh[1], &G->su)))) ||
                    (s = upload_weight(g, sh[2], &G->sdown)))
                    goto fail;
                max_k = TN_MAX(max_k, G->sdown.k);
                max_mk = TN_MAX(max_mk, TN_MAX(2 * G->sdown.m * G->sdown.k, G->sdown.m * G->sdown.k));
                G->sgate = upload_f32(g, &R[TN_ROLE_FFN_GATE_INP_SHEXP], &ok);
            }
        } else if ((s = upload_stacked(g, ts + W_GATE, 2, &G->gu, &G->fused_gu))) {
            goto fail;
        }
        for (int i = 0; i < W_N; i++) {
            if ((i <= W_V && G->fused_qkv) || ((i == W_GATE || i == W_UP) && G->fused_gu)) continue;
            if (i >= W_GATE && G->moe) continue;
            if ((s = upload_weight(g, ts[i], &G->w[i]))) goto fail;
            max_k = TN_MAX(max_k, G->w[i].k);
            max_mk = TN_MAX(max_mk, G->w[i].m * G->w[i].k);
        }
        if (G->fused_qkv) max_mk = TN_MAX(max_mk, G->qkv.m * G->qkv.k);
        if (G->fused_gu) max_mk = TN_MAX(max_mk, G->gu.m * G->gu.k);
        const tn_tensor *bq = &R[TN_ROLE_ATTN_Q_B], *bk = &R[TN_ROLE_ATTN_K_B], *bv = &R[TN_ROLE_ATTN_V_B];
        if (G->fused_qkv && bq->data && bk->data && bv->data) { /* qwen2: the biases stacked likewise */
            const size_t nq = bq->nbytes, nk = bk->nbytes, nv = bv->nbytes;
            float *bb = tn_malloc(nq + nk + nv);
            if (!bb) {
                s = tn_err(TERN_ERR_NOMEM, "cuda: out of memory");
                goto fail;
            }
            memcpy(bb, bq->data, nq), memcpy((uint8_t *)bb + nq, bk->data, nk), memcpy((uint8_t *)bb + nq + nk, bv->data, nv);
            G->bqkv = dupload(g, bb, nq + nk + nv, &ok);
            tn_free(bb);
        } else if (G->fused_qkv && (bq->data || bk->data || bv->data)) {
            s = tn_err(TERN_ERR_UNSUPPORTED, "cuda: layer %d has biases on some of q, k, v only", il);
            goto fail;
        }
        G->attn_norm = upload_f32(g, &R[TN_ROLE_ATTN_NORM], &ok);
        G->ffn_norm = upload_f32(g, &R[TN_ROLE_FFN_NORM], &ok);
        G->bq = upload_f32(g, bq, &ok);
        G->bk = upload_f32(g, bk, &ok);
        G->bv = upload_f32(g, bv, &ok);
        G->q_norm = upload_f32(g, &R[TN_ROLE_ATTN_Q_NORM], &ok); /* qwen3: per-head RMSNorm of q and k */
        G->k_norm = upload_f32(g, &R[TN_ROLE_ATTN_K_NORM], &ok);
        G->qk_full = hp->family && hp->family->qk_norm_full;
        G->attn_post_norm = upload_f32(g, &R[TN_ROLE_ATTN_POST_NORM], &ok); /* gemma (gpt-oss's is its ffn_norm: llama.c) */
        G->sinks = upload_f32(g, &R[TN_ROLE_ATTN_SINKS], &ok); /* gpt-oss */
        G->bo = upload_f32(g, &R[TN_ROLE_ATTN_OUT_B], &ok);
        G->ffn_post_norm = upload_f32(g, &R[TN_ROLE_FFN_POST_NORM], &ok);
    }
    if (ok && g->has_output) {
        if ((s = upload_weight(g, &m->output, &g->output))) goto fail;
        max_mk = TN_MAX(max_mk, g->output.m * g->output.k);
        g->output_norm = upload_f32(g, &m->output_norm, &ok);
    }
    const int64_t nb = c->n_batch, d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    const bool moe = hp->n_expert > 0;
    /* the widest FFN: dense layers', the experts' and a shared expert's */
    const int64_t ff = moe ? TN_MAX(hp->n_ff, TN_MAX(hp->n_ff_exp, hp->n_ff_shexp)) : hp->n_ff;
    const int64_t wide = TN_MAX(TN_MAX(d, qd), ff);
    /* batches routed on the GPU: every (token, slot) pair's gate|up rows and their q8 blocks at once */
    const int64_t pairs_ff = moe ? nb * hp->n_expert_used * hp->n_ff_exp : 0;
    g->x = dalloc(g, (size_t)(nb * d) * 4, &ok);
    g->xb = dalloc(g, (size_t)(nb * wide) * 4, &ok);
    g->q = dalloc(g, (size_t)(nb * (qd + 2 * kv_dim)) * 4, &ok); /* q, k, v side by side when fused */
    g->k = dalloc(g, (size_t)(nb * kv_dim) * 4, &ok);
    g->v = dalloc(g, (size_t)(nb * kv_dim) * 4, &ok);
    g->att = dalloc(g, (size_t)(nb * qd) * 4, &ok);
    g->hb = dalloc(g, (size_t)TN_MAX(nb * 2 * ff, 2 * pairs_ff) * 4, &ok); /* gate and up side by side when fused */
    g->hb2 = dalloc(g, (size_t)TN_MAX(nb * ff, pairs_ff) * 4, &ok);
    if (g->has_output) g->logits = dalloc(g, (size_t)c->n_logits_cap * (size_t)hp->n_vocab * 4, &ok);
    if (moe) {
        const int64_t R = nb * hp->n_expert_used;
        g->rl = dalloc(g, (size_t)(nb * hp->n_expert) * 4, &ok);
        g->xg = dalloc(g, (size_t)(R * d) * 4, &ok);
        g->ey = dalloc(g, (size_t)(R * d) * 4, &ok);
        g->d_moe = dalloc(g, (size_t)(4 * R) * 4, &ok); /* tok, row, w (host routing) or sel (GPU routing) */
    }
    const int64_t xq_n = TN_MAX(nb * max_k, pairs_ff);
    g->xq.q = dalloc(g, (size_t)xq_n, &ok);
    g->xq.d = dalloc(g, (size_t)(xq_n / 32) * 4, &ok);
    g->xq.s = dalloc(g, (size_t)(xq_n / 32) * 4, &ok);
    if (nb > TN_CU_GEMV_MAXN) { /* float-path types (and TERN_CUDA_PREFILL=cublas) above 8 tokens */
        g->xh = dalloc(g, (size_t)(nb * max_k) * 2, &ok);
        g->wh = dalloc(g, (size_t)max_mk * 2, &ok);
        g->wh_elems = max_mk;
    }
    /* the cache in the context's types: rows of c->k_rb / c->v_rb bytes, as the CPU's */
    /* sliding-window layers keep a ring of kv_ring rows (a contiguous cache) or a pool of
     * kv_swa_blocks blocks of their own (a paged one), as the CPU's */
    g->loff = tn_calloc((size_t)ngl + 1, sizeof *g->loff);
    if (!g->loff) {
        s = tn_err(TERN_ERR_NOMEM, "cuda: out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < ngl; il++) {
        const bool w = tn_hp_layer_swa(hp, il);
        g->loff[il + 1] = g->loff[il] + (w && c->kv_ring           ? c->kv_ring
                                         : w && c->kv_swa_blocks ? (int64_t)c->kv_swa_blocks * TN_KV_BLOCK
                                                                 : c->kv_rows);
    }
    const size_t kv_rows_all = (size_t)g->loff[ngl];
    g->Kc = dalloc(g, kv_rows_all * c->k_rb, &ok);
    g->Vc = dalloc(g, kv_rows_all * c->v_rb, &ok);
    if (ok) {
        cudaMemset(g->Kc, 0, kv_rows_all * c->k_rb);
        cudaMemset(g->Vc, 0, kv_rows_all * c->v_rb);
    }
    g->kv = (tn_cu_kv){cut[0], cut[1], (int64_t)c->k_rb, (int64_t)c->v_rb, NULL, c->rot_blk, c->rot_k, c->rot_v, 0, NULL, NULL, NULL, 0};
    if (c->kc_bits) { /* per-channel K: each sequence's newest keys in f16, as the CPU's windows */
        g->kv.kc_w = (int)c->kc_w;
        const size_t wb = (size_t)ngl * kw_layer(c) * 2;
        g->Kw = dalloc(g, wb, &ok);
        if (ok) cudaMemset(g->Kw, 0, wb);
    }
    if (c->rot_k || c->rot_v) g->kv.rot_sign = dupload(g, c->rot_sign, (size_t)hp->head_dim * sizeof(float), &ok);
    g->tbl_cap = (int64_t)nb * (c->kv_blocks + 1) * (c->kv_swa_blocks ? 2 : 1); /* (and the window pool's tables) */
    g->d_ints = dalloc(g, (size_t)ints_needed(c, g->tbl_cap) * 4, &ok);
    g->d_cs = dalloc(g, (size_t)(nb * hp->n_rot) * 4, &ok);
    if (hp->n_swa > 0) g->d_cs_swa = dalloc(g, (size_t)(nb * hp->n_rot) * 4, &ok);
    g->d_cnt = dalloc(g, sizeof(int), &ok);
    if (ok) cudaMemset(g->d_cnt, 0, sizeof(int));
    g->att_max = env_int("TERN_CUDA_ATTN_SPLIT", 0);
    g->att_tile = env_int("TERN_CUDA_ATTN_TILE", 1) != 0;
    g->asched.tile = g->att_tile;
    g->asched.kmax = (int)((c->kv_rows + TN_CU_ATT_CHUNK - 1) / TN_CU_ATT_CHUNK);
    if (g->att_max != 1 && g->asched.kmax > 1) { /* partials of up to TN_CU_ATT_SPREAD tokens' heads */
        g->asched.tokens = (int)TN_MIN(nb, TN_CU_ATT_SPREAD);
        const int64_t units = (int64_t)g->asched.tokens * hp->n_head;
        g->asched.part = dalloc(g, (size_t)(units * g->asched.kmax * (hp->head_dim + 2)) * 4, &ok);
        g->asched.cnt = dalloc(g, (size_t)units * sizeof(int), &ok);
        if (ok) cudaMemset(g->asched.cnt, 0, (size_t)units * sizeof(int));
    }
    if (!ok) {
        s = TERN_ERR_NOMEM;
        goto fail;
    }
    if (cudaMallocHost((void **)&g->h_x, (size_t)(nb * d) * 4) != cudaSuccess ||
        cudaMallocHost((void **)&g->h_cs, (size_t)(nb * hp->n_rot) * 4) != cudaSuccess ||
        cudaMallocHost((void **)&g->h_ints, (size_t)ints_needed(c, g->tbl_cap) * 4) != cudaSuccess ||
        (hp->n_swa > 0 && cudaMallocHost((void **)&g->h_cs_swa, (size_t)(nb * hp->n_rot) * 4) != cudaSuccess) ||
        (moe && cudaMallocHost((void **)&g->h_moe, (size_t)(3 * nb * hp->n_expert_used) * 4) != cudaSuccess)) {
        cudaGetLastError();
        s = tn_err(TERN_ERR_NOMEM, "cuda: cannot allocate pinned host buffers");
        goto fail;
    }
    const char *ge = getenv("TERN_CUDA_GRAPH");
    g->moe_dev = moe && env_int("TERN_CUDA_MOE_HOST", 0) == 0 && moe_dev_ok(g, hp);
    /* (a mixture of experts routed on the host stops between its kernels: no graph of the step) */
    g->use_graph = !(ge && !strcmp(ge, "0")) && (!moe || g->moe_dev);
    g->fuse_rope = env_int("TERN_CUDA_FUSE", 1) != 0 && env_int("TERN_CUDA_FUSE_ROPE", 1) != 0;
    g->fuse_norm = env_int("TERN_CUDA_FUSE", 1) != 0 && env_int("TERN_CUDA_FUSE_NORM", 1) != 0;
    g->fuse_glu = env_int("TERN_CUDA_FUSE", 1) != 0 && env_int("TERN_CUDA_FUSE_GLU", 1) != 0;
    persist_setup(g, c, &ok);
    if (!ok) {
        s = TERN_ERR_NOMEM;
        goto fail;
    }
    /* programmatic dependent launch on Hopper and later, unless TERN_CUDA_PDL=0; the GEMVs'
     * prefetch and grid (kern_cuda.h, tn_cu_configure): TERN_CUDA_EARLY, TERN_CUDA_PREFETCH,
     * TERN_CUDA_GEMV_BPS (blocks per multiprocessor, 0: a block per row group), TERN_CUDA_GEMV_ROWS
     * (rows per warp of one-token code-path GEMVs, 1 or 2) */
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, g->dev) == cudaSuccess) {
        g->sms = prop.multiProcessorCount;
        tn_cu_configure(prop.major >= 9 && env_int("TERN_CUDA_PDL", 1) != 0, env_int("TERN_CUDA_EARLY", 1),
                        env_int("TERN_CUDA_PREFETCH", 1), env_int("TERN_CUDA_GEMV_BPS", TN_CUDA_GEMV_BPS),
                        env_int("TERN_CUDA_GEMV_ROWS", 2));
    }
    const char *pe = getenv("TERN_CUDA_PROFILE");
    if (pe && *pe && strcmp(pe, "0")) {
        g->cap_ev = 2 * 4096;
        g->ev = tn_calloc((size_t)g->cap_ev, sizeof *g->ev);
        g->ev_label = tn_calloc((size_t)g->cap_ev / 2, sizeof *g->ev_label);
        g->prof = g->ev && g->ev_label;
        for (int i = 0; g->prof && i < g->cap_ev; i++)
            if (cudaEventCreate(&g->ev[i]) != cudaSuccess) g->prof = false, g->cap_ev = i;
    }
    const char *pc = getenv("TERN_CUDA_PREFILL");
    g->tile_max_code = 64;
    g->tile_max_float = TN_CU_GEMV_MAXN;
    if (pc && !strcmp(pc, "gemv")) g->tile_max_code = g->tile_max_float = INT64_MAX;
    if (pc && !strcmp(pc, "cublas")) g->tile_max_code = TN_CU_GEMV_MAXN;
    /* code-path batches of at least TERN_CUDA_MMQ tokens on the int8 tensor cores (0, or
     * TERN_CUDA_PREFILL=cublas: none) */
    tn_cu_set_mmq(pc && !strcmp(pc, "cublas") ? 0 : env_int("TERN_CUDA_MMQ", TN_CUDA_MMQ_MIN));
    if (cudaDeviceSynchronize() != cudaSuccess) {
        s = tn_err(TERN_ERR_INTERNAL, "cuda: %s", cudaGetErrorString(cudaGetLastError()));
        goto fail;
    }
    *out = g;
    return TERN_OK;
fail:
    tn_cuda_ctx_free(g);
    return s ? s : TERN_ERR_INTERNAL;
}

/* ---- forward ------------------------------------------------------------------------------------ */

/* every token of the batch of another sequence */
static bool one_token_per_seq(const tn_batch *b) {
    for (int32_t i = 1; i < b->n; i++)
        for (int32_t j = 0; j < i; j++)
            if (b->seq[i] == b->seq[j]) return false;
    return true;
}

#define CK(expr)                                      \
    do {                                              \
        int e_ = (expr);                              \
        if (e_ && !g->cuerr) g->cuerr = e_;           \
    } while (0)

/* CKL(label, launch): CK, and with TERN_CUDA_PROFILE the launch timed under label */
static int prof_begin(tn_cuda_ctx *g, const char *label) {
    if (!g->prof || g->n_ev + 2 > g->cap_ev) return -1;
    const int i = g->n_ev;
    g->ev_label[i / 2] = label;
    cudaEventRecord(g->ev[i], g->st);
    return i;
}
static void prof_end(tn_cuda_ctx *g, int i) {
    if (i < 0) return;
    cudaEventRecord(g->ev[i + 1], g->st);
    g->n_ev = i + 2;
}
#define CKL(label, expr)                              \
    do {                                              \
        const int pi_ = prof_begin(g, label);         \
        CK(expr);                                     \
        prof_end(g, pi_);                             \
    } while (0)

/* After the pass's synchronisation: the timed launches into the per-label sums. */
static void prof_collect(tn_cuda_ctx *g) {
    for (int i = 0; i + 1 < g->n_ev; i += 2) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, g->ev[i], g->ev[i + 1]) != cudaSuccess) continue;
        const char *lb = g->ev_label[i / 2];
        int j = 0;
        while (j < g->n_pt && strcmp(g->pt[j].label, lb)) j++;
        if (j == g->n_pt) {
            if (g->n_pt == (int)(sizeof g->pt / sizeof g->pt[0])) continue;
            g->pt[g->n_pt++].label = lb;
        }
        g->pt[j].ms += ms;
        g->pt[j].calls++;
    }
    g->n_ev = 0;
    cudaGetLastError();
}

static void prof_print(const tn_cuda_ctx *g) {
    double tot = 0;
    for (int j = 0; j < g->n_pt; j++) tot += g->pt[j].ms;
    fprintf(stderr, "tern cuda profile: %ld forward passes, %ld tokens; wall %.3f ms, kernels %.3f ms (%.1f%%)\n",
            g->prof_passes, g->prof_tokens, g->prof_wall_ms, tot, g->prof_wall_ms > 0 ? 100.0 * tot / g->prof_wall_ms : 0.0);
    fprintf(stderr, "  %-14s %8s %12s %10s %7s\n", "launch", "calls", "total ms", "mean us", "share");
    for (int j = 0; j < g->n_pt; j++)
        fprintf(stderr, "  %-14s %8ld %12.3f %10.2f %6.1f%%\n", g->pt[j].label, g->pt[j].calls, g->pt[j].ms,
                1000.0 * g->pt[j].ms / (double)(g->pt[j].calls ? g->pt[j].calls : 1), tot > 0 ? 100.0 * g->pt[j].ms / tot : 0.0);
}

/* the GEMV kernels (and for code-path batches of at least tn_cu_mmq() tokens the tensor-core
 * kernel, with their bits), or fp16 + cuBLAS */
static bool use_gemv(const tn_cuda_ctx *g, const tn_cw *w, int64_t n) {
    if (tn_cw_is_code(w->kind)) return n <= TN_CU_GEMV_MAXN || n <= g->tile_max_code || (tn_cu_mmq() && n >= tn_cu_mmq());
    return n <= TN_CU_GEMV_MAXN || n <= g->tile_max_float;
}

void tn_cuda_set_batch_invariant(tn_cuda_ctx *g, bool on) {
    if (!g) return;
    g->tile_max_code = on ? INT64_MAX : 64;
    g->tile_max_float = on ? INT64_MAX : TN_CU_GEMV_MAXN;
}

/* y[n][ldy] (+)= W x (+ bias); x [n][k] rows of stride ldx; with tail (one token), the norm after it
 * (tn_cu_tail) done by the product's kernel. */
static void mm_tail(tn_cuda_ctx *g, const char *label, const tn_cw *w, const float *x, int64_t ldx, int64_t n, float *y,
                    int64_t ldy, const float *bias, int acc, const tn_cu_tail *tail) {
    if (use_gemv(g, w, n)) {
        if (tn_cw_is_code(w->kind) && g->q_src != x) {
            CKL("quantize", tn_cu_quantize_q8(x, ldx, w->k, n, g->xq, g->st));
            g->q_src = x;
        }
        if (tail) CKL(label, tn_cu_gemv_tail(w, x, ldx, &g->xq, y, bias, acc, tail, g->st));
        else CKL(label, tn_cu_gemv(w, x, ldx, &g->xq, n, y, ldy, bias, acc, g->st));
        return;
    }
    if (g->h_src != x) {
        CKL("to_f16", tn_cu_f32_to_f16(x, ldx, w->k, n, g->xh, g->st));
        g->h_src = x;
    }
    /* the weight in fp16 (f16 weights as they are), in tiles of rows that fit the scratch */
    const bool direct = w->kind == TN_CW_F16;
    const int64_t rows = direct ? w->m : TN_MAX((int64_t)1, TN_MIN(w->m, g->wh_elems / w->k));
    for (int64_t r0 = 0; r0 < w->m; r0 += rows) {
        const int64_t nr = TN_MIN(rows, w->m - r0);
        const uint16_t *A = direct ? (const uint16_t *)w->data : g->wh;
        if (!direct) CKL("dequant_f16", tn_cu_dequant_f16(w, r0, nr, g->wh, g->st));
        const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
        const int pi = prof_begin(g, label);
        cublasStatus_t bs = cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n, (int)w->k, &alpha, A,
                                         CUDA_R_16F, (int)w->k, g->xh, CUDA_R_16F, (int)w->k, &beta, y + r0, CUDA_R_32F,
                                         (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        prof_end(g, pi);
        if (bs != CUBLAS_STATUS_SUCCESS && !g->cuerr) g->cuerr = (int)cudaErrorLaunchFailure;
    }
    if (bias) CKL("bias", tn_cu_add_bias(y, bias, n, ldy, g->st));
    if (tail) CKL("norm", tn_cu_rmsnorm(tail->x, NULL, tail->y, tail->w, 1, tail->d, tail->eps, tail->xq.q ? &tail->xq : NULL, g->st));
}
static void mm(tn_cuda_ctx *g, const char *label, const tn_cw *w, const float *x, int64_t ldx, int64_t n, float *y,
               int64_t ldy, const float *bias, int acc) {
    mm_tail(g, label, w, x, ldx, n, y, ldy, bias, acc, NULL);
}

static void fresh(tn_cuda_ctx *g) { g->q_src = g->h_src = NULL; }

/* Whether mm(w, .., n) reads q8 activations (then a norm or SwiGLU kernel quantizes as it writes). */
static bool q8_for(const tn_cuda_ctx *g, const tn_cw *w, int64_t n) {
    return tn_cw_is_code(w->kind) && use_gemv(g, w, n) && w->k % 32 == 0;
}

/* x += W in (n rows of W's row length); with a post norm (gemma) x += rmsnorm(W in) * post, the
 * product first into xb (free by then: the block's input norm was consumed by its first matmul).
 * tail (no post norm): the next norm, done by the product's kernel. */
static void proj_add(tn_cuda_ctx *g, const char *label, const tn_cw *w, const float *bias, const float *in, int64_t ldin, int64_t n,
                     const float *post, float eps, const tn_cu_tail *tail) {
    if (!post) {
        mm_tail(g, label, w, in, ldin, n, g->x, w->m, bias, 1, tail);
        return;
    }
    mm(g, label, w, in, ldin, n, g->xb, w->m, bias, 0);
    fresh(g);
    CKL("post_norm", tn_cu_rmsnorm_add(g->x, g->xb, post, n, w->m, eps, g->st));
}

/* h = act(Wgate x + bg) * (Wup x + bu) for n rows of x (stride ldx): gu the gate|up matrix (gate
 * rows, then as many up rows; b its biases, gate's then up's, or NULL), or wg and wu apart (gu NULL;
 * b NULL or gate's biases, bu up's); down the product that reads h (whose q8 blocks the last kernel
 * writes where down reads them). Returns h: hb2, or hb (gate and up apart). */
static const float *ffn_glu(tn_cuda_ctx *g, const tn_cw *gu, const tn_cw *wg, const tn_cw *wu, const float *b, const float *bu,
                            const tn_cw *down, const float *x, int64_t ldx, int64_t n, int act) {
    const bool qd = q8_for(g, down, n);
    if (!gu) {
        const int64_t ff = wg->m;
        mm(g, "gate_up", wg, x, ldx, n, g->hb, ff, b, 0);
        mm(g, "gate_up", wu, x, ldx, n, g->hb2, ff, bu, 0);
        CKL("swiglu", tn_cu_swiglu(g->hb, g->hb2, n * ff, act, g->st));
        fresh(g);
        return g->hb;
    }
    const int64_t ff = gu->m / 2;
    const bool code = tn_cw_is_code(gu->kind);
    if (g->fuse_glu && n == 1 && !b && ff % 32 == 0 && (code ? gu->k % 32 == 0 : gu->k % 8 == 0 && ldx % 4 == 0)) {
        /* one token: each warp a gate row and its up row, h = act(gate) up written by the product,
         * its q8 blocks for Wdown by the last block (the same bits as below) */
        if (code && g->q_src != x) {
            CKL("quantize", tn_cu_quantize_q8(x, ldx, gu->k, 1, g->xq, g->st));
            g->q_src = x;
        }
        const tn_cu_tail tg = {g->d_cnt, g->hb2, NULL, NULL, 0.0f, ff, g->xq};
        CKL("gate_up", tn_cu_gemv_glu(gu, x, &g->xq, g->hb, g->hb2, act, qd ? &tg : NULL, g->st));
    } else {
        mm(g, "gate_up", gu, x, ldx, n, g->hb, 2 * ff, b, 0);
        CKL("swiglu", tn_cu_swiglu_pair(g->hb, g->hb2, n, ff, act, qd ? &g->xq : NULL, g->st));
    }
    fresh(g);
    if (qd) g->q_src = g->hb2;
    return g->hb2;
}

/* n tokens' routed experts without the host (the router's logits in rl): routed by
 * tn_cu_moe_route into n k (token, slot) pairs, each pair's expert gate|up and GLU (its q8 blocks
 * by the last block) and down by the pair GEMVs (one-token kernels: a pair's result is the same in
 * any batch), then the slots' weighted sum in slot order, as moe_ffn computes them. */
static void moe_ffn_dev(tn_cuda_ctx *g, const tern_ctx *c, const tn_cu_layer *L, int64_t n, int32_t k, int act) {
    const tn_hparams *hp = &c->hp;
    const int64_t d = hp->n_embd, ffe = hp->n_ff_exp, P = n * k;
    int32_t *sel = g->d_moe + 3 * P, *row = g->d_moe + P;
    float *w = (float *)(g->d_moe + 2 * P);
    const int gating = hp->family->moe_gating == TN_MOE_SOFTMAX_WEIGHT ? TN_CU_GATE_TOPK_SOFTMAX : TN_CU_GATE_SOFTMAX;
    CKL("moe_route", tn_cu_moe_route(g->rl, L->brouter, n, hp->n_expert, k, gating, hp->family->moe_renorm, sel, w, row, g->st));
    const tn_cw *gu = L->fused_egu ? &L->egu : NULL;
    const bool code_gu = tn_cw_is_code((gu ? gu : &L->eg)->kind), code_dn = tn_cw_is_code(L->edown.kind);
    if (code_gu && g->q_src != g->xb) { /* the router's type may not have needed xb's q8 blocks */
        CKL("quantize", tn_cu_quantize_q8(g->xb, d, d, n, g->xq, g->st));
        g->q_src = g->xb;
    }
    const tn_cu_ex xk = {sel, gu ? 2 * ffe : ffe, k, (int)P}, x1 = {sel, d, 1, (int)P};
    float *h;
    if (gu) { /* h [k][ffe] = act(gate) up, fused (its q8 blocks for down by the last block) or the GLU kernel */
        const tn_cu_glu gl = {g->hb2, act};
        const tn_cu_tail tg = {g->d_cnt, g->hb2, NULL, NULL, 0.0f, P * ffe, g->xq};
        if (g->fuse_glu && !L->egu_b) { /* (biases: added before the GLU, by the product without it) */
            CKL("gate_up_exps", tn_cu_gemv_experts(gu, &xk, g->xb, d, &g->xq, g->hb, 2 * ffe, NULL, &gl, code_dn ? &tg : NULL, g->st));
        } else {
            CKL("gate_up_exps", tn_cu_gemv_experts(gu, &xk, g->xb, d, &g->xq, g->hb, 2 * ffe, L->egu_b, NULL, NULL, g->st));
            CKL("swiglu", tn_cu_swiglu_pair(g->hb, g->hb2, P, ffe, act, code_dn ? &g->xq : NULL, g->st));
        }
        h = g->hb2;
    } else { /* gate and up of different types: both products, the GLU kernel, then h's q8 blocks */
        CKL("gate_up_exps", tn_cu_gemv_experts(&L->eg, &xk, g->xb, d, &g->xq, g->hb, ffe, L->eg_b, NULL, NULL, g->st));
        CKL("gate_up_exps", tn_cu_gemv_experts(&L->eu, &xk, g->xb, d, &g->xq, g->hb2, ffe, L->eu_b, NULL, NULL, g->st));
        CKL("swiglu", tn_cu_swiglu(g->hb, g->hb2, P * ffe, act, g->st));
        h = g->hb;
        if (code_dn) CKL("quantize", tn_cu_quantize_q8(h, ffe, ffe, P, g->xq, g->st));
    }
    fresh(g);
    CKL("down_exps", tn_cu_gemv_experts(&L->edown, &x1, h, ffe, &g->xq, g->ey, d, L->edown_b, NULL, NULL, g->st));
    CKL("moe_combine", tn_cu_moe_combine(g->x, g->ey, row, w, n, k, d, g->st));
}

/* A mixture-of-experts FFN on the normed rows xb (n of them): the router's logits to the host,
 * each token routed there by the CPU's own routing (tn_moe_route_token) and the rows grouped by
 * expert (tn_moe_group); the rows' inputs gathered, each chosen expert's gate|up, GLU and down over
 * its rows, then x += the slots' weighted outputs in slot order, and a shared expert's gated
 * output. The same steps as the CPU's tn_blk_moe and tn_blk_shexp. */
static void moe_ffn(tn_cuda_ctx *g, tern_ctx *c, int32_t il, int64_t n, int act) {
    const tn_hparams *hp = &c->hp;
    const tn_cu_layer *L = &g->L[il];
    const tn_layer *Lh = &c->model->layers[il];
    const int32_t ne = hp->n_expert, k = hp->n_expert_used;
    const int64_t d = hp->n_embd, ffe = hp->n_ff_exp, R = n * k;
    /* (the router's bias, gpt-oss, is added by the routing: tn_cu_moe_route, or tn_moe_route_token on the host) */
    mm(g, "router", &L->router, g->xb, d, n, g->rl, ne, NULL, 0);
    /* batches of the GEMV kernels' size route on the GPU (any batch where batch-invariant) */
    if (g->moe_dev && n <= g->tile_max_code && R <= 65535) {
        moe_ffn_dev(g, c, L, n, k, act);
    } else {
        CKL("d2h", cudaMemcpyAsync(c->moe_logits, g->rl, (size_t)(n * ne) * 4, cudaMemcpyDeviceToHost, g->st));
        CK(cudaStreamSynchronize(g->st));
        if (g->cuerr) return;
        for (int64_t t = 0; t < n; t++) tn_moe_route_token(hp, Lh, c->moe_logits + t * ne, c->moe_sel + t * k, c->moe_w + t * k);
        tn_moe_group(c, Lh, il, (int32_t)n);
        int32_t *tok = g->d_moe, *row = tok + R;
        const float *w = (const float *)(row + R);
        memcpy(g->h_moe, c->moe_tok, (size_t)R * 4);
        memcpy(g->h_moe + R, c->moe_row, (size_t)R * 4);
        memcpy(g->h_moe + 2 * R, c->moe_w, (size_t)R * 4);
        CKL("h2d", cudaMemcpyAsync(g->d_moe, g->h_moe, (size_t)(3 * R) * 4, cudaMemcpyHostToDevice, g->st));
        CKL("gather", tn_cu_gather_rows(g->xb, tok, R, d, g->xg, g->st));
        const int32_t *off = c->moe_off;
        for (int32_t e = 0; e < ne; e++) {
            const int64_t r0 = off[e], nr = off[e + 1] - off[e];
            if (nr == 0) continue;
            fresh(g); /* xg's rows: new contents at addresses used before */
            const tn_cw gu = L->fused_egu ? cw_rows(&L->egu, 2 * ffe * e, 2 * ffe) : (tn_cw){0};
            const tn_cw eg = L->fused_egu ? gu : cw_rows(&L->eg, ffe * e, ffe), eu = L->fused_egu ? gu : cw_rows(&L->eu, ffe * e, ffe);
            const tn_cw dn = cw_rows(&L->edown, d * e, d);
            /* gpt-oss: the expert's biases */
            const float *b = L->egu_b ? L->egu_b + 2 * ffe * e : L->eg_b ? L->eg_b + ffe * e : NULL;
            const float *h = ffn_glu(g, L->fused_egu ? &gu : NULL, &eg, &eu, b, L->eu_b ? L->eu_b + ffe * e : NULL, &dn,
                                     g->xg + r0 * d, d, nr, act);
            mm(g, "down_exps", &dn, h, ffe, nr, g->ey + r0 * d, d, L->edown_b ? L->edown_b + d * e : NULL, 0);
        }
        CKL("moe_combine", tn_cu_moe_combine(g->x, g->ey, row, w, n, k, d, g->st));
    }
    fresh(g);
    if (L->shexp) { /* x += sigmoid(gate . xb) * Wdown_sh (act(Wgate_sh xb) * Wup_sh xb) */
        const float *h = ffn_glu(g, L->fused_sgu ? &L->sgu : NULL, &L->sg, &L->su, NULL, NULL, &L->sdown, g->xb, d, n, act);
        mm(g, "down_shexp", &L->sdown, h, L->sdown.k, n, g->ey, d, NULL, 0);
        CKL("gate_add", tn_cu_gate_add(g->x, g->ey, g->xb, L->sgate, n, d, g->st));
        fresh(g);
    }
}

/* The layers on the GPU and, when it holds them all, the final norm and the logits of the n_out
 * rows in d_orow: kernel launches only (a CUDA graph captures them for one-token steps). */
static void run_layers(tn_cuda_ctx *g, tern_ctx *c, int64_t n, int32_t n_out) {
    const tn_hparams *hp = &c->hp;
    const int64_t d = hp->n_embd, hd = hp->head_dim, qd = (int64_t)hp->n_head * hd;
    const int64_t kv_dim = (int64_t)hp->n_head_kv * hd;
    const step_ints di = ints_at(g->d_ints, n);
    int32_t *d_pos = di.pos, *d_kvrow = di.kvrow, *d_toff = di.toff, *d_orow = di.orow, *d_wseq = di.wseq,
            *d_kvrow_swa = di.kvrow_swa, *d_toff_swa = di.toff_swa, *d_tbl = di.tbl;
    float cap;
    const float scale = attn_scale(hp, &cap);
    const int act = glu_act(hp);
    /* one token: the attention kernel does the RoPE and cache store (the same bits, a launch fewer) */
    const bool rope1 = g->fuse_rope && n == 1 && !c->kc_bits; /* (per-channel K: groups close between store and attention) */
    /* one token: the norm after Wo and after Wdown by the product's last block (the same bits) */
    const bool tails = g->fuse_norm && n == 1;
    const tn_cq noq = {NULL, NULL, NULL};
    bool normed = false; /* the block's input norm is done (by the tail of the product before) */
    /* one token wanting its logits: every layer in one persistent kernel, which leaves the output
     * norm in xb (and its q8 blocks for a code-path output) as the last Wdown's tail would */
    bool persist = g->persist && n == 1 && n_out == 1;
    if (persist) {
        tn_cu_persist_args pa = persist_args(g, c);
        pa.pos = d_pos, pa.kvrow = d_kvrow, pa.toff = d_toff, pa.tbl = d_tbl;
        const int pi = prof_begin(g, "persist");
        const int e = tn_cu_persist(&pa, &g->h_player0, g->persist_grid, g->st);
        prof_end(g, pi);
        if (e) { /* not launched (a grid the device cannot hold at once): launch by launch from now on */
            cudaGetLastError();
            fprintf(stderr, "tern: cuda: the persistent kernel did not launch (%s); one-token steps run launch by launch\n",
                    tn_cu_errstr(e));
            g->persist = persist = false; /* (a graph is captured at the next one-token step) */
        }
        normed = persist;
    }
    for (int32_t il = 0; il < (persist ? 0 : g->n_layers); il++) {
        const tn_cu_layer *L = &g->L[il];
        uint8_t *Kc = g->Kc + (size_t)g->loff[il] * c->k_rb;
        uint8_t *Vc = g->Vc + (size_t)g->loff[il] * c->v_rb;
        /* sliding-window layers: the last n_swa positions and their own RoPE table (in a ring of
         * kv_ring rows, position p at row p % kv_ring, where the contiguous cache has one); NoPE
         * layers (smollm3): no rotation (q/k norms and the cache store still run) */
        const bool swa = tn_hp_layer_swa(hp, il);
        tn_cu_kv kv = g->kv; /* per-channel K: the layer's windows */
        if (c->kc_bits)
            kv.kw = g->Kw + (size_t)il * kw_layer(c), kv.wseq = d_wseq, kv.pos = d_pos;
        if (swa && c->kv_ring) kv.ring = (int)c->kv_ring;
        /* a sliding-window layer's rows: its ring, or its pool's block tables */
        const bool own = swa && (c->kv_ring || c->kv_swa_blocks);
        const int32_t *kvr = own ? d_kvrow_swa : d_kvrow, *toff = own ? d_toff_swa : d_toff;
        const int n_rot = tn_hp_layer_rope(hp, il) ? hp->n_rot : 0, window = swa ? hp->n_swa : 0;
        const float *cs = swa ? g->d_cs_swa : g->d_cs;
        /* attention block */
        const bool qa = q8_for(g, L->fused_qkv ? &L->qkv : &L->w[W_Q], n);
        if (!normed) CKL("norm", tn_cu_rmsnorm(g->x, NULL, g->xb, L->attn_norm, n, d, hp->rms_eps, qa ? &g->xq : NULL, g->st));
        fresh(g);
        if (qa) g->q_src = g->xb;
        float *q = g->q, *k, *v;
        int64_t ldq, ldk;
        if (L->fused_qkv) {
            ldq = ldk = qd + 2 * kv_dim;
            k = q + qd, v = k + kv_dim;
            mm(g, "qkv", &L->qkv, g->xb, d, n, q, ldq, L->bqkv, 0);
        } else {
            ldq = qd, ldk = kv_dim;
            k = g->k, v = g->v;
            mm(g, "qkv", &L->w[W_Q], g->xb, d, n, q, qd, L->bq, 0);
            mm(g, "qkv", &L->w[W_K], g->xb, d, n, k, kv_dim, L->bk, 0);
            mm(g, "qkv", &L->w[W_V], g->xb, d, n, v, kv_dim, L->bv, 0);
        }
        /* q / k norms: per head in the RoPE (or attention) kernel; over whole rows (olmoe) first, here */
        const float *qn = L->qk_full ? NULL : L->q_norm, *kn = L->qk_full ? NULL : L->k_norm;
        if (L->qk_full && L->q_norm) CKL("qk_norm", tn_cu_rmsnorm_rows(q, ldq, n, qd, L->q_norm, hp->rms_eps, g->st));
        if (L->qk_full && L->k_norm) CKL("qk_norm", tn_cu_rmsnorm_rows(k, ldk, n, kv_dim, L->k_norm, hp->rms_eps, g->st));
        /* one token: the attention kernel rotates and stores the new row itself */
        const tn_cu_rope rope = {k, v, ldk, qn, kn, hp->rms_eps, cs, n_rot, hp->rope_mode == TN_ROPE_NEOX,
                                 kvr, Kc, Vc};
        if (!rope1)
            CKL("rope_store", tn_cu_rope_store(q, ldq, k, v, ldk, qn, kn, hp->rms_eps, cs, n_rot,
                                               hp->rope_mode == TN_ROPE_NEOX, n, hp->n_head, hp->n_head_kv, (int)hd, kvr, Kc,
                                               Vc, &kv, g->st));
        if (c->kc_bits) CKL("kc_close", tn_cu_kc_close(Kc, &kv, d_kvrow, n, hp->n_head_kv, (int)hd, g->st));
        const bool qo = q8_for(g, &L->w[W_O], n) && hd % 32 == 0;
        CKL("attention", tn_cu_attention(q, ldq, Kc, Vc, n, hp->n_head, hp->n_head_kv, (int)hd, d_pos, toff, d_tbl, scale, cap,
                                         window, L->sinks, g->att, qo ? &g->xq : NULL, rope1 ? &rope : NULL, &kv, &g->asched,
                                         g->st));
        fresh(g);
        if (qo) g->q_src = g->att;
        /* feed-forward block: its norm by Wo's tail, or a launch */
        const bool qf = q8_for(g, L->moe ? &L->router : L->fused_gu ? &L->gu : &L->w[W_GATE], n);
        const tn_cu_tail tf = {g->d_cnt, g->x, g->xb, L->ffn_norm, hp->rms_eps, d, qf ? g->xq : noq};
        const bool tail_f = tails && !L->attn_post_norm;
        proj_add(g, "wo", &L->w[W_O], L->bo, g->att, qd, n, L->attn_post_norm, hp->rms_eps, tail_f ? &tf : NULL);
        if (!tail_f) CKL("norm", tn_cu_rmsnorm(g->x, NULL, g->xb, L->ffn_norm, n, d, hp->rms_eps, qf ? &g->xq : NULL, g->st));
        fresh(g);
        if (qf) g->q_src = g->xb;
        if (L->moe) { /* x += the routed experts' weighted sum (+ the shared expert); the next norm a launch */
            moe_ffn(g, c, il, n, act);
            normed = false;
            continue;
        }
        const float *h = ffn_glu(g, L->fused_gu ? &L->gu : NULL, &L->w[W_GATE], &L->w[W_UP], NULL, NULL, &L->w[W_DOWN], g->xb, d, n,
                                 act);
        /* the next norm by Wdown's tail: the next layer's attention norm, or (one token wanting
         * its logits) the output norm */
        const tn_cu_layer *Ln = il + 1 < g->n_layers ? &g->L[il + 1] : NULL;
        tn_cu_tail tn = {g->d_cnt, g->x, g->xb, NULL, hp->rms_eps, d, noq};
        if (Ln) {
            tn.w = Ln->attn_norm;
            if (q8_for(g, Ln->fused_qkv ? &Ln->qkv : &Ln->w[W_Q], n)) tn.xq = g->xq;
        } else if (g->has_output && n_out == 1) {
            tn.w = g->output_norm;
            if (q8_for(g, &g->output, n_out)) tn.xq = g->xq;
        }
        normed = tails && !L->ffn_post_norm && tn.w;
        proj_add(g, "down", &L->w[W_DOWN], NULL, h, L->w[W_DOWN].k, n, L->ffn_post_norm, hp->rms_eps, normed ? &tn : NULL);
    }
    if (g->has_output && n_out > 0) {
        const bool qout = q8_for(g, &g->output, n_out);
        if (!normed) /* (one token: by the last Wdown's tail; its row is the only one, d_orow[0] = 0) */
            CKL("norm", tn_cu_rmsnorm(g->x, d_orow, g->xb, g->output_norm, n_out, d, hp->rms_eps, qout ? &g->xq : NULL, g->st));
        fresh(g);
        if (qout) g->q_src = g->xb;
        mm(g, "output", &g->output, g->xb, d, n_out, g->logits, hp->n_vocab, NULL, 0);
        if (hp->logit_softcap > 0) /* gemma: logits = cap * tanh(logits / cap) */
            CKL("softcap", tn_cu_softcap(g->logits, (int64_t)n_out * hp->n_vocab, hp->logit_softcap, g->st));
    }
}

/* Token t's block table tb up to position pos into tbl at *nt (tokens of one sequence share the
 * longest, *last): its offset there, -1 without a table, -2 when tbl has no room. */
typedef struct tbl_last {
    const int32_t *tb;
    int32_t off;
    int64_t len;
} tbl_last;
static int32_t put_table(int32_t *tbl, int64_t *nt, int64_t cap, const int32_t *tb, int32_t pos, tbl_last *last) {
    if (!tb) return -1;
    const int64_t need = pos / TN_KV_BLOCK + 1;
    if (tb == last->tb && last->len >= need) return last->off;
    if (*nt + need > cap) return -2;
    memcpy(tbl + *nt, tb, (size_t)need * 4);
    *last = (tbl_last){tb, (int32_t)*nt, need};
    *nt += need;
    return last->off;
}

tern_status tn_cuda_forward_batch(tern_ctx *c, const tn_batch *b, const int32_t *const *tables, const int32_t *const *swa_tables) {
    tn_cuda_ctx *g = c->cuda;
    const tern_model *m = c->model;
    const tn_hparams *hp = &c->hp;
    const int64_t n = b->n, d = hp->n_embd;
    g->cuerr = 0;
    const double t_start = g->prof ? tn_cu_now() : 0;
    cudaSetDevice(g->dev);

    /* host side: embeddings, RoPE table, cache rows, block tables, rows wanting logits */
    int32_t n_out = 0;
    for (int32_t t = 0; t < b->n; t++)
        if (b->logits[t]) c->out_rows[n_out++] = t;
    if ((tables && c->kv_ring) || (c->kv_swa_blocks && (!tables || !swa_tables))) /* (as tn_forward_batch_cpu) */
        return tn_err(TERN_ERR_INTERNAL, "cuda: block tables %s for this context's cache", tables ? "unexpected" : "missing");
    if (!c->kv_swa_blocks) swa_tables = NULL;
    const step_ints hi = ints_at(g->h_ints, n);
    int32_t *pos = hi.pos, *kvrow = hi.kvrow, *toff = hi.toff, *orow = hi.orow, *wseq = hi.wseq, *kvrow_swa = hi.kvrow_swa,
            *toff_swa = hi.toff_swa, *tbl = hi.tbl;
    int64_t nt = 0;
    tbl_last last = {NULL, -1, 0}, last_swa = {NULL, -1, 0};
    tn_hparams hs = *hp; /* sliding-window layers' RoPE: their own base and scale */
    hs.rope_freq_base = hp->rope_base_swa, hs.rope_freq_scale = hp->rope_scale_swa;
    for (int64_t t = 0; t < n; t++) {
        float *xt = g->h_x + t * d;
        tn_tensor_get_row(&m->tok_embd, b->tok[t], xt);
        if (hp->embd_scale > 0) /* gemma: x * sqrt(n_embd) */
            for (int64_t i = 0; i < d; i++) xt[i] *= hp->embd_scale;
        /* the context's frequency factors: LongRoPE's long or short set (phi3), else the file's */
        tn_op_rope_cache(hp, c->rope_ff, b->pos[t], g->h_cs + t * hp->n_rot);
        if (g->h_cs_swa) tn_op_rope_cache(&hs, c->rope_ff, b->pos[t], g->h_cs_swa + t * hp->n_rot);
        pos[t] = b->pos[t];
        if (c->kc_bits && (b->seq[t] < 0 || b->seq[t] >= c->kc_nseq)) /* per-channel K: the sequence's window */
            return tn_err(TERN_ERR_INTERNAL, "cuda: sequence %d of a context with %d K windows", b->seq[t], c->kc_nseq);
        wseq[t] = c->kc_bits ? b->seq[t] * (int32_t)c->kc_w : 0;
        /* the token's cache rows: its block table up to its position (sliding-window layers: their
         * pool's table, or the ring) */
        const int32_t *tb = tables ? tables[b->seq[t]] : NULL, *sb = swa_tables ? swa_tables[b->seq[t]] : NULL;
        kvrow[t] = (int32_t)tn_kv_row(tb, TN_KV_BLOCK, b->pos[t]);
        kvrow_swa[t] = c->kv_ring ? (int32_t)(b->pos[t] % c->kv_ring) : (int32_t)tn_kv_row(sb, TN_KV_BLOCK, b->pos[t]);
        toff[t] = put_table(tbl, &nt, g->tbl_cap, tb, b->pos[t], &last);
        toff_swa[t] = put_table(tbl, &nt, g->tbl_cap, sb, b->pos[t], &last_swa);
        if (toff[t] < -1 || toff_swa[t] < -1)
            return tn_err(TERN_ERR_INTERNAL, "cuda: block tables exceed %lld entries", (long long)g->tbl_cap);
    }
    for (int32_t j = 0; j < n_out; j++) orow[j] = c->out_rows[j];
    /* flash-decoding: blocks per (token, head) for about 4 blocks per multiprocessor, no more than
     * the batch's chunks (the bits do not depend on it), for batches of a few tokens and for
     * batches of one token per sequence (decode steps of many sequences: query tiles would walk
     * each token's positions alone in a block of a kv head's query heads); other batches in query
     * tiles (the same bits) */
    const bool spread = n <= TN_CU_GEMV_MAXN || (n <= g->asched.tokens && one_token_per_seq(b));
    g->asched.tile = g->att_tile && !spread;
    int splits = 1;
    if (g->asched.part && spread) {
        int32_t chunks = 1;
        for (int64_t t = 0; t < n; t++) chunks = TN_MAX(chunks, (b->pos[t] + TN_CU_ATT_CHUNK) / TN_CU_ATT_CHUNK);
        const int64_t units = n * hp->n_head;
        const int want = g->att_max > 1 ? g->att_max : (int)((4 * (int64_t)TN_MAX(g->sms, 1) + units - 1) / units);
        splits = TN_MIN(TN_MIN(chunks, want), g->asched.kmax);
    }
    g->asched.splits = splits;
    CKL("h2d", cudaMemcpyAsync(g->x, g->h_x, (size_t)(n * d) * 4, cudaMemcpyHostToDevice, g->st));
    CKL("h2d", cudaMemcpyAsync(g->d_cs, g->h_cs, (size_t)(n * hp->n_rot) * 4, cudaMemcpyHostToDevice, g->st));
    if (g->h_cs_swa)
        CKL("h2d", cudaMemcpyAsync(g->d_cs_swa, g->h_cs_swa, (size_t)(n * hp->n_rot) * 4, cudaMemcpyHostToDevice, g->st));
    CKL("h2d", cudaMemcpyAsync(g->d_ints, g->h_ints, (size_t)(STEP_INTS * n + nt) * 4, cudaMemcpyHostToDevice, g->st));

    /* one-token decode with logits: a CUDA graph of every kernel of the step (captured once) */
    /* (not around the persistent kernel: a step is two launches, nothing for a graph to save) */
    const bool graph = g->use_graph && !g->persist && !g->prof && n == 1 && g->has_output && n_out == 1;
    if (graph && g->graph_exec && g->graph_S != splits) { /* the context outgrew the graph's attention grid: again */
        cudaGraphExecDestroy(g->graph_exec);
        cudaGraphDestroy(g->graph);
        g->graph_exec = NULL, g->graph = NULL;
    }
    if (graph && !g->graph_exec && !g->cuerr) {
        g->graph_S = splits;
        cudaError_t e = cudaStreamBeginCapture(g->st, cudaStreamCaptureModeRelaxed);
        if (e == cudaSuccess) {
            run_layers(g, c, n, n_out);
            e = cudaStreamEndCapture(g->st, &g->graph);
            if (e == cudaSuccess && !g->cuerr) e = cudaGraphInstantiate(&g->graph_exec, g->graph, 0);
        }
        if (e != cudaSuccess || g->cuerr) { /* no graph: launch the kernels one by one from now on */
            cudaGetLastError();
            if (g->graph) cudaGraphDestroy(g->graph);
            g->graph = NULL;
            g->graph_exec = NULL;
            g->use_graph = false;
            g->cuerr = 0;
        }
    }
    if (graph && g->graph_exec) CK(cudaGraphLaunch(g->graph_exec, g->st));
    else run_layers(g, c, n, n_out);
    if (g->has_output) {
        if (n_out > 0) {
            CKL("d2h", cudaMemcpyAsync(c->logits, g->logits, (size_t)n_out * (size_t)hp->n_vocab * 4, cudaMemcpyDeviceToHost, g->st));
        }
        CK(cudaStreamSynchronize(g->st));
        c->n_logits = n_out;
    } else {
        /* the rest of the layers on the CPU, from the residual stream the GPU leaves */
        CK(cudaMemcpyAsync(g->h_x, g->x, (size_t)(n * d) * 4, cudaMemcpyDeviceToHost, g->st));
        CK(cudaStreamSynchronize(g->st));
        if (!g->cuerr) {
            const int32_t sl = c->start_layer;
            const float *sx = c->start_x;
            c->start_layer = g->n_layers;
            c->start_x = g->h_x;
            tn_forward_batch_cpu(c, b, tables, swa_tables);
            c->start_layer = sl;
            c->start_x = sx;
        }
    }
    if (!g->cuerr) g->cuerr = (int)cudaGetLastError();
    if (g->prof) {
        prof_collect(g);
        g->prof_passes++;
        g->prof_tokens += n;
        g->prof_wall_ms += 1e3 * (tn_cu_now() - t_start);
    }
    if (g->cuerr) return tn_err(TERN_ERR_INTERNAL, "cuda: forward pass failed: %s", tn_cu_errstr(g->cuerr));
    return TERN_OK;
}

/* ---- single weights (tests, tools) --------------------------------------------------------------- */

struct tn_cuda_weight {
    tn_cuda_ctx g; /* its stream, cuBLAS handle and allocations */
    tn_cw w;
};

void tn_cuda_weight_free(tn_cuda_weight *w) {
    if (!w) return;
    ctx_release(&w->g);
    tn_free(w);
}

tern_status tn_cuda_weight_upload(const tn_tensor *t, tn_cuda_weight **out) {
    *out = NULL;
    const char *why = NULL;
    if (tn_cuda_device_count(&why) < 1) return tn_err(TERN_ERR_UNSUPPORTED, "cuda: no usable device (%s)", why);
    tn_cuda_weight *w = tn_calloc(1, sizeof *w);
    if (!w) return tn_err(TERN_ERR_NOMEM, "cuda: out of memory");
    tern_status s = TERN_OK;
    if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreateWithFlags(&w->g.st, cudaStreamNonBlocking) != cudaSuccess ||
        cublasCreate(&w->g.blas) != CUBLAS_STATUS_SUCCESS) {
        s = tn_err(TERN_ERR_UNSUPPORTED, "cuda: cannot use device 0");
    } else {
        cublasSetStream(w->g.blas, w->g.st);
        w->g.tile_max_code = 64;
        w->g.tile_max_float = TN_CU_GEMV_MAXN;
        s = upload_weight(&w->g, t, &w->w);
    }
    if (s) {
        tn_cuda_weight_free(w);
        return s;
    }
    *out = w;
    return TERN_OK;
}

void tn_cuda_test_gemv_launch(bool prefetch, int grid_cap, int rows) {
    tn_cu_configure(0, 0, prefetch, 0, rows);
    tn_cu_set_gemv_grid_cap(grid_cap);
}
int tn_cuda_test_mmq(int min_tokens) { return tn_cu_set_mmq(min_tokens); }

tern_status tn_cuda_weight_matmul(tn_cuda_weight *W, const float *x, int64_t n, bool invariant, float *y) {
    tn_cuda_ctx *g = &W->g;
    const tn_cw *w = &W->w;
    tn_cuda_set_batch_invariant(g, invariant);
    const size_t first = g->n_allocs;
    bool ok = true;
    float *dx = dupload(g, x, (size_t)(n * w->k) * 4, &ok), *dy = dalloc(g, (size_t)(n * w->m) * 4, &ok);
    if (tn_cw_is_code(w->kind)) {
        g->xq.q = dalloc(g, (size_t)(n * w->k), &ok);
        g->xq.d = dalloc(g, (size_t)(n * w->k / 32) * 4, &ok);
        g->xq.s = dalloc(g, (size_t)(n * w->k / 32) * 4, &ok);
    }
    if (n > TN_CU_GEMV_MAXN) {
        g->xh = dalloc(g, (size_t)(n * w->k) * 2, &ok);
        g->wh_elems = TN_MAX(w->k, TN_MIN(w->m * w->k, (int64_t)1 << 24)); /* tiles of rows, as in a context */
        g->wh = dalloc(g, (size_t)g->wh_elems * 2, &ok);
    }
    tern_status s = TERN_OK;
    if (!ok) s = TERN_ERR_NOMEM;
    else {
        g->cuerr = 0;
        fresh(g);
        mm(g, "matmul", w, dx, w->k, n, dy, w->m, NULL, 0);
        CK(cudaMemcpyAsync(y, dy, (size_t)(n * w->m) * 4, cudaMemcpyDeviceToHost, g->st));
        CK(cudaStreamSynchronize(g->st));
        if (g->cuerr) s = tn_err(TERN_ERR_INTERNAL, "cuda: matmul failed: %s", tn_cu_errstr(g->cuerr));
    }
    for (size_t i = first; i < g->n_allocs; i++) cudaFree(g->allocs[i]);
    g->n_allocs = first;
    return s;
}

tern_status tn_cuda_weight_dequant(tn_cuda_weight *W, float *out) {
    tn_cuda_ctx *g = &W->g;
    const tn_cw *w = &W->w;
    const size_t first = g->n_allocs;
    bool ok = true;
    float *d = dalloc(g, (size_t)(w->m * w->k) * 4, &ok);
    tern_status s = TERN_OK;
    if (!ok) s = TERN_ERR_NOMEM;
    else {
        g->cuerr = 0;
        CK(tn_cu_dequant_f32(w, 0, w->m, d, g->st));
        CK(cudaMemcpyAsync(out, d, (size_t)(w->m * w->k) * 4, cudaMemcpyDeviceToHost, g->st));
        CK(cudaStreamSynchronize(g->st));
        if (g->cuerr) s = tn_err(TERN_ERR_INTERNAL, "cuda: dequantize failed: %s", tn_cu_errstr(g->cuerr));
    }
    for (size_t i = first; i < g->n_allocs; i++) cudaFree(g->allocs[i]);
    g->n_allocs = first;
    return s;
}
