/*
 * test_peak.c — the read-bandwidth probe of tern bench (src/kern/peak.c, kern/peak.h): the GB/s
 * it reports are bytes / seconds, so every byte it counts must be read. Each read loop (scalar,
 * and the AVX2 / AVX-512 ones this CPU has) is run over buffers with exactly one non-zero word,
 * at every word of small buffers and at the edges of the four streams and of the tail in larger
 * ones: the loop's fold must be non-zero for each (and zero for a zero buffer), so a word the loop
 * skipped shows. Then the probe object: refuses a buffer too small for one page per thread and
 * measures a positive rate otherwise (never a timing threshold). The int8 dot loops' sums wrap on
 * long runs instead of overflowing an int.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/cpu.h"
#include "kern/peak.h"

typedef uint64_t (*read_fn)(const void *, size_t);

static void check_loop(const char *name, read_fn f) {
    static const size_t sizes[] = {64, 128, 448, 512, 576, 4096, 4096 + 192, 65536, 65536 + 448, 1 << 20};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const size_t n = sizes[si], words = n / 8;
        uint64_t *b = aligned_alloc(64, n);
        assert_non_null(b);
        memset(b, 0, n);
        assert_int_equal(f(b, n), 0);
        /* small buffers: every word; large: every word of the first and last 1 KiB of each stream
         * (quarters of 128-byte multiples) and of the tail, plus a stride through the middle */
        const size_t q = n / 4 / 128 * 128;
        for (size_t w = 0; w < words; w++) {
            const size_t byte = w * 8;
            bool edge = n <= 65536;
            for (size_t s = 0; s <= 4 && !edge; s++) {
                const size_t at = s * q;
                edge = (byte + 1024 > at && byte < at + 1024) || byte + 1024 > n;
            }
            if (!edge && w % 97 != 0) continue;
            b[w] = 0x0123456789abcdefULL;
            if (f(b, n) == 0) fail_msg("%s: word %zu of a %zu-byte buffer not read", name, w, n);
            b[w] = 0;
        }
        free(b);
    }
}

static void test_read_loops(void **state) {
    (void)state;
    check_loop("scalar", tn_peak_read__scalar);
    const tn_cpu *c = tn_cpu_get();
    if (c->avx2) check_loop("avx2", tn_peak_read__avx2);
    if (c->avx512f && c->avx512bw) check_loop("avx512", tn_peak_read__avx512);
}

/* The int8 dot loops on runs long enough that their chains pass the int32 range (the probe times
 * as many rounds as the machine's speed asks for; a loaded machine asked for more than the sums
 * held, and the AVX-512 sum overflowed an int, which UBSan stops): the result wraps, as the
 * registers do. AVX-512 VNNI: each round adds 4 x 3 x (-5) = -60 to every lane of the 16 chains
 * (chain j starts at j), so the 256 lanes sum to 16 x (0 + .. + 15) - 15360 rounds, mod 2^32. */
static void test_dot_loops_wrap(void **state) {
    (void)state;
    const int64_t rounds = 300000; /* 15360 x 300000 = 4.6e9: past 2^31 and 2^32 */
    const tn_cpu *c = tn_cpu_get();
    if (c->avx512f && c->avx512bw && c->avx512vnni) {
        const uint32_t want = (uint32_t)(16u * 120u) - (uint32_t)(15360u * (uint64_t)rounds % 4294967296u);
        assert_int_equal(tn_peak_dot__avx512(rounds), want);
        assert_int_equal(tn_peak_dot__avx512(0), 16u * 120u);
    }
    if (c->avx2) (void)tn_peak_dot__avx2(rounds); /* (under UBSan in CI: no signed overflow) */
    assert_true(tn_peak_dot_gops(1) > 0);
}

static void test_probe(void **state) {
    (void)state;
    assert_null(tn_read_probe_new(2, 4096)); /* less than a page per thread */
    assert_null(tn_read_probe_new(1, 100));
    tn_read_probe *p = tn_read_probe_new(2, (size_t)8 << 20);
    assert_non_null(p);
    for (int i = 0; i < 3; i++) assert_true(tn_read_probe_gbs(p) > 0);
    tn_read_probe_free(p);
    tn_read_probe_free(NULL);
    assert_true(tn_peak_read_gbs(1, (size_t)4 << 20, 2) > 0);
    assert_true(tn_peak_read_gbs(1, 100, 2) == 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_loops),
        cmocka_unit_test(test_dot_loops_wrap),
        cmocka_unit_test(test_probe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
