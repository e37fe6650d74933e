/*
 * test_serve_sched.c — the scheduling policy of tern serve (src/serve/sched.c) on made-up cost
 * models, load histories and engine states: cost interpolation, the load factor and its margin,
 * prefill chunk sizes under the TPOT objective (banked time, attention cost, logit rows), lazy
 * admission, the TTFT predictor, and the admission / early-rejection decisions. No clock: every
 * expected value follows from the numbers below.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <cmocka.h>

#include "serve/sched.h"

#define MS 1e-3

/* t(rows) = 5 + 5 rows ms (a straight line through two points), 2 ms per extra logit row, no
 * attention cost: easy to solve by hand. */
static tn_cost linear_cost(void) { return (tn_cost){2, {1, 129}, {10 * MS, 650 * MS}, 2 * MS, 0}; }

static tn_sched sched_with(double tpot_ms, double f_plan) {
    tn_sched s = {linear_cost(), f_plan, 1.0, tpot_ms * MS, 2 * tpot_ms * MS, 512, 64};
    return s;
}

static tn_sseq decoding(int32_t pos, int32_t left, double bank_ms) { return (tn_sseq){pos, pos, left, bank_ms * MS, 0, false}; }
static tn_sseq prefilling(int32_t pos, int32_t prompt) { return (tn_sseq){pos, prompt, 64, 0, 0, false}; }

/* ---- cost model -------------------------------------------------------------------------------- */
static void test_cost_interpolation(void **state) {
    (void)state;
    /* one row streams the weights; two rows take a slower path; then compute-bound */
    tn_cost c = {5, {1, 2, 4, 8, 128}, {20 * MS, 50 * MS, 50 * MS, 75 * MS, 975 * MS}, 0, 0};
    assert_float_equal(tn_cost_rows(&c, 0), 0, 1e-12);
    assert_float_equal(tn_cost_rows(&c, 1), 20 * MS, 1e-12);
    assert_float_equal(tn_cost_rows(&c, 3), 50 * MS, 1e-12);
    assert_float_equal(tn_cost_rows(&c, 6), 62.5 * MS, 1e-12);
    assert_float_equal(tn_cost_rows(&c, 68), 525 * MS, 1e-12);
    assert_float_equal(tn_cost_rows(&c, 256), 1935 * MS, 1e-12); /* the last segment extends */
    /* logit rows beyond the first and attention keys add up */
    c.logit = 4 * MS, c.key = 1e-6;
    tn_shape sh = {8, 8, 1000};
    assert_float_equal(tn_cost_step(&c, &sh), (75 + 28 + 1) * MS, 1e-12);
    assert_int_equal(tn_chunk_keys(0, 4), 10);
    assert_int_equal(tn_chunk_keys(100, 4), 410);
}

/* ---- load factor -------------------------------------------------------------------------------- */
static void test_load_factor(void **state) {
    (void)state;
    tn_load l;
    tn_load_init(&l);
    assert_float_equal(l.mean, 1.0, 1e-12);
    for (int i = 0; i < 40; i++) tn_load_observe(&l, 0.1, 0.1); /* steady: the margin narrows */
    assert_float_equal(l.mean, 1.0, 1e-9);
    assert_true(tn_load_sd(&l) < 0.001);
    double quiet = tn_load_plan(&l);
    /* another job takes the cores: steps run 2.5x the prediction */
    tn_load_observe(&l, 0.1, 0.25);
    assert_float_equal(l.mean, 1.375, 1e-9);
    assert_true(tn_load_plan(&l) > 2.0); /* mean + sd: the jump itself widens the margin */
    tn_load_observe(&l, 0.1, 0.25);
    tn_load_observe(&l, 0.1, 0.25);
    assert_true(tn_load_plan(&l) > 2.3);
    assert_true(l.mean < 2.5);
    for (int i = 0; i < 40; i++) tn_load_observe(&l, 0.1, 0.25); /* the new level, steady again */
    assert_float_equal(l.mean, 2.5, 1e-4);
    assert_true(tn_load_plan(&l) - l.mean < 0.01);
    assert_true(quiet < 1.01);
    /* nonsense samples are ignored, extreme ones clamped */
    int64_t n = l.n;
    tn_load_observe(&l, 0, 0.1);
    tn_load_observe(&l, 0.1, -1);
    assert_int_equal(l.n, n);
    tn_load_observe(&l, 1e-9, 1.0);
    assert_true(l.mean < 50);
}

/* ---- one step ---------------------------------------------------------------------------------- */
static void test_plan_no_objective(void **state) {
    (void)state;
    tn_sched s = sched_with(0, 1.0);
    tn_sseq q[3] = {decoding(50, 10, 0), prefilling(0, 300), prefilling(16, 400)};
    tn_shape sh;
    tn_sched_plan(&s, q, 3, &sh);
    assert_int_equal(q[0].chunk, 1);
    assert_int_equal(q[1].chunk, 300); /* oldest prefill first, whole */
    assert_int_equal(q[2].chunk, 512 - 1 - 300); /* the rest of the batch */
    assert_int_equal(sh.rows, 512);
    assert_int_equal(sh.logits, 2);
    assert_true(isinf(tn_sched_limit(&s, q, 3)));
}

static void test_plan_tpot_chunk(void **state) {
    (void)state;
    /* 4 decodes on schedule (bank 0): the step may take 200 ms; t = 5 + 5 (4 + k) + 2 * 3 = 31 + 5k ms */
    tn_sched s = sched_with(200, 1.0);
    tn_sseq q[5] = {decoding(100, 50, 0), decoding(100, 50, 0), decoding(100, 50, 0), decoding(100, 50, 0), prefilling(0, 150)};
    tn_shape sh;
    double t = tn_sched_plan(&s, q, 5, &sh);
    assert_int_equal(q[4].chunk, 33); /* 31 + 5 * 33 = 196 <= 200 < 201 */
    assert_float_equal(t, 196 * MS, 1e-9);
    assert_int_equal(sh.rows, 37);
    assert_int_equal(sh.logits, 4);
    /* a noisy machine: planned with 1.5x the prediction, 1.5 (31 + 5k) <= 200 -> k = 20 */
    s.f_plan = 1.5;
    tn_sched_plan(&s, q, 5, NULL);
    assert_int_equal(q[4].chunk, 20);
    /* the last chunk of a prompt takes a logit row too: with 8 ms per logit row
     * t = 5 + 5 (4 + k) + 8 * 3 = 49 + 5k (k <= 30), 57 + 5k when it completes the prompt */
    s.f_plan = 1.0;
    s.cost.logit = 8 * MS;
    q[4] = prefilling(110, 150); /* 40 left */
    tn_sched_plan(&s, q, 5, NULL);
    assert_int_equal(q[4].chunk, 30);
    q[4] = prefilling(120, 150); /* 30 left: 57 + 150 > 200, so 29 now and 1 later */
    tn_sched_plan(&s, q, 5, NULL);
    assert_int_equal(q[4].chunk, 29);
    q[4] = prefilling(122, 150); /* 28 left: 57 + 140 = 197, all of it */
    tn_sched_plan(&s, q, 5, NULL);
    assert_int_equal(q[4].chunk, 28);
}

static void test_plan_bank(void **state) {
    (void)state;
    tn_sched s = sched_with(200, 1.0);
    /* two decodes (t = 17 + 5k ms); limit = min over decodes of 200 + min(bank, 400) */
    tn_sseq q[3] = {decoding(100, 50, 300), decoding(60, 50, 1000), prefilling(0, 1000)};
    assert_float_equal(tn_sched_limit(&s, q, 3), 500 * MS, 1e-12);
    tn_sched_plan(&s, q, 3, NULL);
    assert_int_equal(q[2].chunk, 96); /* 5 + 5 (2 + k) + 2 = 17 + 5k <= 500 */
    q[0].bank = 5000 * MS; /* the cap: 200 + 400 */
    assert_float_equal(tn_sched_limit(&s, q, 3), 600 * MS, 1e-12);
    /* a sequence behind schedule shrinks the step: 200 - 150 = 50 -> 17 + 5k <= 50, k = 6 */
    q[0].bank = -150 * MS;
    tn_sched_plan(&s, q, 3, NULL);
    assert_int_equal(q[2].chunk, 6);
    /* decodes alone over the limit: no prefill at all (no "minimum progress" chunk) */
    q[0].bank = -190 * MS;
    double t = tn_sched_plan(&s, q, 3, NULL);
    assert_int_equal(q[0].chunk, 1);
    assert_int_equal(q[1].chunk, 1);
    assert_int_equal(q[2].chunk, 0);
    assert_float_equal(t, 17 * MS, 1e-12);
}

static void test_plan_order_and_caps(void **state) {
    (void)state;
    tn_sched s = sched_with(200, 1.0);
    /* no decodes: no TPOT limit, prefills in order, the first completes (logit), the second goes on */
    tn_sseq q[3] = {prefilling(0, 100), prefilling(0, 600), prefilling(0, 50)};
    tn_sched_plan(&s, q, 3, NULL);
    assert_int_equal(q[0].chunk, 100);
    assert_int_equal(q[1].chunk, 412);
    assert_int_equal(q[2].chunk, 0);
    /* out of logit rows: a prompt's last token must wait for the next step */
    s.n_logits_cap = 2;
    tn_sseq d[3] = {decoding(10, 5, 0), decoding(10, 5, 0), prefilling(0, 10)};
    tn_sched_plan(&s, d, 3, NULL);
    assert_int_equal(d[2].chunk, 9);
    /* echo + logprobs: every prompt row takes a logit row (cap 6, 2 decodes: 4 rows) */
    s.n_logits_cap = 6;
    tn_sseq l[3] = {decoding(10, 5, 0), decoding(10, 5, 0), prefilling(0, 10)};
    l[2].lp_rows = true;
    tn_shape sh;
    tn_sched_plan(&s, l, 3, &sh);
    assert_int_equal(l[2].chunk, 4);
    assert_int_equal(sh.logits, 6);
    /* a prefill that gets nothing stops the ones behind it (they are younger) */
    s.n_logits_cap = 64;
    tn_sseq e[3] = {decoding(10, 5, -195), prefilling(0, 10), prefilling(0, 1)};
    tn_sched_plan(&s, e, 3, NULL);
    assert_int_equal(e[1].chunk, 0);
    assert_int_equal(e[2].chunk, 0);
}

static void test_plan_attention_cost(void **state) {
    (void)state;
    /* 0.05 ms per key: the same prompt chunk costs more deep into a long context */
    tn_sched s = sched_with(200, 1.0);
    s.cost.key = 0.05 * MS;
    tn_sseq a[2] = {decoding(0, 10, 0), prefilling(0, 500)};
    tn_sseq b[2] = {decoding(0, 10, 0), prefilling(900, 1400)};
    tn_sched_plan(&s, a, 2, NULL);
    tn_sched_plan(&s, b, 2, NULL);
    /* a: 10 + 5k + 0.05 (1 + k (k + 1) / 2) <= 200 -> k = 32; b: ... + 0.05 (1 + 900 k + k (k + 1) / 2) -> k = 3 */
    assert_int_equal(a[1].chunk, 32);
    assert_int_equal(b[1].chunk, 3);
}

/* ---- admission and TTFT prediction ------------------------------------------------------------ */
static void test_starts(void **state) {
    (void)state;
    tn_sched s = sched_with(200, 1.0);
    tn_sseq q[4] = {decoding(10, 10, 0), prefilling(0, 20)};
    tn_sreq_sim r = {100, 10, 1, 0, false};
    /* 5 + 5 (1 + 20 + k) + 2 (first prompt completes) <= 200 -> the newcomer gets 17 tokens */
    assert_true(tn_sched_starts(&s, q, 2, &r));
    assert_int_equal(q[2].chunk, 17);
    /* the prefill ahead takes the whole step: it waits in the queue */
    q[1] = prefilling(0, 200);
    assert_false(tn_sched_starts(&s, q, 2, &r));
    /* nothing running: always */
    assert_true(tn_sched_starts(&s, q, 0, &r));
}

static void test_simulate(void **state) {
    (void)state;
    tn_sched s = sched_with(0, 1.0);
    s.f_expect = 2.0; /* durations: twice the model */
    double ttft[3];
    /* idle server: one step of 100 rows, 2 x (5 + 500) ms */
    tn_sreq_sim r[3] = {{100, 10, 1, 0, false}, {100, 10, 1, 0, false}, {100, 10, 1, 0, false}};
    tn_sched_simulate(&s, NULL, 0, 8, r, 1, 10.0, ttft);
    assert_float_equal(ttft[0], 1.010, 1e-9);
    /* one slot, taken by a sequence with 3 tokens left: 3 decode steps of 2 x 10 ms first */
    tn_sseq q[1] = {decoding(10, 3, 0)};
    tn_sched_simulate(&s, q, 1, 1, r, 1, 10.0, ttft);
    assert_float_equal(ttft[0], 0.060 + 1.010, 1e-9);
    /* two requests, two free slots, no TPOT limit: both prompts in one step of 200 rows */
    tn_sched_simulate(&s, NULL, 0, 2, r, 2, 10.0, ttft);
    assert_float_equal(ttft[0], 2 * (5 + 5 * 200 + 2) * MS, 1e-9);
    assert_float_equal(ttft[1], ttft[0], 1e-12);
    /* the horizon: past it, INFINITY */
    tn_sched_simulate(&s, NULL, 0, 2, r, 2, 1.0, ttft);
    assert_true(isinf(ttft[0]) && isinf(ttft[1]));
    /* a request that wants more slots than exist never starts */
    tn_sreq_sim big = {10, 10, 4, 0, false};
    tn_sched_simulate(&s, NULL, 0, 2, &big, 1, 10.0, ttft);
    assert_true(isinf(ttft[0]));
}

static void test_simulate_tpot_chunks(void **state) {
    (void)state;
    /* TPOT 200 ms, one decode on schedule, f = 1, step by step:
     * step 1: 10 + 5k <= 200 -> k = 38 (200 ms; the decode stays on schedule, bank 0);
     * step 2: the same, 24 left; step 3: 10 + 120 + 2 = 132 ms: first token at 532 ms */
    tn_sched s = sched_with(200, 1.0);
    tn_sseq q[1] = {decoding(20, 50, 0)};
    tn_sreq_sim r = {100, 10, 1, 0, false};
    double ttft;
    tn_sched_simulate(&s, q, 1, 8, &r, 1, 10.0, &ttft);
    assert_float_equal(ttft, 0.532, 1e-9);
    /* a decode 100 ms behind schedule: step 1 may take only 100 ms (k = 18), which puts it back
     * on schedule (-100 + 200 - 100 = 0); then 38, 38 and the last 6 (10 + 30 + 2 = 42 ms) */
    q[0].bank = -100 * MS;
    tn_sched_simulate(&s, q, 1, 8, &r, 1, 10.0, &ttft);
    assert_float_equal(ttft, 0.542, 1e-9);
}

static void test_first_late(void **state) {
    (void)state;
    tn_sched s = sched_with(0, 1.0);
    /* one slot, busy for 100 decode steps of 10 ms = 1 s; queued A then B (prompt 10, 20 tokens):
     * A's first token after 1 + 0.055 s, B's after A's other 19 tokens and its own prefill */
    tn_sseq q[1] = {decoding(10, 100, 0)};
    tn_sreq_sim r[2] = {{10, 20, 1, 0.5, false}, {10, 20, 1, 0.4, false}};
    double ttft[2];
    assert_int_equal(tn_sched_first_late(&s, q, 1, 1, r, 2, 2.0, ttft), -1);
    assert_float_equal(ttft[0], 1.055, 1e-9);
    assert_float_equal(ttft[1], 1.055 + 0.190 + 0.055, 1e-9);
    assert_int_equal(tn_sched_first_late(&s, q, 1, 1, r, 2, 1.6, ttft), 1); /* B: 0.4 + 1.3 > 1.6 */
    assert_int_equal(tn_sched_first_late(&s, q, 1, 1, r, 2, 1.5, ttft), 0); /* A first: 0.5 + 1.055 > 1.5 */
    r[0].started = true;                                                    /* its first choice runs: never refused */
    assert_int_equal(tn_sched_first_late(&s, q, 1, 1, r, 2, 1.5, ttft), 1);
    assert_int_equal(tn_sched_first_late(&s, q, 1, 1, r, 2, 1.8, ttft), -1);
}

static void test_accept(void **state) {
    (void)state;
    tn_sched s = sched_with(0, 1.0);
    tn_sseq q[1] = {decoding(10, 100, 0)};
    double ttft[2], mine;
    /* a newcomer (prompt 10, 20 tokens) behind A in the one slot: first token at 1.055 + 0.19 + 0.055 */
    tn_sreq_sim r[2] = {{10, 20, 1, 0.1, false}, {10, 20, 1, 0, false}};
    assert_true(tn_sched_accept(&s, q, 1, 1, r, 2, 1, 2.0, ttft, &mine));
    assert_float_equal(mine, 1.300, 1e-9);
    assert_false(tn_sched_accept(&s, q, 1, 1, r, 2, 1, 1.2, ttft, &mine)); /* its own TTFT misses */
    /* placed first (less slack) it would make A late: refused although it meets its own */
    tn_sreq_sim r2[2] = {{10, 20, 1, 0, false}, {10, 20, 1, 1.0, false}};
    assert_false(tn_sched_accept(&s, q, 1, 1, r2, 2, 0, 2.2, ttft, &mine));
    assert_float_equal(mine, 1.055, 1e-9);
    assert_true(r2[1].waited == 1.0 && r2[0].waited == 0); /* the queue is left as it was */
    /* A late anyway (waited 2 s): the newcomer changes nothing, it is accepted */
    r2[1].waited = 2.0;
    assert_true(tn_sched_accept(&s, q, 1, 1, r2, 2, 0, 2.2, ttft, &mine));
}

/* ---- speculative decoding: the length per sequence and step -------------------------------------- */
/* Memory-bound up to 16 rows (10 ms + 0.2 ms per row), then compute-bound (1 ms per row); 0.05 ms
 * per extra logit row: a draft row costs 0.25 ms at batch 1, 1.05 ms in a full batch. */
static tn_sched spec_sched(double tpot_ms) {
    tn_sched s = {{3, {1, 16, 64}, {10 * MS, 13 * MS, 61 * MS}, 0.05 * MS, 0}, 1.0, 1.0, tpot_ms * MS, 2 * tpot_ms * MS, 512, 64};
    return s;
}

/* The step time by hand (no tn_cost_*): rows r, logit rows r (every decoding row wants them). */
static double spec_time_ref(int32_t r) {
    double t = r <= 16 ? 10 + 0.2 * (r - 1) : 13 + (r - 16);
    return (t + 0.05 * (r - 1)) * MS;
}

/* Expected tokens by the sum 1 + a + .. + a^k (not the closed form under test). */
static double spec_expected_ref(double a, int32_t k) {
    double e = 0, p = 1;
    for (int32_t j = 0; j <= k; j++) e += p, p *= a;
    return e;
}

/* n decoding sequences (short contexts: attention is free here) with acceptance acc and d drafts. */
static int32_t spec_run(const tn_sched *s, int n, const double *acc, int32_t d, const tn_spec_cfg *cfg, int32_t *k) {
    tn_sseq q[64];
    tn_spec_seq sp[64];
    for (int i = 0; i < n; i++) q[i] = decoding(100, 64, 0), sp[i] = (tn_spec_seq){d, acc[i], -1};
    tn_shape sh;
    tn_sched_plan(s, q, n, &sh);
    tn_sched_spec(s, q, sp, n, cfg, &sh);
    int32_t rows = 0;
    for (int i = 0; i < n; i++) k[i] = sp[i].k, rows += 1 + sp[i].k;
    assert_int_equal(sh.rows, rows);
    assert_int_equal(sh.logits, rows);
    return rows;
}

static void test_spec_expected(void **state) {
    (void)state;
    assert_float_equal(tn_spec_expected(0.5, 3), 1 + 0.5 + 0.25 + 0.125, 1e-12);
    assert_float_equal(tn_spec_expected(0.9, 0), 1, 1e-12);
    assert_float_equal(tn_spec_expected(1.0, 5), 6, 1e-12);
    assert_float_equal(tn_spec_expected(0.0, 5), 1, 1e-12);
    for (int32_t k = 0; k <= 8; k++) assert_float_equal(tn_spec_expected(0.7, k), spec_expected_ref(0.7, k), 1e-12);
    /* acceptance: 0.5, one kept (0.5 + 0.2 x 0.5 = 0.6), then the first rejected (0.6 x 0.8) */
    assert_float_equal(tn_spec_acc_update(0.5, 3, 1), 0.48, 1e-12);
    assert_float_equal(tn_spec_acc_update(0.5, 2, 2), 0.68, 1e-12); /* 0.6, 0.68: all kept */
    assert_float_equal(tn_spec_acc_update(0.5, 1, 0), 0.4, 1e-12);
}

static void test_spec_batch1(void **state) {
    (void)state;
    tn_sched s = spec_sched(0);
    tn_spec_cfg cfg = {1, 8, false, 0, NULL, 0};
    int32_t k[64];
    /* high acceptance at batch 1: rows are nearly free, the longest length is best */
    double a = 0.9;
    spec_run(&s, 1, &a, 8, &cfg, k);
    int32_t kbest = 0;
    for (int32_t j = 1; j <= 8; j++)
        if (spec_expected_ref(a, j) / spec_time_ref(1 + j) > spec_expected_ref(a, kbest) / spec_time_ref(1 + kbest)) kbest = j;
    assert_int_equal(kbest, 8);
    assert_int_equal(k[0], kbest);
    /* fewer drafts found than kmax: all of them */
    spec_run(&s, 1, &a, 3, &cfg, k);
    assert_int_equal(k[0], 3);
    /* the exhaustive optimum at middling acceptance */
    for (double aa = 0.05; aa < 1; aa += 0.05) {
        spec_run(&s, 1, &aa, 8, &cfg, k);
        kbest = 0;
        for (int32_t j = 1; j <= 8; j++)
            if (spec_expected_ref(aa, j) / spec_time_ref(1 + j) > spec_expected_ref(aa, kbest) / spec_time_ref(1 + kbest)) kbest = j;
        assert_int_equal(k[0], kbest);
    }
    /* low acceptance: a draft kept 2% of the time is worth less than its 2.5% of the step */
    a = 0.02;
    spec_run(&s, 1, &a, 8, &cfg, k);
    assert_int_equal(k[0], 0);
    /* fewer drafts than --draft-min: none tried */
    tn_spec_cfg cmin = {4, 8, false, 0, NULL, 0};
    a = 0.9;
    spec_run(&s, 1, &a, 3, &cmin, k);
    assert_int_equal(k[0], 0);
    spec_run(&s, 1, &a, 5, &cmin, k);
    assert_int_equal(k[0], 5);
}

/* A draft model: drafting k tokens costs k passes of it, pass p over the sequences verifying >= p. */
static tn_cost draft_cost(double scale) { /* spec_sched's shape times scale */
    return (tn_cost){3, {1, 16, 64}, {10 * scale * MS, 13 * scale * MS, 61 * scale * MS}, 0.05 * scale * MS, 0};
}

static double draft_time_ref(double scale, int32_t r) { return spec_time_ref(r) * scale; }

static void test_spec_draft_model(void **state) {
    (void)state;
    tn_sched s = spec_sched(0);
    int32_t k[64];
    /* the passes' time by hand: lengths 3, 1, 0 -> a pass of 2 rows, then two of 1 */
    tn_cost d = draft_cost(0.1);
    tn_spec_cfg cfg = {1, 8, false, 0, &d, 0};
    tn_sseq q[3] = {decoding(100, 64, 0), decoding(100, 64, 0), decoding(100, 64, 0)};
    tn_spec_seq sp[3] = {{8, 0.5, 3}, {8, 0.5, 1}, {8, 0.5, 0}};
    assert_float_equal(tn_spec_draft_cost(&cfg, q, sp, 3), draft_time_ref(0.1, 2) + 2 * draft_time_ref(0.1, 1), 1e-12);
    tn_spec_cfg ngram = {1, 8, false, 0, NULL, 0};
    assert_float_equal(tn_spec_draft_cost(&ngram, q, sp, 3), 0, 0);
    /* batch 1: the length maximising expected tokens / (the target's step + k draft passes),
     * exhaustively, for a draft model 10x and 2x cheaper than the target, and one as slow */
    const double scales[] = {0.1, 0.5, 1.0};
    for (int si = 0; si < 3; si++) {
        d = draft_cost(scales[si]);
        for (double a = 0.05; a < 1; a += 0.05) {
            spec_run(&s, 1, &a, 8, &cfg, k);
            int32_t kbest = 0;
            double rbest = 1 / spec_time_ref(1);
            for (int32_t j = 1; j <= 8; j++) {
                double r = spec_expected_ref(a, j) / (spec_time_ref(1 + j) + j * draft_time_ref(scales[si], 1));
                if (r > rbest) rbest = r, kbest = j;
            }
            assert_int_equal(k[0], kbest);
        }
    }
    /* a draft model as slow as the target never pays at acceptance 0.5 (1.5 tokens for 2x the
     * time), where free n-gram drafts do */
    d = draft_cost(1.0);
    double a = 0.5;
    spec_run(&s, 1, &a, 8, &cfg, k);
    assert_int_equal(k[0], 0);
    spec_run(&s, 1, &a, 8, &ngram, k);
    assert_true(k[0] > 0);
    /* a cheap draft model at high acceptance drafts less than free drafts would */
    d = draft_cost(0.1);
    a = 0.8;
    int32_t kd[64];
    spec_run(&s, 1, &a, 8, &cfg, kd);
    spec_run(&s, 1, &a, 8, &ngram, k);
    assert_true(kd[0] > 0 && kd[0] <= k[0]);
    /* the predicted time includes the passes */
    tn_sseq q1 = decoding(100, 64, 0);
    tn_spec_seq sp1 = {8, 0.9, -1};
    tn_shape sh;
    tn_sched_plan(&s, &q1, 1, &sh);
    double t = tn_sched_spec(&s, &q1, &sp1, 1, &cfg, &sh);
    assert_float_equal(t, spec_time_ref(1 + sp1.k) + sp1.k * draft_time_ref(0.1, 1), 1e-9);
}

/* A prefill chunk in the step: its prompt rows count as work like output tokens. Compute-bound
 * (a decoding sequence at 0.9 and a 40-row chunk: 41 rows, 38.05 ms): a draft row adds 1.05 ms
 * for 0.9 tokens, less than the step's 41 units per 38.05 ms, so none. Memory-bound (a 4-row chunk:
 * rows at 0.25 ms each): drafts still pay, as the exhaustive best of (5 + E(k)-1) / t says. */
static void test_spec_prefill(void **state) {
    (void)state;
    tn_sched s = spec_sched(0);
    tn_spec_cfg cfg = {1, 8, false, 0, NULL, 0};
    for (int chunk = 4; chunk <= 40; chunk += 36) {
        tn_sseq q[2] = {decoding(100, 64, 0), prefilling(0, chunk)};
        tn_spec_seq sp[2] = {{8, 0.9, -1}, {0, 0.5, -1}};
        tn_shape sh;
        tn_sched_plan(&s, q, 2, &sh);
        assert_int_equal(q[1].chunk, chunk);
        tn_sched_spec(&s, q, sp, 2, &cfg, &sh);
        /* the step by hand: rows 1 + chunk + j, logit rows 1 + j + 1 (the chunk ends its prompt) */
        int32_t kbest = 0;
        double rbest = 0;
        for (int32_t j = 0; j <= 8; j++) {
            const int32_t r = 1 + chunk + j;
            const double t = (r <= 16 ? 10 + 0.2 * (r - 1) : 13 + (r - 16)) * MS + 0.05 * MS * (j + 1);
            const double w = chunk + spec_expected_ref(0.9, j);
            if (w / t > rbest * (1 + 1e-9)) rbest = w / t, kbest = j;
            if (r > rbest * (1 + 1e-9)) rbest = r, kbest = j;
        }
        print_message("chunk %d: %d drafts (exhaustive best %d)\n", chunk, sp[0].k, kbest);
        assert_int_equal(sp[0].k, kbest);
        assert_int_equal(sp[1].k, 0);
        if (chunk == 40) assert_int_equal(sp[0].k, 0);
        else assert_true(sp[0].k > 0);
    }
}

/* Requests waiting (backlog = 16 slots' worth): 4 decoding sequences at 0.9 in the memory-bound
 * region would fill the rows with drafts (4 + 12 drafts: at most 14.8 tokens in 13.75 ms), but a
 * step of 16 decodes does 16 in 13.75 ms, so with the backlog no draft pays; without it they do. */
static void test_spec_backlog(void **state) {
    (void)state;
    tn_sched s = spec_sched(0);
    tn_spec_cfg cfg = {1, 8, false, 0, NULL, 0};
    double acc[4] = {0.9, 0.9, 0.9, 0.9};
    int32_t k[4];
    int32_t rows = spec_run(&s, 4, acc, 8, &cfg, k);
    assert_true(rows > 4);
    cfg.backlog = 16;
    rows = spec_run(&s, 4, acc, 8, &cfg, k);
    assert_int_equal(rows, 4);
    /* a backlog of 2 slots (a step of 2 rows does 2 in 10.25 ms) still lets drafts pay */
    cfg.backlog = 2;
    rows = spec_run(&s, 4, acc, 8, &cfg, k);
    assert_true(rows > 4);
}

static void test_spec_batch_fills(void **state) {
    (void)state;
    tn_sched s = spec_sched(0);
    tn_spec_cfg cfg = {1, 8, false, 0, NULL, 0};
    double acc[64];
    int32_t k[64];
    for (int i = 0; i < 64; i++) acc[i] = 0.9;
    /* compute-bound: 48 rows cost 47.35 ms for 48 tokens; a draft row adds 1.05 ms for 0.9 */
    int32_t rows = spec_run(&s, 48, acc, 8, &cfg, k);
    assert_int_equal(rows, 48);
    /* the length per sequence falls as the batch fills: 8 at batch 1, 0 from 16 on */
    int32_t prev = 1 << 30;
    for (int n = 1; n <= 32; n *= 2) {
        int32_t total = spec_run(&s, n, acc, 8, &cfg, k) - n, kmax = 0;
        for (int i = 0; i < n; i++) kmax = k[i] > kmax ? k[i] : kmax;
        print_message("batch %d: %d drafts, longest %d\n", n, total, kmax);
        assert_true(kmax <= prev);
        if (n == 1) assert_int_equal(kmax, 8);
        if (n >= 16) assert_int_equal(kmax, 0);
        prev = kmax;
    }
    /* batch 2, one sequence that copies (0.9) and one that does not (0.3): the exhaustive best
     * expected tokens per second, within 1% */
    acc[0] = 0.9, acc[1] = 0.3;
    spec_run(&s, 2, acc, 8, &cfg, k);
    double best = 0;
    for (int32_t a = 0; a <= 8; a++)
        for (int32_t b = 0; b <= 8; b++) {
            double r = (spec_expected_ref(0.9, a) + spec_expected_ref(0.3, b)) / spec_time_ref(2 + a + b);
            if (r > best) best = r;
        }
    double got = (spec_expected_ref(0.9, k[0]) + spec_expected_ref(0.3, k[1])) / spec_time_ref(2 + k[0] + k[1]);
    assert_true(got >= 0.99 * best);
    assert_true(k[0] >= k[1]);
    /* the logit-row cap: 4 sequences, 8 logit rows, so 4 drafts in all */
    for (int i = 0; i < 4; i++) acc[i] = 0.9;
    s.n_logits_cap = 8;
    assert_int_equal(spec_run(&s, 4, acc, 8, &cfg, k), 8);
    /* a fixed length ignores the cost model (not the caps) */
    s.n_logits_cap = 512;
    tn_spec_cfg fixed = {1, 4, true, 0, NULL, 0};
    assert_int_equal(spec_run(&s, 48, acc, 8, &fixed, k), 48 * 5);
    assert_int_equal(k[47], 4);
    /* rows_cap 64: drafts never take a step of fewer rows to 64 (3 x 17 rows fit, a 4th 17 not) */
    tn_spec_cfg cap = {1, 16, true, 64, NULL, 0};
    assert_int_equal(spec_run(&s, 4, acc, 16, &cap, k), 3 * 17 + 1);
    assert_int_equal(k[3], 0);
    cap.fixed = false;
    s.cost = (tn_cost){2, {1, 513}, {10 * MS, 10.5 * MS}, 0, 0}; /* rows nearly free: the adaptive length fills up to the cap */
    assert_int_equal(spec_run(&s, 4, acc, 16, &cap, k), 63);
    /* a step that has 64 rows already (a prefill chunk) may take drafts beyond */
    s = spec_sched(0);
    tn_sseq q[2] = {decoding(100, 64, 0), prefilling(0, 100)};
    tn_spec_seq sp[2] = {{8, 0.9, -1}, {0, 0.5, -1}};
    tn_shape sh;
    tn_sched_plan(&s, q, 2, &sh);
    assert_int_equal(sh.rows, 101);
    tn_sched_spec(&s, q, sp, 2, &(tn_spec_cfg){1, 8, true, 64, NULL, 0}, &sh);
    assert_int_equal(sp[0].k, 8);
    assert_int_equal(sp[1].k, 0);
    assert_int_equal(sh.rows, 109);
}

static void test_spec_tpot(void **state) {
    (void)state;
    /* TPOT 10.55 ms: 10 ms + 0.25 ms per draft row fits 2 drafts (10.5 ms), not 3 (10.75) */
    tn_sched s = spec_sched(10.55);
    tn_spec_cfg cfg = {1, 8, false, 0, NULL, 0};
    double a = 0.9;
    int32_t k[1];
    spec_run(&s, 1, &a, 8, &cfg, k);
    assert_int_equal(k[0], 2);
    assert_true(spec_time_ref(1 + k[0]) <= 10.55 * MS);
    /* planned with a load margin of 1.02: 10.25 x 1.02 = 10.455 fits, 10.5 x 1.02 = 10.71 does not */
    s.f_plan = 1.02;
    spec_run(&s, 1, &a, 8, &cfg, k);
    assert_int_equal(k[0], 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost_interpolation), cmocka_unit_test(test_load_factor),
        cmocka_unit_test(test_plan_no_objective), cmocka_unit_test(test_plan_tpot_chunk),
        cmocka_unit_test(test_plan_bank),          cmocka_unit_test(test_plan_order_and_caps),
        cmocka_unit_test(test_plan_attention_cost), cmocka_unit_test(test_starts),
        cmocka_unit_test(test_simulate),           cmocka_unit_test(test_simulate_tpot_chunks),
        cmocka_unit_test(test_first_late),         cmocka_unit_test(test_accept),
        cmocka_unit_test(test_spec_expected),      cmocka_unit_test(test_spec_batch1),
        cmocka_unit_test(test_spec_draft_model),   cmocka_unit_test(test_spec_prefill),
        cmocka_unit_test(test_spec_backlog),
        cmocka_unit_test(test_spec_batch_fills),   cmocka_unit_test(test_spec_tpot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
