/*
 * tern.h — the one public header of libtern.
 *
 * tern runs Llama-family GGUF models on CPUs. This header exposes opaque handles and a small C API:
 * load a model, create a context (KV cache + scratch), tokenize, decode, sample.
 *
 * Conventions:
 *  - Every fallible call returns tern_status (TERN_OK == 0). Objects come back through the last
 *    out-pointer, which stays NULL on failure. tern_last_error() then describes what went wrong
 *    (thread-local; valid until the next failing call on the same thread).
 *  - Parameter structs start with struct_size and are filled by *_params_init(); pass them by
 *    pointer. New fields are only ever appended.
 *  - A tern_model is immutable after load and may be shared by threads. A tern_ctx is used by one
 *    thread at a time.
 *  - The library never exits, aborts on input data, or prints (install a log callback to see logs).
 */
#ifndef TERN_TERN_H
#define TERN_TERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TERN_BUILD) && defined(__GNUC__)
#define TERN_API __attribute__((visibility("default")))
#else
#define TERN_API
#endif

#define TERN_VERSION_MAJOR 0
#define TERN_VERSION_MINOR 1
#define TERN_VERSION_PATCH 0

typedef enum tern_status {
    TERN_OK = 0,
    TERN_ERR_NOMEM,        /* allocation failed or a size limit was hit                     */
    TERN_ERR_IO,           /* read/write/fsync/rename failed                                */
    TERN_ERR_FORMAT,       /* malformed file or data                                        */
    TERN_ERR_UNSUPPORTED,  /* valid but not supported (tensor type, architecture, ...)      */
    TERN_ERR_INVALID_ARG,  /* bad argument from the caller                                  */
    TERN_ERR_STATE,        /* call not valid in the object's current state                  */
    TERN_ERR_FULL,         /* context / KV cache / queue full                               */
    TERN_ERR_ABORTED,      /* cancelled by a callback or signal                             */
    TERN_ERR_INTERNAL,     /* a bug in tern                                                 */
    TERN_ERR_NOT_FOUND,    /* file missing or unreadable                                    */
} tern_status;

TERN_API const char *tern_status_str(tern_status s);
/* Message of the last failure on this thread ("" if none): names module, object and numbers. */
TERN_API const char *tern_last_error(void);
TERN_API const char *tern_version_string(void);

/* ---- logging --------------------------------------------------------------------------------- */
typedef enum tern_log_level { TERN_LOG_DEBUG = 0, TERN_LOG_INFO, TERN_LOG_WARN, TERN_LOG_ERROR } tern_log_level;
typedef void (*tern_log_fn)(tern_log_level level, const char *msg, void *user);
/* Installs a log callback (NULL = silent, the default). Not thread-safe against concurrent logging. */
TERN_API void tern_set_log(tern_log_fn fn, void *user);

/* ---- models ---------------------------------------------------------------------------------- */
typedef struct tern_model tern_model;
typedef struct tern_ctx tern_ctx;
typedef struct tern_sampler tern_sampler;
typedef int32_t tern_token;

/* Progress callback: return non-zero to cancel (the call then fails with TERN_ERR_ABORTED). */
typedef int (*tern_progress_fn)(uint64_t done, uint64_t total, void *user);

typedef struct tern_model_params {
    uint32_t struct_size;
    bool use_mmap;           /* map tensor data (default true); false reads it into memory   */
    bool check_tensors;      /* scan weights for NaN/Inf at load (default false)             */
    tern_progress_fn progress;
    void *progress_user;
    bool repack;             /* interleave q4_0/q8_0/tq4/tq1 weight rows at load for the CPU's batched
                                kernels, where it has them (default true; the repacked weights
                                live in memory instead of the file mapping, same size)       */
    uint64_t hot_experts;    /* mixture-of-experts models: bytes of 2 MiB pages the most used experts
                                are copied into as a context's routing counters show them (FreqTier);
                                0 (default): every expert stays where the file put it       */
} tern_model_params;

TERN_API void tern_model_params_init(tern_model_params *p);

/* Hot experts (tern_model_params.hot_experts) of a model, and of one context's routing. */
typedef struct tern_hot_experts {
    uint64_t budget_bytes, used_bytes;
    int64_t n_hot, n_experts;  /* experts copied / experts of all MoE layers                  */
    uint64_t rows, rows_hot;   /* tern_ctx_hot_experts: rows the context routed, and to hot experts
                                  (since its counters were last reset)                         */
} tern_hot_experts;
TERN_API tern_status tern_model_load(const char *path, const tern_model_params *p, tern_model **out);
TERN_API void tern_model_free(tern_model *m);

TERN_API int32_t tern_model_n_vocab(const tern_model *m);
TERN_API int32_t tern_model_n_ctx_train(const tern_model *m);
TERN_API int32_t tern_model_n_embd(const tern_model *m);
TERN_API int32_t tern_model_n_layer(const tern_model *m);
TERN_API uint64_t tern_model_n_params(const tern_model *m);
TERN_API uint64_t tern_model_size_bytes(const tern_model *m); /* bytes of weights */
/* Short description, e.g. "llama 260K Q8_0". Owned by the model. */
TERN_API const char *tern_model_desc(const tern_model *m);
/* A metadata value rendered as text into buf (truncated to cap); returns bytes needed or -1. */
TERN_API int32_t tern_model_meta_str(const tern_model *m, const char *key, char *buf, size_t cap);

/* ---- tokenizer ------------------------------------------------------------------------------- */
TERN_API tern_token tern_token_bos(const tern_model *m);   /* -1 if none */
TERN_API tern_token tern_token_eos(const tern_model *m);   /* -1 if none */
TERN_API bool tern_token_is_eog(const tern_model *m, tern_token t); /* end of generation */
TERN_API bool tern_vocab_add_bos(const tern_model *m);

/* Tokenizes text[0..len). add_special: prepend BOS (and append EOS) as the file says.
 * parse_special: recognise special-token text such as "<|eot_id|>".
 * Writes up to cap tokens; *n_out gets the total count. If cap is too small, returns
 * TERN_ERR_FULL with *n_out = the count needed. */
TERN_API tern_status tern_tokenize(const tern_model *m, const char *text, size_t len, bool add_special,
                                   bool parse_special, tern_token *out, int32_t cap, int32_t *n_out);
/* Bytes of one token's piece written to buf (not NUL-terminated). Returns the length, or
 * -(needed) if cap is too small, or INT32_MIN for an invalid token. special: render control
 * tokens as text (else they render empty). */
TERN_API int32_t tern_token_to_piece(const tern_model *m, tern_token t, char *buf, int32_t cap, bool special);
/* Detokenizes n tokens into buf; same return convention as tern_token_to_piece. Handles the
 * SentencePiece leading-space rule when remove_leading_space is true. */
TERN_API int32_t tern_detokenize(const tern_model *m, const tern_token *toks, int32_t n, char *buf, int32_t cap,
                                 bool remove_leading_space, bool special);

/* ---- contexts -------------------------------------------------------------------------------- */
typedef struct tern_ctx_params {
    uint32_t struct_size;
    int32_t n_ctx;       /* KV cache length in tokens; 0 = the model's context_length           */
    int32_t n_batch;     /* most tokens per tern_decode call (default 512)                       */
    int32_t n_threads;   /* worker threads (default: number of online CPUs)                      */
    bool logits_all;     /* keep logits for every token of a batch (perplexity), else only last */
    int32_t device;      /* TERN_DEVICE_CPU (default) or TERN_DEVICE_CUDA: the model's layers run on
                            the GPU, its KV cache lives there (load the model with repack = false) */
    int32_t n_gpu_layers;/* with TERN_DEVICE_CUDA: layers 0 .. N-1 on the GPU, the rest (and then the
                            output) on the CPU; -1 (default) = all                                */
    bool swa_full;       /* sliding-window layers (Gemma 2/3) keep every position, as global layers
                            do; false (default): only their window plus one batch, as a ring, so
                            the cache grows with the global layers only (see tern_ctx_truncate) */
    int32_t type_k;      /* element type of the cached K rows: TERN_KV_F16 (0 also means f16, the
                            default), TERN_KV_Q8_0 or TERN_KV_Q4_0 (ggml's block layouts, 32 values a
                            block), or TERN_KV_TQ(b), b = 2..8 (tern's tq<b>g32a: b-bit codes with an
                            fp16 scale and offset per 32 values); for the quantized types the
                            model's head size must be a multiple of 32; CPU only                 */
    int32_t type_v;      /* the same for the cached V rows                                        */
    int32_t kv_rotate;   /* which quantized halves of the cache hold rotated heads (an orthogonal
                            Hadamard-times-signs rotation per head: K with the queries, V with the
                            attention output turned back; scores and outputs are unchanged up to
                            rounding, the quantization error lower where a few channels are large):
                            TERN_KV_ROT_AUTO (0, default: a quantized K), _NONE, _K, _V, _KV. An
                            f16 half and a latent (MLA) cache are never rotated                   */
} tern_ctx_params;

enum { TERN_DEVICE_CPU = 0, TERN_DEVICE_CUDA = 1 };
/* KV cache types (tern_ctx_params type_k / type_v): ggml's type ids. */
enum { TERN_KV_F16 = 1, TERN_KV_Q4_0 = 2, TERN_KV_Q8_0 = 8 };
/* tern's any-bit KV type of b bits (2..8): the dtype id of tq<b>g32a. */
#define TERN_KV_TQ(b) (1024 + ((b) - 1) * 8 + 1)
/* TERN_KV_TQC(b), b = 2..4: per-channel K ("tqc<b>", K only; KIVI's layout): each key channel
 * quantized to b bits over the 16 positions of a cache block (b + 2 bits a value), the newest
 * block's keys kept in f16 until it is complete (a window per sequence). Not for V, the CUDA
 * backend, sliding-window, latent (MLA) or attention-sink models. */
#define TERN_KV_TQC(b) (1118 + (b))
/* tern_ctx_params kv_rotate */
enum { TERN_KV_ROT_AUTO = 0, TERN_KV_ROT_NONE = 1, TERN_KV_ROT_K = 2, TERN_KV_ROT_V = 3, TERN_KV_ROT_KV = 4 };
/* The TERN_KV_ROT_* called name ("auto", "none", "k", "v", "kv"); -1 if none. */
TERN_API int32_t tern_kv_rotate_from_name(const char *name);
/* "f16", "q8_0", "q4_0" or "tq2" .. "tq8" for a KV cache type, NULL for any other value. */
TERN_API const char *tern_kv_type_name(int32_t type);
/* The KV cache type called name ("f16", "q8_0", "q4_0", "tq2" .. "tq8", any case); -1 if none. */
TERN_API int32_t tern_kv_type_from_name(const char *name);

TERN_API void tern_ctx_params_init(tern_ctx_params *p);
TERN_API tern_status tern_ctx_create(const tern_model *m, const tern_ctx_params *p, tern_ctx **out);
TERN_API void tern_ctx_free(tern_ctx *c);
/* c runs its passes on with's threads from now on (its own are stopped): for two contexts one
 * caller uses in turn, such as a speculative draft model's and its target's, so that the idle
 * one's threads do not spin or yield on cores the busy one needs. Both must have been created
 * with the same n_threads, on the CPU, and must never run at the same time. Either may be freed
 * first. */
TERN_API tern_status tern_ctx_share_threads(tern_ctx *c, tern_ctx *with);
TERN_API int32_t tern_ctx_n_ctx(const tern_ctx *c);
/* Bytes of the context's KV cache (K and V of every layer, host memory). */
TERN_API uint64_t tern_ctx_kv_bytes(const tern_ctx *c);
/* The context's KV cache types (TERN_KV_*), as created. */
TERN_API int32_t tern_ctx_type_k(const tern_ctx *c);
TERN_API int32_t tern_ctx_type_v(const tern_ctx *c);
/* Which halves of the context's cache are rotated (tern_ctx_params kv_rotate, resolved): bit 0 K,
 * bit 1 V. */
TERN_API int32_t tern_ctx_kv_rotated(const tern_ctx *c);
/* Number of tokens currently in the KV cache (the next position). */
TERN_API int32_t tern_ctx_n_past(const tern_ctx *c);
/* Drops KV entries at positions >= n_past (0 clears). On a model with sliding-window layers and
 * swa_full false, a window that later positions have overwritten cannot be restored: when
 * n_past is more than n_batch positions back, the cache is cleared instead (tern_ctx_n_past then
 * says 0; continue from it). */
TERN_API tern_status tern_ctx_truncate(tern_ctx *c, int32_t n_past);

/* Runs the model on n tokens at positions n_past .. n_past+n-1 and appends them to the KV cache.
 * n may exceed n_batch (processed in chunks). Fails with TERN_ERR_FULL when the context is full,
 * TERN_ERR_INVALID_ARG for a token id outside the vocabulary. */
TERN_API tern_status tern_decode(tern_ctx *c, const tern_token *toks, int32_t n);
/* The model's hot experts and this context's routed rows (zeroes for a dense model or no budget). */
TERN_API void tern_ctx_hot_experts(const tern_ctx *c, tern_hot_experts *out);
/* Logits (n_vocab floats) of the last token of the last tern_decode, or with logits_all of the
 * i-th token of that call (i < n). NULL if unavailable. */
TERN_API const float *tern_get_logits(const tern_ctx *c, int32_t i);

/* ---- LoRA adapters ---------------------------------------------------------------------------
 * llama.cpp's GGUF LoRA adapters (general.type "adapter", adapter.type "lora", tensors
 * "<base tensor>.lora_a" [n_in, r] / ".lora_b" [r, n_out], f32, f16, bf16 or q8_0 ...). An
 * adapted matmul computes W x + scale * alpha / r * B (A x) (scale alone without alpha), on the
 * CPU, for attention q/k/v/o (and a fused qkv), ffn gate/up/down and the output matrix. */
typedef struct tern_lora tern_lora;
/* Loads an adapter and checks it against model m: general.type, adapter.type, the architecture,
 * every base tensor present with matching n_in / n_out, ranks of a and b equal; TERN_ERR_FORMAT
 * (or UNSUPPORTED for tensors tern cannot adapt, e.g. embeddings or experts) naming the tensor.
 * The adapter keeps its weights as f32 and refers to m: free it before m. */
TERN_API tern_status tern_lora_load(const tern_model *m, const char *path, tern_lora **out);
TERN_API void tern_lora_free(tern_lora *a);
TERN_API int32_t tern_lora_n_tensors(const tern_lora *a); /* adapted matmuls (fused slices count each) */
TERN_API float tern_lora_alpha(const tern_lora *a);       /* adapter.lora.alpha, 0 if absent         */
/* Applies adapters a[0..n) with scales[i] to every following tern_decode of c (replacing what was
 * set before; n = 0 removes them). The adapters must stay alive while set. A CUDA context:
 * TERN_ERR_UNSUPPORTED. Scale 0 gives exactly the base model's logits. */
TERN_API tern_status tern_ctx_set_lora(tern_ctx *c, tern_lora *const *a, const float *scales, int32_t n);

/* ---- sampling -------------------------------------------------------------------------------- */
typedef struct tern_sampler_params {
    uint32_t struct_size;
    float temp;            /* 0.8; <= 0 means greedy                                           */
    int32_t top_k;         /* 40; 0 = off                                                     */
    float top_p;           /* 0.95; 1 = off                                                   */
    float min_p;           /* 0.05; 0 = off                                                   */
    float repeat_penalty;  /* 1.0 = off                                                       */
    int32_t repeat_last_n; /* 64                                                              */
    uint64_t seed;         /* TERN_SEED_RANDOM picks one (see tern_sampler_seed)               */
} tern_sampler_params;
#define TERN_SEED_RANDOM UINT64_C(0xFFFFFFFF)

TERN_API void tern_sampler_params_init(tern_sampler_params *p);
TERN_API tern_status tern_sampler_create(const tern_model *m, const tern_sampler_params *p, tern_sampler **out);
TERN_API void tern_sampler_free(tern_sampler *s);
TERN_API uint64_t tern_sampler_seed(const tern_sampler *s);
/* Picks a token from logits (n_vocab floats) and records it in the repeat-penalty history. */
TERN_API tern_token tern_sampler_sample(tern_sampler *s, const float *logits);
/* Records a token (e.g. prompt tokens) in the repeat-penalty history without sampling. */
TERN_API void tern_sampler_accept(tern_sampler *s, tern_token t);

/* ---- chat templates -------------------------------------------------------------------------- */
/* Chat templates written out in C (src/model/chat.c); a file's tokenizer.chat_template (Jinja) is only
 * scanned for recognisable markers, never executed. BOS is never rendered: tokenize the result with
 * add_special = true and parse_special = true. */
typedef enum tern_chat_template {
    TERN_CHAT_CHATML = 0, /* <|im_start|>role\n...<|im_end|>\n (Qwen2, SmolLM, SmolLM3, ...)           */
    TERN_CHAT_LLAMA2,     /* [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] answer </s><s>[INST] ...     */
    TERN_CHAT_LLAMA3,     /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>                 */
    TERN_CHAT_QWEN3,      /* chatml; an answer before the last user turn loses its <think>...</think> */
    TERN_CHAT_GEMMA,      /* <start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n             */
    TERN_CHAT_PHI3,       /* <|user|>\n...<|end|>\n<|assistant|>\n                                     */
    TERN_CHAT_PHI4,       /* <|im_start|>user<|im_sep|>...<|im_end|>                                   */
    TERN_CHAT_GPT_OSS,    /* harmony: <|start|>user<|message|>...<|end|><|start|>assistant (gpt-oss)    */
    TERN_CHAT_N_TEMPLATES
} tern_chat_template;

typedef struct tern_chat_msg {
    const char *role;    /* "system", "user", "assistant" (others are rendered as given)          */
    const char *content; /* len bytes, need not be NUL-terminated                                  */
    size_t len;
} tern_chat_msg;

/* Name of a template ("chatml", "llama2", ...); NULL for a value out of range. */
TERN_API const char *tern_chat_template_name(tern_chat_template t);
/* The template of that name; TERN_ERR_INVALID_ARG naming it and listing the known names otherwise. */
TERN_API tern_status tern_chat_template_from_name(const char *name, tern_chat_template *out);
/* The model's template: from the markers of its tokenizer.chat_template, else its special tokens,
 * else its architecture; chatml when nothing is recognised. */
TERN_API tern_chat_template tern_chat_template_detect(const tern_model *m);
/* The strings that end an assistant turn in this template (NULL-terminated list, static), e.g.
 * "<|im_end|>"; the model's end-of-generation tokens end it too. */
TERN_API const char *const *tern_chat_template_stops(tern_chat_template t);
/* The tokens of the model's vocabulary whose text is one of the template's end-of-turn strings
 * (an answer ends at them, as at tern_token_is_eog); writes at most cap, returns how many. */
TERN_API int32_t tern_chat_stop_tokens(const tern_model *m, tern_chat_template t, tern_token *out, int32_t cap);
/* Renders n messages, then (add_assistant) the header that starts the assistant's answer, into
 * buf as NUL-terminated text; *len gets its length without the NUL. If cap <= *len, returns
 * TERN_ERR_FULL (buf holds a truncated prefix, not terminated): call again with cap > *len.
 * TERN_ERR_INVALID_ARG for an unknown template or a message without role or content. */
TERN_API tern_status tern_chat_apply(tern_chat_template t, const tern_chat_msg *msgs, size_t n, bool add_assistant,
                                     char *buf, size_t cap, size_t *len);

#ifdef __cplusplus
}
#endif
#endif /* TERN_TERN_H */
