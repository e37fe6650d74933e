/*
 * cmd_imatrix.c — `tern imatrix -m model.gguf -f calib.txt [-c 512] [--chunks N] -o imatrix.gguf`:
 * llama-imatrix's job. The text is tokenized once (with BOS), cut into chunks of -c tokens, and
 * each chunk is run from an empty cache with its first token replaced by BOS. An activation
 * observer in the forward pass (model/ctx.h) sees the f32 input rows of every matmul: for each
 * weight of the blk.* layers (and output.weight with --process-output) it sums x_i^2 per input
 * column and counts the rows. wq/wk/wv share one input, as do w_gate/w_up, so each gets the same
 * sums. Like llama-imatrix, matmuls over fewer than 16 rows are not collected. Mixture of experts:
 * the router is collected like a dense weight, and each *_exps tensor per expert (the rows routed
 * to it, however few; llama-imatrix's in_sum2 [ne0][n_expert] and counts [1][n_expert]).
 *
 * The result is llama.cpp's GGUF imatrix format (src/quant/imatrix.h): llama-quantize --imatrix
 * accepts it, and tern quantize --imatrix accepts llama-imatrix's. Written atomically at the end;
 * Ctrl-C stops with exit 130 and no file. One progress line per chunk on stderr (with the
 * perplexity of the chunk's second half unless --no-ppl).
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/ctx.h"
#include "model/ops.h"
#include "quant/imatrix.h"

static volatile sig_atomic_t g_stop;
static void on_sigint(int sig) {
    (void)sig;
    g_stop = 1;
}

/* Entry indices of the weights reading each (layer, site). */
typedef struct {
    tn_imatrix_acc *acc;
    int32_t n_layer;
    size_t (*idx)[5][4]; /* [n_layer + 1][site][<= 4 weights] */
    uint8_t (*nidx)[5];
    size_t (*xidx)[2][2]; /* MoE: [n_layer][in, down][<= 2 expert tensors] (NULL: dense) */
    uint8_t (*nxidx)[2];
    tern_status err;
} obs_state;

static void observe(void *user, int32_t il, tn_obs_site site, const float *x, int32_t n, int32_t ne0) {
    obs_state *o = user;
    if (o->err || n < 16 || il < 0 || il > o->n_layer || (int)site < 0 || (int)site >= 5) return;
    const uint8_t k = o->nidx[il][site];
    if (k) o->err = tn_imatrix_acc_add(o->acc, o->idx[il][site], k, x, n, ne0);
}

/* Experts (tn_blk_moe): every routed row counts, per expert, as llama-imatrix collects its
 * indirect products (no 16-row minimum). */
static void observe_moe(void *user, int32_t il, tn_obs_site site, int32_t e, const float *x, const int32_t *rows,
                        int32_t n, int32_t ne0) {
    obs_state *o = user;
    const int si = site == TN_OBS_FFN_DOWN;
    if (o->err || !o->xidx || il < 0 || il >= o->n_layer || (site != TN_OBS_FFN_IN && !si)) return;
    const uint8_t k = o->nxidx[il][si];
    if (k) o->err = tn_imatrix_acc_add_rows(o->acc, o->xidx[il][si], k, e, x, rows, n, ne0);
}

static tern_status add_expert_entry(obs_state *o, int32_t il, int si, const tn_tensor *w) {
    if (!w->data || !w->name) return TERN_OK;
    uint8_t *k = &o->nxidx[il][si];
    tern_status s = tn_imatrix_acc_entry_mat(o->acc, w->name, w->ne[0], w->ne[2], &o->xidx[il][si][*k]);
    if (!s) (*k)++;
    return s;
}

static tern_status add_entry(obs_state *o, int32_t il, tn_obs_site site, const tn_tensor *w) {
    if (!w->data || !w->name) return TERN_OK;
    uint8_t *k = &o->nidx[il][site];
    tern_status s = tn_imatrix_acc_entry(o->acc, w->name, w->ne[0], &o->idx[il][site][*k]);
    if (!s) (*k)++;
    return s;
}

static void usage(void) {
    printf("usage: tern imatrix -m model.gguf -f calib.txt [options]\n"
           "  -o, --output FILE      output file (default imatrix.gguf)\n"
           "  -c, --ctx-size N       chunk length in tokens (default 512)\n"
           "  --chunks N             use at most N chunks (default: all)\n"
           "  -t, --threads N        threads (default: all cores)\n"
           "  --process-output       also collect output.weight (llama-imatrix --process-output)\n"
           "  --no-ppl               do not compute the perplexity of each chunk\n");
}


int cmd_imatrix(int argc, char **argv) {
    const char *model_path = NULL, *text_path = NULL, *out_path = "imatrix.gguf";
    int64_t n_ctx = 512, threads = 0, max_chunks = -1;
    bool process_output = false, ppl = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const bool more = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && more) {
            model_path = argv[++i];
        } else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && more) {
            text_path = argv[++i];
        } else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && more) {
            out_path = argv[++i];
        } else if ((!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) && more) {
            if (!tn_cli_parse_i64(argv[++i], 16, 1 << 20, &n_ctx)) return tn_cli_usage_error("bad context size '%s' (16 or more)", argv[i]);
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && more) {
            if (!tn_cli_parse_i64(argv[++i], 1, 1024, &threads)) return tn_cli_usage_error("bad thread count '%s'", argv[i]);
        } else if (!strcmp(a, "--chunks") && more) {
            if (!tn_cli_parse_i64(argv[++i], 1, INT32_MAX, &max_chunks)) return tn_cli_usage_error("bad chunk count '%s'", argv[i]);
        } else if (!strcmp(a, "--process-output")) {
            process_output = true;
        } else if (!strcmp(a, "--no-ppl")) {
            ppl = false;
        } else {
            return tn_cli_usage_error("unknown argument '%s' (see tern imatrix --help)", a);
        }
    }
    if (!model_path) return tn_cli_usage_error("missing -m model.gguf");
    if (!text_path) return tn_cli_usage_error("missing -f calib.txt");
    {
        const char *const inputs[] = {model_path, text_path};
        const int orc = tn_cli_check_output("-o", out_path, inputs, 2);
        if (orc != TN_EXIT_OK) return orc;
    }

    int rc = TN_EXIT_OK;
    tern_model *m = NULL;
    tern_ctx *c = NULL;
    char *text = NULL;
    tern_token *toks = NULL, *chunk = NULL;
    obs_state o = {0};
    tern_model_params mp;
    tern_model_params_init(&mp);
    tern_status s = tern_model_load(model_path, &mp, &m);
    if (s) return tn_cli_fail(s, "loading the model");
    size_t len = 0;
    int32_t n_tok = 0;
    if ((s = tn_cli_read_file(text_path, &text, &len))) { rc = tn_cli_fail(s, "reading the calibration text"); goto out; }
    if ((s = tn_cli_tokenize(m, text, len, true, false, &toks, &n_tok))) { rc = tn_cli_fail(s, "tokenizing"); goto out; }
    if (n_tok < 2 * n_ctx) {
        fprintf(stderr, "tern: error: need at least %lld tokens for -c %lld; '%s' has %d\n", (long long)(2 * n_ctx),
                (long long)n_ctx, text_path, n_tok);
        rc = TN_EXIT_DATAERR;
        goto out;
    }
    int64_t n_chunk = n_tok / n_ctx;
    if (max_chunks > 0 && n_chunk > max_chunks) n_chunk = max_chunks;
    const tn_hparams *hp = &m->hp;
    if (n_ctx > hp->n_ctx_train)
        fprintf(stderr, "imatrix: warning: the model was trained on only %d context tokens (-c %lld)\n", hp->n_ctx_train,
                (long long)n_ctx);

    /* entries: one per weight, in the model's order */
    o.n_layer = hp->n_layer;
    o.idx = calloc((size_t)hp->n_layer + 1, sizeof *o.idx);
    o.nidx = calloc((size_t)hp->n_layer + 1, sizeof *o.nidx);
    if (!o.idx || !o.nidx) { rc = TN_EXIT_OSERR; goto out; }
    if (hp->n_expert > 0) {
        o.xidx = calloc((size_t)hp->n_layer, sizeof *o.xidx);
        o.nxidx = calloc((size_t)hp->n_layer, sizeof *o.nxidx);
        if (!o.xidx || !o.nxidx) { rc = TN_EXIT_OSERR; goto out; }
    }
    if ((s = tn_imatrix_acc_create(&o.acc))) { rc = tn_cli_fail(s, "imatrix"); goto out; }
    for (int32_t il = 0; il < hp->n_layer && !s; il++) {
        const tn_tensor *w = m->layers[il].w;
        if (!s) s = add_entry(&o, il, TN_OBS_ATTN_IN, &w[TN_ROLE_ATTN_Q]);
        if (!s) s = add_entry(&o, il, TN_OBS_ATTN_IN, &w[TN_ROLE_ATTN_K]);
        if (!s) s = add_entry(&o, il, TN_OBS_ATTN_IN, &w[TN_ROLE_ATTN_V]);
        if (!s) s = add_entry(&o, il, TN_OBS_ATTN_OUT, &w[TN_ROLE_ATTN_OUT]);
        if (!s) s = add_entry(&o, il, TN_OBS_FFN_IN, &w[TN_ROLE_FFN_GATE]);
        if (!s) s = add_entry(&o, il, TN_OBS_FFN_IN, &w[TN_ROLE_FFN_UP]);
        if (!s) s = add_entry(&o, il, TN_OBS_FFN_DOWN, &w[TN_ROLE_FFN_DOWN]);
        if (!s) s = add_entry(&o, il, TN_OBS_FFN_IN, &w[TN_ROLE_FFN_GATE_INP]); /* MoE: the router */
        if (!s && o.xidx) s = add_expert_entry(&o, il, 0, &w[TN_ROLE_FFN_GATE_EXPS]);
        if (!s && o.xidx) s = add_expert_entry(&o, il, 0, &w[TN_ROLE_FFN_UP_EXPS]);
        if (!s && o.xidx) s = add_expert_entry(&o, il, 1, &w[TN_ROLE_FFN_DOWN_EXPS]);
        /* a shared expert (qwen2moe): dense weights on the same inputs; its gate vector is a
         * one-row product llama-imatrix collects too */
        if (!s) s = add_entry(&o, il, TN_OBS_FFN_IN, &w[TN_ROLE_FFN_GATE_INP_SHEXP]);
        if (!s) s = add_entry(&o, il, TN_OBS_FFN_IN, &w[TN_ROLE_FFN_GATE_SHEXP]);
        if (!s) s = add_entry(&o, il, TN_OBS_FFN_IN, &w[TN_ROLE_FFN_UP_SHEXP]);
        if (!s) s = add_entry(&o, il, TN_OBS_FFN_DOWN, &w[TN_ROLE_FFN_DOWN_SHEXP]);
    }
    /* llama-imatrix only names output.weight (a tied output is token_embd: not collected) */
    if (!s && process_output && m->output.name && !strcmp(m->output.name, "output.weight"))
        s = add_entry(&o, hp->n_layer, TN_OBS_OUTPUT, &m->output);
    if (s) { rc = tn_cli_fail(s, "imatrix"); goto out; }

    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = (int32_t)n_ctx;
    cp.n_batch = (int32_t)n_ctx;
    cp.logits_all = ppl || process_output;
    if (threads > 0) cp.n_threads = (int32_t)threads;
    if ((s = tern_ctx_create(m, &cp, &c))) { rc = tn_cli_fail(s, "creating the context"); goto out; }
    c->observe = observe;
    c->observe_moe = observe_moe;
    c->observe_user = &o;

    chunk = malloc(sizeof *chunk * (size_t)n_ctx);
    if (!chunk) { rc = TN_EXIT_OSERR; goto out; }
    const int n_vocab = hp->n_vocab, first = (int)(n_ctx / 2);
    const tern_token bos = tern_token_bos(m);
    const bool add_bos = tern_vocab_add_bos(m) && bos >= 0;
    size_t n_w = 0;
    for (int32_t il = 0; il <= hp->n_layer; il++)
        for (int k = 0; k < 5; k++) n_w += o.nidx[il][k];
    for (int32_t il = 0; o.xidx && il < hp->n_layer; il++) n_w += (size_t)o.nxidx[il][0] + o.nxidx[il][1];
    fprintf(stderr, "imatrix: %s: %d tokens, %lld chunks of %lld, %zu weights\n", text_path, n_tok, (long long)n_chunk,
            (long long)n_ctx, n_w);
    signal(SIGINT, on_sigint);
    signal(SIGTERM, on_sigint);
    double nll = 0;
    int64_t count = 0, done = 0;
    const double t0 = tn_cli_now();
    for (int64_t ci = 0; ci < n_chunk && !g_stop; ci++) {
        memcpy(chunk, toks + ci * n_ctx, sizeof *chunk * (size_t)n_ctx);
        if (add_bos) chunk[0] = bos;
        if ((s = tern_ctx_truncate(c, 0)) || (s = tern_decode(c, chunk, (int32_t)n_ctx))) { rc = tn_cli_fail(s, "decoding"); goto out; }
        if (o.err) { rc = tn_cli_fail(o.err, "collecting activations"); goto out; }
        done++;
        const double el = tn_cli_now() - t0;
        fprintf(stderr, "imatrix: [%lld/%lld] ", (long long)ci + 1, (long long)n_chunk);
        if (ppl) {
            for (int i = first; i < n_ctx - 1; i++) {
                const float *l = tern_get_logits(c, i);
                nll += tn_op_logsumexp(l, n_vocab, NULL) - l[chunk[i + 1]];
            }
            count += n_ctx - 1 - first;
            fprintf(stderr, "PPL %.4f  ", exp(nll / (double)count));
        }
        fprintf(stderr, "%.1f s, ETA %.1f s\n", el, el / (double)(ci + 1) * (double)(n_chunk - ci - 1));
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (g_stop) {
        fprintf(stderr, "tern: interrupted; no output written\n");
        rc = TN_EXIT_INTERRUPTED;
        goto out;
    }
    if ((s = tn_imatrix_acc_save(o.acc, out_path, text_path, (uint32_t)done, (uint32_t)n_ctx))) {
        rc = tn_cli_fail(s, "writing the importance matrix");
        goto out;
    }
    fprintf(stderr, "imatrix: wrote %s (%lld chunks of %lld tokens)\n", out_path, (long long)done, (long long)n_ctx);
    for (int32_t il = 0; c->moe_count && il < hp->n_layer; il++) { /* the context's own routing counters */
        fprintf(stderr, "imatrix: expert usage blk.%d:", il);
        for (int32_t e = 0; e < hp->n_expert; e++)
            fprintf(stderr, " %llu", (unsigned long long)c->moe_count[(int64_t)il * hp->n_expert + e]);
        fprintf(stderr, "\n");
    }
out:
    free(chunk);
    tn_imatrix_acc_free(o.acc);
    free(o.idx);
    free(o.nidx);
    free(o.xidx);
    free(o.nxidx);
    free(toks);
    free(text);
    tern_ctx_free(c);
    tern_model_free(m);
    return rc;
}
