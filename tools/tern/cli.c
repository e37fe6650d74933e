/*
 * cli.c — exit-code mapping, error printing and strict flag parsing shared by subcommands.
 */
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
