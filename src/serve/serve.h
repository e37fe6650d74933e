/*
 * serve.h — tern's OpenAI-compatible inference server (library side): configuration, the shared
 * request object passed between HTTP threads and the engine thread, request validation, chat
 * templates, metrics. tools/tern/cmd_serve.c only parses flags and calls tn_serve_run().
 *
 * Threads: libmicrohttpd runs one thread per connection (HTTP parsing, validation, tokenization,
 * waiting for output); one engine thread owns the tern_ctx, the KV block manager and every
 * sequence, and runs continuous-batching steps. They meet in tn_sreq (mutex + condvar).
 */
#ifndef TN_SERVE_SERVE_H
#define TN_SERVE_SERVE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/tern.h"

/* ---- configuration ---------------------------------------------------------------------------- */
typedef struct tn_serve_config {
    const char *model_path;
    const char *alias;     /* model id in the API; NULL = file stem                           */
    const char *host;      /* "127.0.0.1"                                                     */
    int port;              /* 8080; 0 = pick a free port (printed)                            */
    int n_parallel;        /* -np: sequences decoded together (<= 64)                          */
    int32_t n_ctx;         /* -c: total KV tokens for all sequences; 0 = np * per-seq ctx       */
    int32_t n_batch;       /* tokens per forward pass (prefill chunk + decodes)                */
    int32_t n_threads;
    const char *api_key;   /* NULL = no auth                                                  */
    bool metrics;          /* expose /metrics                                                 */
    int max_queue;         /* waiting requests beyond the running ones; more → 429            */
    double ttft_slo_ms, tpot_slo_ms; /* 0 = none                                              */
    double drain_timeout_s;
    int conn_timeout_s;
    size_t max_body;       /* request body cap (bytes)                                        */
    double step_delay_ms;  /* testing only: sleep after each engine step (makes races visible) */
    bool quiet;
} tn_serve_config;

void tn_serve_config_init(tn_serve_config *c);
/* Loads the model, starts HTTP and the engine, serves until SIGTERM/SIGINT (installed here),
 * drains, returns 0 on a clean shutdown, 130 on a second signal, or an exit code on failure
 * (message on stderr). */
int tn_serve_run(const tn_serve_config *cfg);

/* ---- limits (robustness.md §3.1) ------------------------------------------------------------- */
#define TN_SRV_MAX_DEPTH 64        /* JSON nesting                                             */
#define TN_SRV_MAX_STOP 16         /* stop strings                                             */
#define TN_SRV_MAX_STOP_LEN 256    /* bytes per stop string                                    */
#define TN_SRV_MAX_BIAS 1024       /* logit_bias entries                                       */
#define TN_SRV_MAX_MESSAGES 4096
#define TN_SRV_MAX_N 1             /* choices per request (n)                                  */
#define TN_SRV_MAX_TOP_LOGPROBS 20
#define TN_SRV_MAX_DETOK 65536     /* ids per /detokenize                                      */

/* ---- errors ---------------------------------------------------------------------------------- */
typedef struct tn_http_err {
    int status;          /* 400, 401, 404, 405, 413, 429, 500, 503 */
    const char *type;    /* invalid_request_error, ...                */
    char param[64];
    char msg[320];
    int32_t n_prompt, n_ctx; /* for exceed_context_size_error         */
} tn_http_err;

void tn_http_err_set(tn_http_err *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ---- chat templates -------------------------------------------------------------------------- */
typedef enum { TN_CHAT_CHATML = 0, TN_CHAT_LLAMA2, TN_CHAT_LLAMA3 } tn_chat_tmpl;
/* Picks a template from tokenizer.chat_template by recognisable markers (never executed);
 * NULL or unrecognised → chatml. */
tn_chat_tmpl tn_chat_detect(const char *tmpl);
const char *tn_chat_name(tn_chat_tmpl t);
typedef struct tn_chat_msg {
    const char *role;
    const char *content;
    size_t len;
} tn_chat_msg;
/* Renders messages (+ the assistant header) into a malloc'd NUL-terminated string. */
char *tn_chat_render(tn_chat_tmpl t, const tn_chat_msg *msgs, size_t n, size_t *len);

/* ---- requests -------------------------------------------------------------------------------- */
enum { TN_REQ_COMPLETION = 0, TN_REQ_CHAT = 1 };

typedef struct tn_req_params {
    int kind;
    bool stream, include_usage, ignore_eos;
    int32_t max_tokens;            /* after clamping to the context                          */
    tern_sampler_params sp;
    char *stop[TN_SRV_MAX_STOP];
    int n_stop;
    int32_t *bias_tok;
    float *bias_val;
    int n_bias;
    tern_token *prompt;            /* tokens (BOS included as the model wants)               */
    int32_t n_prompt;
} tn_req_params;

typedef struct tn_req_env {       /* what validation needs to know about the server          */
    const tern_model *model;
    tn_chat_tmpl tmpl;
    int32_t n_ctx_seq;             /* most tokens (prompt + generated) per sequence          */
    int32_t n_vocab;
} tn_req_env;

/* Parses and validates a /v1/completions or /v1/chat/completions body; tokenizes the prompt.
 * On failure fills err (status 400/413/...) and returns false; p is then already released. */
bool tn_req_parse(const char *body, size_t len, int kind, const tn_req_env *env, tn_req_params *p, tn_http_err *err);
void tn_req_params_free(tn_req_params *p);
/* Deepest nesting of [ and { outside strings (a pre-check before jansson). */
int tn_json_depth(const char *s, size_t n);

/* ---- the shared request object -------------------------------------------------------------- */
enum { TN_SREQ_QUEUED = 0, TN_SREQ_RUNNING, TN_SREQ_DONE };

typedef struct tn_sreq {
    tn_req_params p;
    char id[48];
    int64_t created;
    double t_arrival, t_admit, t_first, t_last, t_done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *out;              /* emitted (valid UTF-8, stop strings removed) text            */
    size_t out_len, out_cap;
    int32_t n_gen, n_cached;
    int state;
    const char *finish;     /* "stop" / "length" once done                                 */
    tn_http_err err;        /* err.status != 0: failed                                      */
    atomic_int cancelled;
    int refs;
} tn_sreq;

tn_sreq *tn_sreq_new(void);
void tn_sreq_release(tn_sreq *r); /* drops one reference; frees at zero */

/* ---- metrics ---------------------------------------------------------------------------------- */
#define TN_HIST_N 14
typedef struct tn_hist {
    double sum;
    uint64_t count, b[TN_HIST_N];
} tn_hist;

typedef struct tn_metrics {
    pthread_mutex_t mu;
    uint64_t prompt_tokens, cached_tokens, gen_tokens, steps, batch_tokens;
    uint64_t rejected_queue, rejected_slo, rejected_draining, rejected_invalid, cancelled;
    uint64_t finished_stop, finished_length, finished_error;
    uint64_t slo_met, slo_total;
    tn_hist ttft, itl, e2e, queue;
    int running, waiting;
    double kv_usage;
    int32_t kv_blocks;
} tn_metrics;

void tn_metrics_init(tn_metrics *m);
void tn_hist_add(tn_hist *h, double v);
/* Prometheus text exposition (malloc'd). */
char *tn_metrics_render(tn_metrics *m, const char *model_id, const double cost[3]);

/* ---- engine --------------------------------------------------------------------------------- */
typedef struct tn_engine tn_engine;

tern_status tn_engine_create(const tern_model *m, const tn_serve_config *cfg, tn_metrics *met, tn_engine **out);
void tn_engine_destroy(tn_engine *e);
/* Queues r (takes a reference). Fills err and returns false when the queue is full (429), the
 * SLO predictor says the TTFT objective cannot be met (429), or the server drains (503). */
bool tn_engine_submit(tn_engine *e, tn_sreq *r, tn_http_err *err, int *retry_after_s);
void tn_engine_drain(tn_engine *e);     /* refuse new work; let running/queued requests finish */
void tn_engine_cancel_all(tn_engine *e);
bool tn_engine_idle(tn_engine *e);
int32_t tn_engine_n_ctx_seq(const tn_engine *e);
/* cost model: seconds per step base, per decode sequence, per prefill token */
void tn_engine_cost(const tn_engine *e, double out[3]);

/* Copies s[0..n) as valid UTF-8 to dst+*dlen (capacity >= *dlen + 3n + 1; NUL-terminated),
 * invalid bytes as U+FFFD; an incomplete trailing sequence is left unless final. Returns the
 * bytes of s consumed. */
size_t tn_utf8_copy(char *dst, size_t *dlen, const char *s, size_t n, bool final);

/* Monotonic seconds. */
double tn_srv_now(void);

#endif
