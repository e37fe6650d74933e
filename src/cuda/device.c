/*
 * device.c — the CUDA backend's device queries (cuda.h): how many devices, what each is, and the
 * card's peaks that `tern bench --device cuda` reports its results against (copy bandwidth by
 * tern's own copy kernel, fp16 matrix product through cuBLAS).
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda.h"
#include "cuda/kern_cuda.h"

int tn_cuda_device_count(const char **why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why)
            *why = e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice
                       ? "no NVIDIA GPU or driver found on this machine"
                       : cudaGetErrorString(e);
        cudaGetLastError();
        return 0;
    }
    if (n == 0 && why) *why = "no CUDA device found";
    return n;
}

tern_status tn_cuda_device_info(int dev, tn_cuda_info *out) {
    memset(out, 0, sizeof *out);
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, dev);
    if (e != cudaSuccess) return tn_err(TERN_ERR_UNSUPPORTED, "cuda: device %d: %s", dev, cudaGetErrorString(e));
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->n_sm = p.multiProcessorCount;
    size_t fr = 0, tot = 0;
    int prev = 0;
    cudaGetDevice(&prev);
    if (cudaSetDevice(dev) == cudaSuccess && cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
        out->mem_free = fr;
        out->mem_total = tot;
    } else {
        out->mem_total = p.totalGlobalMem;
    }
    cudaSetDevice(prev);
    cudaDriverGetVersion(&out->driver_version);
    cudaRuntimeGetVersion(&out->runtime_version);
    cudaGetLastError();
    return TERN_OK;
}

/* ---- peaks ---------------------------------------------------------------------------------------- */

static double event_best(cudaEvent_t a, cudaEvent_t b, double best) {
    float ms = 0;
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    return ms > 0 && (best <= 0 || ms < best) ? ms : best;
}

double tn_cuda_peak_copy_gbs(size_t bytes, int reps) {
    if (tn_cuda_device_count(NULL) < 1) return 0;
    bytes &= ~(size_t)15;
    void *src = NULL, *dst = NULL;
    cudaEvent_t a = NULL, b = NULL;
    double best = 0;
    if (cudaMalloc(&src, bytes) == cudaSuccess && cudaMalloc(&dst, bytes) == cudaSuccess &&
        cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess) {
        cudaMemset(src, 1, bytes);
        tn_cu_copy_kernel(src, dst, bytes, NULL); /* warm-up */
        for (int r = 0; r < reps; r++) {
            cudaEventRecord(a, NULL);
            tn_cu_copy_kernel(src, dst, bytes, NULL);
            cudaEventRecord(b, NULL);
            best = event_best(a, b, best);
        }
    }
    cudaFree(src), cudaFree(dst);
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    cudaGetLastError();
    return best > 0 ? 2.0 * (double)bytes / (best * 1e-3) / 1e9 : 0;
}

double tn_cuda_peak_f16_tflops(int n, int reps) {
    if (tn_cuda_device_count(NULL) < 1) return 0;
    const size_t e = (size_t)n * (size_t)n;
    void *A = NULL, *B = NULL, *C = NULL;
    cublasHandle_t h = NULL;
    cudaEvent_t a = NULL, b = NULL;
    double best = 0;
    if (cudaMalloc(&A, e * 2) == cudaSuccess && cudaMalloc(&B, e * 2) == cudaSuccess && cudaMalloc(&C, e * 4) == cudaSuccess &&
        cublasCreate(&h) == CUBLAS_STATUS_SUCCESS && cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess) {
        cudaMemset(A, 0x3c, e * 2); /* 0x3c3c: about 1.06 in fp16 */
        cudaMemset(B, 0x3c, e * 2);
        const float one = 1.0f, zero = 0.0f;
        for (int r = -1; r < reps; r++) {
            cudaEventRecord(a, NULL);
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16F, n, B, CUDA_R_16F, n, &zero, C, CUDA_R_32F, n,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            cudaEventRecord(b, NULL);
            if (r >= 0) best = event_best(a, b, best);
            else cudaEventSynchronize(b);
        }
    }
    cudaFree(A), cudaFree(B), cudaFree(C);
    if (h) cublasDestroy(h);
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    cudaGetLastError();
    return best > 0 ? 2.0 * (double)n * n * n / (best * 1e-3) / 1e12 : 0;
}
