/*
 * serve.h — tern's OpenAI-compatible inference server (library side): configuration, the shared
 * request object passed between HTTP threads and the engine thread, request validation (the chat
 * templates are the library's, model/chat.c), metrics. tools/tern/cmd_serve.c only parses flags
 * and calls tn_serve_run().
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
    bool no_repack;        /* keep the file's weight layouts (tern_model_params.repack)        */
    uint64_t hot_experts;  /* tern_model_params.hot_experts (--hot-experts)                     */
    bool swa_full;         /* sliding-window layers keep every position (--swa-full); default:
                            * a pool of window blocks of their own (engine.c)                  */
    int32_t device;        /* TERN_DEVICE_CPU | TERN_DEVICE_CUDA (--device)                     */
    int32_t n_gpu_layers;  /* -ngl: layers on the GPU (-1 all)                                 */
    int32_t type_k, type_v;/* KV cache types (-ctk / -ctv; TERN_KV_*, 0: f16)                  */
    int32_t kv_rot;        /* --kv-rotate (TERN_KV_ROT_*, 0: auto)                             */
    double step_delay_ms;  /* testing only: sleep after each engine step (makes races visible) */
    bool debug_fail_alloc; /* testing only: honour `X-Tern-Fail-Alloc: N[,persistent]`: the N-th */
                           /* allocation after the request arrives fails (tn_alloc_fail_at)      */
    bool quiet;
    int chat_template;     /* a tern_chat_template; -1 (default): the model's (tern_chat_template_detect) */
    /* speculative decoding (engine.c): --spec ngram verifies n-gram drafts of each sequence's text */
    bool spec_ngram;
    int32_t draft_min, draft_max; /* drafts per sequence and step; fewer than draft_min: none  */
    int32_t spec_ngram_n;  /* longest n-gram matched (--spec-ngram)                            */
    bool spec_fixed;       /* every step drafts draft_max where found (no cost model)           */
    const char *draft_path; /* --draft FILE: a draft model with the same vocabulary (tn_serve_run
                            * loads it into draft_model, which the engine drafts with greedily) */
    const tern_model *draft_model;
    float draft_p_min;     /* --draft-p-min: the draft model stops before a token it gives less (0: never) */
    /* LoRA adapters (--lora): n_lora files with their scales, loaded by tn_serve_run into lora,
     * which the engine sets on its context (CPU only) */
    int32_t n_lora;
    const char *const *lora_paths;
    const float *lora_scales;
    tern_lora *const *lora;
    /* --prompt-cache DIR (model/pcache.h): prompt blocks the prefix cache misses are looked up on
     * disk and loaded into fresh blocks; computed prompt blocks are stored (NULL: off) */
    const char *prompt_cache_dir;
    uint64_t prompt_cache_max_bytes; /* --prompt-cache-max-gb (0: unbounded)                   */
    int prompt_cache_quality;        /* a tn_pc_quality                                       */
    double prompt_cache_prefill_tok_s; /* prefill speed the load decision compares with (0: the
                                        * engine's cost model; TERN_PCACHE_PREFILL_TOK_S, tests) */
    /* --slot-save-path DIR: POST /slots/{id}?action=save|restore|erase (llama-server's) work with
     * files in DIR (NULL: those answer 501, as llama-server does) */
    const char *slot_save_path;
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
#define TN_SRV_MAX_N 16            /* choices per request (n)                                  */
#define TN_SRV_MAX_TOP_LOGPROBS 20 /* chat top_logprobs, n_probs                               */
#define TN_SRV_MAX_LOGPROBS_LEGACY 5 /* /v1/completions integer logprobs (OpenAI's cap)        */
#define TN_SRV_MAX_DETOK 65536     /* ids per /detokenize                                      */

/* ---- growable text buffer (buf.c) ------------------------------------------------------------ */
typedef struct tn_buf {
    char *p;            /* NUL-terminated once anything was put                              */
    size_t n, cap;
    bool oom;           /* an allocation failed: later puts are dropped, tn_buf_take gives NULL */
} tn_buf;

bool tn_buf_reserve(tn_buf *b, size_t extra);
void tn_buf_put(tn_buf *b, const char *s, size_t n);
void tn_buf_puts(tn_buf *b, const char *s);
void tn_buf_printf(tn_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The text (the caller tn_frees it; NULL after a failed allocation, or if nothing was put); the
 * buffer is empty again. */
char *tn_buf_take(tn_buf *b, size_t *len);

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

/* ---- requests -------------------------------------------------------------------------------- */
enum { TN_REQ_COMPLETION = 0, TN_REQ_CHAT = 1 };

typedef struct tn_req_params {
    int kind;
    bool stream, include_usage, ignore_eos;
    int32_t max_tokens;            /* after clamping to the context                          */
    int n;                         /* choices generated, 1..TN_SRV_MAX_N (best_of if given)  */
    int n_return;                  /* choices returned: n, or fewer with best_of (the ones   */
                                   /* with the highest mean token logprob)                   */
    bool logprobs;                 /* return log-probabilities of the sampled tokens         */
    int top_logprobs;              /* and of this many most likely tokens at each position   */
    float presence_penalty, frequency_penalty; /* OpenAI's, over generated tokens            */
    tern_sampler_params sp;        /* seed: TERN_SEED_RANDOM when not given                  */
    char *stop[TN_SRV_MAX_STOP];
    int n_stop;
    int32_t *bias_tok;
    float *bias_val;
    int n_bias;
    tern_token *prompt;            /* tokens (BOS included as the model wants)               */
    int32_t n_prompt;
    bool echo;                     /* completions: the prompt text comes before the output   */
    char *echo_text;               /* the prompt as given (a string), else detokenized; UTF-8 */
    size_t echo_len;
    int32_t echo_chars;            /* its code points (text_offset of the first output token) */
    int32_t *prompt_off;           /* [n_prompt] with echo: text_offset of each prompt token  */
} tn_req_params;

typedef struct tn_req_env {       /* what validation needs to know about the server          */
    const tern_model *model;
    tern_chat_template tmpl;       /* the model's, or --chat-template's                     */
    int32_t n_ctx_seq;             /* most tokens (prompt + generated) per sequence          */
    int32_t n_vocab;
} tn_req_env;

/* Parses and validates a /v1/completions or /v1/chat/completions body; tokenizes the prompt.
 * On failure fills err (status 400/413/...) and returns false; p is then already released. */
bool tn_req_parse(const char *body, size_t len, int kind, const tn_req_env *env, tn_req_params *p, tn_http_err *err);
void tn_req_params_free(tn_req_params *p);
/* Makes jansson allocate through tn_malloc (once, before any JSON is touched). */
void tn_json_alloc_init(void);
/* Parses a request body that must be a JSON object (nesting capped, duplicate keys refused).
 * NULL with err: 400 for bad JSON, 500 when an allocation failed. */
typedef struct json_t json_t;
json_t *tn_json_parse(const char *body, size_t len, tn_http_err *err);
/* Compact JSON text (tn_free it), or NULL for NULL or when an allocation failed. */
char *tn_json_dumps(json_t *j);
/* Deepest nesting of [ and { outside strings (a pre-check before jansson). */
int tn_json_depth(const char *s, size_t n);

/* ---- the shared request object -------------------------------------------------------------- */
enum { TN_SREQ_QUEUED = 0, TN_SREQ_RUNNING, TN_SREQ_DONE };

/* One log-probability: a token and log p(token) under the raw model logits (log-softmax before
 * temperature, penalties and logit_bias). */
typedef struct tn_lp {
    tern_token tok;
    float lp;
} tn_lp;

/* One choice (of n) of a request: its emitted text and, with logprobs, one entry per generated
 * token. Written by the engine thread, read by the connection thread, both under tn_sreq.mu. */
typedef struct tn_choice {
    char *out;              /* emitted (valid UTF-8, stop strings removed) text            */
    size_t out_len, out_cap;
    int32_t n_gen;          /* tokens generated (counted in usage)                          */
    const char *finish;     /* "stop" / "length" once finished; NULL while running/cancelled */
    double lp_sum;          /* log-probability of every sampled token (EOS too): best_of    */
    int32_t n_lp_sum;
    tn_lp *lp;              /* [n_lp][1 + top_logprobs]: the sampled token, then the top ones */
    int32_t *lp_off;        /* [n_lp] characters of generated text before each token         */
    int32_t n_lp, lp_cap;
} tn_choice;

typedef struct tn_sreq {
    tn_req_params p;
    char id[48];
    int64_t created;
    double t_arrival, t_admit, t_first, t_last, t_done;
    double ttft_pred;       /* predicted at admission (seconds from arrival; trace only)      */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tn_choice *ch;          /* [p.n]                                                         */
    int32_t n_cached;       /* prompt tokens of choice 0 found in the prefix cache           */
    int state;
    tn_http_err err;        /* err.status != 0: failed (429: refused from the queue)          */
    int retry_after_s;      /* with a 429 from the queue                                     */
    tn_lp *plp;             /* echo + logprobs: [n_prompt][1 + top_logprobs], entry 0 unused  */
    bool echo_ready;        /* plp is complete (choice 0 computed the whole prompt)           */
    atomic_int cancelled;
    int refs;
    /* engine side (engine thread, or under the engine's mutex) */
    int n_admitted, n_live; /* choices given a sequence; choices running now                 */
    bool in_queue, prompt_ready; /* prompt_ready: choice 0 computed the prompt's K/V         */
    uint64_t base_seed;
    int32_t max_gen;        /* most tokens of any choice (TPOT)                              */
} tn_sreq;

/* New request with refs = 1; tn_sreq_choices allocates its p.n choices (after parsing). */
tn_sreq *tn_sreq_new(void);
bool tn_sreq_choices(tn_sreq *r);
/* Completion tokens over all choices (caller holds r->mu). */
int32_t tn_sreq_n_gen(const tn_sreq *r);
void tn_sreq_release(tn_sreq *r); /* drops one reference; frees at zero */

/* ---- response bodies (resp.c; NULL when out of memory; the request's mu held) --------------- */
json_t *tn_resp_error(const tn_http_err *e);
json_t *tn_resp_usage(const tn_sreq *r);
/* Logprobs of choice ci's tokens [from, to) in the request's shape (chat or legacy); JSON null
 * when the request did not ask for them. */
json_t *tn_resp_logprobs(const tern_model *m, const tn_sreq *r, int ci, int32_t from, int32_t to);
/* echo: the prompt tokens' logprobs in the legacy shape (JSON null without logprobs). */
json_t *tn_resp_echo_logprobs(const tern_model *m, const tn_sreq *r);
json_t *tn_resp_final(const tern_model *m, const char *model_id, const tn_sreq *r);
/* One stream chunk for choice ci (steals delta_or_text and logprobs; logprobs may be NULL). */
json_t *tn_resp_chunk(const char *model_id, const tn_sreq *r, int ci, json_t *delta_or_text, json_t *logprobs,
                      const char *finish);
json_t *tn_resp_usage_chunk(const char *model_id, const tn_sreq *r);

/* ---- metrics ---------------------------------------------------------------------------------- */
#define TN_HIST_N 14
#define TN_SPEC_LEN_N 7 /* buckets of the chosen speculation length: 0 1 2 4 8 16 32 */
typedef struct tn_hist {
    double sum;
    uint64_t count, b[TN_HIST_N];
} tn_hist;

typedef struct tn_metrics {
    pthread_mutex_t mu;
    uint64_t prompt_tokens, cached_tokens, gen_tokens, steps, batch_tokens;
    uint64_t rejected_queue, rejected_slo, rejected_deadline, rejected_draining, rejected_invalid, cancelled;
    uint64_t finished_stop, finished_length, finished_error;
    uint64_t slo_met, slo_total;
    tn_hist ttft, itl, e2e, queue;
    int running, waiting;
    double kv_usage;
    int32_t kv_blocks, kv_used, kv_reserved;
    int32_t kv_swa_blocks, kv_swa_used; /* sliding-window layers' pool (0 blocks: none)        */
    double load_mean, load_sd;     /* step time actual / predicted (the scheduler's load factor) */
    bool spec;                     /* speculative decoding on: its metrics are rendered          */
    uint64_t spec_drafted, spec_accepted; /* draft tokens verified, and kept                     */
    uint64_t spec_len[TN_SPEC_LEN_N + 1]; /* chosen lengths: count with k <= tn_spec_len_bounds[i], then all */
    uint64_t spec_len_sum;
    uint64_t pc_declined;          /* prompts whose disk blocks loaded slower than prefill: rest recomputed */
} tn_metrics;

void tn_metrics_init(tn_metrics *m);
void tn_hist_add(tn_hist *h, double v);
void tn_metrics_spec_len(tn_metrics *m, int32_t k); /* one chosen speculation length (caller holds mu) */
/* Prometheus text exposition (malloc'd). */
/* pc: the disk prompt cache's counters (NULL: no --prompt-cache, none rendered). */
struct tn_pcache_stats; /* model/pcache.h */
char *tn_metrics_render(tn_metrics *m, const char *model_id, const double cost[3], const struct tn_pcache_stats *pc);

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
/* The disk prompt cache's counters (false, *out untouched: no --prompt-cache). Any thread. */
bool tn_engine_pcache_stats(const tn_engine *e, struct tn_pcache_stats *out);

/* ---- slots (llama-server's /slots API) ----------------------------------------------------------
 * Slot i is the engine's sequence i (--parallel N: slots 0..N-1). It holds the tokens of the
 * request it runs, and once that ends, the tokens of the last one (prompt + generated) whose whole
 * blocks stay in the prefix cache until evicted (LRU) or erased. Save writes the slot's blocks
 * still in memory to a file (serve/slot.h); restore puts a file's blocks in the prefix cache, so a
 * later request whose prompt starts with those tokens skips their prefill. The actions run on the
 * engine thread between steps. */
enum { TN_SLOT_LIST = 0, TN_SLOT_SAVE, TN_SLOT_RESTORE, TN_SLOT_ERASE };
/* Runs an action on slot id (LIST: every slot; fail_on_no_slot: 503 when none is idle); path and
 * filename: the file of save/restore. Returns the response body, or NULL with err filled
 * (400 bad slot id or file, 404 no file, 409 slot busy, 501 unsupported, 503 no KV room). */
json_t *tn_engine_slot_action(tn_engine *e, int action, int id, const char *path, const char *filename, bool fail_on_no_slot,
                              tn_http_err *err);

/* Copies s[0..n) as valid UTF-8 to dst+*dlen (capacity >= *dlen + 3n + 1; NUL-terminated),
 * invalid bytes as U+FFFD; an incomplete trailing sequence is left unless final. Returns the
 * bytes of s consumed. */
size_t tn_utf8_copy(char *dst, size_t *dlen, const char *s, size_t n, bool final);

/* Monotonic seconds. */
double tn_srv_now(void);

#endif
