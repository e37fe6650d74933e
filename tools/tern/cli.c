/*
 * cli.c — exit-code mapping, error printing and strict flag parsing shared by subcommands.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "core/base.h"
#include "core/file.h"

int tn_cli_exit_code(tern_status s) {
    switch (s) {
    case TERN_OK: return TN_EXIT_OK;
    case TERN_ERR_INVALID_ARG: return TN_EXIT_USAGE;
    case TERN_ERR_FORMAT:
    case TERN_ERR_UNSUPPORTED: return TN_EXIT_DATAERR;
    case TERN_ERR_NOT_FOUND: return TN_EXIT_NOINPUT;
    case TERN_ERR_NOMEM: return TN_EXIT_OSERR;
    case TERN_ERR_IO: return TN_EXIT_IOERR;
    case TERN_ERR_ABORTED: return TN_EXIT_INTERRUPTED;
    default: return TN_EXIT_SOFTWARE;
    }
}

int tn_cli_fail(tern_status s, const char *what) {
    fprintf(stderr, "tern: error: %s: %s\n", what, tern_last_error());
    return tn_cli_exit_code(s);
}

int tn_cli_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tern: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return TN_EXIT_USAGE;
}

bool tn_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return false;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool tn_cli_parse_f32(const char *s, float lo, float hi, float *out) {
    if (!s || !*s) return false;
    char *end = NULL;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double tn_cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tn_cli_check_output(const char *what, const char *out, const char *const *inputs, int n) {
    if (!out) return TN_EXIT_OK;
    for (int i = 0; i < n; i++)
        if (inputs[i] && (!strcmp(out, inputs[i]) || tn_same_file(out, inputs[i])))
            return tn_cli_usage_error("%s '%s' is an input of this run ('%s'); it would be overwritten", what, out, inputs[i]);
    return TN_EXIT_OK;
}

tern_status tn_cli_read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return tn_err(TERN_ERR_NOT_FOUND, "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
        }
        buf = nb;
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf) return tn_err(TERN_ERR_NOMEM, "out of memory reading '%s'", path);
    if (err) {
        free(buf);
        return tn_err(TERN_ERR_IO, "read error on '%s'", path);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return TERN_OK;
}

static bool tn_is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

bool tn_cli_default_model(char *buf, size_t cap) {
    const char *env = getenv("TERN_DEFAULT_MODEL");
    if (env && *env) {
        snprintf(buf, cap, "%s", env);
        return true; /* a bad path then fails loudly at load */
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        const char *rel[] = {"/../share/tern/tern-default.gguf", "/../models/tern-default.gguf"};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            snprintf(buf, cap, "%s%s", exe, rel[i]);
            if (tn_is_file(buf)) return true;
        }
    }
#ifdef TERN_SOURCE_DIR
    snprintf(buf, cap, "%s/models/tern-default.gguf", TERN_SOURCE_DIR);
    if (tn_is_file(buf)) return true;
#endif
    return false;
}

tern_status tn_cli_tokenize(const tern_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                            tern_token **out, int32_t *n_out) {
    *out = NULL;
    *n_out = 0;
    int32_t cap = (int32_t)(len + 8 < (1u << 30) ? len + 8 : (1u << 30)), n = 0;
    tern_token *toks = malloc((size_t)cap * sizeof *toks);
    if (!toks) return TERN_ERR_NOMEM;
    tern_status s = tern_tokenize(m, text, len, add_special, parse_special, toks, cap, &n);
    if (s == TERN_ERR_FULL) { /* byte fallback can need more tokens than bytes: retry at the size asked */
        tern_token *bigger = realloc(toks, (size_t)n * sizeof *toks);
        if (!bigger) {
            free(toks);
            return TERN_ERR_NOMEM;
        }
        toks = bigger;
        s = tern_tokenize(m, text, len, add_special, parse_special, toks, n, &n);
    }
    if (s) {
        free(toks);
        return s;
    }
    *out = toks;
    *n_out = n;
    return TERN_OK;
}

int tn_cli_device_flag(int argc, char **argv, int *i, int32_t *device, int32_t *n_gpu_layers) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    const bool is_dev = !strcmp(a, "--device") || !strcmp(a, "-dev");
    const bool is_ngl = !strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers") || !strcmp(a, "--gpu-layers");
    if (!is_dev && !is_ngl) return 0;
    if (!val) {
        tn_cli_usage_error("%s needs a value", a);
        return -1;
    }
    (*i)++;
    if (is_dev) {
        if (!strcmp(val, "cpu") || !strcmp(val, "none")) *device = TERN_DEVICE_CPU;
        else if (!strcmp(val, "cuda") || !strcmp(val, "cuda0") || !strcmp(val, "gpu")) *device = TERN_DEVICE_CUDA;
        else {
            tn_cli_usage_error("--device: '%s' is not a device (cpu, cuda)", val);
            return -1;
        }
        return 1;
    }
    int64_t v;
    if (!tn_cli_parse_i64(val, -1, 1 << 20, &v)) {
        tn_cli_usage_error("%s: '%s' is not a layer count (-1 = all)", a, val);
        return -1;
    }
    *n_gpu_layers = (int32_t)v;
    return 1;
}

bool tn_cli_chat_template(const char *name, tern_chat_template *out) {
    if (tern_chat_template_from_name(name, out) == TERN_OK) return true;
    char names[256] = "";
    for (int t = 0; t < TERN_CHAT_N_TEMPLATES; t++) {
        if (t) strncat(names, ", ", sizeof names - strlen(names) - 1);
        strncat(names, tern_chat_template_name((tern_chat_template)t), sizeof names - strlen(names) - 1);
    }
    tn_cli_usage_error("--chat-template: unknown template '%s' (known: %s)", name, names);
    return false;
}

int tn_cli_sampling_flag(int argc, char **argv, int *i, tern_sampler_params *sp, int64_t *seed) {
    static const char *const names[] = {"-s", "--seed", "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n"};
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    size_t k = 0;
    while (k < sizeof names / sizeof *names && strcmp(a, names[k])) k++;
    if (k == sizeof names / sizeof *names) return 0;
    if (!val) {
        tn_cli_usage_error("%s needs a value", a);
        return -1;
    }
    (*i)++;
    int64_t v;
    bool ok = true;
    const char *want = "";
    if (k <= 1) {
        ok = tn_cli_parse_i64(val, -1, INT64_MAX, seed), want = "a seed (>= 0, or -1 for random)";
    } else if (!strcmp(a, "--temp")) {
        ok = tn_cli_parse_f32(val, 0.0f, 100.0f, &sp->temp), want = "a number in 0..100";
    } else if (!strcmp(a, "--top-k")) {
        ok = tn_cli_parse_i64(val, 0, 1 << 24, &v), want = "a number >= 0";
        if (ok) sp->top_k = (int32_t)v;
    } else if (!strcmp(a, "--top-p")) {
        ok = tn_cli_parse_f32(val, 0.0f, 1.0f, &sp->top_p) && sp->top_p != 0.0f, want = "a number in (0, 1]";
    } else if (!strcmp(a, "--min-p")) {
        ok = tn_cli_parse_f32(val, 0.0f, 1.0f, &sp->min_p), want = "a number in 0..1";
    } else if (!strcmp(a, "--repeat-penalty")) {
        ok = tn_cli_parse_f32(val, 0.0f, 100.0f, &sp->repeat_penalty) && sp->repeat_penalty != 0.0f, want = "a number in (0, 100]";
    } else {
        ok = tn_cli_parse_i64(val, 0, 1 << 20, &v), want = "a number in 0..1048576";
        if (ok) sp->repeat_last_n = (int32_t)v;
    }
    if (!ok) {
        tn_cli_usage_error("%s: '%s' is not %s", a, val, want);
        return -1;
    }
    return 1;
}

int tn_cli_cache_type_flag(int argc, char **argv, int *i, int32_t *type_k, int32_t *type_v, int32_t *kv_rot) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--kv-rotate")) {
        const int32_t r = val ? tern_kv_rotate_from_name(val) : -1;
        if (r < 0) {
            if (val) tn_cli_usage_error("--kv-rotate: '%s' is not auto, none, k, v or kv", val);
            else tn_cli_usage_error("--kv-rotate needs a value (auto, none, k, v or kv)");
            return -1;
        }
        (*i)++;
        *kv_rot = r;
        return 1;
    }
    const bool is_k = !strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k");
    if (!is_k && strcmp(a, "-ctv") && strcmp(a, "--cache-type-v")) return 0;
    if (!val) {
        tn_cli_usage_error("%s needs a value (f16, q8_0, q4_0, tq2 .. tq8; for K also tqc2 .. tqc4)", a);
        return -1;
    }
    (*i)++;
    const int32_t t = tern_kv_type_from_name(val);
    if (t < 0) {
        tn_cli_usage_error("%s: '%s' is not a KV cache type (f16, q8_0, q4_0, tq2 .. tq8; for K also tqc2 .. tqc4)", a, val);
        return -1;
    }
    if (!is_k && t >= TERN_KV_TQC(2) && t <= TERN_KV_TQC(4)) {
        tn_cli_usage_error("%s: '%s' is per-channel quantization, for K only (-ctk); V takes f16, q8_0, q4_0, tq2 .. tq8", a, val);
        return -1;
    }
    *(is_k ? type_k : type_v) = t;
    return 1;
}

void tn_cli_run_init(tn_cli_run *r) {
    memset(r, 0, sizeof *r);
    r->n_batch = 512;
    r->use_mmap = r->repack = true;
    r->device = TERN_DEVICE_CPU;
    r->n_gpu_layers = -1;
}

int tn_cli_lora_flag(int argc, char **argv, int *i, tn_cli_lora *l) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    const bool scaled = !strcmp(a, "--lora-scaled");
    if (!scaled && strcmp(a, "--lora")) return 0;
    if (!val || (scaled && *i + 2 >= argc)) {
        tn_cli_usage_error("%s needs %s", a, scaled ? "a file and a scale" : "a file (FILE or FILE:SCALE)");
        return -1;
    }
    if (l->n == TN_CLI_MAX_LORA) {
        tn_cli_usage_error("%s: at most %d adapters", a, TN_CLI_MAX_LORA);
        return -1;
    }
    float scale = 1.0f;
    char *path = strdup(val);
    if (!path) {
        fprintf(stderr, "tern: error: out of memory\n");
        return -1;
    }
    const char *sv = scaled ? argv[*i + 2] : NULL;
    char *colon = strrchr(path, ':');
    if (!scaled && colon && colon[1] && (isdigit((unsigned char)colon[1]) || strchr("-+.", colon[1]))) {
        *colon = 0; /* FILE:SCALE (a path with a colon and no scale after it stays whole) */
        sv = colon + 1;
    }
    if (sv && !tn_cli_parse_f32(sv, -1000.0f, 1000.0f, &scale)) {
        tn_cli_usage_error("%s: scale '%s' is not a number in -1000..1000", a, sv);
        free(path);
        return -1;
    }
    if (!*path) {
        tn_cli_usage_error("%s: empty file name", a);
        free(path);
        return -1;
    }
    l->path[l->n] = path, l->scale[l->n] = scale, l->a[l->n] = NULL, l->n++;
    *i += scaled ? 2 : 1;
    return 1;
}

int tn_cli_lora_open(tn_cli_lora *l, const tern_model *m, tern_ctx *c) {
    if (!l->n) return TN_EXIT_OK;
    for (int i = 0; i < l->n; i++) {
        if (l->a[i]) continue;
        tern_status s = tern_lora_load(m, l->path[i], &l->a[i]);
        if (s) return tn_cli_fail(s, "loading the LoRA adapter");
    }
    tern_status s = tern_ctx_set_lora(c, l->a, l->scale, l->n);
    if (s) return tn_cli_fail(s, "applying the LoRA adapters");
    return TN_EXIT_OK;
}

void tn_cli_lora_free(tn_cli_lora *l) {
    for (int i = 0; i < l->n; i++) {
        tern_lora_free(l->a[i]);
        free(l->path[i]);
    }
    memset(l, 0, sizeof *l);
}

void tn_cli_lora_desc(const tn_cli_lora *l, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < l->n && o < cap; i++) {
        const int w = snprintf(buf + o, cap - o, "%s%s x%g%s", i ? ", " : " (LoRA: ", l->path[i], (double)l->scale[i], i + 1 == l->n ? ")" : "");
        if (w < 0) break;
        o += (size_t)w;
    }
}

int tn_cli_hot_experts_flag(int argc, char **argv, int *i, uint64_t *bytes) {
    if (strcmp(argv[*i], "--hot-experts")) return 0;
    const char *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!val) return tn_cli_usage_error("--hot-experts needs a size (e.g. 2G, 512M)"), -1;
    if (!strcmp(val, "0")) *bytes = 0; /* off */
    else if (!tn_mem_parse_size(val, bytes))
        return tn_cli_usage_error("--hot-experts: '%s' is not a size (bytes, or with K, M, G, T: 2G, 512M)", val), -1;
    ++*i;
    return 1;
}

void tn_cli_hot_experts_report(const tern_ctx *c) {
    tern_hot_experts h;
    tern_ctx_hot_experts(c, &h);
    if (!h.budget_bytes) return;
    fprintf(stderr, "tern: hot experts: %lld of %lld in %.1f of %.1f MiB; %.1f%% of %llu routed rows went to them\n", (long long)h.n_hot,
            (long long)h.n_experts, (double)h.used_bytes / 1048576.0, (double)h.budget_bytes / 1048576.0,
            h.rows ? 100.0 * (double)h.rows_hot / (double)h.rows : 0.0, (unsigned long long)h.rows);
}

int tn_cli_run_flag(int argc, char **argv, int *i, tn_cli_run *r) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    const int lv = tn_cli_lora_flag(argc, argv, i, &r->lora);
    if (lv) return lv;
    const int hv = tn_cli_hot_experts_flag(argc, argv, i, &r->hot_experts);
    if (hv) return hv;
    if (!strcmp(a, "--no-mmap")) return r->use_mmap = false, 1;
    if (!strcmp(a, "--no-repack")) return r->repack = false, 1;
    if (!strcmp(a, "--swa-full")) return r->swa_full = true, 1;
    const int ct = tn_cli_cache_type_flag(argc, argv, i, &r->type_k, &r->type_v, &r->kv_rot);
    if (ct) return ct;
    const bool is_m = !strcmp(a, "-m") || !strcmp(a, "--model"), is_c = !strcmp(a, "-c") || !strcmp(a, "--ctx-size");
    const bool is_t = !strcmp(a, "-t") || !strcmp(a, "--threads"), is_b = !strcmp(a, "-b") || !strcmp(a, "--batch-size");
    if (!is_m && !is_c && !is_t && !is_b) return tn_cli_device_flag(argc, argv, i, &r->device, &r->n_gpu_layers);
    if (!val) {
        tn_cli_usage_error("%s needs a value", a);
        return -1;
    }
    (*i)++;
    if (is_m) return r->model_path = val, 1;
    const int64_t lo = is_c ? 0 : 1, hi = is_c ? 1 << 22 : is_t ? 1024 : 65536;
    if (!tn_cli_parse_i64(val, lo, hi, is_c ? &r->n_ctx : is_t ? &r->n_threads : &r->n_batch)) {
        tn_cli_usage_error("%s: '%s' is not a number in %lld..%lld", a, val, (long long)lo, (long long)hi);
        return -1;
    }
    return 1;
}

int tn_cli_run_open(tn_cli_run *r, tern_model **m, tern_ctx **c) {
    *m = NULL;
    *c = NULL;
    if (!r->model_path) {
        if (!tn_cli_default_model(r->default_path, sizeof r->default_path)) {
            fprintf(stderr, "tern: error: no -m given and tern's default model was not found (looked in $TERN_DEFAULT_MODEL, "
                            "<prefix>/share/tern/ and <source>/models/)\n");
            return TN_EXIT_NOINPUT;
        }
        r->model_path = r->default_path;
    }
    tern_model_params mp;
    tern_model_params_init(&mp);
    mp.use_mmap = r->use_mmap;
    mp.repack = r->repack && r->device == TERN_DEVICE_CPU; /* the GPU reads the file's layouts */
    mp.hot_experts = r->hot_experts;
    double t0 = tn_cli_now();
    tern_status s = tern_model_load(r->model_path, &mp, m);
    if (s) return tn_cli_fail(s, "loading the model");
    r->t_load = tn_cli_now() - t0;
    tern_ctx_params_init(&r->cp);
    const int32_t n_train = tern_model_n_ctx_train(*m);
    r->cp.n_ctx = (int32_t)(r->n_ctx ? r->n_ctx : (n_train < 4096 ? n_train : 4096));
    r->cp.n_batch = (int32_t)r->n_batch;
    r->cp.device = r->device;
    r->cp.n_gpu_layers = r->n_gpu_layers;
    r->cp.swa_full = r->swa_full;
    r->cp.type_k = r->type_k, r->cp.type_v = r->type_v, r->cp.kv_rotate = r->kv_rot;
    if (r->n_threads) r->cp.n_threads = (int32_t)r->n_threads;
    /* A model of a few MiB decodes a token in well under a millisecond: synchronising threads
     * costs more than it saves (and far more on a busy machine), so small models default to one. */
    else if (tern_model_size_bytes(*m) < ((uint64_t)32 << 20)) r->cp.n_threads = 1;
    if ((s = tern_ctx_create(*m, &r->cp, c))) {
        const int rc = tn_cli_fail(s, "creating the context");
        tern_model_free(*m);
        *m = NULL;
        return rc;
    }
    const int rc = tn_cli_lora_open(&r->lora, *m, *c);
    if (rc != TN_EXIT_OK) {
        tn_cli_lora_free(&r->lora);
        tern_ctx_free(*c);
        tern_model_free(*m);
        *c = NULL, *m = NULL;
    }
    return rc;
}

void tn_cli_run_close(tn_cli_run *r) { tn_cli_lora_free(&r->lora); }
