/*
 * alloc.c — the one allocator funnel, with on-demand failure for fault-injection tests
 * (SQLite malloc.c / Lua ltests.c style). Thread-safe: the counter is atomic.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/base.h"

static atomic_uint_fast64_t tn_alloc_n;       /* allocations so far                  */
static atomic_uint_fast64_t tn_fail_at;       /* fail when counter reaches this; 0 off */
static atomic_bool tn_fail_persist;
static atomic_bool tn_env_read;

static void tn_alloc_read_env(void) {
    if (atomic_exchange(&tn_env_read, true)) return;
    const char *e = getenv("TERN_FAIL_ALLOC_AT");
    if (!e || !*e) return;
    char *end = NULL;
    unsigned long long n = strtoull(e, &end, 10);
    bool persist = end && strstr(end, "persistent") != NULL;
    if (n > 0) tn_alloc_fail_at(n, persist);
}

void tn_alloc_fail_at(uint64_t n, bool persistent) {
    atomic_store(&tn_env_read, true);
    atomic_store(&tn_fail_persist, persistent);
    atomic_store(&tn_fail_at, n ? atomic_load(&tn_alloc_n) + n : 0);
}

uint64_t tn_alloc_count(void) { return atomic_load(&tn_alloc_n); }

static bool tn_alloc_should_fail(void) {
    tn_alloc_read_env();
    uint64_t k = atomic_fetch_add(&tn_alloc_n, 1) + 1;
    uint64_t at = atomic_load(&tn_fail_at);
    if (!at) return false;
    if (k == at) return true;
    return k > at && atomic_load(&tn_fail_persist);
}

void *tn_malloc(size_t n) {
    if (tn_alloc_should_fail()) return NULL;
    return malloc(n ? n : 1);
}

void *tn_calloc(size_t count, size_t size) {
    if (tn_alloc_should_fail()) return NULL;
    if (!count || !size) return calloc(1, 1);
    return calloc(count, size);
}

void *tn_realloc(void *p, size_t n) {
    if (tn_alloc_should_fail()) return NULL;
    return realloc(p, n ? n : 1);
}

void tn_free(void *p) { free(p); }

void *tn_malloc_aligned(size_t n, size_t align) {
    if (tn_alloc_should_fail()) return NULL;
    void *p = NULL;
    if (align < sizeof(void *)) align = sizeof(void *);
    if (posix_memalign(&p, align, n ? TN_PAD(n, align) : align) != 0) return NULL;
    return p;
}

void *tn_malloc_huge(size_t n) {
    const size_t huge = (size_t)2 << 20;
    void *p = tn_malloc_aligned(n, huge); /* padded to a multiple of 2 MiB */
    const char *e = getenv("TERN_HUGEPAGES");
    if (p && !(e && !strcmp(e, "0"))) (void)madvise(p, TN_PAD(n ? n : 1, huge), MADV_HUGEPAGE);
    return p;
}

void tn_free_aligned(void *p) { free(p); }

char *tn_strndup(const char *s, size_t n) {
    char *d = tn_malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

char *tn_strdup(const char *s) { return tn_strndup(s, strlen(s)); }

bool tn_mem_parse_size(const char *s, uint64_t *bytes) {
    char *end;
    const double v = strtod(s, &end);
    if (end == s || !(v > 0) || !isfinite(v)) return false;
    double mul = 1;
    switch (*end) {
    case 'K': case 'k': mul = 1024.0, end++; break;
    case 'M': case 'm': mul = 1048576.0, end++; break;
    case 'G': case 'g': mul = 1073741824.0, end++; break;
    case 'T': case 't': mul = 1099511627776.0, end++; break;
    default: break;
    }
    if (mul > 1 && *end == 'i') end++;
    if (*end == 'B') end++;
    const double b = v * mul;
    if (*end || b < 1 || b > 1.8e19) return false;
    *bytes = (uint64_t)b;
    return true;
}

uint64_t tn_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}
