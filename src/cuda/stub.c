/*
 * stub.c — the CUDA backend's entry points in a build without the CUDA toolkit: every one reports
 * that this tern was built without CUDA.
 */
#include <string.h>

#include "cuda/cuda.h"

bool tn_cuda_built(void) { return false; }

int tn_cuda_device_count(const char **why) {
    if (why) *why = "this tern was built without CUDA (no nvcc found at configure time; see docs/cuda.md)";
    return 0;
}

tern_status tn_cuda_device_info(int dev, tn_cuda_info *out) {
    memset(out, 0, sizeof *out);
    return tn_err(TERN_ERR_UNSUPPORTED, "cuda: device %d: this tern was built without CUDA", dev);
}

tern_status tn_cuda_ctx_create(tern_ctx *c, int32_t n_gpu_layers, tn_cuda_ctx **out) {
    TN_UNUSED(c);
    TN_UNUSED(n_gpu_layers);
    *out = NULL;
    return tn_err(TERN_ERR_UNSUPPORTED, "--device cuda: this tern was built without CUDA (no nvcc found at configure time)");
}

void tn_cuda_ctx_free(tn_cuda_ctx *g) { TN_UNUSED(g); }

tern_status tn_cuda_forward_batch(tern_ctx *c, const tn_batch *b, const int32_t *const *tables, const int32_t *const *swa_tables) {
    TN_UNUSED(c);
    TN_UNUSED(b);
    TN_UNUSED(tables);
    TN_UNUSED(swa_tables);
    return tn_err(TERN_ERR_UNSUPPORTED, "cuda: this tern was built without CUDA");
}

const char *tn_cuda_kernel_name(tn_dtype t) {
    TN_UNUSED(t);
    return NULL;
}

double tn_cuda_peak_copy_gbs(size_t bytes, int reps) {
    TN_UNUSED(bytes);
    TN_UNUSED(reps);
    return 0;
}

double tn_cuda_peak_f16_tflops(int n, int reps) {
    TN_UNUSED(n);
    TN_UNUSED(reps);
    return 0;
}

tern_status tn_cuda_weight_upload(const tn_tensor *t, tn_cuda_weight **out) {
    TN_UNUSED(t);
    *out = NULL;
    return tn_err(TERN_ERR_UNSUPPORTED, "cuda: this tern was built without CUDA");
}
void tn_cuda_weight_free(tn_cuda_weight *w) { TN_UNUSED(w); }
tern_status tn_cuda_weight_matmul(tn_cuda_weight *w, const float *x, int64_t n, bool invariant, float *y) {
    TN_UNUSED(w), TN_UNUSED(x), TN_UNUSED(n), TN_UNUSED(invariant), TN_UNUSED(y);
    return tn_err(TERN_ERR_UNSUPPORTED, "cuda: this tern was built without CUDA");
}
tern_status tn_cuda_weight_dequant(tn_cuda_weight *w, float *out) {
    TN_UNUSED(w), TN_UNUSED(out);
    return tn_err(TERN_ERR_UNSUPPORTED, "cuda: this tern was built without CUDA");
}

void tn_cuda_test_gemv_launch(bool prefetch, int grid_cap, int rows) {
    TN_UNUSED(prefetch);
    TN_UNUSED(grid_cap);
    TN_UNUSED(rows);
}

int tn_cuda_test_mmq(int min_tokens) {
    TN_UNUSED(min_tokens);
    return 0;
}

bool tn_cuda_persistent(const tn_cuda_ctx *g) {
    (void)g;
    return false;
}
int tn_cuda_attn_splits(const tn_cuda_ctx *g) {
    (void)g;
    return 1;
}
void tn_cuda_set_batch_invariant(tn_cuda_ctx *g, bool on) {
    TN_UNUSED(g);
    TN_UNUSED(on);
}
