/*
 * http.c — the HTTP front of tern serve on libmicrohttpd (one thread per connection): routing,
 * auth, body limits, OpenAI-shaped JSON errors, SSE streaming, client-disconnect detection, and
 * the process lifecycle (signals, drain). It never touches the model's KV or the tern_ctx: work
 * goes to the engine (engine.c) through tn_sreq.
 *
 * Disconnects: while a connection thread waits for its request it peeks at the socket every
 * 50 ms; EOF marks the request cancelled and the engine frees its sequence on its next step.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/base.h"
#include "model/pcache.h"
#include "model/spec.h"
#include "serve/serve.h"

typedef struct tn_server {
    tn_serve_config cfg;
    tern_model *model;
    tern_model *draft; /* --draft (NULL: none) */
    tern_lora **lora;  /* --lora: cfg.n_lora adapters (NULL: none) */
    tn_engine *eng;
    tn_metrics met;
    tn_req_env env;
    char model_id[256];
    atomic_int draining;
    atomic_int open_requests; /* requests whose response libmicrohttpd has not finished sending */
    atomic_uint id_ctr;
    int64_t started;
} tn_server;

typedef struct tn_conn {
    char *body;
    size_t len, cap;
    bool too_big, oom, responded;
    bool fail_armed; /* X-Tern-Fail-Alloc armed a failure (testing); disarmed when the request ends */
} tn_conn;

static tn_conn tn_conn_failed; /* stands for a request whose tn_conn could not be allocated (read-only) */

void tn_serve_config_init(tn_serve_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->n_parallel = 4;
    c->n_batch = 512;
    c->max_queue = 64;
    c->drain_timeout_s = 30;
    c->conn_timeout_s = 30;
    c->max_body = 4u << 20;
    c->n_gpu_layers = -1;
    c->chat_template = -1;
    c->draft_min = 1;
    c->draft_max = 8;
    c->spec_ngram_n = 3;
}

/* ---- responses ------------------------------------------------------------------------------- */
/* The answer when even building an error fails: static, allocates nothing of ours. */
static const char tn_oom_body[] =
    "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":500}}";

static enum MHD_Result send_oom(struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(sizeof tn_oom_body - 1, (void *)tn_oom_body, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ok = MHD_queue_response(c, 500, r);
    MHD_destroy_response(r);
    return ok;
}

/* Sends text (allocated by tn_malloc or jansson; freed here) with optional extra headers. */
static enum MHD_Result send_owned(struct MHD_Connection *c, int status, const char *ctype, char *text, int retry_after) {
    if (!text) return send_oom(c);
    struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback(strlen(text), text, tn_free);
    if (!r) {
        tn_free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (retry_after > 0) {
        char ra[32];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    if (status == 405) MHD_add_response_header(r, "Allow", "GET, POST");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, json_t *j) {
    char *s = tn_json_dumps(j);
    json_decref(j);
    return send_owned(c, status, "application/json", s, 0);
}

static enum MHD_Result send_error(struct MHD_Connection *c, const tn_http_err *e, int retry_after) {
    json_t *j = tn_resp_error(e);
    char *s = tn_json_dumps(j);
    json_decref(j);
    return send_owned(c, e->status, "application/json", s, retry_after);
}

static enum MHD_Result send_err(struct MHD_Connection *c, int status, const char *type, const char *msg) {
    tn_http_err e = {0};
    tn_http_err_set(&e, status, type, NULL, "%s", msg);
    return send_error(c, &e, 0);
}

/* ---- waiting for the engine, with disconnect detection ---------------------------------------- */
static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static bool peer_gone(int fd) {
    if (fd < 0) return false;
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0) return true;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    return false;
}

/* Waits (r->mu held on entry and exit) up to ms for a change; false if the client left. */
static bool wait_change(tn_sreq *r, int fd, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    if (r->state == TN_SREQ_DONE) return true;
    pthread_mutex_unlock(&r->mu);
    bool gone = peer_gone(fd);
    pthread_mutex_lock(&r->mu);
    if (gone) atomic_store(&r->cancelled, 1);
    return !gone;
}

/* ---- streaming ----------------------------------------------------------------------------------- */
typedef struct tn_cstream {       /* what one choice has sent so far */
    size_t consumed;              /* bytes of its text                */
    int32_t lp_sent;              /* logprob entries                  */
    bool fin_sent;
    bool echo_sent;               /* echo: the prompt's chunk         */
} tn_cstream;

typedef struct tn_stream {
    tn_server *S;
    tn_sreq *r;
    int fd;
    int phase;
    tn_cstream *cs;               /* [r->p.n] */
    tn_buf ev;                    /* events not yet handed to libmicrohttpd: ev.p[off, ev.n)   */
    size_t off;
    const char *fixed;            /* instead of ev: a static error event, then the end         */
    double last_send;
} tn_stream;

/* An error event that needs no allocation. */
static const char tn_oom_event[] =
    "data: {\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":500}}\n\n";

static void stream_raw(tn_stream *st, const char *s, size_t n) { tn_buf_put(&st->ev, s, n); }

/* Appends `data: <json>\n\n` (takes j; NULL means an allocation failed). */
static void stream_event(tn_stream *st, json_t *j) {
    char *s = tn_json_dumps(j);
    json_decref(j);
    if (!s) {
        st->ev.oom = true;
        return;
    }
    stream_raw(st, "data: ", 6);
    stream_raw(st, s, strlen(s));
    stream_raw(st, "\n\n", 2);
    tn_free(s);
}

/* echo: choice i still owes the prompt's chunk / can send it (its prompt logprobs are in). */
static bool echo_owed(const tn_stream *st, int i) { return st->r->p.echo && !st->cs[i].echo_sent; }
static bool echo_ready(const tn_sreq *r) { return !r->plp || r->echo_ready; }

/* Something to send: new text or a finished choice (r->mu held). */
static bool stream_news(const tn_stream *st) {
    const tn_sreq *r = st->r;
    for (int i = 0; i < r->p.n; i++) {
        if (echo_owed(st, i)) {
            if (echo_ready(r)) return true;
            continue;
        }
        if (r->ch[i].out_len > st->cs[i].consumed || (r->ch[i].finish && !st->cs[i].fin_sent)) return true;
    }
    return false;
}

/* Chunks for every choice with news: its new text with the logprobs of the tokens so far, then
 * its finish_reason once the engine finished it (r->mu held). */
static void stream_collect(tn_stream *st) {
    tn_sreq *r = st->r;
    bool chat = r->p.kind == TN_REQ_CHAT;
    const char *mid = st->S->model_id;
    for (int i = 0; i < r->p.n && !st->ev.oom; i++) {
        tn_choice *c = &r->ch[i];
        tn_cstream *cs = &st->cs[i];
        if (echo_owed(st, i)) { /* the prompt's text (and logprobs) before any output */
            if (!echo_ready(r)) continue;
            json_t *t = json_stringn(r->p.echo_text, r->p.echo_len);
            stream_event(st, tn_resp_chunk(mid, r, i, t, tn_resp_echo_logprobs(st->S->model, r), NULL));
            cs->echo_sent = true;
        }
        if (c->out_len > cs->consumed) {
            json_t *t = json_stringn(c->out + cs->consumed, c->out_len - cs->consumed);
            json_t *lp = r->p.logprobs ? tn_resp_logprobs(st->S->model, r, i, cs->lp_sent, c->n_lp) : NULL;
            stream_event(st, tn_resp_chunk(mid, r, i, chat ? json_pack("{s:o}", "content", t) : t, lp, NULL));
            cs->consumed = c->out_len;
            cs->lp_sent = c->n_lp;
        }
        if (c->finish && !cs->fin_sent && !st->ev.oom) {
            json_t *lp = r->p.logprobs && cs->lp_sent < c->n_lp ? tn_resp_logprobs(st->S->model, r, i, cs->lp_sent, c->n_lp) : NULL;
            stream_event(st, tn_resp_chunk(mid, r, i, chat ? json_object() : json_string(""), lp, c->finish));
            cs->lp_sent = c->n_lp;
            cs->fin_sent = true;
        }
    }
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    tn_stream *st = cls;
    tn_sreq *r = st->r;
    bool chat = r->p.kind == TN_REQ_CHAT;
    for (;;) {
        if (st->ev.oom && !st->fixed) { /* an event could not be built: a static error event, then the end */
            atomic_store(&r->cancelled, 1);
            tn_free(tn_buf_take(&st->ev, NULL));
            st->fixed = tn_oom_event;
            st->off = 0;
            st->phase = 4;
        }
        const char *src = st->fixed ? st->fixed : st->ev.p;
        size_t len = st->fixed ? sizeof tn_oom_event - 1 : st->ev.n;
        if (st->off < len) {
            size_t k = len - st->off;
            if (k > max) k = max;
            memcpy(buf, src + st->off, k);
            st->off += k;
            st->last_send = tn_srv_now();
            return (ssize_t)k;
        }
        if (!st->fixed) st->off = st->ev.n = 0;
        switch (st->phase) {
        case 0:
            st->phase = 1;
            for (int i = 0; chat && i < r->p.n; i++)
                stream_event(st, tn_resp_chunk(st->S->model_id, r, i, json_pack("{s:s, s:s}", "role", "assistant", "content", ""),
                                               NULL, NULL));
            continue;
        case 1: {
            pthread_mutex_lock(&r->mu);
            bool ping = false;
            while (!stream_news(st) && r->state != TN_SREQ_DONE) {
                if (!wait_change(r, st->fd, 50)) {
                    pthread_mutex_unlock(&r->mu);
                    return MHD_CONTENT_READER_END_WITH_ERROR;
                }
                if (atomic_load(&st->S->draining) == 2) break;
                if (tn_srv_now() - st->last_send > 10 && !stream_news(st) && r->state != TN_SREQ_DONE) {
                    ping = true;
                    break;
                }
            }
            if (ping) {
                pthread_mutex_unlock(&r->mu);
                stream_raw(st, ": ping\n\n", 8);
                continue;
            }
            if (stream_news(st)) {
                stream_collect(st);
                pthread_mutex_unlock(&r->mu);
                continue;
            }
            bool done = r->state == TN_SREQ_DONE;
            tn_http_err e = r->err;
            pthread_mutex_unlock(&r->mu);
            bool all = true;
            for (int i = 0; i < r->p.n; i++) all &= st->cs[i].fin_sent;
            if (!done) tn_http_err_set(&e, 503, "unavailable_error", NULL, "the server is shutting down");
            if (e.status || !all) {
                if (!e.status) tn_http_err_set(&e, 503, "unavailable_error", NULL, "the request was cancelled");
                stream_event(st, tn_resp_error(&e));
                st->phase = 4;
                continue;
            }
            st->phase = 2;
            continue;
        }
        case 2:
            st->phase = 3;
            if (r->p.include_usage) {
                pthread_mutex_lock(&r->mu);
                stream_event(st, tn_resp_usage_chunk(st->S->model_id, r));
                pthread_mutex_unlock(&r->mu);
            }
            continue;
        case 3:
            st->phase = 4;
            stream_raw(st, "data: [DONE]\n\n", 14);
            continue;
        default:
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
    }
}

static void stream_free(void *cls) {
    tn_stream *st = cls;
    atomic_store(&st->r->cancelled, 1); /* no-op if already done; frees the slot if the client left */
    tn_sreq_release(st->r);
    tn_free(st->ev.p);
    tn_free(st->cs);
    tn_free(st);
}

static void new_id(tn_server *S, char *buf, size_t cap, const char *prefix) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)atomic_fetch_add(&S->id_ctr, 1) << 40) ^
                 (uint64_t)getpid() * UINT64_C(0x9E3779B97F4A7C15);
    x ^= x >> 31;
    x *= UINT64_C(0xBF58476D1CE4E5B9);
    x ^= x >> 29;
    snprintf(buf, cap, "%s%016llx", prefix, (unsigned long long)x);
}

static enum MHD_Result handle_completion(tn_server *S, struct MHD_Connection *c, int kind, const char *body, size_t len) {
    tn_sreq *r = tn_sreq_new();
    if (!r) return send_oom(c);
    tn_http_err err;
    if (!tn_req_parse(body, len, kind, &S->env, &r->p, &err)) {
        tn_sreq_release(r);
        if (err.status == 400) {
            pthread_mutex_lock(&S->met.mu);
            S->met.rejected_invalid++;
            pthread_mutex_unlock(&S->met.mu);
        }
        return send_error(c, &err, 0);
    }
    tn_stream *st = NULL;
    if (!tn_sreq_choices(r) || (r->p.stream && (!(st = tn_calloc(1, sizeof *st)) || !(st->cs = tn_calloc((size_t)r->p.n, sizeof *st->cs))))) {
        if (st) tn_free(st);
        tn_sreq_release(r);
        return send_oom(c);
    }
    new_id(S, r->id, sizeof r->id, kind == TN_REQ_CHAT ? "chatcmpl-" : "cmpl-");
    r->created = (int64_t)time(NULL);
    r->t_arrival = tn_srv_now();
    int retry = 0;
    if (!tn_engine_submit(S->eng, r, &err, &retry)) {
        if (st) {
            tn_free(st->cs);
            tn_free(st);
        }
        tn_sreq_release(r);
        return send_error(c, &err, retry);
    }
    int fd = conn_fd(c);
    if (st) {
        /* with a TTFT objective the status line waits until the request starts: the engine may
         * still refuse it (429) from the queue when the objective can no longer be met */
        pthread_mutex_lock(&r->mu);
        bool alive = true;
        while (S->cfg.ttft_slo_ms > 0 && r->state == TN_SREQ_QUEUED && alive) alive = wait_change(r, fd, 50);
        tn_http_err e = r->err;
        int retry_s = r->retry_after_s;
        bool refused = r->state == TN_SREQ_DONE && e.status;
        pthread_mutex_unlock(&r->mu);
        if (!alive || refused) {
            tn_free(st->cs);
            tn_free(st);
            tn_sreq_release(r);
            return alive ? send_error(c, &e, retry_s) : MHD_NO;
        }
        st->S = S;
        st->r = r; /* our reference moves to the stream */
        st->fd = fd;
        st->last_send = tn_srv_now();
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, st, stream_free);
        if (!resp) {
            stream_free(st);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ok = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ok;
    }
    pthread_mutex_lock(&r->mu);
    bool alive = true;
    while (r->state != TN_SREQ_DONE && alive) alive = wait_change(r, fd, 50);
    if (!alive || r->state != TN_SREQ_DONE) {
        pthread_mutex_unlock(&r->mu);
        tn_sreq_release(r);
        return MHD_NO; /* client gone: close */
    }
    bool all = true;
    for (int i = 0; i < r->p.n; i++) all &= r->ch[i].finish != NULL;
    enum MHD_Result ok;
    if (r->err.status) {
        tn_http_err e = r->err;
        int retry_s = r->retry_after_s;
        pthread_mutex_unlock(&r->mu);
        ok = send_error(c, &e, retry_s);
    } else if (!all) {
        pthread_mutex_unlock(&r->mu);
        ok = send_err(c, 503, "unavailable_error", "the request was cancelled");
    } else {
        json_t *j = tn_resp_final(S->model, S->model_id, r);
        pthread_mutex_unlock(&r->mu);
        ok = send_json(c, 200, j);
    }
    tn_sreq_release(r);
    return ok;
}

/* ---- tokenize / detokenize / models / metrics -------------------------------------------------- */
static json_t *piece_json(const tern_model *m, tern_token t) {
    char buf[256], clean[256 * 3 + 1];
    int32_t k = tern_token_to_piece(m, t, buf, (int32_t)sizeof buf, true);
    if (k < 0) k = 0;
    size_t o = 0;
    tn_utf8_copy(clean, &o, buf, (size_t)k, true);
    if (o == (size_t)k && !memcmp(clean, buf, (size_t)k)) return json_stringn(buf, (size_t)k);
    json_t *a = json_array(); /* not valid UTF-8 on its own: a byte list, like llama.cpp */
    for (int32_t i = 0; a && i < k; i++)
        if (json_array_append_new(a, json_integer((unsigned char)buf[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static enum MHD_Result handle_tokenize(tn_server *S, struct MHD_Connection *c, const char *body, size_t len) {
    tn_http_err err = {0};
    json_t *j = tn_json_parse(body, len, &err);
    if (!j) return send_error(c, &err, 0);
    json_t *content = json_object_get(j, "content"), *prompt = json_object_get(j, "prompt"), *msgs = json_object_get(j, "messages");
    bool add_special = content == NULL, parse_special = true, pieces = false;
    json_t *v;
    if ((v = json_object_get(j, "add_special")) || (v = json_object_get(j, "add_special_tokens"))) {
        if (!json_is_boolean(v)) {
            json_decref(j);
            return send_err(c, 400, "invalid_request_error", "'add_special' must be a boolean");
        }
        add_special = json_is_true(v);
    }
    if ((v = json_object_get(j, "parse_special"))) parse_special = json_is_true(v);
    if ((v = json_object_get(j, "with_pieces")) || (v = json_object_get(j, "return_token_strs"))) pieces = json_is_true(v);
    tern_token *toks = NULL;
    int32_t n = 0;
    if (msgs) {
        tn_req_params p;
        char *b2 = tn_json_dumps(j);
        if (!b2) {
            json_decref(j);
            return send_oom(c);
        }
        bool ok = tn_req_parse(b2, strlen(b2), TN_REQ_CHAT, &S->env, &p, &err);
        tn_free(b2);
        if (!ok) {
            json_decref(j);
            return send_error(c, &err, 0);
        }
        toks = p.prompt;
        n = p.n_prompt;
        p.prompt = NULL;
        tn_req_params_free(&p);
    } else {
        json_t *t = content ? content : prompt;
        if (!json_is_string(t)) {
            json_decref(j);
            return send_err(c, 400, "invalid_request_error", "'content' (or 'prompt') must be a string");
        }
        size_t tl = json_string_length(t);
        int32_t cap = (int32_t)(tl + 8 < (1u << 24) ? tl + 8 : (1u << 24));
        toks = tn_malloc((size_t)cap * sizeof *toks);
        tern_status s = toks ? tern_tokenize(S->model, json_string_value(t), tl, add_special, parse_special, toks, cap, &n)
                             : TERN_ERR_NOMEM;
        if (s == TERN_ERR_FULL && n > cap && n < (1 << 24)) {
            tern_token *q = tn_realloc(toks, (size_t)n * sizeof *toks);
            if (q) {
                toks = q;
                cap = n;
                s = tern_tokenize(S->model, json_string_value(t), tl, add_special, parse_special, toks, cap, &n);
            }
        }
        if (s) {
            tn_free(toks);
            json_decref(j);
            if (s == TERN_ERR_NOMEM) return send_oom(c);
            return send_err(c, 400, "invalid_request_error", "tokenization failed");
        }
    }
    json_t *arr = json_array(), *strs = pieces ? json_array() : NULL;
    bool ok = arr && (strs || !pieces);
    for (int32_t i = 0; ok && i < n; i++) {
        if (pieces)
            ok = !json_array_append_new(arr, json_pack("{s:i, s:o}", "id", toks[i], "piece", piece_json(S->model, toks[i]))) &&
                 !json_array_append_new(strs, piece_json(S->model, toks[i]));
        else
            ok = !json_array_append_new(arr, json_integer(toks[i]));
    }
    tn_free(toks);
    json_decref(j);
    json_t *out = ok ? json_pack("{s:o, s:i, s:i}", "tokens", arr, "count", n, "max_model_len", S->env.n_ctx_seq) : NULL;
    if (!ok) json_decref(arr);
    if (strs && (!out || json_object_set_new(out, "token_strs", strs))) {
        if (!out) json_decref(strs);
        json_decref(out);
        out = NULL;
    }
    return send_json(c, 200, out);
}

static enum MHD_Result handle_detokenize(tn_server *S, struct MHD_Connection *c, const char *body, size_t len) {
    tn_http_err err = {0};
    json_t *j = tn_json_parse(body, len, &err);
    if (!j) return send_error(c, &err, 0);
    json_t *a = json_object_get(j, "tokens");
    if (!json_is_array(a)) {
        json_decref(j);
        return send_err(c, 400, "invalid_request_error", "'tokens' must be an array of token ids");
    }
    size_t n = json_array_size(a);
    if (n > TN_SRV_MAX_DETOK) {
        json_decref(j);
        tn_http_err_set(&err, 400, "invalid_request_error", "tokens", "at most %d tokens (got %zu)", TN_SRV_MAX_DETOK, n);
        return send_error(c, &err, 0);
    }
    tern_token *toks = tn_malloc((n ? n : 1) * sizeof *toks);
    if (!toks) {
        json_decref(j);
        return send_oom(c);
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= S->env.n_vocab) {
            tn_free(toks);
            json_decref(j);
            tn_http_err_set(&err, 400, "invalid_request_error", "tokens", "tokens[%zu] is not a token id in 0..%d", i,
                            S->env.n_vocab - 1);
            return send_error(c, &err, 0);
        }
        toks[i] = (tern_token)json_integer_value(v);
    }
    json_decref(j);
    int32_t need = tern_detokenize(S->model, toks, (int32_t)n, NULL, 0, false, false);
    size_t cap = need < 0 ? (size_t)(-(int64_t)need) : (size_t)need;
    char *buf = tn_malloc(cap + 1), *clean = tn_malloc(3 * cap + 1);
    int32_t k = buf ? tern_detokenize(S->model, toks, (int32_t)n, buf, (int32_t)cap, false, false) : -1;
    tn_free(toks);
    if (!buf || !clean || k < 0) {
        tn_free(buf);
        tn_free(clean);
        if (!buf || !clean) return send_oom(c);
        return send_err(c, 500, "server_error", "detokenization failed");
    }
    size_t o = 0;
    tn_utf8_copy(clean, &o, buf, (size_t)k, true);
    tn_free(buf);
    json_t *out = json_pack("{s:s%, s:s%}", "content", clean, o, "prompt", clean, o);
    tn_free(clean);
    return send_json(c, 200, out);
}

static enum MHD_Result handle_models(tn_server *S, struct MHD_Connection *c) {
    const tern_model *m = S->model;
    json_t *meta = json_pack("{s:i, s:i, s:i, s:I, s:I, s:s, s:s}", "n_vocab", tern_model_n_vocab(m), "n_ctx_train",
                             tern_model_n_ctx_train(m), "n_embd", tern_model_n_embd(m), "n_params",
                             (json_int_t)tern_model_n_params(m), "size", (json_int_t)tern_model_size_bytes(m), "desc",
                             tern_model_desc(m), "chat_template", tern_chat_template_name(S->env.tmpl));
    json_t *j = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i, s:o}]}", "object", "list", "data", "id", S->model_id, "object",
                          "model", "created", (json_int_t)S->started, "owned_by", "tern", "max_model_len", S->env.n_ctx_seq,
                          "meta", meta);
    return send_json(c, 200, j);
}

/* ---- slots (llama-server's API; the engine runs the actions: tn_engine_slot_action) ------------ */
static enum MHD_Result handle_slots(tn_server *S, struct MHD_Connection *c) {
    const char *f = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "fail_on_no_slot");
    tn_http_err e = {0};
    json_t *j = tn_engine_slot_action(S->eng, TN_SLOT_LIST, 0, NULL, NULL, f && strcmp(f, "0") && strcmp(f, "false"), &e);
    return j ? send_json(c, 200, j) : send_error(c, &e, 0);
}

/* A file name inside --slot-save-path: no directories, no hidden or special names. */
static bool slot_filename_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 200 || s[0] == '.' || s[0] == ' ' || s[n - 1] == ' ') return false;
    for (size_t i = 0; i < n; i++) {
        const unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7F || ch == '/' || ch == '\\' || ch == ':') return false;
    }
    return true;
}

static enum MHD_Result handle_slot_action(tn_server *S, struct MHD_Connection *c, const char *url, const char *body, size_t len) {
    tn_http_err e = {0};
    if (!S->cfg.slot_save_path)
        return send_err(c, 501, "not_supported_error", "This server does not support slots action. Start it with `--slot-save-path`");
    const char *ids = url + 7, *action = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
    char *end;
    errno = 0;
    long id = strtol(ids, &end, 10);
    if (!*ids || *end || errno || id < 0 || id > 1000000) return send_err(c, 400, "invalid_request_error", "Invalid slot ID");
    int act = !action ? -1 : !strcmp(action, "save") ? TN_SLOT_SAVE : !strcmp(action, "restore") ? TN_SLOT_RESTORE
                             : !strcmp(action, "erase") ? TN_SLOT_ERASE : -1;
    if (act < 0) return send_err(c, 400, "invalid_request_error", "Invalid action: use ?action=save, restore or erase");
    char path[4352], fname[256] = "";
    path[0] = 0;
    if (act != TN_SLOT_ERASE) {
        json_t *j = tn_json_parse(body, len, &e);
        if (!j) return send_error(c, &e, 0);
        json_t *fn = json_object_get(j, "filename");
        bool ok = json_is_string(fn) && strlen(json_string_value(fn)) == json_string_length(fn) && slot_filename_ok(json_string_value(fn));
        if (ok) {
            snprintf(fname, sizeof fname, "%s", json_string_value(fn));
            snprintf(path, sizeof path, "%s/%s", S->cfg.slot_save_path, fname);
        }
        json_decref(j);
        if (!ok)
            return send_err(c, 400, "invalid_request_error",
                            fn ? "Invalid filename: a plain name inside --slot-save-path (no '/', '\\', ':', leading '.', control characters; at most 200 bytes)"
                               : "Invalid filename: the body must give \"filename\"");
    }
    json_t *r = tn_engine_slot_action(S->eng, act, (int)id, path, fname, false, &e);
    return r ? send_json(c, 200, r) : send_error(c, &e, 0);
}

/* ---- routing ---------------------------------------------------------------------------------- */
static bool auth_ok(tn_server *S, struct MHD_Connection *c) {
    const char *key = S->cfg.api_key;
    if (!key || !*key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *given = NULL;
    if (h && !strncmp(h, "Bearer ", 7)) given = h + 7;
    if (!given) given = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Api-Key");
    if (!given) return false;
    size_t a = strlen(given), b = strlen(key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a; i++) diff |= (unsigned)(given[i] ^ key[i % (b ? b : 1)]); /* constant time */
    return diff == 0;
}

typedef enum { R_NONE, R_HEALTH, R_MODELS, R_CHAT, R_COMPL, R_TOK, R_DETOK, R_METRICS, R_SLOTS, R_SLOT_ACT } route;

static route route_of(const char *url, bool *post) {
    static const struct {
        const char *path;
        route r;
        bool post;
    } tbl[] = {{"/health", R_HEALTH, false},         {"/v1/health", R_HEALTH, false},
               {"/v1/models", R_MODELS, false},      {"/models", R_MODELS, false},
               {"/v1/chat/completions", R_CHAT, true}, {"/chat/completions", R_CHAT, true},
               {"/v1/completions", R_COMPL, true},     {"/completions", R_COMPL, true},
               {"/tokenize", R_TOK, true},             {"/detokenize", R_DETOK, true},
               {"/metrics", R_METRICS, false},         {"/slots", R_SLOTS, false}};
    for (size_t i = 0; i < sizeof tbl / sizeof tbl[0]; i++)
        if (!strcmp(url, tbl[i].path)) {
            *post = tbl[i].post;
            return tbl[i].r;
        }
    if (!strncmp(url, "/slots/", 7)) { /* POST /slots/{id_slot}?action=... */
        *post = true;
        return R_SLOT_ACT;
    }
    return R_NONE;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    tn_server *S = cls;
    tn_conn *cs = *con_cls;
    if (cs == &tn_conn_failed) { /* no memory for this request's state: drain the body, answer 500 */
        if (!*upload_size) return send_oom(c);
        *upload_size = 0;
        return MHD_YES;
    }
    if (!cs) {
        cs = tn_calloc(1, sizeof *cs);
        *con_cls = cs ? cs : &tn_conn_failed;
        atomic_fetch_add(&S->open_requests, 1);
        if (!cs) return MHD_YES;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || *end || v > S->cfg.max_body) {
                cs->responded = true;
                char msg[128];
                snprintf(msg, sizeof msg, "the request body exceeds %zu bytes", S->cfg.max_body);
                return send_err(c, 413, "invalid_request_error", msg);
            }
        }
        return MHD_YES;
    }
    if (cs->responded) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cs->too_big || cs->oom) return MHD_YES;
        if (cs->len + n > S->cfg.max_body) {
            cs->too_big = true;
            tn_free(cs->body);
            cs->body = NULL;
            cs->len = cs->cap = 0;
            return MHD_YES;
        }
        if (cs->len + n + 1 > cs->cap) {
            size_t cap = cs->cap ? cs->cap : 4096;
            while (cap < cs->len + n + 1) cap *= 2;
            char *q = tn_realloc(cs->body, cap);
            if (!q) { /* answer 500 once the upload ends */
                cs->oom = true;
                tn_free(cs->body);
                cs->body = NULL;
                cs->len = cs->cap = 0;
                return MHD_YES;
            }
            cs->body = q;
            cs->cap = cap;
        }
        memcpy(cs->body + cs->len, upload, n);
        cs->len += n;
        cs->body[cs->len] = 0;
        return MHD_YES;
    }
    cs->responded = true;
    if (cs->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body exceeds %zu bytes", S->cfg.max_body);
        return send_err(c, 413, "invalid_request_error", msg);
    }
    if (cs->oom) return send_oom(c);
    bool want_post = false;
    route rt = route_of(url, &want_post);
    if (rt == R_NONE || (rt == R_METRICS && !S->cfg.metrics)) return send_err(c, 404, "not_found_error", "no such endpoint");
    bool is_post = !strcmp(method, "POST"), is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if ((want_post && !is_post) || (!want_post && !is_get)) {
        tn_http_err e = {0};
        tn_http_err_set(&e, 405, "invalid_request_error", NULL, "method %s is not allowed on %s", method, url);
        return send_error(c, &e, 0);
    }
    if (rt == R_HEALTH) {
        if (atomic_load(&S->draining)) {
            tn_http_err e = {0};
            tn_http_err_set(&e, 503, "unavailable_error", NULL, "the server is shutting down");
            return send_error(c, &e, 0);
        }
        return send_json(c, 200, json_pack("{s:s}", "status", "ok"));
    }
    if (!auth_ok(S, c)) return send_err(c, 401, "authentication_error", "invalid or missing API key");
    /* fault-injection tests: fail the N-th allocation from here until this request ends */
    const char *fa = S->cfg.debug_fail_alloc ? MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Tern-Fail-Alloc") : NULL;
    if (fa) {
        cs->fail_armed = true;
        tn_alloc_fail_at(strtoull(fa, NULL, 10), strstr(fa, "persistent") != NULL);
    }
    const char *body = cs->body ? cs->body : "";
    switch (rt) {
    case R_MODELS: return handle_models(S, c);
    case R_CHAT: return handle_completion(S, c, TN_REQ_CHAT, body, cs->len);
    case R_COMPL: return handle_completion(S, c, TN_REQ_COMPLETION, body, cs->len);
    case R_TOK: return handle_tokenize(S, c, body, cs->len);
    case R_DETOK: return handle_detokenize(S, c, body, cs->len);
    case R_SLOTS: return handle_slots(S, c);
    case R_SLOT_ACT: return handle_slot_action(S, c, url, body, cs->len);
    case R_METRICS: {
        double cost[3];
        tn_engine_cost(S->eng, cost);
        tn_pcache_stats pst;
        const bool pc = tn_engine_pcache_stats(S->eng, &pst);
        return send_owned(c, 200, "text/plain; version=0.0.4", tn_metrics_render(&S->met, S->model_id, cost, pc ? &pst : NULL), 0);
    }
    default: return send_err(c, 404, "not_found_error", "no such endpoint");
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c, (void)toe;
    tn_server *S = cls;
    tn_conn *cs = *con_cls;
    *con_cls = NULL;
    if (cs) atomic_fetch_sub(&S->open_requests, 1);
    if (!cs || cs == &tn_conn_failed) return;
    if (cs->fail_armed) tn_alloc_fail_at(0, false);
    tn_free(cs->body);
    tn_free(cs);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls, (void)fmt, (void)ap; /* libmicrohttpd's own messages: quiet */
}

/* ---- lifecycle -------------------------------------------------------------------------------- */
int tn_serve_run(const tn_serve_config *cfg) {
    int rc = 0;
    tn_json_alloc_init(); /* jansson allocates through tern's hook too */
    tn_server *S = tn_calloc(1, sizeof *S);
    struct MHD_Daemon *d = NULL;
    if (!S) return 71;
    S->cfg = *cfg;
    S->started = (int64_t)time(NULL);
    tn_metrics_init(&S->met);

    /* signals: blocked in every thread, taken synchronously by this one */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    tern_model_params mp;
    tern_model_params_init(&mp);
    mp.repack = !cfg->no_repack && cfg->device == TERN_DEVICE_CPU; /* the GPU reads the file's layouts */
    mp.hot_experts = cfg->hot_experts;
    tern_status s = tern_model_load(cfg->model_path, &mp, &S->model);
    if (s) {
        fprintf(stderr, "tern: error: loading the model: %s\n", tern_last_error());
        rc = s == TERN_ERR_NOT_FOUND || s == TERN_ERR_IO ? 66 : s == TERN_ERR_NOMEM ? 71 : 65;
        goto done;
    }
    if (cfg->alias) {
        snprintf(S->model_id, sizeof S->model_id, "%s", cfg->alias);
    } else {
        const char *b = strrchr(cfg->model_path, '/');
        snprintf(S->model_id, sizeof S->model_id, "%s", b ? b + 1 : cfg->model_path);
        char *dot = strrchr(S->model_id, '.');
        if (dot && !strcmp(dot, ".gguf")) *dot = 0;
    }
    if (cfg->draft_path) { /* the draft model: on the CPU, checked against the model's vocabulary */
        tern_model_params dmp;
        tern_model_params_init(&dmp);
        if ((s = tern_model_load(cfg->draft_path, &dmp, &S->draft))) {
            fprintf(stderr, "tern: error: loading the draft model: %s\n", tern_last_error());
            rc = s == TERN_ERR_NOT_FOUND || s == TERN_ERR_IO ? 66 : s == TERN_ERR_NOMEM ? 71 : 65;
            goto done;
        }
        if ((s = tn_spec_vocab_check(S->model, S->draft))) {
            fprintf(stderr, "tern: error: draft model %s: %s\n", cfg->draft_path, tern_last_error());
            rc = 65;
            goto done;
        }
    }
    if (cfg->n_lora > 0) { /* the adapters, checked against the model */
        if (!(S->lora = tn_calloc((size_t)cfg->n_lora, sizeof *S->lora))) {
            fprintf(stderr, "tern: error: out of memory\n");
            rc = 71;
            goto done;
        }
        for (int32_t i = 0; i < cfg->n_lora; i++)
            if ((s = tern_lora_load(S->model, cfg->lora_paths[i], &S->lora[i]))) {
                fprintf(stderr, "tern: error: loading the LoRA adapter: %s\n", tern_last_error());
                rc = s == TERN_ERR_NOT_FOUND || s == TERN_ERR_IO ? 66 : s == TERN_ERR_NOMEM ? 71 : 65;
                goto done;
            }
    }
    S->env.tmpl = cfg->chat_template >= 0 ? (tern_chat_template)cfg->chat_template : tern_chat_template_detect(S->model);
    S->env.model = S->model;
    S->env.n_vocab = tern_model_n_vocab(S->model);
    tn_serve_config ecfg = *cfg;
    ecfg.draft_model = S->draft;
    ecfg.lora = S->lora;
    if ((s = tn_engine_create(S->model, &ecfg, &S->met, &S->eng))) {
        fprintf(stderr, "tern: error: starting the engine: %s\n", tern_last_error());
        rc = s == TERN_ERR_NOMEM ? 71 : s == TERN_ERR_UNSUPPORTED ? 65 : 64;
        goto done;
    }
    S->env.n_ctx_seq = tn_engine_n_ctx_seq(S->eng);

    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)cfg->port);
    if (inet_pton(AF_INET, cfg->host, &sa.sin_addr) != 1) {
        fprintf(stderr, "tern: error: --host '%s' is not an IPv4 address\n", cfg->host);
        rc = 64;
        goto done;
    }
    d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC, 0, NULL,
                         NULL, on_request, S, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
                         (unsigned)256, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->conn_timeout_s,
                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)65536, MHD_OPTION_NOTIFY_COMPLETED, on_completed, S,
                         MHD_OPTION_EXTERNAL_LOGGER, mhd_log, S, MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
                         MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "tern: error: cannot listen on %s:%d: %s\n", cfg->host, cfg->port, strerror(errno));
        rc = 71;
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : cfg->port;
    fprintf(stderr, "tern serve: model %s (%s), chat template %s, %d parallel, ctx %d per sequence\n", S->model_id,
            tern_model_desc(S->model), tern_chat_template_name(S->env.tmpl), cfg->n_parallel, S->env.n_ctx_seq);
    if (cfg->draft_path)
        fprintf(stderr, "tern serve: speculative decoding: draft model %s (%s), %s%d..%d drafts per step\n", cfg->draft_path,
                tern_model_desc(S->draft), cfg->spec_fixed ? "fixed length, " : "length chosen per step, ", cfg->draft_min,
                cfg->draft_max);
    if (cfg->spec_ngram)
        fprintf(stderr, "tern serve: speculative decoding: n-gram drafts (n-grams of 1..%d tokens), %s%d..%d drafts per step\n",
                cfg->spec_ngram_n, cfg->spec_fixed ? "fixed length, " : "length chosen per step, ", cfg->draft_min,
                cfg->draft_max);
    fprintf(stderr, "tern serve: listening on http://%s:%d\n", cfg->host, port);
    fflush(stderr);

    /* serve until a signal; then drain */
    int sig = 0;
    while (!sig) {
        struct timespec ts = {1, 0};
        int k = sigtimedwait(&sigs, NULL, &ts);
        if (k > 0) sig = k;
    }
    fprintf(stderr, "tern serve: %s: draining (up to %.0f s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", cfg->drain_timeout_s);
    atomic_store(&S->draining, 1);
    tn_engine_drain(S->eng);
    MHD_socket lfd = MHD_quiesce_daemon(d);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    double t0 = tn_srv_now();
    bool second = false;
    while (!tn_engine_idle(S->eng) && tn_srv_now() - t0 < cfg->drain_timeout_s) {
        struct timespec ts = {0, 50000000};
        if (sigtimedwait(&sigs, NULL, &ts) > 0) {
            second = true;
            break;
        }
    }
    /* a second signal during the drain: stop waiting, cancel what runs and exit 130 (the
     * shell's code for an interrupted command) as soon as the responses are closed */
    if (second) fprintf(stderr, "tern serve: second signal: cancelling every request\n");
    tn_engine_cancel_all(S->eng);
    for (int i = 0; i < 40 && !tn_engine_idle(S->eng); i++) {
        struct timespec ts = {0, 25000000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&S->draining, 2);
    /* the engine is idle once the last token is out, but its response may still be on the way
     * to the client: stopping the daemon now would cut the connection (curl: code 000) */
    for (int i = 0; i < (second ? 40 : 200) && atomic_load(&S->open_requests) > 0; i++) {
        struct timespec ts = {0, 25000000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "tern serve: %s; bye\n", second ? "cancelled" : "drained");
    if (second) rc = 130;
done:
    if (d) MHD_stop_daemon(d);
    tn_engine_destroy(S->eng);
    for (int32_t i = 0; S->lora && i < cfg->n_lora; i++) tern_lora_free(S->lora[i]);
    tn_free(S->lora);
    tern_model_free(S->model);
    tern_model_free(S->draft);
    pthread_mutex_destroy(&S->met.mu);
    tn_free(S);
    return rc;
}
