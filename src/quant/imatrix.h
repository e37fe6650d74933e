/*
 * imatrix.h — importance matrices (per-column mean of squared activations of every matmul
 * weight), in llama.cpp's GGUF imatrix layout so files interoperate both ways:
 *   general.type = "imatrix"; per weight W: tensor "<W>.in_sum2" f32 [ne0] (sum over calls of
 *   x_i^2) and "<W>.counts" f32 [1] (number of activation rows summed).
 * The importance of column i is in_sum2[i] / counts.
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

/* Writes entries (names[i], sums[i][ne0[i]], counts[i]) as an imatrix GGUF (atomic). */
tern_status tn_imatrix_save(const char *path, size_t n, const char *const *names, const int64_t *ne0,
                            const float *const *sums, const float *counts, const char *dataset);

#endif
