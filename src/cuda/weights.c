/*
 * weights.c — the CUDA backend's device memory and weight upload: each file type into the device
 * layout of its kind (kern_cuda.h: the float path's file blocks, padded where their parts must be
 * aligned; the code path's split layout), stacked matrices (q|k|v, gate|up) and expert matrices.
 */
#include <string.h>

#include "cuda/backend.h"
#include "quant/iq_grid.h"
#include "quant/tq.h"
#include "quant/vq.h"

/* The device kind of file type t (kern_cuda.h), or -1 for a type the GPU does not run. */
int tn_cuda_cw_kind_of(tn_dtype t) {
    switch ((int)t) {
    case TN_F32: return TN_CW_F32;
    case TN_F16: return TN_CW_F16;
    case TN_BF16: return TN_CW_BF16;
    case TN_Q4_K: return TN_CW_Q4_K;
    case TN_Q6_K: return TN_CW_Q6_K;
    case TN_Q5_K: return TN_CW_Q5_K;
    case TN_Q2_K: return TN_CW_Q2_K;
    case TN_Q3_K: return TN_CW_Q3_K;
    case TN_IQ4_XS: return TN_CW_IQ4_XS;
    case TN_IQ4_NL: return TN_CW_IQ4_NL;
    case TN_MXFP4: return TN_CW_MXFP4;
    case TN_IQ2_XXS: return TN_CW_IQ2_XXS;
    case TN_IQ2_XS: return TN_CW_IQ2_XS;
    case TN_IQ2_S: return TN_CW_IQ2_S;
    case TN_IQ3_XXS: return TN_CW_IQ3_XXS;
    case TN_IQ3_S: return TN_CW_IQ3_S;
    case TN_IQ1_S: return TN_CW_IQ1_S;
    case TN_IQ1_M: return TN_CW_IQ1_M;
    case TN_TQ1_0: return TN_CW_TQ1_0;
    case TN_TQ2_0: return TN_CW_TQ2_0;
    case TN_Q4_0: return TN_CW_Q4_0;
    case TN_Q8_0: return TN_CW_Q8_0;
    case TN_Q5_0: return TN_CW_Q5_0;
    case TN_VQ2: return TN_CW_VQ2;
    case TN_Q4_1: /* tq4g32a */
    case TN_Q5_1: return TN_CW_TQ; /* tq5g32a once qh moves */
    default: return tn_tq_is(t) ? TN_CW_TQ : -1;
    }
}

const char *tn_cuda_kernel_name(tn_dtype t) {
    const int kind = tn_cuda_cw_kind_of(t);
    if (kind < 0) return NULL;
    if (tn_cw_is_code(kind))
        return "split layout; decode: dp4a GEMV on q8 activations (one template over widths); batches above 8 tokens: int8 "
               "tensor-core GEMM with the GEMV's bits (sm_80+)";
    if (kind >= TN_CW_IQ2_XXS && kind <= TN_CW_IQ1_M)
        return "file layout, codebook grid on the device; decode: f32 GEMV dequantizing in registers; prefill: fp16 dequant + cuBLAS";
    if (kind == TN_CW_VQ2)
        return "blocks in 72-byte slots, the matrix's codebook as floats on the device; decode: f32 GEMV, 8 lookups a lane; "
               "prefill: fp16 dequant + cuBLAS";
    if (kind == TN_CW_IQ4_NL || kind == TN_CW_MXFP4)
        return "codes then scales per row; decode: f32 GEMV dequantizing in registers; prefill: fp16 dequant + cuBLAS";
    return "file layout; decode: f32 GEMV dequantizing in registers; prefill: fp16 dequant + cuBLAS";
}

/* ---- allocation ------------------------------------------------------------------------------ */

void *tn_cuda_dalloc(tn_cuda_ctx *g, size_t bytes, bool *ok) {
    if (!*ok) return NULL;
    if (g->n_allocs == g->cap_allocs) {
        size_t nc = g->cap_allocs ? 2 * g->cap_allocs : 64;
        void **na = tn_realloc(g->allocs, nc * sizeof *na);
        if (!na) return *ok = false, NULL;
        g->allocs = na;
        g->cap_allocs = nc;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        tn_err(TERN_ERR_NOMEM, "cuda: cannot allocate %.1f MiB of device memory (%.1f MiB held): %s",
               (double)bytes / 1048576.0, (double)g->bytes / 1048576.0, cudaGetErrorString(e));
        return *ok = false, NULL;
    }
    g->allocs[g->n_allocs++] = p;
    g->bytes += bytes;
    return p;
}

void *tn_cuda_dupload(tn_cuda_ctx *g, const void *src, size_t bytes, bool *ok) {
    void *p = tn_cuda_dalloc(g, bytes, ok);
    if (p && cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaGetLastError();
        *ok = false;
        tn_err(TERN_ERR_IO, "cuda: upload of %zu bytes failed", bytes);
        return NULL;
    }
    return p;
}

/* ---- weights ----------------------------------------------------------------------------------- */

/* The grid of codebook i-quant kind (iq1_s and iq1_m share one) on the device, uploaded once per
 * context. */
static const void *iq_grid(tn_cuda_ctx *g, int kind, bool *ok) {
    static const struct {
        int kind, slot;
        const void *grid;
        size_t bytes;
    } G[] = {{TN_CW_IQ2_XXS, 0, tn_iq2xxs_grid, sizeof tn_iq2xxs_grid}, {TN_CW_IQ2_XS, 1, tn_iq2xs_grid, sizeof tn_iq2xs_grid},
             {TN_CW_IQ2_S, 2, tn_iq2s_grid, sizeof tn_iq2s_grid},       {TN_CW_IQ3_XXS, 3, tn_iq3xxs_grid, sizeof tn_iq3xxs_grid},
             {TN_CW_IQ3_S, 4, tn_iq3s_grid, sizeof tn_iq3s_grid},       {TN_CW_IQ1_S, 5, tn_iq1s_grid, sizeof tn_iq1s_grid},
             {TN_CW_IQ1_M, 5, tn_iq1s_grid, sizeof tn_iq1s_grid}};
    for (size_t i = 0; i < sizeof G / sizeof G[0]; i++)
        if (G[i].kind == kind) {
            if (!g->iq_grid[G[i].slot]) g->iq_grid[G[i].slot] = tn_cuda_dupload(g, G[i].grid, G[i].bytes, ok);
            return g->iq_grid[G[i].slot];
        }
    return NULL;
}

tern_status tn_cuda_upload_weight(tn_cuda_ctx *g, const tn_tensor *t, tn_cw *w) {
    memset(w, 0, sizeof *w);
    const int64_t k = t->ne[0], m = t->ne[1] ? t->ne[1] : 1;
    w->m = m;
    w->k = k;
    bool ok = true;
    tn_tq_params tp = {0, 0, false};
    w->kind = tn_cuda_cw_kind_of(t->type);
    switch ((int)t->type) {
    case TN_Q4_0: tp = (tn_tq_params){4, 32, false}; break;
    case TN_Q8_0: tp = (tn_tq_params){8, 32, false}; break;
    case TN_Q5_0: tp = (tn_tq_params){5, 32, false}; break;
    case TN_Q4_1: tp = (tn_tq_params){4, 32, true}; break; /* x = d q + m: tq4g32a */
    case TN_Q5_1: tp = (tn_tq_params){5, 32, true}; break; /* tq5g32a once qh moves */
    default:
        if (w->kind >= 0 && !tn_cw_is_code(w->kind)) break; /* the float path: the file's blocks */
        if (tn_tq_is(t->type)) {
            tn_tq_params_of(t->type, &tp);
            break;
        }
        if (tn_dtype_is_internal(t->type))
            return tn_err(TERN_ERR_UNSUPPORTED, "cuda: tensor '%s' is in the in-memory layout %s: load the model with repack off",
                          t->name, tn_dtype_name(t->type));
        return tn_err(TERN_ERR_UNSUPPORTED,
                      "cuda: tensor '%s' has type %s, which the CUDA backend does not run (F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
                      "Q5_0, Q5_1, Q2_K .. Q6_K, the i-quants IQ1_S .. IQ4_XS, MXFP4, TQ1_0, TQ2_0 and tern's tq<b>g<G> and vq2: "
                      "run it on the CPU)",
                      t->name, tn_dtype_name(t->type));
    }
    const int64_t blck = tn_dtype_get(t->type)->blck_size; /* elements per file block */
    if ((tn_cw_is_code(w->kind) && k % tp.group != 0) || (!tn_cw_is_code(w->kind) && blck > 1 && k % blck != 0))
        return tn_err(TERN_ERR_UNSUPPORTED, "cuda: tensor '%s': row length %lld is not a multiple of the kernels' block",
                      t->name, (long long)k);
    if (w->kind == TN_CW_Q6_K || w->kind == TN_CW_Q3_K) { /* each block in a slot of 8-byte aligned parts */
        const size_t bb = w->kind == TN_CW_Q6_K ? 210 : 110, stride = w->kind == TN_CW_Q6_K ? TN_CU_Q6K_STRIDE : TN_CU_Q3K_STRIDE;
        const int64_t nb = k / 256;
        w->row_bytes = (size_t)nb * stride;
        uint8_t *buf = tn_calloc((size_t)m, w->row_bytes);
        if (!buf) return tn_err(TERN_ERR_NOMEM, "cuda: out of host memory padding '%s'", t->name);
        for (int64_t i = 0; i < m * nb; i++) memcpy(buf + (size_t)i * stride, (const uint8_t *)t->data + (size_t)i * bb, bb);
        w->data = tn_cuda_dupload(g, buf, w->row_bytes * (size_t)m, &ok);
        tn_free(buf);
        return ok ? TERN_OK : tn_err_prefix(TERN_ERR_NOMEM, "cuda: tensor '%s'", t->name);
    }
    if (w->kind == TN_CW_VQ2) { /* blocks in 72-byte slots without the row headers; the codebook as floats */
        const size_t rb_file = tn_dtype_row_size(t->type, k);
        const int64_t nb = k / TN_VQ_QK;
        if (t->nbytes < rb_file * (size_t)m + TN_VQ_CB_BYTES)
            return tn_err(TERN_ERR_FORMAT, "cuda: tensor '%s' (vq2): %zu bytes, fewer than its rows and codebook", t->name, t->nbytes);
        w->row_bytes = (size_t)nb * TN_CU_VQ2_STRIDE;
        uint8_t *buf = tn_calloc((size_t)m, w->row_bytes);
        float *cbf = tn_malloc(sizeof(float) * TN_VQ_CB_BYTES);
        if (!buf || !cbf) {
            tn_free(buf), tn_free(cbf);
            return tn_err(TERN_ERR_NOMEM, "cuda: out of host memory rearranging '%s'", t->name);
        }
        const int8_t *cb = tn_vq_codebook(t->data); /* every row's header names the one after the rows */
        for (int i = 0; i < TN_VQ_CB_BYTES; i++) cbf[i] = (float)cb[i];
        for (int64_t r = 0; r < m; r++) {
            const uint8_t *src = (const uint8_t *)t->data + (size_t)r * rb_file + TN_VQ_HDR;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *dst = buf + (size_t)r * w->row_bytes + (size_t)b * TN_CU_VQ2_STRIDE;
                const uint8_t *blk = src + (size_t)b * sizeof(block_vq2);
                memcpy(dst, blk, 6);              /* d, sc[4] */
                memcpy(dst + 8, blk + 6, TN_VQ_NV); /* qs[64]   */
            }
        }
        w->data = tn_cuda_dupload(g, buf, w->row_bytes * (size_t)m, &ok);
        w->grid = tn_cuda_dupload(g, cbf, sizeof(float) * TN_VQ_CB_BYTES, &ok);
        tn_free(buf), tn_free(cbf);
        return ok ? TERN_OK : tn_err_prefix(TERN_ERR_NOMEM, "cuda: tensor '%s'", t->name);
    }
    if (w->kind == TN_CW_IQ4_NL || w->kind == TN_CW_MXFP4) { /* a row: its blocks' codes, then their scales */
        const size_t hdr = w->kind == TN_CW_IQ4_NL ? 2 : 1, bb = hdr + 16; /* iq4_nl: d, qs[16]; mxfp4: e, qs[16] */
        const int64_t nb = k / 32;
        w->row_bytes = ((size_t)nb * bb + 15) / 16 * 16;
        uint8_t *buf = tn_calloc((size_t)m, w->row_bytes);
        if (!buf) return tn_err(TERN_ERR_NOMEM, "cuda: out of host memory rearranging '%s'", t->name);
        for (int64_t r = 0; r < m; r++) {
            const uint8_t *src = (const uint8_t *)t->data + (size_t)(r * nb) * bb;
            uint8_t *dst = buf + (size_t)r * w->row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                memcpy(dst + b * 16, src + (size_t)b * bb + hdr, 16);
                memcpy(dst + nb * 16 + b * (int64_t)hdr, src + (size_t)b * bb, hdr);
            }
        }
        w->data = tn_cuda_dupload(g, buf, w->row_bytes * (size_t)m, &ok);
        tn_free(buf);
        return ok ? TERN_OK : tn_err_prefix(TERN_ERR_NOMEM, "cuda: tensor '%s'", t->name);
    }
    if (!tn_cw_is_code(w->kind)) {
        if (w->kind >= TN_CW_IQ2_XXS && w->kind <= TN_CW_IQ1_M && !(w->grid = iq_grid(g, w->kind, &ok)))
            return tn_err_prefix(TERN_ERR_NOMEM, "cuda: the grid of '%s'", t->name);
        w->row_bytes = tn_dtype_row_size(t->type, k);
        w->data = tn_cuda_dupload(g, t->data, w->row_bytes * (size_t)m, &ok);
        return ok ? TERN_OK : tn_err_prefix(TERN_ERR_NOMEM, "cuda: tensor '%s'", t->name);
    }
    /* split layout: headers out into d (and mn), codes back to back */
    w->bits = tp.bits;
    w->group = tp.group;
    w->asym = tp.asym;
    const int64_t nb = k / tp.group;
    const size_t hdr = tp.asym ? 4 : 2, cb = (size_t)tp.group * (size_t)tp.bits / 8;
    /* q5_0 / q5_1 store qh[4] before qs[16]; tq5's planes are the 4-bit one first */
    const bool q5 = t->type == TN_Q5_0 || t->type == TN_Q5_1;
    const size_t bb = hdr + cb, rb_file = (size_t)nb * bb;
    w->row_bytes = (size_t)nb * cb;
    uint8_t *codes = tn_malloc((size_t)m * w->row_bytes);
    uint16_t *d = tn_malloc((size_t)(m * nb) * 2), *mn = tp.asym ? tn_malloc((size_t)(m * nb) * 2) : NULL;
    if (!codes || !d || (tp.asym && !mn)) {
        tn_free(codes), tn_free(d), tn_free(mn);
        return tn_err(TERN_ERR_NOMEM, "cuda: out of host memory splitting '%s'", t->name);
    }
    for (int64_t r = 0; r < m; r++) {
        const uint8_t *src = (const uint8_t *)t->data + (size_t)r * rb_file;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = src + (size_t)b * bb;
            memcpy(&d[r * nb + b], blk, 2);
            if (tp.asym) memcpy(&mn[r * nb + b], blk + 2, 2);
            uint8_t *dst = codes + (size_t)r * w->row_bytes + (size_t)b * cb;
            if (q5) memcpy(dst, blk + hdr + 4, 16), memcpy(dst + 16, blk + hdr, 4);
            else memcpy(dst, blk + hdr, cb);
        }
    }
    w->data = tn_cuda_dupload(g, codes, (size_t)m * w->row_bytes, &ok);
    w->d = tn_cuda_dupload(g, d, (size_t)(m * nb) * 2, &ok);
    if (tp.asym) w->mn = tn_cuda_dupload(g, mn, (size_t)(m * nb) * 2, &ok);
    tn_free(codes), tn_free(d), tn_free(mn);
    return ok ? TERN_OK : tn_err_prefix(TERN_ERR_NOMEM, "cuda: tensor '%s'", t->name);
}

float *tn_cuda_upload_f32(tn_cuda_ctx *g, const tn_tensor *t, bool *ok) {
    if (!t->data) return NULL;
    if (t->type != TN_F32) {
        *ok = false;
        tn_err(TERN_ERR_UNSUPPORTED, "cuda: tensor '%s' must be f32", t->name);
        return NULL;
    }
    return tn_cuda_dupload(g, t->data, t->nbytes, ok);
}

/* Matrices a, b[, c] of one type and row length as one matrix of their rows stacked (file bytes
 * concatenated), uploaded; false (nothing uploaded) when their types or row lengths differ. */
tern_status tn_cuda_upload_stacked(tn_cuda_ctx *g, const tn_tensor *const *ts, int nt, tn_cw *w, bool *fused) {
    *fused = false;
    size_t bytes = 0;
    int64_t rows = 0;
    if (tn_vq_is(ts[0]->type)) return TERN_OK; /* a codebook each: uploaded apart */
    for (int i = 0; i < nt; i++) {
        if (ts[i]->type != ts[0]->type || ts[i]->ne[0] != ts[0]->ne[0]) return TERN_OK;
        bytes += ts[i]->nbytes;
        rows += ts[i]->ne[1];
    }
    uint8_t *buf = tn_malloc(bytes);
    if (!buf) return TERN_OK; /* no host memory for the copy: upload them apart */
    size_t off = 0;
    for (int i = 0; i < nt; i++) memcpy(buf + off, ts[i]->data, ts[i]->nbytes), off += ts[i]->nbytes;
    tn_tensor T = *ts[0];
    T.ne[1] = rows;
    T.data = buf;
    T.nbytes = bytes;
    tern_status s = tn_cuda_upload_weight(g, &T, w);
    tn_free(buf);
    *fused = s == TERN_OK;
    return s;
}

/* A 3-D expert matrix [n_expert][rows][k] as one matrix of every expert's rows; with b (up beside
 * gate a, of the same type and row length) interleaved per expert into *ab (expert e's a rows then
 * its b rows: one gate|up matrix per expert, as a dense layer's gu) and *fused set; otherwise a into
 * *wa (or *ab when b is NULL) and b into *wb. */
tern_status tn_cuda_upload_experts(tn_cuda_ctx *g, const tn_tensor *a, const tn_tensor *b, tn_cw *ab, tn_cw *wa, tn_cw *wb, bool *fused) {
    const int64_t ne = a->ne[2] > 0 ? a->ne[2] : 1;
    if (b) {
        tn_tensor *v = tn_malloc(sizeof *v * (size_t)(2 * ne));
        const tn_tensor **ts = tn_malloc(sizeof *ts * (size_t)(2 * ne));
        tern_status s = TERN_OK;
        if (!v || !ts) s = tn_err(TERN_ERR_NOMEM, "cuda: out of host memory");
        for (int64_t e = 0; !s && e < ne; e++) {
            v[2 * e] = tn_expert_view(a, e), v[2 * e + 1] = tn_expert_view(b, e);
            ts[2 * e] = &v[2 * e], ts[2 * e + 1] = &v[2 * e + 1];
        }
        if (!s) s = tn_cuda_upload_stacked(g, ts, (int)(2 * ne), ab, fused);
        tn_free(v);
        tn_free(ts);
        if (s || *fused) return s;
    }
    tn_tensor T = *a;
    T.ne[1] = a->ne[1] * ne, T.ne[2] = 1;
    tern_status s = tn_cuda_upload_weight(g, &T, b ? wa : ab);
    if (s || !b) return s;
    T = *b;
    T.ne[1] = b->ne[1] * (b->ne[2] > 0 ? b->ne[2] : 1), T.ne[2] = 1;
    return tn_cuda_upload_weight(g, &T, wb);
}

/* Rows r0 .. r0 + nr - 1 of w as a matrix of their own (an expert of a stacked expert matrix). */
tn_cw tn_cuda_cw_rows(const tn_cw *w, int64_t r0, int64_t nr) {
    tn_cw v = *w;
    v.m = nr;
    v.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    if (tn_cw_is_code(w->kind)) {
        const int64_t nbr = w->k / w->group;
        v.d = w->d + r0 * nbr;
        if (w->mn) v.mn = w->mn + r0 * nbr;
    }
    return v;
}
