/*
 * buf.c — the server's growable byte buffer (chat prompts, metrics text, stream events). A failed
 * allocation makes the buffer sticky-failed (oom) instead of dropping bytes silently, so a caller
 * checks once at the end (SQLite's sticky-failure idea).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/base.h"
#include "serve/serve.h"

bool tn_buf_reserve(tn_buf *b, size_t extra) {
    if (b->oom) return false;
    if (b->n + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) cap *= 2;
    char *q = tn_realloc(b->p, cap);
    if (!q) {
        b->oom = true;
        return false;
    }
    b->p = q;
    b->cap = cap;
    return true;
}

void tn_buf_put(tn_buf *b, const char *s, size_t n) {
    if (!tn_buf_reserve(b, n)) return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tn_buf_puts(tn_buf *b, const char *s) { tn_buf_put(b, s, strlen(s)); }

void tn_buf_printf(tn_buf *b, const char *fmt, ...) {
    for (size_t want = 256; tn_buf_reserve(b, want);) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        want = (size_t)k;
    }
}

char *tn_buf_take(tn_buf *b, size_t *len) {
    char *p = b->oom ? NULL : b->p;
    if (b->oom) tn_free(b->p);
    if (p && len) *len = b->n;
    memset(b, 0, sizeof *b);
    return p;
}
