/*
 * test_matmul_share.c — tn_matmul_share (src/kern/matmul.c), the adaptive row sharing of one-token
 * matmuls: whatever order and speed the threads claim in, every row of the matrix is handed out
 * exactly once, each thread's first range is its static share, and range starts are multiples of
 * 32 when m is (the interleaved weight layouts need whole 16- and 32-row groups). Threads are
 * simulated: callers take turns in a random order, some taking many turns in a row (a fast
 * thread) and some none until the end (a stalled one).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/test_rng.h"
#include "core/base.h"
#include "kern/matmul.h"

static void check(int64_t m, int nth, int stalled) {
    atomic_int next;
    atomic_init(&next, 0);
    int step[8] = {0};
    bool done[8] = {false};
    uint8_t *seen = calloc((size_t)m, 1);
    int left = nth;
    while (left > 0) {
        int t = (int)(rng_u64() % (uint64_t)nth);
        if (done[t] || (t == stalled && left > 1)) continue; /* the stalled thread waits for the rest */
        const int burst = 1 + (int)(rng_u64() % 3);
        for (int b = 0; b < burst && !done[t]; b++) {
            int64_t r0, r1;
            const bool first = step[t] == 0;
            if (!tn_matmul_share(&next, m, t, nth, &step[t], &r0, &r1)) {
                done[t] = true, left--;
                break;
            }
            assert_true(r0 < r1 && r0 >= 0 && r1 <= m);
            if (m % 32 == 0) assert_int_equal(r0 % 32, 0);
            if (first) { /* the static share of the first rows (tn_split), unless that is empty */
                const int64_t head = m - TN_MIN(m, (m / 8 + 31) / 32 * 32);
                int64_t s0, s1;
                tn_split(head, t, nth, 32, &s0, &s1);
                if (s1 > s0) assert_true(r0 == s0 && r1 == s1);
                else assert_true(r0 >= head);
            }
            for (int64_t i = r0; i < r1; i++) {
                if (seen[i]) fail_msg("m=%lld nth=%d: row %lld handed out twice", (long long)m, nth, (long long)i);
                seen[i] = 1;
            }
        }
    }
    for (int64_t i = 0; i < m; i++)
        if (!seen[i]) fail_msg("m=%lld nth=%d: row %lld never handed out", (long long)m, nth, (long long)i);
    free(seen);
}

static void test_every_row_once(void **state) {
    (void)state;
    const int64_t ms[] = {1, 31, 32, 33, 64, 100, 512, 2048, 8192, 32000, 32001};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (int nth = 1; nth <= 8; nth++)
            for (int rep = 0; rep < 4; rep++) check(ms[i], nth, rep % 2 ? (int)(rng_u64() % (uint64_t)nth) : -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_row_once)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
