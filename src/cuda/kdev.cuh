/*
 * kdev.cuh — what every CUDA kernel file of the backend shares (kernels.cu, gemv.cu, attn.cu):
 * the launch helper with programmatic dependent launch, the launch settings (set once by
 * tn_cu_configure in kernels.cu), warp reductions, prefetches, the q8 activation blocks and the
 * RMSNorm scale. Device code only inlined or static: each file is its own CUDA module (no
 * relocatable device code), so the device-side settings exist once per file and tn_cu_configure
 * sets each file's copy (tn_cu_flags_gemv / tn_cu_flags_attn).
 */
#ifndef TN_CUDA_KDEV_CUH
#define TN_CUDA_KDEV_CUH

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
namespace tn_cu { /* (defined in kernels.cu; a namespace keeps them off the library's global names) */
extern bool g_pdl;
extern int g_bps, g_sms, g_grid_cap, g_rows, g_l2;
extern int g_mmq; /* the smallest batch of code-path weights on the tensor cores (tn_cu_set_mmq), 0: none */
} // namespace tn_cu
using tn_cu::g_bps, tn_cu::g_grid_cap, tn_cu::g_l2, tn_cu::g_mmq, tn_cu::g_pdl, tn_cu::g_rows, tn_cu::g_sms;
static __device__ int d_early = 0;    /* small kernels trigger before they wait */
static __device__ int d_prefetch = 0; /* GEMV kernels prefetch their weight rows into L2 before they wait */
/* this file's copy of the device-side settings */
static inline void kdev_set_flags(int early, int prefetch) {
    cudaMemcpyToSymbol(d_early, &early, sizeof early);
    cudaMemcpyToSymbol(d_prefetch, &prefetch, sizeof prefetch);
}
void tn_cu_flags_gemv(int early, int prefetch); /* gemv.cu's copy */
void tn_cu_flags_attn(int early, int prefetch); /* attn.cu's copy */

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

#endif
