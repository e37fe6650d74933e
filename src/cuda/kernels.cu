/*
 * kernels.cu — tern's CUDA kernels (launchers in kern_cuda.h) beside gemv.cu (the weight products)
 * and attn.cu (norms, RoPE, attention): the launch settings, the activations, the mixture of
 * experts' routing and combination, the persistent decode kernel and the copy kernel. The CPU's
 * scalar kernels are the oracle of every kernel (tests/cuda/test_cuda.c).
 *
 * One-token steps run launch by launch (about 5 launches a layer, a CUDA graph) or, with
 * TERN_CUDA_PERSIST=1, as one persistent cooperative kernel (k_persist, at the end) whose stages
 * call the same device functions as the launches (gemv_code_rows in kcode.cuh, attn_unit in
 * kattn.cuh) between grid barriers.
 */
#include "cuda/kattn.cuh"

namespace tn_cu {
bool g_pdl = false;
int g_bps = 0, g_sms = 0, g_grid_cap = 0, g_rows = 1, g_l2 = 0;
int g_mmq = 0;
} // namespace tn_cu

extern "C" int tn_cu_configure(int pdl, int early, int prefetch, int gemv_bps, int gemv_rows) {
    g_pdl = pdl != 0;
    g_rows = gemv_rows == 2 ? 2 : 1;
    g_bps = gemv_bps > 0 ? gemv_bps : 0;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&g_l2, cudaDevAttrL2CacheSize, dev);
    const int e = pdl && early ? 1 : 0, pf = prefetch ? 1 : 0;
    kdev_set_flags(e, pf); /* each file's copy */
    tn_cu_flags_gemv(e, pf);
    tn_cu_flags_attn(e, pf);
    return tn_cu_err();
}

extern "C" void tn_cu_set_gemv_grid_cap(int blocks) { g_grid_cap = blocks > 0 ? blocks : 0; }

/* Batches of code-path weights of at least g_mmq tokens (0: none) on the int8 tensor cores
 * (k_mmq_code: the GEMV kernels' bits), where the device has them (sm_80 and later) */
extern "C" int tn_cu_set_mmq(int min_tokens) {
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    g_mmq = min_tokens > 0 && major >= 8 ? max(min_tokens, TN_CU_GEMV_MAXN + 1) : 0;
    return g_mmq;
}
extern "C" int tn_cu_mmq(void) { return g_mmq; }


/* ---- activations ------------------------------------------------------------------------------ */

__global__ void k_swiglu(float *g, const float *u, int64_t n, int act) {
    gdc_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = glu(g[i], u[i], act);
}
extern "C" int tn_cu_swiglu(float *g, const float *u, int64_t n, int act, void *stream) {
    if (n == 0) return 0;
    launch(k_swiglu, (unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream, g, u, n, act);
    return tn_cu_err();
}

/* gate and up side by side per token: gu[t] = [gate (ff) | up (ff)] -> h[t][i]; with xq.q != NULL
 * (ff % 32 == 0) also h quantized to q8 blocks, one warp per block */
/* x[i] = relu(x[i])^2 (PLM's ungated FFN; the CPU's tn_op_relu_sqr), and with xq its q8 blocks. */
__global__ void k_relu_sqr(float *x, int64_t n, tn_cq xq) {
    gdc_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (xq.q) { /* whole warps: n is a multiple of 32 */
        if ((i - threadIdx.x % WARP) >= n) return;
    } else if (i >= n) {
        return;
    }
    const float r = x[i] > 0.0f ? x[i] : 0.0f, v = __fmul_rn(r, r);
    x[i] = v;
    if (xq.q) q8_block(v, threadIdx.x % WARP, i / 32, i - threadIdx.x % WARP, xq);
}
extern "C" int tn_cu_relu_sqr(float *x, int64_t n, const tn_cq *xq, void *stream) {
    if (n == 0) return 0;
    if (xq && n % 32 != 0) return (int)cudaErrorInvalidValue;
    const tn_cq none = {NULL, NULL, NULL};
    launch(k_relu_sqr, (unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream, x, n, xq ? *xq : none);
    return tn_cu_err();
}

__global__ void k_swiglu_pair(const float *gu, float *h, int64_t n, int64_t ff, int act, tn_cq xq) {
    gdc_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (xq.q) { /* whole warps: n*ff is a multiple of 32 */
        if ((i - threadIdx.x % WARP) >= n * ff) return;
    } else if (i >= n * ff) {
        return;
    }
    const int64_t t = i / ff, j = i % ff;
    const float v = glu(gu[t * 2 * ff + j], gu[t * 2 * ff + ff + j], act);
    h[i] = v;
    if (xq.q) q8_block(v, threadIdx.x % WARP, i / 32, i - threadIdx.x % WARP, xq);
}
extern "C" int tn_cu_swiglu_pair(const float *gu, float *h, int64_t n, int64_t ff, int act, const tn_cq *xq, void *stream) {
    if (n * ff == 0) return 0;
    const tn_cq none = {NULL, NULL, NULL};
    if (xq && ff % 32 != 0) return (int)cudaErrorInvalidValue;
    launch(k_swiglu_pair, (unsigned)((n * ff + 255) / 256), 256, 0, (cudaStream_t)stream, gu, h, n, ff, act, xq ? *xq : none);
    return tn_cu_err();
}

/* ---- mixture of experts ------------------------------------------------------------------------ */

/* dst[r] = src[idx[r]], rows of d floats (a block per row): the routed rows' inputs grouped by expert */
__global__ void k_gather_rows(const float *src, const int32_t *idx, float *dst, int64_t d) {
    gdc_enter();
    const int64_t r = blockIdx.x, s = idx[r];
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dst[r * d + i] = src[s * d + i];
}
extern "C" int tn_cu_gather_rows(const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst, void *stream) {
    if (n == 0) return 0;
    launch(k_gather_rows, (unsigned)n, 256, 0, (cudaStream_t)stream, src, idx, dst, d);
    return tn_cu_err();
}

/* x[t] += sum_j w[t k + j] * out[row[t k + j]], the slots in order, as the CPU's tn_blk_moe adds
 * them (the first product, then each next one added, then the sum into x) */
__global__ void k_moe_combine(float *x, const float *out, const int32_t *row, const float *w, int k, int64_t d) {
    gdc_enter();
    const int64_t t = blockIdx.x;
    const int32_t *rt = row + t * k;
    const float *wt = w + t * k;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = wt[0] * out[(int64_t)rt[0] * d + i];
        for (int j = 1; j < k; j++) acc += wt[j] * out[(int64_t)rt[j] * d + i];
        x[t * d + i] += acc;
    }
}
extern "C" int tn_cu_moe_combine(float *x, const float *out, const int32_t *row, const float *w, int64_t n, int k, int64_t d,
                                 void *stream) {
    if (n == 0) return 0;
    if (k < 1) return (int)cudaErrorInvalidValue;
    launch(k_moe_combine, (unsigned)n, 256, 0, (cudaStream_t)stream, x, out, row, w, k, d);
    return tn_cu_err();
}

/* x[t] += g y[t] with g = sigmoid(gw . xb[t]) (the dot product in double, as the CPU's
 * tn_blk_shexp; gw NULL: g = 1), a block of 256 per token */
__global__ void k_gate_add(float *x, const float *y, const float *xb, const float *gw, int64_t d) {
    gdc_enter();
    __shared__ double part[8];
    __shared__ float gs;
    const int64_t t = blockIdx.x;
    if (gw) {
        double s = 0;
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += (double)gw[i] * (double)xb[t * d + i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (threadIdx.x % WARP == 0) part[threadIdx.x / WARP] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
            double dot = 0;
            for (int i = 0; i < (int)blockDim.x / WARP; i++) dot += part[i];
            gs = (float)(1.0 / (1.0 + exp(-dot)));
        }
        __syncthreads();
    }
    const float g = gw ? gs : 1.0f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) x[t * d + i] += g * y[t * d + i];
}
extern "C" int tn_cu_gate_add(float *x, const float *y, const float *xb, const float *gw, int64_t n, int64_t d, void *stream) {
    if (n == 0) return 0;
    launch(k_gate_add, (unsigned)n, 256, 0, (cudaStream_t)stream, x, y, xb, gw, d);
    return tn_cu_err();
}

/* ---- mixture of experts: routing ------------------------------------------------------------------ */

/* A warp per token: tn_cu_moe_route's contract, the CPU's arithmetic (the exponentials in parallel,
 * the double sums by one lane in expert order, the top k by k warp-wide arg-maxes) */
#define MOE_ROUTE_MAX 512
/* p[e] = softmax(x)[e] (p may be x) by a warp, as ggml_soft_max: exp(x - max), summed in double by
 * lane 0 in expert order (inv_s: shared), times 1 / sum. */
__device__ __forceinline__ void route_softmax(float *p, const float *x, int ne, float *inv_s) {
    const int lane = threadIdx.x % WARP;
    float mx = -INFINITY;
    for (int e = lane; e < ne; e += WARP) mx = fmaxf(mx, x[e]);
    mx = warp_max(mx);
    for (int e = lane; e < ne; e += WARP) p[e] = expf(x[e] - mx);
    __syncwarp();
    if (lane == 0) {
        double sum = 0;
        for (int e = 0; e < ne; e++) sum += (double)p[e];
        *inv_s = (float)(1.0 / sum);
    }
    __syncwarp();
    const float inv = *inv_s;
    for (int e = lane; e < ne; e += WARP) p[e] *= inv;
}
/* The index (every lane gets it) and value *bv of the largest s[e] not yet taken (taken ones hold
 * -inf: every probability or finite logit is above it), the lower index among equals: lane-wise
 * in expert order, then across the lanes. */
__device__ __forceinline__ int route_best(const float *s, int ne, float *bv_out) {
    const int lane = threadIdx.x % WARP;
    float bv = -INFINITY;
    int bi = -1;
    for (int e = lane; e < ne; e += WARP)
        if (bi < 0 || s[e] > bv) bv = s[e], bi = e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
    *bv_out = bv;
    return bi;
}
__global__ void k_moe_route(const float *lg, const float *bias, int ne, int k, int gating, int renorm, int32_t *sel, float *w,
                            int32_t *row) {
    gdc_enter();
    __shared__ float p[MOE_ROUTE_MAX];
    __shared__ float inv_s;
    const int64_t t = blockIdx.x;
    const int lane = threadIdx.x;
    const float *l = lg + t * ne;
    for (int e = lane; e < ne; e += WARP) p[e] = bias ? l[e] + bias[e] : l[e]; /* (the router's bias: gpt-oss) */
    __syncwarp();
    if (gating != TN_CU_GATE_TOPK_SOFTMAX) route_softmax(p, p, ne, &inv_s); /* (top-k softmax: the top k of the logits themselves) */
    __syncwarp();
    float wj = 0.0f, ws = 0.0f; /* lane j < k: slot j's weight */
    for (int j = 0; j < k; j++) {
        float bv;
        const int bi = route_best(p, ne, &bv);
        if (lane == j) wj = bv;
        if (lane == 0) sel[t * k + j] = bi, row[t * k + j] = (int32_t)(t * k + j);
        __syncwarp();
        if (lane == 0) p[bi] = -INFINITY;
        __syncwarp();
    }
    if (gating == TN_CU_GATE_TOPK_SOFTMAX) { /* the softmax of the k chosen logits: exp(l - best), the double sum in slot order */
        const float best = __shfl_sync(0xffffffffu, wj, 0);
        const float ej = lane < k ? expf(wj - best) : 0.0f;
        double sum = 0;
        for (int j = 0; j < k; j++) sum += (double)__shfl_sync(0xffffffffu, ej, j);
        wj = ej * (float)(1.0 / sum);
    }
    if (renorm) { /* divided by their sum (in double, slot order), clamped below at 2^-14 */
        double sum = 0;
        for (int j = 0; j < k; j++) sum += (double)__shfl_sync(0xffffffffu, wj, j);
        ws = fmaxf((float)sum, 6.103515625e-5f);
        wj /= ws;
    }
    if (lane < k) w[t * k + lane] = wj;
}
extern "C" int tn_cu_moe_route(const float *lg, const float *bias, int64_t n, int ne, int k, int gating, int renorm, int32_t *sel,
                               float *w, int32_t *row, void *stream) {
    if (n == 0) return 0;
    if (ne < 1 || ne > MOE_ROUTE_MAX || k < 1 || k > WARP || k > ne) return (int)cudaErrorInvalidValue;
    launch(k_moe_route, (unsigned)n, WARP, 0, (cudaStream_t)stream, lg, bias, ne, k, gating, renorm, sel, w, row);
    return tn_cu_err();
}

/* DeepSeek's routing, a warp per token (the CPU's tn_moe_route_ds): p = sigmoid or softmax of the
 * logits; selection scores s = p + exp_probs_b; with groups, lane g scores group g by its two best
 * s (the lower index first among equals), lane 0 keeps the group_used best groups and the others'
 * s fall to -inf; the k best s (as k_moe_route picks them) give sel, their p the weights,
 * renormalised (double sum in slot order, clamped at 2^-14) and scaled as the CPU's. */
__global__ void k_moe_route_ds(const float *lg, int ne, int k, tn_cu_route_ds ds, int32_t *sel, float *w, int32_t *row) {
    gdc_enter();
    __shared__ float p[MOE_ROUTE_MAX], sc[MOE_ROUTE_MAX], gs[WARP];
    __shared__ int gused[WARP];
    __shared__ float inv_s;
    const int64_t t = blockIdx.x;
    const int lane = threadIdx.x;
    const float *l = lg + t * ne;
    if (ds.sigmoid) {
        for (int e = lane; e < ne; e += WARP) p[e] = 1.0f / (1.0f + expf(-l[e]));
    } else {
        route_softmax(p, l, ne, &inv_s);
    }
    __syncwarp();
    for (int e = lane; e < ne; e += WARP) sc[e] = ds.bias ? p[e] + ds.bias[e] : p[e];
    __syncwarp();
    if (ds.groups > 1) {
        const int G = ds.groups, per = ne / G;
        if (lane < G) { /* the group's two best scores (tn_moe_topk of 2) */
            const float *g = sc + lane * per;
            int b0 = 0, b1 = -1;
            for (int e = 1; e < per; e++)
                if (g[e] > g[b0]) b0 = e;
            for (int e = 0; e < per; e++)
                if (e != b0 && (b1 < 0 || g[e] > g[b1])) b1 = e;
            gs[lane] = g[b0] + g[b1];
        }
        __syncwarp();
        if (lane == 0) { /* the group_used best groups (the lower index first among equals) */
            for (int g = 0; g < G; g++) gused[g] = 0;
            for (int j = 0; j < ds.group_used; j++) {
                int best = -1;
                for (int g = 0; g < G; g++)
                    if (!gused[g] && (best < 0 || gs[g] > gs[best])) best = g;
                gused[best] = 1;
            }
        }
        __syncwarp();
        for (int e = lane; e < ne; e += WARP)
            if (!gused[e / per]) sc[e] = -INFINITY;
        __syncwarp();
    }
    float wj = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv;
        const int bi = route_best(sc, ne, &bv);
        if (lane == j) wj = p[bi];
        if (lane == 0) sel[t * k + j] = bi, row[t * k + j] = (int32_t)(t * k + j);
        __syncwarp();
        if (lane == 0) sc[bi] = -INFINITY;
        __syncwarp();
    }
    if (ds.norm) {
        double sum = 0;
        for (int j = 0; j < k; j++) sum += (double)__shfl_sync(0xffffffffu, wj, j);
        wj /= fmaxf((float)sum, 6.103515625e-5f);
    }
    if (ds.scale != 0.0f && ds.scale != 1.0f) wj *= ds.scale;
    if (lane < k) w[t * k + lane] = wj;
}
extern "C" int tn_cu_moe_route_ds(const float *lg, int64_t n, int ne, int k, const tn_cu_route_ds *ds, int32_t *sel, float *w,
                                  int32_t *row, void *stream) {
    if (n == 0) return 0;
    if (ne < 1 || ne > MOE_ROUTE_MAX || k < 1 || k > WARP || k > ne || !ds || ds->groups > WARP ||
        (ds->groups > 1 && (ne % ds->groups != 0 || ne / ds->groups < 2 || ds->group_used < 1 || ds->group_used > ds->groups ||
                            ds->group_used * (ne / ds->groups) < k)))
        return (int)cudaErrorInvalidValue;
    launch(k_moe_route_ds, (unsigned)n, WARP, 0, (cudaStream_t)stream, lg, ne, k, *ds, sel, w, row);
    return tn_cu_err();
}


/* ---- the persistent decode kernel (tn_cu_persist) ------------------------------------------------- */

#define PS_WARPS (ATT_THREADS / WARP) /* a block: the attention's 256 threads, 8 GEMV warps */
#define PS_DMAX 8192                  /* the largest n_embd whose q8 activations a block keeps in shared memory */
#define PS_MIN_BLOCKS 2               /* blocks per multiprocessor the registers allow */

/* Every thread of every block of a cooperative launch waits here until all have arrived; what any
 * wrote before is then visible to all (thread 0: a gpu-scope fence before its arrival, a gpu-scope
 * acquire load once the generation has moved, which also drops the multiprocessor's stale L1
 * lines — the pattern of cooperative groups' grid sync). bar[0] counts arrivals, bar[1] is the
 * generation the last arrival advances. */
#ifndef TN_CUDA_EMU
/* thread 0's part, not inlined: its registers are not the kernel's */
__device__ __noinline__ void grid_arrive_wait(unsigned *bar) {
    volatile unsigned *gen = bar + 1;
    const unsigned g = *gen; /* cannot advance before this block arrives */
    __threadfence();
    if (atomicAdd(bar, 1u) == gridDim.x - 1) {
        atomicExch(bar, 0u); /* no block arrives again before the release below */
        __threadfence();
        atomicAdd(bar + 1, 1u);
    } else { /* a block that never arrives (a bug, not a wait) stops the kernel after 10 s: an error, not a hang */
        uint64_t t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        while (*gen == g) {
            __nanosleep(20);
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            if (t - t0 > 10000000000ull) __trap();
        }
    }
    asm volatile("{ .reg .u32 t; ld.acquire.gpu.u32 t, [%0]; }" ::"l"(bar + 1) : "memory");
}
#endif
__device__ __forceinline__ void grid_sync(unsigned *bar) {
#ifdef TN_CUDA_EMU
    (void)bar;
    tn_emu_sync_grid();
#else
    __syncthreads();
    if (threadIdx.x == 0) grid_arrive_wait(bar);
    __syncthreads();
#endif
}

/* This block's share [*u0, *u1) of units 0 .. n - 1, contiguous, in steps of align units. */
__device__ __forceinline__ void ps_share(int64_t n, int64_t align, int64_t *u0, int64_t *u1) {
    const int64_t na = (n + align - 1) / align, per = (na + gridDim.x - 1) / gridDim.x;
    *u0 = min(n, (int64_t)blockIdx.x * per * align);
    *u1 = min(n, *u0 + per * align);
}

/* A persistent GEMV stage's row groups: gemv_code_rows' (R = 2: two rows a warp, or one gate|up
 * pair), PS_WARPS / wpr warp rows a group; a gate|up product's blocks take whole q8 blocks of 32 GLU
 * outputs, which they quantize themselves (k_persist's gate|up stage). */
struct ps_rows {
    int64_t units, upg, align; /* rows (pairs), units per group, groups per share step */
};
__device__ __forceinline__ ps_rows ps_rows_of(const tn_cw &w, int wpr, bool pair) {
    ps_rows r;
    r.upg = PS_WARPS / wpr * (pair ? 1 : 2);
    r.units = pair ? w.m / 2 : w.m;
    r.align = pair ? 32 / r.upg : 1;
    return r;
}
/* Prefetches this block's rows of w (its share as the stage that reads them will take it) into L2:
 * the first of them, at most pf / blocks bytes (pf: a share of the L2 cache), so a product larger
 * than that starts on rows in L2 and streams the rest. */
__device__ __forceinline__ void ps_prefetch(const tn_cw &w, int wpr, bool pair, int64_t pf, bool asym) {
    const int64_t nbr = w.k / w.group, unit_bytes = ((int64_t)w.row_bytes + nbr * (asym ? 4 : 2)) * (pair ? 2 : 1);
    if (!d_prefetch) return;
    const ps_rows r = ps_rows_of(w, wpr, pair);
    int64_t g0, g1;
    ps_share((r.units + r.upg - 1) / r.upg, r.align, &g0, &g1);
    const int64_t u0 = g0 * r.upg, nu = min(min(r.units, g1 * r.upg) - u0, pf / gridDim.x / unit_bytes);
    if (nu <= 0) return;
    for (int hlf = 0; hlf < (pair ? 2 : 1); hlf++) {
        const int64_t a = u0 + hlf * r.units;
        prefetch_l2((const uint8_t *)w.data + a * (int64_t)w.row_bytes, (size_t)(nu * (int64_t)w.row_bytes));
        prefetch_l2(w.d + a * nbr, (size_t)(nu * nbr * 2));
        if (asym) prefetch_l2(w.mn + a * nbr, (size_t)(nu * nbr * 2));
    }
}
/* y (+)= w x (+ bias) for this block's share of the rows; returns its first and last unit */
template <int B, int KIND, bool ASYM>
__device__ __forceinline__ void ps_gemv(const tn_cw &w, int wpr, const int8_t *xq, const float *xd, const int32_t *xs, float *y,
                                        const float *bias, int accumulate, const tn_cu_glu *gl, int64_t *u0, int64_t *u1) {
    const bool pair = gl != nullptr;
    const ps_rows r = ps_rows_of(w, wpr, pair);
    int64_t g0, g1;
    ps_share((r.units + r.upg - 1) / r.upg, r.align, &g0, &g1);
    const tn_cu_glu none = {nullptr, 0};
    for (int64_t rg = g0; rg < g1; rg++)
        gemv_code_rows<B, KIND, ASYM, 2, PS_WARPS>(w, xq, xd, xs, rg, wpr, pair, y, bias, accumulate, pair ? *gl : none);
    *u0 = g0 * r.upg, *u1 = min(r.units, g1 * r.upg);
}
/* q8 blocks b0 .. b0 + 3 (those below nb) of the values val(i), by a warp: q8_block's arithmetic
 * for four blocks at once, their shuffles interleaved (the maximum and the sum of integers are exact
 * in any order: the same bytes) */
template <typename F> __device__ __forceinline__ void q8_block4(F val, int64_t b0, int64_t nb, int lane, const tn_cq &xq) {
    float v[4], am[4], sm[4];
    int qi[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        v[j] = b0 + j < nb ? val((b0 + j) * 32 + lane) : 0.0f;
        am[j] = fabsf(v[j]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int j = 0; j < 4; j++) am[j] = fmaxf(am[j], __shfl_xor_sync(0xffffffffu, am[j], o));
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float id = am[j] != 0.0f ? 127.0f / am[j] : 0.0f;
        qi[j] = __float2int_rn(v[j] * id);
        sm[j] = (float)qi[j];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int j = 0; j < 4; j++) sm[j] += __shfl_xor_sync(0xffffffffu, sm[j], o);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (b0 + j >= nb) break;
        xq.q[(b0 + j) * 32 + lane] = (int8_t)qi[j];
        if (lane == 0) {
            xq.d[b0 + j] = __half2float(__float2half_rn(am[j] / 127.0f));
            xq.s[b0 + j] = (int32_t)sm[j];
        }
    }
}
/* rmsnorm(x) * w as q8 blocks into this block's shared memory (x written by other blocks: read
 * through L2), the arithmetic of k_rmsnorm and norm_tail, so the same bytes */
__device__ __forceinline__ void ps_norm_q8(const float *x, const float *w, int64_t d, float eps, const tn_cq &sq) {
    const float scale = rms_scale_block<true>(x, d, eps);
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    for (int64_t b0 = 4 * warp; b0 < d / 32; b0 += 4 * PS_WARPS)
        q8_block4([&](int64_t i) { return (__ldcg(x + i) * scale) * w[i]; }, b0, d / 32, lane, sq);
    __syncthreads();
}

template <int B, int KIND, bool ASYM>
__global__ void __launch_bounds__(ATT_THREADS, PS_MIN_BLOCKS) k_persist(tn_cu_persist_args a, int wq, int wo, int wg, int wd,
                                                                       int64_t pf) {
    __shared__ __align__(16) int8_t s_q[PS_DMAX];
    __shared__ float s_d[PS_DMAX / 32];
    __shared__ int32_t s_s[PS_DMAX / 32];
    const tn_cq sq = {s_q, s_d, s_s};
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int64_t d = a.d, qd = (int64_t)a.n_head * a.hd, kvd = (int64_t)a.n_head_kv * a.hd, ldq = qd + 2 * kvd;
    const tn_cu_glu gl = {a.h, a.act};
    int64_t u0, u1;
    for (int il = 0; il < a.n_layers; il++) {
        const tn_cu_player *L = a.L + il;
        /* q k v = Wqkv rmsnorm(x) (+ b): every block normalizes x itself */
        ps_prefetch(L->wo, wo, false, pf, ASYM);
        ps_norm_q8(a.x, L->attn_norm, d, a.eps, sq);
        ps_gemv<B, KIND, ASYM>(L->qkv, wq, s_q, s_d, s_s, a.q, L->bqkv, 0, nullptr, &u0, &u1);
        grid_sync(a.bar);
        /* attention, a head a block: q / k norms, RoPE and the cache store of the new row fused, as
         * one-token steps run it; the output and its q8 blocks for Wo */
        ps_prefetch(L->gu, wg, true, pf, ASYM);
        const tn_cu_rope ar = {a.q + qd, a.q + qd + kvd, ldq, L->qn, L->kn, a.eps, L->cs, L->n_rot, a.neox, a.kvrow, L->Kc, L->Vc};
        /* (a head's positions split across the blocks there are for each head) */
        const int S = a.sched.part ? max(1, (int)gridDim.x / a.n_head) : 1;
        for (int u = blockIdx.x; u < a.n_head * S; u += gridDim.x) {
            attn_unit(u / S, u % S, S, a.sched, a.q, ldq, (const uint8_t *)L->Kc, (const uint8_t *)L->Vc, a.n_head, a.n_head_kv,
                      a.hd, a.pos, a.toff, a.tbl, a.scale, a.cap, L->window, L->sinks, a.att, a.xq, ar, a.kv);
            __syncthreads();
        }
        grid_sync(a.bar);
        /* x += Wo att (+ bo) */
        ps_prefetch(L->down, wd, false, pf, ASYM);
        ps_gemv<B, KIND, ASYM>(L->wo, wo, a.xq.q, a.xq.d, a.xq.s, a.x, L->bo, 1, nullptr, &u0, &u1);
        grid_sync(a.bar);
        /* h = act(gate) up of rmsnorm(x) (every block normalizes x itself); each block quantizes the
         * whole q8 blocks of h it computed, for Wdown */
        if (il + 1 < a.n_layers) ps_prefetch(a.L[il + 1].qkv, wq, false, pf, ASYM);
        ps_norm_q8(a.x, L->ffn_norm, d, a.eps, sq);
        ps_gemv<B, KIND, ASYM>(L->gu, wg, s_q, s_d, s_s, nullptr, nullptr, 0, &gl, &u0, &u1);
        for (int64_t b = u0 / 32 + warp; b < u1 / 32; b += PS_WARPS) q8_block(a.h[b * 32 + lane], lane, b, b * 32, a.xq);
        grid_sync(a.bar);
        /* x += Wdown h */
        ps_gemv<B, KIND, ASYM>(L->down, wd, a.xq.q, a.xq.d, a.xq.s, a.x, nullptr, 1, nullptr, &u0, &u1);
        grid_sync(a.bar);
    }
    /* the output norm, by one block: xb and (a code-path output) its q8 blocks, as the last Wdown's
     * norm tail writes them */
    if (blockIdx.x != 0) return;
    const float scale = rms_scale_block<true>(a.x, d, a.eps);
    for (int64_t b = warp; b < d / 32; b += PS_WARPS) {
        const int64_t i = b * 32 + lane;
        const float v = (__ldcg(a.x + i) * scale) * a.out_norm[i];
        a.xb[i] = v;
        if (a.out_q8) q8_block(v, lane, b, b * 32, a.xq);
    }
}

template <int B, int KIND, bool ASYM>
static int launch_persist(const tn_cu_persist_args *a, const tn_cu_player *L0, int grid, cudaStream_t st) {
    void (*k)(tn_cu_persist_args, int, int, int, int, int64_t) = k_persist<B, KIND, ASYM>;
    static int per = 0; /* blocks per multiprocessor, asked once per kernel */
    if (grid <= 0) {
        if (per < 1 && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, ATT_THREADS, 0) != cudaSuccess || per < 1))
            return tn_cu_err();
        grid = min(per, PS_MIN_BLOCKS) * (g_sms > 0 ? g_sms : 1);
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3(ATT_THREADS);
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeCooperative; /* every block resident at once, or the launch fails */
    at[0].val.cooperative = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    /* half of L2 for the next product's rows, fetched while a stage runs */
    cudaLaunchKernelEx(&cfg, k, *a, gemv_wpr(&L0->qkv), gemv_wpr(&L0->wo), gemv_wpr(&L0->gu), gemv_wpr(&L0->down), (int64_t)g_l2 / 2);
    return tn_cu_err();
}

extern "C" int tn_cu_persist_check(const tn_cu_persist_args *a, const tn_cu_player *L0) {
    const tn_cw *ws[4] = {&L0->qkv, &L0->wo, &L0->gu, &L0->down};
    for (int i = 0; i < 4; i++)
        if (!tn_cw_is_code(ws[i]->kind) || ws[i]->kind != L0->qkv.kind || ws[i]->bits != L0->qkv.bits ||
            ws[i]->asym != L0->qkv.asym || ws[i]->k % 32 != 0)
            return (int)cudaErrorInvalidValue;
    if (a->n_layers < 1 || a->d % 32 != 0 || a->d > PS_DMAX || a->ff % 32 != 0 || L0->gu.m != 2 * a->ff || a->hd % 32 != 0 ||
        a->hd > ATT_THREADS || L0->qkv.k != a->d || L0->gu.k != a->d || L0->down.k != a->ff || L0->wo.m != a->d ||
        L0->down.m != a->d || L0->wo.k != (int64_t)a->n_head * a->hd || !a->bar)
        return (int)cudaErrorInvalidValue;
    const bool tq = L0->qkv.kind == TN_CW_TQ && L0->qkv.asym && L0->qkv.bits >= 1 && L0->qkv.bits <= 8;
    return tq || L0->qkv.kind == TN_CW_Q4_0 || L0->qkv.kind == TN_CW_Q8_0 || L0->qkv.kind == TN_CW_Q5_0 ? 0
                                                                                                        : (int)cudaErrorInvalidValue;
}

extern "C" int tn_cu_persist(const tn_cu_persist_args *a, const tn_cu_player *L0, int grid, void *stream) {
    const int e = tn_cu_persist_check(a, L0);
    if (e) return e;
    cudaStream_t st = (cudaStream_t)stream;
    switch (L0->qkv.kind) {
    case TN_CW_Q4_0: return launch_persist<4, 1, false>(a, L0, grid, st);
    case TN_CW_Q8_0: return launch_persist<8, 2, false>(a, L0, grid, st);
    case TN_CW_Q5_0: return launch_persist<5, 3, false>(a, L0, grid, st);
    default: break;
    }
    switch (L0->qkv.bits) {
    case 1: return launch_persist<1, 0, true>(a, L0, grid, st);
    case 2: return launch_persist<2, 0, true>(a, L0, grid, st);
    case 3: return launch_persist<3, 0, true>(a, L0, grid, st);
    case 4: return launch_persist<4, 0, true>(a, L0, grid, st);
    case 5: return launch_persist<5, 0, true>(a, L0, grid, st);
    case 6: return launch_persist<6, 0, true>(a, L0, grid, st);
    case 7: return launch_persist<7, 0, true>(a, L0, grid, st);
    case 8: return launch_persist<8, 0, true>(a, L0, grid, st);
    default: return (int)cudaErrorInvalidValue;
    }
}


__global__ void k_copy(const uint4 *src, uint4 *dst, size_t n16) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
}
extern "C" int tn_cu_copy_kernel(const void *src, void *dst, size_t n, void *stream) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
#ifndef TN_CUDA_EMU
    k_copy<<<(unsigned)(sms * 8), 512, 0, (cudaStream_t)stream>>>((const uint4 *)src, (uint4 *)dst, n / 16);
#else
    launch(k_copy, (unsigned)(sms * 8), 512, 0, (cudaStream_t)stream, (const uint4 *)src, (uint4 *)dst, n / 16);
#endif
    return tn_cu_err();
}
