/*
 * imatrix.h — importance matrices (per-column mean of squared activations of every matmul
 * weight), in llama.cpp's GGUF imatrix layout (tools/imatrix/imatrix.cpp, common/imatrix-loader)
 * so files interoperate both ways:
 *   general.type = "imatrix"; imatrix.datasets (string array), imatrix.chunk_count (u32),
 *   imatrix.chunk_size (u32) — llama-quantize refuses a GGUF imatrix without all three;
 *   per weight W, in strcmp order of W: tensor "<W>.in_sum2" f32 [ne0] (sum over activation
 *   rows of x_i^2) and "<W>.counts" f32 [1] (number of rows summed); for a 3-D expert tensor
 *   (*_exps) "<W>.in_sum2" [ne0][n_expert] and "<W>.counts" [1][n_expert], per expert the rows
 *   routed to it. Loaded, such an entry has ne0 * n_expert values (expert e's at e * ne0).
 * The importance of column i is in_sum2[i] / counts (counts rounded to an integer first, as
 * llama-quantize does; a zero count gives importance 1).
 *
 * The accumulator (tn_imatrix_acc) sums in double and is not thread-safe: one caller at a time.
 */
#ifndef TN_QUANT_IMATRIX_H
#define TN_QUANT_IMATRIX_H

#include "core/base.h"

typedef struct tn_imatrix tn_imatrix;

/* Loads a file (NOT_FOUND / FORMAT with a message). */
tern_status tn_imatrix_load(const char *path, tn_imatrix **out);
void tn_imatrix_free(tn_imatrix *m);
/* Importance of the ne0 columns of weight `name`, or NULL if absent or of another length. The
 * pointer lives as long as m. */
const float *tn_imatrix_find(const tn_imatrix *m, const char *name, int64_t ne0);
/* The row counts of weight `name` (rounded as above; 0 for a matrix without data), one per
 * matrix: *n_mat of them (an expert tensor: n_expert; a dense weight: 1). NULL if absent. */
const float *tn_imatrix_counts(const tn_imatrix *m, const char *name, int64_t *n_mat);
/* Number of entries, and the name / length of entry i (i < n). */
size_t tn_imatrix_count(const tn_imatrix *m);
const char *tn_imatrix_name(const tn_imatrix *m, size_t i, int64_t *ne0);
/* imatrix.chunk_count / chunk_size of the file (0 when absent) and its first dataset (or NULL;
 * lives as long as m). */
void tn_imatrix_meta(const tn_imatrix *m, uint32_t *chunk_count, uint32_t *chunk_size, const char **dataset);

/* Writes entries (names[i], sums[i][n_mat[i]][ne0[i]], counts[i][n_mat[i]]; n_mat NULL: one
 * matrix each) as an imatrix GGUF (atomic), in name order, with llama-imatrix's metadata. */
tern_status tn_imatrix_save(const char *path, size_t n, const char *const *names, const int64_t *ne0,
                            const int64_t *n_mat, const float *const *sums, const float *const *counts, const char *dataset,
                            uint32_t chunk_count, uint32_t chunk_size);

/* ---- accumulation (tern imatrix) ----------------------------------------------------------- */
typedef struct tn_imatrix_acc tn_imatrix_acc;

tern_status tn_imatrix_acc_create(tn_imatrix_acc **out);
void tn_imatrix_acc_free(tn_imatrix_acc *a);
/* Index of entry `name` (ne0 columns), created empty if new. INVALID_ARG if it exists with
 * another ne0 or the name is too long for GGUF. */
tern_status tn_imatrix_acc_entry(tn_imatrix_acc *a, const char *name, int64_t ne0, size_t *idx);
/* The same for n_mat matrices of ne0 columns (an expert tensor: n_expert), each with its own
 * sums and row count. */
tern_status tn_imatrix_acc_entry_mat(tn_imatrix_acc *a, const char *name, int64_t ne0, int64_t n_mat, size_t *idx);
/* Adds the squares of n rows x[n][ne0] to the entries idx[0..n_idx) (weights sharing one input)
 * and counts n rows for each. FORMAT if a value is not finite (nothing is added then). */
tern_status tn_imatrix_acc_add(tn_imatrix_acc *a, const size_t *idx, size_t n_idx, const float *x, int64_t n, int64_t ne0);
/* The same into matrix mat of the entries, over rows x[rows[0..n)] (rows NULL: x[0..n)). */
tern_status tn_imatrix_acc_add_rows(tn_imatrix_acc *a, const size_t *idx, size_t n_idx, int64_t mat, const float *x,
                                    const int32_t *rows, int64_t n, int64_t ne0);
/* Entry i's sums (ne0 doubles; n_mat x ne0 for experts) and row count (of its first matrix);
 * NULL past the end. */
const double *tn_imatrix_acc_get(const tn_imatrix_acc *a, size_t i, int64_t *ne0, int64_t *count);
tern_status tn_imatrix_acc_save(const tn_imatrix_acc *a, const char *path, const char *dataset, uint32_t chunk_count,
                                uint32_t chunk_size);

#endif
