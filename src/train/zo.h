/*
 * zo.h — zeroth-order fine-tuning (SPSA, MeZO-style): forward passes only, no backward.
 *
 * Per step and per sample k: z_k ~ N(0, I) over all parameters, regenerated from the seed
 * (seed, step, k) each time it is needed, never stored; L± = loss(params ± eps z_k);
 * g_k = (L+ - L-) / (2 eps) is the projected gradient. Under --dist dp the ranks (each on its own
 * shard, the same z_k from the shared seed) average the g_k and the loss: one MPI_Allreduce of
 * samples + 1 floats per step. Then params -= lr / samples * sum_k g_k z_k. Weight decay and
 * gradient clipping do not apply. The gradient and AdamW buffers are not touched.
 */
#ifndef TN_TRAIN_ZO_H
#define TN_TRAIN_ZO_H

#include "train/dist.h"

typedef struct tn_zo_opts {
    bool on;
    float eps;      /* perturbation scale (default 1e-3) */
    int samples;    /* perturbations per step (default 1) */
} tn_zo_opts;

/* One SPSA step `step` (0-based) on the batch already in tok/tgt (this rank's rows) with learning
 * rate lr; *loss = the mean of (L+ + L-) / 2 over samples (and ranks). */
tern_status tn_zo_step(tn_tmodel *m, tn_dist *d, const tn_zo_opts *o, uint64_t seed, int64_t step, const int32_t *tok,
                       const int32_t *tgt, float lr, double *loss);

#endif
