/*
 * status.c — thread-local last-error message, status names and the log hook.
 * Invariant: the message buffer is fixed size; formatting never allocates.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/base.h"

#define TN_ERR_CAP 1024
static _Thread_local char tn_err_msg[TN_ERR_CAP];

static const char *tn_basename(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

tern_status tn_err_at(const char *file, int line, tern_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tn_err_msg, TN_ERR_CAP, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if (n < TN_ERR_CAP - 1) snprintf(tn_err_msg + n, (size_t)(TN_ERR_CAP - n), " [%s:%d]", tn_basename(file), line);
    return s;
}

tern_status tn_err_prefix(tern_status s, const char *fmt, ...) {
    char prefix[256], old[TN_ERR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, tn_err_msg, TN_ERR_CAP);
    int n = snprintf(tn_err_msg, TN_ERR_CAP, "%s: ", prefix);
    if (n < 0) n = 0;
    if (n < TN_ERR_CAP) {
        size_t room = (size_t)(TN_ERR_CAP - n) - 1, len = strnlen(old, TN_ERR_CAP);
        if (len > room) len = room;
        memcpy(tn_err_msg + n, old, len);
        tn_err_msg[n + len] = 0;
    }
    return s;
}

void tn_err_clear(void) { tn_err_msg[0] = 0; }

const char *tern_last_error(void) { return tn_err_msg; }

const char *tern_status_str(tern_status s) {
    switch (s) {
    case TERN_OK: return "ok";
    case TERN_ERR_NOMEM: return "out of memory";
    case TERN_ERR_IO: return "i/o error";
    case TERN_ERR_FORMAT: return "invalid format";
    case TERN_ERR_UNSUPPORTED: return "unsupported";
    case TERN_ERR_INVALID_ARG: return "invalid argument";
    case TERN_ERR_STATE: return "invalid state";
    case TERN_ERR_FULL: return "full";
    case TERN_ERR_ABORTED: return "aborted";
    case TERN_ERR_INTERNAL: return "internal error";
    case TERN_ERR_NOT_FOUND: return "not found";
    }
    return "unknown status";
}

#ifndef TERN_VERSION_COMMIT
#define TERN_VERSION_COMMIT "unknown"
#endif
#define TN_STR2(x) #x
#define TN_STR(x) TN_STR2(x)
const char *tern_version_string(void) {
    return TN_STR(TERN_VERSION_MAJOR) "." TN_STR(TERN_VERSION_MINOR) "." TN_STR(TERN_VERSION_PATCH) " (" TERN_VERSION_COMMIT ")";
}

static tern_log_fn tn_log_fn;
static void *tn_log_user;

void tern_set_log(tern_log_fn fn, void *user) {
    tn_log_fn = fn;
    tn_log_user = user;
}

void tn_log(tern_log_level lvl, const char *fmt, ...) {
    if (!tn_log_fn) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    tn_log_fn(lvl, buf, tn_log_user);
}

double tn_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t tn_time_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
