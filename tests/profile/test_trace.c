/*
 * test_trace.c — core/trace: events recorded per thread in order with their args, spans from
 * several threads kept apart, the buffer-full path (a full buffer stops its thread's recording,
 * counts what it dropped, never grows or crashes), off = nothing recorded, restart frees the
 * previous run.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "core/trace.h"

static void test_off_records_nothing(void **state) {
    (void)state;
    tn_trace_reset();
    TN_SPAN_B(TN_TK_MATMUL, "mm", 0, 1, 2, 3, 4);
    TN_SPAN_E(TN_TK_MATMUL, "mm", 0, 5, 6);
    const tn_trace_thread *th;
    assert_int_equal(tn_trace_threads(&th), 0);
}

static void test_records_in_order(void **state) {
    (void)state;
    tn_trace_thread_name("main %d", 7);
    assert_int_equal(tn_trace_start(64), TERN_OK);
    TN_SPAN_B(TN_TK_MATMUL, "attn_q", 3, 8, 256, 512, 1);
    TN_TRACE_COUNTER("rows", 2.5);
    TN_SPAN_E(TN_TK_MATMUL, "attn_q", 3, 128, 4096);
    TN_SPAN_NEXT(TN_TK_LAYER, "layer", 0, TN_TK_LAYER, "layer", 1);
    TN_TRACE_INSTANT(TN_TK_STEP, "kv_cache_exhausted", -1);
    tn_trace_stop();
    TN_SPAN_B(TN_TK_NORM, "after stop", -1, 0, 0, 0, 0); /* not recorded */
    const tn_trace_thread *th;
    assert_int_equal(tn_trace_threads(&th), 1);
    assert_string_equal(th[0].name, "main 7");
    assert_int_equal(th[0].n, 6);
    assert_int_equal(th[0].dropped, 0);
    const tn_trace_ev *e = th[0].ev;
    assert_int_equal(e[0].ph, 'B');
    assert_int_equal(e[0].kind, TN_TK_MATMUL);
    assert_string_equal(e[0].name, "attn_q");
    assert_int_equal(e[0].il, 3);
    assert_int_equal(e[0].a[0], 8);
    assert_int_equal(e[0].a[3], 1);
    assert_int_equal(e[1].ph, 'C');
    assert_true(e[1].d[0] == 2.5);
    assert_int_equal(e[2].ph, 'E');
    assert_int_equal(e[2].a[1], 4096);
    for (int i = 1; i < 6; i++) assert_true(e[i].ts >= e[i - 1].ts); /* monotonic */
    assert_int_equal(e[3].ph, 'E');
    assert_int_equal(e[4].ph, 'B');
    assert_true(e[3].ts == e[4].ts); /* back to back: one instant */
    assert_int_equal(e[5].ph, 'i');
    assert_string_equal(e[5].name, "kv_cache_exhausted");
    tn_trace_reset();
    assert_int_equal(tn_trace_threads(&th), 0);
}

static void test_buffer_full(void **state) {
    (void)state;
    assert_int_equal(tn_trace_start(16), TERN_OK);
    for (int i = 0; i < 1000; i++) {
        TN_SPAN_B(TN_TK_NORM, "norm", i, 0, 0, 0, 0);
        TN_SPAN_E(TN_TK_NORM, "norm", i, 0, 0);
    }
    TN_TRACE_COUNTER("c", 1);
    tn_trace_stop();
    const tn_trace_thread *th;
    assert_int_equal(tn_trace_threads(&th), 1);
    assert_int_equal(th[0].n, 16);           /* kept what fitted, in order */
    assert_int_equal(th[0].dropped, 2000 + 1 - 16);
    assert_int_equal(th[0].ev[15].il, 7);    /* the 8th span's end */
    assert_int_equal(th[0].ev[15].ph, 'E');
    /* a new run starts empty with fresh buffers */
    assert_int_equal(tn_trace_start(16), TERN_OK);
    TN_SPAN_B(TN_TK_NORM, "norm", 0, 0, 0, 0, 0);
    tn_trace_stop();
    assert_int_equal(tn_trace_threads(&th), 1);
    assert_int_equal(th[0].n, 1);
    assert_int_equal(th[0].dropped, 0);
    tn_trace_reset();
}

#define N_THR 4
#define N_SPANS 5000
static void *worker(void *arg) {
    const int id = (int)(intptr_t)arg;
    tn_trace_thread_name("w %d", id);
    for (int i = 0; i < N_SPANS; i++) {
        TN_SPAN_B(TN_TK_MATMUL, "mm", id, i, 0, 0, 0);
        TN_SPAN_E(TN_TK_MATMUL, "mm", id, i, 0);
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    /* room for 3000 events per thread: each thread drops its own overflow, independently */
    assert_int_equal(tn_trace_start(3000), TERN_OK);
    pthread_t t[N_THR];
    for (int i = 0; i < N_THR; i++) assert_int_equal(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i), 0);
    for (int i = 0; i < N_THR; i++) pthread_join(t[i], NULL);
    tn_trace_stop();
    const tn_trace_thread *th;
    assert_int_equal(tn_trace_threads(&th), N_THR);
    int seen = 0;
    for (int i = 0; i < N_THR; i++) {
        assert_int_equal(th[i].tid, i + 1);
        assert_int_equal(th[i].n, 3000);
        assert_int_equal(th[i].dropped, 2 * N_SPANS - 3000);
        const int id = th[i].ev[0].il;
        assert_true(id >= 0 && id < N_THR);
        seen |= 1 << id;
        char want[32];
        snprintf(want, sizeof want, "w %d", id);
        assert_string_equal(th[i].name, want);
        for (int64_t k = 0; k < th[i].n; k++) { /* only its own events, in order */
            assert_int_equal(th[i].ev[k].il, id);
            assert_int_equal(th[i].ev[k].a[0], k / 2);
            assert_int_equal(th[i].ev[k].ph, k % 2 ? 'E' : 'B');
        }
    }
    assert_int_equal(seen, (1 << N_THR) - 1);
    tn_trace_reset();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_off_records_nothing), cmocka_unit_test(test_records_in_order),
                                       cmocka_unit_test(test_buffer_full), cmocka_unit_test(test_threads)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
