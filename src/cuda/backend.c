/*
 * backend.c — the CUDA backend's C side (device queries and peaks: device.c; weight upload:
 * weights.c): a context's layers, the GPU's KV cache and scratch, and the forward pass as a
 * sequence of kernel launches on one stream — the same steps, in the same order, as forward.c.
 *
 * Matrix products: up to TN_CU_GEMV_MAXN tokens use the GEMV kernels (decode); larger batches
 * dequantize the weight to fp16 and multiply with cuBLAS (fp32 accumulation).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/backend.h"
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/ops.h"

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

/* Whether the one-token steps of every MoE layer on the GPU can route there: at most 512 experts
 * and 32 slots (DeepSeek's groups: at most 32, each of at least 2 experts, enough experts in the
 * groups kept for the slots), and expert matrices the pair GEMVs take (code types: rows of whole
 * q8 blocks; float types: of whole groups of 8), the GLU's output in whole q8 blocks. */
static bool moe_dev_ok(const tn_cuda_ctx *g, const tn_hparams *hp) {
    if (hp->n_expert > 512 || hp->n_expert_used > 32 || hp->n_ff_exp % 32 != 0 || hp->n_embd % 32 != 0)
        return false;
    const int32_t G = hp->n_expert_groups;
    if (hp->family->mla && G > 1 &&
        (G > 32 || hp->n_expert % G != 0 || hp->n_expert / G < 2 || hp->n_group_used < 1 || hp->n_group_used > G ||
         hp->n_group_used * (hp->n_expert / G) < hp->n_expert_used))
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
        g->d_bar = tn_cuda_dalloc(g, 2 * sizeof(unsigned), ok);
        g->d_players = tn_cuda_dupload(g, P, sizeof *P * (size_t)g->n_layers, ok);
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
    const bool mla = hp->family && hp->family->mla;
    if (hp->head_dim > 256 && !mla) return tn_err(TERN_ERR_UNSUPPORTED, "cuda: head size %d above 256", hp->head_dim);
    /* latent attention: rows [c | k_pe] of at most 1024 values (deepseek V2 / V3: 576), whole blocks
     * of 32 (f16: of 8) */
    const int64_t mla_row = mla ? tn_hp_mla_kv(hp) : 0;
    if (mla && (mla_row > 1024 || mla_row % (cut[0] == TN_CU_KV_F16 ? 8 : 32) != 0 || hp->n_rot % 2 != 0 ||
                hp->head_dim < hp->n_rot || hp->v_head < 1))
        return tn_err(TERN_ERR_UNSUPPORTED, "cuda: latent attention rows of %lld values (%d rotated, heads of %d) do not fit the GPU's kernel "
                      "(at most 1024, whole blocks of 32); run it on the CPU", (long long)mla_row, hp->n_rot, hp->head_dim);
    /* the block the GPU runs: llama's, with qwen2's biases, qwen3's and gemma3's per-head q/k norms,
     * smollm3's NoPE layers, gemma's GeGLU, post norms, sliding windows and soft caps, phi3's fused
     * matrices (bound as row slices) and LongRoPE (the host's RoPE tables), deepseek2's latent
     * attention; the rest is refused */
    const bool arch_ok = hp->arch == TN_ARCH_LLAMA || hp->arch == TN_ARCH_QWEN2 || hp->arch == TN_ARCH_QWEN3 ||
                         hp->arch == TN_ARCH_SMOLLM3 || hp->arch == TN_ARCH_GEMMA3 || hp->arch == TN_ARCH_GEMMA2 ||
                         hp->arch == TN_ARCH_PHI3 || hp->arch == TN_ARCH_QWEN3MOE || hp->arch == TN_ARCH_QWEN2MOE ||
                         hp->arch == TN_ARCH_GPT_OSS || hp->arch == TN_ARCH_OLMOE || hp->arch == TN_ARCH_DEEPSEEK2 ||
                         hp->arch == TN_ARCH_PLM;
    if (!arch_ok ||
        (hp->ffn != TN_FFN_SWIGLU && hp->ffn != TN_FFN_GEGLU && hp->ffn != TN_FFN_SWIGLU_OAI && hp->ffn != TN_FFN_RELU_SQR))
        return tn_err(TERN_ERR_UNSUPPORTED,
                      "cuda: architecture %s does not run on the GPU yet (llama, qwen2, qwen3, smollm3, gemma2, gemma3, phi3, qwen3moe, "
                      "qwen2moe, gpt-oss, olmoe, deepseek2, plm do); "
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
        G->mla = mla;
        if (mla) { /* latent attention's matrices (k_b, v_b: a matrix of every head's rows, as experts) */
            if (hp->n_lora_q > 0) {
                if ((s = tn_cuda_upload_weight(g, &R[TN_ROLE_ATTN_Q_A], &G->q_a)) ||
                    (s = tn_cuda_upload_weight(g, &R[TN_ROLE_ATTN_Q_LB], &G->q_b)))
                    goto fail;
                G->q_a_norm = tn_cuda_upload_f32(g, &R[TN_ROLE_ATTN_Q_A_NORM], &ok);
                max_k = TN_MAX(max_k, G->q_b.k);
                max_mk = TN_MAX(max_mk, TN_MAX(G->q_a.m * G->q_a.k, G->q_b.m * G->q_b.k));
            }
            if ((s = tn_cuda_upload_weight(g, &R[TN_ROLE_ATTN_KV_A_MQA], &G->kv_a)) ||
                (s = tn_cuda_upload_experts(g, &R[TN_ROLE_ATTN_K_B_MLA], NULL, &G->k_b, NULL, NULL, NULL)) ||
                (s = tn_cuda_upload_experts(g, &R[TN_ROLE_ATTN_V_B_MLA], NULL, &G->v_b, NULL, NULL, NULL)))
                goto fail;
            G->kv_a_norm = tn_cuda_upload_f32(g, &R[TN_ROLE_ATTN_KV_A_NORM], &ok);
            /* the per-head products' activations: every head's rows of a batch at once */
            max_k = TN_MAX(max_k, (int64_t)hp->n_head * TN_MAX(G->k_b.k, G->v_b.k));
            max_mk = TN_MAX(max_mk, TN_MAX(G->kv_a.m * G->kv_a.k, TN_MAX(G->k_b.m * G->k_b.k, G->v_b.m * G->v_b.k)));
            if (G->k_b.m != (int64_t)hp->n_head * hp->n_lora_kv || G->k_b.k != hp->head_dim - hp->n_rot ||
                G->v_b.m != (int64_t)hp->n_head * hp->v_head || G->v_b.k != hp->n_lora_kv || G->kv_a.m != mla_row) {
                s = tn_err(TERN_ERR_FORMAT, "cuda: layer %d: latent attention matrices of unexpected shapes", il);
                goto fail;
            }
        } else if ((s = tn_cuda_upload_stacked(g, ts, 3, &G->qkv, &G->fused_qkv))) {
            goto fail;
        }
        G->moe = tn_layer_moe(L);
        if (G->moe) { /* the router, the experts, a shared expert; no dense gate, up, down */
            if ((s = tn_cuda_upload_weight(g, &R[TN_ROLE_FFN_GATE_INP], &G->router)) ||
                (s = tn_cuda_upload_experts(g, &R[TN_ROLE_FFN_GATE_EXPS], &R[TN_ROLE_FFN_UP_EXPS], &G->egu, &G->eg, &G->eu, &G->fused_egu)) ||
                (s = tn_cuda_upload_experts(g, &R[TN_ROLE_FFN_DOWN_EXPS], NULL, &G->edown, NULL, NULL, NULL)))
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
                    G->egu_b = tn_cuda_dupload(g, bb, sizeof(float) * (size_t)(2 * ffe * ne), &ok);
                    tn_free(bb);
                } else {
                    G->eg_b = tn_cuda_upload_f32(g, gb, &ok);
                    G->eu_b = tn_cuda_upload_f32(g, ub, &ok);
                }
                G->edown_b = tn_cuda_upload_f32(g, db, &ok);
            }
            G->brouter = tn_cuda_upload_f32(g, &R[TN_ROLE_FFN_GATE_INP_B], &ok);
            G->eprobs_b = tn_cuda_upload_f32(g, &R[TN_ROLE_FFN_EXP_PROBS_B], &ok); /* DeepSeek-V3 */
            max_k = TN_MAX(max_k, ffe);
            /* an expert's gate|up (2 ffe rows of n_embd) as the largest matrix cuBLAS gets in one piece */
            max_mk = TN_MAX(max_mk, TN_MAX(2 * ffe * hp->n_embd, G->router.m * G->router.k));
            G->shexp = tn_layer_shexp(L);
            if (G->shexp) {
                const tn_tensor *sh[3] = {&R[TN_ROLE_FFN_GATE_SHEXP], &R[TN_ROLE_FFN_UP_SHEXP], &R[TN_ROLE_FFN_DOWN_SHEXP]};
                if ((s = tn_cuda_upload_stacked(g, sh, 2, &G->sgu, &G->fused_sgu))) goto fail;
                if ((!G->fused_sgu && ((s = tn_cuda_upload_weight(g, sh[0], &G->sg)) || (s = tn_cuda_upload_weight(g, sh[1], &G->su)))) ||
                    (s = tn_cuda_upload_weight(g, sh[2], &G->sdown)))
                    goto fail;
                max_k = TN_MAX(max_k, G->sdown.k);
                max_mk = TN_MAX(max_mk, TN_MAX(2 * G->sdown.m * G->sdown.k, G->sdown.m * G->sdown.k));
                G->sgate = tn_cuda_upload_f32(g, &R[TN_ROLE_FFN_GATE_INP_SHEXP], &ok);
            }
        } else if (!(G->ungated = hp->ffn == TN_FFN_RELU_SQR) && (s = tn_cuda_upload_stacked(g, ts + W_GATE, 2, &G->gu, &G->fused_gu))) {
            goto fail;
        }
        for (int i = 0; i < W_N; i++) {
            if ((i <= W_V && G->fused_qkv) || ((i == W_GATE || i == W_UP) && G->fused_gu)) continue;
            if (mla && (i == W_K || i == W_V || (i == W_Q && hp->n_lora_q > 0))) continue;
            if (G->ungated && i == W_GATE) continue;
            if (i >= W_GATE && G->moe) continue;
            if ((s = tn_cuda_upload_weight(g, ts[i], &G->w[i]))) goto fail;
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
            G->bqkv = tn_cuda_dupload(g, bb, nq + nk + nv, &ok);
            tn_free(bb);
        } else if (G->fused_qkv && (bq->data || bk->data || bv->data)) {
            s = tn_err(TERN_ERR_UNSUPPORTED, "cuda: layer %d has biases on some of q, k, v only", il);
            goto fail;
        }
        G->attn_norm = tn_cuda_upload_f32(g, &R[TN_ROLE_ATTN_NORM], &ok);
        G->ffn_norm = tn_cuda_upload_f32(g, &R[TN_ROLE_FFN_NORM], &ok);
        G->bq = tn_cuda_upload_f32(g, bq, &ok);
        G->bk = tn_cuda_upload_f32(g, bk, &ok);
        G->bv = tn_cuda_upload_f32(g, bv, &ok);
        G->q_norm = tn_cuda_upload_f32(g, &R[TN_ROLE_ATTN_Q_NORM], &ok); /* qwen3: per-head RMSNorm of q and k */
        G->k_norm = tn_cuda_upload_f32(g, &R[TN_ROLE_ATTN_K_NORM], &ok);
        G->qk_full = hp->family && hp->family->qk_norm_full;
        G->attn_post_norm = tn_cuda_upload_f32(g, &R[TN_ROLE_ATTN_POST_NORM], &ok); /* gemma (gpt-oss's is its ffn_norm: llama.c) */
        G->sinks = tn_cuda_upload_f32(g, &R[TN_ROLE_ATTN_SINKS], &ok); /* gpt-oss */
        G->bo = tn_cuda_upload_f32(g, &R[TN_ROLE_ATTN_OUT_B], &ok);
        G->ffn_post_norm = tn_cuda_upload_f32(g, &R[TN_ROLE_FFN_POST_NORM], &ok);
    }
    if (ok && g->has_output) {
        if ((s = tn_cuda_upload_weight(g, &m->output, &g->output))) goto fail;
        max_mk = TN_MAX(max_mk, g->output.m * g->output.k);
        g->output_norm = tn_cuda_upload_f32(g, &m->output_norm, &ok);
    }
    const int64_t nb = c->n_batch, d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    const bool moe = hp->n_expert > 0;
    /* the widest FFN: dense layers', the experts' and a shared expert's */
    const int64_t ff = moe ? TN_MAX(hp->n_ff, TN_MAX(hp->n_ff_exp, hp->n_ff_shexp)) : hp->n_ff;
    const int64_t wide = TN_MAX(TN_MAX(d, qd), ff);
    /* batches routed on the GPU: every (token, slot) pair's gate|up rows and their q8 blocks at once */
    const int64_t pairs_ff = moe ? nb * hp->n_expert_used * hp->n_ff_exp : 0;
    g->x = tn_cuda_dalloc(g, (size_t)(nb * d) * 4, &ok);
    g->xb = tn_cuda_dalloc(g, (size_t)(nb * wide) * 4, &ok);
    g->q = tn_cuda_dalloc(g, (size_t)(nb * (qd + 2 * kv_dim)) * 4, &ok); /* q, k, v side by side when fused */
    g->k = tn_cuda_dalloc(g, (size_t)(nb * kv_dim) * 4, &ok);
    g->v = tn_cuda_dalloc(g, (size_t)(nb * kv_dim) * 4, &ok);
    g->att = tn_cuda_dalloc(g, (size_t)(nb * TN_MAX(qd, mla ? (int64_t)hp->n_head * hp->v_head : 0)) * 4, &ok);
    if (mla) { /* latent attention's scratch, and the per-head products' heads (pair p: head p % n_head) */
        const int64_t units = nb * hp->n_head;
        g->mq = tn_cuda_dalloc(g, (size_t)(units * mla_row) * 4, &ok);
        g->mo = tn_cuda_dalloc(g, (size_t)(units * hp->n_lora_kv) * 4, &ok);
        g->ma = tn_cuda_dalloc(g, (size_t)(nb * TN_MAX(hp->n_lora_q, 1)) * 4, &ok);
        g->mkv = tn_cuda_dalloc(g, (size_t)(nb * mla_row) * 4, &ok);
        int32_t *hs = tn_malloc(sizeof(int32_t) * (size_t)units);
        if (!hs) ok = false, tn_err(TERN_ERR_NOMEM, "cuda: out of host memory");
        for (int64_t p = 0; ok && p < units; p++) hs[p] = (int32_t)(p % hp->n_head);
        if (ok) g->msel = tn_cuda_dupload(g, hs, sizeof(int32_t) * (size_t)units, &ok);
        tn_free(hs);
    }
    g->hb = tn_cuda_dalloc(g, (size_t)TN_MAX(nb * 2 * ff, 2 * pairs_ff) * 4, &ok); /* gate and up side by side when fused */
    g->hb2 = tn_cuda_dalloc(g, (size_t)TN_MAX(nb * ff, pairs_ff) * 4, &ok);
    if (g->has_output) g->logits = tn_cuda_dalloc(g, (size_t)c->n_logits_cap * (size_t)hp->n_vocab * 4, &ok);
    if (moe) {
        const int64_t R = nb * hp->n_expert_used;
        g->rl = tn_cuda_dalloc(g, (size_t)(nb * hp->n_expert) * 4, &ok);
        g->xg = tn_cuda_dalloc(g, (size_t)(R * d) * 4, &ok);
        g->ey = tn_cuda_dalloc(g, (size_t)(R * d) * 4, &ok);
        g->d_moe = tn_cuda_dalloc(g, (size_t)(4 * R) * 4, &ok); /* tok, row, w (host routing) or sel (GPU routing) */
    }
    const int64_t xq_n = TN_MAX(nb * max_k, pairs_ff);
    g->xq.q = tn_cuda_dalloc(g, (size_t)xq_n, &ok);
    g->xq.d = tn_cuda_dalloc(g, (size_t)(xq_n / 32) * 4, &ok);
    g->xq.s = tn_cuda_dalloc(g, (size_t)(xq_n / 32) * 4, &ok);
    if (nb > TN_CU_GEMV_MAXN) { /* float-path types (and TERN_CUDA_PREFILL=cublas) above 8 tokens */
        g->xh = tn_cuda_dalloc(g, (size_t)(nb * max_k) * 2, &ok);
        g->wh = tn_cuda_dalloc(g, (size_t)max_mk * 2, &ok);
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
    g->Kc = tn_cuda_dalloc(g, kv_rows_all * c->k_rb, &ok);
    g->Vc = tn_cuda_dalloc(g, kv_rows_all * c->v_rb, &ok);
    if (ok) {
        cudaMemset(g->Kc, 0, kv_rows_all * c->k_rb);
        cudaMemset(g->Vc, 0, kv_rows_all * c->v_rb);
    }
    g->kv = (tn_cu_kv){cut[0], cut[1], (int64_t)c->k_rb, (int64_t)c->v_rb, NULL, c->rot_blk, c->rot_k, c->rot_v, 0, NULL, NULL, NULL, 0};
    if (c->kc_bits) { /* per-channel K: each sequence's newest keys in f16, as the CPU's windows */
        g->kv.kc_w = (int)c->kc_w;
        const size_t wb = (size_t)ngl * kw_layer(c) * 2;
        g->Kw = tn_cuda_dalloc(g, wb, &ok);
        if (ok) cudaMemset(g->Kw, 0, wb);
    }
    if (c->rot_k || c->rot_v) g->kv.rot_sign = tn_cuda_dupload(g, c->rot_sign, (size_t)hp->head_dim * sizeof(float), &ok);
    g->tbl_cap = (int64_t)nb * (c->kv_blocks + 1) * (c->kv_swa_blocks ? 2 : 1); /* (and the window pool's tables) */
    g->d_ints = tn_cuda_dalloc(g, (size_t)ints_needed(c, g->tbl_cap) * 4, &ok);
    g->d_cs = tn_cuda_dalloc(g, (size_t)(nb * hp->n_rot) * 4, &ok);
    if (hp->n_swa > 0) g->d_cs_swa = tn_cuda_dalloc(g, (size_t)(nb * hp->n_rot) * 4, &ok);
    g->d_cnt = tn_cuda_dalloc(g, sizeof(int), &ok);
    if (ok) cudaMemset(g->d_cnt, 0, sizeof(int));
    g->att_max = env_int("TERN_CUDA_ATTN_SPLIT", 0);
    g->att_tile = env_int("TERN_CUDA_ATTN_TILE", 1) != 0;
    g->asched.tile = g->att_tile;
    g->asched.kmax = (int)((c->kv_rows + TN_CU_ATT_CHUNK - 1) / TN_CU_ATT_CHUNK);
    if (g->att_max != 1 && g->asched.kmax > 1 && !mla) { /* partials of up to TN_CU_ATT_SPREAD tokens' heads */
        g->asched.tokens = (int)TN_MIN(nb, TN_CU_ATT_SPREAD);
        const int64_t units = (int64_t)g->asched.tokens * hp->n_head;
        g->asched.part = tn_cuda_dalloc(g, (size_t)(units * g->asched.kmax * (hp->head_dim + 2)) * 4, &ok);
        g->asched.cnt = tn_cuda_dalloc(g, (size_t)units * sizeof(int), &ok);
        if (ok) cudaMemset(g->asched.cnt, 0, (size_t)units * sizeof(int));
    }
    if (mla) { /* latent attention splits the positions of batches of up to 8 tokens (contexts to 64k) */
        const int64_t kmax = (c->kv_rows + TN_CU_MLA_CHUNK - 1) / TN_CU_MLA_CHUNK;
        g->msplit = (tn_cu_mla_split){NULL, (int)kmax, 1};
        if (g->att_max != 1 && kmax > 1 && kmax <= 256) {
            g->mtokens = (int)TN_MIN(nb, TN_CU_GEMV_MAXN);
            g->msplit.part = tn_cuda_dalloc(g, (size_t)((int64_t)g->mtokens * hp->n_head * kmax * (hp->n_lora_kv + 2)) * 4, &ok);
        }
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

/* y[j ldy + i] (+)= A row i . B row j (fp16 rows of k: A [m][k], B n rows at stride ldb), fp32
 * accumulation, through cuBLAS (timed under label). */
static void gemm_f16(tn_cuda_ctx *g, const char *label, const uint16_t *A, int64_t m, int64_t n, int64_t k, const uint16_t *B,
                     int64_t ldb, float *y, int64_t ldy, int acc) {
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    const int pi = prof_begin(g, label);
    cublasStatus_t bs = cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &alpha, A, CUDA_R_16F, (int)k, B,
                                     CUDA_R_16F, (int)ldb, &beta, y, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    prof_end(g, pi);
    if (bs != CUBLAS_STATUS_SUCCESS && !g->cuerr) g->cuerr = (int)cudaErrorLaunchFailure;
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
        gemm_f16(g, label, A, nr, n, w->k, g->xh, w->k, y + r0, ldy, acc);
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

/* PLM's ungated FFN: h = relu(Wup x)^2 for n rows of x (stride ldx), its q8 blocks written with it
 * where down reads them. Returns h (hb2). */
static const float *ffn_relu_sqr(tn_cuda_ctx *g, const tn_cw *up, const tn_cw *down, const float *x, int64_t ldx, int64_t n) {
    const bool qd = q8_for(g, down, n) && up->m % 32 == 0;
    mm(g, "up", up, x, ldx, n, g->hb2, up->m, NULL, 0);
    CKL("relu_sqr", tn_cu_relu_sqr(g->hb2, n * up->m, qd ? &g->xq : NULL, g->st));
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
    if (hp->family->mla) { /* DeepSeek's routing (tn_moe_route_ds) */
        const tn_cu_route_ds ds = {hp->moe_sigmoid, L->eprobs_b, hp->n_expert_groups, hp->n_group_used, hp->moe_norm, hp->moe_scale};
        CKL("moe_route", tn_cu_moe_route_ds(g->rl, n, hp->n_expert, k, &ds, sel, w, row, g->st));
    } else {
        CKL("moe_route", tn_cu_moe_route(g->rl, L->brouter, n, hp->n_expert, k, gating, hp->family->moe_renorm, sel, w, row, g->st));
    }
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
            const tn_cw gu = L->fused_egu ? tn_cuda_cw_rows(&L->egu, 2 * ffe * e, 2 * ffe) : (tn_cw){0};
            const tn_cw eg = L->fused_egu ? gu : tn_cuda_cw_rows(&L->eg, ffe * e, ffe), eu = L->fused_egu ? gu : tn_cuda_cw_rows(&L->eu, ffe * e, ffe);
            const tn_cw dn = tn_cuda_cw_rows(&L->edown, d * e, d);
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

/* The matrix that reads a layer's normed input first (whose q8 blocks the norm writes where it
 * reads them): q|k|v, q_a (latent attention with q's low rank), else Wq. */
static const tn_cw *attn_in(const tn_cu_layer *L) { return L->fused_qkv ? &L->qkv : L->mla && L->q_a.data ? &L->q_a : &L->w[W_Q]; }

/* Per-head products (latent attention's k_b and v_b): pair p = t H + h of n tokens, y[p ldy ..] =
 * head h's rows of w (w->m / H of them, head after head) times x[p ldx ..] (w->k values). The
 * expert GEMVs with pair p's expert h (one-token kernels: a pair's result does not depend on its
 * batch), or for batches the GEMV kernels do not take, fp16 and a cuBLAS product per head. */
static void mm_heads(tn_cuda_ctx *g, const char *label, const tn_cw *w, int H, const float *x, int64_t ldx, int64_t n, float *y,
                     int64_t ldy) {
    const int64_t rows = w->m / H, P = n * H, k = w->k;
    if (use_gemv(g, w, n)) {
        const int64_t chunk = 65535 / H * H; /* pairs a launch takes (g->msel's pattern restarts at every chunk) */
        for (int64_t p0 = 0; p0 < P; p0 += chunk) {
            const int64_t np = TN_MIN(chunk, P - p0);
            if (tn_cw_is_code(w->kind)) CKL("quantize", tn_cu_quantize_q8(x + p0 * ldx, ldx, k, np, g->xq, g->st));
            const tn_cu_ex ex = {g->msel, rows, 1, (int)np};
            CKL(label, tn_cu_gemv_experts(w, &ex, x + p0 * ldx, ldx, &g->xq, y + p0 * ldy, ldy, NULL, NULL, NULL, g->st));
        }
        fresh(g);
        return;
    }
    CKL("to_f16", tn_cu_f32_to_f16(x, ldx, k, P, g->xh, g->st));
    const bool direct = w->kind == TN_CW_F16;
    if (!direct) CKL("dequant_f16", tn_cu_dequant_f16(w, 0, w->m, g->wh, g->st));
    const uint16_t *A = direct ? (const uint16_t *)w->data : g->wh;
    for (int h = 0; h < H; h++) /* head h: tokens' rows at xh + (t H + h) k, outputs at y + (t H + h) ldy */
        gemm_f16(g, label, A + (size_t)(h * rows * k), rows, n, k, g->xh + (size_t)h * (size_t)k, H * k, y + (size_t)h * (size_t)ldy,
                 H * ldy, 0);
    fresh(g);
}

/* Multi-head latent attention (deepseek2) of the n normed rows in xb into att [n][n_head v_head],
 * the CPU's tn_blk_mla step for step: q (Wq, or q_b rmsnorm(q_a xb)); [c | k_pe] = kv_a xb with c
 * normed; RoPE on k_pe and every head's q_pe, the row cached (tn_cu_mla_rope_store); each head's
 * q_nope absorbed into latent space by its k_b; attention over the cached rows (tn_cu_attn_mla);
 * each head's latent output through its v_b. */
static void mla_attention(tn_cuda_ctx *g, const tern_ctx *c, const tn_cu_layer *L, int64_t n, uint8_t *Kc, const int32_t *d_pos,
                          const int32_t *d_kvrow, const int32_t *d_toff, const int32_t *d_tbl) {
    const tn_hparams *hp = &c->hp;
    const int H = hp->n_head, hd = hp->head_dim, nr = hp->n_rot, R = hp->n_lora_kv;
    const int64_t d = hp->n_embd, Lk = tn_hp_mla_kv(hp), qd = (int64_t)H * hd;
    /* both products of xb first (one set of q8 blocks), then q's low-rank norm and q_b */
    if (hp->n_lora_q > 0) mm(g, "q_a", &L->q_a, g->xb, d, n, g->ma, hp->n_lora_q, NULL, 0);
    else mm(g, "qkv", &L->w[W_Q], g->xb, d, n, g->q, qd, NULL, 0);
    mm(g, "kv_a", &L->kv_a, g->xb, d, n, g->mkv, Lk, NULL, 0);
    fresh(g);
    if (hp->n_lora_q > 0) {
        CKL("norm", tn_cu_rmsnorm_rows(g->ma, hp->n_lora_q, n, hp->n_lora_q, L->q_a_norm, hp->rms_eps, g->st));
        mm(g, "q_b", &L->q_b, g->ma, hp->n_lora_q, n, g->q, qd, NULL, 0);
    }
    CKL("norm", tn_cu_rmsnorm_rows(g->mkv, Lk, n, R, L->kv_a_norm, hp->rms_eps, g->st));
    CKL("rope_store", tn_cu_mla_rope_store(g->q, qd, H, hd, hd - nr, g->mkv, Lk, R, nr, g->d_cs, hp->rope_mode == TN_ROPE_NEOX,
                                           g->mq, Lk, n, d_kvrow, Kc, &g->kv, g->st));
    fresh(g);
    mm_heads(g, "k_b", &L->k_b, H, g->q, hd, n, g->mq, Lk); /* q_nope of head h: its first hd - nr values */
    CKL("attention", tn_cu_attn_mla(g->mq, Lk, R, Kc, n, H, d_pos, d_toff, d_tbl, hp->attn_scale, g->mo, R, &g->kv, &g->msplit, g->st));
    mm_heads(g, "v_b", &L->v_b, H, g->mo, R, n, g->att, hp->v_head);
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
        const bool qa = q8_for(g, attn_in(L), n);
        if (!normed) CKL("norm", tn_cu_rmsnorm(g->x, NULL, g->xb, L->attn_norm, n, d, hp->rms_eps, qa ? &g->xq : NULL, g->st));
        fresh(g);
        if (qa) g->q_src = g->xb;
        if (L->mla) {
            mla_attention(g, c, L, n, Kc, d_pos, d_kvrow, d_toff, d_tbl);
        } else {
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
        }
        /* feed-forward block: its norm by Wo's tail, or a launch */
        const bool qf = q8_for(g, L->moe ? &L->router : L->fused_gu ? &L->gu : &L->w[L->ungated ? W_UP : W_GATE], n);
        const tn_cu_tail tf = {g->d_cnt, g->x, g->xb, L->ffn_norm, hp->rms_eps, d, qf ? g->xq : noq};
        const bool tail_f = tails && !L->attn_post_norm;
        proj_add(g, "wo", &L->w[W_O], L->bo, g->att, L->w[W_O].k, n, L->attn_post_norm, hp->rms_eps, tail_f ? &tf : NULL);
        if (!tail_f) CKL("norm", tn_cu_rmsnorm(g->x, NULL, g->xb, L->ffn_norm, n, d, hp->rms_eps, qf ? &g->xq : NULL, g->st));
        fresh(g);
        if (qf) g->q_src = g->xb;
        if (L->moe) { /* x += the routed experts' weighted sum (+ the shared expert); the next norm a launch */
            moe_ffn(g, c, il, n, act);
            normed = false;
            continue;
        }
        const float *h = L->ungated ? ffn_relu_sqr(g, &L->w[W_UP], &L->w[W_DOWN], g->xb, d, n)
                                    : ffn_glu(g, L->fused_gu ? &L->gu : NULL, &L->w[W_GATE], &L->w[W_UP], NULL, NULL, &L->w[W_DOWN],
                                              g->xb, d, n, act);
        /* the next norm by Wdown's tail: the next layer's attention norm, or (one token wanting
         * its logits) the output norm */
        const tn_cu_layer *Ln = il + 1 < g->n_layers ? &g->L[il + 1] : NULL;
        tn_cu_tail tn = {g->d_cnt, g->x, g->xb, NULL, hp->rms_eps, d, noq};
        if (Ln) {
            tn.w = Ln->attn_norm;
            if (q8_for(g, attn_in(Ln), n)) tn.xq = g->xq;
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

/* Chunks of `chunk` positions of the batch's longest context. */
static int32_t max_chunks(const tn_batch *b, int32_t chunk) {
    int32_t c = 1;
    for (int32_t t = 0; t < b->n; t++) c = TN_MAX(c, (b->pos[t] + chunk) / chunk);
    return c;
}
/* Blocks per (token, head) for about 4 blocks per multiprocessor over `units` of them
 * (TERN_CUDA_ATTN_SPLIT=N: N). */
static int split_want(const tn_cuda_ctx *g, int64_t units) {
    return g->att_max > 1 ? g->att_max : (int)((4 * (int64_t)TN_MAX(g->sms, 1) + units - 1) / units);
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
    if (hp->family->mla) { /* latent attention: its chunks of TN_CU_MLA_CHUNK positions, its partials */
        const int32_t chunks = max_chunks(b, TN_CU_MLA_CHUNK);
        if (g->msplit.part && n <= g->mtokens && chunks <= g->msplit.kmax) splits = TN_MIN(chunks, split_want(g, n * hp->n_head));
        g->msplit.splits = splits;
    } else if (g->asched.part && spread) {
        splits = TN_MIN(TN_MIN(max_chunks(b, TN_CU_ATT_CHUNK), split_want(g, n * hp->n_head)), g->asched.kmax);
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
        s = tn_cuda_upload_weight(&w->g, t, &w->w);
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
    float *dx = tn_cuda_dupload(g, x, (size_t)(n * w->k) * 4, &ok), *dy = tn_cuda_dalloc(g, (size_t)(n * w->m) * 4, &ok);
    if (tn_cw_is_code(w->kind)) {
        g->xq.q = tn_cuda_dalloc(g, (size_t)(n * w->k), &ok);
        g->xq.d = tn_cuda_dalloc(g, (size_t)(n * w->k / 32) * 4, &ok);
        g->xq.s = tn_cuda_dalloc(g, (size_t)(n * w->k / 32) * 4, &ok);
    }
    if (n > TN_CU_GEMV_MAXN) {
        g->xh = tn_cuda_dalloc(g, (size_t)(n * w->k) * 2, &ok);
        g->wh_elems = TN_MAX(w->k, TN_MIN(w->m * w->k, (int64_t)1 << 24)); /* tiles of rows, as in a context */
        g->wh = tn_cuda_dalloc(g, (size_t)g->wh_elems * 2, &ok);
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
    float *d = tn_cuda_dalloc(g, (size_t)(w->m * w->k) * 4, &ok);
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
