/*
 * zo.h — zeroth-order fine-tuning (SPSA, MeZO-style): forward passes only, no backward.
 *
 * Per step and per sample k: z_k ~ N(0, I) over all parameters, regenerated from the seed
 * (seed, step, k) each time it is needed, never stored; L± = loss(params ± eps z_k);
 * g_k = (L+ - L-) / (2 eps) is the projected gradient. Then params -= lr / samples * sum_k g_k z_k,
 * with g_k averaged over the ranks under --dist dp (each rank on its own shard, the same z_k from
 * the shared seed). Weight decay and gradient clipping do not apply; the trainer allocates no
 * gradient or optimizer buffers (tn_train_cfg.forward_only).
 *
 * Exchange (--dist dp):
 *   f32  (--compress none): one MPI_Allreduce of samples + 1 floats (the g_k and the loss).
 *   int8 (the default under --dist; "Just One Byte"): each rank sends ONE byte per sample,
 *        q = clamp(floor(127 g / c + u), -127, 127) with u uniform from (seed, step, rank, k)
 *        (stochastic rounding: E[q c / 127] = g inside the range), -128 for a non-finite g. The
 *        clip range c is the same on every rank: it starts at TN_ZO_CLIP0 and after each step is
 *        updated from the bytes of all ranks (which every rank holds after the MPI_Allgather):
 *        doubled when any byte saturated (|q| = 127), else c = 0.9 c + 0.1 max(4 rms, c / 8)
 *        with rms the root mean square of the dequantized values. Every rank dequantizes and
 *        averages the same bytes (integer sum, then one scale), so all ranks apply the same
 *        update. The loss is not exchanged: rank 0 reports its own shard's. Single-process
 *        (--zo --compress int8 without --dist) runs the same quantization, so one rank under
 *        mpirun is bit-identical to it. c is checkpointed (tn_train_state.zo_clip, GGUF key
 *        tern.train.zo_clip): a resumed run goes on with it, bit-identical to an uninterrupted
 *        one; a checkpoint without it (f32 exchange, older files) restarts at TN_ZO_CLIP0.
 */
#ifndef TN_TRAIN_ZO_H
#define TN_TRAIN_ZO_H

#include "train/dist.h"

typedef struct tn_zo_opts {
    bool on;
    float eps;      /* perturbation scale (default 1e-3) */
    int samples;    /* perturbations per step (default 1) */
    bool int8;      /* one byte per sample per step (above) */
} tn_zo_opts;

#define TN_ZO_CLIP0 1.0f
#define TN_ZO_NONFINITE (-128)

/* What the int8 exchange carries from step to step: the clip range (0: not started). */
typedef struct tn_zo_state {
    float clip;
} tn_zo_state;

/* One SPSA step `step` (0-based) on the batch already in tok/tgt (this rank's rows) with learning
 * rate lr; *loss = the mean of (L+ + L-) / 2 over samples (and ranks, f32 exchange; this rank's
 * with int8; NaN when any rank's projected gradient was not finite). */
tern_status tn_zo_step(tn_tmodel *m, tn_dist *d, const tn_zo_opts *o, tn_zo_state *zs, uint64_t seed, int64_t step,
                       const int32_t *tok, const int32_t *tgt, float lr, double *loss);

/* The int8 code of g for clip range c with the uniform u in [0, 1) (above). Exposed for tests. */
int8_t tn_zo_q8(float g, float c, float u);
/* The clip range after a step whose n bytes (all ranks) were q. Exposed for tests. */
float tn_zo_clip_next(float c, const int8_t *q, int n);

#endif
