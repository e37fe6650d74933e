/*
 * data.c — token shards and batches. See data.h.
 */
#include <math.h>
#include <string.h>

#include "train/data.h"
#include "train/rng.h"

uint64_t tn_text_hash(const char *const *texts, const size_t *lens, int n_texts) {
    uint64_t h = UINT64_C(1469598103934665603);
    for (int t = 0; t < n_texts; t++) {
        for (size_t i = 0; i < lens[t]; i++) h = (h ^ (unsigned char)texts[t][i]) * UINT64_C(1099511628211);
        h = (h ^ 0xFF) * UINT64_C(1099511628211);
    }
    return h;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static bool shard_matches(const char *path, uint64_t vh, uint64_t th, uint64_t *n_tokens) {
    tn_map m;
    if (tn_map_open(path, true, &m)) { tn_err_clear(); return false; }
    bool ok = false;
    if (m.size >= TN_SHARD_HEADER) {
        uint32_t mg, ver;
        uint64_t h1, h2, n;
        memcpy(&mg, m.data, 4); memcpy(&ver, m.data + 4, 4); memcpy(&h1, m.data + 8, 8);
        memcpy(&h2, m.data + 16, 8); memcpy(&n, m.data + 24, 8);
        ok = mg == TN_SHARD_MAGIC && ver == TN_SHARD_VERSION && h1 == vh && h2 == th &&
             n <= (m.size - TN_SHARD_HEADER) / 4 && m.size == TN_SHARD_HEADER + n * 4;
        if (ok) *n_tokens = n;
    }
    tn_map_close(&m);
    return ok;
}

tern_status tn_shard_build(const char *const *texts, const size_t *lens, int n_texts, const tn_vocab_data *v,
                           const char *shard_path, uint64_t *n_tokens) {
    const uint64_t vh = tn_vocab_data_hash(v), th = tn_text_hash(texts, lens, n_texts);
    if (shard_matches(shard_path, vh, th, n_tokens)) return TERN_OK;
    tn_spm_enc *e;
    tern_status s = tn_spm_enc_create(v, &e);
    if (s) return s;
    int32_t *toks = NULL;
    size_t n = 0, cap = 0;
    for (int t = 0; t < n_texts && !s; t++) {
        const char *p = texts[t], *end = texts[t] + lens[t];
        while (p < end && !s) {
            /* paragraph: up to a blank line */
            while (p < end && (*p == '\n' || *p == '\r')) p++;
            if (p >= end) break;
            const char *q = p;
            while (q < end && !(q[0] == '\n' && (q + 1 == end || q[1] == '\n' || (q[1] == '\r' && q + 2 < end && q[2] == '\n')))) q++;
            size_t len = (size_t)(q - p);
            while (len && (p[len - 1] == '\r' || p[len - 1] == '\n')) len--;
            if (len) {
                if (n == cap) {
                    size_t nc = cap ? cap * 2 : 65536;
                    int32_t *nt = tn_realloc(toks, nc * sizeof *nt);
                    if (!nt) { s = tn_err(TERN_ERR_NOMEM, "train: tokens"); break; }
                    toks = nt; cap = nc;
                }
                toks[n++] = v->bos;
                s = tn_spm_encode(e, p, len, &toks, &n, &cap);
            }
            p = q;
        }
    }
    tn_spm_enc_free(e);
    if (s) { tn_free(toks); return s; }
    if (n == 0) { tn_free(toks); return tn_err(TERN_ERR_FORMAT, "train: the corpus is empty (no text to train on)"); }
    tn_wfile w;
    if ((s = tn_wfile_open(shard_path, &w))) { tn_free(toks); return s; }
    uint8_t hdr[TN_SHARD_HEADER];
    put32(hdr, TN_SHARD_MAGIC); put32(hdr + 4, TN_SHARD_VERSION); put64(hdr + 8, vh); put64(hdr + 16, th);
    put64(hdr + 24, (uint64_t)n);
    tn_wfile_write(&w, hdr, sizeof hdr);
    tn_wfile_write(&w, toks, n * sizeof *toks);
    tn_free(toks);
    if ((s = tn_wfile_commit(&w))) return s;
    *n_tokens = n;
    return TERN_OK;
}

static void make_perm(tn_data *d) {
    for (int64_t i = 0; i < d->n_train; i++) d->perm[i] = d->train_w[i];
    uint64_t rng = d->seed * UINT64_C(0x9E3779B97F4A7C15) + (uint64_t)d->epoch + UINT64_C(0x64617461); /* "data" */
    for (int64_t i = d->n_train - 1; i > 0; i--) {
        int64_t j = (int64_t)tn_rng_below(&rng, (uint64_t)i + 1);
        int64_t t = d->perm[i]; d->perm[i] = d->perm[j]; d->perm[j] = t;
    }
}

/* Window tables for nw windows: every period-th held out for validation (the last one when there
 * are fewer than period; none when period is 0), the rest shuffled per epoch. */
static tern_status split_windows(tn_data *d, int64_t nw, int64_t period) {
    d->train_w = tn_malloc((size_t)nw * sizeof *d->train_w);
    d->val_w = tn_malloc((size_t)nw * sizeof *d->val_w);
    d->perm = tn_malloc((size_t)nw * sizeof *d->perm);
    if (!d->train_w || !d->val_w || !d->perm) return tn_err(TERN_ERR_NOMEM, "train: window tables");
    for (int64_t w = 0; w < nw; w++) {
        const bool val = period && (nw >= period ? w % period == period - 1 : w == nw - 1);
        if (val) d->val_w[d->n_val++] = w;
        else d->train_w[d->n_train++] = w;
    }
    make_perm(d);
    return TERN_OK;
}

tern_status tn_data_open(const char *path, const tn_vocab_data *v, int T, uint64_t seed, tn_data *d) {
    memset(d, 0, sizeof *d);
    tern_status s = tn_map_open(path, true, &d->map);
    if (s) return s;
    const uint8_t *p = d->map.data;
    uint32_t mg, ver;
    uint64_t vh, n;
    if (d->map.size < TN_SHARD_HEADER) { s = tn_err(TERN_ERR_FORMAT, "train: shard %s: shorter than its header", path); goto fail; }
    memcpy(&mg, p, 4); memcpy(&ver, p + 4, 4); memcpy(&vh, p + 8, 8); memcpy(&n, p + 24, 8);
    if (mg != TN_SHARD_MAGIC) { s = tn_err(TERN_ERR_FORMAT, "train: %s is not a tern token shard (bad magic)", path); goto fail; }
    if (ver != TN_SHARD_VERSION) { s = tn_err(TERN_ERR_FORMAT, "train: shard %s: version %u, expected %u", path, ver, TN_SHARD_VERSION); goto fail; }
    if (vh != tn_vocab_data_hash(v)) { s = tn_err(TERN_ERR_FORMAT, "train: shard %s was made with a different vocabulary", path); goto fail; }
    if (n > (d->map.size - TN_SHARD_HEADER) / 4 || d->map.size != TN_SHARD_HEADER + n * 4) {
        s = tn_err(TERN_ERR_FORMAT, "train: shard %s: %llu tokens do not match its size %zu", path, (unsigned long long)n, d->map.size);
        goto fail;
    }
    d->tok = (const int32_t *)(p + TN_SHARD_HEADER);
    d->n_tok = n;
    for (uint64_t i = 0; i < n; i++)
        if (d->tok[i] < 0 || d->tok[i] >= v->n) {
            s = tn_err(TERN_ERR_FORMAT, "train: shard %s: token %lld at %llu outside the vocabulary", path, (long long)d->tok[i],
                       (unsigned long long)i);
            goto fail;
        }
    d->T = T;
    d->seed = seed;
    int64_t nw = n > 0 ? (int64_t)((n - 1) / (uint64_t)T) : 0;
    if (nw < 2) {
        s = tn_err(TERN_ERR_FORMAT, "train: the corpus has %llu tokens; training with ctx %d needs at least %d "
                   "(two windows: one to train on, one held out)", (unsigned long long)n, T, 2 * T + 1);
        goto fail;
    }
    if ((s = split_windows(d, nw, 20))) goto fail;
    return TERN_OK;
fail:
    tn_data_close(d);
    return s;
}

void tn_data_close(tn_data *d) {
    tn_map_close(&d->map);
    tn_free(d->own_tok);
    tn_free(d->keep);
    tn_free(d->train_w);
    tn_free(d->val_w);
    tn_free(d->perm);
    memset(d, 0, sizeof *d);
}

tern_status tn_data_seek(tn_data *d, int64_t epoch, int64_t pos) {
    if (epoch < 0 || pos < 0 || pos > d->n_train)
        return tn_err(TERN_ERR_FORMAT, "train: data cursor (epoch %lld, position %lld) outside the data (%lld windows)",
                      (long long)epoch, (long long)pos, (long long)d->n_train);
    d->epoch = epoch;
    d->pos = pos;
    make_perm(d);
    return TERN_OK;
}

static void window(const tn_data *d, int64_t w, int32_t *tokens, int32_t *targets) {
    const int64_t stride = d->keep ? d->T + 1 : d->T;
    const int32_t *src = d->tok + w * stride;
    memcpy(tokens, src, (size_t)d->T * sizeof *tokens);
    memcpy(targets, src + 1, (size_t)d->T * sizeof *targets);
    if (d->keep)
        for (int i = 0; i < d->T; i++)
            if (!d->keep[w * stride + 1 + i]) targets[i] = -1;
}

tern_status tn_data_from_samples(int32_t *tok, uint8_t *keep, int64_t n, int T, double val_frac, uint64_t seed, tn_data *d) {
    memset(d, 0, sizeof *d);
    d->own_tok = tok;
    d->tok = tok;
    d->keep = keep;
    d->n_tok = (uint64_t)n * (uint64_t)(T + 1);
    d->T = T;
    d->seed = seed;
    tern_status s = TERN_OK;
    const int64_t period = val_frac > 0 ? TN_MAX((int64_t)2, (int64_t)llround(1.0 / val_frac)) : 0;
    if (n < (period ? 2 : 1)) {
        s = tn_err(TERN_ERR_FORMAT, "train: the data holds %lld sample%s of up to %d tokens; training%s needs at least %d",
                   (long long)n, n == 1 ? "" : "s", T + 1, period ? " with a validation split" : "", period ? 2 : 1);
        goto fail;
    }
    if ((s = split_windows(d, n, period))) goto fail;
    return TERN_OK;
fail:
    tn_data_close(d);
    return s;
}

tern_status tn_data_next(tn_data *d, int B, int32_t *tokens, int32_t *targets) {
    for (int b = 0; b < B; b++) {
        if (d->pos >= d->n_train) {
            d->epoch++;
            d->pos = 0;
            make_perm(d);
        }
        window(d, d->perm[d->pos++], tokens + (size_t)b * d->T, targets + (size_t)b * d->T);
    }
    return TERN_OK;
}

void tn_data_val(const tn_data *d, int64_t i, int B, int32_t *tokens, int32_t *targets) {
    for (int b = 0; b < B; b++) {
        int64_t w = d->val_w[(i * B + b) % d->n_val];
        window(d, w, tokens + (size_t)b * d->T, targets + (size_t)b * d->T);
    }
}
