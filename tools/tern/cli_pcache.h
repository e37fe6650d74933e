/*
 * cli_pcache.h — `--prompt-cache DIR` for tern generate and tern chat: the flags, opening the cache
 * for a context, loading the cached prefix of a prompt before its prefill and storing its whole
 * blocks after, and the summary line. The cache itself is src/model/pcache.{h,c}.
 */
#ifndef TN_CLI_PCACHE_H
#define TN_CLI_PCACHE_H

#include <stdbool.h>
#include <stdio.h>

#include "model/pcache.h"
#include "tern/tern.h"

typedef struct tn_cli_pcache {
    const char *dir;        /* --prompt-cache DIR (NULL: off)                   */
    float max_gb;           /* --prompt-cache-max-gb (0: unbounded)             */
    tn_pc_quality quality;  /* --prompt-cache-quality lossless|high|balanced|medium */
    bool verbose;           /* -v: the cost model's decisions and sizes         */
    tn_pcache *pc;
    double prefill_tok_s;   /* remembered by earlier runs (0: unknown)          */
} tn_cli_pcache;

void tn_cli_pcache_init(tn_cli_pcache *p);
/* --prompt-cache, --prompt-cache-max-gb, --prompt-cache-quality, -v/--verbose at argv[*i]:
 * 1 consumed, 0 not one of them, -1 after a usage error (exit 64). */
int tn_cli_pcache_flag(int argc, char **argv, int *i, tn_cli_pcache *p);
/* Library warnings (a skipped block file, a full disk) to stderr as "tern: warning: ...". */
void tn_cli_pcache_log_on(void);
/* Lines for a usage text. */
void tn_cli_pcache_usage(FILE *f);
/* TERN_PCACHE_PREFILL_TOK_S: a fixed prefill speed (tokens/s) for the load-or-recompute decision
 * (tests, tuning); 0 when unset or not a positive number. */
double tn_cli_pcache_prefill_env(void);
/* Opens the cache for m and c when --prompt-cache was given; returns an exit code (errors
 * printed: 64 when this build or this context cannot use it). A directory that cannot be made
 * is a warning: the run goes on without the cache. */
int tn_cli_pcache_open(tn_cli_pcache *p, const tern_model *m, const tern_ctx *c);
/* Loads the cached blocks of hist[0..n) from c's n_past on; returns the tokens loaded (0 when off). */
int32_t tn_cli_pcache_load(tn_cli_pcache *p, tern_ctx *c, const tern_token *hist, int32_t n);
/* After a prefill of n_computed tokens in seconds: remembers the speed, stores the new whole blocks
 * of hist[0..n). Never fails (warnings only). */
void tn_cli_pcache_store(tn_cli_pcache *p, const tern_ctx *c, const tern_token *hist, int32_t n, int32_t n_computed,
                         double seconds);
/* Prints the summary line (when on) and closes the cache. */
void tn_cli_pcache_close(tn_cli_pcache *p);

#endif
