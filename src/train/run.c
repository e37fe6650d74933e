/*
 * run.c — one training run end to end. See run.h.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/trace.h"
#include "tern/tern.h"
#include "train/bpe.h"
#include "train/ckpt.h"
#include "train/data.h"
#include "train/ftdata.h"
#include "train/run.h"

void tn_train_opts_default(tn_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->vocab_size = 4096;
    o->cfg = (tn_train_cfg){.n_vocab = 0, .n_ctx = 256, .n_embd = 256, .n_layer = 4, .n_head = 8, .n_head_kv = 4,
                            .n_ff = 768, .rms_eps = 1e-5f, .rope_base = 10000.0f};
    o->batch = 8;
    o->steps = 1000;
    o->warmup = -1;
    tn_adamw_default(&o->opt);
    o->min_lr_frac = 0.1f;
    o->seed = 1234;
    o->n_threads = 2;
    o->val_every = -1;
    o->val_batches = 4;
    o->ckpt_every = 0;
    o->out_type = TN_F32;
    o->recompute = -1;
    tn_dist_opts_default(&o->dist);
    o->zo = (tn_zo_opts){.on = false, .eps = 1e-3f, .samples = 1};
}

static void note(const tn_train_opts *o, const char *fmt, ...) TN_PRINTF(2, 3);
static void note(const tn_train_opts *o, const char *fmt, ...) {
    if (!o->note) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    o->note(buf, o->user);
}

static char *path_with(const char *out, const char *suffix) {
    size_t n = strlen(out);
    if (n > 5 && !strcmp(out + n - 5, ".gguf")) n -= 5;
    char *p = tn_malloc(n + strlen(suffix) + 1);
    if (!p) return NULL;
    memcpy(p, out, n);
    strcpy(p + n, suffix);
    return p;
}

static tern_status write_text(const char *path, const char *text, size_t n) {
    tn_wfile w;
    tern_status s = tn_wfile_open(path, &w);
    if (s) return s;
    tn_wfile_write(&w, text, n);
    return tn_wfile_commit(&w);
}

typedef struct sbuf { char *p; size_t n, cap; bool oom; } sbuf;
static void sb_printf(sbuf *b, const char *fmt, ...) TN_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) { b->oom = true; return; }
        if (b->p && b->n + (size_t)k < b->cap) { b->n += (size_t)k; return; }
        size_t nc = b->cap ? b->cap * 2 : 65536;
        while (nc < b->n + (size_t)k + 1) nc *= 2;
        char *np = tn_realloc(b->p, nc);
        if (!np) { b->oom = true; return; }
        b->p = np;
        b->cap = nc;
    }
}

/* loss.csv (step,loss,lr,val_loss) and an SVG plot of train (blue) and val (orange) loss. */
static tern_status write_curves(const tn_train_state *st, const char *out) {
    char *csv = path_with(out, ".loss.csv"), *svg = path_with(out, ".loss.svg");
    tern_status s = TERN_OK;
    sbuf b = {0};
    if (!csv || !svg) { s = tn_err(TERN_ERR_NOMEM, "train: paths"); goto done; }
    sb_printf(&b, "step,loss,lr,val_loss\n");
    int64_t vi = 0;
    for (int64_t i = 0; i < st->step; i++) {
        sb_printf(&b, "%lld,%.6f,%.6g,", (long long)(i + 1), st->loss[i], st->lr[i]);
        while (vi < st->n_val && st->val_step[vi] < i + 1) vi++;
        if (vi < st->n_val && st->val_step[vi] == i + 1) sb_printf(&b, "%.6f", st->val_loss[vi]);
        sb_printf(&b, "\n");
    }
    if (b.oom) { s = tn_err(TERN_ERR_NOMEM, "train: loss csv"); goto done; }
    if ((s = write_text(csv, b.p, b.n))) goto done;
    b.n = 0;
    /* plot */
    const double W = 800, H = 480, L = 60, R = 20, Tp = 30, B = 50;
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < st->step; i++) { lo = fmin(lo, st->loss[i]); hi = fmax(hi, st->loss[i]); }
    for (int64_t i = 0; i < st->n_val; i++) { lo = fmin(lo, st->val_loss[i]); hi = fmax(hi, st->val_loss[i]); }
    if (!(hi > lo)) { lo = isfinite(lo) ? lo - 1 : 0; hi = lo + 2; }
    const double nx = (double)(st->step > 1 ? st->step : 2);
#define X(i) (L + ((double)(i) - 1) / (nx - 1) * (W - L - R))
#define Y(v) (Tp + (hi - (v)) / (hi - lo) * (H - Tp - B))
    sb_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
              "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    sb_printf(&b, "<text x=\"%.0f\" y=\"18\">tern train: loss (blue: train, orange: validation)</text>\n", L);
    sb_printf(&b, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
    sb_printf(&b, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, Tp, L, H - B);
    for (int k = 0; k <= 4; k++) {
        double v = lo + (hi - lo) * k / 4.0;
        sb_printf(&b, "<text x=\"5\" y=\"%.1f\">%.2f</text>\n", Y(v) + 4, v);
        long long sx = (long long)llround(1 + (nx - 1) * k / 4.0);
        sb_printf(&b, "<text x=\"%.1f\" y=\"%.0f\">%lld</text>\n", X(sx) - 10, H - B + 18, sx);
    }
    sb_printf(&b, "<text x=\"%.0f\" y=\"%.0f\">step</text>\n", W / 2, H - 10);
    if (st->step) {
        sb_printf(&b, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1\" points=\"");
        int64_t stride = st->step > 2000 ? st->step / 2000 : 1;
        for (int64_t i = 0; i < st->step; i += stride) sb_printf(&b, "%.1f,%.1f ", X(i + 1), Y(st->loss[i]));
        sb_printf(&b, "\"/>\n");
    }
    if (st->n_val) {
        sb_printf(&b, "<polyline fill=\"none\" stroke=\"#ff7f0e\" stroke-width=\"2\" points=\"");
        for (int64_t i = 0; i < st->n_val; i++) sb_printf(&b, "%.1f,%.1f ", X(st->val_step[i]), Y(st->val_loss[i]));
        sb_printf(&b, "\"/>\n");
    }
    sb_printf(&b, "</svg>\n");
#undef X
#undef Y
    if (b.oom) { s = tn_err(TERN_ERR_NOMEM, "train: loss svg"); goto done; }
    s = write_text(svg, b.p, b.n);
done:
    tn_free(b.p);
    tn_free(csv);
    tn_free(svg);
    return s;
}

/* Mean validation loss over n_batches batches of B = accum * m->B sequences (each batch's loss
 * the mean over its targets, as in training). */
static double eval_val(tn_tmodel *m, const tn_data *d, int n_batches, int accum, int32_t *tok, int32_t *tgt, tern_status *s) {
    double sum = 0.0;
    for (int i = 0; i < n_batches; i++) {
        double ls = 0.0, l = 0.0;
        int64_t nv = 0;
        for (int j = 0; j < accum; j++) {
            tn_data_val(d, (int64_t)i * accum + j, m->B, tok, tgt);
            if ((*s = tn_tmodel_forward(m, tok, tgt, &l))) return NAN;
            int64_t k = 0;
            for (size_t r = 0; r < (size_t)m->B * m->T; r++) k += tgt[r] >= 0;
            ls += l * (double)k;
            nv += k;
        }
        sum += accum == 1 ? l : nv ? ls / (double)nv : 0.0;
    }
    return sum / n_batches;
}

static void note_line(const char *text, void *user) { note(user, "%s", text); }

/* Full fine-tuning trains the base's own weights in f32: its matrices must be F32, F16 or BF16
 * (a quantized base would be trained from its dequantized values and lose its format). */
static tern_status full_base_check(const tern_model *init, const char *path) {
    for (uint64_t i = 0; i < init->gguf->n_tensors; i++) {
        const tn_gguf_tensor *t = &init->gguf->tensors[i];
        if (t->type != TN_F32 && t->type != TN_F16 && t->type != TN_BF16)
            return tn_err(TERN_ERR_UNSUPPORTED, "finetune --full: %s holds %s tensor '%s'; full fine-tuning needs an F32, F16 "
                          "or BF16 base (quantized models: LoRA, drop --full, or `tern quantize` a float model afterwards)",
                          path, tn_dtype_name(t->type), t->name);
    }
    return TERN_OK;
}

/* The memory plan of the run (o->plan): --grad-accum / --recompute as given, or chosen for
 * --mem-budget; printed as a table. INVALID_ARG when the flags conflict or nothing fits. */
static tern_status choose_plan(tn_train_opts *o, const tn_tmodel *m, int T) {
    if (o->grad_accum > 0 && o->batch % o->grad_accum)
        return tn_err(TERN_ERR_INVALID_ARG, "train: --grad-accum %d must divide --batch %d", o->grad_accum, o->batch);
    if (o->zo.on && o->grad_accum > 1) return tn_err(TERN_ERR_INVALID_ARG, "train: --zo runs whole batches (no --grad-accum)");
    const int accum = o->zo.on ? 1 : o->grad_accum, rc = o->zo.on ? TN_RECOMPUTE_NONE : o->recompute;
    if (o->mem_budget) {
        if (!tn_mem_choose(m, o->batch, T, o->mem_budget, accum, rc, &o->plan)) {
            const tn_mem_plan *p = &o->plan;
            return tn_err(TERN_ERR_INVALID_ARG, "train: --mem-budget %.1f MiB is too small: the smallest configuration "
                          "(batch %d as %d micro-batches of %d, recompute %s) needs %.1f MiB (%.1f MiB parameters, "
                          "gradients, AdamW%s, %.1f MiB activations); raise the budget or lower --batch or --ctx",
                          o->mem_budget / 1048576.0, p->batch, p->accum, p->micro_batch, tn_recompute_name(p->recompute),
                          p->peak / 1048576.0, (p->params + p->grads + p->moments) / 1048576.0,
                          p->frozen ? " and the frozen base" : "", p->acts / 1048576.0);
        }
        note(o, "--mem-budget %.1f MiB: %d micro-batch%s of %d, recompute %s fits (predicted peak %.1f MiB)",
             o->mem_budget / 1048576.0, o->plan.accum, o->plan.accum > 1 ? "es" : "", o->plan.micro_batch,
             tn_recompute_name(o->plan.recompute), o->plan.peak / 1048576.0);
    } else {
        tn_tmodel_mem_plan(m, o->batch, accum > 0 ? accum : 1, T, rc >= 0 ? (tn_recompute)rc : TN_RECOMPUTE_NONE, &o->plan);
    }
    tn_mem_plan_lines(&o->plan, m->cfg.n_layer, note_line, o);
    return TERN_OK;
}

tern_status tn_train_run(tn_train_opts *o) {
    tern_status s = TERN_OK;
    tn_map *maps = NULL;
    const char **texts = NULL;
    size_t *lens = NULL;
    tn_vocab_data *voc = NULL;
    tern_model *init = NULL;
    tn_tmodel *m = NULL;
    tn_data data = {0};
    bool data_open = false;
    tn_train_state st = {0};
    int32_t *tok = NULL, *tgt = NULL;
    char *shard = NULL;
    bool shard_tmp = false;
    tn_dist *dist = NULL;
    if (!o->out) return tn_err(TERN_ERR_INVALID_ARG, "train: no output path (-o)");
    if (o->n_data < 1) return tn_err(TERN_ERR_INVALID_ARG, "train: no training data (--data FILE...)");
    const bool lora = o->lora.rank > 0, full = o->full && !lora;
    const bool ft = lora || full; /* finetune's data: JSONL chats or text, the base's tokenizer */
    if (lora && !o->init) return tn_err(TERN_ERR_INVALID_ARG, "train: LoRA needs a base model (-m)");
    if (o->full && (lora || !o->init)) return tn_err(TERN_ERR_INVALID_ARG, "train: full fine-tuning needs a base model (-m) and no LoRA rank");
    if ((o->steps < 1 && !(o->epochs > 0)) || o->batch < 1) return tn_err(TERN_ERR_INVALID_ARG, "train: --steps and --batch must be positive");
    if (o->ckpt_dir && o->ckpt_every < 1) o->ckpt_every = TN_MAX(1, o->steps / 10);
    if (o->resume && !o->ckpt_dir) return tn_err(TERN_ERR_INVALID_ARG, "train: --resume needs --ckpt-dir");
    if (o->zo.on && (o->dist.method == TN_DIST_DILOCO || o->dist.method == TN_DIST_NOLOCO))
        return tn_err(TERN_ERR_INVALID_ARG, "train: --zo runs alone or with --dist dp (ranks average the projected gradient)");
    /* --dist: MPI up first; only rank 0 reports, writes checkpoints and outputs (dist.h) */
    o->dist.token_weighted = ft; /* chats train on assistant tokens only: ranks' counts differ */
    o->dist.zo = o->zo.on;
    if ((s = tn_dist_open(&o->dist, o->seed, &dist))) return s;
    const int rank = tn_dist_rank(dist), n_ranks = tn_dist_size(dist);
    const bool outer = o->dist.method == TN_DIST_DILOCO || o->dist.method == TN_DIST_NOLOCO;
    o->dist_rank = rank;
    o->dist_size = n_ranks;
    if (rank) { o->note = NULL; o->progress = NULL; }
    if (outer && o->ckpt_dir) /* checkpoints at outer steps, where every rank's parameters agree */
        o->ckpt_every = (o->ckpt_every + o->dist.outer_every - 1) / o->dist.outer_every * o->dist.outer_every;
    /* refuse to clobber checkpoints of another run */
    if (o->ckpt_dir && !o->resume && !rank) {
        char mp[4096];
        snprintf(mp, sizeof mp, "%s/latest", o->ckpt_dir);
        if (access(mp, F_OK) == 0) {
            s = tn_err(TERN_ERR_INVALID_ARG, "train: %s holds checkpoints; pass --resume to continue them or use another "
                       "--ckpt-dir", o->ckpt_dir);
            goto done;
        }
    }
    /* 1. text */
    maps = tn_calloc((size_t)o->n_data, sizeof *maps);
    texts = tn_calloc((size_t)o->n_data, sizeof *texts);
    lens = tn_calloc((size_t)o->n_data, sizeof *lens);
    if (!maps || !texts || !lens) { s = tn_err(TERN_ERR_NOMEM, "train: data list"); goto done; }
    size_t total = 0;
    for (int i = 0; i < o->n_data && !ft; i++) { /* finetune data: train/ftdata.c reads the files */
        if ((s = tn_map_open(o->data[i], true, &maps[i]))) goto done;
        texts[i] = (const char *)maps[i].data;
        lens[i] = maps[i].size;
        total += lens[i];
        if ((s = tn_utf8_check(texts[i], lens[i], o->data[i]))) goto done;
    }
    if (!total && !ft) { s = tn_err(TERN_ERR_FORMAT, "train: the training data is empty (%s%s)", o->data[0], o->n_data > 1 ? ", ..." : ""); goto done; }
    /* 2. vocabulary and config */
    tn_train_cfg cfg = o->cfg;
    if (o->init) {
        tern_model_params mp;
        tern_model_params_init(&mp);
        /* LoRA's int8 forward runs inference's kernels, which are fastest on the interleaved
         * layouts (rows read back through tn_tensor_get_row for the backward); otherwise only
         * rows are read */
        mp.repack = lora && o->lora.base_int8;
        if ((s = tern_model_load(o->init, &mp, &init))) goto done;
        if (!ft && (s = tn_vocab_data_from_gguf(init->gguf, &voc))) goto done;
        if ((s = tn_train_cfg_from(init, o->cfg.n_ctx, &cfg))) { tn_err_prefix(s, "--init %s", o->init); goto done; }
        if (full && (s = full_base_check(init, o->init))) goto done;
        note(o, "fine-tuning %s (%s)%s", o->init, init->desc, lora ? " with LoRA; the base stays frozen in its file's types"
             : full ? ": every weight, trained in f32" : "");
    } else if (o->tokenizer) {
        tn_gguf *g;
        if ((s = tn_gguf_open(o->tokenizer, true, &g))) goto done;
        s = tn_vocab_data_from_gguf(g, &voc);
        tn_gguf_free(g);
        if (s) { tn_err_prefix(s, "%s", o->tokenizer); goto done; }
    } else {
        note(o, "learning a %d-token vocabulary from the data", o->vocab_size);
        if ((s = tn_bpe_train(texts, lens, o->n_data, o->vocab_size, &voc))) goto done;
    }
    if (voc) cfg.n_vocab = voc->n;
    else if (full) cfg.n_vocab = (int32_t)init->hp.n_vocab;
    if ((s = tn_train_cfg_check(&cfg))) goto done;
    cfg.forward_only = o->zo.on; /* zo.h: no gradients, no moments, forward activations only */
    /* 3. the model and its memory plan: what is needed, before touching data */
    if (lora) {
        if ((s = tn_tmodel_create_lora(&cfg, init, &o->lora, o->n_threads, &m))) goto done;
        note(o, "LoRA: %d matrices, rank %d, alpha %g; the base stays in its file's types (%s; never copied to f32)",
             m->n_lora, m->lora_rank, (double)m->lora_alpha,
             o->lora.base_int8 ? "forward products with the int8 kernels" : "--base-matmul f32: mapped, read as rows");
    } else if ((s = tn_tmodel_create(&cfg, o->n_threads, &m))) goto done;
    m->ce_rows = o->ce_rows;
    if ((s = choose_plan(o, m, cfg.n_ctx))) goto done;
    o->planned_bytes = o->plan.peak;
    m->recompute = o->plan.recompute;
    if ((s = tn_tmodel_plan(m, o->plan.micro_batch, cfg.n_ctx))) goto done;
    /* 4. data */
    if (o->ckpt_dir) {
        if (mkdir(o->ckpt_dir, 0777) && access(o->ckpt_dir, W_OK)) {
            s = tn_err(TERN_ERR_IO, "train: cannot create checkpoint dir %s", o->ckpt_dir);
            goto done;
        }
        size_t n = strlen(o->ckpt_dir) + 32;
        shard = tn_malloc(n);
        if (shard) snprintf(shard, n, rank ? "%s/train.r%d.tokens" : "%s/train.tokens", o->ckpt_dir, rank);
    } else {
        char sfx[48];
        snprintf(sfx, sizeof sfx, rank ? ".tokens.r%d.tmp" : ".tokens.tmp", rank);
        shard = path_with(o->out, sfx);
        shard_tmp = true;
    }
    if (!shard) { s = tn_err(TERN_ERR_NOMEM, "train: paths"); goto done; }
    if (ft) {
        int32_t *stok;
        uint8_t *skeep;
        int64_t ns;
        tn_ft_stats fs;
        if ((s = tn_ft_samples(init, o->data, o->n_data, cfg.n_ctx, o->skip_bad_lines, o->note, o->user, &stok, &skeep, &ns, &fs)))
            goto done;
        if ((s = tn_data_from_samples(stok, skeep, ns, cfg.n_ctx, o->val_split, o->seed, &data))) goto done;
        data_open = true;
        note(o, "data: %lld chats (%lld cut to %d tokens, %lld lines skipped), %lld text windows; %lld tokens, %lld trained "
             "targets; %lld training and %lld validation samples", (long long)fs.n_chats, (long long)fs.n_cut, cfg.n_ctx + 1,
             (long long)fs.n_skipped, (long long)fs.n_text_windows, (long long)fs.n_tokens, (long long)fs.n_trained,
             (long long)data.n_train, (long long)data.n_val);
    } else {
        uint64_t n_tok;
        if ((s = tn_shard_build(texts, lens, o->n_data, voc, shard, &n_tok))) goto done;
        if ((s = tn_data_open(shard, voc, cfg.n_ctx, o->seed, &data))) goto done;
        data_open = true;
        note(o, "data: %.2f MB of text, %llu tokens (%.2f bytes/token), %lld training and %lld validation windows of %d",
             total / 1e6, (unsigned long long)n_tok, (double)total / (double)n_tok, (long long)data.n_train,
             (long long)data.n_val, cfg.n_ctx);
    }
    if (o->epochs > 0) {
        const double st_ = ceil(o->epochs * (double)data.n_train / (double)o->batch);
        o->steps = st_ > 1e8 ? 100000000 : st_ < 1 ? 1 : (int)st_;
        if (o->ckpt_dir && o->ckpt_every < 1) o->ckpt_every = TN_MAX(1, o->steps / 10);
    }
    note(o, "model: %s, %.2fM parameters, n_embd %d, %d layers, %d/%d heads of %d, n_ff %d, vocab %d, ctx %d; %d threads",
         m->hp.family->name, m->n_params / 1e6, cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.n_head_kv, m->hp.head_dim,
         cfg.n_ff, cfg.n_vocab, cfg.n_ctx, o->n_threads);
    /* 5. weights: checkpoint, init model or random */
    st.seed = o->seed;
    st.vocab_hash = voc ? tn_vocab_data_hash(voc) : (uint64_t)init->hp.n_vocab;
    bool found = false;
    if (o->resume && (s = tn_ckpt_load(m, &st, o->ckpt_dir, &found))) goto done;
    if (found) {
        if (st.seed != o->seed) { s = tn_err(TERN_ERR_INVALID_ARG, "train: checkpoint seed %llu differs from --seed %llu",
                                             (unsigned long long)st.seed, (unsigned long long)o->seed); goto done; }
        if ((s = tn_data_seek(&data, st.epoch, st.pos))) goto done;
        note(o, "resumed from %s at step %lld", o->ckpt_dir, (long long)st.step);
    } else {
        if (o->resume) note(o, "no checkpoint in %s yet: starting from step 0", o->ckpt_dir);
        if (lora) { /* tn_tmodel_create_lora initialized the adapter (lora_b = 0: the base) */ }
        else if (init) { if ((s = tn_tmodel_init_from(m, init))) goto done; }
        else tn_tmodel_init_random(m, o->seed);
    }
    if (init && !ft) { tern_model_free(init); init = NULL; } /* LoRA reads the base to the end, full its tokenizer keys */
    if ((s = tn_dist_begin(dist, m))) goto done;
    if (dist) {
        char plan[512];
        tn_dist_describe(dist, plan, sizeof plan);
        note(o, "--dist %s on %d ranks: batch %d per rank (global %d)%s%s", tn_dist_name(o->dist.method), n_ranks,
             o->batch, o->batch * n_ranks, outer ? ", outer step every --outer-every steps" : "", plan);
    }
    const size_t N = (size_t)o->batch * cfg.n_ctx;
    tok = tn_malloc(N * (size_t)n_ranks * sizeof *tok); /* the global batch; this rank keeps its rows */
    tgt = tn_malloc(N * (size_t)n_ranks * sizeof *tgt);
    if (!tok || !tgt) { s = tn_err(TERN_ERR_NOMEM, "train: batch"); goto done; }
    const int warmup = o->warmup >= 0 ? o->warmup : TN_MIN(100, o->steps / 10);
    const int val_every = o->val_every > 0 ? o->val_every : TN_MAX(1, o->steps / 20);
    const int val_batches = TN_MAX(1, o->val_batches);
    double t0 = tn_time_s(), tokens_done = 0, loss = NAN;
    tn_zo_state zst = {.clip = st.zo_clip}; /* a resumed run goes on with the saved range */
    int64_t first_step = st.step;
    while (st.step < o->steps) {
        if (o->stop && *o->stop) {
            const bool save = o->ckpt_dir && st.step > first_step && !rank && !outer && !tn_dist_zero(dist);
            if (save && (s = tn_ckpt_save(m, &st, o->ckpt_dir))) goto done;
            if (lora && st.step > 0 && (s = tn_lora_export(m, o->name, o->out))) goto done;
            if (full && st.step > 0 && (s = tn_tmodel_export_tok(m, NULL, init->gguf, o->name, o->out_type, o->out))) goto done;
            s = tn_err(TERN_ERR_ABORTED, "train: interrupted at step %lld%s%s", (long long)st.step,
                       lora && st.step > 0 ? " (the adapter so far is written)" : full && st.step > 0 ? " (the model so far is written)" : "",
                       save ? " (checkpoint written; --resume continues)" : "");
            goto done;
        }
        /* trace: train_step > forward, zero_grad, backward, [allreduce,] optimizer, [eval, checkpoint] */
        TN_SPAN_B(TN_TK_STEP, "train_step", -1, st.step + 1, (int64_t)N * n_ranks, 0, 0);
        tn_data_next(&data, o->batch * n_ranks, tok, tgt);
        tn_dist_shard(dist, o->batch, cfg.n_ctx, tok, tgt);
        float lr = tn_lr_at(st.step, warmup, o->steps, o->opt.lr, o->min_lr_frac);
        double gn = NAN;
        if (o->zo.on) { /* zo.h: forward passes only */
            if ((s = tn_zo_step(m, dist, &o->zo, &zst, o->seed, st.step, tok, tgt, lr, &loss))) goto done;
            st.zo_clip = zst.clip; /* checkpointed with the step */
        } else if ((s = tn_tmodel_grads(m, tok, tgt, o->plan.accum, &loss))) goto done; /* forward + backward */
        if (!isfinite(loss)) { s = tn_err(TERN_ERR_INTERNAL, "train: loss is %f at step %lld (diverged; lower --lr)", loss, (long long)st.step); goto done; }
        if (!o->zo.on) {
            if (dist) TN_SPAN_B(TN_TK_PHASE, "allreduce", -1, 0, 0, 0, 0);
            if ((s = tn_dist_grads(dist, m, &loss))) goto done;
            if (dist) TN_SPAN_E(TN_TK_PHASE, "allreduce", -1, 0, 0);
            TN_SPAN_B(TN_TK_PHASE, "optimizer", -1, 0, 0, 0, 0);
            if (tn_dist_zero(dist)) { /* ZeRO-1: this rank's slice, then all-gather (dist.h) */
                if ((s = tn_dist_zero_step(dist, m, &o->opt, lr, st.step + 1, &gn))) goto done;
            } else {
                TN_SPAN_B(TN_TK_OPTIMIZER, "grad_norm", -1, 0, 0, 0, 0);
                gn = tn_grad_norm(m);
                const bool sgd = o->optim == TN_OPTIM_SGD;
                TN_SPAN_NEXT(TN_TK_OPTIMIZER, "grad_norm", -1, TN_TK_OPTIMIZER, sgd ? "sgd" : "adamw", -1);
                float clip = o->opt.grad_clip > 0 && gn > o->opt.grad_clip ? (float)(o->opt.grad_clip / (gn + 1e-6)) : 1.0f;
                if (sgd) tn_sgd_step(m, &o->opt, lr, clip);
                else tn_adamw_step(m, &o->opt, lr, st.step + 1, clip);
                TN_SPAN_E(TN_TK_OPTIMIZER, sgd ? "sgd" : "adamw", -1, 0, 0);
            }
            TN_SPAN_E(TN_TK_PHASE, "optimizer", -1, 0, 0);
        }
        bool synced;
        if (outer) TN_SPAN_B(TN_TK_PHASE, "allreduce", -1, 0, 0, 0, 0);
        if ((s = tn_dist_outer(dist, m, st.step + 1, st.step + 1 == o->steps, &loss, &synced))) goto done;
        if (outer) TN_SPAN_E(TN_TK_PHASE, "allreduce", -1, 0, 0);
        if ((s = tn_train_state_push(&st, (float)loss, lr))) goto done;
        st.step++;
        st.epoch = data.epoch;
        st.pos = data.pos;
        tokens_done += (double)N * n_ranks;
        double vl = NAN;
        if (!rank && data.n_val && (st.step % val_every == 0 || st.step == o->steps)) { /* rank 0 reports */
            TN_SPAN_B(TN_TK_PHASE, "eval", -1, val_batches, 0, 0, 0);
            vl = eval_val(m, &data, val_batches, o->plan.accum, tok, tgt, &s);
            if (s) goto done;
            TN_SPAN_E(TN_TK_PHASE, "eval", -1, 0, 0);
            if ((s = tn_train_state_push_val(&st, (int32_t)st.step, (float)vl))) goto done;
        }
        if (o->ckpt_dir && (st.step % o->ckpt_every == 0 || st.step == o->steps)) { /* rank 0 writes */
            TN_SPAN_B(TN_TK_PHASE, "checkpoint", -1, 0, 0, 0, 0);
            if ((s = tn_dist_ckpt_save(dist, m, &st, o->ckpt_dir))) goto done;
            TN_SPAN_E(TN_TK_PHASE, "checkpoint", -1, 0, 0);
        }
        if (TN_TRACE_ON()) {
            tn_trace_counter("loss", loss);
            tn_trace_counter("lr", lr);
            if (isfinite(gn)) tn_trace_counter("grad_norm", gn);
            tn_trace_counter("tokens_per_s", tokens_done / (tn_time_s() - t0));
            tn_trace_rec(TN_PH_END, TN_TK_STEP, "train_step", -1, 0, st.step, (int64_t)N * n_ranks, 0, 0);
        }
        if (o->progress) {
            double el = tn_time_s() - t0;
            tn_train_progress p = {.step = st.step, .steps = o->steps, .loss = loss, .val_loss = vl, .lr = lr,
                                   .tok_per_s = tokens_done / el, .eta_s = el / (double)(st.step - first_step) * (double)(o->steps - st.step),
                                   .grad_norm = gn, .comm_bytes = tn_dist_bytes(dist),
                                   .link_wait_s = tn_dist_link_wait(dist), .final = st.step == o->steps};
            o->progress(&p, o->user);
        }
    }
    o->final_loss = st.step ? st.loss[st.step - 1] : NAN;
    o->final_val_loss = st.n_val ? st.val_loss[st.n_val - 1] : NAN;
    o->weights_hash = tn_hash64(m->params, m->n_params * sizeof(float), 0);
    bool same;
    if ((s = tn_dist_same(dist, o->weights_hash, &same))) goto done;
    /* after the check: under --dist every rank has finished its last exchange (with --sim-link,
     * its sleep), so this is the job's time, not rank 0's alone */
    o->tok_per_s = tokens_done / (tn_time_s() - t0);
    if (dist) note(o, "final weights on the %d ranks: %s (hash %016llx on rank 0)", n_ranks, same ? "identical" : "differ",
                   (unsigned long long)o->weights_hash);
    o->comm_bytes = tn_dist_bytes(dist);
    o->link_wait_s = tn_dist_link_wait(dist);
    /* 6. outputs */
    if (!rank) {
        TN_SPAN_B(TN_TK_PHASE, "export", -1, 0, 0, 0, 0); /* converting (quantizing) and writing the output */
        if (lora) s = tn_lora_export(m, o->name, o->out);
        else if (full) s = tn_tmodel_export_tok(m, NULL, init->gguf, o->name, o->out_type, o->out);
        else s = tn_tmodel_export(m, voc, o->name, o->out_type, o->out);
        if (s) goto done;
        TN_SPAN_E(TN_TK_PHASE, "export", -1, 0, 0);
        if ((s = write_curves(&st, o->out))) goto done;
    }
done:
    tn_dist_close(dist, s == TERN_OK);
    if (shard && shard_tmp) unlink(shard);
    tn_free(shard);
    tn_free(tok);
    tn_free(tgt);
    tn_train_state_free(&st);
    if (data_open) tn_data_close(&data);
    tn_tmodel_free(m);
    if (init) tern_model_free(init);
    tn_vocab_data_free(voc);
    if (maps)
        for (int i = 0; i < o->n_data; i++) tn_map_close(&maps[i]);
    tn_free(maps);
    tn_free(texts);
    tn_free(lens);
    return s;
}
