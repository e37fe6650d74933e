/*
 * pcache.c — the prompt cache on disk (pcache.h): the plane codec, block files (write atomically,
 * verify on read), the directory (fingerprint subdirectory, LRU bound, full-disk stop) and the
 * load/store entry points on a contiguous context. It never trusts a file: every field is checked
 * before a byte reaches the KV cache, and a bad file only costs its recomputation.
 *
 * File header (little-endian), TN_PC_HDR bytes, then the payload and a CRC-32 trailer:
 *     0 "TNPC"   4 u32 version   8 u64 fingerprint   16 u32 row type   20 u32 quality
 *    24 u32 n_layer   28 u32 kv_dim   32 u32 n_tok (16)   36 u32 block index
 *    40 u64 chain hash (the file's name)   48 u64 second prefix hash (another seed)
 *    56 u64 raw size   64 u64 payload size   72 i32 tokens[16]
 *   136 payload (zstd frame of the planes: layer 0 K, layer 0 V, layer 1 K, ...)
 *   end u32 CRC-32 (IEEE) of every byte before it
 */
#include "model/pcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/base.h"
#include "core/file.h"
#include "core/le.h"
#include "core/rc.h"
#include "model/blocks.h"
#include "model/ctx.h"
#include "model/model.h"
#include "model/ops.h"
#include "fmt/gguf.h"

#ifdef TERN_HAVE_ZSTD
#include <zstd.h>
#endif

#define TN_PC_HDR 136
#define TN_PC_MAGIC "TNPC"
#define TN_PC_ZLEVEL 3

_Static_assert(TN_PC_NTOK == TN_KV_BLOCK, "a cache block is a KV block");

/* ---- hashes ------------------------------------------------------------------------------ */

uint64_t tn_tok_hash(uint64_t seed, uint64_t parent_hash, const tern_token *toks) {
    uint64_t h = parent_hash ^ UINT64_C(0x9E3779B97F4A7C15) ^ (seed * UINT64_C(0xD6E8FEB86659FD93));
    for (int i = 0; i < TN_PC_NTOK; i++) { /* splitmix-style mixing per token */
        h ^= (uint64_t)(uint32_t)toks[i];
        h *= UINT64_C(0xBF58476D1CE4E5B9);
        h ^= h >> 31;
        h *= UINT64_C(0x94D049BB133111EB);
        h ^= h >> 29;
    }
    return h;
}

static uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= UINT64_C(0xFF51AFD7ED558CCD);
    h ^= h >> 33;
    h *= UINT64_C(0xC4CEB9FE1A85EC53);
    h ^= h >> 33;
    return h;
}

/* 64-bit hash of a byte range, four independent lanes (the model fingerprint reads every byte). */
static uint64_t hash_bytes(const uint8_t *p, size_t n, uint64_t seed) {
    uint64_t h[4] = {seed ^ 1, seed ^ UINT64_C(0x9E3779B97F4A7C15), seed ^ 3, seed ^ UINT64_C(0x94D049BB133111EB)};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int l = 0; l < 4; l++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * l, 8);
            h[l] = (h[l] ^ w) * UINT64_C(0x9FB21C651E98DF25);
            h[l] ^= h[l] >> 29;
        }
    uint64_t r = mix64(h[0]) ^ mix64(h[1] + 1) ^ mix64(h[2] + 2) ^ mix64(h[3] + 3) ^ (uint64_t)n;
    for (; i < n; i++) r = mix64(r ^ p[i]);
    return mix64(r);
}

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? UINT32_C(0xEDB88320) ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}
uint32_t tn_pc_crc32(const uint8_t *p, size_t n) {
    pthread_once(&crc_once, crc_init);
    uint32_t c = UINT32_C(0xFFFFFFFF);
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ UINT32_C(0xFFFFFFFF);
}

uint64_t tn_pc_model_hash(const tern_model *m) { return hash_bytes(m->gguf->base, m->gguf->size, TN_PC_HASH_SEED); }

/* ---- plane codec ------------------------------------------------------------------------ */

/* Steps per RMS of each lossy quality: {K, V} plane terms, {K, V} channel terms, finer first
 * layers, tilts, channel-weight exponents (docs/prompt-cache.md: how they were chosen, on which
 * windows). */
static const tn_pc_steps pc_steps[TN_PC_N_QUALITY] = {
    [TN_PC_HIGH] = {{12.0f, 12.0f}, {8.0f, 8.0f}, 1.0f, 0, false, {0, 0}, {2.0f, 0}},
    [TN_PC_BALANCED] = {{3.0f, 2.0f}, {1.0f, 1.0f}, 1.0f, 0, false, {0, 0}, {2.0f, 0}},
    [TN_PC_MEDIUM] = {{1.0f, 0.7f}, {0, 0}, 1.0f, 0, false, {0, 0}, {0, 0}},
};

tn_pc_steps tn_pc_steps_of(tn_pc_quality q) { return (unsigned)q < TN_PC_N_QUALITY ? pc_steps[q] : pc_steps[TN_PC_LOSSLESS]; }

float tn_pc_div(const tn_pc_steps *st, int kv, int32_t il, bool ch) {
    const float d = ch ? st->div_ch[kv != 0] : st->div[kv != 0];
    return il < st->n_first ? d * st->mul_first : d;
}

bool tn_pc_layer_roped(const tn_hparams *hp, int32_t il) {
    return hp->n_rot > 0 && !(hp->family && hp->family->mla) && tn_hp_layer_rope(hp, il);
}

/* Scales w[0..n) to a geometric mean of 1, after raising entries under 1/1024 of the largest. */
static void weights_norm(float *w, int64_t n) {
    double mx = 0, sl = 0;
    for (int64_t j = 0; j < n; j++) mx = fmax(mx, (double)w[j]);
    if (!(mx > 0) || !isfinite(mx)) {
        for (int64_t j = 0; j < n; j++) w[j] = 1;
        return;
    }
    for (int64_t j = 0; j < n; j++) sl += log(fmax((double)w[j], mx / 1024));
    const double g = exp(sl / (double)n);
    for (int64_t j = 0; j < n; j++) w[j] = (float)(fmax((double)w[j], mx / 1024) / g);
}

tern_status tn_pc_channel_weights(const tern_model *m, float *w) {
    const tn_hparams *hp = &m->hp;
    const int64_t hd = hp->head_dim, kvd = (int64_t)hp->n_head_kv * hd, qd = tn_hp_q_dim(hp);
    const int32_t grp = hp->n_head_kv > 0 ? hp->n_head / hp->n_head_kv : 1;
    float *row = tn_malloc((size_t)TN_MAX(TN_MAX(qd, (int64_t)hp->n_embd), 1) * sizeof *row);
    double *eq = tn_malloc((size_t)(qd + qd + hp->n_embd) * sizeof *eq), *ev = eq ? eq + qd : NULL, *g = ev ? ev + qd : NULL;
    if (!row || !eq) {
        tn_free(row), tn_free(eq);
        return TERN_ERR_NOMEM;
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tn_layer *L = &m->layers[il];
        const tn_tensor *wq = &L->w[TN_ROLE_ATTN_Q], *wo = &L->w[TN_ROLE_ATTN_OUT], *an = &L->w[TN_ROLE_ATTN_NORM],
                        *qnt = &L->w[TN_ROLE_ATTN_Q_NORM];
        float *wk = w + (size_t)il * 2 * (size_t)kvd, *wv = wk + kvd;
        for (int64_t i = 0; i < hp->n_embd; i++) g[i] = 1;
        if (an->data && an->ne[0] == hp->n_embd) {
            tn_tensor_get_row(an, 0, row);
            for (int64_t i = 0; i < hp->n_embd; i++) g[i] = row[i];
        }
        /* E[q_j^2] of every query channel */
        const bool have_q = wq->data && wq->ne[0] == hp->n_embd && wq->ne[1] >= qd;
        for (int64_t j = 0; j < qd; j++) {
            eq[j] = 1;
            if (!have_q) continue;
            tn_tensor_get_row(wq, j, row);
            double s = 0;
            for (int64_t i = 0; i < hp->n_embd; i++) s += (double)row[i] * g[i] * (double)row[i] * g[i];
            eq[j] = s;
        }
        if (have_q && qnt->data && (qnt->ne[0] == hd || qnt->ne[0] == qd)) { /* normed per head, then scaled */
            tn_tensor_get_row(qnt, 0, row);
            for (int32_t h = 0; h < hp->n_head; h++) {
                double mean = 0;
                for (int64_t j = 0; j < hd; j++) mean += eq[h * hd + j] / (double)hd;
                for (int64_t j = 0; j < hd; j++) {
                    const double s = row[qnt->ne[0] == hd ? j : h * hd + j];
                    eq[h * hd + j] = mean > 0 ? s * s * eq[h * hd + j] / mean : s * s;
                }
            }
        }
        if (tn_pc_layer_roped(hp, il)) /* a RoPE pair shares its energy */
            for (int32_t h = 0; h < hp->n_head; h++)
                for (int32_t i0 = 0; i0 + 1 < hp->n_rot; i0 += 2) {
                    const int64_t a = h * hd + (hp->rope_mode == TN_ROPE_NORM ? i0 : i0 / 2);
                    const int64_t b = h * hd + (hp->rope_mode == TN_ROPE_NORM ? i0 + 1 : i0 / 2 + hp->n_rot / 2);
                    eq[a] = eq[b] = (eq[a] + eq[b]) / 2;
                }
        /* |W_o column|^2 of every attention-output channel */
        const bool have_o = wo->data && wo->ne[0] == qd;
        for (int64_t j = 0; j < qd; j++) ev[j] = have_o ? 0 : 1;
        for (int64_t r = 0; have_o && r < wo->ne[1]; r++) {
            tn_tensor_get_row(wo, r, row);
            for (int64_t j = 0; j < qd; j++) ev[j] += (double)row[j] * row[j];
        }
        for (int64_t c = 0; c < kvd; c++) {
            const int64_t kh = c / hd, j = c % hd;
            double sk = 0, sv = 0;
            for (int32_t h = (int32_t)kh * grp; h < (int32_t)(kh + 1) * grp; h++) sk += eq[h * hd + j], sv += ev[h * hd + j];
            wk[c] = (float)sqrt(sk), wv[c] = (float)sqrt(sv);
        }
        weights_norm(wk, kvd);
        weights_norm(wv, kvd);
    }
    tn_free(row), tn_free(eq);
    return TERN_OK;
}

void tn_pc_rope_plane(const tn_hparams *hp, const float *ff, int32_t il, int64_t pos0, float *x, float *cs, int dir) {
    tn_hparams h = *hp; /* local layers rotate with their own base and scale (tn_blk_embed) */
    if (tn_hp_layer_swa(hp, il)) h.rope_freq_base = hp->rope_base_swa, h.rope_freq_scale = hp->rope_scale_swa;
    const int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    for (int t = 0; t < TN_PC_NTOK; t++) {
        tn_op_rope_cache(&h, ff, pos0 + t, cs);
        if (dir < 0) /* the pair (m cos, m sin) / m^2: tn_op_rope's sign -1 then applies R^T / m, m R's inverse */
            for (int32_t i = 0; i + 1 < h.n_rot; i += 2) {
                const float m2 = cs[i] * cs[i] + cs[i + 1] * cs[i + 1];
                if (m2 > 0) cs[i] /= m2, cs[i + 1] /= m2;
            }
        tn_op_rope(&h, x + (int64_t)t * kv_dim, h.n_head_kv, cs, dir < 0 ? -1.0f : 1.0f);
    }
}

size_t tn_pc_plane_max(int64_t kv_dim) { return 1 + (size_t)kv_dim * 2 + (size_t)TN_PC_NTOK * (size_t)kv_dim * 2; }

static uint16_t zigzag16(int32_t d) { return (uint16_t)(((uint32_t)d << 1) ^ (uint32_t)(d < 0 ? -1 : 0)); }
static int32_t unzigzag16(uint16_t z) { return (int32_t)(z >> 1) ^ -(int32_t)(z & 1); }
/* f16 bits -> a code whose integer order is the numbers' order (and back) */
static uint16_t f16_order(uint16_t h) { return h & 0x8000 ? (uint16_t)~h : (uint16_t)(h | 0x8000); }
static uint16_t f16_unorder(uint16_t o) { return o & 0x8000 ? (uint16_t)(o & 0x7FFF) : (uint16_t)~o; }

/* the zigzagged integers z[16][kv_dim] as a low-byte plane and a high-byte plane */
static void put_planes(const uint16_t *z, size_t n, uint8_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = (uint8_t)z[i], out[n + i] = (uint8_t)(z[i] >> 8);
}

/* Bits the byte planes of z[0..n) would take under an order-0 entropy coder (zstd's literals are
 * Huffman-coded): how the lossless encoder picks between deltas and raw values for a plane. */
static double plane_bits(const uint16_t *z, size_t n) {
    uint32_t hl[256] = {0}, hh[256] = {0};
    for (size_t i = 0; i < n; i++) hl[z[i] & 0xFF]++, hh[z[i] >> 8]++;
    double bits = 0;
    for (int k = 0; k < 256; k++) {
        if (hl[k]) bits -= hl[k] * log2((double)hl[k] / (double)n);
        if (hh[k]) bits -= hh[k] * log2((double)hh[k] / (double)n);
    }
    return bits;
}

/* mode byte: bit 1 = raw values (no deltas between neighbouring tokens); bit 2 = lossy: steps per
 * channel, the integers range-coded; bit 3 = (lossy K) keys before RoPE; bit 4 = (lossy) raw or
 * deltas per channel (bit 0, per-channel f16 steps, was format 1's lossy mode: no longer written
 * or read) */
#define TN_PC_MODE_RAW 2
#define TN_PC_MODE_RC 4
#define TN_PC_MODE_PRE_ROPE 8
#define TN_PC_RC_HDR 5 /* mode, coded bytes (u32) */
#define TN_PC_MODE_MIXED 16 /* lossy: raw or deltas chosen per channel (a flag before each) */
#define TN_PC_MODE_ROWS 32  /* a quantized cache's 16 rows as stored in memory (lossless there) */
/* TN_PC_NCTX integer models: the first token's; then by |previous value|: 0, 1, larger (finer
 * buckets, 2, 3-4, 5-8, coded 0.5% larger on the default model) */

void tn_pc_models_init(tn_pc_models *m) {
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int k = 0; k <= TN_PC_NCTX; k++) tn_rc_int_model_init(&m->m[a][b][k]);
    m->raw_ch[0] = m->raw_ch[1] = TN_RC_PROB_INIT;
}

/* The model of token t's value in a channel, from the previous value coded there. */
static int rc_ctx(int t, int32_t prev) {
    if (t == 0) return 0;
    const uint32_t a = prev < 0 ? 0u - (uint32_t)prev : (uint32_t)prev;
    return a == 0 ? 1 : a == 1 ? 2 : 3;
}
_Static_assert(TN_PC_NCTX == 4, "rc_ctx's contexts");

/* Per-channel steps on a grid of eighth-octaves: step(e) = 2^(e / 8), exactly (ldexpf of one of 8
 * float constants), so encoder and decoder agree on every machine. */
#define TN_PC_E_MIN (-320)
#define TN_PC_E_MAX 160
static float step_of(int32_t e) {
    static const float frac[8] = {1.0f, 1.0905077327f, 1.1892071150f, 1.2968395547f, 1.4142135624f, 1.5422108254f, 1.6817928305f, 1.8340080864f};
    const int32_t q = e >= 0 ? e / 8 : -((-e + 7) / 8);
    return ldexpf(frac[e - 8 * q], q);
}
/* The grid step at or just under s > 0. */
static int32_t step_index(float s) {
    int32_t e = (int32_t)floorf(8.0f * log2f(s));
    if (e < TN_PC_E_MIN) e = TN_PC_E_MIN;
    if (e > TN_PC_E_MAX) e = TN_PC_E_MAX;
    while (e > TN_PC_E_MIN && step_of(e) > s) e--;
    while (e < TN_PC_E_MAX && step_of(e + 1) <= s) e++;
    return e;
}

/* Range-codes the channels' step indices (each as the change from the previous channel's) and
 * then c[16][kv_dim] channel by channel into out[0..cap): how = 0 deltas between neighbouring
 * tokens, 1 raw values, 2 per channel as chraw[ch] says (a flag before the channel); returns the
 * bytes, 0 when they do not fit. mod: the plane's models (K's or V's), updated. */
static size_t rc_plane(const int32_t *e_ch, const int32_t *c, int64_t kv_dim, int how, const uint8_t *chraw, tn_rc_int_model (*mod)[TN_PC_NCTX + 1],
                       tn_rc_prob *pflag, uint8_t *out, size_t cap) {
    tn_rc_enc e;
    tn_rc_enc_init(&e, out, cap);
    tn_rc_int_model *ms = mod[how == 1];
    for (int64_t ch = 0; ch < kv_dim; ch++) tn_rc_enc_int(&e, &ms[TN_PC_NCTX], e_ch[ch] - (ch ? e_ch[ch - 1] : 0));
    for (int64_t ch = 0; ch < kv_dim; ch++) {
        const bool raw = how == 2 ? chraw[ch] != 0 : how == 1;
        if (how == 2) tn_rc_enc_bit(&e, pflag, raw);
        tn_rc_int_model *mv = mod[raw];
        int32_t prev = 0, sym = 0;
        for (int t = 0; t < TN_PC_NTOK; t++) {
            const int32_t v = c[(size_t)t * kv_dim + ch];
            const int k = rc_ctx(t, sym);
            sym = raw ? v : v - prev;
            tn_rc_enc_int(&e, &mv[k], sym);
            prev = v;
        }
    }
    return tn_rc_enc_finish(&e);
}

/* About the bits an Elias-gamma code of v takes (zero flag, sign, prefix and suffix). */
static int gamma_bits(int32_t v) {
    const uint32_t a = v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
    return a == 0 ? 1 : 2 + 2 * (31 - __builtin_clz(a)) + 1;
}


/* Lossy: per channel a step s = min(rms(plane) / div * (rms(channel) / rms(plane))^-tilt * w^-wexp,
 * rms(channel) / div_ch) (w: the channel's weight, 1 without w) on the grid (at or under it), c = round(x / s), range-coded with deltas or raw values, whichever is smaller. 0
 * when a value is not finite or the coded plane would not fit (the caller stores it losslessly). */
static size_t encode_lossy(float div, float div_ch, float tilt, const float *w, float wexp, tn_pc_models *mod, int kv, const float *x,
                           int64_t kv_dim, uint8_t mode, uint8_t *out, size_t cap) {
    const size_t n = (size_t)TN_PC_NTOK * (size_t)kv_dim;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    int32_t *c = (int32_t *)tn_malloc((n + (size_t)kv_dim) * sizeof *c), *e_ch = c ? c + n : NULL;
    uint8_t *alt = (uint8_t *)tn_malloc(3 * cap + (size_t)kv_dim), *chraw = alt ? alt + 3 * cap : NULL;
    tn_pc_models *trial = (tn_pc_models *)tn_malloc(3 * sizeof *trial);
    size_t r = 0;
    if (c && alt && trial && cap > TN_PC_RC_HDR) {
        double ss = 0;
        for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
        const double rms_p = sqrt(ss / (double)n), s_plane = div > 0 ? rms_p / div : INFINITY;
        for (int64_t ch = 0; ch < kv_dim; ch++) {
            double sc = 0;
            for (int t = 0; t < TN_PC_NTOK; t++) sc += (double)x[(size_t)t * kv_dim + ch] * x[(size_t)t * kv_dim + ch];
            double lean = 1;
            const double rms_c = sqrt(sc / TN_PC_NTOK);
            if (tilt != 0 && rms_c > 0) lean = pow(rms_c / rms_p, -(double)tilt);
            if (w && wexp != 0) lean *= pow((double)w[ch], -(double)wexp);
            const double want = fmin(s_plane * lean, div_ch > 0 ? rms_c / div_ch : INFINITY);
            e_ch[ch] = want > 0 ? step_index((float)want) : ch ? e_ch[ch - 1] : 0; /* all zero: any step */
            const float s = step_of(e_ch[ch]);
            for (int t = 0; t < TN_PC_NTOK; t++) {
                const size_t i = (size_t)t * kv_dim + ch;
                const float v = want > 0 ? rintf(x[i] / s) : 0;
                if (!(fabsf(v) < (float)(1 << 21))) goto out; /* values and deltas stay in the integer coder's range */
                c[i] = (int32_t)v;
            }
        }
        /* per channel: raw values or deltas, whichever the gamma code would make shorter */
        for (int64_t ch = 0; ch < kv_dim; ch++) {
            int bd = 0, br = 0;
            for (int t = 0; t < TN_PC_NTOK; t++) {
                const size_t i = (size_t)t * kv_dim + ch;
                br += gamma_bits(c[i]);
                bd += gamma_bits(t ? c[i] - c[i - (size_t)kv_dim] : c[i]);
            }
            chraw[ch] = br < bd;
        }
        /* the plane three ways (deltas, raw, mixed), each from a copy of the models; the
         * smallest is kept with its models */
        size_t best = 0;
        int how_best = -1;
        for (int how = 0; how < 3; how++) {
            memcpy(&trial[how], mod, sizeof *mod);
            uint8_t *dst = alt + (size_t)how * cap;
            const size_t m = rc_plane(e_ch, c, kv_dim, how, chraw, trial[how].m[kv], &trial[how].raw_ch[kv], dst, cap - TN_PC_RC_HDR);
            if (m && (how_best < 0 || m < best)) best = m, how_best = how;
        }
        if (how_best >= 0) {
            memcpy(mod, &trial[how_best], sizeof *mod);
            memcpy(out + TN_PC_RC_HDR, alt + (size_t)how_best * cap, best);
            out[0] = (uint8_t)(TN_PC_MODE_RC | mode | (how_best == 1 ? TN_PC_MODE_RAW : how_best == 2 ? TN_PC_MODE_MIXED : 0));
            tn_put_le32(out + 1, (uint32_t)best);
            r = TN_PC_RC_HDR + best;
        }
    }
out:
    tn_free(c);
    tn_free(alt);
    tn_free(trial);
    return r;
}

size_t tn_pc_plane_encode_lossy(const tn_pc_steps *st, int32_t il, int kv, tn_pc_models *mod, const float *x, const float *w,
                                int64_t kv_dim, bool pre_rope, uint8_t *out) {
    if (!st || !mod || (pre_rope && kv)) return 0;
    return encode_lossy(tn_pc_div(st, kv, il, false), tn_pc_div(st, kv, il, true), st->tilt[kv != 0], w, st->wexp[kv != 0], mod,
                        kv != 0, x, kv_dim, pre_rope ? TN_PC_MODE_PRE_ROPE : 0, out, tn_pc_plane_max(kv_dim));
}

size_t tn_pc_plane_encode(tn_pc_quality q, int32_t il, int kv, tn_pc_models *mod, const tn_fp16 *x, int64_t kv_dim, uint8_t *out) {
    const size_t n = (size_t)TN_PC_NTOK * (size_t)kv_dim;
    if (q != TN_PC_LOSSLESS && mod) {
        float *xf = (float *)tn_malloc(n * sizeof *xf);
        if (!xf) return 0;
        for (size_t i = 0; i < n; i++) xf[i] = tn_fp16_to_fp32(x[i]);
        const tn_pc_steps st = tn_pc_steps_of(q);
        const size_t r = tn_pc_plane_encode_lossy(&st, il, kv, mod, xf, NULL, kv_dim, false, out);
        tn_free(xf);
        if (r) return r;
    }
    uint16_t *zd = (uint16_t *)tn_malloc(2 * n * sizeof *zd), *zr = zd + n; /* deltas, raw */
    if (!zd) return 0;
    for (int64_t ch = 0; ch < kv_dim; ch++) {
        int32_t prev = 0;
        for (int t = 0; t < TN_PC_NTOK; t++) {
            const size_t i = (size_t)t * kv_dim + ch;
            const int32_t v = f16_order(x[i]);
            zr[i] = x[i];
            zd[i] = zigzag16((int16_t)(uint16_t)(v - prev)); /* mod 2^16 */
            prev = v;
        }
    }
    const bool raw = plane_bits(zr, n) < plane_bits(zd, n);
    out[0] = (uint8_t)(raw ? TN_PC_MODE_RAW : 0);
    put_planes(raw ? zr : zd, n, out + 1);
    tn_free(zd);
    return 1 + 2 * n;
}

/* x (f16, unless NULL) and xf (f32, unless NULL) from a lossy plane */
static tern_status decode_lossy(const uint8_t *in, size_t n_in, int64_t kv_dim, tn_rc_int_model (*mods)[TN_PC_NCTX + 1],
                               tn_rc_prob *pflag, int32_t *e_ch, tn_fp16 *x, float *xf, size_t *used) {
    if (n_in < TN_PC_RC_HDR) return tn_err(TERN_ERR_FORMAT, "prompt cache: plane header needs %d bytes, %zu left", TN_PC_RC_HDR, n_in);
    const bool all_raw = in[0] & TN_PC_MODE_RAW, mixed = in[0] & TN_PC_MODE_MIXED;
    if (all_raw && mixed) return tn_err(TERN_ERR_FORMAT, "prompt cache: plane mode %d: raw and mixed", in[0]);
    const uint32_t m = tn_get_le32(in + 1);
    if (m > n_in - TN_PC_RC_HDR) return tn_err(TERN_ERR_FORMAT, "prompt cache: plane needs %u coded bytes, %zu left", m, n_in - TN_PC_RC_HDR);
    tn_rc_int_model *ms = mods[all_raw];
    tn_rc_dec d;
    tn_rc_dec_init(&d, in + TN_PC_RC_HDR, m);
    bool ok = true;
    for (int64_t ch = 0; ch < kv_dim && ok; ch++) {
        e_ch[ch] = (ch ? e_ch[ch - 1] : 0) + tn_rc_dec_int(&d, &ms[TN_PC_NCTX], &ok);
        if (e_ch[ch] < TN_PC_E_MIN || e_ch[ch] > TN_PC_E_MAX) ok = false;
    }
    for (int64_t ch = 0; ch < kv_dim && ok; ch++) {
        const float s = step_of(e_ch[ch]);
        const bool raw = mixed ? tn_rc_dec_bit(&d, pflag) != 0 : all_raw;
        tn_rc_int_model *mod = mods[raw];
        int32_t v = 0, sym = 0;
        for (int t = 0; t < TN_PC_NTOK && ok; t++) {
            sym = tn_rc_dec_int(&d, &mod[rc_ctx(t, sym)], &ok);
            v = raw ? sym : v + sym;
            if (v < -(1 << 24) || v > (1 << 24)) ok = false;
            const size_t i = (size_t)t * kv_dim + ch;
            if (x) x[i] = tn_fp32_to_fp16((float)v * s);
            if (xf) xf[i] = (float)v * s;
        }
    }
    if (!ok || tn_rc_dec_overrun(&d)) return tn_err(TERN_ERR_FORMAT, "prompt cache: plane's coded values are corrupt");
    *used = TN_PC_RC_HDR + m;
    return TERN_OK;
}

tern_status tn_pc_plane_decode_f32(const uint8_t *in, size_t n_in, int64_t kv_dim, int kv, tn_pc_models *mod, tn_fp16 *x,
                                   float *xf, bool *pre_rope, size_t *used) {
    const size_t n = (size_t)TN_PC_NTOK * (size_t)kv_dim;
    if (pre_rope) *pre_rope = false;
    if (n_in < 1 || (in[0] & ~(TN_PC_MODE_RAW | TN_PC_MODE_RC | TN_PC_MODE_PRE_ROPE | TN_PC_MODE_MIXED)))
        return tn_err(TERN_ERR_FORMAT, "prompt cache: plane mode %d unknown", n_in ? in[0] : -1);
    if (in[0] & TN_PC_MODE_RC) {
        const bool pre = in[0] & TN_PC_MODE_PRE_ROPE;
        if (!mod) return tn_err(TERN_ERR_FORMAT, "prompt cache: a lossy plane where a lossless one belongs");
        if (pre && (kv || !xf || !pre_rope))
            return tn_err(TERN_ERR_FORMAT, kv ? "prompt cache: a value plane marked as keys before RoPE"
                                              : "prompt cache: keys before RoPE, decoded without their positions");
        int32_t *e_ch = (int32_t *)tn_malloc((size_t)kv_dim * sizeof *e_ch);
        if (!e_ch) return tn_err(TERN_ERR_NOMEM, "prompt cache: out of memory");
        const tern_status st = decode_lossy(in, n_in, kv_dim, mod->m[kv != 0], &mod->raw_ch[kv != 0], e_ch, pre ? NULL : x, xf, used);
        tn_free(e_ch);
        if (!st && pre_rope) *pre_rope = pre;
        return st;
    }
    if (in[0] & (TN_PC_MODE_PRE_ROPE | TN_PC_MODE_MIXED)) return tn_err(TERN_ERR_FORMAT, "prompt cache: lossless plane with lossy mode bits %d", in[0]);
    const bool raw = in[0] & TN_PC_MODE_RAW;
    const size_t need = 1 + 2 * n;
    if (n_in < need) return tn_err(TERN_ERR_FORMAT, "prompt cache: plane needs %zu bytes, %zu left", need, n_in);
    const uint8_t *lo = in + 1, *hi = lo + n;
    for (int64_t ch = 0; ch < kv_dim; ch++) {
        uint16_t acc = 0;
        for (int t = 0; t < TN_PC_NTOK; t++) {
            const size_t i = (size_t)t * kv_dim + ch;
            const uint16_t z = (uint16_t)(lo[i] | hi[i] << 8);
            if (raw) {
                x[i] = z;
            } else {
                acc = (uint16_t)(acc + unzigzag16(z));
                x[i] = f16_unorder(acc);
            }
            if (xf) xf[i] = tn_fp16_to_fp32(x[i]);
        }
    }
    *used = need;
    return TERN_OK;
}

tern_status tn_pc_plane_decode(const uint8_t *in, size_t n_in, int64_t kv_dim, int kv, tn_pc_models *mod, tn_fp16 *x,
                               size_t *used) {
    return tn_pc_plane_decode_f32(in, n_in, kv_dim, kv, mod, x, NULL, NULL, used);
}

/* ---- the cache -------------------------------------------------------------------------- */

struct tn_pcache {
    char *dir, *sub;
    uint64_t fp, max_bytes, total;
    tn_pc_quality q;
    int32_t n_layer, n_rot;
    int64_t kv_dim;
    uint32_t row;        /* the KV row word (tn_pc_row_word): types and rotation of the rows */
    size_t raw_cap, file_cap;
    uint8_t *raw, *file; /* [raw_cap] planes, [file_cap] one file */
    tn_fp16 *plane;      /* [16][kv_dim] */
    float *xf, *cs;      /* [16][kv_dim] a plane in f32, [head_dim] RoPE's cos/sin pairs */
    tn_pc_steps steps;   /* the lossy quality's */
    float *wt;           /* lossy: [n_layer][2][kv_dim] channel weights (tn_pc_channel_weights) */
    tn_pc_models mod;    /* the range coder's models within one block */
    tn_pc_models mod_keep; /* mod before a lossy plane that may be dropped for the rows */
    unsigned tmp_seq;
    bool warned_io;
    char decision[256];
    tn_pcache_stats st;
    double last_load_s;  /* of the last tn_pcache_load_block (the caller's thread only)          */
    /* the background writer (tn_pcache_start_writer): store_block queues a snapshot of the
     * block's rows; the thread encodes and writes it. mu guards what loads and stores share (the
     * scratch buffers above, st, total, the files), qmu the queue. */
    bool writer, wstop;
    const tern_ctx *wc;        /* the context whose rows the snapshots copy (types, rotation, RoPE) */
    pthread_t wth;
    pthread_mutex_t mu, qmu;
    pthread_cond_t qcv, dcv;   /* a job queued (or stop); the queue drained */
    struct pc_job *qhead, *qtail;
    size_t qbytes, qmax;
    int busy;                  /* a job is being written */
};

/* A block waiting for the writer: its rows as the cache held them, [n_layer][K, V][16 rows]. */
typedef struct pc_job {
    struct pc_job *next;
    int32_t bi;
    uint64_t h, h2;
    tern_token tk[TN_PC_NTOK];
    size_t size; /* of the whole job */
    uint8_t rows[];
} pc_job;

static void pc_lock(tn_pcache *pc) {
    if (pc->writer) pthread_mutex_lock(&pc->mu);
}
static void pc_unlock(tn_pcache *pc) {
    if (pc->writer) pthread_mutex_unlock(&pc->mu);
}


static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *const quality_names[TN_PC_N_QUALITY] = {
    [TN_PC_LOSSLESS] = "lossless", [TN_PC_HIGH] = "high", [TN_PC_MEDIUM] = "medium", [TN_PC_BALANCED] = "balanced"};

const char *tn_pc_quality_name(tn_pc_quality q) { return (unsigned)q < TN_PC_N_QUALITY ? quality_names[q] : "?"; }

int tn_pc_quality_from_name(const char *name) {
    for (int q = 0; name && q < TN_PC_N_QUALITY; q++)
        if (!strcmp(name, quality_names[q])) return q;
    return -1;
}

static char *str_printf(const char *fmt, ...) TN_PRINTF(1, 2);
static char *str_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? tn_malloc((size_t)n + 1) : NULL;
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

typedef struct pc_file {
    char *path;
    time_t mtime;
    uint64_t size;
} pc_file;

static int by_mtime(const void *a, const void *b) {
    const pc_file *x = a, *y = b;
    return x->mtime < y->mtime ? -1 : x->mtime > y->mtime;
}

/* Every block file under dir/<subdir>/ (all models): sizes summed into pc->total; with evict,
 * the oldest are removed until the total is within 90% of max_bytes. Temp files older than an
 * hour (a writer killed mid-write) are removed. */
static void scan_dir(tn_pcache *pc, bool evict) {
    pc_file *v = NULL;
    size_t nv = 0, cap = 0;
    uint64_t total = 0;
    const time_t now = time(NULL);
    DIR *d = opendir(pc->dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *sub = str_printf("%s/%s", pc->dir, e->d_name);
        DIR *ds = sub ? opendir(sub) : NULL;
        struct dirent *f;
        while (ds && (f = readdir(ds))) {
            const bool blk = tn_str_ends_with(f->d_name, ".tpc"), tmp = strstr(f->d_name, ".tpc.tmp.") != NULL;
            if (!blk && !tmp) continue;
            char *p = str_printf("%s/%s", sub, f->d_name);
            struct stat sb;
            if (!p || stat(p, &sb) || !S_ISREG(sb.st_mode)) {
                tn_free(p);
                continue;
            }
            if (tmp) {
                if (now - sb.st_mtime > 3600) (void)unlink(p);
                tn_free(p);
                continue;
            }
            total += (uint64_t)sb.st_size;
            if (evict && nv == cap) {
                pc_file *g = tn_realloc(v, (cap = cap ? 2 * cap : 256) * sizeof *v);
                if (!g) evict = false;
                else v = g;
            }
            if (evict) v[nv++] = (pc_file){p, sb.st_mtime, (uint64_t)sb.st_size};
            else tn_free(p);
        }
        if (ds) closedir(ds);
        tn_free(sub);
    }
    if (d) closedir(d);
    if (evict && pc->max_bytes && total > pc->max_bytes) {
        qsort(v, nv, sizeof *v, by_mtime);
        const uint64_t goal = pc->max_bytes / 10 * 9;
        for (size_t i = 0; i < nv && total > goal; i++)
            if (!unlink(v[i].path)) total -= v[i].size, pc->st.blocks_evicted++;
    }
    for (size_t i = 0; i < nv; i++) tn_free(v[i].path);
    tn_free(v);
    pc->total = total;
}

static tern_status mkdir_p(const char *path) {
    if (!mkdir(path, 0755) || errno == EEXIST) {
        struct stat sb;
        if (!stat(path, &sb) && S_ISDIR(sb.st_mode)) return TERN_OK;
        return tn_err(TERN_ERR_IO, "prompt cache: '%s' is not a directory", path);
    }
    return tn_err(TERN_ERR_IO, "prompt cache: cannot create directory '%s': %s", path, strerror(errno));
}

uint32_t tn_pc_row_word(const tern_ctx *c) {
    if (!c || (c->type_k == TN_F16 && c->type_v == TN_F16)) return TN_PC_ROW_F16;
    return (uint32_t)c->type_k | (uint32_t)c->type_v << 12 | (uint32_t)c->rot_k << 24 | (uint32_t)c->rot_v << 25;
}

/* "f16" for f16 rows, else "<K type>[r]-<V type>[r]" (r: stored rotated), e.g. "q8_0r-q4_0" */
static char *rows_name(const tern_ctx *c) {
    if (tn_pc_row_word(c) == TN_PC_ROW_F16) return str_printf("f16");
    return str_printf("%s%s-%s%s", tn_dtype_get((uint32_t)c->type_k)->name, c->rot_k ? "r" : "", tn_dtype_get((uint32_t)c->type_v)->name,
                      c->rot_v ? "r" : "");
}

tern_status tn_pcache_open(const tern_model *m, const tern_ctx *c, const char *dir, uint64_t max_bytes, tn_pc_quality q,
                           tn_pcache **out) {
    *out = NULL;
#ifndef TERN_HAVE_ZSTD
    (void)m, (void)c, (void)dir, (void)max_bytes, (void)q;
    (void)mkdir_p, (void)scan_dir, (void)rows_name; /* used with zstd */
    return tn_err(TERN_ERR_UNSUPPORTED, "prompt cache: this tern was built without libzstd (install libzstd-dev and rebuild)");
#else
    if (!m || !dir || !*dir || (unsigned)q >= TN_PC_N_QUALITY) return tn_err(TERN_ERR_INVALID_ARG, "prompt cache: invalid arguments");
    tern_status s = mkdir_p(dir);
    if (s) return s;
    tn_pcache *pc = tn_calloc(1, sizeof *pc);
    if (!pc) return TERN_ERR_NOMEM;
    pc->q = q;
    pc->steps = tn_pc_steps_of(q);
    pc->max_bytes = max_bytes;
    pc->n_layer = m->hp.n_layer;
    pc->kv_dim = (int64_t)m->hp.n_head_kv * m->hp.head_dim;
    pc->n_rot = m->hp.n_rot;
    pc->row = tn_pc_row_word(c);
    /* fingerprint: the GGUF's bytes (metadata, shapes, tensor data), the KV rows' types and
     * rotation, the codec, the format version */
    uint64_t fp = tn_pc_model_hash(m);
    fp = mix64(fp ^ ((uint64_t)pc->row << 32 | (uint64_t)q << 16 | TN_PC_VERSION));
    pc->fp = fp;
    pc->st.f16_bytes_per_token = 2 * 2 * (uint64_t)pc->n_layer * (uint64_t)pc->kv_dim;
    pc->raw_cap = 2 * (size_t)pc->n_layer * tn_pc_plane_max(pc->kv_dim);
    pc->file_cap = TN_PC_HDR + ZSTD_compressBound(pc->raw_cap) + 4;
    pc->dir = str_printf("%s", dir);
    char *rn = rows_name(c);
    pc->sub = rn ? str_printf("%s/%016llx-%s-%s-v%d", dir, (unsigned long long)fp, rn, tn_pc_quality_name(q), TN_PC_VERSION) : NULL;
    tn_free(rn);
    pc->raw = tn_malloc(pc->raw_cap);
    pc->file = tn_malloc(pc->file_cap);
    pc->plane = tn_malloc((size_t)TN_PC_NTOK * (size_t)pc->kv_dim * sizeof(tn_fp16));
    pc->xf = tn_malloc((size_t)TN_PC_NTOK * (size_t)pc->kv_dim * sizeof(float));
    pc->cs = tn_malloc((size_t)TN_MAX(m->hp.n_rot, 2) * sizeof(float));
    if (q != TN_PC_LOSSLESS && (pc->wt = tn_malloc((size_t)pc->n_layer * 2 * (size_t)pc->kv_dim * sizeof(float))) &&
        tn_pc_channel_weights(m, pc->wt))
        tn_free(pc->wt), pc->wt = NULL;
    if (!pc->dir || !pc->sub || !pc->raw || !pc->file || !pc->plane || !pc->xf || !pc->cs || (q != TN_PC_LOSSLESS && !pc->wt)) {
        tn_pcache_free(pc);
        return TERN_ERR_NOMEM;
    }
    if ((s = mkdir_p(pc->sub))) {
        tn_pcache_free(pc);
        return s;
    }
    scan_dir(pc, max_bytes > 0);
    *out = pc;
    return TERN_OK;
#endif
}

void tn_pcache_free(tn_pcache *pc) {
    if (!pc) return;
    if (pc->writer) { /* the queued blocks are written first */
        pthread_mutex_lock(&pc->qmu);
        pc->wstop = true;
        pthread_cond_signal(&pc->qcv);
        pthread_mutex_unlock(&pc->qmu);
        pthread_join(pc->wth, NULL);
        pthread_mutex_destroy(&pc->mu), pthread_mutex_destroy(&pc->qmu);
        pthread_cond_destroy(&pc->qcv), pthread_cond_destroy(&pc->dcv);
    }
    tn_free(pc->dir);
    tn_free(pc->sub);
    tn_free(pc->raw);
    tn_free(pc->file);
    tn_free(pc->plane);
    tn_free(pc->xf);
    tn_free(pc->cs);
    tn_free(pc->wt);
    tn_free(pc);
}

const char *tn_pcache_subdir(const tn_pcache *pc) { return pc->sub; }
void tn_pcache_set_steps(tn_pcache *pc, const tn_pc_steps *st) {
    if (pc->q != TN_PC_LOSSLESS) pc->steps = *st;
}
const char *tn_pcache_decision(const tn_pcache *pc) { return pc->decision; }
const tn_pcache_stats *tn_pcache_get_stats(const tn_pcache *pc) { return &pc->st; }

void tn_pcache_stats_copy(tn_pcache *pc, tn_pcache_stats *out) {
    pc_lock(pc); /* then the queue's lock (blocks_dropped): never taken the other way round */
    if (pc->writer) pthread_mutex_lock(&pc->qmu);
    *out = pc->st;
    if (pc->writer) pthread_mutex_unlock(&pc->qmu);
    pc_unlock(pc);
}

tern_status tn_pcache_usable(const tn_pcache *pc, const tern_ctx *c) {
    if (c->cuda) return tn_err(TERN_ERR_UNSUPPORTED, "prompt cache: works on the CPU device only (the KV cache is on the GPU)");
    if (c->kv_ring) return tn_err(TERN_ERR_UNSUPPORTED, "prompt cache: sliding-window layers keep a ring (use --swa-full)");
    if (c->kv_swa_blocks) return tn_err(TERN_ERR_UNSUPPORTED, "prompt cache: a paged context with a window pool is not supported");
    /* the cache's fingerprint is the model's: a context whose KV an adapter changes would share files */
    if (c->lora_sites) return tn_err(TERN_ERR_UNSUPPORTED, "prompt cache: not with LoRA adapters (--lora) yet");
    if (c->hp.family && c->hp.family->mla) /* its rows are latents, no V rows: another layout */
        return tn_err(TERN_ERR_UNSUPPORTED, "prompt cache: not for %s's latent KV cache yet", c->hp.family->name);
    if (c->hp.n_layer != pc->n_layer || (int64_t)c->hp.n_head_kv * c->hp.head_dim != pc->kv_dim || c->hp.n_rot > pc->n_rot)
        return tn_err(TERN_ERR_INVALID_ARG, "prompt cache: the context is of another model");
    if (tn_pc_row_word(c) != pc->row) return tn_err(TERN_ERR_INVALID_ARG, "prompt cache: opened for other KV row types or rotation than the context's");
    return TERN_OK;
}

/* name of block file with chain hash h */
static char *block_path(const tn_pcache *pc, uint64_t h) { return str_printf("%s/%016llx.tpc", pc->sub, (unsigned long long)h); }

/* Reads and checks one file; on success the planes are in pc->raw (*raw_n bytes). A missing file
 * is NOT_FOUND (silent); anything else is FORMAT with the reason in the last error. */
static tern_status read_block(tn_pcache *pc, const char *path, uint32_t bi, uint64_t h, uint64_t h2, const tern_token *toks,
                              size_t *raw_n, uint64_t *file_n) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return TERN_ERR_NOT_FOUND;
    struct stat sb;
    tern_status s = TERN_OK;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) s = tn_err(TERN_ERR_FORMAT, "not a regular file");
    else if ((uint64_t)sb.st_size < TN_PC_HDR + 4 || (uint64_t)sb.st_size > pc->file_cap)
        s = tn_err(TERN_ERR_FORMAT, "size %lld outside %d..%zu", (long long)sb.st_size, TN_PC_HDR + 4, pc->file_cap);
    size_t n = s ? 0 : (size_t)sb.st_size, got = 0;
    while (!s && got < n) {
        ssize_t r = read(fd, pc->file + got, n - got);
        if (r <= 0) s = tn_err(TERN_ERR_FORMAT, "read failed at byte %zu of %zu", got, n);
        else got += (size_t)r;
    }
    close(fd);
    if (s) return s;
    const uint8_t *b = pc->file;
    const uint64_t raw = tn_get_le64(b + 56), comp = tn_get_le64(b + 64);
    if (memcmp(b, TN_PC_MAGIC, 4)) return tn_err(TERN_ERR_FORMAT, "bad magic");
    if (tn_get_le32(b + 4) != TN_PC_VERSION) return tn_err(TERN_ERR_FORMAT, "format version %u (this tern reads %d)", tn_get_le32(b + 4), TN_PC_VERSION);
    if (comp != n - TN_PC_HDR - 4) return tn_err(TERN_ERR_FORMAT, "payload of %llu bytes in a file of %zu (truncated?)", (unsigned long long)comp, n);
    if (tn_get_le32(b + n - 4) != tn_pc_crc32(b, n - 4)) return tn_err(TERN_ERR_FORMAT, "CRC-32 mismatch");
    if (tn_get_le64(b + 8) != pc->fp) return tn_err(TERN_ERR_FORMAT, "fingerprint %016llx is another model's", (unsigned long long)tn_get_le64(b + 8));
    if (tn_get_le32(b + 16) != pc->row || tn_get_le32(b + 20) != (uint32_t)pc->q || tn_get_le32(b + 24) != (uint32_t)pc->n_layer ||
        tn_get_le32(b + 28) != (uint32_t)pc->kv_dim || tn_get_le32(b + 32) != TN_PC_NTOK)
        return tn_err(TERN_ERR_FORMAT, "row type, quality or dimensions differ");
    if (tn_get_le32(b + 36) != bi || tn_get_le64(b + 40) != h || tn_get_le64(b + 48) != h2) return tn_err(TERN_ERR_FORMAT, "block index or prefix hashes differ");
    for (int t = 0; t < TN_PC_NTOK; t++)
        if ((tern_token)tn_get_le32(b + 72 + 4 * t) != toks[t]) return tn_err(TERN_ERR_FORMAT, "token %d differs", t);
    if (raw > pc->raw_cap) return tn_err(TERN_ERR_FORMAT, "raw size %llu > %zu", (unsigned long long)raw, pc->raw_cap);
#ifdef TERN_HAVE_ZSTD
    size_t r = ZSTD_decompress(pc->raw, pc->raw_cap, b + TN_PC_HDR, (size_t)comp);
    if (ZSTD_isError(r)) return tn_err(TERN_ERR_FORMAT, "zstd: %s", ZSTD_getErrorName(r));
    if (r != raw) return tn_err(TERN_ERR_FORMAT, "payload decompressed to %zu bytes, header says %llu", r, (unsigned long long)raw);
#endif
    *raw_n = (size_t)raw;
    *file_n = n;
    return TERN_OK;
}

/* Decodes pc->raw, block bi of a prompt (positions bi * 16 ..), into cache block dst of every
 * layer of c; keys coded before RoPE get the layer's RoPE back at those positions. */
static tern_status unpack_block(tn_pcache *pc, tern_ctx *c, int32_t bi, int32_t dst, size_t raw_n) {
    size_t off = 0;
    const size_t pb = (size_t)TN_PC_NTOK * (size_t)pc->kv_dim;
    tn_pc_models_init(&pc->mod);
    for (int32_t il = 0; il < pc->n_layer; il++)
        for (int kv = 0; kv < 2; kv++) {
            size_t used;
            bool pre = false;
            const bool f16 = (kv ? c->type_v : c->type_k) == TN_F16;
            const size_t rb = kv ? c->v_rb : c->k_rb; /* the cache's: tn_pcache_usable matched its row word */
            uint8_t *d = (kv ? c->v_cache : c->k_cache) + ((size_t)c->kv_off[il] + (size_t)dst * TN_PC_NTOK) * rb;
            if (off < raw_n && pc->raw[off] == TN_PC_MODE_ROWS) { /* a quantized half's rows as they were in memory */
                if (f16) return tn_err(TERN_ERR_FORMAT, "quantized rows in an f16 cache's plane");
                if (raw_n - off < 1 + TN_PC_NTOK * rb) return tn_err(TERN_ERR_FORMAT, "rows plane needs %zu bytes, %zu left", 1 + TN_PC_NTOK * rb, raw_n - off);
                memcpy(d, pc->raw + off + 1, TN_PC_NTOK * rb);
                off += 1 + TN_PC_NTOK * rb;
                continue;
            }
            tern_status s = tn_pc_plane_decode_f32(pc->raw + off, raw_n - off, pc->kv_dim, kv, &pc->mod, pc->plane, pc->xf, &pre, &used);
            if (s) return s;
            off += used;
            if (pre) {
                if (!tn_pc_layer_roped(&c->hp, il)) return tn_err(TERN_ERR_FORMAT, "keys before RoPE on layer %d, which has none", il);
                tn_pc_rope_plane(&c->hp, c->rope_ff, il, (int64_t)bi * TN_PC_NTOK, pc->xf, pc->cs, 1);
                for (size_t i = 0; i < pb; i++) pc->plane[i] = tn_fp32_to_fp16(pc->xf[i]);
            }
            if (f16) memcpy(d, pc->plane, pb * sizeof(tn_fp16));
            else /* decoded values quantized (and rotated) as the forward pass stores a row */
                tn_kv_block_from_f32(c, kv, pc->xf, d);
        }
    if (off != raw_n) return tn_err(TERN_ERR_FORMAT, "%zu bytes after the last plane", raw_n - off);
    return TERN_OK;
}

/* Reads block bi of a chain (h, h2: the hashes up to and including it; toks its tokens) into
 * cache block dst of c. NOT_FOUND when absent (silent); a bad file is counted, warned about
 * and FORMAT. *file_n: its size. */
static tern_status load_one(tn_pcache *pc, tern_ctx *c, int32_t bi, uint64_t h, uint64_t h2, const tern_token *tk, int32_t dst,
                            uint64_t *file_n) {
    char *path = block_path(pc, h);
    if (!path) return TERN_ERR_NOMEM;
    size_t raw_n = 0;
    tern_status s = read_block(pc, path, (uint32_t)bi, h, h2, tk, &raw_n, file_n);
    if (!s) s = unpack_block(pc, c, bi, dst, raw_n);
    if (s && s != TERN_ERR_NOT_FOUND) {
        tn_log(TERN_LOG_WARN, "prompt cache: skipping %s: %s (recomputing from position %d)", path, tern_last_error(),
               bi * TN_PC_NTOK);
        pc->st.blocks_skipped++;
    }
    if (!s) {
        (void)utimensat(AT_FDCWD, path, NULL, 0); /* LRU: used now */
        pc->st.blocks_loaded++;
        pc->st.bytes_loaded += *file_n;
    }
    tn_free(path);
    return s;
}

tern_status tn_pcache_load_block(tn_pcache *pc, tern_ctx *c, int32_t bi, tn_pc_chain chain, const tern_token *toks, int32_t dst) {
    uint64_t file_n = 0;
    pc_lock(pc);
    const double t0 = now_s();
    tern_status s = load_one(pc, c, bi, chain.h, chain.h2, toks, dst, &file_n);
    pc->last_load_s = now_s() - t0;
    pc->st.load_s += pc->last_load_s;
    pc_unlock(pc);
    return s;
}

double tn_pcache_last_load_s(const tn_pcache *pc) { return pc->last_load_s; }

void tn_pc_chain_next(tn_pc_chain *ch, const tern_token *toks) {
    ch->h = tn_tok_hash(0, ch->h, toks);
    ch->h2 = tn_tok_hash(1, ch->h2, toks);
}

tern_status tn_pcache_load(tn_pcache *pc, tern_ctx *c, const tern_token *hist, int32_t n, double prefill_tok_s,
                           int32_t *n_loaded) {
    *n_loaded = 0;
    pc->decision[0] = 0;
    tern_status s = tn_pcache_usable(pc, c);
    if (s) return s;
    if (c->n_past % TN_PC_NTOK || n <= c->n_past) return TERN_OK;
    const int32_t b0 = c->n_past / TN_PC_NTOK, b_end = TN_MIN(n - 1, c->n_ctx) / TN_PC_NTOK; /* leave one token */
    tn_pc_chain ch = {0, 0};
    for (int32_t b = 0; b < b0; b++) tn_pc_chain_next(&ch, hist + b * TN_PC_NTOK);
    const double t0 = now_s();
    for (int32_t b = b0; b < b_end; b++) {
        const tern_token *tk = hist + (size_t)b * TN_PC_NTOK;
        tn_pc_chain_next(&ch, tk);
        const double tb = now_s();
        uint64_t file_n = 0;
        if (load_one(pc, c, b, ch.h, ch.h2, tk, b, &file_n)) break;
        c->n_past = (b + 1) * TN_PC_NTOK;
        c->n_logits = 0;
        *n_loaded += TN_PC_NTOK;
        if (b == b0) { /* cost model: this block's load time per token against prefill's */
            const double load_tok = (now_s() - tb) / TN_PC_NTOK, comp_tok = prefill_tok_s > 0 ? 1.0 / prefill_tok_s : 0;
            const bool go = !(comp_tok > 0 && load_tok > comp_tok);
            snprintf(pc->decision, sizeof pc->decision,
                     "prompt cache: load %.3f ms/token (%llu bytes/block) vs prefill %s%.3f ms/token: %s", load_tok * 1e3,
                     (unsigned long long)file_n, comp_tok > 0 ? "" : "unknown, assumed ", comp_tok * 1e3,
                     go ? "loading cached blocks" : "recomputing (cheaper)");
            if (!go) break;
        }
    }
    pc->st.load_s += now_s() - t0;
    return TERN_OK;
}

#ifdef TERN_HAVE_ZSTD
/* Writes one file atomically; returns 0 or an errno. TERN_PCACHE_TEST_PAUSE_MS (tests): sleep
 * with half of the temp file written (a kill -9 leaves it). */
static int write_atomic(tn_pcache *pc, const char *path, const uint8_t *data, size_t n) {
    char *tmp = str_printf("%s.tmp.%ld.%u", path, (long)getpid(), pc->tmp_seq++);
    if (!tmp) return ENOMEM;
    int err = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) err = errno;
    const char *pause = getenv("TERN_PCACHE_TEST_PAUSE_MS");
    for (size_t w = 0; !err && w < n;) {
        size_t part = n - w;
        if (pause && w == 0) part = n / 2;
        ssize_t r = write(fd, data + w, part);
        if (r < 0) err = errno;
        else if (r == 0) err = EIO;
        else w += (size_t)r;
        if (pause && w == n / 2 && !err) usleep((useconds_t)atoi(pause) * 1000u), pause = NULL;
    }
    if (!err && fsync(fd)) err = errno;
    if (fd >= 0 && close(fd) && !err) err = errno;
    if (!err && rename(tmp, path)) err = errno;
    if (err) (void)unlink(tmp);
    else {
        int dfd = open(pc->sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) (void)fsync(dfd), close(dfd);
    }
    tn_free(tmp);
    return err;
}

/* Writes block bi (chain hashes h, h2, tokens tk) from cache block src of c, or from snap (a
 * pc_job's rows) when not NULL, unless its file exists. true when a file was written. */
static bool store_one(tn_pcache *pc, const tern_ctx *c, int32_t bi, uint64_t h, uint64_t h2, const tern_token *tk, int32_t src,
                      const uint8_t *snap) {
    if (pc->st.store_off) return false;
    char *path = block_path(pc, h);
    if (!path) return false;
    if (!access(path, F_OK)) { /* on disk already (a bad one ages out through the LRU bound) */
        tn_free(path);
        return false;
    }
    size_t raw = 0;
    const size_t pb = (size_t)TN_PC_NTOK * (size_t)pc->kv_dim;
    tn_pc_models_init(&pc->mod);
    for (int32_t il = 0; il < pc->n_layer; il++)
        for (int kv = 0; kv < 2; kv++) {
            const bool f16 = (kv ? c->type_v : c->type_k) == TN_F16;
            const size_t rb = kv ? c->v_rb : c->k_rb; /* the cache's: tn_pcache_usable matched its row word */
            const uint8_t *rows = snap ? snap + ((size_t)il * (c->k_rb + c->v_rb) + (kv ? c->k_rb : 0)) * TN_PC_NTOK
                                       : (kv ? c->v_cache : c->k_cache) + ((size_t)c->kv_off[il] + (size_t)src * TN_PC_NTOK) * rb;
            const tn_fp16 *x = (const tn_fp16 *)rows;
            size_t k = 0;
            if (pc->q != TN_PC_LOSSLESS) { /* keys of a roped layer un-rotated, at the block's positions */
                const bool pre = !kv && pc->steps.keys_pre_rope && tn_pc_layer_roped(&c->hp, il);
                if (f16)
                    for (size_t i = 0; i < pb; i++) pc->xf[i] = tn_fp16_to_fp32(x[i]);
                else /* a quantized half: its values, un-rotated (--kv-rotate) */
                    tn_kv_block_to_f32(c, kv, rows, pc->xf);
                if (pre) tn_pc_rope_plane(&c->hp, c->rope_ff, il, (int64_t)bi * TN_PC_NTOK, pc->xf, pc->cs, -1);
                const float *w = pc->wt ? pc->wt + ((size_t)il * 2 + (size_t)kv) * (size_t)pc->kv_dim : NULL;
                if (!f16) pc->mod_keep = pc->mod;
                k = tn_pc_plane_encode_lossy(&pc->steps, il, kv, &pc->mod, pc->xf, w, pc->kv_dim, pre, pc->raw + raw);
                if (!f16 && k > 1 + TN_PC_NTOK * rb) k = 0, pc->mod = pc->mod_keep; /* the rows are smaller: kept instead */
                pc->st.planes_pre_rope += pre && k;
            }
            if (!k && !f16) { /* kept as cached: a quantized half's rows */
                pc->raw[raw] = TN_PC_MODE_ROWS;
                memcpy(pc->raw + raw + 1, rows, TN_PC_NTOK * rb);
                k = 1 + TN_PC_NTOK * rb;
            }
            if (!k) k = tn_pc_plane_encode(TN_PC_LOSSLESS, il, kv, NULL, x, pc->kv_dim, pc->raw + raw); /* kept as cached */
            if (!k) { /* out of memory: this block is not stored */
                tn_free(path);
                return false;
            }
            raw += k;
        }
    uint8_t *f = pc->file;
    size_t comp = ZSTD_compress(f + TN_PC_HDR, pc->file_cap - TN_PC_HDR - 4, pc->raw, raw, TN_PC_ZLEVEL);
    if (ZSTD_isError(comp)) {
        tn_log(TERN_LOG_WARN, "prompt cache: zstd: %s (block not stored)", ZSTD_getErrorName(comp));
        tn_free(path);
        return false;
    }
    memcpy(f, TN_PC_MAGIC, 4);
    tn_put_le32(f + 4, TN_PC_VERSION);
    tn_put_le64(f + 8, pc->fp);
    tn_put_le32(f + 16, pc->row);
    tn_put_le32(f + 20, (uint32_t)pc->q);
    tn_put_le32(f + 24, (uint32_t)pc->n_layer);
    tn_put_le32(f + 28, (uint32_t)pc->kv_dim);
    tn_put_le32(f + 32, TN_PC_NTOK);
    tn_put_le32(f + 36, (uint32_t)bi);
    tn_put_le64(f + 40, h);
    tn_put_le64(f + 48, h2);
    tn_put_le64(f + 56, raw);
    tn_put_le64(f + 64, comp);
    for (int t = 0; t < TN_PC_NTOK; t++) tn_put_le32(f + 72 + 4 * t, (uint32_t)tk[t]);
    const size_t fn = TN_PC_HDR + comp;
    tn_put_le32(f + fn, tn_pc_crc32(f, fn));
    const int err = write_atomic(pc, path, f, fn + 4);
    bool ok = false;
    if (err == ENOSPC || err == EDQUOT) {
        tn_log(TERN_LOG_WARN, "prompt cache: %s: %s; no more blocks are stored in this run", pc->sub, strerror(err));
        pc->st.store_off = true;
    } else if (err) {
        if (!pc->warned_io) tn_log(TERN_LOG_WARN, "prompt cache: writing %s: %s (block not stored)", path, strerror(err));
        pc->warned_io = true;
    } else {
        pc->st.blocks_stored++;
        pc->st.bytes_stored += fn + 4;
        pc->total += fn + 4;
        ok = true;
    }
    tn_free(path);
    return ok;
}
#endif

#ifdef TERN_HAVE_ZSTD
static void *writer_main(void *arg) {
    tn_pcache *pc = arg;
    pthread_mutex_lock(&pc->qmu);
    for (;;) {
        while (!pc->qhead && !pc->wstop) pthread_cond_wait(&pc->qcv, &pc->qmu);
        pc_job *j = pc->qhead;
        if (!j) break; /* stopping, nothing left */
        pc->qhead = j->next;
        if (!pc->qhead) pc->qtail = NULL;
        pc->busy = 1;
        pthread_mutex_unlock(&pc->qmu);
        pthread_mutex_lock(&pc->mu);
        const double t0 = now_s();
        if (store_one(pc, pc->wc, j->bi, j->h, j->h2, j->tk, 0, j->rows) && pc->max_bytes && pc->total > pc->max_bytes)
            scan_dir(pc, true);
        pc->st.store_s += now_s() - t0;
        pthread_mutex_unlock(&pc->mu);
        pthread_mutex_lock(&pc->qmu);
        pc->qbytes -= j->size;
        pc->busy = 0;
        tn_free(j);
        pthread_cond_broadcast(&pc->dcv);
    }
    pthread_mutex_unlock(&pc->qmu);
    return NULL;
}

/* The writer's side of store_block: a snapshot of cache block src queued (dropped, counted, when
 * the queue would pass qmax bytes or memory is short). */
static void queue_block(tn_pcache *pc, const tern_ctx *c, int32_t bi, tn_pc_chain chain, const tern_token *toks, int32_t src) {
    char *path = block_path(pc, chain.h);
    const bool there = path && !access(path, F_OK); /* the writer checks again: this only saves a copy */
    tn_free(path);
    if (there) return;
    const size_t plane = (size_t)TN_PC_NTOK * (c->k_rb + c->v_rb), size = sizeof(pc_job) + (size_t)pc->n_layer * plane;
    pc_job *j = tn_malloc(size);
    pthread_mutex_lock(&pc->qmu);
    if (!j || pc->qbytes + size > pc->qmax) {
        pc->st.blocks_dropped++;
        pthread_mutex_unlock(&pc->qmu);
        tn_free(j);
        return;
    }
    pc->qbytes += size; /* counted before the copy: the bound holds */
    pthread_mutex_unlock(&pc->qmu);
    j->next = NULL, j->bi = bi, j->h = chain.h, j->h2 = chain.h2, j->size = size;
    memcpy(j->tk, toks, sizeof j->tk);
    for (int32_t il = 0; il < pc->n_layer; il++) {
        const size_t off = ((size_t)c->kv_off[il] + (size_t)src * TN_PC_NTOK);
        uint8_t *d = j->rows + (size_t)il * plane;
        memcpy(d, c->k_cache + off * c->k_rb, (size_t)TN_PC_NTOK * c->k_rb);
        memcpy(d + (size_t)TN_PC_NTOK * c->k_rb, c->v_cache + off * c->v_rb, (size_t)TN_PC_NTOK * c->v_rb);
    }
    pthread_mutex_lock(&pc->qmu);
    if (pc->qtail) pc->qtail->next = j;
    else pc->qhead = j;
    pc->qtail = j;
    pthread_cond_signal(&pc->qcv);
    pthread_mutex_unlock(&pc->qmu);
}
#endif

tern_status tn_pcache_start_writer(tn_pcache *pc, const tern_ctx *c, size_t max_queue_bytes) {
#ifdef TERN_HAVE_ZSTD
    if (pc->writer) return TERN_OK;
    const int made = !pthread_mutex_init(&pc->mu, NULL) + !pthread_mutex_init(&pc->qmu, NULL) +
                     !pthread_cond_init(&pc->qcv, NULL) + !pthread_cond_init(&pc->dcv, NULL);
    pc->wc = c, pc->qmax = max_queue_bytes, pc->wstop = false;
    if (made == 4 && !pthread_create(&pc->wth, NULL, writer_main, pc)) {
        pc->writer = true;
        return TERN_OK;
    }
    /* glibc's init calls do not fail; destroying one that did is harmless there */
    pthread_mutex_destroy(&pc->mu), pthread_mutex_destroy(&pc->qmu);
    pthread_cond_destroy(&pc->qcv), pthread_cond_destroy(&pc->dcv);
    return tn_err(TERN_ERR_NOMEM, "prompt cache: cannot start the writer thread");
#else
    (void)pc, (void)c, (void)max_queue_bytes;
    return tn_err(TERN_ERR_UNSUPPORTED, "prompt cache: built without libzstd");
#endif
}

void tn_pcache_flush(tn_pcache *pc) {
    if (!pc->writer) return;
    pthread_mutex_lock(&pc->qmu);
    while (pc->qhead || pc->busy) pthread_cond_wait(&pc->dcv, &pc->qmu);
    pthread_mutex_unlock(&pc->qmu);
}

tern_status tn_pcache_store_block(tn_pcache *pc, const tern_ctx *c, int32_t bi, tn_pc_chain chain, const tern_token *toks,
                                  int32_t src) {
#ifdef TERN_HAVE_ZSTD
    if (pc->writer) {
        queue_block(pc, c, bi, chain, toks, src);
        return TERN_OK;
    }
    const double t0 = now_s();
    if (store_one(pc, c, bi, chain.h, chain.h2, toks, src, NULL) && pc->max_bytes && pc->total > pc->max_bytes) scan_dir(pc, true);
    pc->st.store_s += now_s() - t0;
#else
    (void)pc, (void)c, (void)bi, (void)chain, (void)toks, (void)src;
#endif
    return TERN_OK;
}

tern_status tn_pcache_store(tn_pcache *pc, const tern_ctx *c, const tern_token *hist, int32_t n) {
    tern_status s = tn_pcache_usable(pc, c);
    if (s) return s;
#ifdef TERN_HAVE_ZSTD
    const int32_t nb = TN_MIN(n, c->n_past) / TN_PC_NTOK;
    const double t0 = now_s();
    tn_pc_chain ch = {0, 0};
    bool wrote = false;
    for (int32_t b = 0; b < nb && !pc->st.store_off; b++) {
        const tern_token *tk = hist + (size_t)b * TN_PC_NTOK;
        tn_pc_chain_next(&ch, tk);
        wrote |= store_one(pc, c, b, ch.h, ch.h2, tk, b, NULL);
    }
    if (wrote && pc->max_bytes && pc->total > pc->max_bytes) scan_dir(pc, true);
    pc->st.store_s += now_s() - t0;
#else
    (void)hist, (void)n;
#endif
    return TERN_OK;
}

double tn_pcache_prefill_speed(const tn_pcache *pc) {
    char *p = str_printf("%s/prefill-speed", pc->sub);
    FILE *f = p ? fopen(p, "r") : NULL;
    double v = 0;
    if (f && fscanf(f, "%lf", &v) != 1) v = 0;
    if (f) fclose(f);
    tn_free(p);
    return isfinite(v) && v > 0 ? v : 0;
}

void tn_pcache_note_prefill(tn_pcache *pc, int32_t n_tokens, double seconds) {
    if (n_tokens < TN_PC_NTOK || !(seconds > 0) || pc->st.store_off) return;
    char *p = str_printf("%s/prefill-speed", pc->sub);
    tn_wfile w;
    if (p && !tn_wfile_open(p, &w)) {
        char line[64];
        int k = snprintf(line, sizeof line, "%.3f\n", n_tokens / seconds);
        tn_wfile_write(&w, line, (size_t)k);
        (void)tn_wfile_commit(&w);
    }
    tn_free(p);
}
