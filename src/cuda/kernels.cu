/*
 * kernels.cu — tern's CUDA kernels (launchers in kern_cuda.h). The CPU's scalar kernels are the
 * oracle of every kernel here (tests/cuda/test_cuda.c).
 *
 * Decode GEMV, code path: one template over the tq widths (Tilus's point: any width from one
 * description of the planes, not a kernel per width by hand). A warp computes one row; each lane
 * takes one 32-code chunk at a time, rebuilds its codes as 8 words of 4 bytes from the chunk's
 * planes (shifts and masks, a multiply for the 1-bit plane) and multiplies them with the int8
 * activations by dp4a; up to TN_CU_GEMV_MAXN tokens share each weight load.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/kern_cuda.h"

#define WARP 32
#define GEMV_WARPS_MAX 4 /* warps per GEMV block */

static inline int tn_cu_err(void) { return (int)cudaGetLastError(); }

/* Programmatic dependent launch (Hopper and later, tn_cu_set_pdl): each kernel may be launched
 * while the one before it on the stream is still running; it waits (gdc_wait, its first
 * statement) until that one has finished and its writes are visible, and lets the next one launch
 * at once. What it hides is the launch and ramp-up of every kernel of a decode step. */
static bool g_pdl = false;
extern "C" void tn_cu_set_pdl(int on) { g_pdl = on != 0; }

template <typename... KArgs, typename... Args>
static void launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t shmem, cudaStream_t st, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = shmem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = g_pdl ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k, ((KArgs)args)...);
}

__device__ __forceinline__ void gdc_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* unsigned bytes of a times signed bytes of b, summed into c */
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

/* ---- activations ------------------------------------------------------------------------------ */

/* one warp per block of 32, as the CPU's activation quantizer (quant_act.c, ggml's x86 path):
 * d = amax/127 (fp16-rounded for the product, as q8_0 stores it), q = x * (127/amax) rounded half
 * to even */
__global__ void k_quantize_q8(const float *x, int64_t ldx, int64_t k, int64_t n, int8_t *q, float *dd, int32_t *ss) {
    gdc_wait();
    const int64_t nb = k / 32, blk = (int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (blk >= nb * n) return;
    const int64_t t = blk / nb, b = blk % nb;
    const float v = x[t * ldx + b * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int qi = __float2int_rn(v * id); /* half to even */
    q[t * k + b * 32 + lane] = (int8_t)qi;
    float s = warp_sum((float)qi);
    if (lane == 0) {
        dd[blk] = __half2float(__float2half_rn(d));
        ss[blk] = (int32_t)s;
    }
}

/* 8 floats to out[o .. o+8) as fp16 (one 16-byte store; o % 8 == 0) or f32 */
__device__ __forceinline__ void store8(void *out, int64_t o, const float v[8], int f16) {
    if (f16) {
        __half2 h[4];
#pragma unroll
        for (int i = 0; i < 4; i++) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
        *(uint4 *)((__half *)out + o) = *(const uint4 *)h;
    } else {
        float4 *p = (float4 *)((float *)out + o);
        p[0] = make_float4(v[0], v[1], v[2], v[3]);
        p[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
}

/* ---- code-path weights -------------------------------------------------------------------------- */

/* Plane widths of b bits, widest first (tq.h): b = 8 | 4 | 2 | 1 | 2+1 | 4+1 | 4+2 | 4+2+1 */
template <int B> struct planes;
template <> struct planes<1> { static constexpr int w0 = 1, w1 = 0, w2 = 0; };
template <> struct planes<2> { static constexpr int w0 = 2, w1 = 0, w2 = 0; };
template <> struct planes<3> { static constexpr int w0 = 2, w1 = 1, w2 = 0; };
template <> struct planes<4> { static constexpr int w0 = 4, w1 = 0, w2 = 0; };
template <> struct planes<5> { static constexpr int w0 = 4, w1 = 1, w2 = 0; };
template <> struct planes<6> { static constexpr int w0 = 4, w1 = 2, w2 = 0; };
template <> struct planes<7> { static constexpr int w0 = 4, w1 = 2, w2 = 1; };
template <> struct planes<8> { static constexpr int w0 = 8, w1 = 0, w2 = 0; };

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
__device__ __forceinline__ void gemv_finish(float acc[TN_CU_GEMV_MAXN], int nt, int wpr, bool valid, int64_t row,
                                            int64_t t0, float *y, int64_t ldy, const float *bias, int accumulate) {
    __shared__ float red[GEMV_WARPS_MAX][TN_CU_GEMV_MAXN];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
#pragma unroll
    for (int t = 0; t < TN_CU_GEMV_MAXN; t++) {
        if (t >= nt) break;
        const float v = warp_sum(acc[t]);
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

/* KIND: 0 tq (unsigned codes; sym offset (2^B-1)/2 or asym m), 1 q4_0 (offset 8), 2 q8_0 (signed),
 * 3 q5_0 (offset 16). Any number of tokens, in tiles of TN_CU_GEMV_MAXN: every output is the same
 * sequence of operations whatever n is (lane partial sums over chunks lane, lane+32, .., then the
 * warp's butterfly), so a token's result does not depend on the batch it came in (tern serve's
 * batches equal one-at-a-time decoding). A tile after the first finds the row in L1/L2. */
template <int B, int KIND, bool ASYM>
__global__ void k_gemv_code(tn_cw w, const int8_t *xq, const float *xd, const int32_t *xs, int n, float *y, int64_t ldy,
                            const float *bias, int accumulate, int wpr) {
    gdc_wait();
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, part = warp % wpr;
    const int64_t row = (int64_t)blockIdx.x * (GEMV_WARPS_MAX / wpr) + warp / wpr;
    const bool valid = row < w.m;
    const int64_t nc = w.k / 32, nbr = w.k / w.group;
    const int cpb = w.group / 32;
    const uint8_t *rowp = (const uint8_t *)w.data + (valid ? row : 0) * (int64_t)w.row_bytes;
    const uint16_t *dr = w.d + (valid ? row : 0) * nbr, *mr = ASYM ? w.mn + (valid ? row : 0) * nbr : nullptr;
    const float off = KIND == 1 ? 8.0f : KIND == 3 ? 16.0f : (float)((1 << B) - 1) * 0.5f;
    for (int t0 = 0; t0 < n; t0 += TN_CU_GEMV_MAXN) {
        const int nt = min(TN_CU_GEMV_MAXN, n - t0);
        float acc[TN_CU_GEMV_MAXN];
#pragma unroll
        for (int t = 0; t < TN_CU_GEMV_MAXN; t++) acc[t] = 0.0f;
        for (int64_t ci = lane + (int64_t)WARP * part; valid && ci < nc; ci += (int64_t)WARP * wpr) {
            uint32_t q[8];
            load_chunk<B>(rowp, ci, cpb, q);
            const float d = h2f(dr[ci / cpb]);
            const float m = ASYM ? h2f(mr[ci / cpb]) : 0.0f;
#pragma unroll
            for (int t = 0; t < TN_CU_GEMV_MAXN; t++) {
                if (t >= nt) break;
                const int64_t tt = t0 + t;
                const int4 *a4 = (const int4 *)(xq + tt * w.k + ci * 32);
                const int4 a0 = a4[0], a1 = a4[1];
                const int a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                int sq = 0;
                if (KIND == 2) {
#pragma unroll
                    for (int g = 0; g < 8; g++) sq = __dp4a((int)q[g], a[g], sq);
                } else {
#pragma unroll
                    for (int g = 0; g < 8; g++) sq = dp4a_us(q[g], a[g], sq);
                }
                const float da = xd[tt * nc + ci];
                const float sa = (float)xs[tt * nc + ci];
                if (KIND == 2) acc[t] += da * d * (float)sq;
                else if (ASYM) acc[t] += da * (d * (float)sq + m * sa);
                else acc[t] += da * d * ((float)sq - off * sa);
            }
        }
        gemv_finish(acc, nt, wpr, valid, row, t0, y, ldy, bias, accumulate);
    }
}
template <int B, int KIND, bool ASYM>
__global__ void k_dequant_code(tn_cw w, int64_t r0, int64_t nr, void *out, int f16) {
    gdc_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* one chunk per thread */
    const int64_t nc = w.k / 32;
    if (i >= nr * nc) return;
    const int64_t row = r0 + i / nc, ci = i % nc;
    const int cpb = w.group / 32;
    uint32_t q[8];
    load_chunk<B>((const uint8_t *)w.data + row * (int64_t)w.row_bytes, ci, cpb, q);
    const int64_t nbr = w.k / w.group;
    const float d = h2f(w.d[row * nbr + ci / cpb]);
    const float m = ASYM        ? h2f(w.mn[row * nbr + ci / cpb])
                    : KIND == 1 ? -8.0f * d
                    : KIND == 3 ? -16.0f * d
                    : KIND == 2 ? 0.0f
                                : -d * (float)((1 << B) - 1) * 0.5f;
    const int64_t o = (i / nc) * w.k + ci * 32;
#pragma unroll
    for (int g2 = 0; g2 < 4; g2++) {
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint32_t byte = (q[2 * g2 + j / 4] >> (8 * (j % 4))) & 0xFFu;
            v[j] = KIND == 2 ? d * (float)(int8_t)byte : d * (float)byte + m;
        }
        store8(out, o + 8 * g2, v, f16);
    }
}

/* ---- float-path weights ---------------------------------------------------------------------- */

/* Scale and min of sub-block j of a q4_K / q5_K block (6-bit fields packed in 12 bytes: ggml's
 * get_scale_min_k4). */
__device__ __forceinline__ void kq_scale_min(const uint8_t *sc, int j, int *s, int *m) {
    if (j < 4) *s = sc[j] & 63, *m = sc[j + 4] & 63;
    else *s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
}

/* Elements e0 .. e0+7 (e0 % 8 == 0) of a row of the file type, as floats. */
template <int KIND> __device__ __forceinline__ void load8(const uint8_t *rowp, int64_t e0, float v[8]) {
    if (KIND == TN_CW_F32) {
        const float4 *p = (const float4 *)(rowp + e0 * 4);
        const float4 a = p[0], b = p[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else if (KIND == TN_CW_F16) {
        const uint4 u = *(const uint4 *)(rowp + e0 * 2);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) v[2 * i] = h2f((uint16_t)(w[i] & 0xFFFF)), v[2 * i + 1] = h2f((uint16_t)(w[i] >> 16));
    } else if (KIND == TN_CW_BF16) {
        const uint4 u = *(const uint4 *)(rowp + e0 * 2);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    } else if (KIND == TN_CW_Q4_K) { /* 144-byte blocks of 256: d, dmin, scales[12], qs[128] */
        const uint8_t *b = rowp + (e0 / 256) * 144;
        const int e = (int)(e0 % 256), j = e / 32;
        const float d = h2f(*(const uint16_t *)b), dmin = h2f(*(const uint16_t *)(b + 2));
        int s, mm;
        kq_scale_min(b + 4, j, &s, &mm);
        const uint2 u = *(const uint2 *)(b + 16 + 32 * (j / 2) + (e % 32));
        const uint32_t w[2] = {u.x, u.y};
        const float a = d * (float)s, c = dmin * (float)mm;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t byte = (w[i / 4] >> (8 * (i % 4))) & 0xFFu;
            v[i] = a * (float)((j & 1) ? byte >> 4 : byte & 0xF) - c;
        }
    } else if (KIND == TN_CW_Q5_K) { /* 176-byte blocks of 256: d, dmin, scales[12], qh[32], qs[128] */
        const uint8_t *b = rowp + (e0 / 256) * 176;
        const int e = (int)(e0 % 256), j = e / 32;
        const float d = h2f(*(const uint16_t *)b), dmin = h2f(*(const uint16_t *)(b + 2));
        int s, mm;
        kq_scale_min(b + 4, j, &s, &mm);
        const uint2 u = *(const uint2 *)(b + 48 + 32 * (j / 2) + (e % 32));
        const uint2 h = *(const uint2 *)(b + 16 + (e % 32));
        const uint32_t w[2] = {u.x, u.y}, hw[2] = {h.x, h.y};
        const float a = d * (float)s, c = dmin * (float)mm;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t byte = (w[i / 4] >> (8 * (i % 4))) & 0xFFu, hb = (hw[i / 4] >> (8 * (i % 4))) & 0xFFu;
            const uint32_t q = ((j & 1) ? byte >> 4 : byte & 0xF) | (((hb >> j) & 1u) << 4);
            v[i] = a * (float)q - c;
        }
    } else if (KIND == TN_CW_Q6_K) { /* blocks padded to 224 bytes at upload: ql[128], qh[64], scales[16], d */
        const uint8_t *b = rowp + (e0 / 256) * TN_CU_Q6K_STRIDE;
        const int e = (int)(e0 % 256), h = e / 128, ep = e % 128, qd = ep / 32, l0 = ep % 32;
        const uint2 lq = *(const uint2 *)(b + 64 * h + ((qd & 1) ? 32 : 0) + l0);
        const uint2 hq = *(const uint2 *)(b + 128 + 32 * h + l0);
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h;
        const float d = h2f(*(const uint16_t *)(b + 208));
        const float ds = d * (float)sc[l0 / 16 + 2 * qd]; /* l0 .. l0+7 share a scale (16 apart) */
        const uint32_t lw[2] = {lq.x, lq.y}, hw[2] = {hq.x, hq.y};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t lo = (lw[i / 4] >> (8 * (i % 4))) & 0xFFu, hi = (hw[i / 4] >> (8 * (i % 4))) & 0xFFu;
            const int q = (int)(((qd < 2 ? lo & 0xF : lo >> 4) | (((hi >> (2 * qd)) & 3u) << 4))) - 32;
            v[i] = ds * (float)q;
        }
    }
}

template <int KIND>
__global__ void k_gemv_float(tn_cw w, const float *x, int64_t ldx, int n, float *y, int64_t ldy, const float *bias,
                             int accumulate, int wpr) {
    gdc_wait();
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, part = warp % wpr;
    const int64_t row = (int64_t)blockIdx.x * (GEMV_WARPS_MAX / wpr) + warp / wpr;
    const bool valid = row < w.m;
    const uint8_t *rowp = (const uint8_t *)w.data + (valid ? row : 0) * (int64_t)w.row_bytes;
    for (int t0 = 0; t0 < n; t0 += TN_CU_GEMV_MAXN) { /* token tiles, as k_gemv_code */
        const int nt = min(TN_CU_GEMV_MAXN, n - t0);
        float acc[TN_CU_GEMV_MAXN];
#pragma unroll
        for (int t = 0; t < TN_CU_GEMV_MAXN; t++) acc[t] = 0.0f;
        for (int64_t e0 = ((int64_t)lane + (int64_t)WARP * part) * 8; valid && e0 < w.k; e0 += (int64_t)WARP * wpr * 8) {
            float v[8];
            load8<KIND>(rowp, e0, v);
#pragma unroll
            for (int t = 0; t < TN_CU_GEMV_MAXN; t++) {
                if (t >= nt) break;
                const float4 *xp = (const float4 *)(x + (int64_t)(t0 + t) * ldx + e0);
                const float4 a = xp[0], b = xp[1];
                acc[t] += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y + v[6] * b.z + v[7] * b.w;
            }
        }
        gemv_finish(acc, nt, wpr, valid, row, t0, y, ldy, bias, accumulate);
    }
}
template <int KIND> __global__ void k_dequant_float(tn_cw w, int64_t r0, int64_t nr, void *out, int f16) {
    gdc_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* 8 elements per thread */
    const int64_t n8 = w.k / 8;
    if (i >= nr * n8) return;
    const int64_t row = r0 + i / n8, e0 = (i % n8) * 8;
    float v[8];
    load8<KIND>((const uint8_t *)w.data + row * (int64_t)w.row_bytes, e0, v);
    store8(out, (i / n8) * w.k + e0, v, f16);
}

/* Plain types whose rows are not whole groups of 8 (stories260K's n_ff = 172): element by element. */
template <int KIND> __device__ __forceinline__ float load1(const uint8_t *rowp, int64_t e) {
    if (KIND == TN_CW_F32) return ((const float *)rowp)[e];
    if (KIND == TN_CW_F16) return h2f(((const uint16_t *)rowp)[e]);
    return __uint_as_float((uint32_t)((const uint16_t *)rowp)[e] << 16);
}
template <int KIND>
__global__ void k_gemv_plain1(tn_cw w, const float *x, int64_t ldx, int n, float *y, int64_t ldy, const float *bias,
                              int accumulate) {
    gdc_wait();
    const int64_t row = (int64_t)blockIdx.x * GEMV_WARPS_MAX + threadIdx.x / WARP;
    const bool valid = row < w.m;
    const int lane = threadIdx.x % WARP;
    const uint8_t *rowp = (const uint8_t *)w.data + (valid ? row : 0) * (int64_t)w.row_bytes;
    for (int t0 = 0; t0 < n; t0 += TN_CU_GEMV_MAXN) {
        const int nt = min(TN_CU_GEMV_MAXN, n - t0);
        float acc[TN_CU_GEMV_MAXN];
#pragma unroll
        for (int t = 0; t < TN_CU_GEMV_MAXN; t++) acc[t] = 0.0f;
        for (int64_t e = lane; valid && e < w.k; e += WARP) {
            const float v = load1<KIND>(rowp, e);
#pragma unroll
            for (int t = 0; t < TN_CU_GEMV_MAXN; t++) {
                if (t >= nt) break;
                acc[t] += v * x[(int64_t)(t0 + t) * ldx + e];
            }
        }
        gemv_finish(acc, nt, 1, valid, row, t0, y, ldy, bias, accumulate);
    }
}
template <int KIND> __global__ void k_dequant_plain1(tn_cw w, int64_t r0, int64_t nr, void *out, int f16) {
    gdc_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nr * w.k) return;
    const float v = load1<KIND>((const uint8_t *)w.data + (r0 + i / w.k) * (int64_t)w.row_bytes, i % w.k);
    if (f16) ((__half *)out)[i] = __float2half_rn(v);
    else ((float *)out)[i] = v;
}

/* ---- dispatch ----------------------------------------------------------------------------------- */


/* Warps per row: rows with many chunks in matrices of few rows are split across 2 or 4 warps, so
 * that the launch has enough warps and each enough loads in flight; a function of the shape only. */
static int gemv_wpr(const tn_cw *w) {
    const int64_t units = w->k / 256; /* chunks of 256 elements: one pass of a warp */
    if (w->m <= 4096 && units >= 16) return 4;
    if (w->m <= 8192 && units >= 8) return 2;
    return 1;
}

template <int B, bool ASYM> static void launch_gemv_tq(const tn_cw *w, const tn_cq *xq, int n, float *y, int64_t ldy,
                                                     const float *bias, int acc, cudaStream_t st) {
    const int wpr = gemv_wpr(w);
    const unsigned rpb = (unsigned)(GEMV_WARPS_MAX / wpr), grid = (unsigned)((w->m + rpb - 1) / rpb);
    launch(k_gemv_code<B, 0, ASYM>, grid, GEMV_WARPS_MAX * WARP, 0, st, *w, xq->q, xq->d, xq->s, n, y, ldy, bias, acc, wpr);
}
template <int B, bool ASYM> static void launch_dq_tq(const tn_cw *w, int64_t r0, int64_t nr, void *out, int f16,
                                                   cudaStream_t st) {
    const int64_t nthr = nr * (w->k / 32);
    launch(k_dequant_code<B, 0, ASYM>, (unsigned)((nthr + 255) / 256), 256, 0, st, *w, r0, nr, out, f16);
}

#define TQ_SWITCH(FN, ...)                                                                                          \
    switch (w->bits * 2 + (w->asym ? 1 : 0)) {                                                                     \
    case 2: FN<1, false>(__VA_ARGS__); break; case 3: FN<1, true>(__VA_ARGS__); break;                            \
    case 4: FN<2, false>(__VA_ARGS__); break; case 5: FN<2, true>(__VA_ARGS__); break;                            \
    case 6: FN<3, false>(__VA_ARGS__); break; case 7: FN<3, true>(__VA_ARGS__); break;                            \
    case 8: FN<4, false>(__VA_ARGS__); break; case 9: FN<4, true>(__VA_ARGS__); break;                            \
    case 10: FN<5, false>(__VA_ARGS__); break; case 11: FN<5, true>(__VA_ARGS__); break;                          \
    case 12: FN<6, false>(__VA_ARGS__); break; case 13: FN<6, true>(__VA_ARGS__); break;                          \
    case 14: FN<7, false>(__VA_ARGS__); break; case 15: FN<7, true>(__VA_ARGS__); break;                          \
    case 16: FN<8, false>(__VA_ARGS__); break; case 17: FN<8, true>(__VA_ARGS__); break;                          \
    default: return (int)cudaErrorInvalidValue;                                                                    \
    }

extern "C" int tn_cu_quantize_q8(const float *x, int64_t ldx, int64_t k, int64_t n, tn_cq out, void *stream) {
    const int64_t nblk = n * (k / 32);
    if (nblk == 0) return 0;
    launch(k_quantize_q8, (unsigned)((nblk + 7) / 8), 8 * WARP, 0, (cudaStream_t)stream, x, ldx, k, n, out.q, out.d, out.s);
    return tn_cu_err();
}

extern "C" int tn_cu_gemv(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, int64_t n, float *y, int64_t ldy,
                          const float *bias, int accumulate, void *stream) {
    if (n < 1 || n > (1 << 24)) return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
    const int wpr = gemv_wpr(w);
    const unsigned rpb = (unsigned)(GEMV_WARPS_MAX / wpr), blk = GEMV_WARPS_MAX * WARP;
    const unsigned grid = (unsigned)((w->m + rpb - 1) / rpb), grid1 = (unsigned)((w->m + GEMV_WARPS_MAX - 1) / GEMV_WARPS_MAX);
    const int nn = (int)n;
    const bool plain1 = w->k % 8 != 0 || ldx % 4 != 0 || ((uintptr_t)x & 15) != 0;
    if (plain1 && w->kind <= TN_CW_BF16) {
        if (w->kind == TN_CW_F32) launch(k_gemv_plain1<TN_CW_F32>, grid1, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate);
        if (w->kind == TN_CW_F16) launch(k_gemv_plain1<TN_CW_F16>, grid1, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate);
        if (w->kind == TN_CW_BF16) launch(k_gemv_plain1<TN_CW_BF16>, grid1, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate);
        return tn_cu_err();
    }
    switch (w->kind) {
    case TN_CW_F32: launch(k_gemv_float<TN_CW_F32>, grid, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate, wpr); break;
    case TN_CW_F16: launch(k_gemv_float<TN_CW_F16>, grid, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate, wpr); break;
    case TN_CW_BF16: launch(k_gemv_float<TN_CW_BF16>, grid, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate, wpr); break;
    case TN_CW_Q4_K: launch(k_gemv_float<TN_CW_Q4_K>, grid, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate, wpr); break;
    case TN_CW_Q6_K: launch(k_gemv_float<TN_CW_Q6_K>, grid, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate, wpr); break;
    case TN_CW_Q5_K: launch(k_gemv_float<TN_CW_Q5_K>, grid, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate, wpr); break;
    case TN_CW_Q4_0:
        launch(k_gemv_code<4, 1, false>, grid, blk, 0, st, *w, xq->q, xq->d, xq->s, nn, y, ldy, bias, accumulate, wpr);
        break;
    case TN_CW_Q8_0:
        launch(k_gemv_code<8, 2, false>, grid, blk, 0, st, *w, xq->q, xq->d, xq->s, nn, y, ldy, bias, accumulate, wpr);
        break;
    case TN_CW_Q5_0:
        launch(k_gemv_code<5, 3, false>, grid, blk, 0, st, *w, xq->q, xq->d, xq->s, nn, y, ldy, bias, accumulate, wpr);
        break;
    case TN_CW_TQ: TQ_SWITCH(launch_gemv_tq, w, xq, nn, y, ldy, bias, accumulate, st); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return tn_cu_err();
}

static int dequant(const tn_cw *w, int64_t r0, int64_t nr, void *out, int f16, cudaStream_t st) {
    if (nr <= 0) return 0;
    const int64_t n8 = nr * (w->k / 8), nc = nr * (w->k / 32);
    const unsigned gf = (unsigned)((n8 + 255) / 256), gc = (unsigned)((nc + 255) / 256);
    if (w->k % 8 != 0 && w->kind <= TN_CW_BF16) {
        const unsigned g1 = (unsigned)((nr * w->k + 255) / 256);
        if (w->kind == TN_CW_F32) launch(k_dequant_plain1<TN_CW_F32>, g1, 256, 0, st, *w, r0, nr, out, f16);
        if (w->kind == TN_CW_F16) launch(k_dequant_plain1<TN_CW_F16>, g1, 256, 0, st, *w, r0, nr, out, f16);
        if (w->kind == TN_CW_BF16) launch(k_dequant_plain1<TN_CW_BF16>, g1, 256, 0, st, *w, r0, nr, out, f16);
        return tn_cu_err();
    }
    switch (w->kind) {
    case TN_CW_F32: launch(k_dequant_float<TN_CW_F32>, gf, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_F16: launch(k_dequant_float<TN_CW_F16>, gf, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_BF16: launch(k_dequant_float<TN_CW_BF16>, gf, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_Q4_K: launch(k_dequant_float<TN_CW_Q4_K>, gf, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_Q6_K: launch(k_dequant_float<TN_CW_Q6_K>, gf, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_Q4_0: launch(k_dequant_code<4, 1, false>, gc, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_Q8_0: launch(k_dequant_code<8, 2, false>, gc, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_Q5_0: launch(k_dequant_code<5, 3, false>, gc, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_Q5_K: launch(k_dequant_float<TN_CW_Q5_K>, gf, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_TQ: TQ_SWITCH(launch_dq_tq, w, r0, nr, out, f16, st); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return tn_cu_err();
}

extern "C" int tn_cu_dequant_f16(const tn_cw *w, int64_t r0, int64_t nr, uint16_t *out, void *stream) {
    return dequant(w, r0, nr, out, 1, (cudaStream_t)stream);
}
extern "C" int tn_cu_dequant_f32(const tn_cw *w, int64_t r0, int64_t nr, float *out, void *stream) {
    return dequant(w, r0, nr, out, 0, (cudaStream_t)stream);
}

__global__ void k_f32_to_f16(const float *x, int64_t ldx, int64_t k, int64_t n, __half *out) {
    gdc_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * k) return;
    out[i] = __float2half_rn(x[(i / k) * ldx + i % k]);
}
extern "C" int tn_cu_f32_to_f16(const float *x, int64_t ldx, int64_t k, int64_t n, uint16_t *out, void *stream) {
    if (n * k == 0) return 0;
    launch(k_f32_to_f16, (unsigned)((n * k + 255) / 256), 256, 0, (cudaStream_t)stream, x, ldx, k, n, (__half *)out);
    return tn_cu_err();
}

/* ---- norms, RoPE, attention, activations --------------------------------------------------------- */

/* the q8 block of 32 values v (one per lane) at block index blk: as k_quantize_q8 */
__device__ __forceinline__ void q8_block(float v, int lane, int64_t blk, int64_t qi0, tn_cq xq) {
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int qi = __float2int_rn(v * id);
    xq.q[qi0 + lane] = (int8_t)qi;
    const float s = warp_sum((float)qi);
    if (lane == 0) {
        xq.d[blk] = __half2float(__float2half_rn(d));
        xq.s[blk] = (int32_t)s;
    }
}

/* y[j] = rmsnorm(x row) * w; with xq.q != NULL also y[j] quantized to q8 blocks (d % 32 == 0) */
__global__ void k_rmsnorm(const float *x, const int32_t *rows, float *y, const float *w, int64_t d, float eps, tn_cq xq) {
    gdc_wait();
    const int64_t j = blockIdx.x;
    const float *xr = x + (rows ? (int64_t)rows[j] : j) * d;
    __shared__ double part[32];
    double s = 0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += (double)(xr[i] * xr[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % WARP == 0) part[threadIdx.x / WARP] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (unsigned i = 0; i < blockDim.x / WARP; i++) t += part[i];
        part[0] = t;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)(part[0] / (double)d) + eps);
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

__global__ void k_add_bias(float *y, const float *b, int64_t n, int64_t d) {
    gdc_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * d) y[i] += b[i % d];
}
extern "C" int tn_cu_add_bias(float *y, const float *b, int64_t n, int64_t d, void *stream) {
    if (n * d == 0) return 0;
    launch(k_add_bias, (unsigned)((n * d + 255) / 256), 256, 0, (cudaStream_t)stream, y, b, n, d);
    return tn_cu_err();
}

/* block per token: a warp per head for the q/k norms (qwen3), then one thread per rotated pair
 * (query heads, then key heads), then the cache rows */
__global__ void k_rope_store(float *q, int64_t ldq, float *k, const float *v, int64_t ldk, const float *qn, const float *kn,
                             float eps, const float *cs, int n_rot, int neox, int n_head, int n_head_kv, int hd,
                             const int32_t *kvrow, __half *Kc, __half *Vc) {
    gdc_wait();
    const int64_t t = blockIdx.x;
    const int lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    if (qn || kn) {
        for (int h = threadIdx.x / WARP; h < n_head + n_head_kv; h += nw) {
            const float *w = h < n_head ? qn : kn;
            if (!w) continue;
            float *x = h < n_head ? q + t * ldq + (int64_t)h * hd : k + t * ldk + (int64_t)(h - n_head) * hd;
            double s = 0;
            for (int i = lane; i < hd; i += WARP) s += (double)(x[i] * x[i]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            const float scale = 1.0f / sqrtf((float)(s / (double)hd) + eps);
            for (int i = lane; i < hd; i += WARP) x[i] = (x[i] * scale) * w[i];
        }
        __syncthreads();
    }
    const float *c = cs + t * n_rot;
    const int np = n_rot / 2;
    for (int u = threadIdx.x; u < (n_head + n_head_kv) * np; u += blockDim.x) {
        const int h = u / np, i0 = 2 * (u % np);
        float *x = h < n_head ? q + t * ldq + (int64_t)h * hd : k + t * ldk + (int64_t)(h - n_head) * hd;
        const float co = c[i0], si = c[i0 + 1];
        const int a = neox ? i0 / 2 : i0, b = neox ? i0 / 2 + n_rot / 2 : i0 + 1;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * co - x1 * si;
        x[b] = x0 * si + x1 * co;
    }
    __syncthreads();
    const int kv_dim = n_head_kv * hd;
    const int64_t row = kvrow[t];
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        Kc[row * kv_dim + i] = __float2half_rn(k[t * ldk + i]);
        Vc[row * kv_dim + i] = __float2half_rn(v[t * ldk + i]);
    }
}
extern "C" int tn_cu_rope_store(float *q, int64_t ldq, float *k, const float *v, int64_t ldk, const float *qn, const float *kn,
                                float eps, const float *cs, int n_rot, int neox, int64_t n, int n_head, int n_head_kv, int hd,
                                const int32_t *kvrow, uint16_t *Kc, uint16_t *Vc, void *stream) {
    if (n == 0) return 0;
    launch(k_rope_store, (unsigned)n, 256, 0, (cudaStream_t)stream, q, ldq, k, v, ldk, qn, kn, eps, cs, n_rot, neox, n_head,
           n_head_kv, hd, kvrow, (__half *)Kc, (__half *)Vc);
    return tn_cu_err();
}

#define ATT_THREADS 256
#define ATT_CHUNK 512
/* One block of 256 threads per (token, head), positions in chunks of 512 with an online softmax
 * across chunks: the threads score positions in parallel (each a whole K row, 16-byte loads), the
 * block takes the chunk's max and sum, then thread (g, d) accumulates dimension d of V over the
 * chunk's positions g, g+G, .. (G = 256/hd groups; rows read whole by consecutive threads), and
 * the groups are summed at the end. f32 throughout; K, V in f16 as the cache holds them. */
__global__ void k_attn_block(const float *q, int64_t ldq, const __half *Kc, const __half *Vc, int64_t n, int n_head,
                             int n_head_kv, int hd, const int32_t *pos, const int32_t *tbl_off, const int32_t *tbl,
                             float scale, float *out, tn_cq xq) {
    gdc_wait();
    __shared__ float qs[2 * ATT_THREADS];
    __shared__ float sc[ATT_CHUNK];
    __shared__ int32_t rows[ATT_CHUNK];
    __shared__ float red[ATT_THREADS / WARP];
    __shared__ float part[ATT_THREADS];
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int64_t t = blockIdx.x / n_head;
    const int h = (int)(blockIdx.x % n_head), kvh = h / (n_head / n_head_kv), kv_dim = n_head_kv * hd;
    for (int i = tid; i < hd; i += ATT_THREADS) qs[i] = q[t * ldq + (int64_t)h * hd + i];
    const int T = pos[t] + 1, off = tbl_off[t];
    const int G = hd <= ATT_THREADS ? ATT_THREADS / hd : 1;
    const int gi = hd <= ATT_THREADS ? tid / hd : 0, d0 = hd <= ATT_THREADS ? tid % hd : tid;
    const bool active = gi < G;
    const bool vec = (hd & 7) == 0 && (kv_dim & 7) == 0;
    float acc0 = 0.0f, acc1 = 0.0f, mx = -INFINITY, l = 0.0f;
    __syncthreads();
    for (int p0 = 0; p0 < T; p0 += ATT_CHUNK) {
        const int np = min(ATT_CHUNK, T - p0);
        float cmax = -INFINITY;
        for (int j = tid; j < np; j += ATT_THREADS) {
            const int p = p0 + j;
            const int64_t row = off < 0 ? p : (int64_t)tbl[off + p / 16] * 16 + p % 16;
            rows[j] = (int32_t)row;
            const __half *kr = Kc + row * kv_dim + (int64_t)kvh * hd;
            float dot = 0.0f;
            if (vec) {
                for (int i = 0; i < hd; i += 8) {
                    const uint4 u = *(const uint4 *)(kr + i);
                    const __half2 *h2 = (const __half2 *)&u;
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const float2 f = __half22float2(h2[c]);
                        dot += qs[i + 2 * c] * f.x + qs[i + 2 * c + 1] * f.y;
                    }
                }
            } else {
                for (int i = 0; i < hd; i++) dot += qs[i] * __half2float(kr[i]);
            }
            const float s = dot * scale;
            sc[j] = s;
            cmax = fmaxf(cmax, s);
        }
        cmax = warp_max(cmax);
        if (lane == 0) red[warp] = cmax;
        __syncthreads();
        cmax = red[0];
        for (int w = 1; w < ATT_THREADS / WARP; w++) cmax = fmaxf(cmax, red[w]);
        __syncthreads();
        const float mnew = fmaxf(mx, cmax), corr = expf(mx - mnew);
        float csum = 0.0f;
        for (int j = tid; j < np; j += ATT_THREADS) {
            const float e = expf(sc[j] - mnew);
            sc[j] = e;
            csum += e;
        }
        csum = warp_sum(csum);
        if (lane == 0) red[warp] = csum;
        __syncthreads();
        csum = 0.0f;
        for (int w = 0; w < ATT_THREADS / WARP; w++) csum += red[w];
        l = l * corr + csum;
        mx = mnew;
        acc0 *= corr;
        acc1 *= corr;
        if (active) {
#pragma unroll 4
            for (int j = gi; j < np; j += G) {
                const __half *vr = Vc + (int64_t)rows[j] * kv_dim + (int64_t)kvh * hd;
                const float pj = sc[j];
                acc0 += pj * __half2float(vr[d0]);
                if (hd > ATT_THREADS && d0 + ATT_THREADS < hd) acc1 += pj * __half2float(vr[d0 + ATT_THREADS]);
            }
        }
        __syncthreads(); /* sc, rows and red are rewritten by the next chunk */
    }
    float *o = out + t * (int64_t)n_head * hd + (int64_t)h * hd;
    if (hd <= ATT_THREADS) {
        if (active) part[tid] = acc0;
        __syncthreads();
        if (tid < hd) {
            float s = 0.0f;
            for (int g = 0; g < G; g++) s += part[g * hd + tid];
            o[tid] = s / l;
            /* the output quantized for Wo as it is written (hd % 32 == 0: whole warps, whole blocks) */
            if (xq.q) {
                const int64_t e = t * (int64_t)n_head * hd + (int64_t)h * hd + tid;
                q8_block(s / l, lane, e / 32, e - lane, xq);
            }
        }
    } else {
        o[d0] = acc0 / l;
        if (d0 + ATT_THREADS < hd) o[d0 + ATT_THREADS] = acc1 / l;
    }
}
extern "C" int tn_cu_attention(const float *q, int64_t ldq, const uint16_t *Kc, const uint16_t *Vc, int64_t n, int n_head,
                               int n_head_kv, int hd, const int32_t *pos, const int32_t *tbl_off, const int32_t *tbl,
                               float scale, float *out, const tn_cq *xq, void *stream) {
    if (hd > 256 || (xq && hd % 32 != 0)) return (int)cudaErrorInvalidValue;
    const tn_cq none = {NULL, NULL, NULL};
    const int64_t units = n * n_head;
    if (units == 0) return 0;
    launch(k_attn_block, (unsigned)units, ATT_THREADS, 0, (cudaStream_t)stream, q, ldq, (const __half *)Kc, (const __half *)Vc, n,
                                                                           n_head, n_head_kv, hd, pos, tbl_off, tbl, scale, out,
                                                                           xq ? *xq : none);
    return tn_cu_err();
}

__global__ void k_swiglu(float *g, const float *u, int64_t n) {
    gdc_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
extern "C" int tn_cu_swiglu(float *g, const float *u, int64_t n, void *stream) {
    if (n == 0) return 0;
    launch(k_swiglu, (unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream, g, u, n);
    return tn_cu_err();
}

/* gate and up side by side per token: gu[t] = [gate (ff) | up (ff)] -> h[t][i]; with xq.q != NULL
 * (ff % 32 == 0) also h quantized to q8 blocks, one warp per block */
__global__ void k_swiglu_pair(const float *gu, float *h, int64_t n, int64_t ff, tn_cq xq) {
    gdc_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (xq.q) { /* whole warps: n*ff is a multiple of 32 */
        if ((i - threadIdx.x % WARP) >= n * ff) return;
    } else if (i >= n * ff) {
        return;
    }
    const int64_t t = i / ff, j = i % ff;
    const float g = gu[t * 2 * ff + j], u = gu[t * 2 * ff + ff + j];
    const float v = g / (1.0f + expf(-g)) * u;
    h[i] = v;
    if (xq.q) q8_block(v, threadIdx.x % WARP, i / 32, i - threadIdx.x % WARP, xq);
}
extern "C" int tn_cu_swiglu_pair(const float *gu, float *h, int64_t n, int64_t ff, const tn_cq *xq, void *stream) {
    if (n * ff == 0) return 0;
    const tn_cq none = {NULL, NULL, NULL};
    if (xq && ff % 32 != 0) return (int)cudaErrorInvalidValue;
    launch(k_swiglu_pair, (unsigned)((n * ff + 255) / 256), 256, 0, (cudaStream_t)stream, gu, h, n, ff, xq ? *xq : none);
    return tn_cu_err();
}

__global__ void k_copy(const uint4 *src, uint4 *dst, size_t n16) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
}
extern "C" int tn_cu_copy_kernel(const void *src, void *dst, size_t n, void *stream) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    k_copy<<<(unsigned)(sms * 8), 512, 0, (cudaStream_t)stream>>>((const uint4 *)src, (uint4 *)dst, n / 16);
    return tn_cu_err();
}
