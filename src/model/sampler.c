/*
 * sampler.c — token sampling: repetition penalty, top-k, top-p, min-p, temperature, then a draw
 * from the seeded RNG (llama.cpp's default order); temp <= 0 is greedy (argmax, lowest id on ties).
 * The candidate arrays are allocated once per sampler: sampling allocates nothing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/base.h"
#include "core/trace.h"
#include "model/model.h"

typedef struct {
    int32_t id;
    float logit;
    float p;
} tn_cand;

struct tern_sampler {
    tern_sampler_params p;
    int32_t n_vocab;
    tn_cand *cand;
    int32_t *hist; /* ring buffer of the last repeat_last_n tokens */
    int32_t hist_n, hist_pos;
    uint64_t rng[4]; /* xoshiro256** */
    uint64_t seed;
};

void tern_sampler_params_init(tern_sampler_params *p) {
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->temp = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->seed = TERN_SEED_RANDOM;
}

static uint64_t tn_splitmix64(uint64_t *x) {
    uint64_t z = (*x += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static uint64_t tn_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t tn_rng_next(uint64_t *s) {
    const uint64_t r = tn_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = tn_rotl(s[3], 45);
    return r;
}

/* uniform in [0, 1) with 53 random bits */
static double tn_rng_uniform(uint64_t *s) { return (double)(tn_rng_next(s) >> 11) * 0x1.0p-53; }

tern_status tern_sampler_create(const tern_model *m, const tern_sampler_params *pp, tern_sampler **out) {
    if (!out) return tn_err(TERN_ERR_INVALID_ARG, "tern_sampler_create: out is NULL");
    *out = NULL;
    if (!m) return tn_err(TERN_ERR_INVALID_ARG, "tern_sampler_create: model is NULL");
    tern_sampler_params p;
    tern_sampler_params_init(&p);
    if (pp) memcpy(&p, pp, TN_MIN(sizeof p, pp->struct_size ? pp->struct_size : sizeof p));
    if (!isfinite(p.temp)) return tn_err(TERN_ERR_INVALID_ARG, "sampler: temperature must be finite");
    if (p.top_k < 0) return tn_err(TERN_ERR_INVALID_ARG, "sampler: top_k %d must be >= 0", p.top_k);
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return tn_err(TERN_ERR_INVALID_ARG, "sampler: top_p must be in (0, 1]");
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return tn_err(TERN_ERR_INVALID_ARG, "sampler: min_p must be in [0, 1]");
    if (!(p.repeat_penalty > 0.0f) || !isfinite(p.repeat_penalty))
        return tn_err(TERN_ERR_INVALID_ARG, "sampler: repeat_penalty must be > 0");
    if (p.repeat_last_n < 0 || p.repeat_last_n > (1 << 20))
        return tn_err(TERN_ERR_INVALID_ARG, "sampler: repeat_last_n %d outside 0..1048576", p.repeat_last_n);
    tern_sampler *s = tn_calloc(1, sizeof *s);
    if (!s) return tn_err(TERN_ERR_NOMEM, "sampler: out of memory");
    s->p = p;
    s->n_vocab = m->hp.n_vocab;
    s->cand = tn_malloc((size_t)s->n_vocab * sizeof *s->cand);
    s->hist = tn_malloc((size_t)TN_MAX(p.repeat_last_n, 1) * sizeof *s->hist);
    if (!s->cand || !s->hist) {
        tern_sampler_free(s);
        return tn_err(TERN_ERR_NOMEM, "sampler: out of memory");
    }
    uint64_t seed = p.seed;
    if (seed == TERN_SEED_RANDOM) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = ((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40)) & 0xFFFFFFFEu;
    }
    s->seed = seed;
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = tn_splitmix64(&x);
    *out = s;
    return TERN_OK;
}

void tern_sampler_free(tern_sampler *s) {
    if (!s) return;
    tn_free(s->cand);
    tn_free(s->hist);
    tn_free(s);
}

uint64_t tern_sampler_seed(const tern_sampler *s) { return s->seed; }

void tern_sampler_accept(tern_sampler *s, tern_token t) {
    if (!s || s->p.repeat_last_n == 0) return;
    s->hist[s->hist_pos] = t;
    s->hist_pos = (s->hist_pos + 1) % s->p.repeat_last_n;
    if (s->hist_n < s->p.repeat_last_n) s->hist_n++;
}

static int tn_cand_cmp(const void *a, const void *b) {
    const tn_cand *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return x->id - y->id;
}

/* Moves the k largest candidates to the front, sorted (partial selection, then sort). */
static void tn_top_k(tn_cand *c, int32_t n, int32_t k) {
    /* simple approach: full sort when k is large, else a bounded insertion pass */
    if (k >= n / 8) {
        qsort(c, (size_t)n, sizeof *c, tn_cand_cmp);
        return;
    }
    for (int32_t i = 0; i < k; i++) { /* k passes of selection over the unsorted tail */
        int32_t best = i;
        for (int32_t j = i + 1; j < n; j++)
            if (tn_cand_cmp(&c[j], &c[best]) < 0) best = j;
        tn_cand t = c[i];
        c[i] = c[best];
        c[best] = t;
    }
}

static tern_token tn_sample(tern_sampler *s, const float *logits);

/* The sampling span around the sampler (trace.h). */
tern_token tern_sampler_sample(tern_sampler *s, const float *logits) {
    TN_SPAN_B(TN_TK_SAMPLE, "sample", -1, s->n_vocab, 0, 0, 0);
    const tern_token t = tn_sample(s, logits);
    TN_SPAN_E(TN_TK_SAMPLE, "sample", -1, t, 0);
    return t;
}

static tern_token tn_sample(tern_sampler *s, const float *logits) {
    const int32_t nv = s->n_vocab;
    tn_cand *c = s->cand;
    for (int32_t i = 0; i < nv; i++) c[i] = (tn_cand){i, logits[i], 0.0f};
    /* repetition penalty (llama.cpp rule: divide positive logits, multiply negative ones) */
    if (s->p.repeat_penalty != 1.0f) {
        for (int32_t h = 0; h < s->hist_n; h++) {
            int32_t t = s->hist[h];
            if (t < 0 || t >= nv) continue;
            bool seen = false; /* penalise each distinct token once */
            for (int32_t g = 0; g < h; g++) seen |= s->hist[g] == t;
            if (seen) continue;
            c[t].logit = c[t].logit > 0 ? c[t].logit / s->p.repeat_penalty : c[t].logit * s->p.repeat_penalty;
        }
    }
    if (s->p.temp <= 0.0f) {
        int32_t best = 0;
        for (int32_t i = 1; i < nv; i++)
            if (c[i].logit > c[best].logit) best = i;
        tern_sampler_accept(s, c[best].id);
        return c[best].id;
    }
    int32_t n = nv;
    if (s->p.top_k > 0 && s->p.top_k < n) {
        tn_top_k(c, n, s->p.top_k);
        n = s->p.top_k;
    } else {
        qsort(c, (size_t)n, sizeof *c, tn_cand_cmp);
    }
    /* softmax over the survivors (sorted descending) */
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        c[i].p = expf(c[i].logit - c[0].logit);
        sum += c[i].p;
    }
    for (int32_t i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
    if (s->p.top_p < 1.0f) { /* smallest prefix with cumulative p >= top_p */
        double cum = 0.0;
        for (int32_t i = 0; i < n; i++) {
            cum += c[i].p;
            if (cum >= s->p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0.0f) { /* keep tokens with p >= min_p * p_max */
        const float thr = s->p.min_p * c[0].p;
        int32_t k = 1;
        while (k < n && c[k].p >= thr) k++;
        n = k;
    }
    /* temperature, renormalise, draw */
    sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        c[i].p = expf((c[i].logit - c[0].logit) / s->p.temp);
        sum += c[i].p;
    }
    double r = tn_rng_uniform(s->rng) * sum, acc = 0.0;
    int32_t pick = n - 1;
    for (int32_t i = 0; i < n; i++) {
        acc += c[i].p;
        if (r < acc) {
            pick = i;
            break;
        }
    }
    tern_sampler_accept(s, c[pick].id);
    return c[pick].id;
}
