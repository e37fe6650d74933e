/*
 * base.h — macros, error recording and the allocator hook shared by every tern module.
 *
 * Errors: fallible internal functions return tern_status and record a thread-local message with
 * `return tn_err(TERN_ERR_FORMAT, "gguf: tensor '%s' ends at %llu ...", ...)`. The message is
 * read back through tern_last_error(). tn_err never prints and never exits.
 *
 * Memory: every allocation goes through tn_malloc/tn_calloc/tn_realloc/tn_free so tests can fail
 * the N-th allocation (tn_alloc_fail_at, or env TERN_FAIL_ALLOC_AT=N[,persistent]).
 */
#ifndef TN_CORE_BASE_H
#define TN_CORE_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tern/tern.h"

#define TN_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TN_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TN_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define TN_PAD(x, n) (((x) + (n) - 1) / (n) * (n))
#define TN_UNUSED(x) (void)(x)

/* Whether string s ends with suf (file extensions, tensor-name suffixes). */
static inline bool tn_str_ends_with(const char *s, const char *suf) {
    const size_t n = strlen(s), k = strlen(suf);
    return n >= k && !memcmp(s + n - k, suf, k);
}

/* Length of s[0..n) without a trailing incomplete UTF-8 sequence (what can be printed now). */
static inline size_t tn_utf8_complete(const char *s, size_t n) {
    for (size_t i = n; i > 0 && i + 4 > n; i--) {
        const unsigned char c = (unsigned char)s[i - 1];
        if ((c & 0xC0) == 0x80) continue;
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return n - (i - 1) < need ? i - 1 : n;
    }
    return n;
}

#if defined(__GNUC__)
#define TN_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define TN_LIKELY(x) __builtin_expect(!!(x), 1)
#define TN_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define TN_PRINTF(f, a)
#define TN_LIKELY(x) (x)
#define TN_UNLIKELY(x) (x)
#endif

/* Records "msg (file:line)" as this thread's last error and returns s. */
tern_status tn_err_at(const char *file, int line, tern_status s, const char *fmt, ...) TN_PRINTF(4, 5);
#define tn_err(s, ...) tn_err_at(__FILE__, __LINE__, (s), __VA_ARGS__)
/* Prepends "prefix: " to the current last error (adds context on the way up), returns s. */
tern_status tn_err_prefix(tern_status s, const char *fmt, ...) TN_PRINTF(2, 3);
void tn_err_clear(void);

/* Logging through the user's hook (silent by default). */
void tn_log(tern_log_level lvl, const char *fmt, ...) TN_PRINTF(2, 3);

/* Allocator hook. tn_malloc(0) returns a valid unique pointer. Memory is 64-byte aligned
 * when obtained through tn_malloc_aligned (free with tn_free_aligned). */
void *tn_malloc(size_t n);
void *tn_calloc(size_t count, size_t size);
void *tn_realloc(void *p, size_t n);
void tn_free(void *p);
void *tn_malloc_aligned(size_t n, size_t align);
/* n bytes (rounded up to 2 MiB) aligned to 2 MiB and madvised MADV_HUGEPAGE, so that memory a
 * loop streams through (decode's weights, tern bench's read probe) sits in huge pages where the
 * kernel allows (THP, also in its "madvise" mode): with 4 KiB pages every 4 KiB is a TLB miss and
 * a new stream for the hardware prefetcher. TERN_HUGEPAGES=0 leaves the pages at 4 KiB (for
 * comparison). Free with tn_free_aligned. */
void *tn_malloc_huge(size_t n);
/* Parses "4G", "512M", "100K", "123" (bytes; K/M/G/T are powers of 1024, a trailing "B" or "iB"
 * allowed); false unless a positive size (--mem-budget, --hot-experts). */
bool tn_mem_parse_size(const char *s, uint64_t *bytes);
/* Bytes of memory the kernel says can be had without swapping (/proc/meminfo's MemAvailable), 0
 * if unknown. */
uint64_t tn_mem_available(void);
void tn_free_aligned(void *p);
char *tn_strdup(const char *s);
char *tn_strndup(const char *s, size_t n);

/* Fault injection: the n-th allocation from now fails (1 = the next one); persistent makes all
 * later ones fail too. n = 0 disables. Also set from env TERN_FAIL_ALLOC_AT at first use. */
void tn_alloc_fail_at(uint64_t n, bool persistent);
uint64_t tn_alloc_count(void); /* allocations made since start (for tests) */

/* Overflow-checked arithmetic: return false on overflow. */
static inline bool tn_mul_ok(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }
static inline bool tn_add_ok(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_add_overflow(a, b, r); }

/* Monotonic clock in seconds / microseconds. */
double tn_time_s(void);
int64_t tn_time_us(void);

#endif
