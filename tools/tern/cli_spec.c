/*
 * cli_spec.c — speculative decoding as the commands run it. See cli_spec.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_spec.h"
#include "core/base.h"

void tn_cli_spec_init(tn_cli_spec *sr) {
    memset(sr, 0, sizeof *sr);
    sr->kmax = 8, sr->kmin = 1, sr->ngram_n = 3;
}

int tn_cli_spec_flag(int argc, char **argv, int *i, tn_cli_spec *sr) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    const bool is_draft = !strcmp(a, "--draft") || !strcmp(a, "-md") || !strcmp(a, "--model-draft");
    int64_t *num = !strcmp(a, "--draft-max") ? &sr->kmax : !strcmp(a, "--draft-min") ? &sr->kmin
                   : !strcmp(a, "--spec-ngram") ? &sr->ngram_n : NULL;
    const bool p_min = !strcmp(a, "--draft-p-min");
    if (!is_draft && !num && !p_min && strcmp(a, "--spec")) return 0;
    if (!val) {
        tn_cli_usage_error("%s needs a value", a);
        return -1;
    }
    (*i)++;
    if (p_min) {
        if (!tn_cli_parse_f32(val, 0.0f, 1.0f, &sr->dm.p_min)) {
            tn_cli_usage_error("--draft-p-min: '%s' is not a probability in 0..1", val);
            return -1;
        }
        return 1;
    }
    if (is_draft) return sr->draft_path = val, 1;
    if (!num) {
        if (!strcmp(val, "ngram")) return sr->ngram = true, 1;
        if (!strcmp(val, "none")) return sr->ngram = false, 1;
        tn_cli_usage_error("--spec: '%s' is not ngram or none", val);
        return -1;
    }
    const int64_t lo = num == &sr->kmin ? 0 : 1, hi = num == &sr->ngram_n ? 64 : 32;
    if (!tn_cli_parse_i64(val, lo, hi, num)) {
        tn_cli_usage_error("%s: '%s' is not a number in %lld..%lld", a, val, (long long)lo, (long long)hi);
        return -1;
    }
    return 1;
}

int tn_cli_spec_open(tn_cli_spec *sr, const tern_model *target, tern_ctx *tc, const tern_ctx_params *cp, int32_t n_ctx) {
    sr->hist = malloc(sizeof *sr->hist * ((size_t)n_ctx + 1));
    if (!sr->hist) return tn_cli_fail(TERN_ERR_NOMEM, "speculative decoding: history");
    if (!sr->draft_path) return TN_EXIT_OK;
    tern_model_params mp;
    tern_model_params_init(&mp);
    const char *path = sr->draft_path;
    tern_status s = tern_model_load(path, &mp, &sr->dmodel);
    if (s) return tn_cli_fail(s, "loading the draft model");
    if (tn_spec_vocab_check(target, sr->dmodel)) {
        fprintf(stderr, "tern: error: draft model %s: %s\n", path, tern_last_error());
        return TN_EXIT_DATAERR;
    }
    tern_ctx_params dp = *cp;
    dp.device = TERN_DEVICE_CPU;
    if ((s = tern_ctx_create(sr->dmodel, &dp, &sr->dm.c))) return tn_cli_fail(s, "creating the draft model's context");
    /* the two models run in turn: on one set of threads, the idle one's do not take cores */
    if (cp->device == TERN_DEVICE_CPU && (s = tern_ctx_share_threads(sr->dm.c, tc)))
        return tn_cli_fail(s, "the draft model's threads");
    return TN_EXIT_OK;
}

void tn_cli_spec_reset(tn_cli_spec *sr) {
    sr->n_hist = 0;
    if (sr->dm.c) tern_ctx_truncate(sr->dm.c, 0);
    sr->dm.n_fed = sr->dm.n_extra = 0; /* p_min stays */
}

tern_status tn_cli_spec_step(tn_cli_spec *sr, tern_ctx *c, tern_sampler *smp, int32_t kmax, tern_token *emit,
                             int32_t *n_emit) {
    tern_token draft[64];
    kmax = TN_MIN(kmax, 63);
    int32_t k = 0;
    if (kmax >= 1) {
        k = sr->ngram ? tn_spec_ngram(sr->hist, sr->n_hist, 1, (int32_t)sr->ngram_n, kmax, draft) : 0;
        if (k < sr->kmin || k == 0) {
            k = sr->dm.c ? tn_spec_draft_model(&sr->dm, sr->hist, sr->n_hist, kmax, draft) : 0;
            if (k < 0) return tn_err(TERN_ERR_INTERNAL, "drafting with the draft model: %s", tern_last_error());
            if (k < sr->kmin) k = 0;
        }
    }
    tern_status s = tn_spec_verify(c, smp, sr->hist[sr->n_hist - 1], draft, k, emit, n_emit);
    if (s) return s;
    if (sr->dm.c) tn_spec_draft_accept(&sr->dm, *n_emit - 1);
    sr->drafted += k;
    sr->accepted += *n_emit - 1;
    sr->steps++;
    return TERN_OK;
}

void tn_cli_spec_free(tn_cli_spec *sr) {
    free(sr->hist);
    tern_ctx_free(sr->dm.c);
    tern_model_free(sr->dmodel);
    sr->hist = NULL, sr->dm.c = NULL, sr->dmodel = NULL;
}
