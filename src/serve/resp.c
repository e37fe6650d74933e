/*
 * resp.c — OpenAI-shaped response bodies of tern serve: the final completion / chat completion
 * object, stream chunks, usage, logprobs (chat's `logprobs.content[]` and the legacy completions'
 * `{tokens, token_logprobs, top_logprobs, text_offset}`), and error objects. It only builds JSON
 * (jansson, allocating through tern's allocator hook); http.c sends it.
 *
 * Contract: every builder returns NULL when an allocation fails, never a partial object, so the
 * caller can answer 500 instead of sending wrong data. Builders that read a request's choices are
 * called with the request's mutex held.
 */
#include <jansson.h>
#include <string.h>

#include "core/base.h"
#include "serve/serve.h"

/* Appends v to array a (v may be NULL); false on failure. jansson drops v either way. */
static bool push(json_t *a, json_t *v) { return json_array_append_new(a, v) == 0; }
/* Sets o[k] = v (v may be NULL); false on failure. */
static bool put(json_t *o, const char *k, json_t *v) { return json_object_set_new(o, k, v) == 0; }

json_t *tn_resp_error(const tn_http_err *e) {
    json_t *o = json_pack("{s:s, s:s, s:i}", "message", e->msg, "type", e->type ? e->type : "server_error", "code", e->status);
    if (!o) return NULL;
    bool ok = put(o, "param", e->param[0] ? json_string(e->param) : json_null());
    if (e->type && !strcmp(e->type, "exceed_context_size_error"))
        ok = ok && put(o, "n_prompt_tokens", json_integer(e->n_prompt)) && put(o, "n_ctx", json_integer(e->n_ctx));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return json_pack("{s:o}", "error", o);
}

json_t *tn_resp_usage(const tn_sreq *r) {
    int32_t n_gen = tn_sreq_n_gen(r);
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", r->p.n_prompt, "completion_tokens", n_gen, "total_tokens",
                     r->p.n_prompt + n_gen, "prompt_tokens_details", "cached_tokens", r->n_cached);
}

/* ---- logprobs ---------------------------------------------------------------------------------- */
/* A token as OpenAI shows it: its text (control tokens as their text; bytes that are not valid
 * UTF-8 on their own as U+FFFD) and, in *bytes, its exact bytes as a list of integers. */
static json_t *token_str(const tern_model *m, tern_token t, json_t **bytes) {
    char piece[256], clean[3 * 256 + 1];
    int32_t k = tern_token_to_piece(m, t, piece, (int32_t)sizeof piece, true);
    if (k < 0) k = 0;
    size_t o = 0;
    tn_utf8_copy(clean, &o, piece, (size_t)k, true);
    if (bytes) {
        *bytes = json_array();
        for (int32_t i = 0; *bytes && i < k; i++)
            if (!push(*bytes, json_integer((unsigned char)piece[i]))) {
                json_decref(*bytes);
                *bytes = NULL;
            }
    }
    return json_stringn(clean, o);
}

/* {"token", "logprob", "bytes"} */
static json_t *chat_lp_entry(const tern_model *m, const tn_lp *x) {
    json_t *bytes = NULL, *tok = token_str(m, x->tok, &bytes);
    if (!tok || !bytes) {
        json_decref(tok);
        json_decref(bytes);
        return NULL;
    }
    return json_pack("{s:o, s:f, s:o}", "token", tok, "logprob", (double)x->lp, "bytes", bytes);
}

/* chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]} */
static json_t *chat_logprobs(const tern_model *m, const tn_sreq *r, const tn_choice *c, int32_t from, int32_t to) {
    size_t w = 1 + (size_t)r->p.top_logprobs;
    json_t *content = json_array();
    bool ok = content != NULL;
    for (int32_t i = from; ok && i < to; i++) {
        const tn_lp *x = c->lp + (size_t)i * w;
        json_t *e = chat_lp_entry(m, x);
        ok = put(e, "top_logprobs", json_array()); /* consumes the array even when e is NULL */
        json_t *top = ok ? json_object_get(e, "top_logprobs") : NULL;
        for (int j = 1; ok && j <= r->p.top_logprobs; j++) ok = push(top, chat_lp_entry(m, x + j));
        ok = push(content, e) && ok; /* consumes e */
    }
    if (!ok) {
        json_decref(content);
        return NULL;
    }
    return json_pack("{s:o}", "content", content);
}

/* One legacy entry: the token, its logprob, {token: logprob} of it and the top ones, its
 * text_offset; x == NULL for the prompt's first token (nothing before it: nulls). */
static bool legacy_entry(const tern_model *m, json_t *o, tern_token t, const tn_lp *x, size_t w, int32_t off) {
    json_t *toks = json_object_get(o, "tokens"), *lps = json_object_get(o, "token_logprobs"),
           *tops = json_object_get(o, "top_logprobs"), *offs = json_object_get(o, "text_offset");
    json_t *top = x ? json_object() : json_null();
    bool ok = push(toks, token_str(m, t, NULL)) && push(lps, x ? json_real(x->lp) : json_null()) &&
              push(offs, json_integer(off)) && top;
    for (size_t j = 0; ok && x && j < w; j++) {
        json_t *k = token_str(m, x[j].tok, NULL);
        ok = k && put(top, json_string_value(k), json_real(x[j].lp));
        json_decref(k);
    }
    return push(tops, top) && ok;
}

/* completions (legacy): {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}] (the
 * sampled token and the top_logprobs most likely), "text_offset" (characters)}; with echo, the
 * prompt's tokens first when prompt is set (the first with null logprobs, as OpenAI does) and
 * the generated ones' offsets after the prompt text. */
static json_t *legacy_logprobs(const tern_model *m, const tn_sreq *r, const tn_choice *c, int32_t from, int32_t to,
                               bool prompt) {
    size_t w = 1 + (size_t)r->p.top_logprobs;
    json_t *o = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
    if (!o) return NULL;
    bool ok = true;
    for (int32_t i = 0; ok && prompt && r->plp && i < r->p.n_prompt; i++)
        ok = legacy_entry(m, o, r->p.prompt[i], i ? r->plp + (size_t)i * w : NULL, w, r->p.prompt_off[i]);
    int32_t base = r->p.echo ? r->p.echo_chars : 0;
    for (int32_t i = from; ok && i < to; i++) {
        const tn_lp *x = c->lp + (size_t)i * w;
        ok = legacy_entry(m, o, x->tok, x, w, base + c->lp_off[i]);
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *tn_resp_logprobs(const tern_model *m, const tn_sreq *r, int ci, int32_t from, int32_t to) {
    if (!r->p.logprobs) return json_null();
    const tn_choice *c = &r->ch[ci];
    if (to > c->n_lp) to = c->n_lp;
    if (from > to) from = to;
    return r->p.kind == TN_REQ_CHAT ? chat_logprobs(m, r, c, from, to) : legacy_logprobs(m, r, c, from, to, false);
}

json_t *tn_resp_echo_logprobs(const tern_model *m, const tn_sreq *r) {
    if (!r->p.logprobs || !r->plp) return json_null();
    return legacy_logprobs(m, r, &r->ch[0], 0, 0, true);
}

/* ---- completion objects -------------------------------------------------------------------------- */
/* Mean log-probability per sampled token: how best_of ranks its candidates. */
static double mean_lp(const tn_choice *c) { return c->n_lp_sum > 0 ? c->lp_sum / c->n_lp_sum : -1e300; }

/* The choices to return in order: all of them, or with best_of the n_return with the highest
 * mean token logprob, best first (the lower index first on ties). */
static int pick_choices(const tn_sreq *r, int *ord) {
    int n = r->p.n, k = r->p.n_return > 0 && r->p.n_return < n ? r->p.n_return : n;
    for (int i = 0; i < n; i++) ord[i] = i;
    if (k == n) return n;
    for (int i = 1; i < n; i++) { /* stable insertion sort, descending */
        int x = ord[i], j = i;
        for (; j > 0 && mean_lp(&r->ch[ord[j - 1]]) < mean_lp(&r->ch[x]); j--) ord[j] = ord[j - 1];
        ord[j] = x;
    }
    return k;
}

/* A completions choice whose text is the prompt's then the output's (takes lp). */
static json_t *echo_choice(int index, const tn_sreq *r, const tn_choice *c, json_t *lp) {
    size_t n = r->p.echo_len + c->out_len;
    char *text = tn_malloc(n + 1);
    if (!text || !lp) {
        tn_free(text);
        json_decref(lp);
        return NULL;
    }
    memcpy(text, r->p.echo_text, r->p.echo_len);
    if (c->out_len) memcpy(text + r->p.echo_len, c->out, c->out_len);
    json_t *choice = json_pack("{s:i, s:s%, s:o, s:s}", "index", index, "text", text, n, "logprobs", lp, "finish_reason",
                               c->finish ? c->finish : "stop");
    tn_free(text);
    return choice;
}

json_t *tn_resp_final(const tern_model *m, const char *model_id, const tn_sreq *r) {
    bool chat = r->p.kind == TN_REQ_CHAT;
    json_t *choices = json_array();
    bool ok = choices != NULL;
    int ord[TN_SRV_MAX_N], n_ret = pick_choices(r, ord);
    for (int k = 0; ok && k < n_ret; k++) {
        int i = ord[k];
        const tn_choice *c = &r->ch[i];
        const char *text = c->out ? c->out : "";
        json_t *lp = tn_resp_logprobs(m, r, i, 0, c->n_lp), *choice;
        if (r->p.echo && !chat) { /* the prompt's text (and logprobs) first */
            json_decref(lp);
            lp = r->p.logprobs ? legacy_logprobs(m, r, c, 0, c->n_lp, true) : json_null();
            choice = echo_choice(k, r, c, lp);
        } else if (chat)
            choice = json_pack("{s:i, s:{s:s, s:s%}, s:o, s:s}", "index", k, "message", "role", "assistant", "content", text,
                               c->out_len, "logprobs", lp, "finish_reason", c->finish ? c->finish : "stop");
        else
            choice = json_pack("{s:i, s:s%, s:o, s:s}", "index", k, "text", text, c->out_len, "logprobs", lp, "finish_reason",
                               c->finish ? c->finish : "stop");
        ok = push(choices, choice);
    }
    if (!ok) {
        json_decref(choices);
        return NULL;
    }
    int32_t n_gen = tn_sreq_n_gen(r);
    double pms = (r->t_first > 0 ? r->t_first - r->t_admit : 0) * 1e3, gms = (r->t_done - r->t_first) * 1e3;
    json_t *timings = json_pack("{s:i, s:f, s:i, s:f, s:i}", "prompt_n", r->p.n_prompt - r->n_cached, "prompt_ms", pms,
                                "predicted_n", n_gen, "predicted_ms", gms > 0 ? gms : 0.0, "cache_n", r->n_cached);
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:o}", "id", r->id, "object", chat ? "chat.completion" : "text_completion",
                     "created", (json_int_t)r->created, "model", model_id, "choices", choices, "usage", tn_resp_usage(r),
                     "timings", timings);
}

json_t *tn_resp_chunk(const char *model_id, const tn_sreq *r, int ci, json_t *delta_or_text, json_t *logprobs,
                      const char *finish) {
    bool chat = r->p.kind == TN_REQ_CHAT;
    json_t *choice = json_pack("{s:i, s:o, s:o, s:o}", "index", ci, chat ? "delta" : "text", delta_or_text, "logprobs",
                               logprobs ? logprobs : json_null(), "finish_reason", finish ? json_string(finish) : json_null());
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", r->id, "object", chat ? "chat.completion.chunk" : "text_completion",
                          "created", (json_int_t)r->created, "model", model_id, "choices", choice);
    if (j && r->p.include_usage && !put(j, "usage", json_null())) {
        json_decref(j);
        return NULL;
    }
    return j;
}

json_t *tn_resp_usage_chunk(const char *model_id, const tn_sreq *r) {
    bool chat = r->p.kind == TN_REQ_CHAT;
    return json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", r->id, "object", chat ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)r->created, "model", model_id, "choices", "usage", tn_resp_usage(r));
}
