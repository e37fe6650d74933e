/*
 * kern_cuda.h — the CUDA kernels' launchers (the .cu files of src/cuda), callable from C. Plain types
 * only: backend.c (the C side of the backend) owns the model, the context and every buffer.
 *
 * Device weight formats (made at upload by backend.c, tn_cuda_weight):
 *   float path  — the file's bytes as they are: F32, F16, BF16, Q2_K, Q4_K, Q5_K, IQ4_XS; Q3_K's
 *                 110-byte and Q6_K's 210-byte blocks each padded to TN_CU_Q3K_STRIDE /
 *                 TN_CU_Q6K_STRIDE; IQ4_NL and MXFP4 (blocks of 32) as rows of their codes (16
 *                 bytes a block) followed by their scales (fp16 d / e8m0 bytes), each row padded
 *                 to a multiple of 16 bytes; the codebook i-quants IQ1_S, IQ1_M, IQ2_XXS,
 *                 IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S as the file's blocks (read by bytes and 16-bit
 *                 words), their grid uploaded beside them; ggml's ternary TQ1_0 / TQ2_0 as the
 *                 file's blocks. Activations stay f32.
 *   code path   — Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and every tq<b>g<G>[a] in a split layout: the block headers moved
 *                 out into fp16 arrays d[m][k/G] (and m[m][k/G] for asymmetric tq), the code bytes
 *                 of each row back to back (row stride k*b/8, a multiple of 4 bytes). Within a
 *                 block the planes keep the file's order (tq.h; Q4_0 and Q4_1 are one 4-bit plane,
 *                 Q8_0 one signed 8-bit plane, Q5_0 and Q5_1 a 4-bit plane then their qh as the
 *                 1-bit plane: tq5's layout). Activations are quantized to q8 blocks of 32 (the CPU's
 *                 q8_0 activation rounding: d = amax/127 rounded to fp16, q = x*127/amax
 *                 rounded half to even) and the products
 *                 are integer dot products (dp4a), as the CPU kernels compute them.
 * Every launcher runs on the given stream and returns 0, or a CUDA error code.
 */
#ifndef TN_CUDA_KERN_CUDA_H
#define TN_CUDA_KERN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Weight kinds on the device. */
enum {
    TN_CW_F32 = 0,
    TN_CW_F16,
    TN_CW_BF16,
    TN_CW_Q4_K,
    TN_CW_Q6_K,
    TN_CW_Q5_K,
    TN_CW_Q2_K,
    TN_CW_Q3_K,
    TN_CW_IQ4_XS,
    TN_CW_IQ4_NL,
    TN_CW_MXFP4,
    TN_CW_IQ2_XXS, /* ggml's codebook i-quants: the file's blocks, grid (tn_cw.grid) on the device */
    TN_CW_IQ2_XS,
    TN_CW_IQ2_S,
    TN_CW_IQ3_XXS,
    TN_CW_IQ3_S,
    TN_CW_IQ1_S,
    TN_CW_IQ1_M,
    TN_CW_TQ1_0, /* ggml's ternary types (not tern's tq<b>g<G>) */
    TN_CW_TQ2_0,
    TN_CW_VQ2,  /* tern's codebook type: 72-byte blocks (d, sc[4], 2 pad bytes, qs[64]); its codebook as
                   1024 floats cb[p][i] (tn_cw.grid) */
    TN_CW_Q4_0, /* code path from here on */
    TN_CW_Q8_0,
    TN_CW_Q5_0,
    TN_CW_TQ,   /* also q4_1 (= tq4g32a) and q5_1 (= tq5g32a) */
};

typedef struct tn_cw {
    int kind;
    int bits, group, asym;  /* TN_CW_TQ; Q4_0: 4, 32, 0; Q8_0: 8, 32, 0                     */
    int64_t m, k;           /* rows, row length                                                */
    const void *data;       /* float path: rows of the file type; code path: the codes         */
    size_t row_bytes;       /* bytes per row of data                                           */
    const uint16_t *d, *mn; /* code path: fp16 scales [m][k/group] (mn: asymmetric offsets)   */
    const void *grid;       /* codebook i-quants: their grid on the device (quant/iq_grid.h);  
                               vq2: the matrix's codebook as floats                             */
} tn_cw;

/* Q6_K blocks (210 bytes) are uploaded each in a 224-byte slot, so that their parts are 8-byte aligned */
#define TN_CU_Q6K_STRIDE 224
/* Q3_K blocks (110 bytes) likewise in 112-byte slots */
#define TN_CU_Q3K_STRIDE 112
/* vq2 blocks (70 bytes) in 72-byte slots: d, sc[4], two zero bytes, qs[64] (8-byte aligned) */
#define TN_CU_VQ2_STRIDE 72

static inline int tn_cw_is_code(int kind) { return kind >= TN_CW_Q4_0; }

/* Process-wide launch settings (the caller checks the device; pdl needs Hopper or later):
 *   pdl       programmatic dependent launch for every kernel launched after this: each kernel
 *             waits for its predecessor inside the GPU instead of at launch;
 *   early     (with pdl) the small kernels (norm, RoPE, attention, SwiGLU) let the next kernel
 *             launch before they wait, so the next GEMV is resident early;
 *   prefetch  GEMV kernels prefetch their block's weight rows into L2 before they wait;
 *   gemv_bps  GEMV grids of at most this many blocks per multiprocessor, each block walking its
 *             rows (0: one block per row group);
 *   gemv_rows one-token code-path GEMVs: rows per warp at once (1 or 2).
 * None of these changes a result: rows are computed by the same arithmetic whichever block runs them. */
int tn_cu_configure(int pdl, int early, int prefetch, int gemv_bps, int gemv_rows);
/* Tests: GEMV grids of at most this many blocks in all (0: tn_cu_configure's setting), so that
 * blocks walk several row groups even on small matrices. */
void tn_cu_set_gemv_grid_cap(int blocks);
/* Batches of at least min_tokens tokens (> TN_CU_GEMV_MAXN; 0: none) of code-path weights (Q4_0,
 * Q5_0, Q8_0, the tq types) on the int8 tensor cores instead of the GEMV kernels' token tiles, with
 * the same bits, where the device has them (sm_80 and later). Returns the smallest batch that uses
 * them (0: none); so does tn_cu_mmq. */
int tn_cu_set_mmq(int min_tokens);
int tn_cu_mmq(void);

/* Activations quantized for the code path: n rows of k. */
typedef struct tn_cq {
    int8_t *q;   /* [n][k]      */
    float *d;    /* [n][k/32]   the fp16-rounded scale as float */
    int32_t *s;  /* [n][k/32]   sum of the block's codes        */
} tn_cq;

/* x [n][k] f32 (row stride ldx) -> q8 blocks (k % 32 == 0). */
int tn_cu_quantize_q8(const float *x, int64_t ldx, int64_t k, int64_t n, tn_cq out, void *stream);
/* y[j*ldy + i] (+)= dot(row i of w, x_j) (+ bias[i]) for i < m, j < n: code path reads xq
 * (quantized by tn_cu_quantize_q8), float path reads x; any n, in token tiles of
 * TN_CU_GEMV_MAXN inside the kernel, so that a token's result does not depend on its batch.
 * accumulate: y +=. */
#define TN_CU_GEMV_MAXN 8
int tn_cu_gemv(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, int64_t n, float *y, int64_t ldy,
               const float *bias, int accumulate, void *stream);
/* The RMSNorm that follows a one-token GEMV adding into the residual stream (Wo, Wdown), done by
 * that GEMV's last block to finish (blocks count themselves on cnt, one int of device memory that
 * the last resets to 0): y [d] = rmsnorm(x [d]) * w and, with xq.q, its q8 blocks, as tn_cu_rmsnorm
 * computes them (the same bits), without a launch of its own. */
typedef struct tn_cu_tail {
    int *cnt;
    const float *x;
    float *y;
    const float *w;
    float eps;
    int64_t d;
    tn_cq xq;
} tn_cu_tail;
/* tn_cu_gemv (n = 1) followed by tail's norm (NULL: none); where the product's kernel cannot run
 * the tail (rows not whole groups of 8), the norm is launched after it. A tail with w NULL is no
 * norm: x's q8 blocks only (y unused). */
int tn_cu_gemv_tail(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, float *y, const float *bias, int accumulate,
                    const tn_cu_tail *tail, void *stream);
/* One token through a gate|up matrix w (rows [gate (ff) | up (ff)]; activations xq (q8, code types)
 * or x (f32, the others; k % 8 == 0, 16-byte aligned)): h [ff] = act(gate) * up as
 * tn_cu_swiglu_pair computes it, a warp computing gate row i and up row i and writing h[i]; tail
 * (w NULL, x = h, ff % 32 == 0): h's q8 blocks for Wdown by the last block. Code types with rows
 * one per warp (TERN_CUDA_GEMV_ROWS=1): the product into gu [2 ff], then the GLU kernel. */
typedef struct tn_cu_glu {
    float *h;
    int act;
} tn_cu_glu;
int tn_cu_gemv_glu(const tn_cw *w, const float *x, const tn_cq *xq, float *gu, float *h, int act, const tn_cu_tail *tail,
                   void *stream);
/* A GEMV over (token, slot) pairs of a mixture of experts routed on the GPU (one-token steps): w
 * holds every expert's rows (expert e: rows e rows .. (e + 1) rows - 1); pair p (blockIdx.y of the
 * launch, p < pairs) multiplies expert sel[p]'s rows with input row p / div (div: slots per token
 * for the experts' gate|up, 1 for their down, whose input is the pair's own row) into output row
 * p. The expert is read from device memory after the kernel's wait, so the launch does not depend
 * on the host knowing the routing (a CUDA graph replays it). */
typedef struct tn_cu_ex {
    const int32_t *sel;
    int64_t rows;
    int div, pairs;
} tn_cu_ex;
/* y[p][i] = dot(row i of expert sel[p] of w, input row p / div) for i < rows, p < pairs (ldy the
 * stride of y's rows); with glu (w's experts are gate|up matrices of 2 ff rows; tn_cu_gemv_glu's
 * contract per pair): h[p][i] = act(gate) up, y unused where the GLU is fused (else the product
 * into y, then the GLU kernel), and tail (w NULL, x = h, ff % 32 == 0, d = pairs ff): h's q8 blocks
 * by the last block. Code types need k % 32 == 0, float types k % 8 == 0 and 16-byte rows. bias
 * (without glu; NULL: none): the experts' biases [n_expert][rows], expert sel[p]'s added to pair p's
 * outputs (gpt-oss). */
int tn_cu_gemv_experts(const tn_cw *w, const tn_cu_ex *ex, const float *x, int64_t ldx, const tn_cq *xq, float *y, int64_t ldy,
                       const float *bias, const tn_cu_glu *glu, const tn_cu_tail *tail, void *stream);
/* Each of n tokens routed on the GPU from its router logits lg[t][ne] (ne <= 512; plus bias[ne]
 * where not NULL, gpt-oss's router bias) as the CPU's tn_moe_route_token routes: gating TN_CU_GATE_SOFTMAX, p = softmax(lg) (exp(l - max) summed in
 * double, times 1 / sum), the k largest p (equal: the lower index first) into sel[t][k], their p
 * into w[t][k]; TN_CU_GATE_TOPK_SOFTMAX (gpt-oss), the k largest logits, their softmax into w
 * (exp(l - best), the sum in double in slot order, times 1 / sum). Then w divided by its sum,
 * clamped below at 2^-14, when renorm, and row[t k + j] = t k + j (the pairs' output rows, for
 * tn_cu_moe_combine). */
enum { TN_CU_GATE_SOFTMAX = 0, TN_CU_GATE_TOPK_SOFTMAX = 1 };
int tn_cu_moe_route(const float *lg, const float *bias, int64_t n, int ne, int k, int gating, int renorm, int32_t *sel, float *w,
                    int32_t *row, void *stream);
/* DeepSeek's routing of n tokens (the CPU's tn_moe_route_ds): p = sigmoid (sigmoid) or softmax of
 * the logits lg[t][ne]; scores p + bias (exp_probs_b; NULL: p); groups > 1 (at most 32, ne a
 * multiple): each group scored by the sum of its two best, all but the group_used best groups
 * excluded; the k best scores' experts into sel, their p into w, renormalised (norm: divided by
 * their double sum in slot order, clamped at 2^-14) and times scale unless 0 or 1; row as
 * tn_cu_moe_route's. */
typedef struct tn_cu_route_ds {
    int sigmoid;
    const float *bias;
    int groups, group_used, norm;
    float scale;
} tn_cu_route_ds;
int tn_cu_moe_route_ds(const float *lg, int64_t n, int ne, int k, const tn_cu_route_ds *ds, int32_t *sel, float *w, int32_t *row,
                       void *stream);
/* Rows r0 .. r0 + nr - 1 of w as fp16 into out[nr][k] (prefill: then a cuBLAS GEMM). */
int tn_cu_dequant_f16(const tn_cw *w, int64_t r0, int64_t nr, uint16_t *out, void *stream);
/* Rows of w as f32 (tests). */
int tn_cu_dequant_f32(const tn_cw *w, int64_t r0, int64_t nr, float *out, void *stream);
/* x [n][k] f32 (stride ldx) -> fp16 [n][k]. */
int tn_cu_f32_to_f16(const float *x, int64_t ldx, int64_t k, int64_t n, uint16_t *out, void *stream);
/* The GPU's KV cache: rows of K and of V of type f16, q8_0 or q4_0 (ggml's blocks of 32 values:
 * an fp16 scale, then 32 int8 or 16 bytes of 4-bit codes) or tq<b>g32a, b = 2..8 (TN_CU_KV_TQ(b):
 * an fp16 scale d and offset m, then 32 b-bit codes in tq's planes, value d c + m; quant/tq.h),
 * k_rb / v_rb bytes per row (n_head_kv heads of whole blocks); with rot_k / rot_v each head of q
 * and k / of v is rotated by H D before it is stored (tern's cache rotation, blocks.c tn_kv_rot:
 * signs D = rot_sign [head size], H the normalized Walsh-Hadamard matrix in blocks of rot_blk), and
 * attention outputs rotated back. */
enum { TN_CU_KV_F16 = 0, TN_CU_KV_Q8_0, TN_CU_KV_Q4_0 };
#define TN_CU_KV_TQ(b) (16 + (b))
/* K only: per-channel tqc<b>, b = 2..4 (quant/kc.h: a group of 16 positions, one cache block,
 * quantized per channel once complete; rows of chunks of 8 stat bytes and 4 b code bytes). Until
 * then a sequence's keys are in an f16 window (kw: [sequences][kc_w][kv_dim] halves for the layer):
 * position p of token t's sequence at row wseq[t] + p % kc_w, pos[t] the token's position (what
 * tn_cu_rope_store, tn_cu_kc_close and tn_cu_attention read). */
#define TN_CU_KV_TQC(b) (32 + (b))
typedef struct tn_cu_kv {
    int tk, tv;
    int64_t k_rb, v_rb;
    const float *rot_sign;
    int rot_blk, rot_k, rot_v;
    int kc_w;
    uint16_t *kw;
    const int32_t *wseq, *pos;
    int ring; /* > 0: a sliding-window layer's ring (contiguous cache): position p at row p % ring */
} tn_cu_kv;
/* y[n][d] = rmsnorm(x rows) * w (sum of squares in double, as the CPU). rows: x row of output j
 * is rows[j] (NULL: j). xq != NULL: y is also quantized into it as tn_cu_quantize_q8 would. */
int tn_cu_rmsnorm(const float *x, const int32_t *rows, float *y, const float *w, int64_t n, int64_t d, float eps,
                  const tn_cq *xq, void *stream);
/* x[j] = rmsnorm(x[j]) * w in place for rows j < n of d at stride ldx (sum of squares in double, as
 * the CPU; olmoe's whole-row q and k norms). */
int tn_cu_rmsnorm_rows(float *x, int64_t ldx, int64_t n, int64_t d, const float *w, float eps, void *stream);
/* y[i] += b[i % d] for i < n*d. */
int tn_cu_add_bias(float *y, const float *b, int64_t n, int64_t d, void *stream);
/* Per token t: with qn / kn (qwen3) every query / key head RMS-normed by them first (eps; sum of
 * squares in double, as the CPU); RoPE (cs [n][n_rot] cos/sin pairs; neox = half split) on its
 * n_head query heads of q [n][ldq] and n_head_kv key heads of k [n][ldk]; a rotated cache (kv):
 * q, k (and v) heads rotated in place; then k and v [n][ldk] rows stored in the caches at row
 * kvrow[t] in kv's types (NULL: f16, rows of kv_dim = n_head_kv * hd halves), quantized blocks by
 * the CPU's reference quantizers. */
int tn_cu_rope_store(float *q, int64_t ldq, float *k, float *v, int64_t ldk, const float *qn, const float *kn,
                     float eps, const float *cs, int n_rot, int neox, int64_t n, int n_head, int n_head_kv, int hd,
                     const int32_t *kvrow, void *Kc, void *Vc, const tn_cu_kv *kv, void *stream);
/* A per-channel K cache (kv->tk TN_CU_KV_TQC(b)): for every token t whose position completes a
 * group ((pos[t] + 1) % 16 == 0; decided on the device, so a captured graph stays right), kv head
 * g's 16 keys of that group are quantized from the window into the group's cache rows kvrow[t] - 15
 * .. kvrow[t] (one block), bytes as the CPU's tn_kc_quantize_group writes them. */
int tn_cu_kc_close(void *Kc, const tn_cu_kv *kv, const int32_t *kvrow, int64_t n, int n_head_kv, int hd, void *stream);
/* The RoPE and cache store of k_rope_store done inside the attention kernel (one-token steps:
 * each token's only new cache row is its own): the new rows k, v [n][ldk] (the qkv product),
 * qwen3's per-head norms qn / kn (NULL: none; eps), cos/sin cs [n][n_rot] (neox: half split), the
 * cache row of each token kvrow, and the caches Kc / Vc the rows go to. */
typedef struct tn_cu_rope {
    const float *k, *v;
    int64_t ldk;
    const float *qn, *kn;
    float eps;
    const float *cs;
    int n_rot, neox;
    const int32_t *kvrow;
    void *Kc, *Vc;
} tn_cu_rope;
#define TN_CU_ATT_CHUNK 512
/* How the attention launches (results the same bits either way).
 * Flash-decoding: the positions of a (token, head) in chunks of 512 split across `splits` blocks
 * (a chunk's partial softmax in part, [tokens n_head][kmax][2 + hd] floats: max, sum, output; the
 * last block of a (token, head) to finish, counted on cnt [tokens n_head] ints, zeroed once, folds
 * them). Tokens whose chunks outnumber kmax run unsplit.
 * Query tiles (tile != 0): batches of more than TN_CU_GEMV_MAXN tokens (without rope) run blocks of up to 8 query rows — tokens of one sequence x the query heads of one kv head —
 * that read each K and V row once for all of them. */
/* the largest batch of one token per sequence (tern serve's decode steps) whose heads' positions
 * are split across blocks (flash-decoding); batches of up to TN_CU_GEMV_MAXN tokens always are */
#define TN_CU_ATT_SPREAD 32
typedef struct tn_cu_attn_sched {
    float *part;
    int *cnt;
    int kmax;   /* chunks a (token, head) has room for in part                     */
    int tokens; /* tokens (n) part and cnt have room for                           */
    int splits; /* blocks per (token, head); <= 1: unsplit (tn_cu_attention only) */
    int tile;   /* query tiles for large batches                                   */
} tn_cu_attn_sched;
/* Causal attention: token t (query q[t*ldq ..], n_head*hd floats) attends positions 0 .. pos[t] of its
 * sequence (window > 0: only the last window of them, a sliding-window layer); position p's cache
 * row is p (tbl_off[t] < 0) or tbl[tbl_off[t] + p/16]*16 + p%16. Scores are q.k * scale, with
 * cap > 0 then cap * tanh(score) (gemma2; pass scale already divided by cap, as the CPU does).
 * K and V rows in kv's types (NULL: f16); a quantized K is dotted with the query as q8 blocks.
 * out [n][n_head*hd]. Softmax per chunk of 512 positions, the chunks folded, in f32. xq != NULL (hd % 32 == 0): out also quantized into it.
 * rope != NULL: q is the qkv product as it comes (not yet rotated; it stays so) and the kernel
 * does tn_cu_rope_store's work itself (bit for bit), for batches where no token reads another's
 * new row. sinks [n_head] (gpt-oss; NULL: none): head h's softmax denominator has exp(sinks[h])
 * more (relative to the running maximum). */
int tn_cu_attention(const float *q, int64_t ldq, const void *Kc, const void *Vc, int64_t n, int n_head, int n_head_kv,
                    int hd, const int32_t *pos, const int32_t *tbl_off, const int32_t *tbl, float scale, float cap,
                    int window, const float *sinks, float *out, const tn_cq *xq, const tn_cu_rope *rope, const tn_cu_kv *kv,
                    const tn_cu_attn_sched *sched, void *stream);
/* Multi-head latent attention (deepseek2; the CPU's tn_blk_mla). Per token t: RoPE (cs [n][n_rot],
 * neox = half split) on its rotated key part kv_rows[t ldkv + R ..] (one head of n_rot) and on each
 * query head's rotated part q[t ldq + h hd + nope ..]; those query parts copied to mq[(t n_head +
 * h) Lk + R ..] (after the head's latent-space query, which the caller's k_b product writes at
 * mq[(t n_head + h) Lk]); the row [c | k_pe] (Lk = R + n_rot values) stored at cache row kvrow[t]
 * of Kc in kv->tk (f16, q8_0, q4_0 or tq<b>, as tn_cu_rope_store stores; kv->tv the same type, V not
 * stored: the values are the rows' first R values). */
int tn_cu_mla_rope_store(float *q, int64_t ldq, int n_head, int hd, int nope, float *kv_rows, int64_t ldkv, int R, int n_rot,
                         const float *cs, int neox, float *mq, int64_t Lk, int64_t n, const int32_t *kvrow, void *Kc,
                         const tn_cu_kv *kv, void *stream);
/* Causal attention of unit u = t n_head + h (query mq[u Lk ..], Lk <= 1024 values) over positions 0
 * .. pos[t] of its sequence (rows as tn_cu_attention finds them: tbl_off, tbl), keys the cached rows
 * (a quantized row dotted with the query as q8 blocks), scores times scale, softmax, values the
 * rows' first R values: out[u ldo + i], i < R. f32, chunks of TN_CU_MLA_CHUNK positions folded in
 * order. split (NULL or splits <= 1: none): a unit's chunks across `splits` blocks, each chunk's
 * partial (max, sum, R outputs) in part [units][kmax][R + 2] (every unit's chunks at most kmax),
 * then a fold in chunk order: the same bits as unsplit. */
#define TN_CU_MLA_CHUNK 256
typedef struct tn_cu_mla_split {
    float *part;
    int kmax, splits;
} tn_cu_mla_split;
int tn_cu_attn_mla(const float *mq, int64_t Lk, int R, const void *Kc, int64_t n, int n_head, const int32_t *pos,
                   const int32_t *tbl_off, const int32_t *tbl, float scale, float *out, int64_t ldo, const tn_cu_kv *kv,
                   const tn_cu_mla_split *split, void *stream);
/* x[j] += rmsnorm(y[j]) * w for rows j < n of d (post-attention / post-FFN norms before the
 * residual add; sum of squares in double). */
int tn_cu_rmsnorm_add(float *x, const float *y, const float *w, int64_t n, int64_t d, float eps, void *stream);
/* y[i] = cap * tanh(y[i] / cap), i < n (final logit soft-capping; cap > 0). */
int tn_cu_softcap(float *y, int64_t n, float cap, void *stream);
/* Gated activations: act(gate) * up with act silu (SwiGLU) or Gemma's tanh GELU (GeGLU). */
enum { TN_CU_SILU = 0, TN_CU_GELU = 1, TN_CU_SWIGLU_OAI = 2 /* gpt-oss: min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, +-7) + 1) */ };
/* g[i] = act(g[i]) * u[i], i < n. */
int tn_cu_swiglu(float *g, const float *u, int64_t n, int act, void *stream);
/* h[t][i] = act(gu[t][i]) * gu[t][ff + i] (gate and up computed as one matrix), i < ff, t < n;
 * xq != NULL: h also quantized into it. */
int tn_cu_swiglu_pair(const float *gu, float *h, int64_t n, int64_t ff, int act, const tn_cq *xq, void *stream);
/* x[i] = relu(x[i])^2, i < n (PLM's ungated FFN), as the CPU's tn_op_relu_sqr; xq != NULL (n % 32
 * == 0): x also quantized into it. */
int tn_cu_relu_sqr(float *x, int64_t n, const tn_cq *xq, void *stream);
/* Mixture of experts (the routing itself is the host's: model/blocks.h tn_moe_route_token):
 * dst[r] = src[idx[r]] for r < n, rows of d floats (each routed row's input, grouped by expert). */
int tn_cu_gather_rows(const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst, void *stream);
/* x[t] += sum over slots j < k, in order, of w[t k + j] * out[row[t k + j]] (rows of d), t < n. */
int tn_cu_moe_combine(float *x, const float *out, const int32_t *row, const float *w, int64_t n, int k, int64_t d, void *stream);
/* A shared expert's output y added to x: x[t] += sigmoid(gw . xb[t]) * y[t] (dot in double), or
 * x[t] += y[t] without gw; rows of d, t < n. */
int tn_cu_gate_add(float *x, const float *y, const float *xb, const float *gw, int64_t n, int64_t d, void *stream);
/* The persistent decode kernel (TERN_CUDA_PERSIST=1): one cooperative launch runs every layer of a
 * one-token step, its stages (qkv product, attention, Wo, gate|up with the GLU, Wdown) separated
 * by grid-wide barriers instead of launches, each block prefetching its rows of the next product
 * into L2 while the stage before runs. A layer's matrices, uploaded once (device memory): */
typedef struct tn_cu_player {
    tn_cw qkv, wo, gu, down;         /* one code kind (the kernel's template) in every layer        */
    const float *bqkv, *bo;          /* biases (NULL: none)                                         */
    const float *attn_norm, *ffn_norm;
    const float *qn, *kn;            /* qwen3's per-head q / k norms (NULL: none)                   */
    const float *sinks;              /* gpt-oss-style attention sinks (NULL: none)                  */
    void *Kc, *Vc;                   /* the layer's caches                                          */
    const float *cs;                 /* its cos/sin row (sliding-window layers: their own table)    */
    int n_rot, window;               /* 0 rotated dimensions: no RoPE; window 0: every position     */
} tn_cu_player;
typedef struct tn_cu_persist_args {
    const tn_cu_player *L; /* [n_layers], device memory */
    int n_layers;
    float *x;              /* the residual stream [d]: the embedding in, the last layer's out   */
    float *q;              /* the qkv product [n_head hd + 2 n_head_kv hd]                      */
    float *att, *h;        /* attention output [n_head hd], GLU output [ff]                     */
    float *xb;             /* out: rmsnorm(x) * out_norm [d]                                    */
    tn_cq xq;              /* q8 activations (max(n_head hd, ff) values); out: xb's, with out_q8 */
    const float *out_norm;
    int out_q8;
    int64_t d, ff;
    int n_head, n_head_kv, hd, neox, act;
    float eps, scale, cap; /* attention: scale (already divided by cap), soft cap (0: none) */
    const int32_t *pos, *toff, *tbl, *kvrow; /* as tn_cu_attention's and tn_cu_rope's        */
    tn_cu_kv kv;
    tn_cu_attn_sched sched; /* part NULL: unsplit; else the attention stage splits each head's
                             * positions across grid / n_head blocks (splits, tile not read)    */
    unsigned *bar;         /* 2 unsigned of device memory, zeroed once: the grid barrier        */
} tn_cu_persist_args;
/* Runs a's layers for one token, as the kernels above would one launch at a time (the same bits: the
 * same device functions, the norms' q8 blocks computed by every block from the residual stream);
 * L0 is layer 0 on the host (its kind and shapes choose the kernel). grid: blocks (0: as many as
 * fit the GPU at once). Needs (tn_cu_persist_check: 0, else cudaErrorInvalidValue) every layer's
 * four matrices of L0's kind — Q4_0, Q5_0, Q8_0 or an asymmetric tq (tq<b>g<G>a, Q4_1, Q5_1) —,
 * k % 32 == 0, d and ff multiples of 32, d <= 8192, hd % 32 == 0 and <= 256 (the caller checks
 * that the other layers are as L0). */
int tn_cu_persist_check(const tn_cu_persist_args *a, const tn_cu_player *L0);
int tn_cu_persist(const tn_cu_persist_args *a, const tn_cu_player *L0, int grid, void *stream);
/* Streams: read src and write dst (n bytes), for the bandwidth measurement. */
int tn_cu_copy_kernel(const void *src, void *dst, size_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
