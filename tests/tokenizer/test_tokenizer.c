/*
 * test_tokenizer.c — tokenizer unit tests on tiny vocabularies written with the GGUF writer, so
 * they need no files: SPM merges by score, byte fallback, space prefix, special tokens (user
 * defined always, control only with parse_special, phi-3 RSTRIP), byte-level BPE merges by
 * rank, ignore_merges, invalid UTF-8, buffers too small, invalid ids, detokenize space
 * cleaning, concurrent use, allocation failures, and malformed vocab metadata (G29/G30).
 *
 * Expected ids are worked out by hand from llama.cpp's algorithms (comments show the steps).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fmt/gguf.h"
#include "model/tokenizer.h"
#include "model/tokenizer_impl.h"

/* ---- building vocabularies ------------------------------------------------------------------ */
typedef void (*tweak_fn)(tn_gguf_writer *w);

/* SPM: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then: */
enum { S_SP = 259, S_A, S_B, S_C, S_SP_A, S_AB, S_SP_AB, S_USER, S_CTL, S_SP_C, S_N };
#define BYTE(b) (3 + (b))

static void spm_base(tn_gguf_writer *w) {
    static char bytes[256][8];
    const char *toks[S_N];
    float scores[S_N];
    int32_t types[S_N];
    toks[0] = "<unk>", types[0] = 2;
    toks[1] = "<s>", types[1] = 3;
    toks[2] = "</s>", types[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[BYTE(b)] = bytes[b];
        types[BYTE(b)] = 6;
    }
    const struct {
        int id;
        const char *t;
        float score;
        int32_t type;
    } rest[] = {
        {S_SP, "▁", -1, 1},        {S_A, "a", -2, 1},       {S_B, "b", -2, 1},
        {S_C, "c", -2, 1},                    {S_SP_A, "▁a", -1, 1},
        {S_AB, "ab", -0.5f, 1},               {S_SP_AB, "▁ab", -0.2f, 1},
        {S_USER, "<|user|>", 0, 4},           {S_CTL, "<|ctl|>", 0, 3},
        {S_SP_C, "▁c", -3, 1},
    };
    for (int i = 0; i < S_N; i++) scores[i] = 0;
    for (size_t k = 0; k < sizeof rest / sizeof *rest; k++) {
        toks[rest[k].id] = rest[k].t;
        scores[rest[k].id] = rest[k].score;
        types[rest[k].id] = rest[k].type;
    }
    assert_int_equal(tn_gguf_set_str(w, "general.architecture", "llama"), TERN_OK);
    assert_int_equal(tn_gguf_set_str(w, "tokenizer.ggml.model", "llama"), TERN_OK);
    assert_int_equal(tn_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, S_N), TERN_OK);
    assert_int_equal(tn_gguf_set_arr(w, "tokenizer.ggml.scores", TN_GGUF_F32, scores, S_N), TERN_OK);
    assert_int_equal(tn_gguf_set_arr(w, "tokenizer.ggml.token_type", TN_GGUF_I32, types, S_N), TERN_OK);
    assert_int_equal(tn_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1), TERN_OK);
    assert_int_equal(tn_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2), TERN_OK);
    assert_int_equal(tn_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 0), TERN_OK);
    assert_int_equal(tn_gguf_set_u32(w, "tokenizer.ggml.padding_token_id", 0xFFFFFFFFu), TERN_OK);
}

/* BPE: ids 0..255 are the GPT-2 characters of bytes 0..255, then: */
enum { B_HE = 256, B_LL, B_HELL, B_GW, B_GWO, B_EOT, B_USER, B_HELLO, B_N };

static void bpe_base(tn_gguf_writer *w) {
    static char chars[256][8];
    const char *toks[B_N];
    int32_t types[B_N];
    for (int b = 0; b < 256; b++) {
        size_t m = tn_utf8_encode(tn_byte_to_cp((uint8_t)b), chars[b]);
        chars[b][m] = 0;
        toks[b] = chars[b];
        types[b] = 1;
    }
    toks[B_HE] = "he", toks[B_LL] = "ll", toks[B_HELL] = "hell", toks[B_GW] = "\xc4\xa0w", toks[B_GWO] = "\xc4\xa0wo";
    toks[B_EOT] = "<|endoftext|>", toks[B_USER] = "<|u|>", toks[B_HELLO] = "hello";
    for (int i = 256; i < B_N; i++) types[i] = 1;
    types[B_EOT] = 3;
    types[B_USER] = 4;
    static const char *const merges[] = {"h e", "l l", "he ll", "\xc4\xa0 w", "\xc4\xa0w o"};
    assert_int_equal(tn_gguf_set_str(w, "tokenizer.ggml.model", "gpt2"), TERN_OK);
    assert_int_equal(tn_gguf_set_str(w, "tokenizer.ggml.pre", "gpt-2"), TERN_OK);
    assert_int_equal(tn_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, B_N), TERN_OK);
    assert_int_equal(tn_gguf_set_arr(w, "tokenizer.ggml.token_type", TN_GGUF_I32, types, B_N), TERN_OK);
    assert_int_equal(tn_gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, 5), TERN_OK);
    assert_int_equal(tn_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", B_EOT), TERN_OK);
    assert_int_equal(tn_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", B_EOT), TERN_OK);
}

/* Writes base + tweak to memory and loads the vocab; returns the status. */
static tern_status build(tweak_fn base, tweak_fn tweak, tn_vocab **out) {
    tn_gguf_writer *w = NULL;
    uint8_t *bytes = NULL;
    size_t n = 0;
    tn_gguf *g = NULL;
    assert_int_equal(tn_gguf_writer_create(&w), TERN_OK);
    base(w);
    if (tweak) tweak(w);
    assert_int_equal(tn_gguf_write_mem(w, NULL, NULL, &bytes, &n), TERN_OK);
    tn_gguf_writer_free(w);
    assert_int_equal(tn_gguf_parse(bytes, n, &g), TERN_OK);
    tern_status s = tn_vocab_load(g, out);
    tn_gguf_free(g); /* the vocab must not keep pointers into the file */
    memset(bytes, 0xAB, n);
    tn_free(bytes);
    if (s) assert_null(*out);
    return s;
}

static tn_vocab *spm(tweak_fn t) {
    tn_vocab *v = NULL;
    assert_int_equal(build(spm_base, t, &v), TERN_OK);
    return v;
}
static tn_vocab *bpe(tweak_fn t) {
    tn_vocab *v = NULL;
    assert_int_equal(build(bpe_base, t, &v), TERN_OK);
    return v;
}

/* Tokenizes and compares with the expected ids. */
static void expect_tok(const tn_vocab *v, const char *text, size_t len, bool add_special, bool parse_special, const int32_t *want,
                       int32_t n_want) {
    int32_t out[64], n = -1;
    tern_status s = tn_tokenize(v, text, len, add_special, parse_special, out, 64, &n);
    assert_int_equal(s, TERN_OK);
    if (n != n_want || (n && memcmp(out, want, (size_t)n * sizeof *out) != 0)) {
        fprintf(stderr, "text '%.*s': got", (int)len, text);
        for (int32_t i = 0; i < n; i++) fprintf(stderr, " %d", out[i]);
        fprintf(stderr, ", want");
        for (int32_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
        fail();
    }
}
#define EXPECT(v, text, add, parse, ...)                                                   \
    do {                                                                                   \
        static const int32_t w_[] = {__VA_ARGS__};                                         \
        expect_tok(v, text, sizeof(text) - 1, add, parse, w_, (int32_t)(sizeof w_ / sizeof *w_)); \
    } while (0)
#define EXPECT_NONE(v, text, add, parse) expect_tok(v, text, sizeof(text) - 1, add, parse, NULL, 0)

static void expect_detok(const tn_vocab *v, const int32_t *ids, int32_t n, bool rls, bool special, const char *want) {
    char buf[256];
    int32_t m = tn_detokenize(v, ids, n, buf, sizeof buf, rls, special);
    assert_true(m >= 0);
    buf[m] = 0;
    assert_string_equal(buf, want);
}
#define DETOK(v, rls, special, want, ...)                                        \
    do {                                                                         \
        static const int32_t i_[] = {__VA_ARGS__};                               \
        expect_detok(v, i_, (int32_t)(sizeof i_ / sizeof *i_), rls, special, want); \
    } while (0)

/* ---- SPM ------------------------------------------------------------------------------------ */
static void t_spm_basics(void **st) {
    (void)st;
    tn_vocab *v = spm(NULL);
    assert_int_equal(tn_vocab_n(v), S_N);
    assert_string_equal(tn_vocab_type_name(v), "spm");
    assert_int_equal(tn_vocab_bos(v), 1);
    assert_int_equal(tn_vocab_eos(v), 2);
    assert_int_equal(tn_vocab_unk(v), 0);
    assert_int_equal(tn_vocab_pad(v), -1); /* 0xFFFFFFFF = none */
    assert_int_equal(tn_vocab_eot(v), -1);
    assert_true(tn_vocab_add_bos(v));
    assert_false(tn_vocab_add_eos(v));
    assert_true(tn_vocab_add_space_prefix(v));
    assert_true(tn_vocab_is_eog(v, 2));
    assert_false(tn_vocab_is_eog(v, 1));
    assert_false(tn_vocab_is_eog(v, -1));
    assert_false(tn_vocab_is_eog(v, S_N));
    assert_string_equal(tn_vocab_text(v, S_AB), "ab");
    assert_null(tn_vocab_text(v, S_N));
    assert_int_equal(tn_vocab_token_type(v, BYTE(0x41)), TN_TOKEN_TYPE_BYTE);

    /* "▁ab▁c": ab (-0.5) first, then ▁ab (-0.2); ▁a (-1) is stale; then ▁c (-3) */
    EXPECT(v, "ab c", false, false, S_SP_AB, S_SP_C);
    EXPECT(v, "ab c", true, false, 1, S_SP_AB, S_SP_C);
    EXPECT_NONE(v, "", false, false);
    EXPECT(v, "", true, false, 1);
    /* leading spaces: "▁▁ab" */
    EXPECT(v, " ab", false, false, S_SP, S_SP_AB);
    DETOK(v, true, false, "ab c", S_SP_AB, S_SP_C);
    DETOK(v, false, false, " ab c", S_SP_AB, S_SP_C);
    /* a leading BOS is the "first token": nothing is stripped (llama.cpp) */
    DETOK(v, true, false, " ab c", 1, S_SP_AB, S_SP_C);
    DETOK(v, true, true, "<s> ab c", 1, S_SP_AB, S_SP_C);
    tn_vocab_free(v);
}

static void t_spm_byte_fallback(void **st) {
    (void)st;
    tn_vocab *v = spm(NULL);
    /* é = C3 A9 is no token: its bytes */
    EXPECT(v, "\xc3\xa9", false, false, S_SP, BYTE(0xC3), BYTE(0xA9));
    /* "▁a\x80": ▁a merges, the stray continuation byte falls back */
    EXPECT(v, "a\x80", false, false, S_SP_A, BYTE(0x80));
    /* a 0xFF lead byte claims up to 4 bytes as one symbol (llama.cpp): a and b become bytes too */
    EXPECT(v, "\xff" "ab", false, false, S_SP, BYTE(0xFF), BYTE('a'), BYTE('b'));
    /* NUL bytes are text like any other */
    EXPECT(v, "a\0b", false, false, S_SP_A, BYTE(0), S_B);
    /* byte pieces are single bytes; together they rebuild the text */
    char buf[8];
    assert_int_equal(tn_token_to_piece(v, BYTE(0xC3), buf, 8, false), 1);
    assert_int_equal((unsigned char)buf[0], 0xC3);
    DETOK(v, true, false, "\xc3\xa9", S_SP, BYTE(0xC3), BYTE(0xA9));
    tn_vocab_free(v);
}

static void t_spm_special(void **st) {
    (void)st;
    tn_vocab *v = spm(NULL);
    /* user-defined tokens are split out even without parse_special; text after a special token
     * gets the space prefix again */
    EXPECT(v, "a<|user|>b", false, false, S_SP_A, S_USER, S_SP, S_B);
    /* control tokens only with parse_special */
    EXPECT(v, "a<|ctl|>b", false, true, S_SP_A, S_CTL, S_SP, S_B);
    EXPECT(v, "a<|ctl|>b", false, false, S_SP_A, BYTE('<'), BYTE('|'), S_C, BYTE('t'), BYTE('l'), BYTE('|'), BYTE('>'), S_B);
    EXPECT(v, "<s>", false, true, 1);
    EXPECT(v, "<|ctl|><|ctl|>", false, true, S_CTL, S_CTL);
    /* no RSTRIP by default: the spaces stay */
    EXPECT(v, "a<|user|>  b", false, false, S_SP_A, S_USER, S_SP, S_SP, S_SP, S_B);
    /* control pieces are hidden unless special; user-defined ones are always shown */
    DETOK(v, true, false, "a b", S_SP_A, S_CTL, S_SP, S_B);
    DETOK(v, true, true, "a<|ctl|> b", S_SP_A, S_CTL, S_SP, S_B);
    DETOK(v, true, false, "a<|user|> b", S_SP_A, S_USER, S_SP, S_B);
    char buf[16];
    assert_int_equal(tn_token_to_piece(v, S_CTL, buf, 16, false), 0);
    assert_int_equal(tn_token_to_piece(v, S_CTL, buf, 16, true), 7);
    assert_int_equal(tn_token_to_piece(v, 0, buf, 16, false), 0); /* unknown: hidden */
    tn_vocab_free(v);
}

static void tweak_phi3(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_str(w, "general.name", "Phi-3 mini"), TERN_OK); }
static void tweak_eos(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", true), TERN_OK); }
static void tweak_noprefix(tn_gguf_writer *w) {
    assert_int_equal(tn_gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", false), TERN_OK);
    assert_int_equal(tn_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", false), TERN_OK);
}

static void set_tok(tn_gguf_writer *w, int id, const char *text);
static void tweak_cross(tn_gguf_writer *w) { set_tok(w, S_SP_C, "b▁"); }

static void t_spm_flags(void **st) {
    (void)st;
    tn_vocab *v = spm(tweak_phi3); /* phi-3: special tokens eat the whitespace on their right */
    EXPECT(v, "a<|user|>  b", false, false, S_SP_A, S_USER, S_SP, S_B);
    tn_vocab_free(v);
    /* a token with U+2581 inside ("b▁") disables per-word merging: "▁b▁c" -> ▁, b▁, c */
    v = spm(tweak_cross);
    EXPECT(v, "b c", false, false, S_SP, S_SP_C, S_C);
    EXPECT(v, "a b c", false, false, S_SP_A, S_SP, S_SP_C, S_C); /* "▁a▁b▁c": ▁a, then b▁ */
    tn_vocab_free(v);
    v = spm(tweak_eos);
    EXPECT(v, "ab c", true, false, 1, S_SP_AB, S_SP_C, 2);
    tn_vocab_free(v);
    v = spm(tweak_noprefix); /* "ab▁c" */
    assert_false(tn_vocab_add_space_prefix(v));
    EXPECT(v, "ab c", true, false, S_AB, S_SP_C);
    DETOK(v, true, false, " ab c", S_SP_AB, S_SP_C); /* nothing to strip without a prefix */
    tn_vocab_free(v);
}

static void t_buffers(void **st) {
    (void)st;
    tn_vocab *v = spm(NULL);
    int32_t out[4] = {-7, -7, -7, -7}, n = -1;
    assert_int_equal(tn_tokenize(v, "ab c", 4, true, false, out, 2, &n), TERN_ERR_FULL);
    assert_int_equal(n, 3);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], S_SP_AB);
    assert_int_equal(out[2], -7);
    assert_int_equal(tn_tokenize(v, "ab c", 4, true, false, NULL, 0, &n), TERN_ERR_FULL);
    assert_int_equal(n, 3);
    assert_int_equal(tn_tokenize(v, "ab c", 4, true, false, out, 3, &n), TERN_OK);
    assert_int_equal(n, 3);
    assert_int_equal(tn_tokenize(v, NULL, 0, false, false, NULL, 0, &n), TERN_OK);
    assert_int_equal(n, 0);
    assert_int_equal(tn_tokenize(v, NULL, 3, false, false, out, 4, &n), TERN_ERR_INVALID_ARG);
    assert_int_equal(tn_tokenize(v, "a", 1, false, false, out, -1, &n), TERN_ERR_INVALID_ARG);
    assert_int_equal(tn_tokenize(v, "a", 1, false, false, out, 4, NULL), TERN_ERR_INVALID_ARG);

    char buf[8] = "xxxxxxx";
    assert_int_equal(tn_token_to_piece(v, S_SP_AB, buf, 2, false), -3); /* " ab" */
    assert_int_equal(buf[0], 'x');
    assert_int_equal(tn_token_to_piece(v, S_SP_AB, NULL, 0, false), -3);
    assert_int_equal(tn_token_to_piece(v, S_SP_AB, buf, 3, false), 3);
    assert_memory_equal(buf, " ab", 3);
    static const int32_t ids[] = {S_SP_AB, S_SP_C};
    assert_int_equal(tn_detokenize(v, ids, 2, buf, 3, true, false), -4);
    assert_int_equal(tn_detokenize(v, ids, 2, NULL, 0, false, false), -5);
    assert_int_equal(tn_detokenize(v, ids, 2, buf, 4, true, false), 4);
    assert_int_equal(tn_detokenize(v, ids, 0, buf, 0, true, false), 0);
    tn_vocab_free(v);
}

static void t_invalid_ids(void **st) {
    (void)st;
    tn_vocab *v = spm(NULL);
    char buf[16];
    assert_int_equal(tn_token_to_piece(v, -1, buf, 16, true), INT32_MIN);
    assert_int_equal(tn_token_to_piece(v, S_N, buf, 16, true), INT32_MIN);
    assert_int_equal(tn_token_to_piece(v, INT32_MAX, buf, 16, true), INT32_MIN);
    static const int32_t bad[] = {S_A, S_N}, neg[] = {-5};
    assert_int_equal(tn_detokenize(v, bad, 2, buf, 16, true, false), INT32_MIN);
    assert_int_equal(tn_detokenize(v, neg, 1, buf, 16, true, false), INT32_MIN);
    assert_int_equal(tn_detokenize(v, bad, -1, buf, 16, true, false), INT32_MIN);
    tn_vocab_free(v);
}

/* ---- BPE ------------------------------------------------------------------------------------ */
static void t_bpe_basics(void **st) {
    (void)st;
    tn_vocab *v = bpe(NULL);
    assert_string_equal(tn_vocab_type_name(v), "bpe");
    assert_string_equal(tn_vocab_pre_name(v), "gpt-2");
    assert_false(tn_vocab_add_bos(v));
    assert_false(tn_vocab_add_space_prefix(v));
    assert_true(tn_vocab_is_eog(v, B_EOT));
    /* words "hello", " world" -> "hello", "Ġworld". hello: he(0), ll(1), hell(2), o.
     * Ġworld: Ġw(3), Ġwo(4), r, l, d. "hello" is a token, but gpt-2 does not ignore merges. */
    EXPECT(v, "hello world", false, false, B_HELL, 'o', B_GWO, 'r', 'l', 'd');
    EXPECT(v, "hello world", true, false, B_HELL, 'o', B_GWO, 'r', 'l', 'd'); /* no add_bos */
    DETOK(v, true, false, "hello world", B_HELL, 'o', B_GWO, 'r', 'l', 'd');
    /* bytes outside ASCII: é = C3 A9, each byte its own character token */
    EXPECT(v, "\xc3\xa9", false, false, 0xC3, 0xA9);
    /* the " ?" contraction etc.: words are "a", " ,", "b" -> a, Ġ, ',', b */
    EXPECT(v, "a ,b", false, false, 'a', ' ', ',', 'b');
    DETOK(v, true, false, "a,b", 'a', ' ', ',', 'b'); /* gpt-2 cleans " ," */
    tn_vocab_free(v);
}

static void t_bpe_invalid_utf8(void **st) {
    (void)st;
    tn_vocab *v = bpe(NULL);
    /* an invalid byte decodes to U+FFFD (EF BF BD), as in llama.cpp */
    EXPECT(v, "a\xff" "b", false, false, 'a', 0xEF, 0xBF, 0xBD, 'b');
    DETOK(v, true, false, "a\xef\xbf\xbd" "b", 'a', 0xEF, 0xBF, 0xBD, 'b');
    /* a truncated sequence: each byte becomes U+FFFD; both form one symbol word */
    EXPECT(v, "\xe2\x82", false, false, 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD);
    /* above U+10FFFF (llama.cpp throws): U+FFFD */
    EXPECT(v, "\xf7\xbf\xbf\xbf", false, false, 0xEF, 0xBF, 0xBD);
    /* surrogates and overlong forms decode as llama.cpp does (no check) */
    EXPECT(v, "\xed\xa0\x80", false, false, 0xED, 0xA0, 0x80);
    EXPECT(v, "\xc0\x80", false, false, 0x00);
    /* every single byte and random junk: no crash, no error */
    int32_t out[64], n;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        assert_int_equal(tn_tokenize(v, &c, 1, true, true, out, 64, &n), TERN_OK);
    }
    unsigned seed = 1;
    for (int k = 0; k < 2000; k++) {
        char junk[24];
        for (int i = 0; i < 24; i++) seed = seed * 1103515245u + 12345u, junk[i] = (char)(seed >> 16);
        assert_int_equal(tn_tokenize(v, junk, (size_t)(k % 24), false, k & 1, out, 64, &n), TERN_OK);
    }
    tn_vocab_free(v);
    v = spm(NULL);
    seed = 7;
    for (int k = 0; k < 2000; k++) {
        char junk[24];
        for (int i = 0; i < 24; i++) seed = seed * 1103515245u + 12345u, junk[i] = (char)(seed >> 16);
        assert_int_equal(tn_tokenize(v, junk, (size_t)(k % 24), true, k & 1, out, 64, &n), TERN_OK);
    }
    tn_vocab_free(v);
}

static void t_bpe_special(void **st) {
    (void)st;
    tn_vocab *v = bpe(NULL);
    EXPECT(v, "x<|endoftext|>y", false, true, 'x', B_EOT, 'y');
    EXPECT(v, "x<|endoftext|>y", false, false, 'x', '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|', '>', 'y');
    EXPECT(v, "a<|u|>b", false, false, 'a', B_USER, 'b');
    DETOK(v, true, false, "x", 'x', B_EOT);
    DETOK(v, true, true, "x<|endoftext|>", 'x', B_EOT);
    tn_vocab_free(v);
}

static void tweak_llama3(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_str(w, "tokenizer.ggml.pre", "llama-bpe"), TERN_OK); }
static void tweak_qwen2(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_str(w, "tokenizer.ggml.pre", "qwen2"), TERN_OK); }
static void tweak_unknown_pre(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_str(w, "tokenizer.ggml.pre", "no-such-pre"), TERN_OK); }
static void tweak_no_pre(tn_gguf_writer *w) { assert_int_equal(tn_gguf_remove(w, "tokenizer.ggml.pre"), TERN_OK); }
static void tweak_kimi(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_str(w, "tokenizer.ggml.pre", "kimi-k2"), TERN_OK); }

static int g_warnings;
static void count_warn(tern_log_level lvl, const char *msg, void *user) {
    (void)msg, (void)user;
    if (lvl == TERN_LOG_WARN) g_warnings++;
}

static void t_bpe_pre(void **st) {
    (void)st;
    tn_vocab *v = bpe(tweak_llama3); /* ignore_merges: a word that is a token comes out whole */
    assert_string_equal(tn_vocab_pre_name(v), "llama-bpe");
    assert_true(tn_vocab_add_bos(v));
    EXPECT(v, "hello world", true, false, B_EOT, B_HELLO, B_GWO, 'r', 'l', 'd');
    /* llama3 splits numbers in threes */
    EXPECT(v, "12345", false, false, '1', '2', '3', '4', '5');
    tn_vocab_free(v);

    v = bpe(tweak_qwen2); /* qwen2 keeps spaces when detokenizing */
    DETOK(v, true, false, "a ,b", 'a', ' ', ',', 'b');
    tn_vocab_free(v);

    g_warnings = 0;
    tern_set_log(count_warn, NULL);
    v = bpe(tweak_unknown_pre);
    assert_string_equal(tn_vocab_pre_name(v), "default");
    assert_true(g_warnings > 0);
    EXPECT(v, "hello world", false, false, B_HELL, 'o', B_GWO, 'r', 'l', 'd');
    tn_vocab_free(v);
    g_warnings = 0;
    v = bpe(tweak_no_pre);
    assert_string_equal(tn_vocab_pre_name(v), "default");
    assert_true(g_warnings > 0);
    tn_vocab_free(v);
    tern_set_log(NULL, NULL);

    assert_int_equal(build(bpe_base, tweak_kimi, &v), TERN_ERR_UNSUPPORTED);
    assert_non_null(strstr(tern_last_error(), "kimi-k2"));
}

/* ---- concurrency and allocation failures -------------------------------------------------- */
typedef struct th_arg {
    const tn_vocab *v;
    int ok;
} th_arg;

static void *th_main(void *p) {
    th_arg *a = p;
    static const char text[] = "Hello w\xc3\xb6rld \xe4\xbd\xa0\xe5\xa5\xbd 123 <|endoftext|> \xf0\x9f\xa6\x99!";
    int32_t first[128], out[128], n0 = 0, n = 0;
    a->ok = tn_tokenize(a->v, text, sizeof text - 1, true, true, first, 128, &n0) == TERN_OK;
    for (int k = 0; k < 200 && a->ok; k++)
        a->ok = tn_tokenize(a->v, text, sizeof text - 1, true, true, out, 128, &n) == TERN_OK && n == n0 &&
                memcmp(out, first, (size_t)n * sizeof *out) == 0;
    return NULL;
}

static void tweak_default_pre(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_str(w, "tokenizer.ggml.pre", "default"), TERN_OK); }

static void t_threads(void **st) {
    (void)st;
    tn_vocab *v = bpe(tweak_default_pre); /* the default set classifies code points lazily */
    pthread_t t[4];
    th_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i].v = v;
        assert_int_equal(pthread_create(&t[i], NULL, th_main, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_true(a[i].ok);
    }
    tn_vocab_free(v);
}

static void alloc_failures(tweak_fn base, tweak_fn tweak) {
    tn_gguf_writer *w = NULL;
    uint8_t *bytes = NULL;
    size_t n = 0;
    tn_gguf *g = NULL;
    assert_int_equal(tn_gguf_writer_create(&w), TERN_OK);
    base(w);
    if (tweak) tweak(w);
    assert_int_equal(tn_gguf_write_mem(w, NULL, NULL, &bytes, &n), TERN_OK);
    tn_gguf_writer_free(w);
    assert_int_equal(tn_gguf_parse(bytes, n, &g), TERN_OK);
    static const char text[] = "Hello w\xc3\xb6rld 123 a<|u|>b<|user|>\xff \xe4\xbd\xa0 !!";
    tn_vocab *v = NULL;
    for (uint64_t k = 1;; k++) {
        tn_alloc_fail_at(k, false);
        tern_status s = tn_vocab_load(g, &v);
        tn_alloc_fail_at(0, false);
        if (s == TERN_OK) break;
        assert_int_equal(s, TERN_ERR_NOMEM);
        assert_null(v);
        assert_true(k < 100000);
    }
    int32_t ref[128], out[128], nr = 0, no = 0;
    assert_int_equal(tn_tokenize(v, text, sizeof text - 1, true, true, ref, 128, &nr), TERN_OK);
    for (uint64_t k = 1;; k++) {
        tn_alloc_fail_at(k, false);
        tern_status s = tn_tokenize(v, text, sizeof text - 1, true, true, out, 128, &no);
        tn_alloc_fail_at(0, false);
        if (s == TERN_OK) {
            assert_int_equal(no, nr);
            assert_memory_equal(out, ref, (size_t)nr * sizeof *out);
            break;
        }
        assert_int_equal(s, TERN_ERR_NOMEM);
        assert_true(k < 100000);
    }
    tn_vocab_free(v);
    tn_gguf_free(g);
    tn_free(bytes);
}

static void t_alloc_failures(void **st) {
    (void)st;
    alloc_failures(spm_base, NULL);
    alloc_failures(bpe_base, NULL);
    alloc_failures(bpe_base, tweak_default_pre);
}

/* ---- malformed metadata (G29 / G30) --------------------------------------------------------- */
static void tw_scores_short(tn_gguf_writer *w) {
    float s[3] = {0};
    assert_int_equal(tn_gguf_set_arr(w, "tokenizer.ggml.scores", TN_GGUF_F32, s, 3), TERN_OK);
}
static void tw_scores_i8(tn_gguf_writer *w) {
    int8_t s[S_N] = {0};
    assert_int_equal(tn_gguf_set_arr(w, "tokenizer.ggml.scores", TN_GGUF_I8, s, S_N), TERN_OK);
}
static void tw_types_long(tn_gguf_writer *w) {
    int32_t t[S_N + 1];
    for (int i = 0; i <= S_N; i++) t[i] = 1;
    assert_int_equal(tn_gguf_set_arr(w, "tokenizer.ggml.token_type", TN_GGUF_I32, t, S_N + 1), TERN_OK);
}
static void tw_types_u8(tn_gguf_writer *w) {
    uint8_t t[S_N];
    memset(t, 1, sizeof t);
    assert_int_equal(tn_gguf_set_arr(w, "tokenizer.ggml.token_type", TN_GGUF_U8, t, S_N), TERN_OK);
}
static void set_type(tn_gguf_writer *w, int id, int32_t type) {
    int32_t t[S_N];
    for (int i = 0; i < S_N; i++) t[i] = 1;
    t[id] = type;
    assert_int_equal(tn_gguf_set_arr(w, "tokenizer.ggml.token_type", TN_GGUF_I32, t, S_N), TERN_OK);
}
static void tw_type_7(tn_gguf_writer *w) { set_type(w, 5, 7); }
static void tw_type_neg(tn_gguf_writer *w) { set_type(w, 5, -1); }
static void tw_type_0(tn_gguf_writer *w) { set_type(w, S_AB, 0); }
static void tw_tokens_u32(tn_gguf_writer *w) {
    uint32_t t[4] = {0};
    assert_int_equal(tn_gguf_set_arr(w, "tokenizer.ggml.tokens", TN_GGUF_U32, t, 4), TERN_OK);
}
static void tw_tokens_missing(tn_gguf_writer *w) { assert_int_equal(tn_gguf_remove(w, "tokenizer.ggml.tokens"), TERN_OK); }
static void tw_model_missing(tn_gguf_writer *w) { assert_int_equal(tn_gguf_remove(w, "tokenizer.ggml.model"), TERN_OK); }
static void tw_model_bert(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_str(w, "tokenizer.ggml.model", "bert"), TERN_OK); }
static void tw_model_weird(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_str(w, "tokenizer.ggml.model", "zorglub"), TERN_OK); }
static void tw_model_u32(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_u32(w, "tokenizer.ggml.model", 1), TERN_OK); }
static void tw_bos_big(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", S_N), TERN_OK); }
static void tw_eos_neg(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_i32(w, "tokenizer.ggml.eos_token_id", -2), TERN_OK); }
static void tw_unk_big(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_u64(w, "tokenizer.ggml.unknown_token_id", 1ull << 40), TERN_OK); }
static void tw_bos_str(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_str(w, "tokenizer.ggml.bos_token_id", "1"), TERN_OK); }
static void tw_pad_big(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_u32(w, "tokenizer.ggml.padding_token_id", 99999), TERN_OK); }
static void tw_bos_none(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_i32(w, "tokenizer.ggml.bos_token_id", -1), TERN_OK); }
static void tw_add_bos_u32(tn_gguf_writer *w) { assert_int_equal(tn_gguf_set_u32(w, "tokenizer.ggml.add_bos_token", 1), TERN_OK); }
static void set_tok(tn_gguf_writer *w, int id, const char *text) {
    static char bytes[256][8];
    const char *toks[S_N];
    for (int b = 0; b < 256; b++) snprintf(bytes[b], 8, "<0x%02X>", b), toks[BYTE(b)] = bytes[b];
    toks[0] = "<unk>", toks[1] = "<s>", toks[2] = "</s>";
    static const char *const rest[] = {"▁", "a", "b", "c", "▁a", "ab", "▁ab", "<|user|>", "<|ctl|>",
                                       "▁c"};
    for (int i = S_SP; i < S_N; i++) toks[i] = rest[i - S_SP];
    toks[id] = text;
    assert_int_equal(tn_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, S_N), TERN_OK);
}
static void tw_byte_neg(tn_gguf_writer *w) { set_tok(w, BYTE(7), "<0x-1>"); }
static void tw_byte_zz(tn_gguf_writer *w) { set_tok(w, BYTE(7), "<0xZZ>"); }
static void tw_dup(tn_gguf_writer *w) { set_tok(w, S_C, "ab"); }
static void tw_empty(tn_gguf_writer *w) { set_tok(w, S_C, ""); }

static void tb_merge_nospace(tn_gguf_writer *w) {
    static const char *const m[] = {"h e", "ll"};
    assert_int_equal(tn_gguf_set_arr_str(w, "tokenizer.ggml.merges", m, 2), TERN_OK);
}
static void tb_merge_lead_space(tn_gguf_writer *w) {
    static const char *const m[] = {" he"};
    assert_int_equal(tn_gguf_set_arr_str(w, "tokenizer.ggml.merges", m, 1), TERN_OK);
}
static void tb_merges_missing(tn_gguf_writer *w) { assert_int_equal(tn_gguf_remove(w, "tokenizer.ggml.merges"), TERN_OK); }
static void tb_merges_u32(tn_gguf_writer *w) {
    uint32_t m[2] = {0};
    assert_int_equal(tn_gguf_set_arr(w, "tokenizer.ggml.merges", TN_GGUF_U32, m, 2), TERN_OK);
}

static void expect_bad(tweak_fn base, tweak_fn tweak, tern_status want, const char *msg_part) {
    tn_vocab *v = (tn_vocab *)(uintptr_t)1;
    tern_status s = build(base, tweak, &v);
    if (s != want || (msg_part && !strstr(tern_last_error(), msg_part)))
        fprintf(stderr, "status %d (%s), want %d with '%s'\n", s, tern_last_error(), want, msg_part ? msg_part : "");
    assert_int_equal(s, want);
    assert_null(v);
    if (msg_part) assert_non_null(strstr(tern_last_error(), msg_part));
}

static void t_malformed(void **st) {
    (void)st;
    expect_bad(spm_base, tw_scores_short, TERN_ERR_FORMAT, "tokenizer.ggml.scores");
    expect_bad(spm_base, tw_scores_i8, TERN_ERR_FORMAT, "tokenizer.ggml.scores");
    expect_bad(spm_base, tw_types_long, TERN_ERR_FORMAT, "tokenizer.ggml.token_type");
    expect_bad(spm_base, tw_types_u8, TERN_ERR_FORMAT, "tokenizer.ggml.token_type");
    expect_bad(spm_base, tw_type_7, TERN_ERR_FORMAT, "type 7");
    expect_bad(spm_base, tw_type_neg, TERN_ERR_FORMAT, "type -1");
    expect_bad(spm_base, tw_tokens_u32, TERN_ERR_FORMAT, "tokenizer.ggml.tokens");
    expect_bad(spm_base, tw_tokens_missing, TERN_ERR_FORMAT, "tokenizer.ggml.tokens");
    expect_bad(spm_base, tw_model_missing, TERN_ERR_FORMAT, "tokenizer.ggml.model");
    expect_bad(spm_base, tw_model_bert, TERN_ERR_UNSUPPORTED, "'bert'");
    expect_bad(spm_base, tw_model_weird, TERN_ERR_UNSUPPORTED, "'zorglub'");
    expect_bad(spm_base, tw_model_u32, TERN_ERR_FORMAT, "tokenizer.ggml.model");
    expect_bad(spm_base, tw_bos_big, TERN_ERR_FORMAT, "bos_token_id");
    expect_bad(spm_base, tw_eos_neg, TERN_ERR_FORMAT, "eos_token_id");
    expect_bad(spm_base, tw_unk_big, TERN_ERR_FORMAT, "unknown_token_id");
    expect_bad(spm_base, tw_bos_str, TERN_ERR_FORMAT, "bos_token_id");
    expect_bad(spm_base, tw_add_bos_u32, TERN_ERR_FORMAT, "add_bos_token");
    expect_bad(spm_base, tw_byte_neg, TERN_ERR_FORMAT, "<0x-1>");
    expect_bad(spm_base, tw_byte_zz, TERN_ERR_FORMAT, "<0xZZ>");
    expect_bad(spm_base, tw_dup, TERN_ERR_FORMAT, "same text");
    expect_bad(bpe_base, tb_merge_nospace, TERN_ERR_FORMAT, "merge 1");
    expect_bad(bpe_base, tb_merge_lead_space, TERN_ERR_FORMAT, "merge 0");
    expect_bad(bpe_base, tb_merges_missing, TERN_ERR_FORMAT, "merges");
    expect_bad(bpe_base, tb_merges_u32, TERN_ERR_FORMAT, "merges");

    /* tolerated as llama.cpp tolerates them */
    tn_vocab *v = spm(tw_pad_big); /* a bad padding id is ignored with a warning */
    assert_int_equal(tn_vocab_pad(v), -1);
    tn_vocab_free(v);
    v = spm(tw_bos_none); /* -1 = no BOS: add_bos is dropped */
    assert_int_equal(tn_vocab_bos(v), -1);
    assert_false(tn_vocab_add_bos(v));
    EXPECT(v, "ab c", true, false, S_SP_AB, S_SP_C);
    tn_vocab_free(v);
    v = spm(tw_empty); /* empty token text: renamed like llama.cpp */
    assert_string_equal(tn_vocab_text(v, S_C), "[EMPTY_262]");
    tn_vocab_free(v);
    v = spm(tw_type_0); /* type 0 (undefined) reads as normal */
    EXPECT(v, "ab", false, false, S_SP_AB);
    assert_int_equal(tn_vocab_token_type(v, S_AB), 0);
    char buf[8];
    assert_int_equal(tn_token_to_piece(v, S_AB, buf, 8, false), 2);
    tn_vocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_spm_basics),     cmocka_unit_test(t_spm_byte_fallback), cmocka_unit_test(t_spm_special),
        cmocka_unit_test(t_spm_flags),      cmocka_unit_test(t_buffers),           cmocka_unit_test(t_invalid_ids),
        cmocka_unit_test(t_bpe_basics),     cmocka_unit_test(t_bpe_invalid_utf8),  cmocka_unit_test(t_bpe_special),
        cmocka_unit_test(t_bpe_pre),        cmocka_unit_test(t_threads),           cmocka_unit_test(t_alloc_failures),
        cmocka_unit_test(t_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
