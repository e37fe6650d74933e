/*
 * req.c — parsing and validation of completion / chat requests (OpenAI shape + llama.cpp
 * extensions). Every known field is type- and range-checked; unknown fields are ignored (clients
 * send many). Nothing unchecked reaches the engine: the output is a tn_req_params with a
 * tokenized prompt that fits the context, clamped max_tokens and validated sampler settings.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "model/chat.h"
#include "serve/serve.h"

void tn_http_err_set(tn_http_err *e, int status, const char *type, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}

#define BAD(param, ...)                                                                  \
    do {                                                                                 \
        tn_http_err_set(err, 400, "invalid_request_error", param, __VA_ARGS__);          \
        goto fail;                                                                       \
    } while (0)

/* jansson 2.14 ignores some failed allocations: its lexer drops a byte when an append to its token
 * buffer fails (and then copies a string past that buffer's end), its dumper drops bytes of object
 * keys (malformed output). So a failed allocation inside a parse or a dump is sticky (every later
 * one of that call fails too) and the call's result is thrown away: a failure is always an error,
 * never wrong JSON (both found by tests/serve/fault_test.py). Thread-local: one call at a time. */
static _Thread_local bool tn_json_oom, tn_json_scope;

static void *tn_json_malloc(size_t n) {
    if (tn_json_scope && tn_json_oom) return NULL;
    void *p = tn_malloc(n);
    if (!p) tn_json_oom = true;
    return p;
}

void tn_json_alloc_init(void) { json_set_alloc_funcs(tn_json_malloc, tn_free); }

char *tn_json_dumps(json_t *j) {
    if (!j) return NULL;
    tn_json_oom = false;
    tn_json_scope = true;
    char *s = json_dumps(j, JSON_COMPACT);
    tn_json_scope = false;
    if (s && tn_json_oom) {
        tn_free(s);
        s = NULL;
    }
    return s;
}

json_t *tn_json_parse(const char *body, size_t len, tn_http_err *err) {
    if (tn_json_depth(body, len) > TN_SRV_MAX_DEPTH) {
        tn_http_err_set(err, 400, "invalid_request_error", NULL, "JSON nesting deeper than %d", TN_SRV_MAX_DEPTH);
        return NULL;
    }
    json_error_t je;
    tn_json_oom = false;
    tn_json_scope = true;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    tn_json_scope = false;
    if (tn_json_oom) {
        json_decref(root);
        root = NULL;
        tn_http_err_set(err, 500, "server_error", NULL, "out of memory");
    } else if (!root) {
        tn_http_err_set(err, 400, "invalid_request_error", NULL, "invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
    } else if (!json_is_object(root)) {
        json_decref(root);
        root = NULL;
        tn_http_err_set(err, 400, "invalid_request_error", NULL, "the request body must be a JSON object");
    }
    return root;
}

int tn_json_depth(const char *s, size_t n) {
    int d = 0, maxd = 0;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') in_str = false;
            continue;
        }
        if (c == '"') in_str = true;
        else if (c == '[' || c == '{') {
            if (++d > maxd) maxd = d;
        } else if (c == ']' || c == '}') d--;
    }
    return maxd;
}

void tn_req_params_free(tn_req_params *p) {
    for (int i = 0; i < p->n_stop; i++) tn_free(p->stop[i]);
    tn_free(p->bias_tok);
    tn_free(p->bias_val);
    tn_free(p->prompt);
    tn_free(p->echo_text);
    tn_free(p->prompt_off);
    memset(p, 0, sizeof *p);
}

/* number field in [lo, hi]; returns false (with err) on a type or range error */
static bool get_num(json_t *o, const char *k, double lo, double hi, double *out, bool *present, tn_http_err *err) {
    json_t *v = json_object_get(o, k);
    if (present) *present = false;
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) {
        tn_http_err_set(err, 400, "invalid_request_error", k, "'%s' must be a number", k);
        return false;
    }
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) {
        tn_http_err_set(err, 400, "invalid_request_error", k, "'%s' = %g is outside [%g, %g]", k, x, lo, hi);
        return false;
    }
    *out = x;
    if (present) *present = true;
    return true;
}

static bool get_int(json_t *o, const char *k, long long lo, long long hi, long long *out, bool *present, tn_http_err *err) {
    json_t *v = json_object_get(o, k);
    if (present) *present = false;
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v)) {
        tn_http_err_set(err, 400, "invalid_request_error", k, "'%s' must be an integer", k);
        return false;
    }
    long long x = json_integer_value(v);
    if (x < lo || x > hi) {
        tn_http_err_set(err, 400, "invalid_request_error", k, "'%s' = %lld is outside [%lld, %lld]", k, x, lo, hi);
        return false;
    }
    *out = x;
    if (present) *present = true;
    return true;
}

static bool get_bool(json_t *o, const char *k, bool *out, tn_http_err *err) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        tn_http_err_set(err, 400, "invalid_request_error", k, "'%s' must be a boolean", k);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

static bool oom(tn_http_err *err) {
    tn_http_err_set(err, 500, "server_error", NULL, "out of memory");
    return false;
}

static bool tokenize(const tn_req_env *env, const char *text, size_t len, tn_req_params *p, tn_http_err *err) {
    /* a prompt can't have more tokens than bytes + a few specials; cap at the context anyway */
    int32_t cap = (int32_t)(len + 8 < (size_t)env->n_ctx_seq + 8 ? len + 8 : (size_t)env->n_ctx_seq + 8), n = 0;
    p->prompt = tn_malloc((size_t)cap * sizeof *p->prompt);
    if (!p->prompt) return oom(err);
    tern_status s = tern_tokenize(env->model, text, len, true, true, p->prompt, cap, &n);
    if (s == TERN_ERR_FULL && n > cap && n <= env->n_ctx_seq) { /* byte fallback: retry at the size asked */
        tern_token *q = tn_realloc(p->prompt, (size_t)n * sizeof *q);
        if (!q) return oom(err);
        p->prompt = q;
        cap = n;
        s = tern_tokenize(env->model, text, len, true, true, p->prompt, cap, &n);
    }
    if (s == TERN_ERR_FULL) {
        tn_http_err_set(err, 400, "exceed_context_size_error", "prompt",
                        "the request exceeds the available context size (%d tokens needed at least, context %d)", n,
                        env->n_ctx_seq);
        err->n_prompt = n;
        err->n_ctx = env->n_ctx_seq;
        return false;
    }
    if (s == TERN_ERR_NOMEM) return oom(err);
    if (s) {
        tn_http_err_set(err, 400, "invalid_request_error", "prompt", "tokenization failed: %s", tern_last_error());
        return false;
    }
    p->n_prompt = n;
    return true;
}

static bool text_of_content(json_t *c, char **out, size_t *len, tn_http_err *err, size_t idx) {
    if (json_is_string(c)) {
        *len = json_string_length(c);
        *out = tn_malloc(*len + 1);
        if (!*out) return oom(err);
        memcpy(*out, json_string_value(c), *len + 1);
        return true;
    }
    if (json_is_null(c)) {
        *out = tn_calloc(1, 1);
        *len = 0;
        return *out ? true : oom(err);
    }
    if (!json_is_array(c)) {
        tn_http_err_set(err, 400, "invalid_request_error", "messages", "messages[%zu].content must be a string or an array of text parts", idx);
        return false;
    }
    size_t tot = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *ty = json_object_get(part, "type"), *tx = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(ty) || strcmp(json_string_value(ty), "text") || !json_is_string(tx)) {
            tn_http_err_set(err, 400, "invalid_request_error", "messages",
                            "messages[%zu].content[%zu]: only {\"type\":\"text\",\"text\":...} parts are supported", idx, i);
            return false;
        }
        tot += json_string_length(tx);
    }
    *out = tn_malloc(tot + 1);
    if (!*out) return oom(err);
    *len = 0;
    json_array_foreach(c, i, part) {
        json_t *tx = json_object_get(part, "text");
        memcpy(*out + *len, json_string_value(tx), json_string_length(tx));
        *len += json_string_length(tx);
    }
    (*out)[*len] = 0;
    return true;
}

static bool parse_chat(json_t *root, const tn_req_env *env, tn_req_params *p, tn_http_err *err) {
    json_t *msgs = json_object_get(root, "messages");
    if (!msgs) {
        tn_http_err_set(err, 400, "invalid_request_error", "messages", "'messages' is required");
        return false;
    }
    if (!json_is_array(msgs)) {
        tn_http_err_set(err, 400, "invalid_request_error", "messages", "'messages' must be an array");
        return false;
    }
    size_t n = json_array_size(msgs);
    if (n == 0 || n > TN_SRV_MAX_MESSAGES) {
        tn_http_err_set(err, 400, "invalid_request_error", "messages", "'messages' must hold 1..%d messages (got %zu)",
                        TN_SRV_MAX_MESSAGES, n);
        return false;
    }
    tern_chat_msg *cm = tn_calloc(n, sizeof *cm);
    char **texts = tn_calloc(n, sizeof *texts);
    bool ok = false;
    if (!cm || !texts) {
        oom(err);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role)) {
            tn_http_err_set(err, 400, "invalid_request_error", "messages", "messages[%zu] must be an object with a string 'role'", i);
            goto out;
        }
        const char *r = json_string_value(role);
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool") && strcmp(r, "developer")) {
            tn_http_err_set(err, 400, "invalid_request_error", "messages",
                            "messages[%zu].role must be system, developer, user, assistant or tool", i);
            goto out;
        }
        json_t *c = json_object_get(m, "content");
        if (!c) {
            tn_http_err_set(err, 400, "invalid_request_error", "messages", "messages[%zu].content is required", i);
            goto out;
        }
        if (!text_of_content(c, &texts[i], &cm[i].len, err, i)) goto out;
        cm[i].role = r;
        cm[i].content = texts[i];
    }
    size_t len = 0;
    char *prompt = tn_chat_render(env->tmpl, cm, n, true, &len);
    if (!prompt) {
        oom(err);
        goto out;
    }
    ok = tokenize(env, prompt, len, p, err);
    tn_free(prompt);
out:
    if (texts)
        for (size_t i = 0; i < n; i++) tn_free(texts[i]);
    tn_free(texts);
    tn_free(cm);
    return ok;
}

static bool parse_prompt(json_t *root, const tn_req_env *env, tn_req_params *p, tn_http_err *err) {
    json_t *pr = json_object_get(root, "prompt");
    if (!pr) {
        tn_http_err_set(err, 400, "invalid_request_error", "prompt", "'prompt' is required");
        return false;
    }
    if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0))) pr = json_array_get(pr, 0);
    if (json_is_string(pr)) return tokenize(env, json_string_value(pr), json_string_length(pr), p, err);
    if (json_is_array(pr)) { /* token ids */
        size_t n = json_array_size(pr), i;
        if (n == 0) {
            tn_http_err_set(err, 400, "invalid_request_error", "prompt", "'prompt' is an empty array");
            return false;
        }
        if (n > (size_t)env->n_ctx_seq) {
            tn_http_err_set(err, 400, "exceed_context_size_error", "prompt",
                            "the request exceeds the available context size (%zu prompt tokens, context %d)", n, env->n_ctx_seq);
            err->n_prompt = (int32_t)n;
            err->n_ctx = env->n_ctx_seq;
            return false;
        }
        p->prompt = tn_malloc(n * sizeof *p->prompt);
        if (!p->prompt) return oom(err);
        json_t *v;
        json_array_foreach(pr, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= env->n_vocab) {
                tn_http_err_set(err, 400, "invalid_request_error", "prompt",
                                "prompt[%zu] must be a token id in 0..%d (or give one string)", i, env->n_vocab - 1);
                return false;
            }
            p->prompt[i] = (tern_token)json_integer_value(v);
        }
        p->n_prompt = (int32_t)n;
        return true;
    }
    tn_http_err_set(err, 400, "invalid_request_error", "prompt", "'prompt' must be a string, one-string array or token array");
    return false;
}

static int32_t n_chars(const char *s, size_t n) {
    int32_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* echo: the prompt text to put before the output (the string as given, else the detokenized
 * token ids; invalid UTF-8 as U+FFFD) and each prompt token's text_offset in it: the code points
 * of the pieces before it (special tokens render as nothing; the leading space the detokenizer
 * drops is not counted). */
static bool echo_prompt(json_t *root, const tn_req_env *env, tn_req_params *p, tn_http_err *err) {
    json_t *pr = json_object_get(root, "prompt");
    if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0))) pr = json_array_get(pr, 0);
    const char *src;
    size_t n;
    char *det = NULL;
    if (json_is_string(pr)) {
        src = json_string_value(pr);
        n = json_string_length(pr);
    } else {
        int32_t need = tern_detokenize(env->model, p->prompt, p->n_prompt, NULL, 0, true, false);
        if (need < 0) need = -need;
        det = tn_malloc((size_t)need + 1);
        int32_t k = det ? tern_detokenize(env->model, p->prompt, p->n_prompt, det, need + 1, true, false) : -1;
        if (k < 0) {
            tn_free(det);
            return oom(err);
        }
        src = det;
        n = (size_t)k;
    }
    p->echo_text = tn_malloc(3 * n + 1);
    p->prompt_off = tn_malloc((size_t)p->n_prompt * sizeof *p->prompt_off);
    if (!p->echo_text || !p->prompt_off) {
        tn_free(det);
        return oom(err);
    }
    p->echo_len = 0;
    tn_utf8_copy(p->echo_text, &p->echo_len, src, n, true);
    tn_free(det);
    p->echo_chars = n_chars(p->echo_text, p->echo_len);
    int32_t off = 0, first = -1;
    char piece[256];
    for (int32_t i = 0; i < p->n_prompt; i++) {
        p->prompt_off[i] = off;
        int32_t k = tern_token_to_piece(env->model, p->prompt[i], piece, (int32_t)sizeof piece, false);
        if (k <= 0) continue;
        if (first < 0) first = piece[0] == ' ' ? i : p->n_prompt;
        off += n_chars(piece, (size_t)k);
    }
    if (off == p->echo_chars + 1 && first >= 0 && first < p->n_prompt) /* the dropped leading space */
        for (int32_t i = first + 1; i < p->n_prompt; i++) p->prompt_off[i]--;
    return true;
}

bool tn_req_parse(const char *body, size_t len, int kind, const tn_req_env *env, tn_req_params *p, tn_http_err *err) {
    memset(p, 0, sizeof *p);
    memset(err, 0, sizeof *err);
    json_t *root = NULL;
    p->kind = kind;
    tern_sampler_params_init(&p->sp);
    p->sp.top_p = 1.0f; /* OpenAI default */
    p->sp.temp = 1.0f;
    root = tn_json_parse(body, len, err);
    if (!root) goto fail;

    json_t *model = json_object_get(root, "model");
    if (model && !json_is_string(model) && !json_is_null(model)) BAD("model", "'model' must be a string");

    if (!get_bool(root, "stream", &p->stream, err)) goto fail;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) BAD("stream_options", "'stream_options' must be an object");
        if (!get_bool(so, "include_usage", &p->include_usage, err)) goto fail;
    }
    if (!get_bool(root, "ignore_eos", &p->ignore_eos, err)) goto fail;

    double d;
    bool has;
    long long ll;
    if (!get_num(root, "temperature", 0, 2, &d, &has, err)) goto fail;
    if (has) p->sp.temp = (float)d;
    if (!get_num(root, "top_p", 0, 1, &d, &has, err)) goto fail;
    if (has) {
        if (d <= 0) BAD("top_p", "'top_p' must be in (0, 1]");
        p->sp.top_p = (float)d;
    }
    if (!get_num(root, "min_p", 0, 1, &d, &has, err)) goto fail;
    if (has) p->sp.min_p = (float)d;
    if (!get_int(root, "top_k", 0, env->n_vocab, &ll, &has, err)) goto fail;
    if (has) p->sp.top_k = (int32_t)ll;
    if (!get_num(root, "repeat_penalty", 0, 10, &d, &has, err)) goto fail;
    if (!has && !get_num(root, "repetition_penalty", 0, 10, &d, &has, err)) goto fail;
    if (has) {
        if (d <= 0) BAD("repeat_penalty", "'repeat_penalty' must be > 0");
        p->sp.repeat_penalty = (float)d;
    }
    if (!get_int(root, "repeat_last_n", 0, 1 << 20, &ll, &has, err)) goto fail;
    if (has) p->sp.repeat_last_n = (int32_t)ll;
    /* OpenAI's penalties over the tokens generated so far: logit -= f * count + p * (count > 0) */
    if (!get_num(root, "presence_penalty", -2, 2, &d, &has, err)) goto fail;
    if (has) p->presence_penalty = (float)d;
    if (!get_num(root, "frequency_penalty", -2, 2, &d, &has, err)) goto fail;
    if (has) p->frequency_penalty = (float)d;
    if (!get_int(root, "seed", 0, (long long)UINT32_MAX - 1, &ll, &has, err)) goto fail;
    if (has) p->sp.seed = (uint64_t)ll;
    p->n = 1;
    if (!get_int(root, "n", 1, TN_SRV_MAX_N, &ll, &has, err)) goto fail;
    if (has) p->n = (int)ll;
    p->n_return = p->n;
    if (kind == TN_REQ_COMPLETION) { /* best_of: generate this many, return the n most likely */
        if (!get_int(root, "best_of", 1, TN_SRV_MAX_N, &ll, &has, err)) goto fail;
        if (has && ll < p->n) BAD("best_of", "'best_of' (%lld) must be >= 'n' (%d)", ll, p->n);
        if (has && ll > p->n && p->stream) BAD("best_of", "'best_of' > 'n' cannot be streamed (the best are known at the end)");
        if (has) p->n = (int)ll;
    }
    /* logprobs: chat takes a boolean + top_logprobs 0..20; completions an integer 0..5 (legacy) */
    json_t *lp = json_object_get(root, "logprobs");
    if (lp && !json_is_null(lp)) {
        if (kind == TN_REQ_COMPLETION && json_is_integer(lp)) {
            json_int_t k = json_integer_value(lp);
            if (k < 0 || k > TN_SRV_MAX_LOGPROBS_LEGACY) BAD("logprobs", "'logprobs' must be in 0..%d", TN_SRV_MAX_LOGPROBS_LEGACY);
            p->logprobs = true;
            p->top_logprobs = (int)k;
        } else if (json_is_boolean(lp)) {
            p->logprobs = json_is_true(lp);
        } else {
            BAD("logprobs", kind == TN_REQ_CHAT ? "'logprobs' must be a boolean" : "'logprobs' must be an integer in 0..%d",
                TN_SRV_MAX_LOGPROBS_LEGACY);
        }
    }
    if (!get_int(root, "top_logprobs", 0, TN_SRV_MAX_TOP_LOGPROBS, &ll, &has, err)) goto fail;
    if (has && kind == TN_REQ_CHAT) {
        if (ll > 0 && !p->logprobs) BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
        p->top_logprobs = (int)ll;
    }
    if (!get_int(root, "n_probs", 0, TN_SRV_MAX_TOP_LOGPROBS, &ll, NULL, err)) goto fail; /* llama.cpp native: ignored */

    long long max_tokens = -1;
    if (!get_int(root, "max_tokens", 1, INT32_MAX, &ll, &has, err)) goto fail;
    if (has) max_tokens = ll;
    if (!get_int(root, "max_completion_tokens", 1, INT32_MAX, &ll, &has, err)) goto fail;
    if (has) max_tokens = ll;
    if (!get_int(root, "n_predict", -1, INT32_MAX, &ll, &has, err)) goto fail;
    if (has && max_tokens < 0 && ll != 0) max_tokens = ll;

    /* stop: string or array of strings; empty strings are ignored */
    json_t *stop = json_object_get(root, "stop");
    if (stop && !json_is_null(stop)) {
        json_t *one[1] = {stop};
        size_t n = 1;
        if (json_is_array(stop)) n = json_array_size(stop);
        else if (!json_is_string(stop)) BAD("stop", "'stop' must be a string or an array of strings");
        if (n > TN_SRV_MAX_STOP) BAD("stop", "at most %d stop strings (got %zu)", TN_SRV_MAX_STOP, n);
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_is_array(stop) ? json_array_get(stop, i) : one[0];
            if (!json_is_string(s)) BAD("stop", "stop[%zu] must be a string", i);
            size_t sl = json_string_length(s);
            if (sl > TN_SRV_MAX_STOP_LEN) BAD("stop", "stop[%zu] is %zu bytes (max %d)", i, sl, TN_SRV_MAX_STOP_LEN);
            if (sl == 0) continue;
            p->stop[p->n_stop] = tn_strndup(json_string_value(s), sl);
            if (!p->stop[p->n_stop]) {
                oom(err);
                goto fail;
            }
            if (strlen(p->stop[p->n_stop]) != sl) { /* embedded NUL: never matches text; drop it */
                tn_free(p->stop[p->n_stop]);
                continue;
            }
            p->n_stop++;
        }
    }

    /* logit_bias: {"token id": bias in [-100, 100]} */
    json_t *lb = json_object_get(root, "logit_bias");
    if (lb && !json_is_null(lb)) {
        if (!json_is_object(lb)) BAD("logit_bias", "'logit_bias' must be an object mapping token ids to numbers");
        size_t n = json_object_size(lb);
        if (n > TN_SRV_MAX_BIAS) BAD("logit_bias", "at most %d logit_bias entries (got %zu)", TN_SRV_MAX_BIAS, n);
        p->bias_tok = tn_malloc((n ? n : 1) * sizeof *p->bias_tok);
        p->bias_val = tn_malloc((n ? n : 1) * sizeof *p->bias_val);
        if (!p->bias_tok || !p->bias_val) {
            oom(err);
            goto fail;
        }
        const char *key;
        json_t *v;
        json_object_foreach(lb, key, v) {
            char *end;
            errno = 0;
            long id = strtol(key, &end, 10);
            if (!*key || *end || errno || id < 0 || id >= env->n_vocab)
                BAD("logit_bias", "logit_bias key '%.32s' is not a token id in 0..%d", key, env->n_vocab - 1);
            if (!json_is_number(v)) BAD("logit_bias", "logit_bias[%ld] must be a number", id);
            double b = json_number_value(v);
            if (!(b >= -100 && b <= 100)) BAD("logit_bias", "logit_bias[%ld] = %g is outside [-100, 100]", id, b);
            p->bias_tok[p->n_bias] = (int32_t)id;
            p->bias_val[p->n_bias] = (float)b;
            p->n_bias++;
        }
    }

    if (kind == TN_REQ_CHAT) {
        if (!parse_chat(root, env, p, err)) goto fail;
    } else {
        if (!parse_prompt(root, env, p, err)) goto fail;
    }
    if (p->n_prompt == 0) { /* a model needs one token to start from */
        tern_token b = tern_token_bos(env->model);
        p->prompt[0] = b >= 0 ? b : 0;
        p->n_prompt = 1;
    }
    if (p->n_prompt >= env->n_ctx_seq) {
        tn_http_err_set(err, 400, "exceed_context_size_error", "prompt",
                        "the request exceeds the available context size (%d prompt tokens, context %d)", p->n_prompt,
                        env->n_ctx_seq);
        err->n_prompt = p->n_prompt;
        err->n_ctx = env->n_ctx_seq;
        goto fail;
    }
    if (kind == TN_REQ_COMPLETION) {
        if (!get_bool(root, "echo", &p->echo, err)) goto fail;
        if (p->echo && !echo_prompt(root, env, p, err)) goto fail;
    }
    int32_t room = env->n_ctx_seq - p->n_prompt;
    p->max_tokens = max_tokens < 0 || max_tokens > room ? room : (int32_t)max_tokens;
    json_decref(root);
    return true;
fail:
    if (!err->status) tn_http_err_set(err, 400, "invalid_request_error", NULL, "invalid request");
    json_decref(root);
    tn_req_params_free(p);
    return false;
}
