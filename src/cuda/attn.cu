/*
 * attn.cu — norms, RoPE and the cache store, and attention: a block per (token, head) with
 * flash-decoding splits for long contexts, query tiles for prompts, per-channel K groups closed on
 * the device, and multi-head latent attention (deepseek2). The device functions they share with
 * the persistent kernel are in kattn.cuh.
 */
#include "cuda/kattn.cuh"

void tn_cu_flags_attn(int early, int prefetch) { kdev_set_flags(early, prefetch); }

/* ---- norms, RoPE, attention ------------------------------------------------------------------------ */

/* y[j] = rmsnorm(x row) * w, a block per row; with xq.q != NULL also y[j] quantized to q8 blocks
 * (d % 32 == 0) */
__global__ void k_rmsnorm(const float *x, const int32_t *rows, float *y, const float *w, int64_t d, float eps, tn_cq xq) {
    gdc_enter();
    const int64_t j = blockIdx.x;
    const float *xr = x + (rows ? (int64_t)rows[j] : j) * d;
    const float scale = rms_scale_block<false>(xr, d, eps);
    if (!xq.q) {
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) y[j * d + i] = (xr[i] * scale) * w[i];
        return;
    }
    const int lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    for (int64_t b = threadIdx.x / WARP; b < d / 32; b += nw) {
        const int64_t i = b * 32 + lane;
        const float v = (xr[i] * scale) * w[i];
        y[j * d + i] = v;
        q8_block(v, lane, j * (d / 32) + b, j * d + b * 32, xq);
    }
}
extern "C" int tn_cu_rmsnorm(const float *x, const int32_t *rows, float *y, const float *w, int64_t n, int64_t d, float eps,
                             const tn_cq *xq, void *stream) {
    if (n == 0) return 0;
    const tn_cq none = {NULL, NULL, NULL};
    if (xq && d % 32 != 0) return (int)cudaErrorInvalidValue;
    launch(k_rmsnorm, (unsigned)n, 1024, 0, (cudaStream_t)stream, x, rows, y, w, d, eps, xq ? *xq : none);
    return tn_cu_err();
}

/* x[j] = rmsnorm(x[j]) * w in place, rows j < n of d at stride ldx, a block per row (olmoe's norms
 * over the whole q and k rows of the qkv product) */
__global__ void k_rmsnorm_rows(float *x, int64_t ldx, const float *w, int64_t d, float eps) {
    gdc_enter();
    float *xr = x + (int64_t)blockIdx.x * ldx;
    const float scale = rms_scale_block<false>(xr, d, eps);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) xr[i] = (xr[i] * scale) * w[i];
}
extern "C" int tn_cu_rmsnorm_rows(float *x, int64_t ldx, int64_t n, int64_t d, const float *w, float eps, void *stream) {
    if (n == 0) return 0;
    if (ldx < d) return (int)cudaErrorInvalidValue;
    launch(k_rmsnorm_rows, (unsigned)n, 1024, 0, (cudaStream_t)stream, x, ldx, w, d, eps);
    return tn_cu_err();
}

/* x[j] += rmsnorm(y[j]) * w, a block per row (gemma's post-attention and post-FFN norms: the CPU's
 * tn_op_rmsnorm of the product, then the residual add) */
__global__ void k_rmsnorm_add(float *x, const float *y, const float *w, int64_t d, float eps) {
    gdc_enter();
    const int64_t j = blockIdx.x;
    const float *yr = y + j * d;
    const float scale = rms_scale_block<false>(yr, d, eps);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) x[j * d + i] += (yr[i] * scale) * w[i];
}
extern "C" int tn_cu_rmsnorm_add(float *x, const float *y, const float *w, int64_t n, int64_t d, float eps, void *stream) {
    if (n == 0) return 0;
    launch(k_rmsnorm_add, (unsigned)n, 1024, 0, (cudaStream_t)stream, x, y, w, d, eps);
    return tn_cu_err();
}

/* y[i] = cap * tanh(y[i] / cap), i < n (final logit soft-capping, as the CPU writes it) */
__global__ void k_softcap(float *y, int64_t n, float cap) {
    gdc_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = tanhf(y[i] * (1.0f / cap)) * cap;
}
extern "C" int tn_cu_softcap(float *y, int64_t n, float cap, void *stream) {
    if (n == 0) return 0;
    if (!(cap > 0.0f)) return (int)cudaErrorInvalidValue;
    launch(k_softcap, (unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream, y, n, cap);
    return tn_cu_err();
}

__global__ void k_add_bias(float *y, const float *b, int64_t n, int64_t d) {
    gdc_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * d) y[i] += b[i % d];
}
extern "C" int tn_cu_add_bias(float *y, const float *b, int64_t n, int64_t d, void *stream) {
    if (n * d == 0) return 0;
    launch(k_add_bias, (unsigned)((n * d + 255) / 256), 256, 0, (cudaStream_t)stream, y, b, n, d);
    return tn_cu_err();
}

/* A per-channel K's launch arguments: its window, the tokens' windows and positions. */
static bool kc_args_ok(const tn_cu_kv &kv) { return kv.kw && kv.wseq && kv.pos && kv.kc_w >= 16; }

/* kv, or the f16 cache without rotation where the caller passes none */
static tn_cu_kv kv_or_f16(const tn_cu_kv *kv) {
    const tn_cu_kv f16 = {TN_CU_KV_F16, TN_CU_KV_F16, 0, 0, NULL, 0, 0, 0, 0, NULL, NULL, NULL, 0};
    return kv ? *kv : f16;
}

/* block per token: a warp per head for the q/k norms (qwen3), then one thread per rotated pair
 * (query heads, then key heads), then (a quantized cache) the cache's rotation of each q, k and v
 * head, a warp per head, then the cache rows, a warp per block of 32 values */
__global__ void k_rope_store(float *q, int64_t ldq, float *k, float *v, int64_t ldk, const float *qn, const float *kn,
                             float eps, const float *cs, int n_rot, int neox, int n_head, int n_head_kv, int hd,
                             const int32_t *kvrow, uint8_t *Kc, uint8_t *Vc, tn_cu_kv kv) {
    gdc_enter();
    const int64_t t = blockIdx.x;
    const int lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    if (qn || kn) {
        for (int h = threadIdx.x / WARP; h < n_head + n_head_kv; h += nw) {
            const float *w = h < n_head ? qn : kn;
            if (!w) continue;
            float *x = h < n_head ? q + t * ldq + (int64_t)h * hd : k + t * ldk + (int64_t)(h - n_head) * hd;
            head_norm_warp(x, hd, w, eps, lane);
        }
        __syncthreads();
    }
    const float *c = cs + t * n_rot;
    const int np = n_rot / 2;
    for (int u = threadIdx.x; u < (n_head + n_head_kv) * np; u += blockDim.x) {
        const int h = u / np;
        float *x = h < n_head ? q + t * ldq + (int64_t)h * hd : k + t * ldk + (int64_t)(h - n_head) * hd;
        rope_pair(x, 2 * (u % np), c, n_rot, neox);
    }
    __syncthreads();
    if (kv.rot_k || kv.rot_v) { /* q and k heads (rot_k), then v heads (rot_v) */
        for (int h = threadIdx.x / WARP; h < n_head + 2 * n_head_kv; h += nw) {
            const bool isv = h >= n_head + n_head_kv;
            if (isv ? !kv.rot_v : !kv.rot_k) continue;
            float *x = h < n_head ? q + t * ldq + (int64_t)h * hd
                       : isv      ? v + t * ldk + (int64_t)(h - n_head - n_head_kv) * hd
                                  : k + t * ldk + (int64_t)(h - n_head) * hd;
            kv_rot_warp(x, hd, kv.rot_sign, kv.rot_blk, false, lane);
        }
        __syncthreads();
    }
    const int kv_dim = n_head_kv * hd;
    const int64_t row = kvrow[t];
    const bool kc = kv_kc_bits(kv.tk) != 0;
    if (kc) { /* per-channel K: the key row into its sequence's window, quantized with its group (k_kc_close) */
        __half *w = (__half *)kv_kc_win(kv, t, kv.pos[t], kv_dim, 0, hd);
        for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) w[i] = __float2half_rn(k[t * ldk + i]);
    }
    if (kv.tk == TN_CU_KV_F16 && kv.tv == TN_CU_KV_F16) {
        for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
            ((__half *)Kc)[row * kv_dim + i] = __float2half_rn(k[t * ldk + i]);
            ((__half *)Vc)[row * kv_dim + i] = __float2half_rn(v[t * ldk + i]);
        }
        return;
    }
    for (int b = threadIdx.x / WARP; b < 2 * (kv_dim / 32); b += nw) { /* K blocks, then V blocks (kv_dim % 32 == 0) */
        const bool isv = b >= kv_dim / 32;
        if (kc && !isv) continue;
        const int64_t e0 = (int64_t)(isv ? b - kv_dim / 32 : b) * 32;
        kv_store_warp(isv ? Vc + row * kv.v_rb : Kc + row * kv.k_rb, isv ? kv.tv : kv.tk, e0,
                      isv ? v[t * ldk + e0 + lane] : k[t * ldk + e0 + lane], lane);
    }
}
extern "C" int tn_cu_rope_store(float *q, int64_t ldq, float *k, float *v, int64_t ldk, const float *qn, const float *kn,
                                float eps, const float *cs, int n_rot, int neox, int64_t n, int n_head, int n_head_kv, int hd,
                                const int32_t *kvrow, void *Kc, void *Vc, const tn_cu_kv *kv, void *stream) {
    if (n == 0) return 0;
    const tn_cu_kv kvv = kv_or_f16(kv);
    if ((kvv.tk != TN_CU_KV_F16 || kvv.tv != TN_CU_KV_F16 || kvv.rot_k || kvv.rot_v) && hd % 32 != 0) return (int)cudaErrorInvalidValue;
    if (kv_kc_bits(kvv.tk) && !kc_args_ok(kvv)) return (int)cudaErrorInvalidValue;
    launch(k_rope_store, (unsigned)n, 256, 0, (cudaStream_t)stream, q, ldq, k, v, ldk, qn, kn, eps, cs, n_rot, neox, n_head,
           n_head_kv, hd, kvrow, (uint8_t *)Kc, (uint8_t *)Vc, kvv);
    return tn_cu_err();
}

/* Block (token t, kv head g), a thread a channel of the head (hd threads): when t's position
 * completes a group, the group's 16 keys of the channel from the window, its (d, m) and codes as
 * tn_kc_quantize_group computes them (d = f16((max - min) / (2^b - 1)), m = f16(min), c =
 * clamp(rint((x - m) / d))), each row's codes packed into tq's planes by the channel's warp (the 32
 * channels of a chunk) and its stats by the two lanes whose channels the row carries. */
__global__ void k_kc_close(uint8_t *Kc, tn_cu_kv kv, const int32_t *kvrow, int n_head_kv, int hd) {
    gdc_enter();
    const int64_t t = blockIdx.x / n_head_kv;
    const int g = blockIdx.x % n_head_kv, ch = threadIdx.x, lane = ch % WARP, p = kv.pos[t];
    if ((p + 1) % 16 != 0 || ch >= hd) return; /* (whole warps: hd % 32 == 0) */
    const int bits = kv_kc_bits(kv.tk), nmax = (1 << bits) - 1, kv_dim = n_head_kv * hd;
    float x[16];
#pragma unroll
    for (int r = 0; r < 16; r++) x[r] = __half2float(kv_kc_win(kv, t, p - 15 + r, kv_dim, g, hd)[ch]);
    float mn = x[0], mx = x[0];
#pragma unroll
    for (int r = 1; r < 16; r++) mn = fminf(mn, x[r]), mx = fmaxf(mx, x[r]);
    const __half dh = __float2half_rn(__fsub_rn(mx, mn) / (float)nmax), mh = __float2half_rn(mn);
    const float d = __half2float(dh), m = __half2float(mh), id = d != 0.0f ? 1.0f / d : 0.0f;
    const int64_t j = ((int64_t)g * hd + ch) / 32; /* the chunk of the row */
    uint8_t *g0 = Kc + (int64_t)(kvrow[t] - 15) * kv.k_rb + j * (8 + 4 * bits);
#pragma unroll /* (x in registers) */
    for (int r = 0; r < 16; r++) {
        int c = 0;
        if (d != 0.0f) {
            c = __float2int_rn(__fmul_rn(__fsub_rn(x[r], m), id));
            c = c < 0 ? 0 : c > nmax ? nmax : c;
        }
        uint8_t *o = g0 + r * kv.k_rb;
        if (lane / 2 == r) ((__half *)o)[2 * (lane % 2)] = dh, ((__half *)o)[2 * (lane % 2) + 1] = mh;
        tq_pack_code(o + 8, bits, c, lane);
    }
}
extern "C" int tn_cu_kc_close(void *Kc, const tn_cu_kv *kv, const int32_t *kvrow, int64_t n, int n_head_kv, int hd, void *stream) {
    if (n == 0) return 0;
    if (!kv || !kv_kc_bits(kv->tk) || !kc_args_ok(*kv) || hd % 32 != 0 || hd > 256)
        return (int)cudaErrorInvalidValue;
    launch(k_kc_close, (unsigned)(n * n_head_kv), (unsigned)hd, 0, (cudaStream_t)stream, (uint8_t *)Kc, *kv, kvrow, n_head_kv, hd);
    return tn_cu_err();
}
__global__ void k_attn_block(const float *q, int64_t ldq, const uint8_t *Kc, const uint8_t *Vc, int64_t n, int n_head, int n_head_kv, int hd,
                 const int32_t *pos, const int32_t *tbl_off, const int32_t *tbl, float scale, float cap, int window,
                 const float *sinks, float *out, tn_cq xq, tn_cu_rope ar, tn_cu_kv kv, tn_cu_attn_sched sp, int S) {
    (void)n;
    gdc_enter();
    attn_unit((int)(blockIdx.x / S), (int)(blockIdx.x % S), S, sp, q, ldq, Kc, Vc, n_head, n_head_kv, hd, pos, tbl_off, tbl, scale, cap,
              window, sinks, out, xq, ar, kv);
}
#define ATT_TR 8 /* query rows of a tiled attention block */
/* Prefill attention with the cache rows shared: a block computes up to ATT_TR query rows (tokens
 * of a tile x the query heads of one kv head, which read the same K and V rows), each K row read
 * once and dotted with every row's query, each V value read once and accumulated into every row's
 * output. Per row, the arithmetic is attn_unit's in the same order (each thread the same
 * positions, the same reductions, the same fold of the chunks; a row's maximum, sum and fold
 * scales computed once, by thread r, into shared memory): the same bits as a block per (token,
 * head), so a token's result still does not depend on its batch. K and V in any cache type the
 * GPU keeps (f16 K rows in 16-byte loads; a quantized K dotted with each row's query as q8 blocks). A block takes tokens t0 .. t0 + qt - 1 and heads h0 .. h0 + hb - 1 (of kv head
 * kvh); tokens go together while they read the same rows (one block table, or the contiguous
 * cache) from the same first position (sliding windows), else in passes. */
__global__ void __launch_bounds__(ATT_THREADS, 2) k_attn_tile(const float *q, int64_t ldq, const uint8_t *Kc, const uint8_t *Vc, int64_t n,
                                                            int n_head, int n_head_kv, int hd, int qt, int hb, const int32_t *pos,
                                                            const int32_t *tbl_off, const int32_t *tbl, float scale, float cap, int window,
                                                            const float *sinks, float *out, tn_cq xq, tn_cu_kv kv) {
    __shared__ __align__(16) float qs[ATT_TR][ATT_THREADS];
    __shared__ float sc[ATT_TR][ATT_CHUNK];
    __shared__ int32_t rows[ATT_CHUNK];
    __shared__ float red[ATT_TR][ATT_THREADS / WARP];
    __shared__ float part[ATT_TR][ATT_THREADS];
    /* per row: its positions T, this chunk's max m, the running max M and sum L, the fold's scales a, b */
    __shared__ int Ts[ATT_TR];
    __shared__ float ms[ATT_TR], Ms[ATT_TR], Ls[ATT_TR], fa[ATT_TR], fb[ATT_TR];
    /* a quantized K: each row's query as q8 blocks (codes, scales, sums), as attn_unit makes them */
    __shared__ __align__(16) int8_t qq[ATT_TR][ATT_THREADS];
    __shared__ float qd[ATT_TR][ATT_THREADS / 32];
    __shared__ int32_t qsum[ATT_TR][ATT_THREADS / 32];
    gdc_enter();
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int gh = n_head / n_head_kv, hgroups = (gh + hb - 1) / hb;
    const int sub = blockIdx.x % hgroups, kvh = (blockIdx.x / hgroups) % n_head_kv;
    const int64_t t0 = (int64_t)(blockIdx.x / hgroups / n_head_kv) * qt, t1 = min(n, t0 + qt);
    const int h0 = kvh * gh + sub * hb, nh = min(hb, gh - sub * hb);
    const int kv_dim = n_head_kv * hd;
    const bool kq = kv.tk != TN_CU_KV_F16;
    const int kcb = kv_kc_bits(kv.tk); /* per-channel K: complete groups from the cache, the rest from the window */
    const int64_t k_rb = kq ? kv.k_rb : (int64_t)kv_dim * 2, v_rb = kv.tv == TN_CU_KV_F16 ? (int64_t)kv_dim * 2 : kv.v_rb;
    const int64_t koff = kv_head_off(kv.tk, kvh, hd), voff = kv_head_off(kv.tv, kvh, hd);
    const int G = ATT_THREADS / hd, gi = tid / hd, d0 = tid % hd;
    const bool active = gi < G;
    const auto first = [&](int64_t t) { const int T = pos[t] + 1; return window > 0 && T > window ? T - window : 0; };
    for (int64_t ta = t0; ta < t1;) {
        int64_t tb = ta + 1; /* this pass: tokens ta .. tb - 1 */
        while (tb < t1 && tbl_off[tb] == tbl_off[ta] && first(tb) == first(ta)) tb++;
        const int nr = (int)(tb - ta) * nh, off = tbl_off[ta], p_lo = first(ta);
        for (int i = tid; i < nr * hd; i += ATT_THREADS) {
            const int r = i / hd;
            qs[r][i % hd] = q[(ta + r / nh) * ldq + (int64_t)(h0 + r % nh) * hd + i % hd];
        }
        if (tid < ATT_TR) Ts[tid] = tid < nr ? pos[ta + tid / nh] + 1 : 0, Ms[tid] = -INFINITY, Ls[tid] = 0.0f;
        if (kq && !kcb) { /* the rows' queries as q8 blocks, a warp a block */
            __syncthreads();
            for (int rb = warp; rb < nr * (hd / 32); rb += ATT_THREADS / WARP) {
                const int r = rb / (hd / 32), b = rb % (hd / 32);
                q8_block(qs[r][b * 32 + lane], lane, b, b * 32, tn_cq{qq[r], qd[r], qsum[r]});
            }
        }
        float O[ATT_TR];
#pragma unroll
        for (int r = 0; r < ATT_TR; r++) O[r] = 0.0f;
        __syncthreads();
        int Tmax = 0;
        for (int r = 0; r < nr; r++) Tmax = max(Tmax, Ts[r]);
        for (int p0 = p_lo; p0 < Tmax; p0 += ATT_CHUNK) {
            const int npm = min(ATT_CHUNK, Tmax - p0);
            int np[ATT_TR];
            float cm[ATT_TR];
#pragma unroll
            for (int r = 0; r < ATT_TR; r++) np[r] = min(ATT_CHUNK, Ts[r] - p0), cm[r] = -INFINITY;
            for (int j = tid; j < npm; j += ATT_THREADS) {
                const int p = p0 + j;
                const int64_t row = kv_pos_row(kv, off, tbl, p);
                rows[j] = (int32_t)row;
                const uint8_t *krow = Kc + row * k_rb + koff;
                float dot[ATT_TR];
#pragma unroll
                for (int r = 0; r < ATT_TR; r++) dot[r] = 0.0f;
                if (kcb) { /* row r: its complete groups as attn_unit dots them, the rest from its token's window */
#pragma unroll 1
                    for (int r = 0; r < nr; r++) {
                        if (j >= Ts[r] - p0) continue;
                        if (p < Ts[r] - Ts[r] % 16) {
                            sc[r][j] = kv_dot_kc_b(kcb, krow - (int64_t)(p % 16) * k_rb, k_rb, p % 16, qs[r], hd);
                        } else {
                            const __half *kr = kv_kc_win(kv, ta + r / nh, p, kv_dim, kvh, hd);
                            float dd = 0.0f;
                            for (int i = 0; i < hd; i += 8) dd = dot8_h(dd, &qs[r][i], *(const uint4 *)(kr + i));
                            sc[r][j] = dd;
                        }
                    }
#pragma unroll
                    for (int r = 0; r < ATT_TR; r++)
                        if (j < np[r]) dot[r] = sc[r][j];
                } else if (kq) { /* (each row's dot through sc: one inlined copy of the dequantizing dot) */
#pragma unroll 1
                    for (int r = 0; r < nr; r++)
                        if (j < Ts[r] - p0) sc[r][j] = kv_dot_q(krow, kv.tk, qq[r], qd[r], qsum[r], hd);
#pragma unroll
                    for (int r = 0; r < ATT_TR; r++)
                        if (j < np[r]) dot[r] = sc[r][j];
                } else {
                    for (int i = 0; i < hd; i += 8) {
                        const uint4 u = *(const uint4 *)((const __half *)krow + i);
#pragma unroll
                        for (int r = 0; r < ATT_TR; r++)
                            if (r < nr) dot[r] = dot8_h(dot[r], &qs[r][i], u);
                    }
                }
#pragma unroll
                for (int r = 0; r < ATT_TR; r++) {
                    if (j >= np[r]) continue;
                    float sco = dot[r] * scale;
                    if (cap > 0.0f) sco = cap * tanhf(sco);
                    sc[r][j] = sco;
                    cm[r] = fmaxf(cm[r], sco);
                }
            }
#pragma unroll
            for (int r = 0; r < ATT_TR; r++) {
                const float v = warp_max(cm[r]);
                if (lane == 0) red[r][warp] = v;
            }
            __syncthreads();
            if (tid < ATT_TR) { /* row tid's chunk max, over the warps in order */
                float m = red[tid][0];
                for (int w = 1; w < ATT_THREADS / WARP; w++) m = fmaxf(m, red[tid][w]);
                ms[tid] = m;
            }
            __syncthreads();
#pragma unroll
            for (int r = 0; r < ATT_TR; r++) {
                float cs = 0.0f;
                const float m = ms[r];
                for (int j = tid; j < np[r]; j += ATT_THREADS) {
                    const float e = expf(sc[r][j] - m);
                    sc[r][j] = e;
                    cs += e;
                }
                cs = warp_sum(cs);
                if (lane == 0) red[r][warp] = cs;
            }
            __syncthreads();
            if (tid < ATT_TR && Ts[tid] > p0) { /* row tid: the chunk's sum, folded into the running one */
                float l = 0.0f;
                for (int w = 0; w < ATT_THREADS / WARP; w++) l += red[tid][w];
                const float M = Ms[tid], m = ms[tid], Mn = fmaxf(M, m), a = expf(M - Mn), b = expf(m - Mn);
                Ls[tid] = attn_fold_add(Ls[tid], l, a, b);
                Ms[tid] = Mn, fa[tid] = a, fb[tid] = b;
            }
            float acc[ATT_TR];
#pragma unroll
            for (int r = 0; r < ATT_TR; r++) acc[r] = 0.0f;
            if (active) {
                for (int j = gi; j < npm; j += G) {
                    const uint8_t *vr = Vc + (int64_t)rows[j] * v_rb + voff;
                    const float v = kv.tv == TN_CU_KV_F16 ? __half2float(((const __half *)vr)[d0]) : kv_value(vr, kv.tv, d0);
#pragma unroll
                    for (int r = 0; r < ATT_TR; r++)
                        if (j < np[r]) acc[r] = __fmaf_rn(sc[r][j], v, acc[r]);
                }
#pragma unroll
                for (int r = 0; r < ATT_TR; r++) part[r][tid] = acc[r];
            }
            __syncthreads();
            if (tid < hd) {
#pragma unroll
                for (int r = 0; r < ATT_TR; r++) {
                    if (np[r] <= 0) continue;
                    float o = 0.0f;
                    for (int g = 0; g < G; g++) o += part[r][g * hd + tid];
                    O[r] = attn_fold_add(O[r], o, fa[r], fb[r]);
                }
            }
            __syncthreads(); /* sc, rows, red, part and the row scalars are rewritten by the next chunk */
        }
        /* each row's output (sinks, rotated back), written and quantized for Wo */
#pragma unroll
        for (int r = 0; r < ATT_TR; r++) {
            if (r >= nr) continue;
            float L = Ls[r];
            if (sinks) L += expf(sinks[h0 + r % nh] - Ms[r]);
            if (tid < hd) qs[r][tid] = O[r] / L;
        }
        if (kv.rot_v) {
            __syncthreads();
            for (int r = warp; r < nr; r += ATT_THREADS / WARP) kv_rot_warp(qs[r], hd, kv.rot_sign, kv.rot_blk, true, lane);
        }
        __syncthreads();
        for (int r = 0; r < nr && tid < hd; r++) {
            const int64_t e = (ta + r / nh) * (int64_t)n_head * hd + (int64_t)(h0 + r % nh) * hd + tid;
            const float v = qs[r][tid];
            out[e] = v;
            if (xq.q) q8_block(v, lane, e / 32, e - lane, xq); /* (hd % 32 == 0: whole warps) */
        }
        __syncthreads(); /* qs and the row scalars are rewritten by the next pass */
        ta = tb;
    }
}
extern "C" int tn_cu_attention(const float *q, int64_t ldq, const void *Kc, const void *Vc, int64_t n, int n_head,
                               int n_head_kv, int hd, const int32_t *pos, const int32_t *tbl_off, const int32_t *tbl,
                               float scale, float cap, int window, const float *sinks, float *out, const tn_cq *xq,
                               const tn_cu_rope *rope, const tn_cu_kv *kv, const tn_cu_attn_sched *sched, void *stream) {
    const tn_cu_kv kvv = kv_or_f16(kv);
    const bool plain = kvv.tk == TN_CU_KV_F16 && kvv.tv == TN_CU_KV_F16 && !kvv.rot_k && !kvv.rot_v;
    if (hd > 256 || (xq && hd % 32 != 0) || (rope && (rope->n_rot > hd || rope->n_rot % 2 != 0)) || window < 0 || cap < 0.0f ||
        (!plain && hd % 32 != 0) || (kv_kc_bits(kvv.tk) && (rope || !kc_args_ok(kvv))))
        return (int)cudaErrorInvalidValue; /* (a per-channel K: its window, and no new rows stored here) */
    const tn_cq none = {NULL, NULL, NULL};
    tn_cu_rope ar = {};
    if (rope) ar = *rope;
    const int64_t units = n * n_head;
    if (units == 0) return 0;
    tn_cu_attn_sched sp = {};
    int S = 1;
    if (sched && sched->splits > 1) {
        if (!sched->part || !sched->cnt || sched->kmax < 1 || sched->tokens < n) return (int)cudaErrorInvalidValue;
        sp = *sched, S = sched->splits;
    }
    const int gh = n_head / n_head_kv, kv_dim = n_head_kv * hd;
    if (sched && sched->tile && !rope && n > TN_CU_GEMV_MAXN && hd % 8 == 0 && kv_dim % 8 == 0) {
        const int hb = min(gh, ATT_TR), qt = ATT_TR / hb, hgroups = (gh + hb - 1) / hb;
        const int64_t blocks = (n + qt - 1) / qt * n_head_kv * hgroups;
        launch(k_attn_tile, (unsigned)blocks, ATT_THREADS, 0, (cudaStream_t)stream, q, ldq, (const uint8_t *)Kc, (const uint8_t *)Vc,
               n, n_head, n_head_kv, hd, qt, hb, pos, tbl_off, tbl, scale, cap, window, sinks, out, xq ? *xq : none, kvv);
        return tn_cu_err();
    }
    launch(k_attn_block, (unsigned)(units * S), ATT_THREADS, 0, (cudaStream_t)stream, q, ldq, (const uint8_t *)Kc,
           (const uint8_t *)Vc, n, n_head, n_head_kv, hd, pos, tbl_off, tbl, scale, cap, window, sinks, out, xq ? *xq : none, ar,
           kvv, sp, S);
    return tn_cu_err();
}

/* ---- multi-head latent attention (deepseek2) ------------------------------------------------- */

/* Block per token: RoPE on the token's rotated key part (kvr[R .. R + nr), one head) and on each
 * query head's rotated part (q[h hd + nope ..]), as the CPU's tn_op_rope (rope_pair); the query
 * parts copied after each head's latent-space query in mq [n H][Lk] (at R); then the row
 * [c | k_pe] (Lk values) stored at cache row kvrow[t] in kv.tk (f16, or by the CPU's reference
 * quantizers, a warp per block of 32). */
__global__ void k_mla_rope_store(float *q, int64_t ldq, int H, int hd, int nope, float *kvr, int64_t ldkv, int R, int nr,
                                 const float *cs, int neox, float *mq, int64_t Lk, const int32_t *kvrow, uint8_t *Kc, tn_cu_kv kv) {
    gdc_enter();
    const int64_t t = blockIdx.x;
    const int lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    const float *c = cs + t * nr;
    const int npair = nr / 2;
    float *kr = kvr + t * ldkv;
    for (int u = threadIdx.x; u < (H + 1) * npair; u += blockDim.x) {
        const int h = u / npair;
        float *x = h < H ? q + t * ldq + (int64_t)h * hd + nope : kr + R;
        rope_pair(x, 2 * (u % npair), c, nr, neox);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < H * nr; i += blockDim.x) {
        const int h = i / nr, j = i % nr;
        mq[(t * H + h) * Lk + R + j] = q[t * ldq + (int64_t)h * hd + nope + j];
    }
    uint8_t *row = Kc + (int64_t)kvrow[t] * kv.k_rb;
    if (kv.tk == TN_CU_KV_F16) {
        for (int i = threadIdx.x; i < Lk; i += blockDim.x) ((__half *)row)[i] = __float2half_rn(kr[i]);
        return;
    }
    for (int b = threadIdx.x / WARP; b < Lk / 32; b += nw) kv_store_warp(row, kv.tk, (int64_t)b * 32, kr[b * 32 + lane], lane);
}
extern "C" int tn_cu_mla_rope_store(float *q, int64_t ldq, int n_head, int hd, int nope, float *kv_rows, int64_t ldkv, int R,
                                    int n_rot, const float *cs, int neox, float *mq, int64_t Lk, int64_t n, const int32_t *kvrow,
                                    void *Kc, const tn_cu_kv *kv, void *stream) {
    if (n == 0) return 0;
    if (!kv) return (int)cudaErrorInvalidValue;
    const tn_cu_kv kvv = *kv;
    if (n_rot % 2 != 0 || nope + n_rot > hd || R + n_rot != Lk || kvv.rot_k || kv_kc_bits(kvv.tk) || kvv.tk != kvv.tv ||
        (kvv.tk != TN_CU_KV_F16 && Lk % 32 != 0))
        return (int)cudaErrorInvalidValue;
    launch(k_mla_rope_store, (unsigned)n, 256, 0, (cudaStream_t)stream, q, ldq, n_head, hd, nope, kv_rows, ldkv, R, n_rot, cs, neox,
           mq, Lk, kvrow, (uint8_t *)Kc, kvv);
    return tn_cu_err();
}

#define MLA_LMAX 1024 /* the longest latent row [c | k_pe] the attention block holds (deepseek V2/V3: 576) */
#define MLA_CH TN_CU_MLA_CHUNK /* positions scored at once */
/* max / sum of v over the block, every thread gets it (the warps' results combined in warp order) */
__device__ __forceinline__ float mla_block_max(float v, float *red) {
    v = warp_max(v);
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < (int)(blockDim.x / WARP); i++) r = fmaxf(r, red[i]);
    __syncthreads();
    return r;
}
__device__ __forceinline__ float mla_block_sum(float v, float *red) {
    v = warp_sum(v);
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < (int)(blockDim.x / WARP); i++) r += red[i];
    __syncthreads();
    return r;
}
/* Block per (token t, head h) = unit u, or with a split (sp.splits = S > 1) per (unit, s < S): query
 * mq[u] (Lk values) over the cached rows of positions 0 .. pos[t] (row kv_pos_row), scores q.k *
 * scale, softmax, and the weighted sum of the rows' first R values (the latent: keys and values are
 * the same rows). Positions in chunks of MLA_CH: a thread per position scores it (f16 rows: 8 values
 * a 16-byte load, fused multiply-adds in order; a quantized row: the query as q8 blocks, kv_dot_q
 * as the other attention kernels), the chunk's max m and sum l of exp, thread i accumulates
 * dimensions i, i + 256, .. over the chunk's positions (V values dequantized) into o. Unsplit, the
 * chunks' (m, l, o) are folded in order (mla_fold) and out[u ldo + i] = O / L; split, block s takes
 * chunks s, s + S, .. and writes each chunk's (m, l, o) to sp.part, which k_attn_mla_fold folds in
 * chunk order: the same operations in the same order, so the same bits. f32 throughout. */
__device__ __forceinline__ void mla_fold(float &M, float &L, float *O, int n, float m, float l, const float *o) {
    const float Mn = fmaxf(M, m), a = expf(M - Mn), b = expf(m - Mn);
    L = attn_fold_add(L, l, a, b);
    for (int k = 0; k < n; k++) O[k] = attn_fold_add(O[k], o[k], a, b);
    M = Mn;
}
#define MLA_OPT (MLA_LMAX / ATT_THREADS) /* output dimensions per thread */
__global__ void __launch_bounds__(ATT_THREADS) k_attn_mla(const float *mq, int Lk, int R, const uint8_t *Kc, int H,
                                                          const int32_t *pos, const int32_t *toff, const int32_t *tbl, float scale,
                                                          float *out, int64_t ldo, tn_cu_kv kv, tn_cu_mla_split sp) {
    gdc_enter();
    __shared__ __align__(16) float sq[MLA_LMAX];
    __shared__ __align__(16) int8_t sqq[MLA_LMAX];
    __shared__ float sqd[MLA_LMAX / 32];
    __shared__ int32_t sqs[MLA_LMAX / 32];
    __shared__ float ss[MLA_CH];
    __shared__ int64_t srow[MLA_CH];
    __shared__ float red[ATT_THREADS / WARP];
    const int S = sp.splits > 1 ? sp.splits : 1;
    const int64_t u = blockIdx.x / S, t = u / H;
    const int s0 = (int)(blockIdx.x % S);
    const int tid = threadIdx.x, lane = tid % WARP, nw = blockDim.x / WARP;
    const int np = pos[t] + 1, off = toff[t], K = (np + MLA_CH - 1) / MLA_CH;
    if (s0 >= K) return; /* (a split block without a chunk of its own: the whole block leaves) */
    const float *q = mq + u * Lk;
    for (int i = tid; i < Lk; i += blockDim.x) sq[i] = q[i];
    const bool quant = kv.tk != TN_CU_KV_F16;
    if (quant) {
        const tn_cq sx = {sqq, sqd, sqs};
        for (int b = tid / WARP; b < Lk / 32; b += nw) q8_block(q[b * 32 + lane], lane, b, (int64_t)b * 32, sx);
    }
    __syncthreads();
    float M = -INFINITY, L = 0.0f, O[MLA_OPT];
#pragma unroll
    for (int k = 0; k < MLA_OPT; k++) O[k] = 0.0f;
    for (int c = s0; c < K; c += S) {
        const int p0 = c * MLA_CH, nc = min(MLA_CH, np - p0);
        float m = -INFINITY;
        for (int j = tid; j < nc; j += blockDim.x) {
            const int64_t r = kv_pos_row(kv, off, tbl, p0 + j);
            const uint8_t *row = Kc + r * kv.k_rb;
            float sc = 0.0f;
            if (quant) {
                sc = kv_dot_q(row, kv.tk, sqq, sqd, sqs, Lk);
            } else {
                for (int i = 0; i < Lk; i += 8) sc = dot8_h(sc, sq + i, *(const uint4 *)(row + 2 * i));
            }
            sc = __fmul_rn(sc, scale);
            ss[j] = sc, srow[j] = r;
            m = fmaxf(m, sc);
        }
        m = mla_block_max(m, red);
        float l = 0.0f;
        for (int j = tid; j < nc; j += blockDim.x) {
            const float e = expf(ss[j] - m);
            ss[j] = e;
            l += e;
        }
        l = mla_block_sum(l, red); /* (its barriers also publish ss) */
        float o[MLA_OPT];
#pragma unroll
        for (int k = 0; k < MLA_OPT; k++) {
            const int i = tid + k * ATT_THREADS;
            o[k] = 0.0f;
            if (i >= R) continue;
            for (int j = 0; j < nc; j++) {
                const uint8_t *row = Kc + srow[j] * kv.k_rb;
                o[k] = __fmaf_rn(ss[j], quant ? kv_value(row, kv.tk, i) : h2f(((const uint16_t *)row)[i]), o[k]);
            }
        }
        if (S > 1) { /* the chunk's partial: (m, l, o[R]) */
            float *pp = sp.part + ((size_t)u * sp.kmax + c) * (size_t)(R + 2);
            if (tid == 0) pp[0] = m, pp[1] = l;
#pragma unroll
            for (int k = 0; k < MLA_OPT; k++)
                if (tid + k * ATT_THREADS < R) pp[2 + tid + k * ATT_THREADS] = o[k];
        } else {
            mla_fold(M, L, O, MLA_OPT, m, l, o);
        }
        __syncthreads(); /* ss, srow are rewritten by the next chunk */
    }
    if (S > 1) return;
#pragma unroll
    for (int k = 0; k < MLA_OPT; k++) {
        const int i = tid + k * ATT_THREADS;
        if (i < R) out[u * ldo + i] = O[k] / L;
    }
}
/* Block per unit u: its chunks' partials folded in chunk order (attn_fold: mla_fold's operations
 * for one dimension, as the unsplit block folds them), out[u ldo + i] = O / L. */
__global__ void __launch_bounds__(ATT_THREADS) k_attn_mla_fold(int R, int H, const int32_t *pos, float *out, int64_t ldo,
                                                               tn_cu_mla_split sp) {
    gdc_enter();
    const int64_t u = blockIdx.x, t = u / H;
    const int K = (pos[t] + MLA_CH) / MLA_CH;
    const float *pp = sp.part + (size_t)u * sp.kmax * (size_t)(R + 2);
    for (int i = threadIdx.x; i < R; i += blockDim.x) {
        float M = -INFINITY, L = 0.0f, O = 0.0f;
        for (int c = 0; c < K; c++) {
            const float *pc = pp + (size_t)c * (size_t)(R + 2);
            attn_fold(M, L, O, pc[0], pc[1], pc[2 + i]);
        }
        out[u * ldo + i] = O / L;
    }
}
extern "C" int tn_cu_attn_mla(const float *mq, int64_t Lk, int R, const void *Kc, int64_t n, int n_head, const int32_t *pos,
                              const int32_t *tbl_off, const int32_t *tbl, float scale, float *out, int64_t ldo, const tn_cu_kv *kv,
                              const tn_cu_mla_split *split, void *stream) {
    if (!kv) return (int)cudaErrorInvalidValue;
    const tn_cu_kv kvv = *kv;
    if (Lk > MLA_LMAX || R > Lk || R < 1 || kvv.rot_k || kv_kc_bits(kvv.tk) || kvv.ring || kvv.tk != kvv.tv ||
        (kvv.tk == TN_CU_KV_F16 ? Lk % 8 != 0 || kvv.k_rb % 16 != 0 : Lk % 32 != 0))
        return (int)cudaErrorInvalidValue;
    if (n * n_head == 0) return 0;
    tn_cu_mla_split sp = {NULL, 0, 1};
    if (split && split->splits > 1) {
        if (!split->part || split->kmax < 1) return (int)cudaErrorInvalidValue;
        sp = *split;
    }
    launch(k_attn_mla, (unsigned)(n * n_head * sp.splits), ATT_THREADS, 0, (cudaStream_t)stream, mq, (int)Lk, R, (const uint8_t *)Kc,
           n_head, pos, tbl_off, tbl, scale, out, ldo, kvv, sp);
    if (sp.splits > 1)
        launch(k_attn_mla_fold, (unsigned)(n * n_head), ATT_THREADS, 0, (cudaStream_t)stream, R, n_head, pos, out, ldo, sp);
    return tn_cu_err();
}
