/*
 * test_serve.c — unit tests of the server library without HTTP: the KV block manager and prefix
 * cache (kv.c), request validation (req.c) against the tiny test model, chat templates (chat.c),
 * UTF-8 sanitising of streamed text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "serve/kv.h"
#include "serve/serve.h"

/* ---- KV blocks ------------------------------------------------------------------------------- */
static void test_kv_alloc_release(void **state) {
    (void)state;
    tn_kv kv;
    assert_int_equal(tn_kv_init(&kv, 4), TERN_OK);
    assert_int_equal(tn_kv_available(&kv), 4);
    assert_true(tn_kv_reserve(&kv, 3));
    assert_int_equal(tn_kv_available(&kv), 1);
    assert_false(tn_kv_reserve(&kv, 2));
    int32_t a = tn_kv_alloc(&kv, true), b = tn_kv_alloc(&kv, true), c = tn_kv_alloc(&kv, true);
    assert_true(a >= 0 && b >= 0 && c >= 0 && a != b && b != c && a != c);
    assert_int_equal(tn_kv_used(&kv), 3);
    int32_t d = tn_kv_alloc(&kv, false);
    assert_true(d >= 0);
    assert_int_equal(tn_kv_alloc(&kv, false), -1); /* exhausted */
    tn_kv_release(&kv, a);
    tn_kv_release(&kv, b);
    assert_int_equal(tn_kv_available(&kv), 2);
    tn_kv_release(&kv, b); /* double release is ignored */
    assert_int_equal(tn_kv_available(&kv), 2);
    tn_kv_release(&kv, c);
    tn_kv_release(&kv, d);
    assert_int_equal(tn_kv_used(&kv), 0);
    tn_kv_free(&kv);
}

static void fill(tern_token *t, int base) {
    for (int i = 0; i < TN_KVB; i++) t[i] = base + i;
}

static void test_kv_prefix_cache(void **state) {
    (void)state;
    tn_kv kv;
    assert_int_equal(tn_kv_init(&kv, 8), TERN_OK);
    tern_token b0[TN_KVB], b1[TN_KVB], other[TN_KVB];
    fill(b0, 100), fill(b1, 200), fill(other, 300);
    /* sequence A computes two blocks and publishes them */
    int32_t a0 = tn_kv_alloc(&kv, false), a1 = tn_kv_alloc(&kv, false);
    tn_kv_publish(&kv, a0, -1, 0, b0);
    uint64_t h0 = tn_kv_hash(0, b0);
    tn_kv_publish(&kv, a1, a0, h0, b1);
    /* sequence B with the same prefix shares both blocks */
    assert_int_equal(tn_kv_lookup(&kv, -1, 0, b0), a0);
    assert_int_equal(tn_kv_lookup(&kv, a0, h0, b1), a1);
    assert_int_equal(kv.b[a0].ref, 2);
    /* a different first block, or the right tokens under the wrong parent, miss */
    assert_int_equal(tn_kv_lookup(&kv, -1, 0, other), -1);
    assert_int_equal(tn_kv_lookup(&kv, -1, 0, b1), -1);
    assert_int_equal(tn_kv_lookup(&kv, a1, tn_kv_hash(h0, b1), b1), -1);
    /* both leave: blocks become cached (evictable), not free, and can be revived */
    for (int i = 0; i < 2; i++) {
        tn_kv_release(&kv, a0);
        tn_kv_release(&kv, a1);
    }
    assert_int_equal(tn_kv_used(&kv), 0);
    assert_int_equal(kv.n_cached, 2);
    assert_int_equal(tn_kv_available(&kv), 8);
    assert_int_equal(tn_kv_lookup(&kv, -1, 0, b0), a0);
    assert_int_equal(kv.n_cached, 1);
    tn_kv_release(&kv, a0);
    /* filling the pool evicts cached blocks (LRU) and unpublishes them */
    int32_t ids[8];
    for (int i = 0; i < 8; i++) assert_true((ids[i] = tn_kv_alloc(&kv, false)) >= 0);
    assert_int_equal(kv.n_cached, 0);
    assert_int_equal(tn_kv_lookup(&kv, -1, 0, b0), -1);
    for (int i = 0; i < 8; i++) tn_kv_release(&kv, ids[i]);
    tn_kv_free(&kv);
}

static void test_kv_revive_respects_reservations(void **state) {
    (void)state;
    tn_kv kv;
    assert_int_equal(tn_kv_init(&kv, 2), TERN_OK);
    tern_token b0[TN_KVB];
    fill(b0, 7);
    int32_t a = tn_kv_alloc(&kv, false);
    tn_kv_publish(&kv, a, -1, 0, b0);
    tn_kv_release(&kv, a); /* cached */
    assert_true(tn_kv_reserve(&kv, 2)); /* someone was promised every block */
    assert_int_equal(tn_kv_lookup(&kv, -1, 0, b0), -1); /* reviving would break the promise */
    assert_true(tn_kv_alloc(&kv, true) >= 0);
    assert_true(tn_kv_alloc(&kv, true) >= 0); /* evicts the cached block */
    tn_kv_free(&kv);
}

/* ---- chat templates, JSON depth, UTF-8 ------------------------------------------------------- */
static void test_chat_templates(void **state) {
    (void)state;
    assert_int_equal(tn_chat_detect(NULL), TN_CHAT_CHATML);
    assert_int_equal(tn_chat_detect("{% for m in messages %}<|start_header_id|>{{m.role}}<|end_header_id|>{{m.content}}<|eot_id|>"), TN_CHAT_LLAMA3);
    assert_int_equal(tn_chat_detect("{{ bos_token }}[INST] {{ m }} [/INST]"), TN_CHAT_LLAMA2);
    assert_int_equal(tn_chat_detect("<|im_start|>{{ ''.__class__ }}"), TN_CHAT_CHATML);
    tn_chat_msg m[] = {{"system", "S", 1}, {"user", "U", 1}, {"assistant", "A", 1}, {"user", "V", 1}};
    size_t len;
    char *s = tn_chat_render(TN_CHAT_CHATML, m, 4, &len);
    assert_string_equal(s, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
                           "<|im_start|>user\nV<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    s = tn_chat_render(TN_CHAT_LLAMA3, m, 2, &len);
    assert_string_equal(s, "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(s);
    s = tn_chat_render(TN_CHAT_LLAMA2, m, 4, &len);
    assert_string_equal(s, "[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A </s><s>[INST] V [/INST]");
    free(s);
}

static void test_json_depth(void **state) {
    (void)state;
    assert_int_equal(tn_json_depth("{\"a\":[1,{\"b\":2}]}", 17), 3);
    assert_int_equal(tn_json_depth("{\"a\":\"[[[[\\\"[[\"}", 16), 1);
}

static void test_utf8(void **state) {
    (void)state;
    char out[64];
    size_t o = 0;
    /* complete sequences pass; a trailing partial one waits unless final */
    assert_int_equal(tn_utf8_copy(out, &o, "a\xC3\xA9\xE2\x82", 5, false), 3);
    assert_string_equal(out, "a\xC3\xA9");
    o = 0;
    assert_int_equal(tn_utf8_copy(out, &o, "\xE2\x82", 2, true), 2);
    assert_string_equal(out, "\xEF\xBF\xBD"); /* one U+FFFD for the maximal subpart */
    o = 0;
    tn_utf8_copy(out, &o, "\xFFx\xED\xA0\x80", 5, true); /* bad byte; a surrogate */
    assert_string_equal(out, "\xEF\xBF\xBDx\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

/* ---- request validation (needs the tiny model) --------------------------------------------------- */
static tern_model *g_model;

static bool parse(const char *body, int kind, tn_req_params *p, tn_http_err *e) {
    tn_req_env env = {g_model, TN_CHAT_CHATML, 128, tern_model_n_vocab(g_model)};
    return tn_req_parse(body, strlen(body), kind, &env, p, e);
}

static void expect_400(const char *body, int kind, const char *param) {
    tn_req_params p;
    tn_http_err e;
    bool ok = parse(body, kind, &p, &e);
    if (ok) fail_msg("accepted: %s", body);
    assert_int_equal(e.status, 400);
    if (param) assert_string_equal(e.param, param);
}

static void test_req_valid(void **state) {
    (void)state;
    if (!g_model) skip();
    tn_req_params p;
    tn_http_err e;
    assert_true(parse("{\"prompt\":\"hello\",\"max_tokens\":5,\"temperature\":0,\"stop\":[\"a\",\"\"],\"logit_bias\":{\"3\":-100},"
                      "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"unknown_field\":{\"x\":1}}",
                      TN_REQ_COMPLETION, &p, &e));
    assert_true(p.n_prompt > 1);
    assert_int_equal(p.max_tokens, 5);
    assert_int_equal(p.n_stop, 1); /* empty stop ignored */
    assert_int_equal(p.n_bias, 1);
    assert_true(p.stream && p.include_usage);
    assert_true(p.sp.temp == 0.0f);
    tn_req_params_free(&p);
    /* max_tokens is clamped to the context */
    assert_true(parse("{\"prompt\":[1,2,3],\"max_tokens\":100000}", TN_REQ_COMPLETION, &p, &e));
    assert_int_equal(p.n_prompt, 3);
    assert_int_equal(p.max_tokens, 125);
    tn_req_params_free(&p);
    assert_true(parse("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}]}", TN_REQ_CHAT, &p, &e));
    tn_req_params_free(&p);
}

static void test_req_invalid(void **state) {
    (void)state;
    if (!g_model) skip();
    expect_400("nope", TN_REQ_COMPLETION, NULL);
    expect_400("[1]", TN_REQ_COMPLETION, NULL);
    expect_400("{\"prompt\":\"x\",\"max_tokens\":\"3\"}", TN_REQ_COMPLETION, "max_tokens");
    expect_400("{\"prompt\":\"x\",\"max_tokens\":0}", TN_REQ_COMPLETION, "max_tokens");
    expect_400("{\"prompt\":\"x\",\"temperature\":3}", TN_REQ_COMPLETION, "temperature");
    expect_400("{\"prompt\":\"x\",\"top_p\":0}", TN_REQ_COMPLETION, "top_p");
    expect_400("{\"prompt\":\"x\",\"top_k\":-1}", TN_REQ_COMPLETION, "top_k");
    expect_400("{\"prompt\":\"x\",\"n\":2}", TN_REQ_COMPLETION, "n");
    expect_400("{\"prompt\":\"x\",\"seed\":-1}", TN_REQ_COMPLETION, "seed");
    expect_400("{\"prompt\":\"x\",\"stream\":1}", TN_REQ_COMPLETION, "stream");
    expect_400("{\"prompt\":\"x\",\"stop\":[1]}", TN_REQ_COMPLETION, "stop");
    expect_400("{\"prompt\":\"x\",\"logit_bias\":{\"abc\":1}}", TN_REQ_COMPLETION, "logit_bias");
    expect_400("{\"prompt\":\"x\",\"logit_bias\":{\"1\":101}}", TN_REQ_COMPLETION, "logit_bias");
    expect_400("{\"prompt\":\"x\",\"logit_bias\":{\"512\":1}}", TN_REQ_COMPLETION, "logit_bias");
    expect_400("{\"prompt\":[1,512]}", TN_REQ_COMPLETION, "prompt");
    expect_400("{\"prompt\":[]}", TN_REQ_COMPLETION, "prompt");
    expect_400("{\"prompt\":{}}", TN_REQ_COMPLETION, "prompt");
    expect_400("{\"max_tokens\":3}", TN_REQ_COMPLETION, "prompt");
    expect_400("{\"messages\":[]}", TN_REQ_CHAT, "messages");
    expect_400("{\"messages\":[{\"role\":\"user\"}]}", TN_REQ_CHAT, "messages");
    expect_400("{\"messages\":[{\"role\":\"root\",\"content\":\"x\"}]}", TN_REQ_CHAT, "messages");
    expect_400("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", TN_REQ_CHAT, "messages");
    char deep[400];
    memset(deep, '[', 200);
    memset(deep + 200, ']', 199);
    deep[399] = 0;
    expect_400(deep, TN_REQ_COMPLETION, NULL);
    /* prompt longer than the context */
    char big[2048];
    snprintf(big, sizeof big, "{\"prompt\":\"%0*d\"}", 1000, 0);
    tn_req_params p;
    tn_http_err e;
    assert_false(parse(big, TN_REQ_COMPLETION, &p, &e));
    assert_string_equal(e.type, "exceed_context_size_error");
}

int main(void) {
    const char *tmp = getenv("TERN_TEST_TMP");
    char path[4096];
    snprintf(path, sizeof path, "%s/tiny-q8_0.gguf", tmp ? tmp : ".");
    tern_model_params mp;
    tern_model_params_init(&mp);
    if (tern_model_load(path, &mp, &g_model)) g_model = NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_alloc_release), cmocka_unit_test(test_kv_prefix_cache),
        cmocka_unit_test(test_kv_revive_respects_reservations), cmocka_unit_test(test_chat_templates),
        cmocka_unit_test(test_json_depth), cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_req_valid), cmocka_unit_test(test_req_invalid),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tern_model_free(g_model);
    return rc;
}
