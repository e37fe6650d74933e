/*
 * cmd_train.c — `tern train`: train a model of a trainable family (llama, qwen2, qwen3: the
 * registry's descriptors, src/train/) from text (src/train/run.h) and write it as GGUF; progress
 * on stderr (one redrawn line on a TTY, periodic lines otherwise).
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "train/run.h"

static volatile sig_atomic_t tn_train_stop;
static void on_sig(int sig) {
    (void)sig;
    tn_train_stop = 1;
}

/* the distributed-training flags, in tern train's and tern finetune's usage */
#define DIST_USAGE                                                                                           \
    "distributed (under mpirun -np N; docs/distributed.md):\n"                                               \
    "  --dist METHOD           dp (gradients all-reduced every step), diloco (parameter change\n"            \
    "                          all-reduced every H steps, outer Nesterov step) or noloco (one\n"             \
    "                          random peer per outer step, no collectives); --batch is per rank\n"           \
    "  --outer-every H         inner steps per outer step (diloco, noloco; default 100)\n"                   \
    "  --outer-lr X            outer learning rate (default 0.7)\n"                                          \
    "  --outer-momentum X      outer Nesterov momentum (default 0.9)\n"                                      \
    "  --zo                    zeroth-order (SPSA) steps: forward passes only, no backward;\n"              \
    "                          under --dist dp ranks exchange one byte per sample per step\n"               \
    "                          (--compress none: 4-byte floats; --compress int8 without\n"                \
    "                          --dist: the same one-byte quantization in one process)\n"                   \
    "  --zo-eps X              perturbation scale (default 1e-3)\n"                                          \
    "  --zo-samples N          perturbations per step (default 1)\n"                                         \
    "  --compress int8|none    dp, diloco: send int8 with a scale per 256 values, stochastic\n"             \
    "                          rounding (~3.9x fewer bytes); default none\n"                             \
    "  --bucket-mb X           dp: all-reduce gradients in buckets of X MiB started while the\n"            \
    "                          backward runs (default 25; 0: one all-reduce after it)\n"                    \
    "  --zero 1                dp: ZeRO-1, AdamW moments sharded over the ranks (1/N each)\n"                \
    "  --sim-link RATE[,LAT]   simulate a slow link: every exchange lasts at least LAT + bytes/RATE\n"       \
    "                          (RATE with kbit, mbit or gbit per second, LAT with us or ms; e.g.\n"        \
    "                          1gbit,2ms); the ranks sleep the rest, results are unchanged\n"

/* the memory flags, in tern train's and tern finetune's usage (docs/training.md, "Memory") */
#define MEM_USAGE                                                                                            \
    "memory (a plan is printed before step 1):\n"                                                             \
    "  --grad-accum N          split each batch into N micro-batches (N divides --batch); the same\n"        \
    "                          update as the whole batch, activations for batch/N sequences\n"              \
    "  --recompute MODE        none (default), attn (recompute the attention probabilities in\n"           \
    "                          backward) or full (keep only each layer's input, rerun the layer)\n"         \
    "  --mem-budget SIZE       e.g. 4G, 512M: choose micro-batch, accumulation and recomputation so\n"      \
    "                          the predicted peak fits (no recompute, then attn, then smaller\n"           \
    "                          micro-batches, then full); refused when nothing fits\n"                    \
    "  --logits-chunk N        output projection and cross-entropy N tokens at a time when a\n"          \
    "                          micro-batch has more (default 0: 256, fewer for vocabularies over\n"      \
    "                          32k); a number >= batch x ctx keeps all logits at once\n"

static void train_usage(FILE *f) {
    char names[128];
    tn_train_arch_names(names, sizeof names);
    fprintf(f,
            "usage: tern train --data FILE... -o model.gguf [options]\n"
            "  --data FILE...          UTF-8 training text (paragraphs = blank-line separated)\n"
            "  -o, --output FILE       output GGUF (loss curve: <out>.loss.csv and <out>.loss.svg)\n"
            "  --tokenizer FILE        vocabulary from `tern tokenizer-train` (default: learn one, --vocab)\n"
            "  --vocab N               vocabulary size when learning it (default 4096)\n"
            "  --arch NAME             model family: %s (default llama; rms_eps and rope base\n"
            "                          are the family's defaults)\n"
            "  --init FILE             fine-tune this GGUF (its family, shape and vocabulary)\n"
            "  --preset NAME           tiny | small | base | 15m (dimensions; explicit flags override)\n"
            "  --n-embd N --n-layer N --n-head N --n-head-kv N --n-ff N --ctx N\n"
            "  --head-dim N            per-head width (default n_embd / n_head; query rows n_head * N)\n"
            "  --steps N               optimizer steps (default 1000)\n"
            "  --batch N               sequences per step (default 8)\n"
            "  --lr X                  peak learning rate (default 1e-3)\n"
            "  --min-lr-frac X         cosine decays to lr*X (default 0.1)\n"
            "  --warmup N              linear warmup steps (default min(100, steps/10))\n"
            "  --wd X                  AdamW weight decay on matrices (default 0.1)\n"
            "  --beta1 X --beta2 X     AdamW betas (default 0.9, 0.95)\n"
            "  --clip X                global gradient-norm clip (default 1; 0 = off)\n"
            "  --seed N                init, shuffle seed (default 1234)\n"
            "  -t, --threads N         threads (default 2)\n"
            "  --val-every N           validation every N steps (default steps/20)\n"
            "  --val-batches N         validation batches (default 4)\n"
            "  --ckpt-dir DIR          write checkpoints here (atomic; keeps the last 2)\n"
            "  --ckpt-every N          steps between checkpoints (default steps/10)\n"
            "  --resume                continue from --ckpt-dir\n"
            "  --out-type T            matrices' type: f32 (default), f16, bf16, q8_0, q4_0, q4_K, q6_K, ...\n"
            "  --name S                general.name of the output\n"
            "  --log-every N           progress line every N steps when stderr is not a TTY (default steps/50)\n"
            "  --optim NAME            adamw (default) or sgd (plain SGD, same lr schedule, clip and decay)\n" MEM_USAGE
            DIST_USAGE,
            names);
}

typedef struct prog_ctx {
    bool tty, dist, link;
    int log_every;
    double last_val;
} prog_ctx;

static void fmt_eta(double s, char *buf, size_t cap) {
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)s;
    if (t >= 3600) snprintf(buf, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
}

/* " 12.3 KiB" style */
static void fmt_bytes(double b, char *buf, size_t cap) {
    static const char *const U[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) { b /= 1024; u++; }
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", b, U[u]);
}

static void on_progress(const tn_train_progress *p, void *user) {
    prog_ctx *c = user;
    char comm[96] = "";
    if (c->dist) {
        char b[32];
        fmt_bytes((double)p->comm_bytes / (double)(p->step > 0 ? p->step : 1), b, sizeof b);
        const int k = snprintf(comm, sizeof comm, "  comm %s/step", b);
        if (c->link)
            snprintf(comm + k, sizeof comm - (size_t)k, "  link wait %.3f s/step",
                     p->link_wait_s / (double)(p->step > 0 ? p->step : 1));
    }
    if (!isnan(p->val_loss)) c->last_val = p->val_loss;
    char eta[32];
    fmt_eta(p->eta_s, eta, sizeof eta);
    char val[48] = "val -";
    if (!isnan(c->last_val)) snprintf(val, sizeof val, "val %.4f (ppl %.1f)", c->last_val, exp(c->last_val));
    if (c->tty) {
        fprintf(stderr, "\r\033[Kstep %lld/%lld  loss %.4f  %s  lr %.2e  %.0f tok/s%s  ETA %s", (long long)p->step,
                (long long)p->steps, p->loss, val, p->lr, p->tok_per_s, comm, eta);
        if (p->final) fputc('\n', stderr);
    } else if (p->step % c->log_every == 0 || p->final || !isnan(p->val_loss)) {
        fprintf(stderr, "step %lld/%lld  loss %.4f  %s  lr %.2e  gnorm %.2f  %.0f tok/s%s  ETA %s\n", (long long)p->step,
                (long long)p->steps, p->loss, val, p->lr, p->grad_norm, p->tok_per_s, comm, eta);
    }
    fflush(stderr);
}

static void on_note(const char *msg, void *user) {
    (void)user;
    fprintf(stderr, "tern train: %s\n", msg);
}

/* Runs o with progress on stderr and SIGINT/SIGTERM stopping it; the exit code (0: done). */
static int run_cli(tn_train_opts *o, int log_every) {
    prog_ctx pc = {.tty = isatty(2), .dist = o->dist.method != TN_DIST_NONE, .link = o->dist.link.bits_per_s > 0,
                   .log_every = log_every, .last_val = NAN};
    o->progress = on_progress;
    o->note = on_note;
    o->user = &pc;
    o->stop = &tn_train_stop;
    signal(SIGINT, on_sig);
    signal(SIGTERM, on_sig);
    tern_status s = tn_train_run(o);
    if (!s) return 0;
    if (pc.tty) fputc('\n', stderr);
    if (o->dist_size > 1) fprintf(stderr, "tern: error (rank %d of %d): %s\n", o->dist_rank, o->dist_size, tern_last_error());
    else fprintf(stderr, "tern: error: %s\n", tern_last_error()); /* messages start with "train:" */
    const int rc = tn_cli_exit_code(s);
    fflush(stderr);
    tn_dist_abort(rc); /* under mpirun: stop the other ranks rather than leave them waiting */
    return rc;
}

static bool preset(const char *name, tn_train_cfg *c) {
    /* dimensions only: the family (and its rms_eps and rope base) is --arch's */
    static const struct { const char *name; int32_t ctx, embd, layer, head, head_kv, ff; } P[] = {
        {"tiny", 64, 64, 2, 4, 2, 256},
        {"small", 256, 256, 4, 8, 4, 768},
        {"base", 512, 512, 8, 8, 4, 1536},
        {"15m", 256, 288, 6, 6, 6, 768},
    };
    for (size_t i = 0; i < sizeof P / sizeof P[0]; i++)
        if (!strcmp(name, P[i].name)) {
            *c = (tn_train_cfg){.n_ctx = P[i].ctx, .n_embd = P[i].embd, .n_layer = P[i].layer, .n_head = P[i].head,
                                .n_head_kv = P[i].head_kv, .n_ff = P[i].ff, .rms_eps = 1e-5f, .rope_base = 10000.0f};
            return true;
        }
    return false;
}

/* The flags tern train and tern finetune share (the run, optimizer schedule, checkpoints, log):
 * 1 when argv[*i] is one (its value consumed), 0 when not, -1 after printing a usage error. */
static int shared_flag(int argc, char **argv, int *i, tn_train_opts *o, int *log_every) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    int64_t v = 0, lo = 0, hi = 0;
    float f = 0, flo = 0, fhi = 0;
    bool is_int = false, is_flt = false;
    if (!strcmp(a, "--resume")) return o->resume = true, 1;
    if (!strcmp(a, "--batch")) is_int = true, lo = 1, hi = 1 << 20;
    else if (!strcmp(a, "--warmup")) is_int = true, lo = 0, hi = 100000000;
    else if (!strcmp(a, "--seed")) is_int = true, lo = 0, hi = INT64_MAX;
    else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) is_int = true, lo = 1, hi = 1024;
    else if (!strcmp(a, "--val-every") || !strcmp(a, "--ckpt-every") || !strcmp(a, "--log-every")) is_int = true, lo = 1, hi = 100000000;
    else if (!strcmp(a, "--val-batches")) is_int = true, lo = 1, hi = 100000;
    else if (!strcmp(a, "--lr") || !strcmp(a, "--wd")) is_flt = true, flo = 0.0f, fhi = 10.0f;
    else if (!strcmp(a, "--min-lr-frac")) is_flt = true, flo = 0.0f, fhi = 1.0f;
    else if (!strcmp(a, "--clip")) is_flt = true, flo = 0.0f, fhi = 1e9f;
    else if (strcmp(a, "--ckpt-dir") && strcmp(a, "--name")) return 0;
    if (!val) return tn_cli_usage_error("%s needs a value", a), -1;
    ++*i;
    if (is_int && !tn_cli_parse_i64(val, lo, hi, &v))
        return tn_cli_usage_error("%s: '%s' is not an integer in [%lld, %lld]", a, val, (long long)lo, (long long)hi), -1;
    if (is_flt && !tn_cli_parse_f32(val, flo, fhi, &f))
        return tn_cli_usage_error("%s: '%s' is not a number in [%g, %g]", a, val, (double)flo, (double)fhi), -1;
    const int32_t n = (int32_t)v;
    if (!strcmp(a, "--ckpt-dir")) o->ckpt_dir = val;
    else if (!strcmp(a, "--name")) o->name = val;
    else if (!strcmp(a, "--batch")) o->batch = n;
    else if (!strcmp(a, "--warmup")) o->warmup = n;
    else if (!strcmp(a, "--seed")) o->seed = (uint64_t)v;
    else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) o->n_threads = n;
    else if (!strcmp(a, "--val-every")) o->val_every = n;
    else if (!strcmp(a, "--ckpt-every")) o->ckpt_every = n;
    else if (!strcmp(a, "--log-every")) *log_every = n;
    else if (!strcmp(a, "--val-batches")) o->val_batches = n;
    else if (!strcmp(a, "--lr")) o->opt.lr = f;
    else if (!strcmp(a, "--wd")) o->opt.weight_decay = f;
    else if (!strcmp(a, "--min-lr-frac")) o->min_lr_frac = f;
    else if (!strcmp(a, "--clip")) o->opt.grad_clip = f;
    return 1;
}

/* --out-type NAME (tern train, tern finetune --full): a type the export has a reference quantizer
 * for; false after printing a usage error. */
static bool out_type(const char *val, tn_dtype *t) {
    if (tn_dtype_from_name(val, t) && tn_export_type_ok(*t)) return true;
    tn_cli_usage_error("--out-type: '%s' is not a type tern can write without an importance matrix (f32, f16, bf16, q8_0, "
                       "q4_0, q5_0, q4_K, q5_K, q6_K, ...)", val);
    return false;
}

/* The memory flags (tern train, tern finetune): 1 when argv[*i] is one (its value consumed), 0
 * when not, -1 after printing a usage error. */
static int mem_flag(int argc, char **argv, int *i, tn_train_opts *o) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (strcmp(a, "--grad-accum") && strcmp(a, "--recompute") && strcmp(a, "--mem-budget") && strcmp(a, "--logits-chunk")) return 0;
    if (!val) return tn_cli_usage_error("%s needs a value", a), -1;
    ++*i;
    int64_t v;
    tn_recompute r;
    if (!strcmp(a, "--grad-accum")) {
        if (!tn_cli_parse_i64(val, 1, 1 << 20, &v)) return tn_cli_usage_error("--grad-accum: '%s' is not an integer in [1, %d]", val, 1 << 20), -1;
        o->grad_accum = (int)v;
    } else if (!strcmp(a, "--recompute")) {
        if (!tn_recompute_parse(val, &r)) return tn_cli_usage_error("--recompute: '%s' (none, attn or full)", val), -1;
        o->recompute = (int)r;
    } else if (!strcmp(a, "--logits-chunk")) {
        if (!tn_cli_parse_i64(val, 0, 1 << 30, &v)) return tn_cli_usage_error("--logits-chunk: '%s' is not an integer in [0, %d]", val, 1 << 30), -1;
        o->ce_rows = (int)v;
    } else if (!tn_mem_parse_size(val, &o->mem_budget)) {
        return tn_cli_usage_error("--mem-budget: '%s' is not a size (bytes, or with K, M, G, T: 4G, 512M)", val), -1;
    }
    return 1;
}

/* The distributed-training flags (tern train, tern finetune): 1 when argv[*i] is one (its value
 * consumed), 0 when not, -1 after printing a usage error; dist_check after the loop. */
typedef struct dist_seen {
    const char *zo, *outer, *dp;
    bool compress, link;
} dist_seen;

static int dist_flag(int argc, char **argv, int *i, tn_train_opts *o, dist_seen *seen) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--zo")) return o->zo.on = true, 1;
    if (strcmp(a, "--dist") && strcmp(a, "--compress") && strcmp(a, "--zo-eps") && strcmp(a, "--zo-samples") &&
        strcmp(a, "--outer-every") && strcmp(a, "--outer-lr") && strcmp(a, "--outer-momentum") && strcmp(a, "--zero") &&
        strcmp(a, "--bucket-mb") && strcmp(a, "--sim-link"))
        return 0;
    if (!val) return tn_cli_usage_error("%s needs a value", a), -1;
    ++*i;
    int64_t v = 0;
    float f = 0;
    if (!strcmp(a, "--dist")) {
        if (!tn_dist_parse(val, &o->dist.method)) return tn_cli_usage_error("--dist: unknown method '%s' (dp, diloco or noloco)", val), -1;
    } else if (!strcmp(a, "--compress")) {
        if (!strcmp(val, "int8")) o->dist.compress = TN_COMPRESS_INT8;
        else if (!strcmp(val, "none")) o->dist.compress = TN_COMPRESS_NONE;
        else return tn_cli_usage_error("--compress: '%s' (int8 or none)", val), -1;
        seen->compress = true;
    } else if (!strcmp(a, "--sim-link")) {
        if (!tn_link_parse(val, &o->dist.link))
            return tn_cli_usage_error("--sim-link: '%s' is not RATE[,LATENCY] (RATE > 0 with kbit, mbit or gbit per "
                                      "second, LATENCY with us or ms: 1gbit,2ms)", val), -1;
        seen->link = true;
    } else if (!strcmp(a, "--zero")) {
        if (strcmp(val, "0") && strcmp(val, "1")) return tn_cli_usage_error("--zero: '%s' (0 or 1: ZeRO stage 1)", val), -1;
        o->dist.zero = val[0] == '1';
        seen->dp = a;
    } else if (!strcmp(a, "--bucket-mb")) {
        if (!tn_cli_parse_f32(val, 0.0f, 65536.0f, &f)) return tn_cli_usage_error("--bucket-mb: '%s' is not a number in [0, 65536]", val), -1;
        o->dist.bucket_mb = f;
        seen->dp = a;
    } else if (!strcmp(a, "--zo-samples") || !strcmp(a, "--outer-every")) {
        const int64_t hi = !strcmp(a, "--zo-samples") ? 64 : 100000000;
        if (!tn_cli_parse_i64(val, 1, hi, &v)) return tn_cli_usage_error("%s: '%s' is not an integer in [1, %lld]", a, val, (long long)hi), -1;
        if (!strcmp(a, "--zo-samples")) o->zo.samples = (int32_t)v, seen->zo = a;
        else o->dist.outer_every = (int32_t)v, seen->outer = a;
    } else {
        const float lo = !strcmp(a, "--zo-eps") ? 1e-8f : 0.0f, hi = !strcmp(a, "--zo-eps") ? 1.0f : !strcmp(a, "--outer-lr") ? 10.0f : 0.99999f;
        if (!tn_cli_parse_f32(val, lo, hi, &f)) return tn_cli_usage_error("%s: '%s' is not a number in [%g, %g]", a, val, (double)lo, (double)hi), -1;
        if (!strcmp(a, "--zo-eps")) o->zo.eps = f, seen->zo = a;
        else if (!strcmp(a, "--outer-lr")) o->dist.outer_lr = f, seen->outer = a;
        else o->dist.outer_momentum = f, seen->outer = a;
    }
    return 1;
}

/* Flags that need others: 0, or the usage exit code after printing the error. */
static int dist_check(tn_train_opts *o, const dist_seen *seen, const char *cmd) {
    if (seen->zo && !o->zo.on) return tn_cli_usage_error("%s: %s needs --zo", cmd, seen->zo);
    if (seen->compress && o->dist.method == TN_DIST_NONE && !o->zo.on)
        return tn_cli_usage_error("%s: --compress needs --dist (or --zo)", cmd);
    if (o->zo.on) { /* one byte per sample: by default under --dist, or asked for (zo.h) */
        o->zo.int8 = seen->compress ? o->dist.compress == TN_COMPRESS_INT8 : o->dist.method != TN_DIST_NONE;
        o->dist.compress = TN_COMPRESS_NONE;
    }
    if (seen->link && o->dist.method == TN_DIST_NONE)
        return tn_cli_usage_error("%s: --sim-link simulates the link between ranks: it needs --dist", cmd);
    if (seen->outer && o->dist.method != TN_DIST_DILOCO && o->dist.method != TN_DIST_NOLOCO)
        return tn_cli_usage_error("%s: %s applies to --dist diloco or noloco", cmd, seen->outer);
    if (seen->dp && o->dist.method != TN_DIST_DP) return tn_cli_usage_error("%s: %s applies to --dist dp", cmd, seen->dp);
    if (o->dist.zero && o->optim == TN_OPTIM_SGD)
        return tn_cli_usage_error("%s: --zero 1 shards AdamW's moments; --optim sgd has none", cmd);
    if (o->dist.zero && o->zo.on) return tn_cli_usage_error("%s: --zero 1 shards AdamW's moments; --zo has none", cmd);
    if (o->dist.zero && o->dist.compress)
        return tn_cli_usage_error("%s: --zero 1 reduce-scatters f32 gradients; it does not combine with --compress int8", cmd);
    return 0;
}

/* After a --dist run, rank 0's line on what was sent. */
static void dist_summary(const tn_train_opts *o, const char *cmd) {
    if (o->dist.method == TN_DIST_NONE) return;
    char b[32], t[32];
    fmt_bytes((double)o->comm_bytes / (double)o->steps, b, sizeof b);
    fmt_bytes((double)o->comm_bytes, t, sizeof t);
    fprintf(stderr, "tern %s: --dist %s on %d ranks: communicated %llu bytes per rank (%s), %s per step\n", cmd,
            tn_dist_name(o->dist.method), o->dist_size, (unsigned long long)o->comm_bytes, t, b);
    if (o->dist.link.bits_per_s > 0) {
        char l[96];
        tn_link_describe(&o->dist.link, l, sizeof l);
        fprintf(stderr, "tern %s: simulated link %s: rank 0 waited %.3f s on it in total, %.4f s per step\n", cmd, l,
                o->link_wait_s, o->link_wait_s / (double)o->steps);
    }
}

int cmd_train(int argc, char **argv) {
    tn_train_opts o;
    tn_train_opts_default(&o);
    const char **data = calloc((size_t)argc, sizeof *data);
    if (!data) return tn_cli_fail(TERN_ERR_NOMEM, "train");
    int n_data = 0, log_every = 0, sf;
    dist_seen seen = {NULL, NULL, NULL, false, false};
    int64_t v;
    float f;
    int64_t ov[7] = {-1, -1, -1, -1, -1, -1, -1}; /* embd layer head head_kv ff ctx head_dim */
    const tn_arch_desc *arch = NULL;
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED()                                                                                  \
    do {                                                                                        \
        if (!val) { rc = tn_cli_usage_error("%s needs a value", a); goto out; }                 \
        i++;                                                                                    \
    } while (0)
#define INT(dst, lo, hi)                                                                        \
    do {                                                                                        \
        NEED();                                                                                 \
        if (!tn_cli_parse_i64(val, lo, hi, &v)) { rc = tn_cli_usage_error("%s: '%s' is not an integer in [%lld, %lld]", a, val, (long long)(lo), (long long)(hi)); goto out; } \
        dst = v;                                                                                \
    } while (0)
#define FLT(dst, lo, hi)                                                                        \
    do {                                                                                        \
        NEED();                                                                                 \
        if (!tn_cli_parse_f32(val, lo, hi, &f)) { rc = tn_cli_usage_error("%s: '%s' is not a number in [%g, %g]", a, val, (double)(lo), (double)(hi)); goto out; } \
        dst = f;                                                                                \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { train_usage(stdout); goto out; }
        else if (!strcmp(a, "--data")) {
            NEED();
            data[n_data++] = val;
            while (i + 1 < argc && argv[i + 1][0] != '-') data[n_data++] = argv[++i];
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) { NEED(); o.out = val; }
        else if (!strcmp(a, "--tokenizer")) { NEED(); o.tokenizer = val; }
        else if (!strcmp(a, "--vocab")) INT(o.vocab_size, 260, 1 << 20);
        else if (!strcmp(a, "--init")) { NEED(); o.init = val; }
        else if (!strcmp(a, "--arch")) {
            NEED();
            arch = tn_arch_find(val, strlen(val));
            if (!tn_train_arch_ok(arch)) {
                char names[128];
                tn_train_arch_names(names, sizeof names);
                rc = tn_cli_usage_error("--arch: %s '%s' (training runs %s)", arch ? "cannot train architecture" : "unknown architecture",
                                        val, names);
                goto out;
            }
        }
        else if (!strcmp(a, "--preset")) {
            NEED();
            if (!preset(val, &o.cfg)) { rc = tn_cli_usage_error("--preset: unknown '%s' (tiny, small, base, 15m)", val); goto out; }
        } else if (!strcmp(a, "--n-embd")) INT(ov[0], 2, 65536);
        else if (!strcmp(a, "--n-layer")) INT(ov[1], 1, 1024);
        else if (!strcmp(a, "--n-head")) INT(ov[2], 1, 4096);
        else if (!strcmp(a, "--n-head-kv")) INT(ov[3], 1, 4096);
        else if (!strcmp(a, "--n-ff")) INT(ov[4], 1, 1 << 20);
        else if (!strcmp(a, "--ctx")) INT(ov[5], 2, 65536);
        else if (!strcmp(a, "--head-dim")) INT(ov[6], 2, 4096);
        else if (!strcmp(a, "--steps")) INT(o.steps, 1, 100000000);
        else if (!strcmp(a, "--beta1")) FLT(o.opt.beta1, 0.0f, 0.99999f);
        else if (!strcmp(a, "--beta2")) FLT(o.opt.beta2, 0.0f, 0.99999f);
        else if (!strcmp(a, "--out-type")) {
            NEED();
            if (!out_type(val, &o.out_type)) { rc = TN_EXIT_USAGE; goto out; }
        }
        else if (!strcmp(a, "--optim")) {
            NEED();
            if (!strcmp(val, "adamw")) o.optim = TN_OPTIM_ADAMW;
            else if (!strcmp(val, "sgd")) o.optim = TN_OPTIM_SGD;
            else { rc = tn_cli_usage_error("--optim: '%s' (adamw or sgd)", val); goto out; }
        } else if ((sf = mem_flag(argc, argv, &i, &o)) != 0) {
            if (sf < 0) { rc = TN_EXIT_USAGE; goto out; }
        } else if ((sf = dist_flag(argc, argv, &i, &o, &seen)) != 0) {
            if (sf < 0) { rc = TN_EXIT_USAGE; goto out; }
        }
        else if ((sf = shared_flag(argc, argv, &i, &o, &log_every)) != 0) {
            if (sf < 0) { rc = TN_EXIT_USAGE; goto out; }
        } else { rc = tn_cli_usage_error("train: unknown option '%s' (see tern train --help)", a); goto out; }
    }
    if (!n_data) { rc = tn_cli_usage_error("train: --data FILE... is required"); goto out; }
    if ((rc = dist_check(&o, &seen, "train"))) goto out;
    if (!o.out) { rc = tn_cli_usage_error("train: -o FILE is required"); goto out; }
    {
        const char *const inputs[] = {o.tokenizer, o.init};
        if ((rc = tn_cli_check_output("-o", o.out, inputs, 2)) != TN_EXIT_OK ||
            (rc = tn_cli_check_output("-o", o.out, data, n_data)) != TN_EXIT_OK)
            goto out;
    }
    if (ov[0] > 0) o.cfg.n_embd = (int32_t)ov[0];
    if (ov[1] > 0) o.cfg.n_layer = (int32_t)ov[1];
    if (ov[2] > 0) o.cfg.n_head = (int32_t)ov[2];
    if (ov[3] > 0) o.cfg.n_head_kv = (int32_t)ov[3];
    else if (ov[2] > 0 && o.cfg.n_head % o.cfg.n_head_kv) o.cfg.n_head_kv = o.cfg.n_head;
    if (ov[4] > 0) o.cfg.n_ff = (int32_t)ov[4];
    if (ov[5] > 0) o.cfg.n_ctx = (int32_t)ov[5];
    if (ov[6] > 0) o.cfg.head_dim = (int32_t)ov[6];
    if (arch && o.init) { rc = tn_cli_usage_error("train: --arch and --init: the family comes from the --init file"); goto out; }
    if (arch) { /* the family's own defaults (qwen3: rms_eps 1e-6, rope base 1e6) */
        o.cfg.arch = arch;
        o.cfg.rms_eps = arch->rms_eps;
        o.cfg.rope_base = arch->rope_base;
    }
    o.data = data;
    o.n_data = n_data;
    double t0 = tn_cli_now();
    if ((rc = run_cli(&o, log_every ? log_every : (o.steps >= 50 ? o.steps / 50 : 1)))) goto out;
    if (o.dist_rank) goto out; /* rank 0 reports */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr, "tern train: done in %.1f s: final loss %.4f, val loss %.4f (perplexity %.2f), %.0f tokens/s, "
            "planned %.1f MiB, peak RSS %.1f MiB\n", tn_cli_now() - t0, o.final_loss, o.final_val_loss,
            exp(o.final_val_loss), o.tok_per_s, o.planned_bytes / 1048576.0, ru.ru_maxrss / 1024.0);
    dist_summary(&o, "train");
    fprintf(stderr, "tern train: wrote %s (weights hash %016llx) and its .loss.csv / .loss.svg\n", o.out,
            (unsigned long long)o.weights_hash);
out:
    free(data);
    return rc;
}

/* ---- tern finetune ---------------------------------------------------------------------------- */

static void finetune_usage(FILE *f) {
    fprintf(f,
            "usage: tern finetune -m base.gguf --data FILE... -o adapter.gguf [options]\n"
            "       tern finetune --full -m base.gguf --data FILE... -o model.gguf [--out-type T] [options]\n"
            "  LoRA (QLoRA): the base's matrices stay frozen in their file types (F16, Q8_0, Q4_0, Q4_K, tq...),\n"
            "  dequantized a tile of rows at a time; only the adapter (lora_a, lora_b), its gradients and AdamW\n"
            "  moments are trained. The output is a GGUF LoRA adapter in llama.cpp's format (--lora FILE).\n"
            "  -m, --model FILE        base model (llama, qwen2, qwen3 families)\n"
            "  --data FILE...          *.jsonl: one chat per line {\"messages\":[{\"role\":..,\"content\":..}]}, rendered\n"
            "                          with the model's chat template, loss on assistant turns only;\n"
            "                          other files: plain text (paragraphs at blank lines), loss on every token\n"
            "  -o, --output FILE       the adapter GGUF (loss curve: <out>.loss.csv and <out>.loss.svg)\n"
            "  --lora-rank N           adapter rank (default 16)\n"
            "  --lora-alpha X          scale = alpha / rank (default 2 * rank)\n"
            "  --lora-targets LIST     matrices to adapt: q,k,v,o,gate,up,down (default all)\n"
            "  --base-matmul MODE      int8 (default): the forward products of quantized base matrices with\n"
            "                          inference's int8 kernels (activations quantized to q8_0/q8_K, as tern\n"
            "                          generate runs them); f32: dequantized to f32 for an f32 GEMM (slower);\n"
            "                          the backward's products are f32 either way\n"
            "  --epochs X              passes over the training samples (default 1; --steps overrides)\n"
            "  --steps N               optimizer steps\n"
            "  --batch N               sequences per step (default 4)\n"
            "  --ctx N                 tokens per sequence (default min(512, the model's context))\n"
            "  --lr X                  peak learning rate (default 2e-4)\n"
            "  --val-split X           fraction of samples held out for validation loss (default 0.05; 0 = none)\n"
            "  --skip-bad-lines        skip malformed JSONL lines and chats without an assistant turn (noted)\n"
            "  --warmup N --min-lr-frac X --wd X (default 0) --clip X --seed N -t N --val-every N --val-batches N\n"
            "  --ckpt-dir DIR --ckpt-every N --resume  checkpoints (atomic) and resuming, as tern train\n"
            "  --name S --log-every N\n"
            "  Ctrl-C stops and writes the adapter trained so far.\n"
            "full fine-tuning:\n"
            "  --full                  train every weight of the base (F32, F16 or BF16; quantized bases are\n"
            "                          refused: use LoRA) in f32, with AdamW moments; -o is a model\n"
            "  --out-type T            the output's matrices: f32, f16 (default), bf16, q8_0, q4_0, q4_K, ...\n"
            "                          (the base's tokenizer and chat template are kept); default --lr 5e-5\n"
            MEM_USAGE DIST_USAGE);
}

int cmd_finetune(int argc, char **argv) {
    tn_train_opts o;
    tn_train_opts_default(&o);
    o.lora = (tn_lora_cfg){.rank = 16, .alpha = 0.0f, .targets = 0, .seed = 1234, .base_int8 = true};
    o.batch = 4;
    o.steps = 0;
    o.epochs = 1.0;
    o.opt.lr = 2e-4f;
    o.opt.weight_decay = 0.0f;
    o.val_split = 0.05;
    o.cfg.n_ctx = 512;
    const char **data = calloc((size_t)argc, sizeof *data);
    if (!data) return tn_cli_fail(TERN_ERR_NOMEM, "finetune");
    int n_data = 0, log_every = 0, sf;
    int64_t v;
    float f;
    int rc = 0;
    bool alpha_set = false, lr_set = false, out_type_set = false;
    const char *lora_flag = NULL;
    dist_seen seen = {NULL, NULL, NULL, false, false};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { finetune_usage(stdout); goto out; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEED(); o.init = val; }
        else if (!strcmp(a, "--data")) {
            NEED();
            data[n_data++] = val;
            while (i + 1 < argc && argv[i + 1][0] != '-') data[n_data++] = argv[++i];
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) { NEED(); o.out = val; }
        else if (!strcmp(a, "--full")) o.full = true;
        else if (!strcmp(a, "--out-type")) {
            NEED();
            if (!out_type(val, &o.out_type)) { rc = TN_EXIT_USAGE; goto out; }
            out_type_set = true;
        }
        else if (!strcmp(a, "--lora-rank")) { INT(o.lora.rank, 1, 65536); lora_flag = a; }
        else if (!strcmp(a, "--lora-alpha")) { FLT(o.lora.alpha, 1e-6f, 1e6f); alpha_set = true; lora_flag = a; }
        else if (!strcmp(a, "--lora-targets")) {
            NEED();
            lora_flag = a;
            char bad[80];
            if (!tn_lora_parse_targets(val, &o.lora.targets, bad, sizeof bad)) {
                rc = tn_cli_usage_error("--lora-targets: unknown target '%s' (q, k, v, o, gate, up, down, comma-separated)", bad);
                goto out;
            }
        } else if (!strcmp(a, "--base-matmul")) {
            NEED();
            lora_flag = a;
            if (strcmp(val, "int8") && strcmp(val, "f32")) {
                rc = tn_cli_usage_error("--base-matmul: '%s' (int8 or f32)", val);
                goto out;
            }
            o.lora.base_int8 = !strcmp(val, "int8");
        } else if (!strcmp(a, "--epochs")) { FLT(f, 1e-6f, 1e6f); o.epochs = f; }
        else if (!strcmp(a, "--steps")) { INT(o.steps, 1, 100000000); o.epochs = 0; }
        else if (!strcmp(a, "--ctx")) INT(o.cfg.n_ctx, 2, 65536);
        else if (!strcmp(a, "--val-split")) { FLT(f, 0.0f, 0.5f); o.val_split = f; }
        else if (!strcmp(a, "--skip-bad-lines")) o.skip_bad_lines = true;
        else if (!strcmp(a, "--seed")) { INT(o.seed, 0, INT64_MAX); o.lora.seed = o.seed; }
        else if ((sf = mem_flag(argc, argv, &i, &o)) != 0) {
            if (sf < 0) { rc = TN_EXIT_USAGE; goto out; }
        } else if ((sf = dist_flag(argc, argv, &i, &o, &seen)) != 0) {
            if (sf < 0) { rc = TN_EXIT_USAGE; goto out; }
        } else if ((sf = shared_flag(argc, argv, &i, &o, &log_every)) != 0) {
            if (sf < 0) { rc = TN_EXIT_USAGE; goto out; }
            lr_set |= !strcmp(a, "--lr");
        } else { rc = tn_cli_usage_error("finetune: unknown option '%s' (see tern finetune --help)", a); goto out; }
    }
    if (o.full && lora_flag) { rc = tn_cli_usage_error("finetune: %s is a LoRA option; --full trains every weight", lora_flag); goto out; }
    if (!o.full && out_type_set) { rc = tn_cli_usage_error("finetune: --out-type is for --full (a LoRA adapter is f32)"); goto out; }
    if (o.full) {
        o.lora.rank = 0;
        if (!out_type_set) o.out_type = TN_F16;
        if (!lr_set) o.opt.lr = 5e-5f;
    }
    if (!o.init) { rc = tn_cli_usage_error("finetune: -m base.gguf is required"); goto out; }
    if (!n_data) { rc = tn_cli_usage_error("finetune: --data FILE... is required"); goto out; }
    if (!o.out) { rc = tn_cli_usage_error("finetune: -o %s is required", o.full ? "model.gguf" : "adapter.gguf"); goto out; }
    if ((rc = dist_check(&o, &seen, "finetune"))) goto out;
    {
        const char *const inputs[] = {o.init};
        if ((rc = tn_cli_check_output("-o", o.out, inputs, 1)) != TN_EXIT_OK ||
            (rc = tn_cli_check_output("-o", o.out, data, n_data)) != TN_EXIT_OK)
            goto out;
    }
    if (!alpha_set) o.lora.alpha = 2.0f * (float)o.lora.rank;
    o.data = data;
    o.n_data = n_data;
    double t0 = tn_cli_now();
    if ((rc = run_cli(&o, log_every ? log_every : 10))) goto out;
    if (o.dist_rank) goto out; /* rank 0 reports */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr, "tern finetune: done in %.1f s: %d steps, final loss %.4f, val loss %.4f, %.0f tokens/s, planned %.1f MiB, "
            "peak RSS %.1f MiB\n", tn_cli_now() - t0, o.steps, o.final_loss, o.final_val_loss, o.tok_per_s,
            o.planned_bytes / 1048576.0, ru.ru_maxrss / 1024.0);
    dist_summary(&o, "finetune");
    if (o.full) fprintf(stderr, "tern finetune: wrote the model %s (%s) and its .loss.csv / .loss.svg\n", o.out, tn_dtype_name(o.out_type));
    else fprintf(stderr, "tern finetune: wrote the adapter %s (use: --lora %s) and its .loss.csv / .loss.svg\n", o.out, o.out);
out:
    free(data);
    return rc;
}
