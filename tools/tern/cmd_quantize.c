/*
 * cmd_quantize.c — `tern quantize in.gguf out.gguf TYPE [threads]`: llama-quantize's job.
 *
 * TYPE is a llama.cpp file type (q8_0, q4_0, q4_k_m, q5_k_m, q6_k, q3_k_m, q2_k, ...: the same
 * per-tensor types as llama-quantize, src/quant/mix.h, and byte-identical output files) or a
 * tern any-bit type (tq<b>[g<G>][a|s], src/quant/tq.h) or codebook type (vq2, src/quant/vq.h: a
 * codebook fitted per matrix before its rows are quantized in parallel). The output is written to a temp file and
 * renamed (never half-written); in == out is refused; Ctrl-C stops with exit 130 and no file.
 * Progress goes to stderr, one line per tensor, in llama-quantize's format.
 *
 * --imatrix FILE (tern imatrix or llama-imatrix output): tq types use it in their weighted scale
 * search; llama.cpp types use ggml's importance-weighted quantizers (src/quant/quant_iw.c), so the
 * file stays byte-identical to llama-quantize --imatrix (quantize.imatrix.* keys included).
 * --target-bpw X (tq TYPE only): per-tensor bit widths of TYPE's family chosen under a whole-file
 * budget of X bits per weight, weighing each tensor's error by its measured KL sensitivity
 * (probes on --calib text, or on text the model generates; docs/quant-quality.md);
 * --target-types LIST adds other types (vq2, llama.cpp's) to every tensor's candidates.
 */
#include <cblas.h>
#include <math.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/cpu.h"
#include "core/file.h"
#include "core/pool.h"
#include "fmt/gguf.h"
#include "kern/kern.h"
#include "model/ctx.h"
#include "model/model.h"
#include "model/ops.h"
#include "quant/imatrix.h"
#include "quant/iq_grid.h"
#include "quant/mix.h"
#include "quant/quant.h"
#include "quant/tq.h"
#include "quant/vq.h"
#include "tensor/dtype.h"

static volatile sig_atomic_t g_stop;
static void on_sigint(int sig) {
    (void)sig;
    g_stop = 1;
}

typedef struct {
    regex_t re;
    int type;
} tt_override;

typedef struct {
    tt_override *ov;
    int n_ov;
} ov_set;

static int override_fn(void *user, const char *name) {
    ov_set *s = user;
    for (int i = 0; i < s->n_ov; i++)
        if (regexec(&s->ov[i].re, name, 0, NULL, 0) == 0) return s->ov[i].type;
    return -1;
}

/* A tensor type name: ggml's (q4_K, f16, ...) or a tern tq name. */
static bool parse_dtype(const char *s, int *out) {
    tn_dtype t;
    tn_tq_params p;
    if (tn_tq_from_name(s, &p)) return (*out = (int)tn_tq_dtype(&p)), true;
    if (tn_dtype_from_name(s, &t)) {
        const tn_dtype_traits *tr = tn_dtype_get(t);
        if (!tr || !tr->supported || t == TN_Q8_1 || t == TN_Q8_K) return false;
        *out = (int)t;
        return true;
    }
    return false;
}

#define HESS_SITES 4 /* TN_OBS_ATTN_IN .. TN_OBS_FFN_DOWN: the inputs a Hessian is kept for */

typedef struct {
    const tn_gguf *in;
    const size_t *order;       /* output index -> input tensor index */
    const tn_qmix_choice *ch;  /* per output index */
    size_t n;
    tn_pool *pool;
    const tn_imatrix *imat;
    bool allow_requantize;
    tn_ftype ftype;
    float *f32;                /* scratch: largest tensor as floats */
    uint64_t total_in, total_out, n_elem;
    /* task */
    const float *task_x;
    uint8_t *task_y;
    int64_t task_rows, task_ne0;
    uint32_t task_type;
    const float *task_imat;
    int64_t task_mat_rows; /* > 0: task_imat holds one row of ne0 per matrix of this many rows (experts) */
    int8_t task_cb[TN_VQ_CB_BYTES]; /* vq types: the tensor's fitted codebook */
    const struct hess_set *hess;    /* --calib with a vq type: Hessians per weight, or NULL */
    tn_vq_gptq *task_gptq;          /* this tensor's error-feedback state, or NULL */
    int n_gptq;                     /* tensors quantized with it */
    /* per input site: the last Hessian factored and its state (q/k/v, gate/up share one) */
    const float *gptq_H[HESS_SITES];
    tn_vq_gptq *gptq_of[HESS_SITES];
} qctx;

static const float *hess_find(const struct hess_set *h, const char *name, int64_t ne0, int *site);

static void fmt_shape(const tn_gguf_tensor *t, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "%5lld", (long long)t->ne[0]);
    for (uint32_t i = 1; i < t->n_dims && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, ", %5lld", (long long)t->ne[i]);
}

/* The tensor's values as floats: its own data if f32, else dequantized into buf. */
static tern_status tensor_f32(const tn_gguf_tensor *t, float *buf, const float **out) {
    if (t->type == TN_F32) {
        *out = (const float *)t->data;
        return TERN_OK;
    }
    int64_t nel = 1;
    for (uint32_t i = 0; i < t->n_dims; i++) nel *= t->ne[i];
    const int64_t ne0 = t->ne[0], rows = nel / ne0;
    const size_t rb = tn_dtype_row_size((tn_dtype)t->type, ne0);
    /* the table's to_float where the type has one (same floats at every ISA, kern.h) */
    const tn_to_float_fn tf = t->type < TN_DTYPE_SLOT_COUNT ? tn_kern()->slot[t->type].to_float : NULL;
    for (int64_t r = 0; r < rows; r++) {
        bool ok;
        if (tf) { /* every tq type has one (kern/scalar/tq.c) */
            tf(t->data + (size_t)r * rb, buf + r * ne0, ne0);
            ok = true;
        } else {
            ok = tn_dequantize_row((tn_dtype)t->type, t->data + (size_t)r * rb, buf + r * ne0, ne0);
        }
        if (!ok) return tn_err(TERN_ERR_UNSUPPORTED, "quantize: cannot convert '%s' from %s", t->name, tn_dtype_name(t->type));
    }
    *out = buf;
    return TERN_OK;
}

/* The importances of tensor t's rows from imat: an expert tensor's entry holds one row of ne0 per
 * expert (*mat_rows = the rows of one expert), any other's one row (*mat_rows = 0); NULL without an
 * entry of that size. */
static const float *tensor_imp(const tn_imatrix *imat, const tn_gguf_tensor *t, int64_t *mat_rows) {
    const bool experts = t->n_dims == 3 && t->ne[2] > 1;
    *mat_rows = experts ? t->ne[1] : 0;
    return imat ? tn_imatrix_find(imat, t->name, experts ? t->ne[0] * t->ne[2] : t->ne[0]) : NULL;
}

/* Row r's importances within tensor_imp's (NULL: none). */
static inline const float *row_imp(const float *imp, int64_t mat_rows, int64_t ne0, int64_t r) {
    return imp && mat_rows > 0 ? imp + r / mat_rows * ne0 : imp;
}

static void quant_task(void *arg, int ith, int nth) {
    qctx *q = arg;
    int64_t r0, r1;
    tn_split(q->task_rows, ith, nth, 1, &r0, &r1);
    if (q->task_gptq) {
        tn_vq_gptq_quantize_rows(q->task_gptq, q->task_x, q->task_y, r0, r1, q->task_rows);
        return;
    }
    const size_t rb = tn_dtype_row_size((tn_dtype)q->task_type, q->task_ne0);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = q->task_x + r * q->task_ne0;
        uint8_t *y = q->task_y + (size_t)r * rb;
        const float *imat = row_imp(q->task_imat, q->task_mat_rows, q->task_ne0, r);
        if (tn_vq_is(q->task_type)) {
            tn_vq_quantize_row(q->task_cb, x, y, q->task_ne0, r, q->task_rows, imat);
        } else if (tn_tq_is(q->task_type)) {
            tn_tq_params p;
            tn_tq_params_of(q->task_type, &p);
            tn_kern()->tq_quantize(&p, x, y, q->task_ne0, imat);
        } else {
            tn_quantize_row_imat((tn_dtype)q->task_type, x, y, q->task_ne0, imat);
        }
    }
}

/* A vq tensor: checks its shape and fits its codebook (one per tensor; rows then follow in
 * quant_task). The seed is the tensor name's hash, so a file quantizes to the same bytes. */
static tern_status vq_prepare(qctx *q, const tn_gguf_tensor *t, size_t nbytes) {
    if (q->task_rows != t->ne[1] || nbytes - TN_VQ_CB_BYTES > UINT32_MAX)
        return tn_err(TERN_ERR_UNSUPPORTED, "quantize: '%s' cannot be %s: %s", t->name, tn_dtype_name(q->task_type),
                      q->task_rows != t->ne[1] ? "only 2-D matrices take a codebook per tensor" : "over 4 GiB of rows");
    uint64_t seed = 1469598103934665603ull;
    for (const char *c = t->name; *c; c++) seed = (seed ^ (uint8_t)*c) * 1099511628211ull;
    return tn_vq_fit_codebook(q->task_x, q->task_rows, q->task_ne0, q->task_imat, seed, q->task_cb);
}

static tern_status fill(void *user, size_t idx, void *dst, size_t nbytes) {
    qctx *q = user;
    if (g_stop) return tn_err(TERN_ERR_ABORTED, "quantize: interrupted");
    const tn_gguf_tensor *t = &q->in->tensors[q->order[idx]];
    const tn_qmix_choice *c = &q->ch[idx];
    char shape[96];
    fmt_shape(t, shape, sizeof shape);
    fprintf(stderr, "[%4zu/%4zu] %-36s - [%s], type = %6s, ", idx + 1, q->n, t->name, shape, tn_dtype_name(t->type));
    int64_t nel = 1;
    for (uint32_t i = 0; i < t->n_dims; i++) nel *= t->ne[i];
    q->n_elem += (uint64_t)nel;
    q->total_in += t->nbytes;
    q->total_out += nbytes;
    if (c->type == t->type) {
        if (nbytes != t->nbytes) return tn_err(TERN_ERR_INTERNAL, "quantize: size of '%s' changed", t->name);
        memcpy(dst, t->data, nbytes);
        fprintf(stderr, "size = %8.3f MiB\n", t->nbytes / 1024.0 / 1024.0);
        return TERN_OK;
    }
    const tn_dtype_traits *src = tn_dtype_get(t->type);
    if (src && src->is_quantized && !q->allow_requantize)
        return tn_err(TERN_ERR_UNSUPPORTED, "quantize: requantizing from type %s is disabled (--allow-requantize)",
                      tn_dtype_name(t->type));
    const float *x;
    tern_status s = tensor_f32(t, q->f32, &x);
    if (s) return s;
    fprintf(stderr, "converting to %s .. ", tn_dtype_name(c->type));
    q->task_x = x;
    q->task_y = dst;
    q->task_ne0 = t->ne[0];
    q->task_rows = nel / t->ne[0];
    q->task_type = c->type;
    q->task_imat = tensor_imp(q->imat, t, &q->task_mat_rows); /* experts: one importance row per expert */
    if (!q->task_imat && (tn_qmix_requires_imatrix(t->name, c->type, q->ftype) || tn_iq_needs_weights((tn_dtype)c->type)))
        return tn_err(TERN_ERR_FORMAT, "quantize: '%s' as %s needs importance data, and %s", t->name, tn_dtype_name(c->type),
                      q->imat ? "the importance matrix has no entry of its size for it" : "no --imatrix was given");
    if (tn_dtype_is_iq_grid((tn_dtype)c->type) && !tn_iq_map_get((tn_dtype)c->type))
        return tn_err(TERN_ERR_NOMEM, "quantize: no memory for the %s grid's search tables", tn_dtype_name(c->type));
    int site = -1;
    const float *H = tn_vq_is(c->type) && q->hess && t->n_dims == 2 ? hess_find(q->hess, t->name, t->ne[0], &site) : NULL;
    if (H) { /* the codebook and the scales weigh columns by diag H, the rows get error feedback */
        if (q->gptq_H[site] != H) { /* a new input: factor its Hessian (once for q/k/v, gate/up) */
            tn_vq_gptq_free(q->gptq_of[site]);
            q->gptq_of[site] = NULL, q->gptq_H[site] = NULL;
            if ((s = tn_vq_gptq_create(H, t->ne[0], 0.01f, &q->gptq_of[site]))) return s;
            q->gptq_H[site] = H;
        }
        q->task_gptq = q->gptq_of[site];
        q->task_imat = tn_vq_gptq_diag(q->task_gptq);
        q->task_mat_rows = 0;
        fprintf(stderr, "with its Hessian .. ");
    }
    if (tn_vq_is(c->type) && (s = vq_prepare(q, t, nbytes))) {
        q->task_gptq = NULL;
        return s;
    }
    if (q->task_gptq) tn_vq_gptq_set_codebook(q->task_gptq, q->task_cb);
    tn_pool_run(q->pool, quant_task, q);
    if (q->task_gptq) q->n_gptq++;
    q->task_gptq = NULL;
    if (g_stop) return tn_err(TERN_ERR_ABORTED, "quantize: interrupted");
    if (tn_vq_is(c->type)) /* the codebook follows the rows (quant/vq.h) */
        memcpy((uint8_t *)dst + nbytes - TN_VQ_CB_BYTES, q->task_cb, TN_VQ_CB_BYTES);
    fprintf(stderr, "size = %8.2f MiB -> %8.2f MiB\n", t->nbytes / 1024.0 / 1024.0, nbytes / 1024.0 / 1024.0);
    return TERN_OK;
}

/* ---- sensitivity probes (--calib) ------------------------------------------------------------
 * The model of the input file runs over a few chunks of calibration text; the log-probabilities
 * of the second half of each chunk are kept. A probe swaps one weight's view for a quantized copy,
 * reruns the chunks and measures the mean KL divergence from the kept distributions. The first
 * run also keeps the residual stream entering every layer (when it fits PROBE_STREAM_MAX), so the
 * probe of a layer's weight starts at that layer (ctx.h start_layer: the same logits bit for bit,
 * tests/model test_start_layer) and the output's probe runs only the output: about half the
 * layers' work per probe. */
#define PROBE_STREAM_MAX ((size_t)2 << 30) /* bytes of kept residual streams, at most */

typedef struct {
    tern_model *m;
    tern_ctx *c;
    tern_token *toks; /* [n_chunk][n_ctx], BOS first */
    int n_chunk, n_ctx, first, n_vocab;
    float *base;      /* [n_chunk][n_ctx - first][n_vocab] log-probabilities */
    float *xs;        /* [n_chunk][n_layer][n_ctx][n_embd]: stream entering layer l + 1, or NULL */
    int cur_chunk;    /* the chunk the first run is in (stream capture) */
} probe_ctx;

static void probe_close(probe_ctx *p) {
    tern_ctx_free(p->c);
    tern_model_free(p->m);
    free(p->toks);
    free(p->base);
    free(p->xs);
    memset(p, 0, sizeof *p);
}

/* The kept residual stream of chunk ci entering layer l (1 .. n_layer). */
static float *probe_stream(const probe_ctx *p, int ci, int32_t l) {
    const size_t per_layer = (size_t)p->n_ctx * (size_t)p->m->hp.n_embd;
    return p->xs + ((size_t)ci * (size_t)p->m->hp.n_layer + (size_t)(l - 1)) * per_layer;
}

/* debug_layer hook of the first run: the stream after layer il (= entering il + 1) of the chunk. */
static void probe_keep_stream(void *user, int32_t il, const float *x, int32_t n, int32_t d) {
    probe_ctx *p = user;
    if (il >= p->m->hp.n_layer || n != p->n_ctx) return; /* il = n_layer: the final normed rows */
    memcpy(probe_stream(p, p->cur_chunk, il + 1), x, sizeof(float) * (size_t)n * d);
}

/* The first layer a probe of weight `name` must run: its block's, n_layer for the output matrix
 * (unless tied to the embedding), 0 for anything else. */
static int32_t probe_start_layer(const probe_ctx *p, const char *name) {
    if (!p->xs) return 0;
    int il = -1, len = 0;
    if (sscanf(name, "blk.%d.%n", &il, &len) == 1 && len > 0 && il >= 0 && il < p->m->hp.n_layer) return il;
    if (!strcmp(name, "output.weight")) return p->m->hp.n_layer;
    return 0;
}

static void log_softmax(const float *l, float *out, int n) {
    const float z = (float)tn_op_logsumexp(l, n, NULL);
    for (int i = 0; i < n; i++) out[i] = l[i] - z;
}

/* Runs the chunks: without base yet, keeps the log-probabilities (and the residual streams, if
 * p->xs); else returns the mean KL, running the layers from start on (0: all). */
static tern_status probe_run(probe_ctx *p, float *tmp, double *kl, int32_t start) {
    double sum = 0;
    const int ns = p->n_ctx - p->first;
    for (int ci = 0; ci < p->n_chunk; ci++) {
        tern_status s = tern_ctx_truncate(p->c, 0);
        p->cur_chunk = ci;
        p->c->debug_layer = !kl && p->xs ? probe_keep_stream : NULL;
        p->c->debug_user = p;
        p->c->start_layer = start;
        p->c->start_x = start > 0 ? probe_stream(p, ci, start) : NULL;
        if (!s) s = tern_decode(p->c, p->toks + (size_t)ci * p->n_ctx, p->n_ctx);
        p->c->debug_layer = NULL, p->c->start_layer = 0, p->c->start_x = NULL;
        if (s) return s;
        for (int i = 0; i < ns; i++) {
            float *b = p->base + ((size_t)ci * ns + i) * p->n_vocab;
            const float *l = tern_get_logits(p->c, p->first + i);
            if (!kl) {
                log_softmax(l, b, p->n_vocab);
                continue;
            }
            log_softmax(l, tmp, p->n_vocab);
            double k = 0;
            for (int j = 0; j < p->n_vocab; j++) k += exp(b[j]) * ((double)b[j] - tmp[j]);
            sum += k;
        }
    }
    if (kl) *kl = sum / ((double)p->n_chunk * ns);
    return TERN_OK;
}

/* No calibration text: the model writes its own, n_chunk sequences of n_ctx tokens sampled from
 * BOS (temperature 1, top-k 40, fixed seed), so the probes need no data (data-free, like a model
 * quantized without an importance matrix). */
static tern_status self_generate(tern_model *m, int n_ctx, int n_chunk, int threads, tern_token **out) {
    *out = NULL;
    tern_ctx *c = NULL;
    tern_sampler *sm = NULL;
    tern_token *toks = malloc(sizeof *toks * (size_t)n_ctx * (size_t)n_chunk + 1);
    if (!toks) return tn_err(TERN_ERR_NOMEM, "quantize: out of memory");
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = n_ctx;
    cp.n_threads = threads;
    tern_sampler_params sp;
    tern_sampler_params_init(&sp);
    sp.temp = 1.0f, sp.top_k = 40, sp.top_p = 1.0f, sp.min_p = 0.0f, sp.seed = 1234;
    tern_status s = tern_ctx_create(m, &cp, &c);
    if (!s) s = tern_sampler_create(m, &sp, &sm);
    const tern_token bos = tern_token_bos(m);
    for (int ci = 0; ci < n_chunk && !s; ci++) {
        tern_token *t = toks + (size_t)ci * n_ctx;
        t[0] = bos >= 0 ? bos : 0;
        s = tern_ctx_truncate(c, 0);
        for (int i = 1; i < n_ctx && !s; i++) {
            if ((s = tern_decode(c, &t[i - 1], 1))) break;
            t[i] = tern_sampler_sample(sm, tern_get_logits(c, 0));
        }
    }
    tern_sampler_free(sm);
    tern_ctx_free(c);
    if (s) {
        free(toks);
        return s;
    }
    *out = toks;
    return TERN_OK;
}

static tern_status probe_open(const char *model_path, const char *calib, int max_chunks, int threads, probe_ctx *p) {
    memset(p, 0, sizeof *p);
    tern_model_params mp;
    tern_model_params_init(&mp);
    char *text = NULL;
    size_t len = 0;
    int32_t n_tok = 0;
    tern_token *all = NULL;
    tern_status s = tern_model_load(model_path, &mp, &p->m);
    if (s) goto fail;
    p->n_ctx = p->m->hp.n_ctx_train > 0 && p->m->hp.n_ctx_train < 512 ? p->m->hp.n_ctx_train : 512;
    if (calib) {
        if (!s) s = tn_cli_read_file(calib, &text, &len);
        if (!s) s = tn_cli_tokenize(p->m, text, len, true, false, &all, &n_tok);
        free(text);
        if (s) goto fail;
        p->n_chunk = n_tok / p->n_ctx < max_chunks ? n_tok / p->n_ctx : max_chunks;
    } else {
        p->n_chunk = max_chunks;
        if ((s = self_generate(p->m, p->n_ctx, max_chunks, threads, &all))) goto fail;
        n_tok = p->n_chunk * p->n_ctx;
    }
    if (p->n_chunk < 1) {
        s = tn_err(TERN_ERR_INVALID_ARG, "--calib %s: %d tokens, fewer than one chunk of %d", calib, n_tok, p->n_ctx);
        goto fail;
    }
    p->first = p->n_ctx / 2;
    p->n_vocab = p->m->hp.n_vocab;
    p->toks = all;
    all = NULL;
    const tern_token bos = tern_token_bos(p->m);
    if (tern_vocab_add_bos(p->m) && bos >= 0)
        for (int ci = 0; ci < p->n_chunk; ci++) p->toks[(size_t)ci * p->n_ctx] = bos;
    p->base = malloc(sizeof(float) * (size_t)p->n_chunk * (size_t)(p->n_ctx - p->first) * (size_t)p->n_vocab);
    if (!p->base) {
        s = tn_err(TERN_ERR_NOMEM, "quantize: out of memory for the calibration logits");
        goto fail;
    }
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = cp.n_batch = p->n_ctx;
    cp.logits_all = true;
    cp.n_threads = threads;
    if ((s = tern_ctx_create(p->m, &cp, &p->c))) goto fail;
    const size_t xs_bytes = sizeof(float) * (size_t)p->n_chunk * (size_t)p->m->hp.n_layer * (size_t)p->n_ctx * (size_t)p->m->hp.n_embd;
    if (p->m->hp.n_layer > 0 && xs_bytes <= PROBE_STREAM_MAX) p->xs = malloc(xs_bytes); /* NULL: every probe runs all layers */
    if ((s = probe_run(p, NULL, NULL, 0))) goto fail;
    return TERN_OK;
fail:
    free(all);
    probe_close(p);
    return s;
}

/* Points every view of weight `name` at (type, data); returns how many views it changed. */
static int swap_views(tern_model *m, const char *name, uint32_t type, const void *data, size_t nbytes, tn_tensor *saved) {
    tn_tensor *v[2 + TN_ROLE_N_LAYER * 512];
    int nv = 0, k = 0;
    v[nv++] = &m->tok_embd;
    v[nv++] = &m->output;
    for (int32_t il = 0; il < m->hp.n_layer && il < 512; il++)
        for (int r = 0; r < TN_ROLE_N_LAYER; r++)
            if (tn_roles[r].matrix) v[nv++] = &m->layers[il].w[r];
    for (int i = 0; i < nv; i++)
        if (v[i]->name && !strcmp(v[i]->name, name)) {
            if (saved && k == 0) *saved = *v[i];
            v[i]->type = (tn_dtype)type, v[i]->data = data, v[i]->nbytes = nbytes;
            k++;
        }
    return k;
}

/* ---- --target-bpw ------------------------------------------------------------------------ */

typedef struct {
    const float *x, *imp;
    const double *mat_w; /* experts: [n_mat] the weight of each expert's rows (NULL: 1) */
    int64_t rows, ne0;
    int64_t mat_rows; /* > 0: rows come in matrices of this many (experts), imp has one row of ne0 per matrix */
    tn_tq_params p;
    size_t rb;
    uint8_t *qbuf; /* [nth][rb]  */
    float *ybuf;   /* [nth][ne0] */
    double *part;  /* [nth]      */
    double *sig;   /* [nth]      */
} err_ctx;

/* Importance-weighted squared error of quantizing rows [r0, r1) as p: sum_j imp_j (x_j - x^_j)^2,
 * for an expert tensor with expert e's importances and times expert e's weight mat_w[e]. */
static void err_task(void *arg, int ith, int nth) {
    err_ctx *e = arg;
    int64_t r0, r1;
    tn_split(e->rows, ith, nth, 1, &r0, &r1);
    uint8_t *qb = e->qbuf + (size_t)ith * e->rb;
    float *yb = e->ybuf + (size_t)ith * (size_t)e->ne0;
    double acc = 0, sig = 0;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = e->x + r * e->ne0;
        const int64_t mat = e->mat_rows > 0 ? r / e->mat_rows : 0;
        const float *imp = row_imp(e->imp, e->mat_rows, e->ne0, r);
        tn_kern()->tq_quantize(&e->p, xr, qb, e->ne0, imp);
        tn_tq_dequantize_row(&e->p, qb, yb, e->ne0);
        double ra = 0, rs = 0;
        for (int64_t j = 0; j < e->ne0; j++) {
            const double d = (double)xr[j] - yb[j], w = imp ? imp[j] : 1.0;
            ra += w * d * d;
            rs += w * (double)xr[j] * xr[j];
        }
        const double mw = e->mat_w ? e->mat_w[mat] : 1.0;
        acc += mw * ra;
        sig += mw * rs;
    }
    e->part[ith] = acc;
    e->sig[ith] = sig;
}

/* --target-types: a candidate of another type than the family. The whole tensor is quantized as
 * the file would hold it (vq2: its codebook fitted first), then each row decoded by the type's
 * to_float and weighed as in err_task. */
typedef struct {
    const err_ctx *e; /* x, imp, mat_w, rows, ne0, mat_rows */
    const uint8_t *q;
    size_t rb;
    tn_dtype type;
    float *ybuf;  /* [nth][ne0] */
    double *part; /* [nth]      */
} err_any_ctx;

static void err_any_task(void *arg, int ith, int nth) {
    err_any_ctx *a = arg;
    const err_ctx *e = a->e;
    int64_t r0, r1;
    tn_split(e->rows, ith, nth, 1, &r0, &r1);
    float *yb = a->ybuf + (size_t)ith * (size_t)e->ne0;
    double acc = 0;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = e->x + r * e->ne0;
        const float *imp = row_imp(e->imp, e->mat_rows, e->ne0, r);
        tn_kern()->slot[a->type].to_float(a->q + (size_t)r * a->rb, yb, e->ne0);
        double ra = 0;
        for (int64_t j = 0; j < e->ne0; j++) {
            const double d = (double)xr[j] - yb[j], w = imp ? imp[j] : 1.0;
            ra += w * d * d;
        }
        acc += (e->mat_w ? e->mat_w[e->mat_rows > 0 ? r / e->mat_rows : 0] : 1.0) * ra;
    }
    a->part[ith] = acc;
}

/* Whether extra type ty can hold tensor t: its block divides ne0; vq2 only for 2-D matrices. */
static bool target_extra_fits(const tn_gguf_tensor *t, tn_dtype ty) {
    if (tn_vq_is(ty)) return t->n_dims == 2 && t->ne[0] % TN_VQ_QK == 0;
    return t->ne[0] % tn_dtype_get(ty)->blck_size == 0;
}

/* Error of tensor t (x: its floats, e: rows/importance as for the family's widths) as type ty;
 * *bits its size in bits. q: a buffer of at least tn_dtype_tensor_size(ty, ne0, rows) bytes. */
static tern_status target_extra_err(const tn_gguf_tensor *t, const err_ctx *e, tn_dtype ty, tn_pool *pool, int nth,
                                    uint8_t *q, float *ybuf, double *part, double *bits, double *err) {
    qctx qq;
    memset(&qq, 0, sizeof qq);
    qq.task_x = e->x, qq.task_y = q, qq.task_rows = e->rows, qq.task_ne0 = e->ne0, qq.task_type = ty;
    qq.task_imat = e->imp, qq.task_mat_rows = e->mat_rows;
    const size_t nbytes = tn_dtype_tensor_size(ty, e->ne0, e->rows);
    if (tn_vq_is(ty)) {
        tern_status s = vq_prepare(&qq, t, nbytes);
        if (s) return s;
        memcpy(q + nbytes - TN_VQ_CB_BYTES, qq.task_cb, TN_VQ_CB_BYTES);
    }
    tn_pool_run(pool, quant_task, &qq);
    err_any_ctx a = {e, q, tn_dtype_row_size(ty, e->ne0), ty, ybuf, part};
    memset(part, 0, sizeof *part * (size_t)nth);
    tn_pool_run(pool, err_any_task, &a);
    double tot = 0;
    for (int k = 0; k < nth; k++) tot += part[k];
    *bits = 8.0 * (double)nbytes;
    *err = tot;
    return TERN_OK;
}

/* Whether --target-bpw chooses tensor i's width (quantizable, not overridden, ne0 a multiple of the
 * family's group); else its bits are fixed by the mix. */
static bool target_allocatable(const tn_gguf_tensor *t, const tn_qmix_choice *c, const tn_qmix_opts *opts,
                               const tn_tq_params *fam) {
    const bool forced = (opts->output_type >= 0 && !strcmp(t->name, "output.weight")) ||
                        (opts->token_embd_type >= 0 && !strcmp(t->name, "token_embd.weight"));
    return c->quantizable && !c->manual && !forced && t->ne[0] % fam->group == 0;
}

/* The sizes a --target-bpw plan can reach, in bits per weight: every allocatable tensor at
 * 1 bit of the family (lo) and at 8 (hi), the others as the mix has them. Known before any
 * tensor is measured, so an unreachable target is refused at once. */
static void target_range(const tn_gguf *g, const size_t *order, const tn_qmix_choice *ch, size_t n,
                         const tn_qmix_opts *opts, const tn_tq_params *fam, double *lo, double *hi) {
    double total_el = 0, fixed = 0, b1 = 0, b8 = 0;
    for (size_t i = 0; i < n; i++) {
        const tn_gguf_tensor *t = &g->tensors[order[i]];
        double el = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) el *= (double)t->ne[d];
        total_el += el;
        const double rows = el / (double)t->ne[0];
        if (!target_allocatable(t, &ch[i], opts, fam)) {
            fixed += 8.0 * (double)tn_dtype_row_size((tn_dtype)ch[i].type, t->ne[0]) * rows;
            continue;
        }
        tn_tq_params p = *fam;
        p.bits = 1;
        b1 += 8.0 * (double)tn_dtype_row_size((tn_dtype)tn_tq_dtype(&p), t->ne[0]) * rows;
        p.bits = 8;
        b8 += 8.0 * (double)tn_dtype_row_size((tn_dtype)tn_tq_dtype(&p), t->ne[0]) * rows;
    }
    *lo = total_el > 0 ? (fixed + b1) / total_el : 0;
    *hi = total_el > 0 ? (fixed + b8) / total_el : 0;
}

/* Chooses the bit width of every allocatable tensor (quantizable, not overridden, ne0 a multiple
 * of the family's group) so that the whole file has at most `target` bits per weight with the
 * least total error (all8: the target holds every one at 8 bits, target_range — nothing weighed). The error of a tensor is its importance-weighted squared quantization error
 * (weight 1 per column without an importance matrix), as an estimate of the squared error it adds
 * to its output per token; token_embd's is divided by its rows (one row is read per token). An
 * expert tensor's rows are weighed with their own expert's importances, and each expert's error
 * by the share of tokens routed to it (expert_used_count x its rows / all the experts' rows, from
 * the importance matrix's per-expert counts; expert_used_count / expert_count each without them):
 * a token reads only its experts, so that is the error it adds per token (k_used: the model's
 * expert_used_count). */
#define TARGET_XT_MAX 8 /* --target-types: extra candidate types at most */
#define TARGET_NC (8 + TARGET_XT_MAX)

static tern_status plan_target(const tn_gguf *g, const size_t *order, const tn_qmix_tensor *mt, tn_qmix_choice *ch,
                               size_t n, const tn_qmix_opts *opts, const tn_tq_params *fam, const tn_dtype *xt, int nxt,
                               const tn_imatrix *imat, double target, tn_pool *pool, int nth, float *f32, probe_ctx *pr,
                               bool all8, int64_t k_used, double *achieved) {
    tern_status s = TERN_OK;
    double *bits = calloc(n * TARGET_NC + 1, sizeof *bits), *err = calloc(n * TARGET_NC + 1, sizeof *err);
    uint32_t *ctype = calloc(n * TARGET_NC + 1, sizeof *ctype); /* each candidate's type */
    const double **bp = calloc(n + 1, sizeof *bp), **ep = calloc(n + 1, sizeof *ep);
    int *ncand = calloc(n + 1, sizeof *ncand), *choice = calloc(n + 1, sizeof *choice);
    size_t *which = calloc(n + 1, sizeof *which);
    uint8_t *xq = NULL; /* an extra type's whole tensor */
    uint8_t *qbuf = NULL;
    float *lp = pr ? malloc(sizeof(float) * (size_t)pr->n_vocab) : NULL;
    const int b0 = target < 3 ? 2 : target >= 7 ? 6 : (int)target - 1; /* probe width */
    err_ctx e = {0};
    double *mat_w = NULL;
    e.part = calloc((size_t)nth + 1, sizeof *e.part);
    e.sig = calloc((size_t)nth + 1, sizeof *e.sig);
    if (!bits || !err || !ctype || !bp || !ep || !ncand || !choice || !which || !e.part || !e.sig) {
        s = tn_err(TERN_ERR_NOMEM, "quantize: out of memory");
        goto out;
    }
    double total_el = 0, fixed_bits = 0;
    size_t na = 0;
    for (size_t i = 0; i < n; i++) {
        const tn_gguf_tensor *t = &g->tensors[order[i]];
        double el = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) el *= (double)t->ne[d];
        total_el += el;
        const int64_t rows = (int64_t)(el / (double)t->ne[0]);
        if (!target_allocatable(t, &ch[i], opts, fam)) {
            fixed_bits += 8.0 * (double)tn_dtype_row_size((tn_dtype)ch[i].type, t->ne[0]) * (double)rows;
            continue;
        }
        which[na] = i;
        double *B = bits + na * TARGET_NC, *E = err + na * TARGET_NC;
        uint32_t *C = ctype + na * TARGET_NC;
        bp[na] = B;
        ep[na] = E;
        ncand[na] = 8;
        for (int b = 1; b <= 8; b++) {
            tn_tq_params p = *fam;
            p.bits = b;
            C[b - 1] = tn_tq_dtype(&p);
        }
        if (all8) { /* the budget holds every tensor at 8 bits: nothing to weigh */
            tn_tq_params p = *fam;
            p.bits = 8;
            B[7] = 8.0 * (double)tn_dtype_row_size((tn_dtype)tn_tq_dtype(&p), t->ne[0]) * (double)rows;
            na++;
            continue;
        }
        const float *x;
        if ((s = tensor_f32(t, f32, &x))) goto out;
        e.x = x;
        e.rows = rows;
        e.ne0 = t->ne[0];
        e.imp = tensor_imp(imat, t, &e.mat_rows);
        e.mat_w = NULL;
        if (e.mat_rows > 0) { /* experts */
            const int64_t n_exp = t->ne[2];
            int64_t nm = 0;
            const float *cnt = e.imp ? tn_imatrix_counts(imat, t->name, &nm) : NULL;
            double tot = 0;
            for (int64_t x = 0; cnt && nm == n_exp && x < n_exp; x++) tot += cnt[x];
            free(mat_w);
            if (!(mat_w = malloc(sizeof *mat_w * (size_t)n_exp))) {
                s = tn_err(TERN_ERR_NOMEM, "quantize: out of memory");
                goto out;
            }
            const double k = k_used > 0 ? (double)k_used : 1.0;
            for (int64_t x = 0; x < n_exp; x++) mat_w[x] = tot > 0 ? k * cnt[x] / tot : k / (double)n_exp;
            e.mat_w = mat_w;
        }
        for (int b = 1; b <= 8; b++) {
            tn_tq_params p = *fam;
            p.bits = b;
            e.p = p;
            e.rb = tn_dtype_row_size((tn_dtype)tn_tq_dtype(&p), t->ne[0]);
            free(e.qbuf), free(e.ybuf);
            e.qbuf = malloc(e.rb * (size_t)nth);
            e.ybuf = malloc(sizeof(float) * (size_t)e.ne0 * (size_t)nth);
            if (!e.qbuf || !e.ybuf) {
                s = tn_err(TERN_ERR_NOMEM, "quantize: out of memory");
                goto out;
            }
            memset(e.part, 0, sizeof *e.part * (size_t)nth);
            tn_pool_run(pool, err_task, &e);
            double tot = 0, sig = 0;
            for (int k = 0; k < nth; k++) tot += e.part[k], sig += e.sig[k];
            (void)sig;
            if (!pr && !strcmp(t->name, "token_embd.weight")) tot /= (double)rows;
            B[b - 1] = 8.0 * (double)e.rb * (double)rows;
            E[b - 1] = tot;
        }
        for (int x = 0; x < nxt; x++) { /* --target-types */
            if (!target_extra_fits(t, xt[x])) continue;
            free(xq);
            if (!(xq = malloc(tn_dtype_tensor_size(xt[x], t->ne[0], rows) + 64))) {
                s = tn_err(TERN_ERR_NOMEM, "quantize: out of memory");
                goto out;
            }
            const int c = ncand[na]++;
            if ((s = target_extra_err(t, &e, xt[x], pool, nth, xq, e.ybuf, e.part, &B[c], &E[c]))) goto out;
            if (!pr && !strcmp(t->name, "token_embd.weight")) E[c] /= (double)rows;
            C[c] = xt[x];
        }
        if (pr) {
            /* measured sensitivity: the KL of the calibration logits with only this tensor at
             * b0 - 1 and at b0 bits, per unit of its error there; the predicted KL at b bits is
             * sens(b0) * err(b) for b >= b0 and sens(b0 - 1) * err(b) below (the response grows
             * faster than the error at the lowest widths, so the low side gets its own probe) */
            double sens[2] = {1, 1};
            for (int k = 0; k < 2; k++) {
                const int pb = b0 - 1 + k;
                if (pb < 1) continue;
                tn_tq_params p = *fam;
                p.bits = pb;
                const uint32_t ty = tn_tq_dtype(&p);
                const size_t rb = tn_dtype_row_size((tn_dtype)ty, t->ne[0]);
                free(qbuf);
                if (!(qbuf = malloc(rb * (size_t)rows + 64)) || !lp) {
                    s = tn_err(TERN_ERR_NOMEM, "quantize: out of memory");
                    goto out;
                }
                qctx qq = {0};
                qq.task_x = x, qq.task_y = qbuf, qq.task_rows = rows, qq.task_ne0 = t->ne[0], qq.task_type = ty, qq.task_imat = e.imp;
                qq.task_mat_rows = e.mat_rows;
                tn_pool_run(pool, quant_task, &qq);
                tn_tensor saved;
                double kl = 0;
                if (swap_views(pr->m, t->name, ty, qbuf, rb * (size_t)rows, &saved) > 0) {
                    s = probe_run(pr, lp, &kl, probe_start_layer(pr, t->name));
                    swap_views(pr->m, t->name, saved.type, saved.data, saved.nbytes, NULL);
                    if (s) goto out;
                    sens[k] = E[pb - 1] > 0 ? kl / E[pb - 1] : 0;
                }
            }
            if (b0 - 1 < 1) sens[0] = sens[1];
            for (int b = 1; b <= 8; b++) E[b - 1] *= b >= b0 ? sens[1] : sens[0];
            /* an extra type: the sensitivity of the family's width it is at least as large as */
            for (int c = 8; c < ncand[na]; c++) E[c] *= B[c] >= B[b0 - 1] ? sens[1] : sens[0];
        }
        fprintf(stderr, "target-bpw: %-32s predicted KL at 1..8 bits %.2e %.2e %.2e %.2e %.2e %.2e %.2e %.2e\n", t->name,
                E[0], E[1], E[2], E[3], E[4], E[5], E[6], E[7]);
        for (int c = 8; c < ncand[na]; c++)
            fprintf(stderr, "target-bpw: %-32s predicted KL as %s (%.3f bpw) %.4e\n", t->name, tn_dtype_name((tn_dtype)C[c]),
                    B[c] / (double)(rows * t->ne[0]), E[c]);
        /* candidates by size, smallest first (the allocation upgrades from the first) */
        for (int c = 1; c < ncand[na]; c++)
            for (int d = c; d > 0 && B[d] < B[d - 1]; d--) {
                const double tb = B[d], te = E[d];
                const uint32_t tc = C[d];
                B[d] = B[d - 1], E[d] = E[d - 1], C[d] = C[d - 1];
                B[d - 1] = tb, E[d - 1] = te, C[d - 1] = tc;
            }
        na++;
    }
    const double budget = target * total_el - fixed_bits;
    if (all8) {
        for (size_t k = 0; k < na; k++) choice[k] = 7;
    } else if (!tn_qmix_allocate(na, ncand, bp, ep, budget, choice)) {
        double min_bits = fixed_bits;
        for (size_t k = 0; k < na; k++) min_bits += bp[k][0];
        s = tn_err(TERN_ERR_INVALID_ARG, "--target-bpw %.4g is below the smallest file possible with tq1g%d%s (%.4g bpw)",
                   target, fam->group, fam->asym ? "a" : "", min_bits / total_el);
        goto out;
    }
    double used = fixed_bits;
    for (size_t k = 0; k < na; k++) {
        const uint32_t ty = ctype[k * TARGET_NC + choice[k]];
        ch[which[k]].type = ch[which[k]].wanted = ty;
        ch[which[k]].fallback = false;
        used += bp[k][choice[k]];
        char nm[32];
        tn_tq_params p;
        if (tn_tq_is(ty)) tn_tq_params_of(ty, &p), tn_tq_name(&p, nm, sizeof nm);
        else snprintf(nm, sizeof nm, "%s", tn_dtype_name((tn_dtype)ty));
        fprintf(stderr, "target-bpw: %-36s -> %s\n", mt[which[k]].name, nm);
    }
    *achieved = used / total_el;
out:
    free(bits), free(err), free(ctype), free(bp), free(ep), free(ncand), free(choice), free(which), free(xq);
    free(e.part), free(e.sig), free(e.qbuf), free(e.ybuf), free(qbuf), free(lp), free(mat_w);
    return s;
}

/* ---- Hessians for the codebook types (--calib with vq2) -------------------------------------
 * The model of the input file runs over the calibration text in chunks (as tern imatrix does) and
 * an activation observer sums X^T X of the input rows of each (layer, site): wq/wk/wv share one,
 * w_gate/w_up another, wo and w_down have their own. The vq quantizer then feeds each matrix's
 * rounding errors forward through its site's Hessian (quant/vq.h). f32 sums, upper triangles
 * (cblas_ssyrk); on a 1B-class llama they take about 4 GB (22 layers x 3 x 2048^2 + 5632^2). */
typedef struct hess_set {
    int32_t n_layer;
    float **H;        /* [n_layer][HESS_SITES], NULL until that site is seen */
    int64_t *dim;     /* [n_layer][HESS_SITES] columns                         */
    char **names;     /* [n_layer][TN_ROLE_N_LAYER] weight names (views share)  */
    int8_t *site_of;  /* [n_layer][TN_ROLE_N_LAYER] site of that weight, or -1   */
    tern_status err;
} hess_set;

static void hess_free(hess_set *h) {
    for (int64_t i = 0; h->H && i < (int64_t)h->n_layer * HESS_SITES; i++) free(h->H[i]);
    for (int64_t i = 0; h->names && i < (int64_t)h->n_layer * TN_ROLE_N_LAYER; i++) free(h->names[i]);
    free(h->H);
    free(h->dim);
    free(h->names);
    free(h->site_of);
    memset(h, 0, sizeof *h);
}

static void hess_observe(void *user, int32_t il, tn_obs_site site, const float *x, int32_t n, int32_t ne0) {
    hess_set *h = user;
    if (h->err || il < 0 || il >= h->n_layer || (int)site < 0 || (int)site >= HESS_SITES || n <= 0) return;
    const int64_t i = (int64_t)il * HESS_SITES + site;
    if (!h->H[i]) {
        if (!(h->H[i] = calloc((size_t)ne0 * (size_t)ne0, sizeof(float)))) {
            h->err = tn_err(TERN_ERR_NOMEM, "quantize: out of memory for a %d x %d Hessian (layer %d)", ne0, ne0, il);
            return;
        }
        h->dim[i] = ne0;
    }
    if (h->dim[i] != ne0) return;
    for (int64_t k = 0; k < (int64_t)n * ne0; k++)
        if (!isfinite(x[k])) {
            h->err = tn_err(TERN_ERR_FORMAT, "quantize: layer %d's activations are not finite on the calibration text", il);
            return;
        }
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, ne0, n, 1.0f, x, ne0, 1.0f, h->H[i], ne0);
}

/* The Hessian of weight `name` (ne0 columns) and its site, or NULL. */
static const float *hess_find(const struct hess_set *h, const char *name, int64_t ne0, int *site) {
    for (int64_t i = 0; h->names && i < (int64_t)h->n_layer * TN_ROLE_N_LAYER; i++) {
        if (!h->names[i] || h->site_of[i] < 0 || strcmp(h->names[i], name)) continue;
        const int64_t k = i / TN_ROLE_N_LAYER * HESS_SITES + h->site_of[i];
        *site = h->site_of[i];
        return h->H[k] && h->dim[k] == ne0 ? h->H[k] : NULL;
    }
    return NULL;
}

static tern_status hess_collect(const char *model_path, const char *calib, int64_t max_chunks, int threads, hess_set *h) {
    memset(h, 0, sizeof *h);
    tern_model_params mp;
    tern_model_params_init(&mp);
    tern_model *m = NULL;
    tern_ctx *c = NULL;
    char *text = NULL;
    size_t len = 0;
    int32_t n_tok = 0;
    tern_token *toks = NULL;
    tern_status s = tern_model_load(model_path, &mp, &m);
    if (s) return s;
    const tn_hparams *hp = &m->hp;
    const int n_ctx = hp->n_ctx_train > 0 && hp->n_ctx_train < 512 ? hp->n_ctx_train : 512;
    if (!(s = tn_cli_read_file(calib, &text, &len))) s = tn_cli_tokenize(m, text, len, true, false, &toks, &n_tok);
    free(text);
    int64_t n_chunk = n_tok / n_ctx;
    if (!s && n_chunk > max_chunks) n_chunk = max_chunks;
    if (!s && n_chunk < 1)
        s = tn_err(TERN_ERR_INVALID_ARG, "--calib %s: %d tokens, fewer than one chunk of %d", calib, n_tok, n_ctx);
    h->n_layer = hp->n_layer;
    if (!s) {
        const size_t nl = (size_t)hp->n_layer;
        h->H = calloc(nl * HESS_SITES + 1, sizeof *h->H);
        h->dim = calloc(nl * HESS_SITES + 1, sizeof *h->dim);
        h->names = calloc(nl * TN_ROLE_N_LAYER + 1, sizeof *h->names);
        h->site_of = malloc(nl * TN_ROLE_N_LAYER + 1);
        if (!h->H || !h->dim || !h->names || !h->site_of) s = tn_err(TERN_ERR_NOMEM, "quantize: out of memory");
    }
    static const struct { int role, site; } sites[] = {
        {TN_ROLE_ATTN_Q, TN_OBS_ATTN_IN},   {TN_ROLE_ATTN_K, TN_OBS_ATTN_IN},  {TN_ROLE_ATTN_V, TN_OBS_ATTN_IN},
        {TN_ROLE_ATTN_QKV, TN_OBS_ATTN_IN}, {TN_ROLE_ATTN_OUT, TN_OBS_ATTN_OUT}, {TN_ROLE_FFN_GATE, TN_OBS_FFN_IN},
        {TN_ROLE_FFN_UP, TN_OBS_FFN_IN},    {TN_ROLE_FFN_DOWN, TN_OBS_FFN_DOWN}};
    for (int32_t il = 0; !s && il < hp->n_layer; il++) {
        memset(h->site_of + (size_t)il * TN_ROLE_N_LAYER, -1, TN_ROLE_N_LAYER);
        for (size_t k = 0; k < sizeof sites / sizeof sites[0] && !s; k++) {
            const tn_tensor *w = &m->layers[il].w[sites[k].role];
            if (!w->data || !w->name) continue;
            const size_t i = (size_t)il * TN_ROLE_N_LAYER + (size_t)sites[k].role;
            if (!(h->names[i] = strdup(w->name))) s = tn_err(TERN_ERR_NOMEM, "quantize: out of memory");
            h->site_of[i] = (int8_t)sites[k].site;
        }
    }
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = cp.n_batch = n_ctx;
    cp.n_threads = threads;
    if (!s) s = tern_ctx_create(m, &cp, &c);
    if (!s) {
        c->observe = hess_observe;
        c->observe_user = h;
        fprintf(stderr, "quantize: collecting Hessians on %s (%lld chunks of %d tokens)\n", calib, (long long)n_chunk, n_ctx);
    }
    const tern_token bos = tern_token_bos(m);
    const double t0 = tn_cli_now();
    for (int64_t ci = 0; !s && ci < n_chunk && !g_stop; ci++) {
        tern_token *chunk = toks + ci * n_ctx;
        if (tern_vocab_add_bos(m) && bos >= 0) chunk[0] = bos;
        if (!(s = tern_ctx_truncate(c, 0))) s = tern_decode(c, chunk, n_ctx);
        if (!s && h->err) s = h->err;
        const double el = tn_cli_now() - t0;
        fprintf(stderr, "\rquantize: Hessians [%lld/%lld] %.1f s, ETA %.1f s ", (long long)ci + 1, (long long)n_chunk, el,
                el / (double)(ci + 1) * (double)(n_chunk - ci - 1));
    }
    fprintf(stderr, "\n");
    if (!s && g_stop) s = tn_err(TERN_ERR_ABORTED, "quantize: interrupted");
    free(toks);
    tern_ctx_free(c);
    tern_model_free(m);
    if (s) hess_free(h);
    return s;
}

static void usage(void) {
    printf("usage: tern quantize [options] in.gguf out.gguf TYPE [threads]\n"
           "  TYPE: Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q2_K_S Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K\n"
           "        IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_XS IQ3_S IQ3_M (IQ1_*, IQ2_*, IQ3_XXS need\n"
           "        --imatrix, as in llama-quantize)\n"
           "        IQ4_NL IQ4_XS TQ1_0 TQ2_0 MXFP4_MOE (= MXFP4; a dense model's mix is all Q8_0, --pure gives\n"
           "        MXFP4 everywhere) F16 BF16 F32 (llama.cpp mixes, byte-identical to llama-quantize), or\n"
           "        tq<b>[g<G>][a|s]: tern any-bit, b in 1..8, G in 32/64/128/256 (tq3 = tq3g64a; not ggml's\n"
           "        ternary TQ1_0 / TQ2_0), or vq2: tern codebook, 4-vectors in a 256-entry codebook fitted per\n"
           "        matrix (2.19 bpw + 1 KiB per matrix; --imatrix weights the fit)\n"
           "  -t, --threads N               threads (default: all cores)\n"
           "  --pure                        every quantizable tensor gets TYPE (no mix)\n"
           "  --leave-output-tensor         keep output.weight as it is\n"
           "  --output-tensor-type T        type of output.weight\n"
           "  --token-embedding-type T      type of token_embd.weight\n"
           "  --tensor-type REGEX=T         type for tensors matching REGEX (POSIX ERE; repeatable)\n"
           "  --imatrix FILE                importance matrix (tern imatrix or llama-imatrix) for importance-weighted\n"
           "                                rounding (llama.cpp types: byte-identical to llama-quantize --imatrix)\n"
           "  --target-bpw X                per-tensor bit widths of TYPE's family (tq<b>g<G>[a]) chosen so the whole\n"
           "                                file has at most X bits per weight, at the least predicted loss\n"
           "  --target-types LIST           more candidates for --target-bpw besides TYPE's widths, comma-separated:\n"
           "                                vq2 (2-D matrices, ne0 %% 256 == 0), llama.cpp types (e.g. q4_K,q6_K,q8_0)\n"
           "  --calib FILE                  text whose KL divergence weighs each tensor's error (--target-bpw;\n"
           "                                default: text the model generates itself); with vq2, the text the\n"
           "                                layers' Hessians are collected on (each matrix's rounding errors are\n"
           "                                fed forward through its input's X^T X, as GPTQ/VPTQ do)\n"
           "  --calib-chunks N              chunks of calibration text per probe (default 16; 0 = no probes,\n"
           "                                plain importance-weighted errors); with vq2, for the Hessians\n"
           "                                (default: all, at most 256)\n"
           "  --allow-requantize            allow quantized inputs\n");
}

static void read_model(const tn_gguf *g, tn_qmix_model *m) {
    memset(m, 0, sizeof *m);
    tn_gguf_str arch = {0, NULL};
    tn_gguf_get_str(g, "general.architecture", false, &arch);
    char a[64] = "llama", key[128];
    if (arch.data && arch.len < sizeof a) memcpy(a, arch.data, arch.len), a[arch.len] = 0;
    m->falcon = !strcmp(a, "falcon");
    int64_t v = 0;
    snprintf(key, sizeof key, "%s.block_count", a);
    if (tn_gguf_get_i64(g, key, false, &v) == TERN_OK) m->n_layer = (int)v;
    v = 0;
    snprintf(key, sizeof key, "%s.attention.head_count", a);
    if (tn_gguf_get_i64(g, key, false, &v) == TERN_OK) m->n_head = (int)v;
    m->n_head_kv = m->n_head;
    snprintf(key, sizeof key, "%s.attention.head_count_kv", a);
    if (tn_gguf_get_i64(g, key, false, &v) == TERN_OK) m->n_head_kv = (int)v;
    v = 0;
    snprintf(key, sizeof key, "%s.expert_count", a);
    if (tn_gguf_get_i64(g, key, false, &v) == TERN_OK) m->n_expert = (int)v;
    v = 0;
    snprintf(key, sizeof key, "%s.expert_used_count", a);
    if (tn_gguf_get_i64(g, key, false, &v) == TERN_OK && v > 0) m->n_expert_used = (int)v;
    m->is_70b = !strcmp(a, "llama") && m->n_layer == 80 && m->n_head != m->n_head_kv;
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[4] = {0};
    int npos = 0, rc = TN_EXIT_OK;
    int64_t threads = 0;
    tn_qmix_opts opts = {.output_type = -1, .token_embd_type = -1};
    const char *imatrix_path = NULL;
    bool allow_requantize = false;
    float target_bpw = 0;
    const char *target_types = NULL; /* --target-types LIST */
    tn_dtype xt[TARGET_XT_MAX];
    int nxt = 0;
    const char *calib_path = NULL;
    int64_t calib_chunks = 16;
    bool calib_chunks_set = false;
    ov_set ovs = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const bool more = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            goto done;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && more) {
            if (!tn_cli_parse_i64(argv[++i], 1, 1024, &threads)) { rc = tn_cli_usage_error("bad thread count '%s'", argv[i]); goto done; }
        } else if (!strcmp(a, "--pure")) {
            opts.pure = true;
        } else if (!strcmp(a, "--leave-output-tensor")) {
            opts.leave_output = true;
        } else if (!strcmp(a, "--allow-requantize")) {
            allow_requantize = true;
        } else if ((!strcmp(a, "--output-tensor-type") || !strcmp(a, "--token-embedding-type")) && more) {
            int t;
            if (!parse_dtype(argv[i + 1], &t)) { rc = tn_cli_usage_error("unknown tensor type '%s'", argv[i + 1]); goto done; }
            if (!strcmp(a, "--output-tensor-type")) opts.output_type = t;
            else opts.token_embd_type = t;
            i++;
        } else if (!strcmp(a, "--tensor-type") && more) {
            char *spec = argv[++i], *eq = strrchr(spec, '=');
            int t;
            if (!eq || eq == spec || !parse_dtype(eq + 1, &t)) { rc = tn_cli_usage_error("bad --tensor-type '%s' (want REGEX=TYPE)", spec); goto done; }
            tt_override *nv = realloc(ovs.ov, sizeof *nv * (size_t)(ovs.n_ov + 1));
            if (!nv) { rc = TN_EXIT_OSERR; goto done; }
            ovs.ov = nv;
            char *pat = strndup(spec, (size_t)(eq - spec));
            int e = pat ? regcomp(&ovs.ov[ovs.n_ov].re, pat, REG_EXTENDED | REG_NOSUB) : -1;
            free(pat);
            if (e) { rc = tn_cli_usage_error("bad regular expression in '%s'", spec); goto done; }
            ovs.ov[ovs.n_ov++].type = t;
        } else if (!strcmp(a, "--imatrix") && more) {
            imatrix_path = argv[++i];
        } else if (!strcmp(a, "--calib") && more) {
            calib_path = argv[++i];
        } else if (!strcmp(a, "--calib-chunks") && more) {
            if (!tn_cli_parse_i64(argv[++i], 0, 100000, &calib_chunks)) { rc = tn_cli_usage_error("bad --calib-chunks '%s'", argv[i]); goto done; }
            calib_chunks_set = true;
        } else if (!strcmp(a, "--target-types") && more) {
            target_types = argv[++i];
        } else if (!strcmp(a, "--target-bpw") && more) {
            if (!tn_cli_parse_f32(argv[++i], 0.5f, 64.0f, &target_bpw)) {
                rc = tn_cli_usage_error("bad --target-bpw '%s' (bits per weight, 0.5 to 64)", argv[i]);
                goto done;
            }
        } else if (a[0] == '-' && a[1]) {
            static const char *const valued[] = {"-t", "--threads", "--output-tensor-type", "--token-embedding-type",
                                                 "--tensor-type", "--imatrix", "--target-bpw", "--target-types", "--calib",
                                                 "--calib-chunks"};
            bool known = false;
            for (size_t v = 0; v < sizeof valued / sizeof valued[0]; v++) known |= !strcmp(a, valued[v]);
            rc = known ? tn_cli_usage_error("%s needs a value", a)
                       : tn_cli_usage_error("unknown option '%s' (see tern quantize --help)", a);
            goto done;
        } else if (npos < 4) {
            pos[npos++] = a;
        } else {
            rc = tn_cli_usage_error("unexpected argument '%s'", a);
            goto done;
        }
    }
    if (npos < 3) {
        static const char *const what[] = {"in.gguf, out.gguf and TYPE", "out.gguf and TYPE", "TYPE"};
        rc = tn_cli_usage_error("missing %s (usage: tern quantize [options] in.gguf out.gguf TYPE [threads]; see --help)",
                                what[npos]);
        goto done;
    }
    if (npos == 4 && !tn_cli_parse_i64(pos[3], 1, 1024, &threads)) { rc = tn_cli_usage_error("bad thread count '%s'", pos[3]); goto done; }
    if (ovs.n_ov) opts.override = override_fn, opts.override_user = &ovs;
    const char *in_path = pos[0], *out_path = pos[1], *type_name = pos[2];

    tn_ftype ftype;
    tn_dtype default_type;
    tn_tq_params tqp;
    if (tn_ftype_from_name(type_name, &ftype)) {
        tn_ftype_default_type(ftype, &default_type);
    } else if (tn_tq_from_name(type_name, &tqp)) {
        ftype = TN_FTYPE_TERN;
        default_type = (tn_dtype)tn_tq_dtype(&tqp);
    } else if (tn_dtype_from_name(type_name, &default_type) && tn_vq_is(default_type)) {
        ftype = TN_FTYPE_TERN; /* a codebook type (quant/vq.h) */
    } else {
        rc = tn_cli_usage_error("unknown type '%s' (see tern quantize --help)", type_name);
        goto done;
    }
    const bool vq_type = ftype == TN_FTYPE_TERN && tn_vq_is(default_type);
    if (calib_path && !(target_bpw > 0) && !vq_type) {
        rc = tn_cli_usage_error("--calib is used by --target-bpw and the codebook types (vq2) only");
        goto done;
    }
    if (target_bpw > 0 && (ftype != TN_FTYPE_TERN || tn_vq_is(default_type))) {
        rc = tn_cli_usage_error("--target-bpw needs a tern type (tq<b>g<G>[a]: its group size and symmetry), not '%s'", type_name);
        goto done;
    }
    if (target_types && !(target_bpw > 0)) {
        rc = tn_cli_usage_error("--target-types adds candidates to --target-bpw; give --target-bpw X too");
        goto done;
    }
    for (const char *p = target_types; p && *p;) { /* comma-separated type names */
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        char nm[32];
        if (len == 0 || len >= sizeof nm) {
            rc = tn_cli_usage_error("bad --target-types '%s' (comma-separated type names, e.g. vq2,q4_K,q6_K)", target_types);
            goto done;
        }
        memcpy(nm, p, len), nm[len] = 0;
        int ti;
        if (!parse_dtype(nm, &ti) || tn_tq_is((uint32_t)ti)) { /* a tensor type (as --tensor-type), not the family's */
            rc = tn_cli_usage_error("--target-types: '%s' is not a tensor type besides the tq family (e.g. vq2, q4_K, "
                                    "q6_K, q8_0, iq4_xs)", nm);
            goto done;
        }
        const tn_dtype t = (tn_dtype)ti;
        if ((tn_dtype_is_iq_grid(t) || tn_iq_needs_weights(t)) && !imatrix_path) {
            rc = tn_cli_usage_error("--target-types: %s needs an importance matrix (--imatrix)", nm);
            goto done;
        }
        if (nxt == TARGET_XT_MAX) {
            rc = tn_cli_usage_error("--target-types: at most %d types", TARGET_XT_MAX);
            goto done;
        }
        bool dup = false;
        for (int k = 0; k < nxt; k++) dup |= xt[k] == t;
        if (!dup) xt[nxt++] = t;
        p = e ? e + 1 : p + len;
    }
    if (ftype == TN_FTYPE_MOSTLY_Q2_K_S && !imatrix_path) {
        rc = tn_cli_usage_error("Q2_K_S needs an importance matrix (--imatrix)");
        goto done;
    }
    if (!strcmp(in_path, out_path) || tn_same_file(in_path, out_path)) {
        rc = tn_cli_usage_error("input and output are the same file: '%s'", out_path);
        goto done;
    }
    {
        const char *const inputs[] = {imatrix_path, calib_path};
        if ((rc = tn_cli_check_output("output", out_path, inputs, 2)) != TN_EXIT_OK) goto done;
    }

    tn_gguf *g = NULL;
    tern_status s = tn_gguf_open(in_path, true, &g);
    if (s) { rc = tn_cli_fail(s, "reading the model"); goto done; }
    tn_imatrix *imat = NULL;
    if (imatrix_path) {
        s = tn_imatrix_load(imatrix_path, &imat);
        if (s) { rc = tn_cli_fail(s, "reading the importance matrix"); tn_gguf_free(g); goto done; }
        opts.has_imatrix = true;
    }

    const size_t n = g->n_tensors;
    const char **names = calloc(n + 1, sizeof *names);
    size_t *order = calloc(n + 1, sizeof *order);
    tn_qmix_tensor *mt = calloc(n + 1, sizeof *mt);
    tn_qmix_choice *ch = calloc(n + 1, sizeof *ch);
    tn_gguf_writer *w = NULL;
    tn_pool *pool = NULL;
    qctx q = {0};
    hess_set hs = {0};
    if (!names || !order || !mt || !ch) { rc = TN_EXIT_OSERR; goto out; }
    size_t max_el = 0;
    for (size_t i = 0; i < n; i++) {
        names[i] = g->tensors[i].name;
        size_t el = 1;
        for (uint32_t d = 0; d < g->tensors[i].n_dims; d++) el *= (size_t)g->tensors[i].ne[d];
        if (el > max_el) max_el = el;
    }
    tn_qmix_sort(names, n, order);
    for (size_t i = 0; i < n; i++) {
        const tn_gguf_tensor *t = &g->tensors[order[i]];
        mt[i].name = t->name;
        mt[i].n_dims = (int)t->n_dims;
        for (int d = 0; d < 4; d++) mt[i].ne[d] = d < (int)t->n_dims ? t->ne[d] : 1;
        mt[i].type = t->type;
    }
    tn_qmix_model mm;
    read_model(g, &mm);
    tn_qmix_plan(ftype, default_type, &mm, &opts, mt, n, ch);
    for (size_t i = 0; i < n && !imat; i++)
        if (ch[i].quantizable && tn_qmix_requires_imatrix(mt[i].name, ch[i].type, ftype)) {
            rc = tn_cli_usage_error("%s: tensor '%s' would be %s, which needs an importance matrix: give one with "
                                    "--imatrix FILE (tern imatrix or llama-imatrix), as llama-quantize requires",
                                    type_name, mt[i].name, tn_dtype_name(ch[i].type));
            goto out;
        }

    if (threads <= 0) threads = tn_cpu_count();
    if ((s = tn_pool_create((int)threads, &pool))) goto fail;
    q.f32 = malloc(max_el * sizeof(float) + 64);
    if (!q.f32) { rc = TN_EXIT_OSERR; goto out; }
    double achieved_bpw = 0;
    if (target_bpw > 0) {
        double lo_bpw, hi_bpw;
        target_range(g, order, ch, n, &opts, &tqp, &lo_bpw, &hi_bpw);
        if (target_bpw < lo_bpw) {
            char fam[32];
            tn_tq_params p1 = tqp;
            p1.bits = 1;
            tn_tq_name(&p1, fam, sizeof fam);
            rc = tn_cli_usage_error("--target-bpw %.4g is below the smallest file possible with %s (%.4g bpw)", target_bpw,
                                    fam, lo_bpw);
            goto out;
        }
        probe_ctx pr;
        if (target_bpw >= hi_bpw) {
            fprintf(stderr, "target-bpw: %.4g bpw holds every tensor at 8 bits (%.4g bpw): no measuring needed\n",
                    target_bpw, hi_bpw);
            calib_chunks = 0;
        } else if (calib_chunks > 0) {
            fprintf(stderr, "target-bpw: measuring sensitivities on %s (%lld chunks)\n",
                    calib_path ? calib_path : "text the model generates", (long long)calib_chunks);
            if ((s = probe_open(in_path, calib_path, (int)calib_chunks, (int)threads, &pr))) goto fail;
        } else {
            fprintf(stderr, "target-bpw: --calib-chunks 0: tensors are weighed by their %s squared error alone\n",
                    imat ? "importance-weighted" : "plain");
        }
        s = plan_target(g, order, mt, ch, n, &opts, &tqp, xt, nxt, imat, target_bpw, pool, (int)threads, q.f32,
                        calib_chunks > 0 ? &pr : NULL, target_bpw >= hi_bpw, mm.n_expert_used, &achieved_bpw);
        if (calib_chunks > 0) probe_close(&pr);
        if (s == TERN_ERR_INVALID_ARG) {
            rc = tn_cli_usage_error("%s", tern_last_error());
            goto out;
        }
        if (s) goto fail;
    }

    int n_fallback = 0;
    for (size_t i = 0; i < n; i++) {
        if (ch[i].fallback) {
            n_fallback++;
            fprintf(stderr, "warning: %-36s - ncols %6lld not divisible by %3lld (required for type %7s) -> falling back to %7s\n",
                    mt[i].name, (long long)mt[i].ne[0], (long long)tn_dtype_get(ch[i].wanted)->blck_size,
                    tn_dtype_name(ch[i].wanted), tn_dtype_name(ch[i].type));
        }
        if (ch[i].manual) fprintf(stderr, "%-36s - manual override: %s\n", mt[i].name, tn_dtype_name(ch[i].type));
    }

    /* metadata: every key of the input, then the quantization keys (re-added at the end, as
     * gguf_set_val does in llama.cpp) */
    if ((s = tn_gguf_writer_create(&w))) goto fail;
    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((s = tn_gguf_set_kv(w, &g->kv[i]))) goto fail;
    tn_gguf_remove(w, "general.quantization_version");
    if ((s = tn_gguf_set_u32(w, "general.quantization_version", 2))) goto fail;
    tn_gguf_remove(w, "general.file_type");
    if ((s = tn_gguf_set_u32(w, "general.file_type", (uint32_t)ftype))) goto fail;
    tn_gguf_remove(w, "split.no");
    tn_gguf_remove(w, "split.count");
    tn_gguf_remove(w, "split.tensors.count");
    if (imat && ftype != TN_FTYPE_TERN) {
        /* llama-quantize records the importance matrix as kv overrides, in this order */
        char buf[128];
        uint32_t cc = 0;
        const char *ds = NULL;
        tn_imatrix_meta(imat, &cc, NULL, &ds);
        snprintf(buf, sizeof buf, "%s", imatrix_path);
        if ((s = tn_gguf_set_str(w, "quantize.imatrix.file", buf))) goto fail;
        if (ds) {
            snprintf(buf, sizeof buf, "%s", ds);
            if ((s = tn_gguf_set_str(w, "quantize.imatrix.dataset", buf))) goto fail;
        }
        if ((s = tn_gguf_set_u32(w, "quantize.imatrix.entries_count", (uint32_t)tn_imatrix_count(imat)))) goto fail;
        if (cc > 0 && (s = tn_gguf_set_u32(w, "quantize.imatrix.chunks_count", cc))) goto fail;
    }
    if (ftype == TN_FTYPE_TERN && tn_vq_is(default_type)) { /* a codebook type: no bits/group keys */
        static const char *const tq_keys[] = {"tern.quant.bits", "tern.quant.group_size", "tern.quant.asymmetric"};
        for (size_t i = 0; i < sizeof tq_keys / sizeof tq_keys[0]; i++) (void)tn_gguf_remove(w, tq_keys[i]);
        if ((s = tn_gguf_set_u32(w, "tern.quant.version", 1))) goto fail;
        if ((s = tn_gguf_set_str(w, "tern.quant.type", tn_dtype_name(default_type)))) goto fail;
        if ((s = tn_gguf_set_str(w, "tern.quant.layout", "vq2-v1"))) goto fail;
        if (imatrix_path && (s = tn_gguf_set_str(w, "tern.quant.imatrix", imatrix_path))) goto fail;
    } else if (ftype == TN_FTYPE_TERN) {
        char nm[32];
        tn_tq_name(&tqp, nm, sizeof nm);
        if ((s = tn_gguf_set_u32(w, "tern.quant.version", 1))) goto fail;
        if ((s = tn_gguf_set_str(w, "tern.quant.type", nm))) goto fail;
        if ((s = tn_gguf_set_u32(w, "tern.quant.bits", (uint32_t)tqp.bits))) goto fail;
        if ((s = tn_gguf_set_u32(w, "tern.quant.group_size", (uint32_t)tqp.group))) goto fail;
        if ((s = tn_gguf_set_bool(w, "tern.quant.asymmetric", tqp.asym))) goto fail;
        if ((s = tn_gguf_set_str(w, "tern.quant.layout", "planes-8421-v1"))) goto fail;
        if (imatrix_path && (s = tn_gguf_set_str(w, "tern.quant.imatrix", imatrix_path))) goto fail;
        if (target_bpw > 0 && (s = tn_gguf_set_f32(w, "tern.quant.target_bpw", target_bpw))) goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        const tn_gguf_tensor *t = &g->tensors[order[i]];
        if ((s = tn_gguf_add_tensor(w, t->name, ch[i].type, t->n_dims, t->ne, NULL))) goto fail;
    }

    if (vq_type && calib_path) {
        signal(SIGINT, on_sigint);
        signal(SIGTERM, on_sigint);
        s = hess_collect(in_path, calib_path, calib_chunks_set ? calib_chunks : 256, (int)threads, &hs);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        if (s == TERN_ERR_INVALID_ARG) {
            rc = tn_cli_usage_error("%s", tern_last_error());
            goto out;
        }
        if (g_stop) {
            fprintf(stderr, "\ntern: interrupted; no output written\n");
            rc = TN_EXIT_INTERRUPTED;
            goto out;
        }
        if (s) {
            rc = tn_cli_fail(s, "collecting Hessians on the --calib text");
            goto out;
        }
        q.hess = &hs;
        if ((s = tn_gguf_set_str(w, "tern.quant.calib", calib_path))) goto fail;
    }
    q.in = g;
    q.order = order;
    q.ch = ch;
    q.n = n;
    q.pool = pool;
    q.imat = imat;
    q.allow_requantize = allow_requantize;
    q.ftype = ftype;

    fprintf(stderr, "quantize: %s -> %s as %s (%zu tensors, %lld threads)\n", in_path, out_path, type_name, n, (long long)threads);
    signal(SIGINT, on_sigint);
    signal(SIGTERM, on_sigint);
    const double t0 = tn_cli_now();
    s = tn_gguf_write(w, out_path, fill, &q);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (g_stop) {
        fprintf(stderr, "\ntern: interrupted; no output written\n");
        rc = TN_EXIT_INTERRUPTED;
        goto out;
    }
    if (s) goto fail;
    fprintf(stderr, "quantize: model size  = %8.2f MiB (%.2f BPW)\n", q.total_in / 1024.0 / 1024.0, q.total_in * 8.0 / (double)q.n_elem);
    fprintf(stderr, "quantize: quant size  = %8.2f MiB (%.2f BPW)\n", q.total_out / 1024.0 / 1024.0, q.total_out * 8.0 / (double)q.n_elem);
    if (q.hess) fprintf(stderr, "quantize: %d tensors quantized with their Hessians\n", q.n_gptq);
    if (target_bpw > 0)
        fprintf(stderr, "quantize: target %.4g bpw, achieved %.4f bpw (whole file)\n", target_bpw, achieved_bpw);
    if (n_fallback) fprintf(stderr, "quantize: WARNING: %d of %zu tensor(s) required fallback quantization\n", n_fallback, n);
    fprintf(stderr, "quantize: done in %.2f s\n", tn_cli_now() - t0);
    goto out;
fail:
    fprintf(stderr, "\n");
    rc = tn_cli_fail(s, "quantizing");
out:
    hess_free(&hs);
    for (int i = 0; i < HESS_SITES; i++) tn_vq_gptq_free(q.gptq_of[i]);
    free(q.f32);
    tn_pool_free(pool);
    tn_gguf_writer_free(w);
    free(names);
    free(order);
    free(mt);
    free(ch);
    tn_imatrix_free(imat);
    tn_gguf_free(g);
done:
    for (int i = 0; i < ovs.n_ov; i++) regfree(&ovs.ov[i].re);
    free(ovs.ov);
    return rc;
}
