/*
 * cli.c — exit-code mapping, error printing and strict flag parsing shared by subcommands.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

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
