/*
 * backend.h — the CUDA backend's C side, shared by its files (not part of libtern's interface): a
 * layer and a context on the GPU, device allocations, and the weight upload (weights.c) that
 * backend.c's context and forward pass use.
 */
#ifndef TN_CUDA_BACKEND_H
#define TN_CUDA_BACKEND_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#include "cuda/cuda.h"
#include "cuda/kern_cuda.h"
#include "model/blocks.h"

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
    float *eprobs_b; /* DeepSeek-V3: the experts' selection bias (exp_probs_b) [n_expert] */
    bool qk_full; /* olmoe: q_norm / k_norm over the whole q and k rows, not per head */
    /* multi-head latent attention (deepseek2): q's low-rank pair q_a, q_b (q_lora > 0; else
     * w[W_Q]) and q_a's norm; the latent projection kv_a ([c | k_pe] rows) and c's norm; the
     * per-head k_b, v_b (3-D in the file) as one matrix of every head's rows (head h: rows h kv_lora
     * .. of k_b, h v_head .. of v_b) */
    bool mla;
    bool ungated; /* PLM: h = relu(Wup x)^2, no gate */
    tn_cw q_a, q_b, kv_a, k_b, v_b;
    float *q_a_norm, *kv_a_norm;
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
    /* multi-head latent attention: absorbed queries [n n_head][Lk], latent outputs [n n_head][kv_lora],
     * q's low-rank rows [n][q_lora], the tokens' [c | k_pe] rows [n][Lk], and pair p's head p % n_head
     * ([n_batch n_head], for the per-head products' expert GEMVs) */
    float *mq, *mo, *ma, *mkv;
    int32_t *msel;
    /* latent attention's flash-decoding (kern_cuda.h tn_cu_mla_split): partials of up to mtokens
     * tokens' heads (part NULL: never split); splits chosen per step */
    tn_cu_mla_split msplit;
    int mtokens;
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

/* ---- device memory (weights.c): every allocation is g's, freed with it ---- */
/* bytes of device memory (NULL and *ok false, the error set, when it cannot; nothing when *ok is
 * already false) */
void *tn_cuda_dalloc(tn_cuda_ctx *g, size_t bytes, bool *ok);
/* bytes of src copied into a new allocation */
void *tn_cuda_dupload(tn_cuda_ctx *g, const void *src, size_t bytes, bool *ok);

/* ---- weights (weights.c) ---- */
/* The device kind of file type t (kern_cuda.h), or -1 for a type the GPU does not run. */
int tn_cuda_cw_kind_of(tn_dtype t);
/* A matrix in the device layout of its kind (kern_cuda.h), or an error naming the tensor. */
tern_status tn_cuda_upload_weight(tn_cuda_ctx *g, const tn_tensor *t, tn_cw *w);
/* An f32 vector as it is (NULL without data; *ok false and the error set for another type). */
float *tn_cuda_upload_f32(tn_cuda_ctx *g, const tn_tensor *t, bool *ok);
/* Matrices ts[0 .. nt) of one type and row length as one matrix of their rows stacked, *fused set;
 * *fused false (nothing uploaded) when their types or row lengths differ. */
tern_status tn_cuda_upload_stacked(tn_cuda_ctx *g, const tn_tensor *const *ts, int nt, tn_cw *w, bool *fused);
/* A 3-D expert matrix [n_expert][rows][k] as one matrix of every expert's rows; with b (up beside
 * gate a) interleaved per expert into *ab when they share type and row length (*fused), else a into
 * *wa and b into *wb. */
tern_status tn_cuda_upload_experts(tn_cuda_ctx *g, const tn_tensor *a, const tn_tensor *b, tn_cw *ab, tn_cw *wa, tn_cw *wb,
                                   bool *fused);
/* Rows r0 .. r0 + nr - 1 of w as a matrix of their own (an expert of a stacked expert matrix). */
tn_cw tn_cuda_cw_rows(const tn_cw *w, int64_t r0, int64_t nr);

#endif
