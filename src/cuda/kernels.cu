/*
 * kernels.cu — tern's CUDA kernels (launchers in kern_cuda.h). The CPU's scalar kernels are the
 * oracle of every kernel here (tests/cuda/test_cuda.c).
 *
 * Decode GEMV, code path: one template over the tq widths (Tilus's point: any width from one
 * description of the planes, not a kernel per width by hand). A warp computes one row; each lane
 * takes one 32-code chunk at a time, rebuilds its codes as 8 words of 4 bytes from the chunk's
 * planes (shifts and masks, a multiply for the 1-bit plane) and multiplies them with the int8
 * activations by dp4a; up to TN_CU_GEMV_MAXN tokens share each weight load.
 *
 * One-token steps run launch by launch (about 5 launches a layer, a CUDA graph) or, with
 * TERN_CUDA_PERSIST=1, as one persistent cooperative kernel (k_persist, at the end) whose stages
 * call the same device functions (gemv_code_rows, attn_unit) between grid barriers.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/kern_cuda.h"

#define WARP 32
#define GEMV_WARPS_MAX 4 /* warps per GEMV block */
/* GEMV blocks that fit on a multiprocessor at once, by registers (at most 64 per thread): the
 * blocks of a running GEMV and of the next one, prefetching, side by side */
#define GEMV_MIN_BLOCKS 8
#define GEMV_MIN_BLOCKS_R 6 /* two rows per warp: more registers */

static inline int tn_cu_err(void) { return (int)cudaGetLastError(); }

/* Programmatic dependent launch (Hopper and later, tn_cu_configure): each kernel may be launched
 * while the one before it on the stream is still running; it waits (griddepcontrol.wait) until
 * that one has finished and its writes are visible, and lets the next one launch
 * (griddepcontrol.launch_dependents). What it hides is the launch and ramp-up of every kernel of a
 * decode step.
 *
 * Where each kernel lets the next launch decides how far ahead the GPU runs (TN_CU_EARLY):
 *   - the GEMV kernels first prefetch their block's weight rows into L2 (they depend on nothing
 *     earlier), then wait, then let the next kernel launch;
 *   - with early triggers, the small kernels (norms, RoPE, attention, SwiGLU, quantization) let the
 *     next kernel launch before they wait, so the next GEMV is already resident and prefetching
 *     its weights while the kernels before it run. The GEMVs, which trigger only after their wait,
 *     bound the chain: at most the next GEMV's weights are fetched ahead, which fits in L2.
 * A kernel launched early only waits; what it reads is written by kernels that have completed. */
static bool g_pdl = false;
static int g_bps = 0, g_sms = 0, g_grid_cap = 0, g_rows = 1, g_l2 = 0;
__device__ int d_early = 0;    /* small kernels trigger before they wait */
__device__ int d_prefetch = 0; /* GEMV kernels prefetch their weight rows into L2 before they wait */

extern "C" int tn_cu_configure(int pdl, int early, int prefetch, int gemv_bps, int gemv_rows) {
    g_pdl = pdl != 0;
    g_rows = gemv_rows == 2 ? 2 : 1;
    g_bps = gemv_bps > 0 ? gemv_bps : 0;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&g_l2, cudaDevAttrL2CacheSize, dev);
    const int e = pdl && early ? 1 : 0, pf = prefetch ? 1 : 0;
    cudaMemcpyToSymbol(d_early, &e, sizeof e);
    cudaMemcpyToSymbol(d_prefetch, &pf, sizeof pf);
    return tn_cu_err();
}

extern "C" void tn_cu_set_gemv_grid_cap(int blocks) { g_grid_cap = blocks > 0 ? blocks : 0; }

/* Batches of code-path weights of at least g_mmq tokens (0: none) on the int8 tensor cores
 * (k_mmq_code: the GEMV kernels' bits), where the device has them (sm_80 and later) */
static int g_mmq = 0;
extern "C" int tn_cu_set_mmq(int min_tokens) {
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    g_mmq = min_tokens > 0 && major >= 8 ? max(min_tokens, TN_CU_GEMV_MAXN + 1) : 0;
    return g_mmq;
}
extern "C" int tn_cu_mmq(void) { return g_mmq; }

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

__device__ __forceinline__ void gdc_wait_only(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void gdc_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* wait for the kernel before, then let the next one launch (GEMV, dequantization, copies) */
__device__ __forceinline__ void gdc_wait(void) {
    gdc_wait_only();
    gdc_trigger();
}
/* the small kernels of a step: with early triggers the next kernel launches before this one waits */
__device__ __forceinline__ void gdc_enter(void) {
    const bool early = d_early != 0;
    if (early) gdc_trigger();
    gdc_wait_only();
    if (!early) gdc_trigger();
}

/* Prefetches bytes [p, p + n) into L2, one 128-byte line per thread of the block at a time (the
 * addresses stay inside the allocation: cudaMalloc aligns it to 256 bytes). */
__device__ __forceinline__ void prefetch_l2(const void *p, size_t n) {
    const uintptr_t a1 = (uintptr_t)p + n;
    for (uintptr_t a = ((uintptr_t)p & ~(uintptr_t)127) + 128u * threadIdx.x; a < a1; a += 128u * blockDim.x)
#ifndef TN_CUDA_EMU /* the emulator (tests/cuda/emu) has no caches to prefetch into */
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
#else
        (void)a;
#endif
}
/* One line into L1 (a hint: the next row a warp of a GEMV will read, while it computes this one) */
__device__ __forceinline__ void prefetch_l1(const void *p) {
#ifndef TN_CUDA_EMU
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* The warp's sum of a GEMV's per-lane partial sums (lane l: chunks l, l + 32, ..): a butterfly over
 * lane distances 1, 2, .., 16, so neighbouring chunks' sums are added first — the tree that the
 * tensor-core kernel (k_mmq_code), meeting the chunks in order, builds as it goes. Every lane ends
 * with the same bits (each addition's operands are the same pair, in either order). */
__device__ __forceinline__ float gemv_warp_sum(float v) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
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
#ifndef TN_CUDA_EMU
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    for (int i = 0; i < 4; i++) c += (int)((a >> (8 * i)) & 255u) * (int)(int8_t)(b >> (8 * i));
    return c;
#endif
}

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

/* The same q8 block by one thread: value j of block blk is v(j) (a function: the caller's loads and
 * arithmetic), the same arithmetic as q8_block, so the same bytes. Two passes over the values (the
 * scale, then the codes) rather than 32 of them in registers. */
template <typename F> __device__ __forceinline__ void q8_thread(F v, int64_t blk, tn_cq xq) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v(j)));
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int s = 0;
    for (int j = 0; j < 32; j++) {
        const int qi = __float2int_rn(v(j) * id);
        xq.q[blk * 32 + j] = (int8_t)qi;
        s += qi;
    }
    xq.d[blk] = __half2float(__float2half_rn(d));
    xq.s[blk] = s;
}

/* 1 / rms(xr) of a row of d floats, by the whole block, every thread gets it: the float squares
 * summed in double (as the CPU) in an order that does not depend on the block's size — 128 lanes,
 * lane l summing elements l, l + 128, .. in turn, each warp's 32 lanes by its butterfly, the four
 * warps' sums in order — so the norm kernel and a GEMV's norm tail (blocks of 1024 and 128 threads)
 * give the same bits. CG: loads through L2 only (data other blocks of the running kernel wrote). */
template <bool CG> __device__ __forceinline__ float rms_scale_block(const float *xr, int64_t d, float eps) {
    __shared__ double part[4];
    const int lane = threadIdx.x % WARP;
    for (int vw = threadIdx.x / WARP; vw < 4; vw += blockDim.x / WARP) {
        double s = 0;
        for (int64_t i = vw * WARP + lane; i < d; i += 4 * WARP) {
            const float v = CG ? __ldcg(xr + i) : xr[i];
            s += (double)(v * v);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) part[vw] = s;
    }
    __syncthreads();
    const double t = ((part[0] + part[1]) + part[2]) + part[3];
    __syncthreads(); /* part is free again */
    return 1.0f / sqrtf((float)(t / (double)d) + eps);
}

/* The end of a one-token GEMV with a norm tail (tn_cu_tail): every thread's rows made visible, the
 * block counted; the last block of the grid computes the norm of the finished x (read through L2:
 * this block's L1 may hold lines of x from before the other blocks' writes) as k_rmsnorm does, its
 * q8 blocks a thread each, and resets the count. All threads of the block call it. */
__device__ __forceinline__ void norm_tail(const tn_cu_tail &t) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(t.cnt, 1) == (int)(gridDim.x * gridDim.y) - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* no norm (w NULL): x's q8 blocks only (the GLU's output for Wdown) */
    const float scale = t.w ? rms_scale_block<true>(t.x, t.d, t.eps) : 1.0f;
    const auto v = [&](int64_t i) { return t.w ? (__ldcg(t.x + i) * scale) * t.w[i] : __ldcg(t.x + i); };
    for (int64_t i = threadIdx.x; t.w && i < t.d; i += blockDim.x) t.y[i] = v(i);
    if (t.xq.q)
        for (int64_t b = threadIdx.x; b < t.d / 32; b += blockDim.x) q8_thread([&](int j) { return v(b * 32 + j); }, b, t.xq);
    if (threadIdx.x == 0) *t.cnt = 0;
}

/* ---- activations ------------------------------------------------------------------------------ */

/* one warp per block of 32, as the CPU's activation quantizer (quant_act.c, ggml's x86 path):
 * d = amax/127 (fp16-rounded for the product, as q8_0 stores it), q = x * (127/amax) rounded half
 * to even */
__global__ void k_quantize_q8(const float *x, int64_t ldx, int64_t k, int64_t n, int8_t *q, float *dd, int32_t *ss) {
    gdc_enter();
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

/* KIND: 0 tq (unsigned codes; sym offset (2^B-1)/2 or asym m), 1 q4_0 (offset 8), 2 q8_0 (signed),
 * 3 q5_0 (offset 16). Any number of tokens, in tiles of NT (TN_CU_GEMV_MAXN, or 1 for one-token
 * steps): every output is the same sequence of operations whatever n and NT are (lane partial sums
 * over chunks lane, lane+32, .., then the warp's butterfly), so a token's result does not depend
 * on the batch it came in (tern serve's batches equal one-at-a-time decoding). A tile after the
 * first finds the row in L1/L2. One-token steps may give each warp R consecutive rows at once (the
 * activation chunk loaded once, the rows' code loads in flight together; each row's arithmetic as
 * alone). Before waiting for the kernel before it, the block prefetches its weight rows into L2
 * (they depend on nothing earlier). */
template <int B, int KIND, bool ASYM, int NT, int R>
__global__ void __launch_bounds__(GEMV_WARPS_MAX * WARP, R == 1 ? GEMV_MIN_BLOCKS : GEMV_MIN_BLOCKS_R)
    k_gemv_code(tn_cw w, const int8_t *xq, const float *xd, const int32_t *xs, int n, float *y, int64_t ldy, const float *bias,
                int accumulate, int wpr, tn_cu_tail tail, tn_cu_glu gl, tn_cu_ex ex) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, part = warp % wpr, rpb = GEMV_WARPS_MAX / wpr * R;
    if constexpr (NT == 1) /* a (token, slot) pair per blockIdx.y: an expert's rows (which, after the wait) */
        if (ex.sel) w.m = ex.rows;
    const int64_t nc = w.k / 32, nbr = w.k / w.group;
    const int cpb = w.group / 32;
    /* gate|up pairs (R == 2): warp row "row0" is the pair (row0, row0 + half), a row group rpb / 2 pairs */
    const bool pair = R == 2 && gl.h != nullptr;
    const int64_t half = w.m / 2, units = pair ? half : w.m, upg = pair ? rpb / 2 : rpb;
    int64_t rg0, rg1;
    gemv_rows(units, upg, &rg0, &rg1);
    if (d_prefetch && (NT > 1 || !ex.sel) && rg0 < rg1) {
        const int64_t r0 = rg0 * upg, nr = min(units, rg1 * upg) - r0;
        for (int h = 0; h < (pair ? 2 : 1); h++) {
            const int64_t a = r0 + h * half;
            prefetch_l2((const uint8_t *)w.data + a * (int64_t)w.row_bytes, (size_t)(nr * (int64_t)w.row_bytes));
            prefetch_l2(w.d + a * nbr, (size_t)(nr * nbr * 2));
            if (ASYM) prefetch_l2(w.mn + a * nbr, (size_t)(nr * nbr * 2));
        }
    }
    gdc_wait();
    if constexpr (NT == 1) if (ex.sel) { /* the pair's expert, input row and output row */
        const int64_t p = blockIdx.y, e = ex.sel[p], r = p / ex.div;
        w.data = (const uint8_t *)w.data + e * w.m * (int64_t)w.row_bytes;
        w.d += e * w.m * nbr;
        if (ASYM) w.mn += e * w.m * nbr;
        xq += r * w.k, xd += r * nc, xs += r * nc;
        y += p * ldy;
        if (gl.h) gl.h += p * half;
        if (bias) bias += e * w.m; /* the expert's biases (gpt-oss) */
    }
    const float off = KIND == 1 ? 8.0f : KIND == 3 ? 16.0f : (float)((1 << B) - 1) * 0.5f;
    for (int64_t rg = rg0; rg < rg1; rg++) {
        if constexpr (R > 1) { /* one token (n == 1): R consecutive rows, or a gate|up pair, a warp */
            gemv_code_rows<B, KIND, ASYM, R, GEMV_WARPS_MAX>(w, xq, xd, xs, rg, wpr, pair, y, bias, accumulate, gl);
            continue;
        }
        const int64_t row = rg * rpb + warp / wpr;
        const bool valid = row < w.m;
        const uint8_t *rowp = (const uint8_t *)w.data + (valid ? row : 0) * (int64_t)w.row_bytes;
        const uint16_t *dr = w.d + (valid ? row : 0) * nbr, *mr = ASYM ? w.mn + (valid ? row : 0) * nbr : nullptr;
        if (rg + 1 < rg1 && row + rpb < w.m) { /* the warp's next row: its chunks into L1 meanwhile */
            const uint8_t *np = rowp + (int64_t)rpb * (int64_t)w.row_bytes;
            for (int64_t ci = lane + (int64_t)WARP * part; ci < nc; ci += (int64_t)WARP * wpr) {
                const uint8_t *bp = np + (ci / cpb) * (int64_t)(4 * B * cpb);
                prefetch_l1(bp);
                if (4 * B * cpb > 128) prefetch_l1(bp + 128);
                prefetch_l1(dr + (int64_t)rpb * nbr + ci / cpb);
            }
        }
        for (int t0 = 0; t0 < n; t0 += NT) {
            const int nt = min(NT, n - t0);
            float acc[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) acc[t] = 0.0f;
            for (int64_t ci = lane + (int64_t)WARP * part; valid && ci < nc; ci += (int64_t)WARP * wpr) {
                uint32_t q[8];
                load_chunk<B>(rowp, ci, cpb, q);
                const float d = h2f(dr[ci / cpb]);
                const float m = ASYM ? h2f(mr[ci / cpb]) : 0.0f;
#pragma unroll
                for (int t = 0; t < NT; t++) {
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
                    acc[t] = chunk_acc<KIND, ASYM>(acc[t], da, d, m, sq, sa, off);
                }
            }
            gemv_finish(acc, nt, wpr, valid, row, t0, y, ldy, bias, accumulate);
        }
    }
    if constexpr (NT == 1) /* one-token steps only (the tiles' registers stay theirs) */
        if (tail.cnt) norm_tail(tail);
}
/* ---- tensor-core products of batches (k_mmq_code) --------------------------------------------- */

/* d = a b, one m16n8k32 product of the int8 tensor cores (sums in int32, exact), in the PTX ISA's
 * fragments: lane (g = lane / 4, t = lane % 4) holds a[0] = row g's bytes 4t .. 4t+3, a[1] = row g+8's,
 * a[2] = row g's bytes 16+4t .., a[3] = row g+8's; b[0] = column g's bytes 4t .., b[1] = its bytes
 * 16+4t ..; and gets d[0], d[1] = row g, columns 2t and 2t+1, d[2], d[3] = row g+8. AS: a's bytes
 * are int8 (q8_0's codes), else uint8 (every other code type); b's are int8 (q8 activations). Before
 * sm_80 (no m16n8k32), the same product from the lanes' fragments by shuffles and dp4a. */
template <bool AS> __device__ __forceinline__ void mma_i8(int d[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(TN_CUDA_EMU)
    tn_emu_mma_i8(d, a, b, AS ? 1 : 0);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    d[0] = d[1] = d[2] = d[3] = 0;
    if (AS)
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    const int lane = threadIdx.x % WARP, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] = 0;
#pragma unroll
    for (int q = 0; q < 4; q++) { /* bytes 4q .. 4q+3 and 16+4q .. of the rows and columns, from lane 4 row + q */
        const uint32_t a0 = __shfl_sync(0xffffffffu, a[0], 4 * g + q), a1 = __shfl_sync(0xffffffffu, a[1], 4 * g + q);
        const uint32_t a2 = __shfl_sync(0xffffffffu, a[2], 4 * g + q), a3 = __shfl_sync(0xffffffffu, a[3], 4 * g + q);
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int b0 = (int)__shfl_sync(0xffffffffu, b[0], 4 * (2 * t + c) + q);
            const int b1 = (int)__shfl_sync(0xffffffffu, b[1], 4 * (2 * t + c) + q);
            if (AS) {
                d[c] = __dp4a((int)a2, b1, __dp4a((int)a0, b0, d[c]));
                d[2 + c] = __dp4a((int)a3, b1, __dp4a((int)a1, b0, d[2 + c]));
            } else {
                d[c] = dp4a_us(a2, b1, dp4a_us(a0, b0, d[c]));
                d[2 + c] = dp4a_us(a3, b1, dp4a_us(a1, b0, d[2 + c]));
            }
        }
    }
#endif
}

/* An int32 sum of 32 products of bytes (|v| < 2^22) as a float: exact, as (float)v, with an integer
 * and a float addition instead of a conversion (a quarter-rate instruction) */
__device__ __forceinline__ float i2f_small(int v) { return __fsub_rn(__uint_as_float(0x4B400000u + (unsigned)v), 12582912.0f); }

#define MMQ_BM 64      /* rows a block */
#define MMQ_BN 64      /* tokens a block */
#define MMQ_THREADS 256 /* 8 warps: 2 along the rows (32 each) x 4 along the tokens (16 each) */
#define MMQ_LDS 20     /* words per row (token) of a stage in shared memory: 2 chunks and 4 of padding,
                        * so that a fragment's 32 loads fall in 32 banks */

/* One stage's global loads, held in registers while the tensor cores work on the stage before:
 * threads 0..127 a chunk of a row (its planes' words, scale, offset), 128..255 a chunk of a token
 * (32 int8 activations, scale, sum). */
template <int B> struct mmq_fetch {
    uint32_t raw[B];
    float d, m;
    int4 a0, a1;
};

/* The products of an n-token batch (n >= tn_cu_mmq(), 65 by default) on the int8 tensor cores,
 * giving every output the bits the GEMV kernels give it (k_gemv_code, every token alone): a
 * chunk's 32 products are one integer (the mma's, the GEMV's dp4a), scaled by chunk_acc's rounded operations; the
 * chunks of a GEMV lane's slot (chunks l + 32 p + 32 wpr j for j = 0, 1, ..: lane l of the row's
 * warp p) are accumulated in that order; the slots' sums are added in gemv_warp_sum's tree (slot 2i
 * with 2i+1, those pairs' sums pairwise, .. five levels) and the warps' trees in part order, then
 * the bias. So a block walks its chunks slot pair by slot pair — for part p, pair i = 0..15, the
 * chunks (2i, 2i+1) + 32 p + 32 wpr j for each j, two adjacent chunks a stage — keeps two slot sums
 * and four levels of the tree per output, and folds a pair into the tree once its last chunk is
 * in. A block is 64 rows x 64 tokens; its stages' codes (unpacked from the planes as load_chunk
 * unpacks them) and activations pass through shared memory, double-buffered: the next stage's
 * global loads are in flight while this one's products run. */
template <int B, int KIND, bool ASYM>
__global__ void __launch_bounds__(MMQ_THREADS) k_mmq_code(tn_cw w, const int8_t *xq, const float *xd, const int32_t *xs, int n,
                                                          float *y, int64_t ldy, const float *bias, int accumulate, int wpr) {
    constexpr int w0 = planes<B>::w0, w1 = planes<B>::w1, w2 = planes<B>::w2;
    __shared__ __align__(16) uint32_t sA[2][MMQ_BM * MMQ_LDS];
    __shared__ __align__(16) uint32_t sB[2][MMQ_BN * MMQ_LDS];
    __shared__ float sD[2][MMQ_BM][2], sM[2][MMQ_BM][2], sDa[2][MMQ_BN][2], sSa[2][MMQ_BN][2];
    gdc_wait();
    const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP, g = lane / 4, t = lane % 4;
    const int64_t r0 = (int64_t)blockIdx.x * MMQ_BM, t0 = (int64_t)blockIdx.y * MMQ_BN;
    const int64_t nc = w.k / 32, nbr = w.k / w.group, span = (int64_t)WARP * wpr, J = (nc + span - 1) / span;
    const int cpb = w.group / 32;
    const int64_t steps = (int64_t)wpr * 16 * J;
    const float off = KIND == 1 ? 8.0f : KIND == 3 ? 16.0f : (float)((1 << B) - 1) * 0.5f;
    /* this thread's loads: a chunk (lh) of row / token lr */
    const bool ldw = tid < 2 * MMQ_BM;
    const int lr = (tid % (2 * MMQ_BM)) / 2, lh = tid % 2;
    mmq_fetch<B> f;
    auto first_chunk = [&](int64_t s) { /* the stage's first chunk: part p, slot pair i, pass j */
        const int64_t p = s / (16 * J), i = (s / J) % 16, j = s % J;
        return 2 * i + WARP * p + span * j;
    };
    auto fetch = [&](int64_t s) {
        const int64_t ci = first_chunk(s) + lh;
        if (ldw) {
            const int64_t row = r0 + lr;
            const bool ok = row < w.m && ci < nc;
            const uint8_t *bp = (const uint8_t *)w.data + (ok ? row : 0) * (int64_t)w.row_bytes + (ok ? ci / cpb : 0) * (int64_t)(4 * B * cpb);
            const int c = ok ? (int)(ci % cpb) : 0;
#pragma unroll
            for (int e = 0; e < w0; e++) f.raw[e] = ok ? ((const uint32_t *)(bp + c * 4 * w0))[e] : 0u;
#pragma unroll
            for (int e = 0; e < w1; e++) f.raw[w0 + e] = ok ? ((const uint32_t *)(bp + 4 * cpb * w0 + c * 4 * w1))[e] : 0u;
#pragma unroll
            for (int e = 0; e < w2; e++)
                f.raw[w0 + w1 + e] = ok ? ((const uint32_t *)(bp + 4 * cpb * (w0 + w1) + c * 4 * w2))[e] : 0u;
            f.d = ok ? h2f(w.d[row * nbr + ci / cpb]) : 0.0f;
            f.m = ok && ASYM ? h2f(w.mn[row * nbr + ci / cpb]) : 0.0f;
        } else {
            const int64_t tok = t0 + lr;
            const bool ok = tok < n && ci < nc;
            const int4 z = {0, 0, 0, 0};
            const int4 *a4 = (const int4 *)(xq + (ok ? tok * w.k + ci * 32 : 0));
            f.a0 = ok ? a4[0] : z;
            f.a1 = ok ? a4[1] : z;
            f.d = ok ? xd[tok * nc + ci] : 0.0f;
            f.m = ok ? (float)xs[tok * nc + ci] : 0.0f;
        }
    };
    auto store = [&](int buf) {
        if (ldw) {
            uint32_t q[8];
#pragma unroll
            for (int e = 0; e < 8; e++) q[e] = 0;
            unpack_plane<w0, 0>(f.raw, q);
            if (w1) unpack_plane<w1, w0>(f.raw + w0, q);
            if (w2) unpack_plane<w2, w0 + w1>(f.raw + w0 + w1, q);
            uint4 *o = (uint4 *)(sA[buf] + lr * MMQ_LDS + lh * 8);
            o[0] = uint4{q[0], q[1], q[2], q[3]};
            o[1] = uint4{q[4], q[5], q[6], q[7]};
            sD[buf][lr][lh] = f.d;
            sM[buf][lr][lh] = f.m;
        } else {
            int4 *o = (int4 *)(sB[buf] + lr * MMQ_LDS + lh * 8);
            o[0] = f.a0;
            o[1] = f.a1;
            sDa[buf][lr][lh] = f.d;
            sSa[buf][lr][lh] = f.m;
        }
    };
    /* per output o = (row tile mt, token tile nt, fragment element e) = 8 mt + 4 nt + e: the two slots
     * of the current pair, the tree's levels 1..4 (the sums of 2, 4, 8, 16 slots waiting for their
     * partner), and the parts' running sum */
    float sl[2][16], L1[16], L2[16], L3[16], L4[16], part[16];
#pragma unroll
    for (int o = 0; o < 16; o++) sl[0][o] = sl[1][o] = L1[o] = L2[o] = L3[o] = L4[o] = part[o] = 0.0f;
    const int wm = (warp % 2) * 32, wn = (warp / 2) * 16;
    fetch(0);
    store(0);
    __syncthreads();
    for (int64_t s = 0; s < steps; s++) {
        const int buf = (int)(s & 1);
        if (s + 1 < steps) fetch(s + 1);
        const int64_t c0 = first_chunk(s);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (c0 + h >= nc) continue;
            uint32_t af[2][4], bf[2][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const uint32_t *pa = sA[buf] + (wm + mt * 16 + g) * MMQ_LDS + h * 8 + t;
                af[mt][0] = pa[0];
                af[mt][1] = pa[8 * MMQ_LDS];
                af[mt][2] = pa[4];
                af[mt][3] = pa[8 * MMQ_LDS + 4];
            }
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const uint32_t *pb = sB[buf] + (wn + nt * 8 + g) * MMQ_LDS + h * 8 + t;
                bf[nt][0] = pb[0];
                bf[nt][1] = pb[4];
            }
#pragma unroll
            for (int mn = 0; mn < 4; mn++) {
                const int mt = mn >> 1, nt = mn & 1;
                int dd[4];
                mma_i8<KIND == 2>(dd, af[mt], bf[nt]);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int rl = wm + mt * 16 + g + (e >> 1) * 8, tl = wn + nt * 8 + 2 * t + (e & 1), o = 4 * mn + e;
                    sl[h][o] = chunk_acc_f<KIND, ASYM>(sl[h][o], sDa[buf][tl][h], sD[buf][rl][h], ASYM ? sM[buf][rl][h] : 0.0f,
                                                       i2f_small(dd[e]), sSa[buf][tl][h], off);
                }
            }
        }
        if (s % J == J - 1) { /* the pair's slots are complete: into the tree */
            const int i = (int)((s / J) % 16);
            const bool first_part = s / (16 * J) == 0;
#pragma unroll
            for (int o = 0; o < 16; o++) {
                float v = __fadd_rn(sl[0][o], sl[1][o]);
                sl[0][o] = sl[1][o] = 0.0f;
                if (!(i & 1)) { L1[o] = v; continue; }
                v = __fadd_rn(L1[o], v);
                if (!(i & 2)) { L2[o] = v; continue; }
                v = __fadd_rn(L2[o], v);
                if (!(i & 4)) { L3[o] = v; continue; }
                v = __fadd_rn(L3[o], v);
                if (!(i & 8)) { L4[o] = v; continue; }
                v = __fadd_rn(L4[o], v);
                part[o] = first_part ? v : __fadd_rn(part[o], v);
            }
        }
        if (s + 1 < steps) store(buf ^ 1);
        __syncthreads();
    }
#pragma unroll
    for (int o = 0; o < 16; o++) {
        const int mt = o >> 3, nt = (o >> 2) & 1, e = o & 3;
        const int64_t row = r0 + wm + mt * 16 + g + (e >> 1) * 8, tok = t0 + wn + nt * 8 + 2 * t + (e & 1);
        if (row >= w.m || tok >= n) continue;
        const float r = part[o] + (bias ? bias[row] : 0.0f);
        float *yp = y + tok * ldy + row;
        *yp = accumulate ? *yp + r : r;
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

/* ggml's 16-entry tables of iq4_nl / iq4_xs (kvalues_iq4nl) and of mxfp4 (kvalues_mxfp4, e2m1
 * doubled), as bytes of two 64-bit constants: entry q is byte q % 8 of the (q < 8 ? lo : hi) word. */
__device__ __forceinline__ int iq4nl_value(uint32_t q) {
    const uint64_t lo = 0xF6EADDCFBFAD9881ull /* -127 -104 -83 -65 -49 -35 -22 -10 */,
                   hi = 0x7159453526190D01ull /* 1 13 25 38 53 69 89 113 */;
    return (int)(int8_t)(uint8_t)(((q & 8) ? hi : lo) >> (8 * (q & 7)));
}
__device__ __forceinline__ int mxfp4_value(uint32_t q) {
    const uint64_t lo = 0x0C08060403020100ull /* 0 1 2 3 4 6 8 12 */, hi = 0xF4F8FAFCFDFEFF00ull /* 0 -1 -2 -3 -4 -6 -8 -12 */;
    return (int)(int8_t)(uint8_t)(((q & 8) ? hi : lo) >> (8 * (q & 7)));
}
/* 2^(e-128): e8m0's value halved (the table above is doubled), as ggml_e8m0_to_fp32_half */
__device__ __forceinline__ float e8m0_half(uint32_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

/* The codebook i-quants (quant/quant_iq2.c tn_iq_sub_decode has the layouts): blocks of 256 in 8
 * sub-blocks of 32, each 4 groups of 8 elements; a group is one 8-byte grid entry (iq2, iq1) or
 * two 4-byte ones (iq3), with a sign byte (iq2, iq3; 7 stored bits and even parity for iq2_xxs,
 * iq2_xs, iq3_xxs) or a shift of +-1/8 (iq1). Blocks are only 2-byte aligned: bytes and 16-bit
 * words. */
__device__ __forceinline__ uint32_t rd16(const uint8_t *p) { return *(const uint16_t *)p; }
__device__ __forceinline__ uint32_t rd32_2(const uint8_t *p) { return rd16(p) | rd16(p + 2) << 16; }
__device__ __forceinline__ uint32_t iq_signs7(uint32_t s7) {
    s7 &= 127;
    return s7 | (uint32_t)(__popc(s7) & 1) << 7;
}
/* v[j] = db * (+-byte j of e), minus where bit j of sg is set (ggml's db * grid * sign) */
__device__ __forceinline__ void iq_grid8(uint64_t e, uint32_t sg, float db, float v[8]) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int g = (int)((e >> (8 * j)) & 0xFF);
        v[j] = db * (float)((sg >> j) & 1u ? -g : g);
    }
}
/* v[j] = db * (signed byte j of e + delta) (iq1) */
__device__ __forceinline__ void iq1_grid8(uint64_t e, float delta, float db, float v[8]) {
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = db * ((float)(int8_t)(uint8_t)(e >> (8 * j)) + delta);
}
#define TN_IQ1_DELTA_F 0.125f

/* Elements e0 .. e0+7 (e0 % 8 == 0) of a row (k elements) of the file type, as floats; grid: the
 * codebook of the i-quants. */
template <int KIND>
__device__ __forceinline__ void load8(const uint8_t *rowp, int64_t e0, int64_t k, const void *grid, float v[8]) {
    (void)k, (void)grid;
    if (KIND >= TN_CW_IQ2_XXS && KIND <= TN_CW_IQ1_M) { /* group l of sub-block ib; h: its half (scales per 16) */
        const int e = (int)(e0 % 256), ib = e / 32, l = (e % 32) / 8, h = (e % 32) / 16;
        const uint64_t *g8 = (const uint64_t *)grid;
        const uint32_t *g4 = (const uint32_t *)grid;
        if (KIND == TN_CW_IQ2_XXS) { /* 66 bytes: d, then per sub-block 4 grid bytes and 32 bits of signs | scale << 28 */
            const uint8_t *b = rowp + (e0 / 256) * 66, *qs = b + 2 + 8 * ib;
            const uint32_t sg = rd32_2(qs + 4);
            const float db = h2f((uint16_t)rd16(b)) * (0.5f + (float)(sg >> 28)) * 0.25f;
            iq_grid8(g8[qs[l]], iq_signs7(sg >> (7 * l)), db, v);
        } else if (KIND == TN_CW_IQ2_XS) { /* 74 bytes: d, qs u16[32] (9-bit index | 7 sign bits << 9), scales[8] */
            const uint8_t *b = rowp + (e0 / 256) * 74;
            const uint32_t q = rd16(b + 2 + 2 * (4 * ib + l)), s = (b[66 + ib] >> (4 * h)) & 15u;
            const float db = h2f((uint16_t)rd16(b)) * (0.5f + (float)s) * 0.25f;
            iq_grid8(g8[q & 511], iq_signs7(q >> 9), db, v);
        } else if (KIND == TN_CW_IQ2_S) { /* 82 bytes: d, qs[32] index bytes, signs[32], qh[8], scales[8] */
            const uint8_t *b = rowp + (e0 / 256) * 82;
            const uint32_t idx = b[2 + 4 * ib + l] | ((b[66 + ib] >> (2 * l)) & 3u) << 8, s = (b[74 + ib] >> (4 * h)) & 15u;
            const float db = h2f((uint16_t)rd16(b)) * (0.5f + (float)s) * 0.25f;
            iq_grid8(g8[idx], b[34 + 4 * ib + l], db, v);
        } else if (KIND == TN_CW_IQ3_XXS) { /* 98 bytes: d, qs[64] (8 index bytes a sub-block), 32 bits of signs | scale << 28 each */
            const uint8_t *b = rowp + (e0 / 256) * 98, *qs = b + 2 + 8 * ib;
            const uint32_t sg = rd32_2(b + 66 + 4 * ib);
            const float db = h2f((uint16_t)rd16(b)) * (0.5f + (float)(sg >> 28)) * 0.5f;
            iq_grid8((uint64_t)g4[qs[2 * l]] | (uint64_t)g4[qs[2 * l + 1]] << 32, iq_signs7(sg >> (7 * l)), db, v);
        } else if (KIND == TN_CW_IQ3_S) { /* 110 bytes: d, qs[64], qh[8], signs[32], scales[4] */
            const uint8_t *b = rowp + (e0 / 256) * 110, *qs = b + 2 + 8 * ib;
            const uint32_t qh = b[66 + ib], s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 15u;
            const uint32_t i0 = qs[2 * l] | ((qh >> (2 * l)) & 1u) << 8, i1 = qs[2 * l + 1] | ((qh >> (2 * l + 1)) & 1u) << 8;
            const float db = h2f((uint16_t)rd16(b)) * (float)(1 + 2 * (int)s);
            iq_grid8((uint64_t)g4[i0] | (uint64_t)g4[i1] << 32, b[74 + 4 * ib + l], db, v);
        } else if (KIND == TN_CW_IQ1_S) { /* 50 bytes: d, qs[32], qh u16[8] (3 index bits a group, scale, shift sign) */
            const uint8_t *b = rowp + (e0 / 256) * 50;
            const uint32_t qh = rd16(b + 34 + 2 * ib);
            const float db = h2f((uint16_t)rd16(b)) * (float)(2 * (int)((qh >> 12) & 7u) + 1);
            iq1_grid8(g8[b[2 + 4 * ib + l] | ((qh >> (3 * l)) & 7u) << 8], (qh & 0x8000u) ? -TN_IQ1_DELTA_F : TN_IQ1_DELTA_F, db, v);
        } else { /* IQ1_M, 56 bytes: qs[32], qh[16] (a nibble a group: 3 index bits, shift sign), scales[8] (and d's nibbles) */
            const uint8_t *b = rowp + (e0 / 256) * 56;
            const uint32_t s0 = rd16(b + 48), s1 = rd16(b + 50), s2 = rd16(b + 52), s3 = rd16(b + 54);
            const float d = h2f((uint16_t)((s0 >> 12) | ((s1 >> 8) & 0x00F0u) | ((s2 >> 4) & 0x0F00u) | (s3 & 0xF000u)));
            const uint32_t sc = rd16(b + 48 + 2 * (ib / 2)), hq = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) & 15u;
            const float db = d * (float)(2 * (int)((sc >> (6 * (ib % 2) + 3 * h)) & 7u) + 1);
            iq1_grid8(g8[b[4 * ib + l] | (hq & 7u) << 8], (hq & 8u) ? -TN_IQ1_DELTA_F : TN_IQ1_DELTA_F, db, v);
        }
        return;
    }
    if (KIND == TN_CW_VQ2) { /* 72-byte slots: d, sc[4], pad, qs[64]; weight 64 p + j = d (2 s_{j/8} + 1) cb[p][qs[j]] */
        const uint8_t *b = rowp + (e0 / 256) * TN_CU_VQ2_STRIDE;
        const int e = (int)(e0 % 256), p = e / 64, j0 = e % 64, gi = j0 / 8; /* 8 vectors of one scale group */
        const uint2 u = *(const uint2 *)(b + 8 + j0);
        const uint32_t w[2] = {u.x, u.y};
        const float *cb = (const float *)grid + 256 * p;
        const float s = h2f((uint16_t)rd16(b)) * (float)(2 * (int)((b[2 + gi / 2] >> (4 * (gi % 2))) & 15u) + 1);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = s * cb[(w[i / 4] >> (8 * (i % 4))) & 0xFFu];
        return;
    }
    if (KIND == TN_CW_TQ1_0) { /* 54 bytes: qs[48], qh[4] (5 / 4 base-3 digits a byte), d; value (trit - 1) d */
        const uint8_t *b = rowp + (e0 / 256) * 54;
        const int e = (int)(e0 % 256);
        const float d = h2f((uint16_t)rd16(b + 52));
        /* elements 0-159: digit e/32 of qs[e%32]; 160-239: digit (e-160)/16 of qs[32 + (e-160)%16];
         * 240-255: digit (e-240)/4 of qh[(e-240)%4] (quant_iq.c tq1_trits) */
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int ei = e + i;
            const uint32_t byte = ei < 160 ? b[ei % 32] : ei < 240 ? b[32 + (ei - 160) % 16] : b[48 + (ei - 240) % 4];
            const int n = ei < 160 ? ei / 32 : ei < 240 ? (ei - 160) / 16 : (ei - 240) / 4;
            const uint32_t p3 = n == 0 ? 1u : n == 1 ? 3u : n == 2 ? 9u : n == 3 ? 27u : 81u;
            const int t = (int)((((byte * p3) & 0xFFu) * 3u) >> 8);
            v[i] = (float)(t - 1) * d;
        }
        return;
    }
    if (KIND == TN_CW_TQ2_0) { /* 66 bytes: qs[64] (2-bit codes, 4 to a byte), d; value (q - 1) d */
        const uint8_t *b = rowp + (e0 / 256) * 66;
        const int e = (int)(e0 % 256), sh = 2 * ((e % 128) / 32);
        const float d = h2f((uint16_t)rd16(b + 64));
        const uint8_t *q = b + 32 * (e / 128) + e % 32;
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = (float)((int)((q[i] >> sh) & 3u) - 1) * d;
        return;
    }
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
    } else if (KIND == TN_CW_Q2_K) { /* 84-byte blocks of 256: scales[16] (4-bit scale | 4-bit min), qs[64], d, dmin */
        const uint8_t *b = rowp + (e0 / 256) * 84;
        const int e = (int)(e0 % 256);
        const uint32_t sc = b[e / 16]; /* e .. e+7 share a group of 16 */
        const float d = h2f(*(const uint16_t *)(b + 80)), dmin = h2f(*(const uint16_t *)(b + 82));
        const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
        const uint32_t *qp = (const uint32_t *)(b + 16 + 32 * (e / 128) + e % 32); /* blocks are 4-byte aligned */
        const uint32_t w[2] = {qp[0], qp[1]};
        const int sh = 2 * ((e % 128) / 32);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = dl * (float)((w[i / 4] >> (8 * (i % 4) + sh)) & 3u) - ml;
    } else if (KIND == TN_CW_Q3_K) { /* blocks padded to 112 bytes at upload: hmask[32], qs[64], scales[12], d */
        const uint8_t *b = rowp + (e0 / 256) * TN_CU_Q3K_STRIDE;
        const int e = (int)(e0 % 256), j = e / 16;
        const uint8_t *sc = b + 96;
        const int lo = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4, hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        const float dl = h2f(*(const uint16_t *)(b + 108)) * (float)((lo | (hi << 4)) - 32);
        const uint2 q = *(const uint2 *)(b + 32 + 32 * (e / 128) + e % 32);
        const uint2 h = *(const uint2 *)(b + e % 32);
        const uint32_t qw[2] = {q.x, q.y}, hw[2] = {h.x, h.y};
        const int sh = 2 * ((e % 128) / 32), hb = e / 32;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int low = (int)((qw[i / 4] >> (8 * (i % 4) + sh)) & 3u), high = (int)((hw[i / 4] >> (8 * (i % 4) + hb)) & 1u);
            v[i] = dl * (float)(low - (high ? 0 : 4));
        }
    } else if (KIND == TN_CW_IQ4_XS) { /* 136-byte blocks of 256: d, scales_h, scales_l[4], qs[128] */
        const uint8_t *b = rowp + (e0 / 256) * 136;
        const int e = (int)(e0 % 256), ib = e / 32;
        const uint32_t sh = *(const uint16_t *)(b + 2);
        const int ls = (int)(((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3u) << 4));
        const float dl = h2f(*(const uint16_t *)b) * (float)(ls - 32);
        const uint2 u = *(const uint2 *)(b + 8 + 16 * ib + e % 16);
        const uint32_t w[2] = {u.x, u.y};
        const int s = (e % 32) < 16 ? 0 : 4; /* elements 0-15 of a sub-block: low nibbles; 16-31: high */
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = dl * (float)iq4nl_value((w[i / 4] >> (8 * (i % 4) + s)) & 0xFu);
    } else if (KIND == TN_CW_IQ4_NL || KIND == TN_CW_MXFP4) { /* a row: codes [k/32][16], then the k/32 scales */
        const int64_t blk = e0 / 32;
        const uint2 u = *(const uint2 *)(rowp + blk * 16 + e0 % 16);
        const uint32_t w[2] = {u.x, u.y};
        const int s = (e0 % 32) < 16 ? 0 : 4;
        if (KIND == TN_CW_IQ4_NL) {
            const float d = h2f(*(const uint16_t *)(rowp + k / 2 + blk * 2));
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = d * (float)iq4nl_value((w[i / 4] >> (8 * (i % 4) + s)) & 0xFu);
        } else {
            const float d = e8m0_half(rowp[k / 2 + blk]);
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = (float)mxfp4_value((w[i / 4] >> (8 * (i % 4) + s)) & 0xFu) * d;
        }
    }
}

/* acc plus the dot product of 8 weights v and 8 activations at xp: one expression that every
 * float-path variant (token tiles, one token, gate|up pairs) inlines, so they compile to the same
 * operations (test_cuda checks their bits) */
__device__ __forceinline__ float dot8(float acc, const float v[8], const float *xp) {
    const float4 a = ((const float4 *)xp)[0], b = ((const float4 *)xp)[1];
    return acc + (v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y + v[6] * b.z + v[7] * b.w);
}

/* With gl.h (one token): gate|up pairs as k_gemv_code's, a warp's gate row i, then its up row i + m/2. */
template <int KIND, int NT>
__global__ void __launch_bounds__(GEMV_WARPS_MAX * WARP, GEMV_MIN_BLOCKS)
    k_gemv_float(tn_cw w, const float *x, int64_t ldx, int n, float *y, int64_t ldy, const float *bias, int accumulate, int wpr,
                 tn_cu_tail tail, tn_cu_glu gl, tn_cu_ex ex) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, part = warp % wpr, rpb = GEMV_WARPS_MAX / wpr;
    if constexpr (NT == 1) /* as k_gemv_code */
        if (ex.sel) w.m = ex.rows;
    const bool pair = NT == 1 && gl.h != nullptr;
    const int64_t half = w.m / 2, units = pair ? half : w.m;
    int64_t rg0, rg1;
    gemv_rows(units, rpb, &rg0, &rg1);
    if (d_prefetch && (NT > 1 || !ex.sel) && rg0 < rg1) {
        const int64_t r0 = rg0 * rpb, nr = min(units, rg1 * rpb) - r0;
        for (int h = 0; h < (pair ? 2 : 1); h++)
            prefetch_l2((const uint8_t *)w.data + (r0 + h * half) * (int64_t)w.row_bytes, (size_t)(nr * (int64_t)w.row_bytes));
    }
    gdc_wait();
    if constexpr (NT == 1) if (ex.sel) { /* the pair's expert and input row (its output row and biases where they are
                                           * written: held across the loop, the offsets cost the Q6_K kernel a spill) */
        const int64_t p = blockIdx.y, e = ex.sel[p];
        w.data = (const uint8_t *)w.data + e * w.m * (int64_t)w.row_bytes;
        x += p / ex.div * ldx;
    }
    for (int64_t rg = rg0; rg < rg1; rg++) {
        if (pair) {
            const int64_t i = rg * rpb + warp / wpr;
            const bool valid = i < half;
            float acc[2] = {0.0f, 0.0f};
            for (int r = 0; r < 2; r++) {
                const uint8_t *rowp = (const uint8_t *)w.data + (valid ? i + r * half : 0) * (int64_t)w.row_bytes;
#pragma unroll 4
                for (int64_t e0 = ((int64_t)lane + (int64_t)WARP * part) * 8; valid && e0 < w.k; e0 += (int64_t)WARP * wpr * 8) {
                    float v[8];
                    load8<KIND>(rowp, e0, w.k, w.grid, v);
                    acc[r] = dot8(acc[r], v, x + e0);
                }
            }
            tn_cu_glu gp = gl; /* a pair's h row (offsets applied here, not held across the loop) */
            if (ex.sel) gp.h += blockIdx.y * half;
            gemv_finish_glu(acc, wpr, i, half, gp);
            continue;
        }
        const int64_t row = rg * rpb + warp / wpr;
        const bool valid = row < w.m;
        const uint8_t *rowp = (const uint8_t *)w.data + (valid ? row : 0) * (int64_t)w.row_bytes;
        if (rg + 1 < rg1 && row + rpb < w.m) { /* the warp's next row into L1 meanwhile */
            const uint8_t *np = rowp + (int64_t)rpb * (int64_t)w.row_bytes;
            for (int64_t e0 = ((int64_t)lane + (int64_t)WARP * part) * 8; e0 < w.k; e0 += (int64_t)WARP * wpr * 8)
                prefetch_l1(np + (int64_t)w.row_bytes * e0 / w.k);
        }
        for (int t0 = 0; t0 < n; t0 += NT) { /* token tiles, as k_gemv_code */
            const int nt = min(NT, n - t0);
            float acc[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) acc[t] = 0.0f;
#pragma unroll(NT == 1 ? 4 : 1) /* one token: four loads of a lane in flight */
            for (int64_t e0 = ((int64_t)lane + (int64_t)WARP * part) * 8; valid && e0 < w.k; e0 += (int64_t)WARP * wpr * 8) {
                float v[8];
                load8<KIND>(rowp, e0, w.k, w.grid, v);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= nt) break;
                    acc[t] = dot8(acc[t], v, x + (int64_t)(t0 + t) * ldx + e0);
                }
            }
            gemv_finish(acc, nt, wpr, valid, row, t0, NT == 1 && ex.sel ? y + blockIdx.y * ldy : y, ldy,
                        NT == 1 && ex.sel && bias ? bias + ex.sel[blockIdx.y] * w.m : bias, accumulate); /* the expert's biases */
        }
    }
    if constexpr (NT == 1) /* one-token steps only (the tiles' registers stay theirs) */
        if (tail.cnt) norm_tail(tail);
}
template <int KIND> __global__ void k_dequant_float(tn_cw w, int64_t r0, int64_t nr, void *out, int f16) {
    gdc_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* 8 elements per thread */
    const int64_t n8 = w.k / 8;
    if (i >= nr * n8) return;
    const int64_t row = r0 + i / n8, e0 = (i % n8) * 8;
    float v[8];
    load8<KIND>((const uint8_t *)w.data + row * (int64_t)w.row_bytes, e0, w.k, w.grid, v);
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

/* One GEMV launch's shape: warps per row, and a grid of every row group or, with blocks per SM set
 * (tn_cu_configure), at most that many blocks per multiprocessor, each walking its rows. R: rows
 * of a warp at once (one-token steps). */
struct gemv_launch {
    int wpr;
    unsigned grid, block;
};
static gemv_launch gemv_shape(const tn_cw *w, int R) {
    gemv_launch L;
    L.wpr = gemv_wpr(w);
    const int64_t rpb = GEMV_WARPS_MAX / L.wpr * R, nrg = (w->m + rpb - 1) / rpb;
    const int64_t cap = g_grid_cap > 0 ? g_grid_cap : g_bps > 0 && g_sms > 0 ? (int64_t)g_bps * g_sms : nrg;
    L.grid = (unsigned)(nrg < cap ? nrg : cap);
    L.block = GEMV_WARPS_MAX * WARP;
    return L;
}

template <int B, bool ASYM, int NT, int R>
static void launch_gemv_tq(const tn_cw *w, const tn_cq *xq, int n, float *y, int64_t ldy, const float *bias, int acc,
                           const tn_cu_tail &tail, const tn_cu_glu &gl, const tn_cu_ex &ex, unsigned gy, cudaStream_t st) {
    const gemv_launch L = gemv_shape(w, R);
    launch(k_gemv_code<B, 0, ASYM, NT, R>, dim3(L.grid, gy), L.block, 0, st, *w, xq->q, xq->d, xq->s, n, y, ldy, bias, acc, L.wpr,
           tail, gl, ex);
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

/* Every float-path kind (kern_cuda.h): the GEMV and dequantization switches take their cases from this list. */
#define FLOAT_KINDS(X)                                                                                                        \
    X(TN_CW_F32) X(TN_CW_F16) X(TN_CW_BF16) X(TN_CW_Q2_K) X(TN_CW_Q3_K) X(TN_CW_Q4_K) X(TN_CW_Q5_K) X(TN_CW_Q6_K)            \
    X(TN_CW_IQ4_XS) X(TN_CW_IQ4_NL) X(TN_CW_MXFP4) X(TN_CW_IQ2_XXS) X(TN_CW_IQ2_XS) X(TN_CW_IQ2_S) X(TN_CW_IQ3_XXS)         \
    X(TN_CW_IQ3_S) X(TN_CW_IQ1_S) X(TN_CW_IQ1_M) X(TN_CW_TQ1_0) X(TN_CW_TQ2_0) X(TN_CW_VQ2)

/* The launch of a GEMV with NT-token tiles; R rows per warp for the code path (NT = 1 only). */
template <int NT, int R>
static int gemv_run(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, int nn, float *y, int64_t ldy,
                    const float *bias, int accumulate, const tn_cu_tail &tail, const tn_cu_glu &gl, const tn_cu_ex &ex, unsigned gy,
                    cudaStream_t st) {
    const gemv_launch L1 = gemv_shape(w, 1), LR = gemv_shape(w, R);
#define GEMV_FLOAT(K) \
    launch(k_gemv_float<K, NT>, dim3(L1.grid, gy), L1.block, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate, L1.wpr, tail, gl, ex)
#define GEMV_CODE(B, K)                                                                                                  \
    launch(k_gemv_code<B, K, false, NT, R>, dim3(LR.grid, gy), LR.block, 0, st, *w, xq->q, xq->d, xq->s, nn, y, ldy, bias,      \
           accumulate, LR.wpr, tail, gl, ex)
#define GEMV_FLOAT_CASE(K) \
    case K: GEMV_FLOAT(K); break;
#define GEMV_TQ(B, A) launch_gemv_tq<B, A, NT, R>(w, xq, nn, y, ldy, bias, accumulate, tail, gl, ex, gy, st)
    switch (w->kind) {
    FLOAT_KINDS(GEMV_FLOAT_CASE)
    case TN_CW_Q4_0: GEMV_CODE(4, 1); break;
    case TN_CW_Q8_0: GEMV_CODE(8, 2); break;
    case TN_CW_Q5_0: GEMV_CODE(5, 3); break;
    case TN_CW_TQ:
        switch (w->bits * 2 + (w->asym ? 1 : 0)) {
        case 2: GEMV_TQ(1, false); break;
        case 3: GEMV_TQ(1, true); break;
        case 4: GEMV_TQ(2, false); break;
        case 5: GEMV_TQ(2, true); break;
        case 6: GEMV_TQ(3, false); break;
        case 7: GEMV_TQ(3, true); break;
        case 8: GEMV_TQ(4, false); break;
        case 9: GEMV_TQ(4, true); break;
        case 10: GEMV_TQ(5, false); break;
        case 11: GEMV_TQ(5, true); break;
        case 12: GEMV_TQ(6, false); break;
        case 13: GEMV_TQ(6, true); break;
        case 14: GEMV_TQ(7, false); break;
        case 15: GEMV_TQ(7, true); break;
        case 16: GEMV_TQ(8, false); break;
        case 17: GEMV_TQ(8, true); break;
        default: return (int)cudaErrorInvalidValue;
        }
        break;
    default: return (int)cudaErrorInvalidValue;
    }
#undef GEMV_FLOAT
#undef GEMV_FLOAT_CASE
#undef GEMV_CODE
#undef GEMV_TQ
    return tn_cu_err();
}

/* A batch of code-path weights on the tensor cores (k_mmq_code) */
template <int B, int K, bool ASYM>
static void launch_mmq(const tn_cw *w, const tn_cq *xq, int n, float *y, int64_t ldy, const float *bias, int accumulate,
                       cudaStream_t st) {
    const dim3 grid((unsigned)((w->m + MMQ_BM - 1) / MMQ_BM), (unsigned)((n + MMQ_BN - 1) / MMQ_BN));
    launch(k_mmq_code<B, K, ASYM>, grid, MMQ_THREADS, 0, st, *w, xq->q, xq->d, xq->s, n, y, ldy, bias, accumulate, gemv_wpr(w));
}
template <int B, bool ASYM> static void launch_mmq_tq(const tn_cw *w, const tn_cq *xq, int n, float *y, int64_t ldy,
                                                    const float *bias, int accumulate, cudaStream_t st) {
    launch_mmq<B, 0, ASYM>(w, xq, n, y, ldy, bias, accumulate, st);
}
static int mmq_run(const tn_cw *w, const tn_cq *xq, int n, float *y, int64_t ldy, const float *bias, int accumulate, cudaStream_t st) {
    switch (w->kind) {
    case TN_CW_Q4_0: launch_mmq<4, 1, false>(w, xq, n, y, ldy, bias, accumulate, st); break;
    case TN_CW_Q8_0: launch_mmq<8, 2, false>(w, xq, n, y, ldy, bias, accumulate, st); break;
    case TN_CW_Q5_0: launch_mmq<5, 3, false>(w, xq, n, y, ldy, bias, accumulate, st); break;
    case TN_CW_TQ: TQ_SWITCH(launch_mmq_tq, w, xq, n, y, ldy, bias, accumulate, st); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return tn_cu_err();
}

static int gemv(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, int64_t n, float *y, int64_t ldy, const float *bias,
                int accumulate, const tn_cu_tail *tailp, const tn_cu_glu *glp, void *stream, const tn_cu_ex *exq = nullptr) {
    if (n < 1 || n > (1 << 24) || (tailp && n != 1)) return (int)cudaErrorInvalidValue;
    const tn_cu_tail tail = tailp ? *tailp : tn_cu_tail{};
    const tn_cu_glu gl = glp ? *glp : tn_cu_glu{};
    cudaStream_t st = (cudaStream_t)stream;
    const unsigned blk = GEMV_WARPS_MAX * WARP, grid1 = (unsigned)((w->m + GEMV_WARPS_MAX - 1) / GEMV_WARPS_MAX);
    const int nn = (int)n;
    const bool plain1 = w->k % 8 != 0 || ldx % 4 != 0 || ((uintptr_t)x & 15) != 0;
    if (plain1 && w->kind <= TN_CW_BF16) {
        if (w->kind == TN_CW_F32) launch(k_gemv_plain1<TN_CW_F32>, grid1, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate);
        if (w->kind == TN_CW_F16) launch(k_gemv_plain1<TN_CW_F16>, grid1, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate);
        if (w->kind == TN_CW_BF16) launch(k_gemv_plain1<TN_CW_BF16>, grid1, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate);
        /* no tail in this kernel: the norm (or the quantization) on its own */
        if (tailp && !tail.w) return tn_cu_quantize_q8(tail.x, tail.d, tail.d, 1, tail.xq, stream);
        if (tailp) return tn_cu_rmsnorm(tail.x, NULL, tail.y, tail.w, 1, tail.d, tail.eps, tail.xq.q ? &tail.xq : NULL, stream);
        return tn_cu_err();
    }
    const tn_cq none = {NULL, NULL, NULL};
    if (!xq) xq = &none;
    const tn_cu_ex ex = exq ? *exq : tn_cu_ex{};
    const unsigned gy = exq ? (unsigned)exq->pairs : 1u;
    if (g_mmq && nn >= g_mmq && tn_cw_is_code(w->kind) && !exq && (nn + MMQ_BN - 1) / MMQ_BN <= 65535)
        return mmq_run(w, xq, nn, y, ldy, bias, accumulate, st);
    if (nn > 1) return gemv_run<TN_CU_GEMV_MAXN, 1>(w, x, ldx, xq, nn, y, ldy, bias, accumulate, tail, gl, ex, gy, st);
    return g_rows == 2 ? gemv_run<1, 2>(w, x, ldx, xq, nn, y, ldy, bias, accumulate, tail, gl, ex, gy, st)
                       : gemv_run<1, 1>(w, x, ldx, xq, nn, y, ldy, bias, accumulate, tail, gl, ex, gy, st);
}
extern "C" int tn_cu_gemv(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, int64_t n, float *y, int64_t ldy,
                          const float *bias, int accumulate, void *stream) {
    return gemv(w, x, ldx, xq, n, y, ldy, bias, accumulate, NULL, NULL, stream);
}
extern "C" int tn_cu_gemv_tail(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, float *y, const float *bias,
                               int accumulate, const tn_cu_tail *tail, void *stream) {
    if (!tail || !tail->cnt || (tail->xq.q && tail->d % 32 != 0)) return (int)cudaErrorInvalidValue;
    return gemv(w, x, ldx, xq, 1, y, w->m, bias, accumulate, tail, NULL, stream);
}
/* One token's gate|up product w (rows [gate | up], ff = w->m / 2 each) with its GLU into h (the q8
 * tail's contract checked here), for one token or, with ex, for ex->pairs (token, slot) pairs (h and
 * gu rows per pair): fused into the product, or (code rows one at a time) the product into gu, then
 * the GLU kernel. */
static int gemv_glu(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, float *gu, int64_t ldgu, const tn_cu_glu &gl,
                    const tn_cu_tail *tail, void *stream, const tn_cu_ex *ex) {
    const int64_t ff = w->m / 2, pairs = ex ? ex->pairs : 1;
    if (w->m % 2 != 0 || (tail && (!tail->cnt || tail->w || !tail->xq.q || tail->x != gl.h || ff % 32 != 0 || tail->d != pairs * ff)))
        return (int)cudaErrorInvalidValue;
    if (tn_cw_is_code(w->kind) && g_rows != 2) {
        const int e = gemv(w, x, ldx, xq, 1, gu, ldgu, NULL, 0, NULL, NULL, stream, ex);
        return e ? e : tn_cu_swiglu_pair(gu, gl.h, pairs, ff, gl.act, tail ? &tail->xq : NULL, stream);
    }
    return gemv(w, x, ldx, xq, 1, gu, ldgu, NULL, 0, tail, &gl, stream, ex);
}
extern "C" int tn_cu_gemv_glu(const tn_cw *w, const float *x, const tn_cq *xq, float *gu, float *h, int act, const tn_cu_tail *tail,
                              void *stream) {
    if (tn_cw_is_code(w->kind) ? w->k % 32 != 0 : w->k % 8 != 0 || ((uintptr_t)x & 15) != 0) return (int)cudaErrorInvalidValue;
    return gemv_glu(w, x, w->k, xq, gu, w->m, tn_cu_glu{h, act}, tail, stream, NULL);
}

extern "C" int tn_cu_gemv_experts(const tn_cw *w, const tn_cu_ex *ex, const float *x, int64_t ldx, const tn_cq *xq, float *y,
                                  int64_t ldy, const float *bias, const tn_cu_glu *glu, const tn_cu_tail *tail, void *stream) {
    if (!ex || !ex->sel || ex->pairs < 1 || ex->pairs > 65535 || ex->div < 1 || ex->rows < 1 || (tail && !glu) || (bias && glu) ||
        (tn_cw_is_code(w->kind) ? w->k % 32 != 0 : w->k % 8 != 0 || ldx % 4 != 0 || ((uintptr_t)x & 15) != 0))
        return (int)cudaErrorInvalidValue;
    tn_cw v = *w; /* an expert's shape: the kernels pick the launch by it */
    v.m = ex->rows;
    return glu ? gemv_glu(&v, x, ldx, xq, y, ldy, *glu, tail, stream, ex) : gemv(&v, x, ldx, xq, 1, y, ldy, bias, 0, NULL, NULL, stream, ex);
}

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
#define DEQUANT_FLOAT_CASE(K) \
    case K: launch(k_dequant_float<K>, gf, 256, 0, st, *w, r0, nr, out, f16); break;
    FLOAT_KINDS(DEQUANT_FLOAT_CASE)
#undef DEQUANT_FLOAT_CASE
    case TN_CW_Q4_0: launch(k_dequant_code<4, 1, false>, gc, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_Q8_0: launch(k_dequant_code<8, 2, false>, gc, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_Q5_0: launch(k_dequant_code<5, 3, false>, gc, 256, 0, st, *w, r0, nr, out, f16); break;
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
    gdc_enter();
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

/* qwen3's per-head RMSNorm of x [hd] by w, in place, by one warp (lane sums in double, the warp's
 * butterfly): k_rope_store and the fused attention share it, so they give the same bits. */
__device__ __forceinline__ void head_norm_warp(float *x, int hd, const float *w, float eps, int lane) {
    double s = 0;
    for (int i = lane; i < hd; i += WARP) s += (double)(x[i] * x[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float scale = 1.0f / sqrtf((float)(s / (double)hd) + eps);
    for (int i = lane; i < hd; i += WARP) x[i] = (x[i] * scale) * w[i];
}
/* RoPE of rotated pair i0 (even; cos, sin at c[i0], c[i0 + 1]) of head x, in place: neighbours
 * (2i, 2i+1), or the half split (i, i + n_rot/2) with neox. Rounded products, no fused multiply-add,
 * so that every kernel computing it gives the same bits. */
__device__ __forceinline__ void rope_pair(float *x, int i0, const float *c, int n_rot, int neox) {
    const float co = c[i0], si = c[i0 + 1];
    const int a = neox ? i0 / 2 : i0, b = neox ? i0 / 2 + n_rot / 2 : i0 + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = __fsub_rn(__fmul_rn(x0, co), __fmul_rn(x1, si));
    x[b] = __fadd_rn(__fmul_rn(x0, si), __fmul_rn(x1, co));
}

/* tern's rotation of a quantized cache's heads (blocks.c tn_kv_rot) on one head x [hd] in place, by
 * one warp: forward x <- H (D x), inverse x <- D (H x), with D = diag(sg) and H the normalized
 * Walsh-Hadamard matrix in blocks of B (a power of 2 dividing hd); the CPU's butterflies, element for
 * element (a + d, a - d per stage, then the scale 1/sqrt(B)). */
__device__ void kv_rot_warp(float *x, int hd, const float *sg, int B, bool inverse, int lane) {
    if (!inverse) {
        for (int i = lane; i < hd; i += WARP) x[i] *= sg[i];
        __syncwarp();
    }
    const int hb = B / 2;
    for (int len = 1; len < B; len <<= 1) {
        for (int p = lane; p < hd / 2; p += WARP) { /* pair p: block p / hb, its (p % hb)-th pair at this stage */
            const int r = p % hb, j = (p / hb) * B + (r / len) * 2 * len + r % len;
            const float a = x[j], d = x[j + len];
            x[j] = a + d, x[j + len] = a - d;
        }
        __syncwarp();
    }
    const float s = 1.0f / sqrtf((float)B);
    for (int i = lane; i < hd; i += WARP) x[i] *= s;
    __syncwarp();
    if (inverse) {
        for (int i = lane; i < hd; i += WARP) x[i] *= sg[i];
        __syncwarp();
    }
}

/* The bits of a tq<b>g32a cache type (TN_CU_KV_TQ(b)), 0 for the others */
__device__ __forceinline__ int kv_tq_bits(int type) { return type >= TN_CU_KV_TQ(2) && type <= TN_CU_KV_TQ(8) ? type - TN_CU_KV_TQ(0) : 0; }
/* The bits of a per-channel K type (TN_CU_KV_TQC(b)), 0 for the others */
__host__ __device__ __forceinline__ int kv_kc_bits(int type) { return type >= TN_CU_KV_TQC(2) && type <= TN_CU_KV_TQC(4) ? type - TN_CU_KV_TQC(0) : 0; }
/* Bytes of a block of 32 values of a quantized cache type: q8_0 34, q4_0 18, tq<b>g32a 4 + 4 b;
 * a chunk of a per-channel K row 8 + 4 b. */
__device__ __forceinline__ int kv_block_bytes(int type) {
    return type == TN_CU_KV_Q8_0 ? 34 : type == TN_CU_KV_Q4_0 ? 18 : kv_kc_bits(type) ? 8 + 4 * kv_kc_bits(type) : 4 + 4 * kv_tq_bits(type);
}
/* Bytes of a head's first value in a cache row: f16 2 per value, the quantized types a block per 32. */
__device__ __forceinline__ int64_t kv_head_off(int type, int64_t h, int hd) {
    return type == TN_CU_KV_F16 ? h * hd * 2 : h * (hd / 32) * kv_block_bytes(type);
}

/* Writes one plane of width w of a chunk of 32 codes (lane n holds p, its w bits for this plane) to
 * dst (4 w bytes, 4-aligned) in tq's order, by the whole warp: w = 8 byte j = v[j]; 4 byte j = v[j] |
 * v[j+16] << 4; 2 byte j = v[j] | v[j+8] << 2 | v[j+16] << 4 | v[j+24] << 6; 1 bit n = v[n]. Each
 * lane shifts its code to its place in its 32-bit word, the lanes of a word OR theirs together
 * (butterflies over the lane bits that do not change the word), and the word's first lane stores it. */
__device__ __forceinline__ void tq_pack_plane(uint8_t *dst, uint32_t p, int w, int lane) {
    const int nb = 4 * w; /* the plane's bytes */
    uint32_t v = w == 1 ? p << lane : p << (8 * (lane % 4) + w * (lane / nb));
    for (int o = 1; o < WARP; o <<= 1) /* w is the warp's: every lane takes the same branches */
        if (w == 1 || o < 4 || o >= nb) v |= __shfl_xor_sync(0xffffffffu, v, o);
    if (w == 1 ? lane == 0 : lane % 4 == 0 && lane < nb) ((uint32_t *)dst)[w == 1 ? 0 : lane / 4] = v;
}
/* The warp's 32 codes (lane n holds code c of b bits) into tq's planes at codes (4 b bytes). */
__device__ __forceinline__ void tq_pack_code(uint8_t *codes, int bits, int c, int lane) {
    for (int pl = 0, s = 0; pl < 3; pl++) {
        const int w = tq_plane_width(bits, pl);
        if (!w) break;
        tq_pack_plane(codes, ((uint32_t)c >> s) & ((1u << w) - 1u), w, lane);
        s += w, codes += 4 * w;
    }
}
/* Code i (0..31) of a tq<b>g32a block's planes (at codes) */
__device__ __forceinline__ int tq_code(const uint8_t *codes, int bits, int i) {
    int c = 0, s = 0;
    for (int pl = 0; pl < 3; pl++) {
        const int w = tq_plane_width(bits, pl);
        if (!w) break;
        const int v = w == 1 ? (codes[i / 8] >> (i % 8)) & 1 : (codes[i % (4 * w)] >> (w * (i / (4 * w)))) & ((1 << w) - 1);
        c |= v << s;
        s += w, codes += 4 * w;
    }
    return c;
}

/* Stores value v (lane's element of a block of 32) as element e0 + lane of a cache row of type t, by
 * the whole warp: f16 as it is; q8_0 / q4_0 with ggml's reference quantizers (the CPU's
 * tn_quantize_row_q8_0_ref / _q4_0_ref, so the CPU and the GPU store the same bytes): q8_0 d =
 * amax/127, q = roundf(x / d); q4_0 d = max/-8 (max: the first element of largest magnitude, sign
 * kept), q = min(15, (int)(x / d + 8.5)), element j in the low nibble of byte j, j + 16 in the high. */
__device__ __forceinline__ void kv_store_warp(uint8_t *row, int t, int64_t e0, float v, int lane) {
    if (t == TN_CU_KV_F16) {
        ((__half *)row)[e0 + lane] = __float2half_rn(v);
        return;
    }
    const int64_t blk = e0 / 32;
    const float av = fabsf(v);
    if (kv_tq_bits(t)) { /* tn_tq_quantize_row_rtn: d = (max - min) / (2^b - 1), m = min, both rounded to
                          * fp16, c = clamp(rint((x - m) / d)) against the rounded values (tn_tq_finish_group) */
        const int bits = kv_tq_bits(t), nmax = (1 << bits) - 1;
        const float mn = -warp_max(-v), mx = warp_max(v);
        const __half dh = __float2half_rn(__fsub_rn(mx, mn) / (float)nmax), mh = __float2half_rn(mn);
        const float d = __half2float(dh), m = __half2float(mh);
        int c = 0;
        if (d != 0.0f) {
            c = __float2int_rn(__fmul_rn(__fsub_rn(v, m), 1.0f / d));
            c = c < 0 ? 0 : c > nmax ? nmax : c;
        }
        uint8_t *b = row + blk * kv_block_bytes(t);
        if (lane == 0) ((__half *)b)[0] = dh, ((__half *)b)[1] = mh;
        tq_pack_code(b + 4, bits, c, lane);
        return;
    }
    if (t == TN_CU_KV_Q8_0) {
        const float d = warp_max(av) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t *b = row + blk * 34;
        b[2 + lane] = (uint8_t)(int8_t)roundf(v * id);
        if (lane == 0) *(__half *)b = __float2half_rn(d);
        return;
    }
    /* q4_0: the lowest lane holding the largest magnitude */
    float am = av;
    int al = lane;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, am, o);
        const int ol = __shfl_xor_sync(0xffffffffu, al, o);
        if (om > am || (om == am && ol < al)) am = om, al = ol;
    }
    const float mx = __shfl_sync(0xffffffffu, v, al);
    const float d = mx / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const float hi_v = __shfl_down_sync(0xffffffffu, v, 16); /* element lane + 16 for lanes < 16 */
    uint8_t *b = row + blk * 18;
    if (lane < 16) {
        int lo = (int)__fadd_rn(__fmul_rn(v, id), 8.5f), hi = (int)__fadd_rn(__fmul_rn(hi_v, id), 8.5f); /* no fused multiply-add: the CPU's bytes */
        lo = lo < 15 ? lo : 15;
        hi = hi < 15 ? hi : 15;
        b[2 + lane] = (uint8_t)(lo | (hi << 4));
    }
    if (lane == 0) *(__half *)b = __float2half_rn(d);
}

/* Value i (of a head starting at p) of a cache row of type t, as the CPU dequantizes it. */
__device__ __forceinline__ float kv_value(const uint8_t *p, int t, int i) {
    if (t == TN_CU_KV_F16) return __half2float(((const __half *)p)[i]);
    if (t == TN_CU_KV_Q8_0) {
        const uint8_t *b = p + (i / 32) * 34;
        return (float)(int8_t)b[2 + i % 32] * h2f(*(const uint16_t *)b);
    }
    if (kv_tq_bits(t)) { /* d c + m */
        const uint8_t *b = p + (i / 32) * kv_block_bytes(t);
        return __fadd_rn(__fmul_rn(h2f(((const uint16_t *)b)[0]), (float)tq_code(b + 4, kv_tq_bits(t), i % 32)),
                         h2f(((const uint16_t *)b)[1]));
    }
    const uint8_t *b = p + (i / 32) * 18;
    const int j = i % 32, q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
    return (float)(q - 8) * h2f(*(const uint16_t *)b);
}

/* q . k for a tq<B>g32a K head at p and the query as q8 blocks (codes qq, 16-byte aligned; scales qd;
 * sums qs): per block d_q (d_k sum(c q) + m_k sum(q)), summed in block order, as the CPU's
 * tn_tq_vec_dot_ref (rounded operations: no contraction to fused multiply-adds). */
template <int B> __device__ float kv_dot_tq(const uint8_t *p, const int8_t *qq, const float *qd, const int32_t *qs, int hd) {
    float s = 0.0f;
    for (int b = 0; b < hd / 32; b++) {
        const uint8_t *kb = p + b * (4 + 4 * B);
        uint32_t c[8];
        load_chunk<B>(kb + 4, 0, 1, c);
        const int *a = (const int *)(qq + b * 32);
        int sq = 0;
#pragma unroll
        for (int g = 0; g < 8; g++) sq = dp4a_us(c[g], a[g], sq);
        const float d = h2f(((const uint16_t *)kb)[0]), m = h2f(((const uint16_t *)kb)[1]);
        s = __fadd_rn(s, __fmul_rn(qd[b], __fadd_rn(__fmul_rn(d, (float)sq), __fmul_rn(m, (float)qs[b]))));
    }
    return s;
}

/* q . k for a quantized K head at p and the query as q8 blocks (qq codes, qd fp16-rounded scales, qs
 * sums): q8_0 / q4_0 per block the integer sum, then sum += sumi * (d_k * d_q) in block order, as
 * the CPU's vec_dot_q8_0_q8_0 / q4_0_q8_0 reference; tq<b>g32a kv_dot_tq. */
__device__ __forceinline__ float kv_dot_q(const uint8_t *p, int t, const int8_t *qq, const float *qd, const int32_t *qs, int hd) {
    switch (kv_tq_bits(t)) {
    case 2: return kv_dot_tq<2>(p, qq, qd, qs, hd);
    case 3: return kv_dot_tq<3>(p, qq, qd, qs, hd);
    case 4: return kv_dot_tq<4>(p, qq, qd, qs, hd);
    case 5: return kv_dot_tq<5>(p, qq, qd, qs, hd);
    case 6: return kv_dot_tq<6>(p, qq, qd, qs, hd);
    case 7: return kv_dot_tq<7>(p, qq, qd, qs, hd);
    case 8: return kv_dot_tq<8>(p, qq, qd, qs, hd);
    default: break;
    }
    float s = 0.0f;
    for (int b = 0; b < hd / 32; b++) {
        int sumi = 0;
        const int8_t *qb = qq + b * 32;
        const uint8_t *kb = p + b * kv_block_bytes(t);
        if (t == TN_CU_KV_Q8_0)
            for (int i = 0; i < 32; i++) sumi += (int)(int8_t)kb[2 + i] * (int)qb[i];
        else
            for (int j = 0; j < 16; j++) sumi += ((kb[2 + j] & 15) - 8) * (int)qb[j] + ((kb[2 + j] >> 4) - 8) * (int)qb[j + 16];
        s += (float)sumi * (h2f(*(const uint16_t *)kb) * qd[b]);
    }
    return s;
}

#ifdef TN_CUDA_EMU /* (libstdc++ spells the attribute __noinline__: the emulator cannot define it) */
#define TN_NOINLINE __attribute__((noinline))
#else
#define TN_NOINLINE __noinline__
#endif
/* q . k of a key in a complete per-channel group (quant/kc.h): the kv head's part of the group's
 * first row at g0 (rows k_rb apart), the key its row r; sum over the channels in order of
 * q_c (d_c c + m_c), the stats (d, m) of channel 32 j + i in the group's row i / 2 (chunk j), as
 * the CPU's tn_attn1_kc dequantizes and dots them (rounded operations, no fused multiply-adds). */
template <int B> __device__ float kv_dot_kc(const uint8_t *g0, int64_t k_rb, int r, const float *q, int hd) {
    constexpr int cb = 8 + 4 * B; /* bytes of a chunk */
    float s = 0.0f;
    for (int j = 0; j < hd / 32; j++) {
        uint32_t c[8];
        load_chunk<B>(g0 + r * k_rb + j * cb + 8, 0, 1, c);
#pragma unroll 4
        for (int i = 0; i < 32; i++) {
            const uint16_t *st = (const uint16_t *)(g0 + (i / 2) * k_rb + j * cb) + 2 * (i % 2);
            const float code = (float)((c[i / 4] >> (8 * (i % 4))) & 0xFFu);
            s = __fadd_rn(s, __fmul_rn(q[32 * j + i], __fadd_rn(__fmul_rn(h2f(st[0]), code), h2f(st[1]))));
        }
    }
    return s;
}
/* (not inlined: the per-channel path's registers stay out of the attention kernels' other paths) */
__device__ TN_NOINLINE float kv_dot_kc_b(int bits, const uint8_t *g0, int64_t k_rb, int r, const float *q, int hd) {
    return bits == 2 ? kv_dot_kc<2>(g0, k_rb, r, q, hd) : bits == 3 ? kv_dot_kc<3>(g0, k_rb, r, q, hd) : kv_dot_kc<4>(g0, k_rb, r, q, hd);
}
/* The f16 row of position p of token t's sequence in a per-channel K window, at kv head kvh. */
__device__ __forceinline__ const __half *kv_kc_win(const tn_cu_kv &kv, int64_t t, int p, int kv_dim, int kvh, int hd) {
    return (const __half *)kv.kw + (int64_t)(kv.wseq[t] + p % kv.kc_w) * kv_dim + (int64_t)kvh * hd;
}

/* The cache row of position p: p (the contiguous cache; p % ring in a sliding-window layer's
 * ring), or its block's row in the token's table at tbl + off (paged blocks of 16). */
__device__ __forceinline__ int64_t kv_pos_row(const tn_cu_kv &kv, int off, const int32_t *tbl, int p) {
    return off < 0 ? (kv.ring ? p % kv.ring : p) : (int64_t)tbl[off + p / 16] * 16 + p % 16;
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

#define ATT_THREADS 256
#define ATT_CHUNK TN_CU_ATT_CHUNK
/* Blocks of 256 threads per (token, head), positions in chunks of 512: the threads score a chunk's
 * positions in parallel (each a whole K row, 16-byte loads), the block takes the chunk's max m and
 * its sum l of exp(s - m), then thread (g, d) accumulates dimension d of V over the chunk's
 * positions g, g+G, .. (G = 256/hd groups; rows read whole by consecutive threads), the groups
 * summed into the chunk's o. The chunks' (m, l, o) are folded in order, each rescaled to the
 * running maximum (attn_fold), and the output is o / l. f32 throughout; K, V in f16 as the cache
 * holds them.
 * Flash-decoding (sp.part, S > 1): a (token, head) with K > 1 chunks has min(S, K) blocks, block s
 * taking chunks s, s + S, ..; each writes its chunks' (m, l, o) to sp.part, and the last block to
 * finish (counted on sp.cnt) folds all K in order. The same per-chunk arithmetic and the same fold
 * in the same order as one block doing every chunk: the same bits for any S. */
/* A quantized cache (kv.tk / kv.tv q8_0 or q4_0): a quantized K is dotted with the query as q8
 * blocks (the CPU's activation quantizer), integer sums per block, as the CPU's attention over such
 * a cache; V values are dequantized as they are accumulated. A rotated cache (kv.rot_k, kv.rot_v):
 * the query (rot_k) is rotated like the keys were, and the output (rot_v) rotated back. */
/* With ar.cs (one-token steps, kern_cuda.h's tn_cu_rope): the block first does what k_rope_store
 * would for its head: the query head's norm and RoPE in shared memory, and its key/value head's
 * new row normed, rotated and rounded to fp16, which it uses for the token's own position (the
 * leader of each group of query heads stores it to the cache: no block of this launch reads it
 * there). The same functions as k_rope_store, so the same bits. */
/* dot + q[0 .. 7] . the 8 f16 values in u, as fused multiply-adds in order (written out: the same
 * bits in every kernel that inlines it) */
__device__ __forceinline__ float dot8_h(float dot, const float *q, const uint4 &u) {
    const __half2 *h2 = (const __half2 *)&u;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const float2 f = __half22float2(h2[c]);
        dot = __fmaf_rn(q[2 * c + 1], f.y, __fmaf_rn(q[2 * c], f.x, dot));
    }
    return dot;
}
/* The running fold (M, L, O) of the chunks so far and one more chunk (m, l, o): both rescaled to
 * the larger maximum. Rounded as written (no contraction): the split and unsplit paths fold with
 * these same operations. The first chunk gives (m, l, o) exactly (a = 0, b = 1). */
__device__ __forceinline__ float attn_fold_add(float X, float x, float a, float b) { return __fadd_rn(__fmul_rn(X, a), __fmul_rn(x, b)); }
__device__ __forceinline__ void attn_fold(float &M, float &L, float &O, float m, float l, float o) {
    const float Mn = fmaxf(M, m), a = expf(M - Mn), b = expf(m - Mn);
    L = attn_fold_add(L, l, a, b);
    O = attn_fold_add(O, o, a, b);
    M = Mn;
}
/* The fold of K chunks' partials (m, l, o[hd]) at pp, in order, read through L2 (other blocks wrote
 * them): (M, L, O) for dimension tid < hd. Not inlined: a path taken once per split (token, head),
 * whose registers would otherwise add to the persistent kernel's. */
__device__ TN_NOINLINE float3 attn_fold_parts(const float *pp, int K, int hd, int tid) {
    float M = -INFINITY, L = 0.0f, O = 0.0f;
    for (int c = 0; c < K; c++, pp += hd + 2) attn_fold(M, L, O, __ldcg(pp), __ldcg(pp + 1), tid < hd ? __ldcg(pp + 2 + tid) : 0.0f);
    return make_float3(M, L, O);
}
/* (The body of block s of S of `unit` = token * n_head + head; k_attn_block and the persistent
 * kernel call it with ATT_THREADS threads; a block with nothing to do returns at once.) */
__device__ __forceinline__ void attn_unit(int64_t unit, int s, int S, const tn_cu_attn_sched &sp, const float *q, int64_t ldq,
                                          const uint8_t *Kc, const uint8_t *Vc, int n_head, int n_head_kv, int hd,
                                          const int32_t *pos, const int32_t *tbl_off, const int32_t *tbl, float scale, float cap,
                                          int window, const float *sinks, float *out, const tn_cq &xq, const tn_cu_rope &ar,
                                          const tn_cu_kv &kv) {
    __shared__ __align__(16) float qs[2 * ATT_THREADS];
    __shared__ float sc[ATT_CHUNK];
    __shared__ int32_t rows[ATT_CHUNK];
    __shared__ float red[ATT_THREADS / WARP];
    __shared__ float part[ATT_THREADS];
    __shared__ __align__(16) float kf[ATT_THREADS], vf[ATT_THREADS];
    /* the token's own new K and V rows (one head) as the cache stores them: f16, or q8_0 / q4_0 blocks */
    __shared__ __align__(16) __half kh[ATT_THREADS], vh[ATT_THREADS];
    __shared__ __align__(16) int8_t qq[ATT_THREADS]; /* a quantized K: the query as q8 blocks (codes, scales, sums) */
    __shared__ float qd[ATT_THREADS / 32];
    __shared__ int32_t qsum[ATT_THREADS / 32];
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int64_t t = unit / n_head;
    const int h = (int)(unit % n_head), kvh = h / (n_head / n_head_kv), kv_dim = n_head_kv * hd;
    const bool f16kv = kv.tk == TN_CU_KV_F16 && kv.tv == TN_CU_KV_F16;
    const int64_t k_rb = f16kv ? (int64_t)kv_dim * 2 : kv.k_rb, v_rb = f16kv ? (int64_t)kv_dim * 2 : kv.v_rb;
    const int64_t koff = kv_head_off(kv.tk, kvh, hd), voff = kv_head_off(kv.tv, kvh, hd);
    /* positions p_lo .. T - 1 (all, or the last `window` on a sliding-window layer) in K chunks of
     * ATT_CHUNK from p_lo; chunk c by split block c % Se (Se = 1: this block does them all) */
    const int T = pos[t] + 1, off = tbl_off[t], p_lo = window > 0 && T > window ? T - window : 0;
    const int K = (T - p_lo + ATT_CHUNK - 1) / ATT_CHUNK;
    const int Se = sp.part && K <= sp.kmax ? min(S, K) : 1;
    if (s >= Se) return;
    for (int i = tid; i < hd; i += ATT_THREADS) qs[i] = q[t * ldq + (int64_t)h * hd + i];
    const bool fused = ar.cs != nullptr;
    if (fused) {
        for (int i = tid; i < hd; i += ATT_THREADS) {
            kf[i] = ar.k[t * ar.ldk + (int64_t)kvh * hd + i];
            vf[i] = ar.v[t * ar.ldk + (int64_t)kvh * hd + i];
        }
        __syncthreads();
        if (ar.qn && warp == 0) head_norm_warp(qs, hd, ar.qn, ar.eps, lane);
        if (ar.kn && warp == 1) head_norm_warp(kf, hd, ar.kn, ar.eps, lane);
        __syncthreads();
        const int np2 = ar.n_rot / 2;
        for (int u = tid; u < 2 * np2; u += ATT_THREADS)
            rope_pair(u < np2 ? qs : kf, 2 * (u % np2), ar.cs + t * ar.n_rot, ar.n_rot, ar.neox);
        __syncthreads();
        if (kv.rot_k && warp == 0) kv_rot_warp(qs, hd, kv.rot_sign, kv.rot_blk, false, lane);
        if (kv.rot_k && warp == 1) kv_rot_warp(kf, hd, kv.rot_sign, kv.rot_blk, false, lane);
        if (kv.rot_v && warp == 2) kv_rot_warp(vf, hd, kv.rot_sign, kv.rot_blk, false, lane);
        __syncthreads();
        if (f16kv) {
            for (int i = tid; i < hd; i += ATT_THREADS) {
                kh[i] = __float2half_rn(kf[i]);
                vh[i] = __float2half_rn(vf[i]);
            }
        } else {
            for (int b = warp; b < 2 * (hd / 32); b += ATT_THREADS / WARP) { /* the head's K blocks, then its V blocks */
                const bool isv = b >= hd / 32;
                const int e0 = (isv ? b - hd / 32 : b) * 32;
                kv_store_warp((uint8_t *)(isv ? vh : kh), isv ? kv.tv : kv.tk, e0, (isv ? vf : kf)[e0 + lane], lane);
            }
        }
        __syncthreads();
        if (h % (n_head / n_head_kv) == 0 && s == 0) { /* the group's leader stores the row's bytes */
            const int64_t r = ar.kvrow[t];
            const int kb = (int)(kv_head_off(kv.tk, 1, hd)), vb = (int)(kv_head_off(kv.tv, 1, hd)); /* a head's bytes */
            for (int i = tid; i < kb; i += ATT_THREADS) ((uint8_t *)ar.Kc)[r * k_rb + koff + i] = ((const uint8_t *)kh)[i];
            for (int i = tid; i < vb; i += ATT_THREADS) ((uint8_t *)ar.Vc)[r * v_rb + voff + i] = ((const uint8_t *)vh)[i];
        }
    } /* else: the query was normed, rotated (and turned, rot_k) by k_rope_store */
    /* per-channel K: keys below Qk (complete groups) from the cache, the others from the window */
    const int kcb = kv_kc_bits(kv.tk), Qk = T - T % 16;
    if (kv.tk != TN_CU_KV_F16 && !kcb) { /* the query as q8 blocks, a warp per block, as the CPU's activation quantizer */
        __syncthreads();
        const tn_cq sq = {qq, qd, qsum};
        for (int b = warp; b < hd / 32; b += ATT_THREADS / WARP) q8_block(qs[b * 32 + lane], lane, b, b * 32, sq);
    }
    const int G = ATT_THREADS / hd, gi = tid / hd, d0 = tid % hd; /* hd <= ATT_THREADS */
    const bool active = gi < G;
    const bool vec = (hd & 7) == 0 && (kv_dim & 7) == 0;
    float M = -INFINITY, L = 0.0f, O = 0.0f; /* the fold of the chunks so far (O: dimension tid < hd) */
    __syncthreads();
    for (int c = s; c < K; c += Se) {
        const int p0 = p_lo + c * ATT_CHUNK, np = min(ATT_CHUNK, T - p0);
        float cmax = -INFINITY;
        for (int j = tid; j < np; j += ATT_THREADS) {
            const int p = p0 + j;
            const int64_t row = kv_pos_row(kv, off, tbl, p);
            const bool own = fused && p == T - 1; /* the new row, in shared memory */
            rows[j] = own ? -1 : (int32_t)row;
            const uint8_t *krow = own ? (const uint8_t *)kh
                                  : kcb && p >= Qk ? (const uint8_t *)kv_kc_win(kv, t, p, kv_dim, kvh, hd) : Kc + row * k_rb + koff;
            float dot = 0.0f;
            if (kcb && p < Qk) { /* (rows of a block are consecutive: the group's first is row - p % 16) */
                dot = kv_dot_kc_b(kcb, krow - (int64_t)(p % 16) * k_rb, k_rb, p % 16, qs, hd);
            } else if (kv.tk != TN_CU_KV_F16 && !kcb) {
                dot = kv_dot_q(krow, kv.tk, qq, qd, qsum, hd);
            } else if (vec) {
                const __half *kr = (const __half *)krow;
#pragma unroll 8 /* the row's loads in flight together (hd <= 64: all of them) */
                for (int i = 0; i < hd; i += 8) dot = dot8_h(dot, qs + i, *(const uint4 *)(kr + i));
            } else {
                const __half *kr = (const __half *)krow;
                for (int i = 0; i < hd; i++) dot += qs[i] * __half2float(kr[i]);
            }
            float sco = dot * scale;
            if (cap > 0.0f) sco = cap * tanhf(sco); /* soft-capped scores (gemma2): scale is then 1/(sqrt(hd) cap) */
            sc[j] = sco;
            cmax = fmaxf(cmax, sco);
        }
        /* the chunk's own softmax: its max m, sum l, and o = sum_j exp(s_j - m) v_j */
        cmax = warp_max(cmax);
        if (lane == 0) red[warp] = cmax;
        __syncthreads();
        float m = red[0];
        for (int w = 1; w < ATT_THREADS / WARP; w++) m = fmaxf(m, red[w]);
        __syncthreads();
        float csum = 0.0f;
        for (int j = tid; j < np; j += ATT_THREADS) {
            const float e = expf(sc[j] - m);
            sc[j] = e;
            csum += e;
        }
        csum = warp_sum(csum);
        if (lane == 0) red[warp] = csum;
        __syncthreads();
        float l = 0.0f;
        for (int w = 0; w < ATT_THREADS / WARP; w++) l += red[w];
        float acc = 0.0f;
        if (active && kv.tv == TN_CU_KV_F16) {
#pragma unroll 8
            for (int j = gi; j < np; j += G) {
                const __half *vr = rows[j] < 0 ? vh : (const __half *)(Vc + (int64_t)rows[j] * v_rb + voff);
                acc = __fmaf_rn(sc[j], __half2float(vr[d0]), acc);
            }
        } else if (active) {
            for (int j = gi; j < np; j += G) {
                const uint8_t *vr = rows[j] < 0 ? (const uint8_t *)vh : Vc + (int64_t)rows[j] * v_rb + voff;
                acc = __fmaf_rn(sc[j], kv_value(vr, kv.tv, d0), acc);
            }
        }
        if (active) part[tid] = acc;
        __syncthreads();
        float o = 0.0f;
        if (tid < hd)
            for (int g = 0; g < G; g++) o += part[g * hd + tid];
        if (Se == 1) {
            attn_fold(M, L, O, m, l, o);
        } else { /* the chunk's partial, for the unit's last block to fold */
            float *pp = sp.part + ((int64_t)unit * sp.kmax + c) * (hd + 2);
            if (tid == 0) pp[0] = m, pp[1] = l;
            if (tid < hd) pp[2 + tid] = o;
        }
        __syncthreads(); /* sc, rows, red and part are rewritten by the next chunk */
    }
    if (Se > 1) { /* split: the unit's last block to finish folds every chunk's partial, in order */
        __shared__ int last;
        __threadfence();
        __syncthreads();
        if (tid == 0) last = atomicAdd(sp.cnt + unit, 1) == Se - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        const float3 f = attn_fold_parts(sp.part + (int64_t)unit * sp.kmax * (hd + 2), K, hd, tid);
        M = f.x, L = f.y, O = f.z;
        if (tid == 0) sp.cnt[unit] = 0;
    }
    if (sinks) L += expf(sinks[h] - M); /* gpt-oss: one more logit in the denominator */
    float *out_t = out + t * (int64_t)n_head * hd + (int64_t)h * hd;
    float r = tid < hd ? O / L : 0.0f;
    if (kv.rot_v) { /* the output rotated back (D H), in shared memory */
        __syncthreads();
        if (tid < hd) kf[tid] = r;
        __syncthreads();
        if (warp == 0) kv_rot_warp(kf, hd, kv.rot_sign, kv.rot_blk, true, lane);
        __syncthreads();
        if (tid < hd) r = kf[tid];
    }
    if (tid < hd) {
        out_t[tid] = r;
        /* the output quantized for Wo as it is written (hd % 32 == 0: whole warps, whole blocks) */
        if (xq.q) {
            const int64_t e = t * (int64_t)n_head * hd + (int64_t)h * hd + tid;
            q8_block(r, lane, e / 32, e - lane, xq);
        }
    }
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
