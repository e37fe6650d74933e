/*
 * test_pcache.c — the prompt cache (src/model/pcache.c).
 *  - range coder (core/rc.h): bits and integers round-trip; a stream of biased bits codes within
 *    5% of its entropy (computed here from the probability); a truncated stream is noticed.
 *  - codec: lossless planes round-trip bit for bit (specials, subnormals, -0, NaN included); lossy
 *    planes stay within the bound the docs state, computed here from the input alone: per channel
 *    min(rms(plane) / div, rms(channel) / div_ch) (docs/prompt-cache.md's table, written out
 *    here), halved, plus f16 rounding; planes of one block decode in sequence with the models the
 *    encoder carried; a plane with a non-finite value comes back exactly; truncated, unknown or
 *    corrupted planes are refused or decode to some values, never out of bounds.
 *  - cache on a tiny random model: blocks stored after a prefill load into a fresh context with
 *    the same K/V bits (lossless), and the logits after the loaded prefix equal those of a context
 *    that computed the same prefix itself; a second store writes nothing new; damaged files
 *    (truncated, a flipped bit, another model's, an old format version, and with a valid CRC: a
 *    wrong token id, garbage payload, a wrong raw size) are skipped with the blocks before them
 *    still loaded.
 */
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
        const size_t n = tn_pc_plane_encode(TN_PC_LOSSLESS, 0, 4, 0, &me, x, KVD, buf);
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

/* steps per RMS, docs/prompt-cache.md's table: high 12 (plane) and 8 (channel), medium 1 and 2 */
static double expected_step(int q, const tn_fp16 *x, int ch) {
    double sp = 0, sc = 0;
    for (int i = 0; i < 16 * KVD; i++) sp += (double)tn_fp16_to_fp32(x[i]) * tn_fp16_to_fp32(x[i]);
    for (int t = 0; t < 16; t++) sc += (double)tn_fp16_to_fp32(x[t * KVD + ch]) * tn_fp16_to_fp32(x[t * KVD + ch]);
    const double dp = q == TN_PC_HIGH ? 12 : 1, dc = q == TN_PC_HIGH ? 8 : 2;
    return fmin(sqrt(sp / (16 * KVD)) / dp, sqrt(sc / 16) / dc);
}

static void test_lossy_bound(void **st) {
    (void)st;
    enum { NP = 6 }; /* planes of one block: K and V of 3 layers, coded in sequence */
    static tn_fp16 x[NP][16 * KVD], y[16 * KVD];
    static uint8_t buf[NP * 4096];
    for (int q = TN_PC_HIGH; q <= TN_PC_MEDIUM; q++)
        for (int rep = 0; rep < 10; rep++) {
            tn_pc_models me, md;
            tn_pc_models_init(&me);
            tn_pc_models_init(&md);
            size_t off = 0, ends[NP];
            for (int p = 0; p < NP; p++) {
                fill(x[p], KVD);
                off += tn_pc_plane_encode(q, p / 2, 3, p % 2, &me, x[p], KVD, buf + off);
                ends[p] = off;
                assert_true(ends[p] > (p ? ends[p - 1] : 0));
            }
            double worst = 0; /* largest error / bound */
            int differ = 0;
            off = 0;
            for (int p = 0; p < NP; p++) {
                size_t used = 0;
                assert_int_equal(tn_pc_plane_decode(buf + off, ends[NP - 1] - off, KVD, p % 2, &md, y, &used), TERN_OK);
                off += used;
                assert_int_equal(off, ends[p]);
                for (int ch = 0; ch < KVD; ch++) {
                    const double step = expected_step(q, x[p], ch) * (1 + 0x1p-20);
                    for (int t = 0; t < 16; t++) {
                        const double a = tn_fp16_to_fp32(x[p][t * KVD + ch]), b = tn_fp16_to_fp32(y[t * KVD + ch]);
                        const double bound = step / 2 + (fabs(a) + step / 2) * 0x1p-11 + 0x1p-25;
                        worst = fmax(worst, fabs(a - b) / bound);
                        differ += a != b;
                    }
                }
            }
            if (rep == 0) print_message("quality %d: worst error %.3f of the bound, %zu bytes for %d values\n", q, worst, off, NP * 16 * KVD);
            assert_true(worst <= 1.0);
            assert_true(worst > 0.2); /* the bound is not vacuous: errors reach a good part of it */
            assert_true(differ > 0);
            /* corrupted bytes: refused or decoded to some values, never out of bounds (ASan) */
            for (int k = 0; k < 50; k++) {
                uint8_t *b = buf + (size_t)(urand() * (double)ends[0]);
                *b ^= (uint8_t)(1 + urand() * 254);
                tn_pc_models_init(&md);
                size_t used = 0;
                (void)tn_pc_plane_decode(buf, ends[0], KVD, 0, &md, y, &used);
            }
        }
    /* a non-finite value: the plane is stored losslessly */
    tn_pc_models me, md;
    tn_pc_models_init(&me);
    tn_pc_models_init(&md);
    fill(x[0], KVD);
    x[0][100] = 0x7C00;
    size_t used = 0, n = tn_pc_plane_encode(TN_PC_MEDIUM, 3, 6, 1, &me, x[0], KVD, buf);
    assert_int_equal(tn_pc_plane_decode(buf, n, KVD, 1, &md, y, &used), TERN_OK);
    assert_memory_equal(x[0], y, sizeof y);
}

/* ---- the cache on a model --------------------------------------------------------------- */

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
    assert_int_equal(tn_pcache_open(m, dir, 0, TN_PC_LOSSLESS, &pc), TERN_OK);
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

static void test_cache_model(void **st) {
    (void)st;
#ifndef TERN_HAVE_ZSTD
    print_message("SKIP: built without libzstd: no prompt cache\n");
    skip();
#endif
    tern_model *m = NULL;
    assert_int_equal(tern_model_load(model_path, NULL, &m), TERN_OK);
    tern_token toks[50];
    for (int i = 0; i < 50; i++) toks[i] = (tern_token)(3 + (i * 37) % 300);
    /* a: computes 50 tokens and stores blocks 0..2 */
    tern_ctx *a = new_ctx(m);
    assert_int_equal(tern_decode(a, toks, 50), TERN_OK);
    tn_pcache *pc = NULL;
    assert_int_equal(tn_pcache_open(m, dir, 0, TN_PC_LOSSLESS, &pc), TERN_OK);
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
            assert_int_equal(tn_pcache_open(m2, dir, 0, TN_PC_LOSSLESS, &pc2), TERN_OK);
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
        cmocka_unit_test(test_lossy_bound),
        cmocka_unit_test(test_cache_model),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(model_path);
    unlink(model2_path);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) r |= 0;
    return r;
}
