/*
 * cli_spec.h — speculative decoding as the commands run it (generate, bench): the flags
 * (--spec ngram, --draft FILE, --draft-max/--draft-min/--spec-ngram), the draft model checked
 * against the target's vocabulary, and one verification step (model/spec.h underneath).
 */
#ifndef TN_CLI_SPEC_H
#define TN_CLI_SPEC_H

#include "model/spec.h"

typedef struct tn_cli_spec {
    bool ngram;              /* --spec ngram                                             */
    const char *draft_path;  /* --draft FILE (NULL: none)                                */
    int64_t kmax, kmin, ngram_n;
    tern_model *dmodel;      /* the draft model once loaded                              */
    tn_spec_draft dm;        /* its context (dm.c == NULL: no draft model)               */
    tern_token *hist;        /* prompt and emitted tokens; the last is the current one  */
    int32_t n_hist;
    int64_t drafted, accepted, steps;
} tn_cli_spec;

void tn_cli_spec_init(tn_cli_spec *sr);
/* --spec, --draft (-md, --model-draft), --draft-max, --draft-min, --draft-p-min, --spec-ngram at argv[*i]: 1
 * consumed, 0 not one of them, -1 after printing a usage error (exit 64). */
int tn_cli_spec_flag(int argc, char **argv, int *i, tn_cli_spec *sr);
static inline bool tn_cli_spec_on(const tn_cli_spec *sr) { return sr->ngram || sr->draft_path; }
/* Loads the draft model (if any) and its context like the target's (cp; on the CPU), refusing one
 * whose vocabulary differs from the target's (each token's text compared); allocates the history
 * for n_ctx tokens. Returns an exit code. */
int tn_cli_spec_open(tn_cli_spec *sr, const tern_model *target, tern_ctx *tc, const tern_ctx_params *cp, int32_t n_ctx);
/* Back to an empty history and draft cache (the counters stay). */
void tn_cli_spec_reset(tn_cli_spec *sr);
/* One step after hist (its last token is current and not yet in c's cache): drafts (n-grams first,
 * then the draft model; fewer than kmin: none) of at most kmax, verified on c with smp; emit gets
 * the accepted drafts then the sampler's own token (*n_emit >= 1). The caller appends the tokens
 * it keeps to hist. */
tern_status tn_cli_spec_step(tn_cli_spec *sr, tern_ctx *c, tern_sampler *smp, int32_t kmax, tern_token *emit,
                             int32_t *n_emit);
void tn_cli_spec_free(tn_cli_spec *sr);

#endif
