/*
 * memplan.c — choosing a configuration for a memory budget and writing the plan as a table. The
 * sizes come from tn_tmodel_mem_plan (tmodel.c: the same layout tn_tmodel_plan allocates). See
 * train.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

bool tn_mem_choose(const tn_tmodel *m, int batch, int T, size_t budget, int accum, int rc, tn_mem_plan *p) {
    /* pass 0: no recomputation, then attn, per micro-batch (largest first); pass 1: full */
    for (int pass = 0; pass < 2; pass++)
        for (int mb = batch; mb >= 1; mb--) {
            if (batch % mb || (accum > 0 && batch / mb != accum)) continue;
            const int r0 = pass ? TN_RECOMPUTE_FULL : TN_RECOMPUTE_NONE, r1 = pass ? TN_RECOMPUTE_FULL : TN_RECOMPUTE_ATTN;
            for (int r = r0; r <= r1; r++) {
                if (rc >= 0 && r != rc) continue;
                tn_tmodel_mem_plan(m, batch, batch / mb, T, (tn_recompute)r, p);
                if (p->peak <= budget) return true;
            }
        }
    /* nothing fits: the smallest configuration allowed (micro-batch 1 unless accum fixes it) */
    tn_tmodel_mem_plan(m, batch, accum > 0 ? accum : batch, T, rc >= 0 ? (tn_recompute)rc : TN_RECOMPUTE_FULL, p);
    return false;
}

static void fmt_mib(size_t b, char *buf, size_t cap) { snprintf(buf, cap, "%9.1f MiB", (double)b / 1048576.0); }

void tn_mem_plan_lines(const tn_mem_plan *p, int n_layer, void (*line)(const char *text, void *user), void *user) {
    static const char *const kind[TN_MEM_N_KIND] = {"layer inputs, normed inputs", "q, k, v, attention output",
                                                    "attention probabilities", "FFN gate, up, SwiGLU output"};
    static const char *const what[3] = {"nothing",
                                        "the attention probabilities softmax(q k^T) per layer, from the kept q, k, v",
                                        "each layer's forward from its kept input (all but its output projection)"};
    char buf[256], b[32], b2[32];
    snprintf(buf, sizeof buf, "memory plan: batch %d = %d micro-batch%s of %d sequences x ctx %d, recompute %s", p->batch,
             p->accum, p->accum > 1 ? "es" : "", p->micro_batch, p->T, tn_recompute_name(p->recompute));
    line(buf, user);
#define ROW(name, bytes, note)                                                         \
    do {                                                                               \
        fmt_mib(bytes, b, sizeof b);                                                   \
        snprintf(buf, sizeof buf, "  %-34s %s%s", name, b, note);                     \
        line(buf, user);                                                               \
    } while (0)
    ROW("parameters (trained, f32)", p->params, "");
    ROW("gradients", p->grads, "");
    ROW("AdamW moments (m, v)", p->moments, "");
    if (p->frozen) ROW("frozen base (file types)", p->frozen, "");
    snprintf(buf, sizeof buf, "  activations (%d layers):", n_layer);
    line(buf, user);
    for (int k = 0; k < TN_MEM_N_KIND; k++) {
        char note[96] = "";
        if (p->recomp[k]) {
            snprintf(b2, sizeof b2, "%.1f MiB", (double)p->recomp[k] / 1048576.0);
            if (p->kept[k]) snprintf(note, sizeof note, "  (of which 1 layer, recomputed in backward: %s)", b2);
            else snprintf(note, sizeof note, "  (1 layer, recomputed in backward)");
        }
        char name[64];
        snprintf(name, sizeof name, "  %s", kind[k]);
        ROW(name, p->kept[k] + p->recomp[k], note);
    }
    ROW("  final norm input, output", p->head, "");
    {
        char note[96] = "";
        if (p->ce_rows < (int64_t)p->micro_batch * p->T)
            snprintf(note, sizeof note, "  (%lld rows at a time of %lld; recomputed in backward)", (long long)p->ce_rows,
                     (long long)p->micro_batch * p->T);
        ROW("  logits", p->logits, note);
    }
    ROW("  backward scratch", p->scratch, "");
    ROW("  RoPE cache, tokens, targets", p->caches, "");
    ROW("predicted peak", p->peak, "");
#undef ROW
    snprintf(buf, sizeof buf, "  recomputed in backward: %s", what[p->recompute]);
    line(buf, user);
}
