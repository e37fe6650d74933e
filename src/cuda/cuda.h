/*
 * cuda.h — tern's CUDA backend, as the rest of tern sees it. Built when CMake finds nvcc
 * (TERN_CUDA=AUTO|ON); without it every entry point reports "built without CUDA" and tern is the
 * CPU engine. A context created with device = TERN_DEVICE_CUDA uploads the weights of its first
 * n_gpu_layers layers (all, and the output, by default) and keeps their KV cache on the GPU;
 * tn_forward_batch then runs those layers there, and the rest on the CPU (the residual stream
 * crosses once per batch).
 */
#ifndef TN_CUDA_CUDA_H
#define TN_CUDA_CUDA_H

#include "model/ctx.h"

typedef struct tn_cuda_info {
    char name[256];
    int cc_major, cc_minor, n_sm;
    uint64_t mem_total, mem_free;
    int driver_version, runtime_version;
} tn_cuda_info;

/* True when this build has the CUDA backend. */
bool tn_cuda_built(void);
/* Number of usable devices (0 with a reason in *why: no driver, no device, not built). */
int tn_cuda_device_count(const char **why);
tern_status tn_cuda_device_info(int dev, tn_cuda_info *out);

typedef struct tn_cuda_ctx tn_cuda_ctx;

/* Uploads the model's weights (layers 0 .. n_gpu_layers - 1; the output too when every layer is
 * on the GPU) and allocates the GPU's KV cache and scratch for c's n_ctx and n_batch. The model
 * must be loaded without repacking (its tensors in the file's types). n_gpu_layers < 0: all. */
tern_status tn_cuda_ctx_create(tern_ctx *c, int32_t n_gpu_layers, tn_cuda_ctx **out);
void tn_cuda_ctx_free(tn_cuda_ctx *g);
/* Batch-invariant results (tern serve): every matrix product through the GEMV kernels, whose
 * result for a token does not depend on the batch it is in (prefill slower than through cuBLAS).
 * Default off: batches above 64 tokens (code-path types) or 8 (float types) use cuBLAS. */
void tn_cuda_set_batch_invariant(tn_cuda_ctx *g, bool on);
/* Whether g runs one-token steps as one persistent kernel (TERN_CUDA_PERSIST=1 and a model it
 * takes: kern_cuda.h tn_cu_persist). */
bool tn_cuda_persistent(const tn_cuda_ctx *g);
/* The blocks per (token, head) the last step's attention launches split its positions across
 * (flash-decoding; 1: unsplit). */
int tn_cuda_attn_splits(const tn_cuda_ctx *g);
/* The forward pass of tn_forward_batch on the GPU (and the CPU for layers past n_gpu_layers).
 * Returns TERN_OK or the CUDA error that stopped it. */
tern_status tn_cuda_forward_batch(tern_ctx *c, const tn_batch *b, const int32_t *const *tables, const int32_t *const *swa_tables);
/* One weight matrix on the device, for tests and tools: uploaded as a context uploads it;
 * matmul: y[n][m] = W x_j for host x[n][k], through the kernels the forward pass would choose
 * for n tokens (invariant: as in a batch-invariant context, the GEMV kernels for every n);
 * dequant: the m x k floats the GPU reconstructs. */
typedef struct tn_cuda_weight tn_cuda_weight;
tern_status tn_cuda_weight_upload(const tn_tensor *t, tn_cuda_weight **out);
void tn_cuda_weight_free(tn_cuda_weight *w);
tern_status tn_cuda_weight_matmul(tn_cuda_weight *w, const float *x, int64_t n, bool invariant, float *y);
tern_status tn_cuda_weight_dequant(tn_cuda_weight *w, float *out);
/* Tests: how the GEMV kernels launch from now on (process-wide; results must not change):
 * prefetch of the weight rows into L2, grid_cap > 0 blocks in all, each walking several row
 * groups (0: a block per row group), and rows (1 or 2) per warp in one-token code-path GEMVs.
 * No programmatic dependent launch. */
void tn_cuda_test_gemv_launch(bool prefetch, int grid_cap, int rows);
/* Code-path batches of at least TN_CUDA_MMQ_MIN tokens (TERN_CUDA_MMQ=N: N) run on the int8 tensor
 * cores with the GEMV kernels' bits: a block takes 64 tokens, so smaller batches of smaller
 * matrices would leave most of the GPU idle. */
#define TN_CUDA_MMQ_MIN 65
/* Tests: code-path batches of at least min_tokens tokens (0: none) on the tensor cores, the others
 * in the GEMV kernels' token tiles, process-wide from now on; returns the smallest batch that uses
 * them (0 on devices before sm_80). */
int tn_cuda_test_mmq(int min_tokens);

/* Device memory bandwidth: a copy kernel over `bytes` (read + write counted), best of reps, GB/s;
 * 0 when there is no device. */
double tn_cuda_peak_copy_gbs(size_t bytes, int reps);
/* Dense fp16 matrix product peak through cuBLAS (n x n x n, fp32 accumulation), best of reps,
 * TFLOP/s; 0 when there is no device. */
double tn_cuda_peak_f16_tflops(int n, int reps);

/* Kernel chosen per weight type, for `tern info` ("tq3g64a: code-path dp4a gemv, f16 cuBLAS gemm"). */
const char *tn_cuda_kernel_name(tn_dtype t);

#endif
