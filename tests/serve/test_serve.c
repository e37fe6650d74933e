/*
 * test_serve.c — unit tests of the server library without HTTP: the KV block manager and prefix
 * cache (kv.c), request validation (req.c) against the tiny test model, chat templates (chat.c),
 * UTF-8 sanitising of streamed text, allocation-failure sweeps over request parsing, and the
 * engine driven in-process (n choices, seeds, logprobs against tern_get_logits, penalties).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>
#include <math.h>

#include "core/base.h"
#include "model/chat.h"
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

/* tn_kv_find takes no reference; tn_kv_forget frees a cached block (slot erase) and refuses one
 * in use or never published */
static void test_kv_find_forget(void **state) {
    (void)state;
    tn_kv kv;
    assert_int_equal(tn_kv_init(&kv, 4), TERN_OK);
    tern_token b0[TN_KVB], b1[TN_KVB];
    fill(b0, 11), fill(b1, 12);
    int32_t a0 = tn_kv_alloc(&kv, false), a1 = tn_kv_alloc(&kv, false), priv = tn_kv_alloc(&kv, false);
    tn_kv_publish(&kv, a0, -1, 0, b0);
    tn_kv_publish(&kv, a1, a0, tn_kv_hash(0, b0), b1);
    assert_int_equal(tn_kv_find(&kv, -1, 0, b0), a0);
    assert_int_equal(tn_kv_find(&kv, a0, tn_kv_hash(0, b0), b1), a1);
    assert_int_equal(tn_kv_find(&kv, -1, 0, b1), -1);
    assert_int_equal(kv.b[a0].ref, 1); /* find took nothing */
    assert_false(tn_kv_forget(&kv, a0)); /* in use */
    assert_false(tn_kv_forget(&kv, priv)); /* not published */
    tn_kv_release(&kv, a0), tn_kv_release(&kv, a1), tn_kv_release(&kv, priv);
    assert_int_equal(kv.n_cached, 2);
    assert_int_equal(kv.n_free, 2);
    assert_true(tn_kv_forget(&kv, a1));
    assert_false(tn_kv_forget(&kv, a1)); /* already free */
    assert_int_equal(kv.n_cached, 1);
    assert_int_equal(kv.n_free, 3);
    assert_int_equal(tn_kv_find(&kv, a0, tn_kv_hash(0, b0), b1), -1);
    assert_int_equal(tn_kv_lookup(&kv, -1, 0, b0), a0); /* the other one is still cached */
    tn_kv_release(&kv, a0);
    assert_true(tn_kv_forget(&kv, a0));
    assert_int_equal(tn_kv_available(&kv), 4);
    int32_t ids[4]; /* every block can be handed out again, each once */
    for (int i = 0; i < 4; i++) assert_true((ids[i] = tn_kv_alloc(&kv, false)) >= 0);
    assert_int_equal(tn_kv_alloc(&kv, false), -1);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < i; j++) assert_int_not_equal(ids[i], ids[j]);
    tn_kv_free(&kv);
}

/* ---- chat templates, JSON depth, UTF-8 ------------------------------------------------------- */
#define DETECT(jinja) tn_chat_detect(jinja, strlen(jinja), NULL, NULL)
static void test_chat_templates(void **state) {
    (void)state;
    assert_int_equal(tn_chat_detect(NULL, 0, NULL, NULL), TERN_CHAT_CHATML);
    assert_int_equal(DETECT("{% for m in messages %}<|start_header_id|>{{m.role}}<|end_header_id|>{{m.content}}<|eot_id|>"), TERN_CHAT_LLAMA3);
    assert_int_equal(DETECT("{{ bos_token }}[INST] {{ m }} [/INST]"), TERN_CHAT_LLAMA2);
    assert_int_equal(DETECT("<|im_start|>{{ ''.__class__ }}"), TERN_CHAT_CHATML);
    tern_chat_msg m[] = {{"system", "S", 1}, {"user", "U", 1}, {"assistant", "A", 1}, {"user", "V", 1}};
    size_t len;
    char *s = tn_chat_render(TERN_CHAT_CHATML, m, 4, true, &len);
    assert_string_equal(s, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
                           "<|im_start|>user\nV<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    s = tn_chat_render(TERN_CHAT_LLAMA3, m, 2, true, &len);
    assert_string_equal(s, "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(s);
    s = tn_chat_render(TERN_CHAT_LLAMA2, m, 4, true, &len);
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
    tn_req_env env = {g_model, TERN_CHAT_CHATML, 128, tern_model_n_vocab(g_model)};
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
    assert_int_equal(p.n, 1);
    assert_false(p.logprobs);
    tn_req_params_free(&p);
    /* n, logprobs in both shapes, penalties */
    assert_true(parse("{\"prompt\":\"x\",\"n\":16,\"logprobs\":5,\"presence_penalty\":-2,\"frequency_penalty\":1.5}", TN_REQ_COMPLETION,
                      &p, &e));
    assert_int_equal(p.n, 16);
    assert_true(p.logprobs);
    assert_int_equal(p.top_logprobs, 5);
    assert_true(p.presence_penalty == -2.0f && p.frequency_penalty == 1.5f);
    tn_req_params_free(&p);
    assert_true(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":20}", TN_REQ_CHAT, &p,
                      &e));
    assert_true(p.logprobs);
    assert_int_equal(p.top_logprobs, 20);
    tn_req_params_free(&p);
    assert_true(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":false,\"top_logprobs\":0}", TN_REQ_CHAT, &p,
                      &e));
    assert_false(p.logprobs);
    tn_req_params_free(&p);
}

/* Every allocation of a request's parsing failing in turn (jansson's too): each failure is a 500
 * "server_error", never a crash, a wrong 400 or a leak (LSan in the ASan build). */
static void test_req_alloc_failures(void **state) {
    (void)state;
    if (!g_model) skip();
    tn_json_alloc_init();
    const char *bodies[] = {
        ("{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
         "\"text\":\"hello\"}]}],\"stop\":[\"a\",\"bc\"],\"logit_bias\":{\"5\":-100,\"6\":3},\"n\":2,\"logprobs\":true}"),
        "{\"prompt\":\"once upon a time\",\"max_tokens\":4,\"stop\":\"x\"}", "{\"prompt\":[1,2,3,4]}"};
    for (size_t b = 0; b < sizeof bodies / sizeof bodies[0]; b++) {
        int failed = 0;
        for (uint64_t k = 1; k < 200; k++) {
            tn_req_params p;
            tn_http_err e;
            tn_alloc_fail_at(k, false);
            uint64_t before = tn_alloc_count();
            bool ok = parse(bodies[b], b == 0 ? TN_REQ_CHAT : TN_REQ_COMPLETION, &p, &e);
            bool hit = tn_alloc_count() - before >= k; /* the failing allocation happened */
            tn_alloc_fail_at(0, false);
            if (ok) {
                tn_req_params_free(&p);
                if (!hit) break; /* every allocation of this body has been failed once */
            } else {
                if (e.status != 500) fail_msg("body %zu, allocation %llu: status %d (%s)", b, (unsigned long long)k, e.status, e.msg);
                failed++;
            }
        }
        assert_true(failed > 0);
    }
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
    expect_400("{\"prompt\":\"x\",\"n\":0}", TN_REQ_COMPLETION, "n");
    expect_400("{\"prompt\":\"x\",\"n\":17}", TN_REQ_COMPLETION, "n");
    expect_400("{\"prompt\":\"x\",\"logprobs\":6}", TN_REQ_COMPLETION, "logprobs");
    expect_400("{\"prompt\":\"x\",\"logprobs\":\"yes\"}", TN_REQ_COMPLETION, "logprobs");
    expect_400("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":3}", TN_REQ_CHAT, "logprobs");
    expect_400("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", TN_REQ_CHAT, "top_logprobs");
    expect_400("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", TN_REQ_CHAT,
               "top_logprobs");
    expect_400("{\"prompt\":\"x\",\"presence_penalty\":2.5}", TN_REQ_COMPLETION, "presence_penalty");
    expect_400("{\"prompt\":\"x\",\"frequency_penalty\":-3}", TN_REQ_COMPLETION, "frequency_penalty");
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

/* ---- the engine in-process ------------------------------------------------------------------------ */
static tn_engine *g_eng;
static tn_metrics g_met;

static tn_engine *engine(void) {
    if (!g_eng) {
        tn_serve_config cfg;
        tn_serve_config_init(&cfg);
        cfg.n_parallel = 4;
        cfg.n_threads = 1;
        cfg.quiet = true;
        tn_metrics_init(&g_met);
        assert_int_equal(tn_engine_create(g_model, &cfg, &g_met, &g_eng), TERN_OK);
    }
    return g_eng;
}

static tn_sreq *submit(const char *body, int kind) {
    tn_engine *e = engine();
    tn_sreq *r = tn_sreq_new();
    tn_http_err err;
    tn_req_env env = {g_model, TERN_CHAT_CHATML, tn_engine_n_ctx_seq(e), tern_model_n_vocab(g_model)};
    if (!tn_req_parse(body, strlen(body), kind, &env, &r->p, &err)) fail_msg("%s: %s", body, err.msg);
    assert_true(tn_sreq_choices(r));
    r->t_arrival = tn_srv_now();
    int retry;
    assert_true(tn_engine_submit(e, r, &err, &retry));
    return r;
}

static void wait_done(tn_sreq *r) {
    pthread_mutex_lock(&r->mu);
    while (r->state != TN_SREQ_DONE) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

static tn_sreq *run(const char *body) {
    tn_sreq *r = submit(body, TN_REQ_COMPLETION);
    wait_done(r);
    assert_int_equal(r->err.status, 0);
    return r;
}

/* the sampled token ids of a choice (the request asked for logprobs) */
static int choice_tokens(const tn_sreq *r, int ci, tern_token *out) {
    const tn_choice *c = &r->ch[ci];
    assert_int_equal(c->n_lp, c->n_gen);
    for (int32_t i = 0; i < c->n_lp; i++) out[i] = c->lp[(size_t)i * (1 + (size_t)r->p.top_logprobs)].tok;
    return c->n_lp;
}

/* logprobs are the log-softmax of the raw logits: checked against tern_decode + tern_get_logits
 * for the same tokens, plus the invariants (<= 0, sorted, greedy pick = top 1, sum p <= 1). */
static void test_engine_logprobs(void **state) {
    (void)state;
    if (!g_model) skip();
    tern_token prompt[] = {1, 10, 20, 30, 40};
    tn_sreq *r = run("{\"prompt\":[1,10,20,30,40],\"max_tokens\":4,\"temperature\":0,\"logprobs\":5,\"ignore_eos\":true}");
    const tn_choice *c = &r->ch[0];
    assert_int_equal(c->n_gen, 4);
    assert_int_equal(c->n_lp, 4);
    tern_ctx *ctx;
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = 64;
    cp.n_threads = 1;
    assert_int_equal(tern_ctx_create(g_model, &cp, &ctx), TERN_OK);
    assert_int_equal(tern_decode(ctx, prompt, 5), TERN_OK);
    int32_t nv = tern_model_n_vocab(g_model);
    for (int32_t i = 0; i < c->n_lp; i++) {
        const tn_lp *x = c->lp + (size_t)i * 6;
        double psum = 0;
        for (int j = 1; j <= 5; j++) {
            assert_true(x[j].lp <= 0.0f);
            if (j > 1) assert_true(x[j].lp <= x[j - 1].lp);
            psum += exp(x[j].lp);
        }
        assert_true(psum <= 1.0 + 1e-5);
        assert_int_equal(x[0].tok, x[1].tok); /* greedy: the sampled token is the most likely */
        assert_true(x[0].lp == x[1].lp);
        if (i > 0) assert_true(c->lp_off[i] > c->lp_off[i - 1] || c->lp_off[i] == c->lp_off[i - 1]);
        /* independent: log-softmax of the C API's logits for the same tokens */
        const float *lg = tern_get_logits(ctx, -1);
        assert_non_null(lg);
        double mx = lg[0], sum = 0;
        for (int32_t v = 1; v < nv; v++) mx = lg[v] > mx ? lg[v] : mx;
        for (int32_t v = 0; v < nv; v++) sum += exp(lg[v] - mx);
        double want = lg[x[0].tok] - mx - log(sum), want2 = lg[x[2].tok] - mx - log(sum);
        if (fabs(x[0].lp - want) > 2e-3 || fabs(x[2].lp - want2) > 2e-3)
            fail_msg("token %d: server logprob %.6f / %.6f, C API %.6f / %.6f", i, x[0].lp, x[2].lp, want, want2);
        assert_int_equal(tern_decode(ctx, &x[0].tok, 1), TERN_OK);
    }
    tern_ctx_free(ctx);
    tn_sreq_release(r);
}

/* n choices: greedy ones are equal; with a seed they are reproducible, choice 0 equals n = 1 with
 * that seed, and the others differ from it. usage counts every choice. */
static void test_engine_n_choices(void **state) {
    (void)state;
    if (!g_model) skip();
    tern_token a[64], b[64];
    tn_sreq *r = run("{\"prompt\":\"once upon a time\",\"n\":3,\"max_tokens\":8,\"temperature\":0,\"logprobs\":0,\"ignore_eos\":true}");
    int na = choice_tokens(r, 0, a);
    assert_int_equal(na, 8);
    for (int i = 1; i < 3; i++) {
        assert_int_equal(choice_tokens(r, i, b), na);
        assert_memory_equal(a, b, sizeof *a * (size_t)na);
        assert_string_equal(r->ch[i].out, r->ch[0].out);
    }
    assert_int_equal(tn_sreq_n_gen(r), 24);
    tn_sreq_release(r);

    const char *seeded = "{\"prompt\":\"once upon a time\",\"n\":3,\"max_tokens\":8,\"temperature\":1,\"seed\":7,\"logprobs\":0,\"ignore_eos\":true}";
    tn_sreq *r1 = run(seeded), *r2 = run(seeded);
    tn_sreq *one = run("{\"prompt\":\"once upon a time\",\"max_tokens\":8,\"temperature\":1,\"seed\":7,\"logprobs\":0,\"ignore_eos\":true}");
    for (int i = 0; i < 3; i++) {
        int n1 = choice_tokens(r1, i, a), n2 = choice_tokens(r2, i, b);
        assert_int_equal(n1, n2);
        assert_memory_equal(a, b, sizeof *a * (size_t)n1);
    }
    choice_tokens(r1, 0, a);
    choice_tokens(one, 0, b);
    assert_memory_equal(a, b, sizeof *a * 8);
    choice_tokens(r1, 1, b);
    assert_memory_not_equal(a, b, sizeof *a * 8);
    tn_sreq_release(r1);
    tn_sreq_release(r2);
    tn_sreq_release(one);
}

static int n_distinct(const tern_token *t, int n) {
    int d = 0;
    for (int i = 0; i < n; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= t[j] == t[i];
        d += !seen;
    }
    return d;
}

/* presence / frequency penalties: 0 leaves greedy output as it was; a large one forbids repeats */
static void test_engine_penalties(void **state) {
    (void)state;
    if (!g_model) skip();
    tern_token base[64], t[64];
    const char *fmt = "{\"prompt\":\"once upon a time\",\"max_tokens\":40,\"temperature\":0,\"logprobs\":0,\"ignore_eos\":true%s}";
    char body[256];
    snprintf(body, sizeof body, fmt, "");
    tn_sreq *r = run(body);
    int n = choice_tokens(r, 0, base);
    tn_sreq_release(r);
    assert_int_equal(n, 40);
    assert_true(n_distinct(base, n) < n); /* the tiny model repeats itself when greedy */
    const char *zero[] = {",\"presence_penalty\":0", ",\"frequency_penalty\":0,\"presence_penalty\":0"};
    for (int i = 0; i < 2; i++) {
        snprintf(body, sizeof body, fmt, zero[i]);
        r = run(body);
        assert_int_equal(choice_tokens(r, 0, t), n);
        assert_memory_equal(base, t, sizeof *t * (size_t)n);
        tn_sreq_release(r);
    }
    const char *big[] = {",\"presence_penalty\":2", ",\"frequency_penalty\":2"};
    for (int i = 0; i < 2; i++) {
        snprintf(body, sizeof body, fmt, big[i]);
        r = run(body);
        assert_int_equal(choice_tokens(r, 0, t), n);
        if (n_distinct(t, n) != n) fail_msg("%s: %d distinct of %d", big[i], n_distinct(t, n), n);
        tn_sreq_release(r);
    }
}

/* a cancelled request with n > 1 counts once, and every KV block and reservation comes back */
static void test_engine_cancel_n(void **state) {
    (void)state;
    if (!g_model) skip();
    engine();
    pthread_mutex_lock(&g_met.mu);
    uint64_t before = g_met.cancelled;
    pthread_mutex_unlock(&g_met.mu);
    tn_sreq *r = submit("{\"prompt\":\"once upon a time\",\"n\":6,\"max_tokens\":100,\"ignore_eos\":true}", TN_REQ_COMPLETION);
    struct timespec ts = {0, 3000000};
    nanosleep(&ts, NULL);
    atomic_store(&r->cancelled, 1);
    wait_done(r);
    tn_sreq_release(r);
    bool idle = false;
    for (int i = 0; i < 200 && !idle; i++) {
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&g_met.mu);
        idle = tn_engine_idle(g_eng) && g_met.kv_used == 0 && g_met.kv_reserved == 0 && g_met.running == 0;
        pthread_mutex_unlock(&g_met.mu);
    }
    assert_true(idle);
    pthread_mutex_lock(&g_met.mu);
    assert_int_equal(g_met.cancelled, before + 1);
    pthread_mutex_unlock(&g_met.mu);
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
        cmocka_unit_test(test_kv_revive_respects_reservations), cmocka_unit_test(test_kv_find_forget),
        cmocka_unit_test(test_chat_templates),
        cmocka_unit_test(test_json_depth), cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_req_valid), cmocka_unit_test(test_req_invalid),
        cmocka_unit_test(test_req_alloc_failures), cmocka_unit_test(test_engine_logprobs),
        cmocka_unit_test(test_engine_n_choices), cmocka_unit_test(test_engine_penalties),
        cmocka_unit_test(test_engine_cancel_n),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tn_engine_destroy(g_eng);
    if (g_eng) pthread_mutex_destroy(&g_met.mu);
    tern_model_free(g_model);
    return rc;
}
