/*
 * kcode.cuh — the code-path weights' device functions (kern_cuda.h's split layout: Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0 and tq<b>g<G>[a]): the planes of a width, a chunk's codes rebuilt from them,
 * the integer chunk products, the rows of a GEMV and their finishing (bias, accumulation, the GLU
 * pair). The GEMV kernels (gemv.cu), the per-channel K cache (attn.cu) and the persistent kernel
 * (kernels.cu) call the same functions, so they give the same bits.
 */
#ifndef TN_CUDA_KCODE_CUH
#define TN_CUDA_KCODE_CUH

#include "cuda/kdev.cuh"

/* Plane i's width for b bits, widest first, 0 after the last (tq.h): b = 8 | 4 | 2 | 1 | 2+1 | 4+1 |
 * 4+2 | 4+2+1. The weight kernels take it at compile time (planes<B>), the tq KV rows at run time. */
__host__ __device__ constexpr int tq_plane_width(int bits, int i) {
    const int w0 = bits >= 8 ? 8 : bits >= 4 ? 4 : bits >= 2 ? 2 : 1;
    const int r = bits - w0, w1 = r >= 2 ? 2 : r;
    return i == 0 ? w0 : i == 1 ? w1 : r - w1;
}
template <int B> struct planes {
    static constexpr int w0 = tq_plane_width(B, 0), w1 = tq_plane_width(B, 1), w2 = tq_plane_width(B, 2);
};

/* ORs the codes of one plane piece (4*W bytes at p) shifted by S into q[g] (codes 4g .. 4g+3). */
template <int W, int S> __device__ __forceinline__ void unpack_plane(const uint32_t *p, uint32_t q[8]) {
    if (W == 8) {
#pragma unroll
        for (int g = 0; g < 8; g++) q[g] = p[g];
    } else if (W == 4) { /* byte j = v[j] | v[j+16] << 4 */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t u = p[i];
            q[i] |= (u & 0x0F0F0F0Fu) << S;
            q[i + 4] |= ((u >> 4) & 0x0F0F0F0Fu) << S;
        }
    } else if (W == 2) { /* byte j = v[j] | v[j+8] << 2 | v[j+16] << 4 | v[j+24] << 6 */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t u = p[i];
#pragma unroll
            for (int s = 0; s < 4; s++) q[2 * s + i] |= ((u >> (2 * s)) & 0x03030303u) << S;
        }
    } else if (W == 1) { /* bit n = v[n]: 4 bits -> 4 bytes by one multiply */
        const uint32_t u = p[0];
#pragma unroll
        for (int g = 0; g < 8; g++) q[g] |= ((((u >> (4 * g)) & 0xFu) * 0x00204081u) & 0x01010101u) << S;
    }
}

/* The 32 codes of chunk ci of a row (codes at rowp) as bytes in q[8]. cpb = chunks per block. */
template <int B> __device__ __forceinline__ void load_chunk(const uint8_t *rowp, int64_t ci, int cpb, uint32_t q[8]) {
    constexpr int w0 = planes<B>::w0, w1 = planes<B>::w1, w2 = planes<B>::w2;
    const int64_t blk = ci / cpb;
    const int c = (int)(ci % cpb);
    const uint8_t *bp = rowp + blk * (int64_t)(4 * B * cpb);
#pragma unroll
    for (int g = 0; g < 8; g++) q[g] = 0;
    unpack_plane<w0, 0>((const uint32_t *)(bp + c * 4 * w0), q);
    if (w1) unpack_plane<w1, w0>((const uint32_t *)(bp + 4 * cpb * w0 + c * 4 * w1), q);
    if (w2) unpack_plane<w2, w0 + w1>((const uint32_t *)(bp + 4 * cpb * (w0 + w1) + c * 4 * w2), q);
}

/* The end of a token tile of the GEMV kernels: warp (row r, part p) holds per-lane partial sums
 * acc[t]; each warp reduces its own (butterfly), the parts of a row are added in part order, and
 * y[t][row] is written (+ bias, or accumulated). The same for every n: a token's result does not
 * depend on its batch. All threads of the block must call it (it synchronises). */
template <int NT>
__device__ __forceinline__ void gemv_finish(const float (&acc)[NT], int nt, int wpr, bool valid, int64_t row, int64_t t0,
                                            float *y, int64_t ldy, const float *bias, int accumulate) {
    __shared__ float red[GEMV_WARPS_MAX][TN_CU_GEMV_MAXN];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        const float v = gemv_warp_sum(acc[t]);
        if (lane == 0) red[warp][t] = v;
    }
    __syncthreads();
    if (valid && warp % wpr == 0 && lane < nt) {
        float v = red[warp][lane];
        for (int p = 1; p < wpr; p++) v += red[warp + p][lane];
        const float r = v + (bias ? bias[row] : 0.0f);
        float *yp = y + (t0 + lane) * ldy + row;
        *yp = accumulate ? *yp + r : r;
    }
    __syncthreads();
}

/* The rows of a GEMV block: row groups [*rg0, *rg1) of rpb rows each, contiguous, so that the
 * block's weights are one range of bytes (prefetched before the wait). A grid of fewer blocks than
 * row groups (tn_cu_configure's blocks per SM) walks them in turn; a row's arithmetic is the same
 * whichever block and pass computes it. */
__device__ __forceinline__ void gemv_rows(int64_t m, int rpb, int64_t *rg0, int64_t *rg1) {
    const int64_t nrg = (m + rpb - 1) / rpb, per = (nrg + gridDim.x - 1) / gridDim.x;
    *rg0 = min(nrg, (int64_t)blockIdx.x * per);
    *rg1 = min(nrg, *rg0 + per);
}

/* acc + da * (one chunk's dot product: d sq - off d sa, d sq + m sa (asymmetric) or d sq (q8_0))
 * in explicitly rounded operations: the compiler may not contract them differently in different
 * kernels, so every GEMV variant (token tiles, one token, two rows per warp) gives the same bits. */
template <int KIND, bool ASYM>
__device__ __forceinline__ float chunk_acc_f(float acc, float da, float d, float m, float fq, float sa, float off) {
    if (KIND == 2) return __fmaf_rn(__fmul_rn(da, d), fq, acc);
    if (ASYM) return __fmaf_rn(da, __fmaf_rn(d, fq, __fmul_rn(m, sa)), acc);
    return __fmaf_rn(__fmul_rn(da, d), __fmaf_rn(-off, sa, fq), acc);
}
template <int KIND, bool ASYM>
__device__ __forceinline__ float chunk_acc(float acc, float da, float d, float m, int sq, float sa, float off) {
    return chunk_acc_f<KIND, ASYM>(acc, da, d, m, (float)sq, sa, off);
}

/* The end of a one-token step of a GEMV warp that computed R rows at once (k_gemv_code with R > 1):
 * row0 + r for r < R, each reduced exactly as gemv_finish reduces a token (the warp's butterfly,
 * then the parts of the row in part order), so its bits are those of the row computed alone. */
template <int R, int NW = GEMV_WARPS_MAX>
__device__ __forceinline__ void gemv_finish_rows(const float (&acc)[R], int wpr, int64_t row0, int64_t m, float *y,
                                                 const float *bias, int accumulate) {
    __shared__ float red[NW][R];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = gemv_warp_sum(acc[r]);
        if (lane == 0) red[warp][r] = v;
    }
    __syncthreads();
    if (warp % wpr == 0 && lane < R && row0 + lane < m) {
        float v = red[warp][lane];
        for (int p = 1; p < wpr; p++) v += red[warp + p][lane];
        const float r = v + (bias ? bias[row0 + lane] : 0.0f);
        float *yp = y + row0 + lane;
        *yp = accumulate ? *yp + r : r;
    }
    __syncthreads();
}

/* act(g) * u as the CPU's references write it: silu (TN_CU_SILU) g / (1 + exp(-g)) * u, or Gemma's
 * tanh GELU (TN_CU_GELU) 0.5 g (1 + tanh(sqrt(2/pi) g (1 + 0.044715 g^2))) u */
__device__ __forceinline__ float glu(float g, float u, int act) {
    if (act == TN_CU_GELU) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * g * (1.0f + 0.044715f * g * g))) * u;
    if (act == TN_CU_SWIGLU_OAI) { /* gpt-oss: as tn_op_swiglu_oai (alpha 1.702, limit 7) */
        const float x = fminf(g, 7.0f), y = fmaxf(-7.0f, fminf(u, 7.0f));
        return x / (1.0f + expf(1.702f * (-x))) * (y + 1.0f);
    }
    return g / (1.0f + expf(-g)) * u;
}

/* The end of a one-token step of a GEMV warp that computed the gate row i and the up row i + m/2 of
 * a gate|up matrix (tn_cu_glu): both reduced as gemv_finish_rows reduces a row (+ 0.0f for the
 * absent bias), then h[i] = act(gate) * up as k_swiglu_pair computes it — the same bits. */
template <int NW = GEMV_WARPS_MAX>
__device__ __forceinline__ void gemv_finish_glu(const float (&acc)[2], int wpr, int64_t i, int64_t half, tn_cu_glu gl) {
    __shared__ float red[NW][2];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float v = gemv_warp_sum(acc[r]);
        if (lane == 0) red[warp][r] = v;
    }
    __syncthreads();
    if (warp % wpr == 0 && lane == 0 && i < half) {
        float g = red[warp][0], u = red[warp][1];
        for (int p = 1; p < wpr; p++) g += red[warp + p][0], u += red[warp + p][1];
        gl.h[i] = glu(g + 0.0f, u + 0.0f, gl.act);
    }
    __syncthreads();
}

/* One row group rg of a one-token GEMV whose warps take R rows at once (k_gemv_code with R > 1, and
 * the persistent kernel's stages): a block of NW warps, wpr warps a row; warp row row0 is R
 * consecutive rows, or (pair) the gate|up pair (row0, row0 + m/2) whose GLU it writes to gl.h. xq,
 * xd, xs: the token's q8 activations (device or shared memory). Every caller computes a row with the
 * same operations in the same order, so the same bits. */
template <int B, int KIND, bool ASYM, int R, int NW>
__device__ __forceinline__ void gemv_code_rows(const tn_cw &w, const int8_t *xq, const float *xd, const int32_t *xs, int64_t rg,
                                               int wpr, bool pair, float *y, const float *bias, int accumulate,
                                               const tn_cu_glu &gl) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, part = warp % wpr;
    const int64_t nc = w.k / 32, nbr = w.k / w.group, half = w.m / 2;
    const int cpb = w.group / 32;
    const float off = KIND == 1 ? 8.0f : KIND == 3 ? 16.0f : (float)((1 << B) - 1) * 0.5f;
    const int64_t row0 = (rg * (NW / wpr) + warp / wpr) * (pair ? 1 : R);
    const int64_t rstep = pair ? half : 1, lim = pair ? half : w.m;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int64_t ci = lane + (int64_t)WARP * part; row0 < lim && ci < nc; ci += (int64_t)WARP * wpr) {
        uint32_t q[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int64_t row = row0 + r * rstep < w.m ? row0 + r * rstep : row0;
            load_chunk<B>((const uint8_t *)w.data + row * (int64_t)w.row_bytes, ci, cpb, q[r]);
        }
        const int4 *a4 = (const int4 *)(xq + ci * 32);
        const int4 a0 = a4[0], a1 = a4[1];
        const int a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float da = xd[ci];
        const float sa = (float)xs[ci];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int64_t row = row0 + r * rstep < w.m ? row0 + r * rstep : row0;
            const float d = h2f(w.d[row * nbr + ci / cpb]);
            const float m = ASYM ? h2f(w.mn[row * nbr + ci / cpb]) : 0.0f;
            int sq = 0;
            if (KIND == 2) {
#pragma unroll
                for (int g = 0; g < 8; g++) sq = __dp4a((int)q[r][g], a[g], sq);
            } else {
#pragma unroll
                for (int g = 0; g < 8; g++) sq = dp4a_us(q[r][g], a[g], sq);
            }
            acc[r] = chunk_acc<KIND, ASYM>(acc[r], da, d, m, sq, sa, off);
        }
    }
    if constexpr (R == 2) {
        if (pair) {
            gemv_finish_glu<NW>(acc, wpr, row0, half, gl);
            return;
        }
    }
    gemv_finish_rows<R, NW>(acc, wpr, row0, w.m, y, bias, accumulate);
}

/* Warps per row: rows with many chunks in matrices of few rows are split across 2 or 4 warps, so
 * that the launch has enough warps and each enough loads in flight; a function of the shape only
 * (the GEMV launches and the persistent kernel's stages). */
static inline int gemv_wpr(const tn_cw *w) {
    const int64_t units = w->k / 256; /* chunks of 256 elements: one pass of a warp */
    if (w->m <= 4096 && units >= 16) return 4;
    if (w->m <= 8192 && units >= 8) return 2;
    return 1;
}

#endif
