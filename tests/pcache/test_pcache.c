/*
 * test_pcache.c — the prompt cache (src/model/pcache.c).
 *  - range coder (core/rc.h): bits and integers round-trip; a stream of biased bits codes within
 *    5% of its entropy (computed here from the probability); a truncated stream is noticed.
 *  - codec: lossless planes round-trip bit for bit (specials, subnormals, -0, NaN included); lossy
 *    planes with steps set here (K and V apart, finer first layers) stay within the bound the docs
 *    state, computed here from the input alone: per channel min(rms(plane) / div,
 *    rms(channel) / div_ch), halved (f32 values), plus f16 rounding (f16 values); planes of one
 *    block decode in sequence with the models the encoder carried; keys marked as coded before
 *    RoPE come back in f32 only; a plane with a non-finite value comes back exactly; truncated,
 *    unknown or corrupted planes are refused or decode to some values, never out of bounds. The
 *    built-in qualities' steps are docs/prompt-cache.md's (written out here).
 *  - RoPE on a key plane (tn_pc_rope_plane) against a double-precision rotation written here:
 *    adjacent pairs and halves, partial rotation, frequency scale and mscale, NoPE layers; undo
 *    then redo gives the plane back within float rounding.
 *  - cache on a tiny random model: blocks stored after a prefill load into a fresh context with
 *    the same K/V bits (lossless), and the logits after the loaded prefix equal those of a context
 *    that computed the same prefix itself; a second store writes nothing new; damaged files
 *    (truncated, a flipped bit, another model's, an old format version, and with a valid CRC: a
 *    wrong token id, garbage payload, a wrong raw size) are skipped with the blocks before them
 *    still loaded. A lossy store codes every key plane before RoPE, and the loaded K (rotated
 *    back) and V are within the bound computed here from the cached values (K un-rotated in
 *    double); the built-in qualities store none before RoPE.
 */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/tiny_model.h"
#include "core/fp16.h"
#include "core/rc.h"
#include "model/ctx.h"
#include "model/pcache.h"

#define KVD 48
/* docs/prompt-cache.md's steps: K, V plane; K, V channel; first layers' factor, how many; K, V tilts; K, V weight exponents */
#define DOC_HIGH 12, 12, 8, 8, 1, 0, 0, 0, 2, 0
#define DOC_MEDIUM 1, 0.7f, 0, 0, 1, 0, 0, 0, 0, 0
#define DOC_BALANCED 3, 2, 1, 1, 1, 0, 0, 0, 2, 0

static uint64_t rng = 88172645463325252ull;
static double urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void fill(tn_fp16 *x, int64_t kv_dim) {
    for (int64_t ch = 0; ch < kv_dim; ch++) {
        const double scale = pow(10.0, 4 * urand() - 3); /* channels from 1e-3 to 10 */
        const double base = (urand() - 0.5) * scale;
        for (int t = 0; t < 16; t++) x[t * kv_dim + ch] = tn_fp32_to_fp16((float)(base + 0.2 * scale * (urand() - 0.5)));
    }
}

static void test_rc(void **st) {
    (void)st;
    enum { NB = 200000 };
    static uint8_t buf[NB], bits[NB];
    const double p1 = 0.05; /* P(bit = 1) */
    for (int i = 0; i < NB; i++) bits[i] = urand() < p1;
    tn_rc_enc e;
    tn_rc_enc_init(&e, buf, sizeof buf);
    tn_rc_prob pe = TN_RC_PROB_INIT, pd = TN_RC_PROB_INIT;
    for (int i = 0; i < NB; i++) tn_rc_enc_bit(&e, &pe, bits[i]);
    const size_t n = tn_rc_enc_finish(&e);
    int ones = 0;
    for (int i = 0; i < NB; i++) ones += bits[i];
    const double f = (double)ones / NB, h = -(f * log2(f) + (1 - f) * log2(1 - f)) * NB / 8; /* entropy, bytes */
    print_message("%d bits at p = %.3f: %zu bytes, entropy %.0f bytes\n", NB, f, n, h);
    /* within 5%: a probability that adapts by 1/32 per bit tracks p with noise, which costs ~3% */
    assert_true(n > 0 && n < 1.05 * h + 16 && n > h - 16);
    tn_rc_dec d;
    tn_rc_dec_init(&d, buf, n);
    for (int i = 0; i < NB; i++) assert_int_equal(tn_rc_dec_bit(&d, &pd), bits[i]);
    assert_false(tn_rc_dec_overrun(&d));
    /* integers of every size, signs, zero */
    static int32_t v[4096];
    for (int i = 0; i < 4096; i++) {
        const int k = (int)(urand() * 23);
        v[i] = (int32_t)(urand() * (double)(1 << k)) * (urand() < 0.5 ? -1 : 1);
    }
    tn_rc_int_model me, md;
    tn_rc_int_model_init(&me);
    tn_rc_int_model_init(&md);
    tn_rc_enc_init(&e, buf, sizeof buf);
    for (int i = 0; i < 4096; i++) tn_rc_enc_int(&e, &me, v[i]);
    const size_t ni = tn_rc_enc_finish(&e);
    assert_true(ni > 0);
    tn_rc_dec_init(&d, buf, ni);
    bool ok = true;
    for (int i = 0; i < 4096; i++) assert_int_equal(tn_rc_dec_int(&d, &md, &ok), v[i]);
    assert_true(ok);
    assert_false(tn_rc_dec_overrun(&d));
    /* truncated: the decoder reads past the end and says so */
    tn_rc_int_model_init(&md);
    tn_rc_dec_init(&d, buf, ni / 2);
    for (int i = 0; i < 4096 && ok; i++) tn_rc_dec_int(&d, &md, &ok);
    assert_true(tn_rc_dec_overrun(&d) || !ok);
    /* the encoder stops at its buffer's end */
    tn_rc_enc_init(&e, buf, 64);
    tn_rc_int_model_init(&me);
    for (int i = 0; i < 4096; i++) tn_rc_enc_int(&e, &me, v[i]);
    assert_int_equal(tn_rc_enc_finish(&e), 0);
}

static void test_lossless_roundtrip(void **st) {
    (void)st;
    tn_fp16 x[16 * KVD], y[16 * KVD];
    uint8_t buf[4096];
    tn_pc_models me, md;
    assert_true(tn_pc_plane_max(KVD) <= sizeof buf);
    for (int rep = 0; rep < 20; rep++) {
        fill(x, KVD);
        if (rep == 0) /* every kind of value: 0, -0, subnormals, max, inf, NaN */
            for (int i = 0; i < 16 * KVD; i++) x[i] = (tn_fp16)(i * 1361u);
        x[3] = 0x8000, x[4] = 0x7C00, x[5] = 0xFC00, x[6] = 0x7E01, x[7] = 0x0001, x[8] = 0x7BFF;
        tn_pc_models_init(&me);
        tn_pc_models_init(&md);
        const size_t n = tn_pc_plane_encode(TN_PC_LOSSLESS, 0, 0, &me, x, KVD, buf);
        assert_true(n > 0 && n <= tn_pc_plane_max(KVD));
        size_t used = 0;
        memset(y, 0xAB, sizeof y);
        assert_int_equal(tn_pc_plane_decode(buf, n, KVD, 0, &md, y, &used), TERN_OK);
        assert_int_equal(used, n);
        assert_memory_equal(x, y, sizeof x);
        assert_int_not_equal(tn_pc_plane_decode(buf, n - 1, KVD, 0, &md, y, &used), TERN_OK); /* truncated */
        buf[0] = 7;
        assert_int_not_equal(tn_pc_plane_decode(buf, n, KVD, 0, &md, y, &used), TERN_OK); /* unknown mode */
    }
}

/* The step the docs give a channel (before the grid, which rounds it down):
 * min(rms(plane) / div * (rms(channel) / rms(plane))^-tilt, rms(channel) / div_ch), in double from
 * the input alone. */
static double want_step(const float *x, int64_t kvd, int ch, double div, double div_ch, double tilt, double wlean) {
    double sp = 0, sc = 0;
    for (int64_t i = 0; i < 16 * kvd; i++) sp += (double)x[i] * x[i];
    for (int t = 0; t < 16; t++) sc += (double)x[t * kvd + ch] * x[t * kvd + ch];
    const double rp = sqrt(sp / (double)(16 * kvd)), rc = sqrt(sc / 16);
    return fmin(div > 0 ? rp / div * (rc > 0 ? pow(rc / rp, -tilt) : 1) * wlean : INFINITY, div_ch > 0 ? rc / div_ch : INFINITY);
}

/* The built-in qualities are the steps docs/prompt-cache.md's table gives (written out here). */
static void test_steps_table(void **st) {
    (void)st;
    const tn_pc_steps h = tn_pc_steps_of(TN_PC_HIGH), m = tn_pc_steps_of(TN_PC_MEDIUM), l = tn_pc_steps_of(TN_PC_LOSSLESS);
    const tn_pc_steps b = tn_pc_steps_of(TN_PC_BALANCED);
    const float want[3][10] = {{DOC_HIGH}, {DOC_MEDIUM}, {DOC_BALANCED}};
    const tn_pc_steps *q[3] = {&h, &m, &b};
    for (int i = 0; i < 3; i++) {
        assert_true(q[i]->div[0] == want[i][0] && q[i]->div[1] == want[i][1]);
        assert_true(q[i]->div_ch[0] == want[i][2] && q[i]->div_ch[1] == want[i][3]);
        assert_true(q[i]->mul_first == want[i][4] && q[i]->n_first == (int32_t)want[i][5]);
        assert_true(q[i]->tilt[0] == want[i][6] && q[i]->tilt[1] == want[i][7]);
        assert_true(q[i]->wexp[0] == want[i][8] && q[i]->wexp[1] == want[i][9]);
        assert_false(q[i]->keys_pre_rope); /* keys after RoPE: docs/prompt-cache.md */
        /* tn_pc_div: finer on the first layers only */
        for (int kv = 0; kv < 2; kv++) {
            assert_true(tn_pc_div(q[i], kv, q[i]->n_first, false) == q[i]->div[kv]);
            if (q[i]->n_first > 0) assert_true(tn_pc_div(q[i], kv, 0, true) == q[i]->div_ch[kv] * q[i]->mul_first);
        }
    }
    assert_true(l.div[0] == 0 && l.div[1] == 0);
}

/* Lossy planes with steps chosen here (K and V apart, a finer first layer): per channel the error
 * of the f32 values is within half the channel's step (the step the docs give, which the grid only
 * lowers), and the f16 values add at most their rounding. */
static void test_lossy_bound(void **st) {
    (void)st;
    enum { NP = 6 }; /* planes of one block: K and V of 3 layers, coded in sequence */
    static tn_fp16 x16[16 * KVD], y[16 * KVD];
    static float x[NP][16 * KVD], yf[16 * KVD];
    static uint8_t buf[NP * 4096];
    const tn_pc_steps sts[4] = {{{12, 9}, {8, 6}, 1, 0, false, {0, 0}, {0, 0}},
                                {{1, 1.5f}, {2, 0}, 1.5f, 1, false, {0.5f, -0.25f}, {0, 0}},
                                {{0, 3}, {4, 2}, 2, 2, false, {0, 0.3f}, {0, 0}},
                                {{6, 4}, {0, 3}, 1, 0, false, {0, 0}, {1, 0.5f}}}; /* channel weights */
    static float wts[KVD]; /* weights between 1/4 and 4 */
    for (int ch = 0; ch < KVD; ch++) wts[ch] = (float)pow(2, 4 * urand() - 2);
    for (int si = 0; si < 4; si++)
        for (int rep = 0; rep < 10; rep++) {
            const tn_pc_steps *sp = &sts[si];
            tn_pc_models me, md;
            tn_pc_models_init(&me);
            tn_pc_models_init(&md);
            size_t off = 0, ends[NP];
            for (int p = 0; p < NP; p++) {
                fill(x16, KVD);
                for (int i = 0; i < 16 * KVD; i++) x[p][i] = tn_fp16_to_fp32(x16[i]) * (float)(1 + 0.01 * urand());
                const bool pre = p % 2 == 0 && (rep & 1); /* marked as keys before RoPE: decoded in f32 only */
                off += tn_pc_plane_encode_lossy(sp, p / 2, p % 2, &me, x[p], si == 3 ? wts : NULL, KVD, pre, buf + off);
                ends[p] = off;
                assert_true(ends[p] > (p ? ends[p - 1] : 0));
            }
            double worst = 0, worst16 = 0; /* largest error / bound */
            int differ = 0;
            off = 0;
            for (int p = 0; p < NP; p++) {
                size_t used = 0;
                bool pre = true;
                memset(y, 0xAB, sizeof y);
                assert_int_equal(tn_pc_plane_decode_f32(buf + off, ends[NP - 1] - off, KVD, p % 2, &md, y, yf, &pre, &used), TERN_OK);
                assert_int_equal(pre, p % 2 == 0 && (rep & 1));
                off += used;
                assert_int_equal(off, ends[p]);
                const int il = p / 2, kv = p % 2;
                const double mul = il < sp->n_first ? sp->mul_first : 1;
                for (int ch = 0; ch < KVD; ch++) {
                    const double wl = si == 3 ? pow(wts[ch], -(double)sp->wexp[kv]) : 1;
                    const double step = want_step(x[p], KVD, ch, sp->div[kv] * mul, sp->div_ch[kv] * mul, sp->tilt[kv], wl);
                    for (int t = 0; t < 16; t++) {
                        const int i = t * KVD + ch;
                        const double a = x[p][i], b = yf[i];
                        const double bound = step / 2 * (1 + 0x1p-20) + fabs(a) * 0x1p-22;
                        worst = fmax(worst, fabs(a - b) / bound);
                        differ += a != b;
                        if (!pre) {
                            const double b16 = tn_fp16_to_fp32(y[i]);
                            worst16 = fmax(worst16, fabs(a - b16) / (bound + (fabs(a) + step / 2) * 0x1p-11 + 0x1p-25));
                        } else {
                            assert_int_equal(y[i], 0xABAB); /* keys before RoPE: f16 left to the caller */
                        }
                    }
                }
            }
            if (rep == 0) print_message("steps %d: worst error %.3f of the bound (f16 %.3f), %zu bytes for %d values\n", si, worst, worst16, off, NP * 16 * KVD);
            assert_true(worst <= 1.0 && worst16 <= 1.0);
            assert_true(worst > 0.2); /* the bound is not vacuous: errors reach a good part of it */
            assert_true(differ > 0);
            /* a pre-RoPE plane refused by the f16-only decoder; a V plane cannot be one */
            size_t used = 0;
            if (rep & 1) assert_int_not_equal(tn_pc_plane_decode(buf, ends[0], KVD, 0, &md, y, &used), TERN_OK);
            assert_int_equal(tn_pc_plane_encode_lossy(sp, 0, 1, &me, x[0], NULL, KVD, true, buf + off), 0);
            /* corrupted bytes: refused or decoded to some values, never out of bounds (ASan) */
            for (int k = 0; k < 50; k++) {
                uint8_t *b = buf + (size_t)(urand() * (double)ends[0]);
                *b ^= (uint8_t)(1 + urand() * 254);
                tn_pc_models_init(&md);
                bool pre = false;
                (void)tn_pc_plane_decode_f32(buf, ends[0], KVD, 0, &md, y, yf, &pre, &used);
            }
        }
    /* a non-finite value: the plane is stored losslessly */
    tn_pc_models me, md;
    tn_pc_models_init(&me);
    tn_pc_models_init(&md);
    fill(x16, KVD);
    x16[100] = 0x7C00;
    size_t used = 0, n = tn_pc_plane_encode(TN_PC_MEDIUM, 3, 1, &me, x16, KVD, buf);
    assert_int_equal(tn_pc_plane_decode(buf, n, KVD, 1, &md, y, &used), TERN_OK);
    assert_memory_equal(x16, y, sizeof y);
    x[0][5] = NAN;
    assert_int_equal(tn_pc_plane_encode_lossy(&sts[0], 0, 0, &me, x[0], NULL, KVD, true, buf), 0);
}

static void weights_ref(const tern_model *m, int32_t il, int kv, double *out);

/* RoPE written out in double: theta_i = pos * freq_scale * base^(-2i / n_rot), pairs (2i, 2i+1)
 * (NORM) or (i, i + n_rot / 2) (NEOX), rotated dims times mscale m; dir -1: R^T / m. */
static void rope_ref(const tn_hparams *hp, int64_t pos, double *x, int dir) {
    const double m = hp->rope_attn_factor > 0 ? hp->rope_attn_factor : 1;
    for (int h = 0; h < hp->n_head_kv; h++)
        for (int i = 0; i < hp->n_rot / 2; i++) {
            const double th = (double)pos * hp->rope_freq_scale * pow(hp->rope_freq_base, -2.0 * i / hp->n_rot);
            const int a = h * hp->head_dim + (hp->rope_mode == TN_ROPE_NORM ? 2 * i : i);
            const int b = h * hp->head_dim + (hp->rope_mode == TN_ROPE_NORM ? 2 * i + 1 : i + hp->n_rot / 2);
            const double c = cos(th), s = sin(th) * dir, x0 = x[a], x1 = x[b], g = dir > 0 ? m : 1 / m;
            x[a] = g * (x0 * c - x1 * s);
            x[b] = g * (x0 * s + x1 * c);
        }
}

/* tn_pc_rope_plane against rope_ref: forward and inverse, both pair layouts, partial rotation, an
 * mscale, NoPE layers; inverse then forward gives the plane back. */
static void test_rope_plane(void **st) {
    (void)st;
    enum { HD = 16, NKV = 3, D = HD * NKV };
    for (int cfg = 0; cfg < 4; cfg++) {
        tn_hparams hp;
        memset(&hp, 0, sizeof hp);
        hp.n_layer = 4, hp.n_head_kv = NKV, hp.head_dim = HD, hp.n_rot = cfg == 2 ? 8 : HD;
        hp.rope_freq_base = cfg == 1 ? 500000.0f : 10000.0f, hp.rope_freq_scale = cfg == 3 ? 0.25f : 1.0f;
        hp.rope_mode = cfg & 1 ? TN_ROPE_NEOX : TN_ROPE_NORM;
        hp.rope_attn_factor = cfg == 3 ? 1.25f : 0;
        hp.nope_step = cfg == 2 ? 4 : 0; /* layer 3 without RoPE */
        assert_int_equal(tn_pc_layer_roped(&hp, 3), cfg != 2);
        assert_true(tn_pc_layer_roped(&hp, 0));
        static float x[16 * D], y[16 * D];
        static double r[16 * D];
        float cs[HD];
        for (int i = 0; i < 16 * D; i++) x[i] = (float)(4 * urand() - 2);
        const int64_t pos0 = 16 * (1 + cfg * 7);
        for (int dir = -1; dir <= 1; dir += 2) {
            memcpy(y, x, sizeof y);
            tn_pc_rope_plane(&hp, NULL, 1, pos0, y, cs, dir);
            for (int i = 0; i < 16 * D; i++) r[i] = x[i];
            for (int t = 0; t < 16; t++) rope_ref(&hp, pos0 + t, r + t * D, dir);
            double err = 0;
            for (int i = 0; i < 16 * D; i++) err = fmax(err, fabs(y[i] - r[i]));
            print_message("rope cfg %d dir %+d: max |tern - double| %.2e\n", cfg, dir, err);
            assert_true(err < 2e-5 * (1 + pos0 / 16.0));
            if (cfg == 2) /* dims past n_rot untouched */
                for (int t = 0; t < 16; t++)
                    for (int h = 0; h < NKV; h++)
                        for (int i = 8; i < HD; i++) assert_true(y[t * D + h * HD + i] == x[t * D + h * HD + i]);
        }
        memcpy(y, x, sizeof y);
        tn_pc_rope_plane(&hp, NULL, 2, pos0, y, cs, -1);
        tn_pc_rope_plane(&hp, NULL, 2, pos0, y, cs, 1);
        double err = 0;
        for (int i = 0; i < 16 * D; i++) err = fmax(err, fabs(y[i] - x[i]));
        print_message("rope cfg %d: undo then redo, max |difference| %.2e\n", cfg, err);
        assert_true(err < 1e-5); /* float rounding of values up to 2.5 */
    }
}

/* ---- the cache on a model --------------------------------------------------------------- */

/* A test of the cache itself is skipped (visibly) in a build without libzstd. */
#ifdef TERN_HAVE_ZSTD
#define NEED_ZSTD() ((void)0)
#else
#define NEED_ZSTD()                                                                                  \
    do {                                                                                             \
        print_message("SKIP: built without libzstd: no prompt cache\n");                             \
        skip();                                                                                      \
    } while (0)
#endif

static char model_path[512], model2_path[512], dir[600];

static tern_ctx *new_ctx(tern_model *m) {
    tern_ctx_params p;
    tern_ctx_params_init(&p);
    p.n_ctx = 64;
    p.n_threads = 1;
    tern_ctx *c = NULL;
    assert_int_equal(tern_ctx_create(m, &p, &c), TERN_OK);
    return c;
}

static void kv_equal(const tern_ctx *a, const tern_ctx *b, int32_t rows) {
    const int64_t kvd = (int64_t)a->hp.n_head_kv * a->hp.head_dim;
    for (int32_t il = 0; il < a->hp.n_layer; il++) {
        assert_memory_equal(a->k_cache + (size_t)a->kv_off[il] * a->k_rb, b->k_cache + (size_t)b->kv_off[il] * b->k_rb, (size_t)rows * kvd * 2);
        assert_memory_equal(a->v_cache + (size_t)a->kv_off[il] * a->v_rb, b->v_cache + (size_t)b->kv_off[il] * b->v_rb, (size_t)rows * kvd * 2);
    }
}

static void load_expect(tern_model *m, const tern_token *toks, int32_t n, int32_t want, int64_t skipped) {
    print_message("load: want %d tokens, %lld skipped\n", want, (long long)skipped);
    tn_pcache *pc = NULL;
    assert_int_equal(tn_pcache_open(m, NULL, dir, 0, TN_PC_LOSSLESS, &pc), TERN_OK);
    tern_ctx *c = new_ctx(m);
    int32_t got = -1;
    assert_int_equal(tn_pcache_load(pc, c, toks, n, 0, &got), TERN_OK);
    assert_int_equal(got, want);
    assert_int_equal(tern_ctx_n_past(c), want);
    assert_int_equal(tn_pcache_get_stats(pc)->blocks_skipped, skipped);
    tern_ctx_free(c);
    tn_pcache_free(pc);
}

/* CRC-32 (IEEE, reflected, bit by bit): written here, not taken from pcache.c */
static uint32_t crc32_bits(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
    }
    return ~c;
}
static void fix_crc(uint8_t *b, size_t n) {
    const uint32_t c = crc32_bits(b, n - 4);
    for (int i = 0; i < 4; i++) b[n - 4 + i] = (uint8_t)(c >> 8 * i);
}

static char *block_file(tn_pcache *pc, const tern_token *toks, int32_t b) {
    uint64_t h = 0;
    for (int32_t i = 0; i <= b; i++) h = tn_tok_hash(0, h, toks + 16 * i);
    static char p[1024];
    snprintf(p, sizeof p, "%s/%016llx.tpc", tn_pcache_subdir(pc), (unsigned long long)h);
    return p;
}

/* The test model loaded into *m, toks[50] = add + (i * mul) % 300, a context that computed them. */
static tern_ctx *decoded_ctx(tern_model **m, tern_token *toks, int add, int mul) {
    assert_int_equal(tern_model_load(model_path, NULL, m), TERN_OK);
    for (int i = 0; i < 50; i++) toks[i] = (tern_token)(add + (i * mul) % 300);
    tern_ctx *a = new_ctx(*m);
    assert_int_equal(tern_decode(a, toks, 50), TERN_OK);
    return a;
}

static void test_cache_model(void **st) {
    (void)st;
    NEED_ZSTD();
    tern_model *m = NULL;
    tern_token toks[50];
    tern_ctx *a = decoded_ctx(&m, toks, 3, 37); /* a: computes 50 tokens and stores blocks 0..2 */
    tn_pcache *pc = NULL;
    assert_int_equal(tn_pcache_open(m, NULL, dir, 0, TN_PC_LOSSLESS, &pc), TERN_OK);
    assert_int_equal(tn_pcache_store(pc, a, toks, 50), TERN_OK);
    assert_int_equal(tn_pcache_get_stats(pc)->blocks_stored, 3);
    assert_int_equal(tn_pcache_store(pc, a, toks, 50), TERN_OK); /* all on disk: nothing new */
    assert_int_equal(tn_pcache_get_stats(pc)->blocks_stored, 3);
    /* b: loads 48 tokens (3 blocks: 49 would leave at least one token), bits equal to a's */
    tern_ctx *b = new_ctx(m);
    int32_t got = 0;
    assert_int_equal(tn_pcache_load(pc, b, toks, 50, 0, &got), TERN_OK);
    assert_int_equal(got, 48);
    kv_equal(a, b, 48);
    /* a prompt of exactly 48 tokens loads 32: the last token is computed for its logits */
    tern_ctx *b2 = new_ctx(m);
    assert_int_equal(tn_pcache_load(pc, b2, toks, 48, 0, &got), TERN_OK);
    assert_int_equal(got, 32);
    tern_ctx_free(b2);
    /* logits after the loaded prefix == a context that computed the prefix itself */
    tern_ctx *c = new_ctx(m);
    assert_int_equal(tern_decode(c, toks, 48), TERN_OK);
    assert_int_equal(tern_decode(c, toks + 48, 2), TERN_OK);
    assert_int_equal(tern_decode(b, toks + 48, 2), TERN_OK);
    assert_memory_equal(tern_get_logits(b, -1), tern_get_logits(c, -1), (size_t)tern_model_n_vocab(m) * sizeof(float));
    tern_ctx_free(a);
    tern_ctx_free(b);
    tern_ctx_free(c);

    /* faults: each damages block 1; block 0 still loads, the damaged one is skipped */
    char p1[1024];
    snprintf(p1, sizeof p1, "%s", block_file(pc, toks, 1));
    struct stat sb;
    assert_int_equal(stat(p1, &sb), 0);
    FILE *f = fopen(p1, "rb");
    uint8_t *good = malloc((size_t)sb.st_size), *bad = malloc((size_t)sb.st_size);
    assert_int_equal(fread(good, 1, (size_t)sb.st_size, f), (size_t)sb.st_size);
    fclose(f);
    for (int kind = 0; kind < 7; kind++) {
        size_t n = (size_t)sb.st_size;
        memcpy(bad, good, n);
        if (kind == 0) n -= 7;                           /* truncated */
        if (kind == 1) bad[n / 2] ^= 0x10;               /* one bit flipped in the payload */
        if (kind == 2) bad[4] = 0;                       /* an old format version (0) */
        if (kind == 4) bad[72] ^= 1, fix_crc(bad, n);    /* a token id differs (CRC made valid) */
        if (kind == 5) bad[n - 40] ^= 0x5A, fix_crc(bad, n); /* payload garbage with a valid CRC */
        if (kind == 6) bad[56] ^= 0x20, fix_crc(bad, n); /* raw size in the header wrong, valid CRC */
        f = fopen(p1, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(bad, 1, n, f), n);
        fclose(f);
        if (kind == 3) { /* another model's block under this name: written by a cache of model 2 */
            tern_model *m2 = NULL;
            assert_int_equal(tern_model_load(model2_path, NULL, &m2), TERN_OK);
            tn_pcache *pc2 = NULL;
            assert_int_equal(tn_pcache_open(m2, NULL, dir, 0, TN_PC_LOSSLESS, &pc2), TERN_OK);
            assert_string_not_equal(tn_pcache_subdir(pc2), tn_pcache_subdir(pc)); /* other subdirectory */
            tern_ctx *c2 = new_ctx(m2);
            assert_int_equal(tern_decode(c2, toks, 40), TERN_OK);
            assert_int_equal(tn_pcache_store(pc2, c2, toks, 40), TERN_OK);
            assert_int_equal(tn_pcache_get_stats(pc2)->blocks_stored, 2);
            char other[1024];
            snprintf(other, sizeof other, "%s", block_file(pc2, toks, 1));
            assert_int_equal(rename(other, p1), 0);
            tern_ctx_free(c2);
            tn_pcache_free(pc2);
            tern_model_free(m2);
        }
        print_message("fault %d\n", kind);
        load_expect(m, toks, 50, 16, 1);
    }
    /* restored: all three load again */
    f = fopen(p1, "wb");
    assert_int_equal(fwrite(good, 1, (size_t)sb.st_size, f), (size_t)sb.st_size);
    fclose(f);
    load_expect(m, toks, 50, 48, 0);
    free(good);
    free(bad);
    tn_pcache_free(pc);
    tern_model_free(m);
}

/* Files in a cache's subdirectory. */
static int count_files(const tn_pcache *pc, const char *suffix) {
    DIR *d = opendir(tn_pcache_subdir(pc));
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, suffix) != NULL;
    closedir(d);
    return n;
}

/* The background writer (tern serve's): blocks queued from a context's cache are written by the
 * cache's thread in full (loaded into another context, they are the first one's rows bit for bit),
 * a queue bound drops what does not fit (counted, no file), and freeing the cache writes what is
 * still queued. */
static void test_writer(void **st) {
    (void)st;
    NEED_ZSTD();
    tern_model *m = NULL;
    tern_token toks[50];
    tern_ctx *a = decoded_ctx(&m, toks, 7, 41);
    char wd[3][700];
    tn_pcache *pc[3];
    for (int k = 0; k < 3; k++) {
        snprintf(wd[k], sizeof wd[k], "%s/writer%d", dir, k);
        assert_int_equal(tn_pcache_open(m, NULL, wd[k], 0, TN_PC_LOSSLESS, &pc[k]), TERN_OK);
        /* 0: room for every block; 1: for none; 2: freed without a flush */
        assert_int_equal(tn_pcache_start_writer(pc[k], a, k == 1 ? 1 : (size_t)64 << 20), TERN_OK);
        tn_pc_chain ch = {0, 0};
        for (int32_t b = 0; b < 3; b++) {
            tn_pc_chain_next(&ch, toks + 16 * b);
            assert_int_equal(tn_pcache_store_block(pc[k], a, b, ch, toks + 16 * b, b), TERN_OK);
        }
    }
    tn_pcache_free(pc[2]); /* writes the queued blocks first */
    for (int k = 0; k < 2; k++) tn_pcache_flush(pc[k]);
    assert_int_equal(tn_pcache_get_stats(pc[0])->blocks_stored, 3);
    assert_int_equal(tn_pcache_get_stats(pc[0])->blocks_dropped, 0);
    assert_int_equal(count_files(pc[0], ".tpc"), 3);
    assert_int_equal(tn_pcache_get_stats(pc[1])->blocks_stored, 0);
    assert_int_equal(tn_pcache_get_stats(pc[1])->blocks_dropped, 3);
    assert_int_equal(count_files(pc[1], ".tpc"), 0);
    /* loads while the writer runs: a's rows */
    tern_ctx *b = new_ctx(m);
    tn_pc_chain ch = {0, 0};
    for (int32_t bi = 0; bi < 3; bi++) {
        tn_pc_chain_next(&ch, toks + 16 * bi);
        assert_int_equal(tn_pcache_load_block(pc[0], b, bi, ch, toks + 16 * bi, bi), TERN_OK);
    }
    kv_equal(a, b, 48);
    tern_ctx_free(b);
    for (int k = 0; k < 2; k++) tn_pcache_free(pc[k]);
    /* the cache freed without a flush wrote all three: a fresh cache loads them */
    assert_int_equal(tn_pcache_open(m, NULL, wd[2], 0, TN_PC_LOSSLESS, &pc[2]), TERN_OK);
    assert_int_equal(count_files(pc[2], ".tpc"), 3);
    assert_int_equal(count_files(pc[2], ".tmp."), 0);
    tern_ctx *c = new_ctx(m);
    int32_t got = 0;
    assert_int_equal(tn_pcache_load(pc[2], c, toks, 50, 0, &got), TERN_OK);
    assert_int_equal(got, 48);
    kv_equal(a, c, 48);
    tern_ctx_free(c);
    tn_pcache_free(pc[2]);
    tern_ctx_free(a);
    tern_model_free(m);
}

/* A lossy store and load on the tiny (RoPE'd) model: every key plane went before RoPE, and each
 * loaded K and V value is within the bound computed here from the cached values alone: V within
 * half its channel's step, K (un-rotated here in double, stepped, rotated back) within half the
 * length of its rotation pair's steps, plus f16 rounding. */
static void test_lossy_model(void **st) {
    (void)st;
    NEED_ZSTD();
    tern_model *m = NULL;
    assert_int_equal(tern_model_load(model_path, NULL, &m), TERN_OK);
    tern_token toks[50];
    for (int i = 0; i < 50; i++) toks[i] = (tern_token)(5 + (i * 53) % 300);
    tern_ctx *a = new_ctx(m);
    assert_int_equal(tern_decode(a, toks, 50), TERN_OK);
    tn_pcache *pc = NULL;
    assert_int_equal(tn_pcache_open(m, NULL, dir, 0, (tn_pc_quality)TN_PC_N_QUALITY, &pc), TERN_ERR_INVALID_ARG); /* no such quality */
    assert_null(pc);
    assert_int_equal(tn_pcache_open(m, NULL, dir, 0, TN_PC_HIGH, &pc), TERN_OK);
    /* coarse, so errors show; keys before RoPE; steps leaning on the channel weights */
    const tn_pc_steps sp = {{3, 2}, {4, 3}, 2, 1, true, {0.25f, 0}, {8, 4}}; /* weights^8: steps apart by ~2x */
    tn_pcache_set_steps(pc, &sp);
    assert_int_equal(tn_pcache_store(pc, a, toks, 50), TERN_OK);
    const tn_hparams *hp = &a->hp;
    assert_int_equal(tn_pcache_get_stats(pc)->blocks_stored, 3);
    assert_int_equal(tn_pcache_get_stats(pc)->planes_pre_rope, 3 * hp->n_layer);
    tern_ctx *b = new_ctx(m);
    int32_t got = 0;
    assert_int_equal(tn_pcache_load(pc, b, toks, 50, 0, &got), TERN_OK);
    assert_int_equal(got, 48);
    const int kvd = hp->n_head_kv * hp->head_dim;
    double *u = malloc(sizeof *u * 16 * (size_t)kvd);
    float *uf = malloc(sizeof *uf * 16 * (size_t)kvd), *w = malloc(sizeof *w * (size_t)kvd);
    double *wr = malloc(sizeof *wr * (size_t)kvd);
    double worst[2] = {0, 0};
    for (int32_t il = 0; il < hp->n_layer; il++)
        for (int kv = 0; kv < 2; kv++)
            for (int blk = 0; blk < 3; blk++) {
                const tn_fp16 *xa = (const tn_fp16 *)(kv ? a->v_cache : a->k_cache) + ((size_t)a->kv_off[il] + 16 * (size_t)blk) * kvd;
                const tn_fp16 *xb = (const tn_fp16 *)(kv ? b->v_cache : b->k_cache) + ((size_t)b->kv_off[il] + 16 * (size_t)blk) * kvd;
                for (int i = 0; i < 16 * kvd; i++) u[i] = tn_fp16_to_fp32(xa[i]);
                if (!kv)
                    for (int t = 0; t < 16; t++) rope_ref(hp, 16 * blk + t, u + (size_t)t * kvd, -1);
                for (int i = 0; i < 16 * kvd; i++) uf[i] = (float)u[i];
                const double mul = il < sp.n_first ? sp.mul_first : 1;
                weights_ref(m, il, kv, wr);
                for (int ch = 0; ch < kvd; ch++)
                    w[ch] = (float)want_step(uf, kvd, ch, sp.div[kv] * mul, sp.div_ch[kv] * mul, sp.tilt[kv], pow(wr[ch], -(double)sp.wexp[kv]));
                for (int t = 0; t < 16; t++)
                    for (int ch = 0; ch < kvd; ch++) {
                        const int i = t * kvd + ch, hc = ch % hp->head_dim, h0 = ch - hc;
                        /* the rotation partner of channel ch (NORM: adjacent pairs; NEOX: halves) */
                        const int pc_ = hc >= hp->n_rot ? ch : hp->rope_mode == TN_ROPE_NORM ? h0 + (hc ^ 1) : h0 + (hc + hp->n_rot / 2) % hp->n_rot;
                        const double e = kv ? w[ch] / 2 : sqrt((double)w[ch] * w[ch] + (double)w[pc_] * w[pc_]) / 2;
                        const double x0 = tn_fp16_to_fp32(xa[i]), x1 = tn_fp16_to_fp32(xb[i]);
                        const double bound = e * (1 + 1e-5) + (fabs(x0) + e) * 0x1p-10 + 1e-6;
                        worst[kv] = fmax(worst[kv], fabs(x0 - x1) / bound);
                    }
            }
    print_message("lossy store/load: worst error K %.3f, V %.3f of the bound\n", worst[0], worst[1]);
    assert_true(worst[0] <= 1 && worst[1] <= 1);
    assert_true(worst[0] > 0.2 && worst[1] > 0.2);
    /* keys after RoPE (format 2's way) store no plane before RoPE */
    tn_pcache_free(pc);
    char sub[1024];
    assert_int_equal(tn_pcache_open(m, NULL, dir, 0, TN_PC_HIGH, &pc), TERN_OK);
    snprintf(sub, sizeof sub, "rm -rf '%s'", tn_pcache_subdir(pc));
    tn_pcache_free(pc);
    assert_int_equal(system(sub), 0);
    assert_int_equal(tn_pcache_open(m, NULL, dir, 0, TN_PC_HIGH, &pc), TERN_OK);
    tn_pc_steps post = sp;
    post.keys_pre_rope = false;
    tn_pcache_set_steps(pc, &post);
    assert_int_equal(tn_pcache_store(pc, a, toks, 50), TERN_OK);
    assert_int_equal(tn_pcache_get_stats(pc)->blocks_stored, 3);
    assert_int_equal(tn_pcache_get_stats(pc)->planes_pre_rope, 0);
    tn_pcache_free(pc);
    free(u), free(uf), free(w), free(wr);
    tern_ctx_free(a);
    tern_ctx_free(b);
    tern_model_free(m);
}

/* ---- a quantized in-memory cache (-ctk/-ctv) through the prompt cache ------------------------ */

static tern_ctx *quant_ctx(tern_model *m, int32_t tk, int32_t tv, int32_t rot) {
    tern_ctx_params p;
    tern_ctx_params_init(&p);
    p.n_ctx = 64;
    p.n_threads = 1;
    p.type_k = tk, p.type_v = tv, p.kv_rotate = rot;
    tern_ctx *c = NULL;
    assert_int_equal(tern_ctx_create(m, &p, &c), TERN_OK);
    return c;
}

/* value i of a q8_0 (bits 8) or q4_0 (bits 4) row, read here from ggml's block layouts (an f16
 * scale, then 32 int8 / 16 bytes of nibbles: low nibbles values 0..15, high 16..31, minus 8);
 * *d: the block's scale */
static double deq_ref(const uint8_t *row, int bits, int i, double *d) {
    const uint8_t *b = row + (size_t)(i / 32) * (bits == 8 ? 34 : 18);
    *d = tn_fp16_to_fp32((tn_fp16)(b[0] | b[1] << 8));
    const int j = i % 32;
    const int q = bits == 8 ? (int8_t)b[2 + j] : (j < 16 ? b[2 + j] & 15 : b[2 + j - 16] >> 4) - 8;
    return *d * q;
}

/* With -ctk/-ctv quantized (rotated or not) the prompt cache stores and loads the rows:
 *  - lossless: a fresh context of the same types loads every block with its rows' bytes equal to
 *    those computed, and the logits after them equal a context that computed the prefix; the
 *    subdirectory names the row types (r: rotated); a context of other types (or rotation) is
 *    refused by the cache, and a cache of f16 rows in the same directory finds none of the files.
 *  - lossy (coarse steps set here, plane term only): each loaded head row is within the codec's
 *    error (at most half the plane step sqrt(hd) rms(plane) / div, the same in the rotated domain:
 *    the rotation is orthogonal) plus the requantization's (a scale a value for q4_0, half for
 *    q8_0) of the computed row, in L2 per head, and the loaded rows do differ from the computed. */
static void test_quant_rows(void **st) {
    (void)st;
    NEED_ZSTD();
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.n_embd = 128, cfg.n_head = 4, cfg.n_head_kv = 2; /* heads of 32: whole quantized blocks */
    tern_model *m = tiny_model_load(&cfg, "pcache-q");
    assert_non_null(m);
    tern_token toks[50];
    for (int i = 0; i < 50; i++) toks[i] = (tern_token)(7 + (i * 41) % 300);
    char qdir[700], cmd[800];
    snprintf(qdir, sizeof qdir, "%s.q", dir);
    static const struct { int32_t k, v, rot; const char *name; } cases[] = {
        {TERN_KV_Q8_0, TERN_KV_Q4_0, TERN_KV_ROT_AUTO, "-q8_0r-q4_0-"},
        {TERN_KV_TQ(4), TERN_KV_TQ(3), TERN_KV_ROT_KV, "-tq4g32ar-tq3g32ar-"},
        {TERN_KV_Q4_0, TERN_KV_F16, TERN_KV_ROT_NONE, "-q4_0-f16-"},
        {TERN_KV_F16, TERN_KV_Q8_0, TERN_KV_ROT_V, "-f16-q8_0r-"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        print_message("rows %s lossless\n", cases[ci].name);
        tern_ctx *a = quant_ctx(m, cases[ci].k, cases[ci].v, cases[ci].rot);
        assert_int_equal(tern_decode(a, toks, 50), TERN_OK);
        tn_pcache *pc = NULL;
        assert_int_equal(tn_pcache_open(m, a, qdir, 0, TN_PC_LOSSLESS, &pc), TERN_OK);
        assert_non_null(strstr(tn_pcache_subdir(pc), cases[ci].name));
        assert_int_equal(tn_pcache_store(pc, a, toks, 50), TERN_OK);
        assert_int_equal(tn_pcache_get_stats(pc)->blocks_stored, 3);
        tern_ctx *b = quant_ctx(m, cases[ci].k, cases[ci].v, cases[ci].rot);
        int32_t got = 0;
        assert_int_equal(tn_pcache_load(pc, b, toks, 50, 0, &got), TERN_OK);
        assert_int_equal(got, 48);
        for (int32_t il = 0; il < a->hp.n_layer; il++) {
            assert_memory_equal(a->k_cache + (size_t)a->kv_off[il] * a->k_rb, b->k_cache + (size_t)b->kv_off[il] * b->k_rb, 48 * a->k_rb);
            assert_memory_equal(a->v_cache + (size_t)a->kv_off[il] * a->v_rb, b->v_cache + (size_t)b->kv_off[il] * b->v_rb, 48 * a->v_rb);
        }
        tern_ctx *c = quant_ctx(m, cases[ci].k, cases[ci].v, cases[ci].rot);
        assert_int_equal(tern_decode(c, toks, 48), TERN_OK);
        assert_int_equal(tern_decode(c, toks + 48, 2), TERN_OK);
        assert_int_equal(tern_decode(b, toks + 48, 2), TERN_OK);
        assert_memory_equal(tern_get_logits(b, -1), tern_get_logits(c, -1), (size_t)tern_model_n_vocab(m) * sizeof(float));
        /* another type or rotation: refused; f16 rows: another subdirectory, nothing found */
        tern_ctx *o = quant_ctx(m, cases[ci].k == TERN_KV_F16 ? TERN_KV_Q8_0 : TERN_KV_F16, cases[ci].v, cases[ci].rot);
        assert_int_equal(tn_pcache_usable(pc, o), TERN_ERR_INVALID_ARG);
        assert_int_equal(tn_pcache_load(pc, o, toks, 50, 0, &got), TERN_ERR_INVALID_ARG);
        tern_ctx_free(o);
        tn_pcache *pf = NULL;
        assert_int_equal(tn_pcache_open(m, NULL, qdir, 0, TN_PC_LOSSLESS, &pf), TERN_OK);
        tern_ctx *f = quant_ctx(m, TERN_KV_F16, TERN_KV_F16, TERN_KV_ROT_AUTO);
        assert_int_equal(tn_pcache_load(pf, f, toks, 50, 0, &got), TERN_OK);
        assert_int_equal(got, 0);
        tern_ctx_free(f);
        tn_pcache_free(pf);
        tn_pcache_free(pc);
        tern_ctx_free(a), tern_ctx_free(b), tern_ctx_free(c);
    }
    /* lossy: q8_0 K and q4_0 V, both rotated */
    tern_ctx *a = quant_ctx(m, TERN_KV_Q8_0, TERN_KV_Q4_0, TERN_KV_ROT_KV);
    assert_int_equal(tern_decode(a, toks, 50), TERN_OK);
    tn_pcache *pc = NULL;
    assert_int_equal(tn_pcache_open(m, a, qdir, 0, TN_PC_HIGH, &pc), TERN_OK);
    const tn_pc_steps sp = {{2, 1.5f}, {0, 0}, 1, 0, false, {0, 0}, {0, 0}};
    tn_pcache_set_steps(pc, &sp);
    assert_int_equal(tn_pcache_store(pc, a, toks, 50), TERN_OK);
    assert_int_equal(tn_pcache_get_stats(pc)->blocks_stored, 3);
    tern_ctx *b = quant_ctx(m, TERN_KV_Q8_0, TERN_KV_Q4_0, TERN_KV_ROT_KV);
    int32_t got = 0;
    assert_int_equal(tn_pcache_load(pc, b, toks, 50, 0, &got), TERN_OK);
    assert_int_equal(got, 48);
    const int hd = a->hp.head_dim, kvd = a->hp.n_head_kv * hd;
    double worst[2] = {0, 0};
    int64_t differ[2] = {0, 0};
    for (int32_t il = 0; il < a->hp.n_layer; il++)
        for (int kv = 0; kv < 2; kv++) {
            const size_t rb = kv ? a->v_rb : a->k_rb;
            const int bits = kv ? 4 : 8;
            for (int blk = 0; blk < 3; blk++) {
                const uint8_t *ra = (kv ? a->v_cache : a->k_cache) + ((size_t)a->kv_off[il] + 16 * (size_t)blk) * rb;
                const uint8_t *rbb = (kv ? b->v_cache : b->k_cache) + ((size_t)b->kv_off[il] + 16 * (size_t)blk) * rb;
                double ss = 0, d;
                for (int t = 0; t < 16; t++)
                    for (int i = 0; i < kvd; i++) ss += pow(deq_ref(ra + (size_t)t * rb, bits, i, &d), 2);
                const double step = sqrt(ss / (16.0 * kvd)) / sp.div[kv]; /* the codec's plane step, at most */
                for (int t = 0; t < 16; t++) {
                    differ[kv] += memcmp(ra + (size_t)t * rb, rbb + (size_t)t * rb, rb) != 0;
                    for (int h = 0; h < kvd / hd; h++) {
                        double e2 = 0, q2 = 0, da, db;
                        for (int i = h * hd; i < (h + 1) * hd; i++) {
                            e2 += pow(deq_ref(ra + (size_t)t * rb, bits, i, &da) - deq_ref(rbb + (size_t)t * rb, bits, i, &db), 2);
                            q2 += pow(bits == 8 ? db / 2 : db, 2);
                        }
                        const double bound = sqrt(hd) * step / 2 * (1 + 1e-4) + sqrt(q2) + 1e-6;
                        worst[kv] = fmax(worst[kv], sqrt(e2) / bound);
                    }
                }
            }
        }
    print_message("lossy rows: worst head error K %.3f, V %.3f of the bound; rows changed K %lld, V %lld of %d\n", worst[0], worst[1],
                  (long long)differ[0], (long long)differ[1], 48 * a->hp.n_layer);
    assert_true(worst[0] <= 1 && worst[1] <= 1);
    assert_true(differ[0] > 0 && differ[1] > 0);
    tn_pcache_free(pc);
    tern_ctx_free(a), tern_ctx_free(b);
    tern_model_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", qdir);
    assert_int_equal(system(cmd), 0);
}

/* tn_pc_channel_weights recomputed here in double from the f32 tensors as the header defines
 * them: K channel j of KV head g = sqrt(sum over g's query heads of |W_q row (.) attn_norm|^2),
 * times q_norm_j^2 / the head's mean where present, RoPE pairs averaged; V = sqrt(sum of |W_o
 * column|^2); floor at 1/1024 of the largest, geometric mean 1. */
static void weights_ref(const tern_model *m, int32_t il, int kv, double *out) {
    const tn_hparams *hp = &m->hp;
    const tn_layer *L = &m->layers[il];
    const int hd = hp->head_dim, kvd = hp->n_head_kv * hd, qd = hp->n_head * hd, ne = hp->n_embd, grp = hp->n_head / hp->n_head_kv;
    const float *wq = L->w[TN_ROLE_ATTN_Q].data, *wo = L->w[TN_ROLE_ATTN_OUT].data, *g = L->w[TN_ROLE_ATTN_NORM].data;
    const float *qn = L->w[TN_ROLE_ATTN_Q_NORM].data;
    assert_true(L->w[TN_ROLE_ATTN_Q].type == TN_F32 && L->w[TN_ROLE_ATTN_OUT].type == TN_F32);
    double *e = calloc((size_t)qd, sizeof *e);
    for (int r = 0; r < qd; r++) {
        for (int i = 0; i < ne; i++) {
            const double v = kv ? (double)wo[(size_t)i * qd + r] : (double)wq[(size_t)r * ne + i] * g[i];
            e[r] += v * v;
        }
    }
    if (!kv && qn)
        for (int h = 0; h < hp->n_head; h++) {
            double mean = 0;
            for (int j = 0; j < hd; j++) mean += e[h * hd + j] / hd;
            for (int j = 0; j < hd; j++) e[h * hd + j] *= (double)qn[j] * qn[j] / mean;
        }
    if (!kv && hp->n_rot > 0)
        for (int h = 0; h < hp->n_head; h++)
            for (int j = 0; j < hp->n_rot; j++) { /* pair partner: adjacent (NORM) or the other half (NEOX) */
                const int p = hp->rope_mode == TN_ROPE_NORM ? j ^ 1 : (j + hp->n_rot / 2) % hp->n_rot;
                if (j < p) e[h * hd + j] = e[h * hd + p] = (e[h * hd + j] + e[h * hd + p]) / 2;
            }
    double mx = 0, sl = 0;
    for (int c = 0; c < kvd; c++) {
        double s = 0;
        for (int h = c / hd * grp; h < (c / hd + 1) * grp; h++) s += e[h * hd + c % hd];
        out[c] = sqrt(s), mx = fmax(mx, out[c]);
    }
    for (int c = 0; c < kvd; c++) out[c] = fmax(out[c], mx / 1024), sl += log(out[c]);
    for (int c = 0; c < kvd; c++) out[c] /= exp(sl / kvd);
    free(e);
}

static void test_channel_weights(void **st) {
    (void)st;
    static const char *archs[] = {"llama", "qwen3"};
    for (int a = 0; a < 2; a++) {
        tiny_cfg cfg;
        tiny_cfg_default(&cfg);
        cfg.arch = archs[a];
        cfg.n_head = 8, cfg.n_head_kv = 2; /* 4 query heads per KV head */
        tern_model *m = tiny_model_load(&cfg, "pcache-w");
        assert_non_null(m);
        const tn_hparams *hp = &m->hp;
        const int kvd = hp->n_head_kv * hp->head_dim;
        assert_true(a == 0 || m->layers[0].w[TN_ROLE_ATTN_Q_NORM].data != NULL);
        float *w = malloc(sizeof *w * (size_t)hp->n_layer * 2 * (size_t)kvd);
        double *r = malloc(sizeof *r * (size_t)kvd), worst = 0, spread = 0;
        assert_int_equal(tn_pc_channel_weights(m, w), TERN_OK);
        for (int32_t il = 0; il < hp->n_layer; il++)
            for (int kv = 0; kv < 2; kv++) {
                weights_ref(m, il, kv, r);
                double lo = INFINITY, hi = 0;
                for (int c = 0; c < kvd; c++) {
                    const double x = w[((size_t)il * 2 + (size_t)kv) * (size_t)kvd + (size_t)c];
                    worst = fmax(worst, fabs(x - r[c]) / r[c]);
                    lo = fmin(lo, x), hi = fmax(hi, x);
                }
                spread = fmax(spread, hi / lo);
            }
        print_message("%s: channel weights within %.2e of the double-precision reference (largest/smallest %.2f)\n", archs[a], worst,
                      spread);
        assert_true(worst < 1e-5);
        assert_true(spread > 1.05); /* the weights do differ between channels */
        free(w), free(r);
        tern_model_free(m);
    }
}

int main(void) {
    tiny_tmp_path(model_path, sizeof model_path, "pcache-a");
    tiny_tmp_path(model2_path, sizeof model2_path, "pcache-b");
    snprintf(dir, sizeof dir, "%s.dir", model_path);
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.n_layer = 3;
    if (tiny_model_write(model_path, &cfg)) return 1;
    cfg.seed += 1;
    if (tiny_model_write(model2_path, &cfg)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rc),
        cmocka_unit_test(test_lossless_roundtrip),
        cmocka_unit_test(test_steps_table),
        cmocka_unit_test(test_channel_weights),
        cmocka_unit_test(test_lossy_bound),
        cmocka_unit_test(test_rope_plane),
        cmocka_unit_test(test_cache_model),
        cmocka_unit_test(test_writer),
        cmocka_unit_test(test_lossy_model),
        cmocka_unit_test(test_quant_rows),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(model_path);
    unlink(model2_path);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) r |= 0;
    return r;
}
