/*
 * cli_pcache.c — `--prompt-cache DIR` for tern generate and tern chat (cli_pcache.h).
 */
#include "cli_pcache.h"

#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/ctx.h"

void tn_cli_pcache_init(tn_cli_pcache *p) { memset(p, 0, sizeof *p), p->quality = TN_PC_LOSSLESS; }

double tn_cli_pcache_prefill_env(void) {
    const char *ov = getenv("TERN_PCACHE_PREFILL_TOK_S");
    const double v = ov ? atof(ov) : 0.0;
    return v > 0 ? v : 0.0;
}

void tn_cli_pcache_usage(FILE *f) {
    fprintf(f, "      --prompt-cache DIR  keep the prompt's KV blocks (16 tokens each) compressed in DIR and load the\n"
               "                          longest cached prefix of later prompts instead of recomputing it\n"
               "      --prompt-cache-max-gb X  bound DIR to X GB, least recently used blocks evicted (default: unbounded)\n"
               "      --prompt-cache-quality lossless|high|balanced|medium  lossless (default: the same logits), or\n"
               "                          per-channel quantized deltas: high (q8_0-cache accuracy, ~2.6x smaller than\n"
               "                          f16), balanced (~4.4x), medium (q4_0-cache accuracy, ~8x)\n"
               "  -v, --verbose           print the prompt cache's load/recompute decision and sizes\n");
}

int tn_cli_pcache_flag(int argc, char **argv, int *ip, tn_cli_pcache *p) {
    int i = *ip;
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--prompt-cache")) {
        if (!val || !*val) return tn_cli_usage_error("%s needs a directory", a), -1;
        p->dir = val;
        i++;
    } else if (!strcmp(a, "--prompt-cache-max-gb")) {
        if (!val || !tn_cli_parse_f32(val, 0.0f, 1e6f, &p->max_gb))
            return tn_cli_usage_error("%s: '%s' is not a size in GB (0..1000000)", a, val ? val : ""), -1;
        i++;
    } else if (!strcmp(a, "--prompt-cache-quality")) {
        const int q = tn_pc_quality_from_name(val);
        if (q < 0) return tn_cli_usage_error("%s: '%s' is not lossless, high, balanced or medium", a, val ? val : ""), -1;
        p->quality = (tn_pc_quality)q;
        i++;
    } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
        p->verbose = true;
    } else {
        return 0;
    }
    *ip = i;
    return 1;
}

static void log_to_stderr(tern_log_level lvl, const char *msg, void *user) {
    (void)user;
    if (lvl >= TERN_LOG_WARN) fprintf(stderr, "tern: warning: %s\n", msg);
}

void tn_cli_pcache_log_on(void) { tern_set_log(log_to_stderr, NULL); }

int tn_cli_pcache_open(tn_cli_pcache *p, const tern_model *m, const tern_ctx *c) {
    if (!p->dir) return TN_EXIT_OK;
    tern_set_log(log_to_stderr, NULL);
    tern_status s = tn_pcache_open(m, c, p->dir, (uint64_t)((double)p->max_gb * 1e9), p->quality, &p->pc);
    if (s == TERN_ERR_UNSUPPORTED) return tn_cli_usage_error("--prompt-cache: %s", tern_last_error());
    if (s) { /* a directory that cannot be made (full disk, permissions) costs the cache, not the run */
        fprintf(stderr, "tern: warning: --prompt-cache: %s; running without the prompt cache\n", tern_last_error());
        return TN_EXIT_OK;
    }
    if ((s = tn_pcache_usable(p->pc, c))) {
        tn_pcache_free(p->pc);
        p->pc = NULL;
        return tn_cli_usage_error("--prompt-cache: %s", tern_last_error());
    }
    p->prefill_tok_s = tn_pcache_prefill_speed(p->pc);
    if (tn_cli_pcache_prefill_env() > 0) p->prefill_tok_s = tn_cli_pcache_prefill_env();
    if (p->verbose) fprintf(stderr, "tern: prompt cache: %s\n", tn_pcache_subdir(p->pc));
    return TN_EXIT_OK;
}

int32_t tn_cli_pcache_load(tn_cli_pcache *p, tern_ctx *c, const tern_token *hist, int32_t n) {
    int32_t got = 0;
    if (!p->pc) return 0;
    if (tn_pcache_load(p->pc, c, hist, n, p->prefill_tok_s, &got)) fprintf(stderr, "tern: warning: %s\n", tern_last_error());
    if (p->verbose && tn_pcache_decision(p->pc)[0]) fprintf(stderr, "tern: %s\n", tn_pcache_decision(p->pc));
    return got;
}

void tn_cli_pcache_store(tn_cli_pcache *p, const tern_ctx *c, const tern_token *hist, int32_t n, int32_t n_computed,
                         double seconds) {
    if (!p->pc) return;
    tn_pcache_note_prefill(p->pc, n_computed, seconds);
    if (tn_pcache_store(p->pc, c, hist, n)) fprintf(stderr, "tern: warning: %s\n", tern_last_error());
}

void tn_cli_pcache_close(tn_cli_pcache *p) {
    if (!p->pc) return;
    const tn_pcache_stats *st = tn_pcache_get_stats(p->pc);
    fprintf(stderr, "tern: prompt cache: %lld blocks loaded (%lld tokens, %.1f ms), %lld stored, %lld skipped as bad, %lld evicted%s\n",
            (long long)st->blocks_loaded, (long long)st->blocks_loaded * TN_PC_NTOK, st->load_s * 1e3,
            (long long)st->blocks_stored, (long long)st->blocks_skipped, (long long)st->blocks_evicted,
            st->store_off ? " (storing stopped: disk full)" : "");
    const int64_t nb = st->blocks_stored ? st->blocks_stored : st->blocks_loaded;
    if (p->verbose && nb) { /* the blocks written, else those read */
        const double per_tok = (double)(st->blocks_stored ? st->bytes_stored : st->bytes_loaded) / (double)(nb * TN_PC_NTOK);
        fprintf(stderr, "tern: prompt cache: %.1f bytes/token on disk, f16 KV %llu bytes/token: %.2fx smaller\n", per_tok,
                (unsigned long long)st->f16_bytes_per_token, (double)st->f16_bytes_per_token / per_tok);
    }
    tn_pcache_free(p->pc);
    p->pc = NULL;
}
