/*
 * tn_cuda_emu.h — a CUDA emulator for tern's tests: the part of the CUDA runtime, cuBLAS and the
 * device language that src/cuda/ uses, on the CPU. tests/cuda/emu/include's cuda_runtime.h,
 * cuda_runtime_api.h, cuda_fp16.h, cuda_bf16.h and cublas_v2.h all include this file, so
 * src/cuda/backend.c (as C) and the .cu files of src/cuda (as C++, TN_CUDA_EMU) compile against
 * it unchanged; test_cuda_emu then runs test_cuda's GPU tests on a machine without a GPU.
 *
 * What it models: device memory is host memory; streams, events and copies are synchronous; a
 * kernel launch runs its blocks one after another (in a shuffled order, as a GPU may; a cooperative
 * launch runs them in phases between grid barriers, every block's threads alive at once), each
 * block's threads as cooperative fibers (one OS thread) that switch only at __syncthreads,
 * __syncwarp and the warp shuffles — a barrier
 * is kept when every live thread of the block (or of the warp) has reached it, and a block whose
 * threads wait at different barriers is reported as a deadlock. __shared__ variables are static
 * (blocks do not overlap). Arithmetic is the host's IEEE float (built with -ffp-contract=off, so
 * __fmul_rn and friends round as on the GPU); libm's expf, tanhf differ from CUDA's by a few ulp.
 * What it does not model: timing, memory coalescing, occupancy, races between blocks, alignment
 * faults, CUDA graphs (capture reports "not supported"; the backend then launches kernel by
 * kernel) and programmatic dependent launch (a no-op). It checks logic, not speed: results
 * computed here are what the same code computes on a GPU up to libm's last bits.
 */
#ifndef TN_CUDA_EMU_H
#define TN_CUDA_EMU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime API (C) ------------------------------------------------------------------------ */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNotSupported = 801,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
} cudaError_t;

typedef struct tn_emu_stream *cudaStream_t;
typedef struct tn_emu_event *cudaEvent_t;
typedef struct tn_emu_graph *cudaGraph_t;
typedef struct tn_emu_graph_exec *cudaGraphExec_t;

enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1, cudaStreamCaptureModeRelaxed = 2 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrL2CacheSize = 38, cudaDevAttrComputeCapabilityMajor = 75 };
#define cudaStreamNonBlocking 0x01

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor, multiProcessorCount;
};

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);

/* ---- cuBLAS (the one product the backend calls) --------------------------------------------- */

typedef struct tn_emu_blas *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_NOT_SUPPORTED = 15 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
/* C = alpha op(A) op(B) + beta C, column-major; A and B fp16, C f32, sums in f32 */
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t comp, cublasGemmAlgo_t algo);

/* the launch the emulator runs: grid and block sizes, the body run once per thread */
typedef struct { unsigned x, y, z; } tn_emu_dim;
cudaError_t tn_emu_run(tn_emu_dim grid, tn_emu_dim block, void (*body)(void *), void *arg);
/* a cooperative launch (cudaLaunchAttributeCooperative): every block live at once, grid barriers */
cudaError_t tn_emu_run_coop(tn_emu_dim grid, tn_emu_dim block, void (*body)(void *), void *arg);
void tn_emu_sync_block(void);
/* the grid-wide barrier of a cooperative launch: every live thread of every block */
void tn_emu_sync_grid(void);
void tn_emu_sync_warp(void);
/* warp exchange: this lane's 8 bytes in, lane src's 8 bytes out (a warp-wide collective) */
uint64_t tn_emu_shfl(uint64_t v, int src);
/* the warp's int8 tensor-core product mma.sync.m16n8k32 (d = a b, 32-bit sums), a warp-wide
 * collective over the fragments as the PTX ISA lays them out: lane (g = lane / 4, t = lane % 4)
 * holds a[0] = row g bytes 4t .. 4t+3, a[1] = row g+8 the same bytes, a[2] = row g bytes 16+4t ..,
 * a[3] = row g+8 those; b[0] = column g bytes 4t .., b[1] = column g bytes 16+4t ..; it gets d[0],
 * d[1] = row g columns 2t, 2t+1 and d[2], d[3] = row g+8. a_signed: a's bytes are int8 (else
 * uint8); b's are int8. */
void tn_emu_mma_i8(int d[4], const uint32_t a[4], const uint32_t b[2], int a_signed);
/* counts of what the emulator ran (tests print them) */
void tn_emu_stats(long *launches, long *blocks, long *switches);

#ifdef __cplusplus
}
#endif

/* ---- the device language (C++: the .cu files of src/cuda) ------------------------------------ */
#ifdef __cplusplus
#include <math.h>
#include <string.h>
#include <tuple>
#include <utility>

#include "core/fp16.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
    dim3(const tn_emu_dim &d) : x(d.x), y(d.y), z(d.z) {}
};
/* the running thread's indices: set by the scheduler before it resumes a thread */
extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

struct float2 { float x, y; };
struct float3 { float x, y, z; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(16) uint4 { unsigned x, y, z, w; };
struct __align__(8) uint2 { unsigned x, y; };
static inline float3 make_float3(float a, float b, float c) { return float3{a, b, c}; }
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }

/* fp16 and bf16 as their bits, converted as the CPU converts them (core/fp16.h: round to nearest
 * even, subnormals, inf and NaN as the hardware) */
struct __half {
    uint16_t x;
};
struct __align__(4) __half2 {
    __half x, y;
};
struct __nv_bfloat16 {
    uint16_t x;
};
static inline float __half2float(__half h) { return tn_fp16_to_fp32(h.x); }
static inline __half __float2half_rn(float f) { return __half{tn_fp32_to_fp16(f)}; }
static inline __half __ushort_as_half(unsigned short v) { return __half{(uint16_t)v}; }
static inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
static inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }

static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline float __uint_as_float(unsigned v) { return tn_bits_f32(v); }
static inline unsigned __float_as_uint(float f) { return tn_f32_bits(f); }
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline int __dp4a(int a, int b, int c) { /* signed bytes of a times signed bytes of b, into c */
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

static inline void __syncthreads(void) { tn_emu_sync_block(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)mask;
    tn_emu_sync_warp();
}
template <typename T> static inline T tn_emu_shfl_t(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    u = tn_emu_shfl(u, src);
    T r;
    memcpy(&r, &u, sizeof r);
    return r;
}
static inline int tn_emu_lane(void) { return (int)((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32u); }
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    (void)mask, (void)width;
    return tn_emu_shfl_t(v, src & 31);
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    (void)mask, (void)width;
    return tn_emu_shfl_t(v, tn_emu_lane() ^ m);
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    (void)mask, (void)width;
    const int l = tn_emu_lane();
    return tn_emu_shfl_t(v, l + (int)d < 32 ? l + (int)d : l);
}

/* atomics, fences and L2 loads: one OS thread runs every fiber and switches only at barriers and
 * shuffles, so a read-modify-write is atomic as it is and memory is coherent */
static inline int atomicAdd(int *p, int v) {
    const int old = *p;
    *p = old + v;
    return old;
}
static inline void __threadfence(void) {}
template <typename T> static inline T __ldcg(const T *p) { return *p; }

/* launches: the launch configuration and cudaLaunchKernelEx as the runtime declares them */
typedef enum { cudaLaunchAttributeCooperative = 2, cudaLaunchAttributeProgrammaticStreamSerialization = 5 } cudaLaunchAttributeID;
typedef struct {
    cudaLaunchAttributeID id;
    union {
        int programmaticStreamSerializationAllowed;
        int cooperative;
    } val;
} cudaLaunchAttribute;
typedef struct {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned numAttrs;
} cudaLaunchConfig_t;

template <typename K, typename Tup> struct tn_emu_call {
    K k;
    Tup args;
    static void run(void *p) {
        tn_emu_call *c = (tn_emu_call *)p;
        std::apply(c->k, c->args); /* each thread gets its own copies of the parameters */
    }
};
template <typename... KArgs, typename... Act>
static inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *cfg, void (*k)(KArgs...), Act &&...args) {
    typedef std::tuple<KArgs...> Tup;
    tn_emu_call<void (*)(KArgs...), Tup> c{k, Tup((KArgs)args...)};
    bool coop = false;
    for (unsigned i = 0; i < cfg->numAttrs; i++) coop |= cfg->attrs[i].id == cudaLaunchAttributeCooperative && cfg->attrs[i].val.cooperative;
    return (coop ? tn_emu_run_coop : tn_emu_run)(tn_emu_dim{cfg->gridDim.x, cfg->gridDim.y, cfg->gridDim.z},
                      tn_emu_dim{cfg->blockDim.x, cfg->blockDim.y, cfg->blockDim.z}, &tn_emu_call<void (*)(KArgs...), Tup>::run, &c);
}
/* one block of any kernel per multiprocessor (the emulator runs them one at a time anyway) */
template <typename K> static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, K k, int threads, size_t shmem) {
    (void)k, (void)shmem;
    *n = threads > 0 && threads <= 1024 ? 1 : 0;
    return cudaSuccess;
}
template <typename T> static inline cudaError_t cudaMemcpyToSymbol(T &sym, const void *src, size_t n, size_t off = 0,
                                                                   cudaMemcpyKind k = cudaMemcpyHostToDevice) {
    (void)k;
    memcpy((char *)&sym + off, src, n);
    return cudaSuccess;
}
#endif /* __cplusplus */

#endif
