/*
 * test_dump_margins.c — `tern generate --temp 0 --dump-margins FILE` against the independent
 * double-precision reference (ref_forward.c).
 *
 * usage: test_dump_margins MODEL.gguf DUMP PROMPT N_STEPS
 * The dump must hold the prompt's token ids (as tern_tokenize gives them, BOS included) and
 * N_STEPS lines "step id margin rms". The reference is fed the same prompt and then the dumped ids, so
 * it follows tern's path; at every step the dumped id must be the reference's argmax or within
 * the tolerance of it (a near-tie), and the dumped margin (top-1 minus top-2) must equal the
 * reference's within twice that tolerance (the RMS of the logits within it).
 * Tolerance: test_forward bounds tern's logits at a relative RMS error of 5e-3 against this
 * reference for F32/F16 files (4e-2 for quantized ones); one logit may be off by a few times the
 * RMS, so the bound on one logit is 4 * rel * rms(reference logits).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_forward.h"
#include "tern/tern.h"

static int fail(const char *what) {
    fprintf(stderr, "test_dump_margins: FAIL: %s\n", what);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: test_dump_margins MODEL.gguf DUMP PROMPT N_STEPS\n");
        return 2;
    }
    const int n_steps = atoi(argv[4]);
    tern_model *m = NULL;
    if (tern_model_load(argv[1], NULL, &m)) {
        fprintf(stderr, "test_dump_margins: load %s: %s\n", argv[1], tern_last_error());
        return 1;
    }
    const int32_t nv = tern_model_n_vocab(m);
    const tn_dtype wt = m->layers[0].w[TN_ROLE_ATTN_Q].type;
    const double rel = wt == TN_F32 || wt == TN_F16 ? 5e-3 : 4e-2;
    /* the prompt ids tern should have decoded */
    tern_token want[256];
    int32_t n_want = 0;
    if (tern_tokenize(m, argv[3], strlen(argv[3]), true, true, want, 256, &n_want) || n_want <= 0) return fail("tokenizing the prompt");
    FILE *f = fopen(argv[2], "r");
    if (!f) return fail("the dump file is missing");
    char line[8192];
    int32_t prompt[256], n_prompt = -1;
    int ids[1024], n = 0;
    double margins[1024], rmss[1024];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        if (!strncmp(line, "prompt", 6)) {
            n_prompt = 0;
            for (char *p = line + 6, *e;; p = e) {
                long v = strtol(p, &e, 10);
                if (e == p || n_prompt == 256) break;
                prompt[n_prompt++] = (int32_t)v;
            }
            continue;
        }
        int step, id;
        double mg, rm;
        if (sscanf(line, "%d %d %lf %lf", &step, &id, &mg, &rm) != 4 || step != n || n == 1024) return fail("a step line is malformed or out of order");
        if (id < 0 || id >= nv || !(mg >= 0)) return fail("a step has an id outside the vocabulary or a negative margin");
        ids[n] = id, margins[n] = mg, rmss[n] = rm, n++;
    }
    fclose(f);
    if (n_prompt != n_want || memcmp(prompt, want, sizeof *want * (size_t)n_want)) return fail("the prompt ids differ from tern_tokenize's");
    if (n != n_steps) {
        fprintf(stderr, "test_dump_margins: FAIL: %d steps in the dump, want %d\n", n, n_steps);
        return 1;
    }
    ref_model *r = ref_create(m, n_prompt + n_steps + 1);
    double *lg = malloc(sizeof *lg * (size_t)nv);
    for (int32_t i = 0; i < n_prompt; i++) ref_step(r, prompt[i], lg, NULL);
    int bad = 0, near = 0, distinct = 0;
    double worst = 0;
    for (int s = 0; s < n; s++) {
        double v1 = -INFINITY, v2 = -INFINITY, rms = 0;
        int best = 0;
        for (int32_t i = 0; i < nv; i++) {
            rms += lg[i] * lg[i];
            if (lg[i] > v1) v2 = v1, v1 = lg[i], best = i;
            else if (lg[i] > v2) v2 = lg[i];
        }
        const double tol = 4 * rel * sqrt(rms / nv), dm = fabs(margins[s] - (v1 - v2));
        if (ids[s] != best) {
            near++;
            if (v1 - lg[ids[s]] > tol) {
                fprintf(stderr, "step %d: tern chose %d, %.4g below the reference's argmax %d (tolerance %.3g)\n", s, ids[s],
                        v1 - lg[ids[s]], best, tol);
                bad++;
            }
        } else if (dm > 2 * tol) {
            fprintf(stderr, "step %d: margin %.6g, the reference's %.6g (tolerance %.3g)\n", s, margins[s], v1 - v2, 2 * tol);
            bad++;
        }
        if (fabs(rmss[s] - sqrt(rms / nv)) > tol) {
            fprintf(stderr, "step %d: rms of the logits %.6g, the reference's %.6g\n", s, rmss[s], sqrt(rms / nv));
            bad++;
        }
        if (dm / tol > worst) worst = dm / tol;
        if (s == 0 || ids[s] != ids[s - 1]) distinct++;
        ref_step(r, ids[s], lg, NULL);
    }
    printf("test_dump_margins %s: %d steps, %d near-ties, worst margin error %.2f of the tolerance, %d changes of token\n",
           argv[1], n, near, worst / 2, distinct);
    free(lg);
    ref_free(r);
    tern_model_free(m);
    if (bad) return fail("tern's dump disagrees with the reference beyond the tolerance");
    /* a dump that repeats one token would test little: the synthetic models do not */
    return distinct > 1 ? 0 : fail("every step chose the same token");
}
