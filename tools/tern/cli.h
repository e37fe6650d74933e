/*
 * cli.h — shared pieces of the tern subcommands: exit codes, error printing, flag parsing.
 */
#ifndef TERN_CLI_H
#define TERN_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "tern/tern.h"

enum {
    TN_EXIT_OK = 0,
    TN_EXIT_USAGE = 64,
    TN_EXIT_DATAERR = 65,
    TN_EXIT_NOINPUT = 66,
    TN_EXIT_SOFTWARE = 70,
    TN_EXIT_OSERR = 71,
    TN_EXIT_IOERR = 74,
    TN_EXIT_INTERRUPTED = 130,
};

typedef struct tn_cmd {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} tn_cmd;

#define TN_CMD(name, fn, help) int fn(int argc, char **argv);
#include "commands.inc"
#undef TN_CMD

/* Exit code for a status. */
int tn_cli_exit_code(tern_status s);
/* Prints "tern: error: <what>: <last error>" and returns the exit code for s. */
int tn_cli_fail(tern_status s, const char *what);
/* Prints "tern: error: <msg>" (printf style) and returns 64. */
int tn_cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* In a flag loop `for (int i = 1; i < argc; i++)` with a = argv[i] and val = argv[i + 1] (NULL after
 * the last): consumes the flag's value, or returns the usage error (exit 64) naming the flag. */
#define TN_CLI_NEED_VAL()                                                \
    do {                                                                 \
        if (!val) return tn_cli_usage_error("%s needs a value", a);     \
        i++;                                                             \
    } while (0)

/* Strict number parsing for flags: the whole string must be a number in [lo, hi]. */
bool tn_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
bool tn_cli_parse_f32(const char *s, float lo, float hi, float *out);

/* Reads a whole file (NUL-terminated, malloc'd). NOT_FOUND / NOMEM / IO with the message in
 * tern_last_error() (nothing printed: the caller reports it, e.g. tn_cli_fail). */
tern_status tn_cli_read_file(const char *path, char **out, size_t *len);
/* An output path that is one of the run's inputs (same path or same file) would destroy it: a usage
 * error (exit 64) naming both; TN_EXIT_OK when out is none of them (NULL entries are skipped). */
int tn_cli_check_output(const char *what, const char *out, const char *const *inputs, int n);
/* Finds tern's default model: $TERN_DEFAULT_MODEL, <exe>/../share/tern/tern-default.gguf,
 * <exe>/../models/tern-default.gguf, <source dir>/models/tern-default.gguf. */
bool tn_cli_default_model(char *buf, size_t cap);
double tn_cli_now(void);
/* --device cpu|cuda and -ngl/--n-gpu-layers N at argv[*i]: returns 1 when consumed (advancing *i
 * past the value), 0 when argv[*i] is neither, -1 after printing a usage error (exit 64). */
int tn_cli_device_flag(int argc, char **argv, int *i, int32_t *device, int32_t *n_gpu_layers);
/* --cache-type-k/-ctk T and --cache-type-v/-ctv T (T: f16, q8_0, q4_0, tq2 .. tq8; K also tqc2 .. tqc4) at argv[*i], into *type_k /
 * *type_v (TERN_KV_*), and --kv-rotate auto|none|k|v|kv into *kv_rot (TERN_KV_ROT_*). Same
 * contract as tn_cli_device_flag. */
int tn_cli_cache_type_flag(int argc, char **argv, int *i, int32_t *type_k, int32_t *type_v, int32_t *kv_rot);
#define TN_CLI_CACHE_TYPE_HELP                                                                                          \
    "  -ctk, --cache-type-k T  K cache type: f16 (default), q8_0, q4_0 (llama.cpp's), tq2 .. tq8 (tern's b-bit\n"      \
    "                          groups of 32 with scale and offset; quantized types: head size a multiple of 32),\n" \
    "                          tqc2 .. tqc4 (per channel over each 16 positions, b + 2 bits)\n"                \
    "  -ctv, --cache-type-v T  V cache type: f16, q8_0, q4_0, tq2 .. tq8\n"                             \
    "      --kv-rotate R       rotate the heads of a quantized K and/or V: auto (default: K), none, k, v, kv\n"
/* --hot-experts SIZE (bytes, or with K, M, G, T) at argv[*i]: 1 consumed, 0 not it, -1 after a usage error. */
int tn_cli_hot_experts_flag(int argc, char **argv, int *i, uint64_t *bytes);
/* "tern: hot experts: ..." on stderr (experts copied, bytes, share of routed rows they took); nothing
 * without a budget. */
void tn_cli_hot_experts_report(const tern_ctx *c);
#define TN_CLI_HOT_EXPERTS_HELP                                                                                         \
    "      --hot-experts SIZE  mixture-of-experts models: copy the most used experts (as routing shows them)\n"        \
    "                          into SIZE (e.g. 2G) of 2 MiB pages; the rest stay in the file mapping\n"
/* Tokenizes text into a malloc'd array (*out, *n_out), growing it when byte fallback needs more
 * tokens than bytes. On failure *out is NULL and the status says why (NOMEM for the array). */
tern_status tn_cli_tokenize(const tern_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                            tern_token **out, int32_t *n_out);
/* The sampling flags of generate and chat at argv[*i]: -s/--seed N (into *seed, -1 = random), --temp,
 * --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n (into *sp). Same contract as
 * tn_cli_device_flag: 1 consumed, 0 not one of them, -1 after printing a usage error. */
int tn_cli_sampling_flag(int argc, char **argv, int *i, tern_sampler_params *sp, int64_t *seed);
/* LoRA adapters of a run: --lora FILE[:SCALE] (repeatable; scale 1 by default) and llama.cpp's
 * --lora-scaled FILE SCALE. */
#define TN_CLI_MAX_LORA 16
typedef struct tn_cli_lora {
    int n;
    char *path[TN_CLI_MAX_LORA]; /* malloc'd */
    float scale[TN_CLI_MAX_LORA];
    tern_lora *a[TN_CLI_MAX_LORA];
} tn_cli_lora;
/* --lora / --lora-scaled at argv[*i]: same contract as tn_cli_device_flag (1 consumed, 0 not one of
 * them, -1 after printing a usage error). */
int tn_cli_lora_flag(int argc, char **argv, int *i, tn_cli_lora *l);
/* Loads the adapters against m and sets them on c (nothing to do without any). Returns an exit
 * code (errors printed: a bad adapter 65, a missing file 66, a CUDA context 65). */
int tn_cli_lora_open(tn_cli_lora *l, const tern_model *m, tern_ctx *c);
/* Frees the adapters and paths (after the last decode of the contexts using them). */
void tn_cli_lora_free(tn_cli_lora *l);
/* " (LoRA: FILE xSCALE, ...)" for logs, or "" without adapters. */
void tn_cli_lora_desc(const tn_cli_lora *l, char *buf, size_t cap);

/* What generate and chat share: the model and its context. */
typedef struct tn_cli_run {
    const char *model_path;      /* -m; NULL: tern's default model                                  */
    int64_t n_ctx, n_threads, n_batch; /* -c (0: the model's, capped at 4096), -t (0: default), -b */
    bool use_mmap, repack;       /* --no-mmap, --no-repack                                          */
    uint64_t hot_experts;        /* --hot-experts (bytes; 0: off)                                   */
    bool swa_full;               /* --swa-full: sliding-window layers keep every position           */
    int32_t type_k, type_v;      /* -ctk, -ctv (TERN_KV_*; 0: f16)                                  */
    int32_t kv_rot;              /* --kv-rotate (TERN_KV_ROT_*; 0: auto)                            */
    int32_t device, n_gpu_layers;/* --device, -ngl                                                  */
    double t_load;               /* seconds tn_cli_run_open spent loading the model                 */
    tern_ctx_params cp;          /* as the context was created                                      */
    tn_cli_lora lora;            /* --lora, --lora-scaled: set on the context by tn_cli_run_open    */
    char default_path[4096];
} tn_cli_run;
void tn_cli_run_init(tn_cli_run *r);
/* -m, -c, -t, -b, --no-mmap, --no-repack, --swa-full, -ctk, -ctv, --device, -ngl, --lora, --lora-scaled at argv[*i]: same contract as
 * tn_cli_device_flag (1 consumed, 0 not one of them, -1 after printing a usage error). */
int tn_cli_run_flag(int argc, char **argv, int *i, tn_cli_run *r);
/* Loads the model (the default one without -m) and creates its context: n_ctx the model's capped
 * at 4096 unless -c, one thread for models under 32 MiB unless -t. Returns an exit code (errors
 * printed); on failure *m and *c stay NULL. */
int tn_cli_run_open(tn_cli_run *r, tern_model **m, tern_ctx **c);
/* Frees what tn_cli_run_open kept besides the model and context (the adapters). */
void tn_cli_run_close(tn_cli_run *r);
/* --chat-template NAME: true with *out set, or false after printing a usage error that lists the
 * known names (exit 64). */
bool tn_cli_chat_template(const char *name, tern_chat_template *out);

#endif
