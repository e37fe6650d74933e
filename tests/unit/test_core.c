/*
 * test_core.c — core: error recording, allocator fault injection, fp16/bf16 conversions
 * (checked against the compiler's own _Float16-free arithmetic definitions), thread pool splits
 * and barrier, atomic output files.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/base.h"
#include "core/file.h"
#include "core/fp16.h"
#include "core/pool.h"

static void test_err_message(void **state) {
    (void)state;
    tern_status s = tn_err(TERN_ERR_FORMAT, "gguf: tensor '%s' ends at %d", "x", 42);
    assert_int_equal(s, TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "gguf: tensor 'x' ends at 42"));
    assert_non_null(strstr(tern_last_error(), "test_core.c:"));
    tn_err_prefix(s, "model.gguf");
    assert_true(strncmp(tern_last_error(), "model.gguf: gguf:", 17) == 0);
    assert_string_equal(tern_status_str(TERN_ERR_NOMEM), "out of memory");
}

static void test_alloc_fail(void **state) {
    (void)state;
    tn_alloc_fail_at(2, false);
    void *a = tn_malloc(8), *b = tn_malloc(8), *c = tn_malloc(8);
    assert_non_null(a);
    assert_null(b);
    assert_non_null(c);
    tn_free(a);
    tn_free(c);
    tn_alloc_fail_at(1, true);
    assert_null(tn_malloc(1));
    assert_null(tn_calloc(2, 2));
    tn_alloc_fail_at(0, false);
    a = tn_malloc(0);
    assert_non_null(a);
    tn_free(a);
}

/* Independent fp16 decode: sign * 2^(e-15) * (1 + m/1024) / subnormals. */
static float half_decode(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf(1.0f + (float)m / 1024.0f, e - 15);
    return s ? -v : v;
}

static void test_fp16(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float ref = half_decode((uint16_t)h), got = tn_fp16_to_fp32((uint16_t)h);
        if (isnan(ref)) {
            assert_true(isnan(got));
            continue;
        }
        assert_true(ref == got);
        /* round trip of every representable value */
        uint16_t back = tn_fp32_to_fp16(got);
        if (ref != 0.0f) assert_int_equal(back, h);
    }
    /* round to nearest even: halfway between 1 and 1+2^-10 goes to 1 */
    assert_int_equal(tn_fp32_to_fp16(1.0f + ldexpf(1.0f, -11)), 0x3C00);
    assert_int_equal(tn_fp32_to_fp16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3C02);
    assert_int_equal(tn_fp32_to_fp16(1e9f), 0x7C00);
    assert_true(tn_bf16_to_fp32(tn_fp32_to_bf16(1.0f)) == 1.0f);
    assert_int_equal(tn_fp32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3F80);     /* tie -> even */
    assert_int_equal(tn_fp32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)), 0x3F82); /* tie -> even */
}

typedef struct {
    tn_pool *pool;
    int64_t n;
    int *hits;
    int phase_ok;
} pool_arg;

static void pool_task(void *vp, int ith, int nth) {
    pool_arg *a = vp;
    int64_t s, e;
    tn_split(a->n, ith, nth, 1, &s, &e);
    for (int64_t i = s; i < e; i++) a->hits[i]++;
    tn_pool_barrier(a->pool);
    /* after the barrier every element has been written once */
    if (ith == 0) {
        int ok = 1;
        for (int64_t i = 0; i < a->n; i++) ok &= a->hits[i] == 1;
        a->phase_ok = ok;
    }
    tn_pool_barrier(a->pool);
}

static void test_pool(void **state) {
    (void)state;
    for (int nt = 1; nt <= 4; nt++) {
        tn_pool *p = NULL;
        assert_int_equal(tn_pool_create(nt, &p), TERN_OK);
        for (int rep = 0; rep < 50; rep++) {
            int hits[103] = {0};
            pool_arg a = {p, 103, hits, 0};
            tn_pool_run(p, pool_task, &a);
            assert_int_equal(a.phase_ok, 1);
        }
        tn_pool_free(p);
    }
    int64_t s, e, total = 0;
    for (int i = 0; i < 3; i++) {
        tn_split(100, i, 3, 32, &s, &e);
        assert_int_equal(s % 32, 0);
        total += e - s;
    }
    assert_int_equal(total, 100);
    tn_pool *p = NULL;
    assert_int_equal(tn_pool_create(0, &p), TERN_ERR_INVALID_ARG);
    assert_null(p);
}

static void test_wfile(void **state) {
    (void)state;
    char dir[] = "/tmp/tern_core_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/out.bin", dir);
    tn_wfile w;
    assert_int_equal(tn_wfile_open(path, &w), TERN_OK);
    tn_wfile_write(&w, "abc", 3);
    tn_wfile_pad(&w, 5);
    struct stat st;
    assert_int_not_equal(stat(path, &st), 0); /* nothing at the final path before commit */
    assert_int_equal(tn_wfile_commit(&w), TERN_OK);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 8);
    tn_map m;
    assert_int_equal(tn_map_open(path, true, &m), TERN_OK);
    assert_int_equal(m.size, 8);
    assert_memory_equal(m.data, "abc\0\0\0\0\0", 8);
    tn_map_close(&m);
    /* abort leaves the old file intact */
    assert_int_equal(tn_wfile_open(path, &w), TERN_OK);
    tn_wfile_write(&w, "zz", 2);
    tn_wfile_abort(&w);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 8);
    /* /dev/full style failure: a directory that does not exist */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/nodir/x.bin", dir);
    assert_int_equal(tn_wfile_open(bad, &w), TERN_ERR_IO);
    assert_int_equal(tn_map_open(bad, true, &m), TERN_ERR_NOT_FOUND);
    assert_int_equal(tn_map_open(dir, true, &m), TERN_ERR_NOT_FOUND);
    /* a directory as the output: refused at open, the directory untouched */
    assert_int_equal(tn_wfile_open(dir, &w), TERN_ERR_IO);
    assert_non_null(strstr(tern_last_error(), "directory"));
    assert_int_equal(stat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    /* not a regular file (a FIFO here, as /dev/full or /dev/null would be): written in place, the
     * node itself stays (a rename would have replaced it with a file); the reader gets the bytes */
    char fifo[300];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* reader: exit status 7 when it got the 7 bytes; killed after 20 s if no writer comes */
        alarm(20);
        FILE *f = fopen(fifo, "rb");
        char buf[64];
        const size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        _exit(n == 7 && !memcmp(buf, "pipe\0\0\0", 7) ? 7 : 1);
    }
    assert_int_equal(tn_wfile_open(fifo, &w), TERN_OK);
    tn_wfile_write(&w, "pipe", 4);
    tn_wfile_pad(&w, 3);
    assert_int_equal(tn_wfile_commit(&w), TERN_OK);
    int wst = 0;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    assert_true(WIFEXITED(wst));
    assert_int_equal(WEXITSTATUS(wst), 7);
    assert_int_equal(lstat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    unlink(fifo);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_message), cmocka_unit_test(test_alloc_fail), cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_pool),        cmocka_unit_test(test_wfile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
