/*
 * test_bpe.c — the learned vocabulary loads in tern's tokenizer (model/tokenizer.h), the
 * trainer's SPM encoder (the fast path that makes training shards) gives exactly the tokens
 * tern's tokenizer gives, and detokenizing round-trips the text; byte fallback for characters
 * outside the learned alphabet; bad inputs are rejected with clear errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"
#include "train/bpe.h"

static const char *CORPUS =
    "In the beginning God created the heaven and the earth.\n"
    "And the earth was without form, and void; and darkness was upon the face of the deep.\n"
    "And the Spirit of God moved upon the face of the waters.\n\n"
    "And God said, Let there be light: and there was light.\n"
    "And God saw the light, that it was good: and God divided the light from the darkness.\n"
    "Café, naïve façade — “quoted” text with  two spaces and\ttabs.\n";

static const char *PROBES[] = {
    "In the beginning",
    "And God said, Let there be light",
    " leading space and trailing space ",
    "multiple   spaces\n\nand newlines\n",
    "unseen characters: 日本語 🙂 ßø and Cafés",
    "darknessdarkness the the the",
    "",
};

static tn_vocab *load_vocab(const tn_vocab_data *v) {
    tn_gguf_writer *w;
    assert_int_equal(tn_gguf_writer_create(&w), TERN_OK);
    assert_int_equal(tn_gguf_set_str(w, "general.architecture", "llama"), TERN_OK);
    assert_int_equal(tn_vocab_data_write(v, w), TERN_OK);
    uint8_t *buf;
    size_t n;
    assert_int_equal(tn_gguf_write_mem(w, NULL, NULL, &buf, &n), TERN_OK);
    tn_gguf_writer_free(w);
    tn_gguf *g;
    assert_int_equal(tn_gguf_parse(buf, n, &g), TERN_OK);
    tn_vocab *tv;
    assert_int_equal(tn_vocab_load(g, &tv), TERN_OK);
    tn_gguf_free(g);
    tn_free(buf);
    return tv;
}

static void test_encoder_matches_tokenizer(void **st) {
    (void)st;
    const char *texts[1] = {CORPUS};
    size_t lens[1] = {strlen(CORPUS)};
    tn_vocab_data *v;
    assert_int_equal(tn_bpe_train(texts, lens, 1, 380, &v), TERN_OK);
    assert_int_equal(v->n, 380);
    tn_vocab *tv = load_vocab(v);
    tn_spm_enc *e;
    assert_int_equal(tn_spm_enc_create(v, &e), TERN_OK);
    for (size_t p = 0; p < sizeof PROBES / sizeof PROBES[0]; p++) {
        const char *t = PROBES[p];
        size_t len = strlen(t);
        int32_t *mine = NULL;
        size_t n = 0, cap = 0;
        assert_int_equal(tn_spm_encode(e, t, len, &mine, &n, &cap), TERN_OK);
        int32_t theirs[512], cnt = 0;
        assert_int_equal(tn_tokenize(tv, t, len, false, false, theirs, 512, &cnt), TERN_OK);
        if ((size_t)cnt != n || (n && memcmp(mine, theirs, n * sizeof *mine))) {
            printf("probe %zu '%s': trainer %zu tokens, tokenizer %d\n", p, t, n, cnt);
            for (size_t i = 0; i < n || i < (size_t)cnt; i++)
                printf("  %3zu  %5d %5d\n", i, i < n ? mine[i] : -1, i < (size_t)cnt ? theirs[i] : -1);
            fail();
        }
        char back[1024];
        int32_t bl = tn_detokenize(tv, theirs, cnt, back, sizeof back, true, false);
        assert_int_equal(bl, (int32_t)len);
        assert_memory_equal(back, t, len);
        tn_free(mine);
    }
    /* the whole corpus too, paragraph by paragraph as the shard builder cuts it */
    int32_t *mine = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(tn_spm_encode(e, CORPUS, strlen(CORPUS), &mine, &n, &cap), TERN_OK);
    int32_t *theirs = malloc(4096 * sizeof *theirs), cnt;
    assert_int_equal(tn_tokenize(tv, CORPUS, strlen(CORPUS), false, false, theirs, 4096, &cnt), TERN_OK);
    assert_int_equal((int32_t)n, cnt);
    assert_memory_equal(mine, theirs, n * sizeof *mine);
    printf("corpus: %zu bytes -> %d tokens, identical in both encoders\n", strlen(CORPUS), cnt);
    free(theirs);
    tn_free(mine);
    tn_spm_enc_free(e);
    tn_vocab_free(tv);
    tn_vocab_data_free(v);
}

static void test_bad_inputs(void **st) {
    (void)st;
    tn_vocab_data *v = NULL;
    const char *empty[1] = {""};
    size_t zero[1] = {0};
    assert_int_equal(tn_bpe_train(empty, zero, 1, 300, &v), TERN_ERR_FORMAT);
    assert_null(v);
    const char *small[1] = {"ab ab"};
    size_t sl[1] = {5};
    assert_int_equal(tn_bpe_train(small, sl, 1, 4096, &v), TERN_ERR_INVALID_ARG);
    assert_non_null(strstr(tern_last_error(), "supports at most"));
    assert_int_equal(tn_bpe_train(small, sl, 1, 100, &v), TERN_ERR_INVALID_ARG);
    assert_int_equal(tn_utf8_check("ok \xC3\xA9", 5, "x"), TERN_OK);
    assert_int_equal(tn_utf8_check("bad \xC3(", 6, "x"), TERN_ERR_FORMAT);
    assert_int_equal(tn_utf8_check("\xED\xA0\x80", 3, "x"), TERN_ERR_FORMAT); /* surrogate */
    assert_int_equal(tn_utf8_check("\xC0\xAF", 2, "x"), TERN_ERR_FORMAT);     /* overlong */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encoder_matches_tokenizer),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
