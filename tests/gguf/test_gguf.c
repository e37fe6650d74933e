/*
 * test_gguf.c — GGUF writer → reader round trips (every value type, tensors of several types,
 * borrowed data and fill callbacks, custom alignment), typed getters, value formatting, writer
 * argument validation, atomic file output, path-prefixed errors, and allocation-failure loops
 * over parse, open and write (every N-th allocation fails: result is OK or NOMEM, never a crash
 * or a leak — the ASan build checks the leak part).
 */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/base.h"
#include "fmt/gguf.h"
#include "tensor/dtype.h"

static const char *tmp_dir(void) {
    const char *t = getenv("TERN_TEST_TMP");
    return t && *t ? t : "/tmp";
}

/* Adds a valid seed to the generated fuzz corpus ($TERN_TEST_TMP/gguf-corpus, see tests/fuzz). */
static void corpus_save(const char *name, const uint8_t *p, size_t n) {
    const char *t = getenv("TERN_TEST_TMP");
    if (!t || !*t) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/gguf-corpus", t);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/gguf-corpus/%s.gguf", t, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(p, 1, n, f);
    fclose(f);
}

static tn_gguf_kv raw_kv(const char *key, uint32_t type) {
    tn_gguf_kv kv = {0};
    kv.key.data = key;
    kv.key.len = strlen(key);
    kv.type = type;
    return kv;
}

/* Writer holding one key of every type plus arrays of every element type. */
static tern_status build_kvs(tn_gguf_writer *w) {
    tern_status st;
#define TRY(x) if ((st = (x))) return st
    TRY(tn_gguf_set_str(w, "general.architecture", "llama"));
    TRY(tn_gguf_set_u32(w, "t.u32", 4000000000u));
    TRY(tn_gguf_set_i32(w, "t.i32", -123456));
    TRY(tn_gguf_set_u64(w, "t.u64", UINT64_MAX));
    TRY(tn_gguf_set_f32(w, "t.f32", 1e-5f));
    TRY(tn_gguf_set_bool(w, "t.bool", true));
    tn_gguf_kv kv = raw_kv("t.u8", TN_GGUF_U8);
    kv.v.u64 = 200;
    TRY(tn_gguf_set_kv(w, &kv));
    kv = raw_kv("t.i8", TN_GGUF_I8);
    kv.v.i64 = -100;
    TRY(tn_gguf_set_kv(w, &kv));
    kv = raw_kv("t.u16", TN_GGUF_U16);
    kv.v.u64 = 65535;
    TRY(tn_gguf_set_kv(w, &kv));
    kv = raw_kv("t.i16", TN_GGUF_I16);
    kv.v.i64 = -32768;
    TRY(tn_gguf_set_kv(w, &kv));
    kv = raw_kv("t.i64", TN_GGUF_I64);
    kv.v.i64 = INT64_MIN;
    TRY(tn_gguf_set_kv(w, &kv));
    kv = raw_kv("t.f64", TN_GGUF_F64);
    kv.v.f64 = 3.141592653589793;
    TRY(tn_gguf_set_kv(w, &kv));
    kv = raw_kv("t.str_nul", TN_GGUF_STRING);
    kv.v.str.data = "a\0b";
    kv.v.str.len = 3;
    TRY(tn_gguf_set_kv(w, &kv));
    TRY(tn_gguf_set_str(w, "t.empty", ""));
    /* arrays of every fixed type: elements 0..n-1 encoded per type */
    static const uint32_t types[] = {TN_GGUF_U8, TN_GGUF_I8, TN_GGUF_U16, TN_GGUF_I16, TN_GGUF_U32, TN_GGUF_I32,
                                     TN_GGUF_F32, TN_GGUF_BOOL, TN_GGUF_U64, TN_GGUF_I64, TN_GGUF_F64};
    for (size_t i = 0; i < TN_ARRAY_LEN(types); i++) {
        uint8_t data[8 * 5];
        for (int j = 0; j < 5; j++) {
            int64_t v = types[i] == TN_GGUF_BOOL ? j & 1 : (j - 2);
            if (types[i] == TN_GGUF_F32) { float f = (float)v * 0.5f; memcpy(data + 4 * j, &f, 4); }
            else if (types[i] == TN_GGUF_F64) { double d = (double)v * 0.25; memcpy(data + 8 * j, &d, 8); }
            else {
                size_t sz = types[i] == TN_GGUF_U8 || types[i] == TN_GGUF_I8 || types[i] == TN_GGUF_BOOL ? 1
                          : types[i] == TN_GGUF_U16 || types[i] == TN_GGUF_I16 ? 2
                          : types[i] == TN_GGUF_U32 || types[i] == TN_GGUF_I32 ? 4 : 8;
                memcpy(data + sz * j, &v, sz);
            }
        }
        char key[32];
        snprintf(key, sizeof key, "arr.%s", tn_gguf_type_name(types[i]));
        TRY(tn_gguf_set_arr(w, key, types[i], data, 5));
    }
    const char *toks[] = {"<unk>", "", "hello \"world\"", "\xe2\x96\x81the"};
    TRY(tn_gguf_set_arr_str(w, "arr.string", toks, 4));
    TRY(tn_gguf_set_arr(w, "arr.empty", TN_GGUF_F32, NULL, 0));
#undef TRY
    return TERN_OK;
}

static void test_roundtrip_values(void **state) {
    (void)state;
    tn_gguf_writer *w = NULL;
    assert_int_equal(tn_gguf_writer_create(&w), TERN_OK);
    assert_int_equal(build_kvs(w), TERN_OK);
    /* replace keeps the first position; remove drops */
    assert_int_equal(tn_gguf_set_u32(w, "t.replace", 1), TERN_OK);
    assert_int_equal(tn_gguf_set_str(w, "t.replace", "two"), TERN_OK);
    assert_int_equal(tn_gguf_set_u32(w, "t.gone", 1), TERN_OK);
    assert_int_equal(tn_gguf_remove(w, "t.gone"), TERN_OK);
    assert_int_equal(tn_gguf_remove(w, "t.never"), TERN_OK);
    uint8_t *buf = NULL;
    size_t size = 0;
    assert_int_equal(tn_gguf_write_mem(w, NULL, NULL, &buf, &size), TERN_OK);
    tn_gguf_writer_free(w);

    corpus_save("ok_all_types", buf, size);
    tn_gguf *g = NULL;
    assert_int_equal(tn_gguf_parse(buf, size, &g), TERN_OK);
    assert_int_equal(g->version, 3);
    assert_int_equal(g->n_tensors, 0);
    assert_int_equal(g->n_kv, 28);
    assert_true(tn_gguf_str_eq(g->kv[0].key, "general.architecture"));
    assert_true(tn_gguf_str_eq(g->kv[26].key, "arr.empty"));
    assert_true(tn_gguf_str_eq(g->kv[27].key, "t.replace"));
    assert_int_equal(g->kv[27].type, TN_GGUF_STRING);
    assert_null(tn_gguf_find(g, "t.gone"));
    assert_int_equal(tn_gguf_find_index(g, "t.u32"), 1);
    assert_int_equal(tn_gguf_find_index(g, "nope"), -1);

    const tn_gguf_kv *kv;
    assert_non_null(kv = tn_gguf_find(g, "t.u32"));
    assert_int_equal(kv->type, TN_GGUF_U32);
    assert_int_equal(kv->v.u64, 4000000000u);
    assert_int_equal(tn_gguf_find(g, "t.i32")->v.i64, -123456);
    assert_true(tn_gguf_find(g, "t.u64")->v.u64 == UINT64_MAX);
    assert_true(tn_gguf_find(g, "t.f32")->v.f64 == (double)1e-5f);
    assert_int_equal(tn_gguf_find(g, "t.bool")->v.u64, 1);
    assert_int_equal(tn_gguf_find(g, "t.u8")->v.u64, 200);
    assert_int_equal(tn_gguf_find(g, "t.u8")->type, TN_GGUF_U8);
    assert_int_equal(tn_gguf_find(g, "t.i8")->v.i64, -100);
    assert_int_equal(tn_gguf_find(g, "t.u16")->v.u64, 65535);
    assert_int_equal(tn_gguf_find(g, "t.i16")->v.i64, -32768);
    assert_true(tn_gguf_find(g, "t.i64")->v.i64 == INT64_MIN);
    assert_true(tn_gguf_find(g, "t.f64")->v.f64 == 3.141592653589793);
    kv = tn_gguf_find(g, "t.str_nul");
    assert_int_equal(kv->v.str.len, 3);
    assert_memory_equal(kv->v.str.data, "a\0b", 3);
    assert_true(tn_gguf_str_eq(tn_gguf_find(g, "t.empty")->v.str, ""));
    assert_true(tn_gguf_str_eq(tn_gguf_find(g, "t.replace")->v.str, "two"));

    kv = tn_gguf_find(g, "arr.i16");
    assert_int_equal(kv->type, TN_GGUF_ARRAY);
    assert_int_equal(kv->arr_type, TN_GGUF_I16);
    assert_int_equal(kv->arr_n, 5);
    int16_t i16[5];
    memcpy(i16, kv->arr_data, sizeof i16);
    assert_int_equal(i16[0], -2);
    assert_int_equal(i16[4], 2);
    kv = tn_gguf_find(g, "arr.f64");
    double d64[5];
    memcpy(d64, kv->arr_data, sizeof d64);
    assert_true(d64[1] == -0.25);
    kv = tn_gguf_find(g, "arr.bool");
    assert_memory_equal(kv->arr_data, "\0\1\0\1\0", 5);
    kv = tn_gguf_find(g, "arr.string");
    assert_int_equal(kv->arr_type, TN_GGUF_STRING);
    assert_int_equal(kv->arr_n, 4);
    assert_true(tn_gguf_str_eq(kv->arr_strs[0], "<unk>"));
    assert_true(tn_gguf_str_eq(kv->arr_strs[1], ""));
    assert_true(tn_gguf_str_eq(kv->arr_strs[3], "\xe2\x96\x81the"));
    char *dup = tn_gguf_str_dup(kv->arr_strs[2]);
    assert_string_equal(dup, "hello \"world\"");
    tn_free(dup);
    assert_int_equal(tn_gguf_find(g, "arr.empty")->arr_n, 0);

    /* copying every kv through set_kv reproduces the same bytes */
    tn_gguf_writer *w2 = NULL;
    assert_int_equal(tn_gguf_writer_create(&w2), TERN_OK);
    for (uint64_t i = 0; i < g->n_kv; i++) assert_int_equal(tn_gguf_set_kv(w2, &g->kv[i]), TERN_OK);
    uint8_t *buf2 = NULL;
    size_t size2 = 0;
    assert_int_equal(tn_gguf_write_mem(w2, NULL, NULL, &buf2, &size2), TERN_OK);
    assert_int_equal(size2, size);
    assert_memory_equal(buf2, buf, size);
    tn_free(buf2);
    tn_gguf_writer_free(w2);
    tn_gguf_free(g);
    tn_free(buf);
}

typedef struct tdesc {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[4];
    bool fill; /* produced by the callback instead of borrowed */
} tdesc;

static const tdesc tensors[] = {
    {"token_embd.weight", TN_F32, 2, {16, 3}, false},
    {"blk.0.attn_q.weight", TN_Q8_0, 2, {64, 2}, true},
    {"blk.0.ffn_up.weight", TN_Q4_K, 2, {256, 2}, false},
    {"blk.0.ffn_down.weight", TN_Q6_K, 1, {256}, true},
    {"blk.0.attn_norm.weight", TN_F16, 1, {5}, false},
    {"bf", TN_BF16, 4, {2, 3, 1, 2}, true},
    {"iq", 16 /* iq2_xxs: known, not computed */, 1, {256}, false},
    {"empty", TN_F32, 2, {4, 0}, false},
    {"q4_0", TN_Q4_0, 3, {32, 1, 3}, false},
};

static size_t tbytes(const tdesc *t) {
    size_t rows = 1;
    for (uint32_t d = 1; d < t->n_dims; d++) rows *= (size_t)t->ne[d];
    return tn_dtype_row_size(t->type, t->ne[0]) * rows;
}

static uint8_t pattern(size_t ti, size_t j) { return (uint8_t)(ti * 31 + j * 7 + 3); }

static tern_status fill_cb(void *user, size_t index, void *dst, size_t nbytes) {
    int *calls = user;
    (*calls)++;
    assert_true(tensors[index].fill);
    assert_int_equal(nbytes, tbytes(&tensors[index]));
    for (size_t j = 0; j < nbytes; j++) ((uint8_t *)dst)[j] = pattern(index, j);
    return TERN_OK;
}

static tern_status fill_any(void *user, size_t index, void *dst, size_t nbytes) {
    (void)user;
    for (size_t j = 0; j < nbytes; j++) ((uint8_t *)dst)[j] = pattern(index, j);
    return TERN_OK;
}

static uint8_t *tensor_data[TN_ARRAY_LEN(tensors)];

static tn_gguf_writer *build_model(uint32_t alignment) {
    tn_gguf_writer *w = NULL;
    assert_int_equal(tn_gguf_writer_create(&w), TERN_OK);
    assert_int_equal(tn_gguf_set_str(w, "general.architecture", "llama"), TERN_OK);
    if (alignment) assert_int_equal(tn_gguf_set_u32(w, "general.alignment", alignment), TERN_OK);
    for (size_t i = 0; i < TN_ARRAY_LEN(tensors); i++) {
        const tdesc *t = &tensors[i];
        size_t n = tbytes(t);
        if (!tensor_data[i]) {
            tensor_data[i] = malloc(n ? n : 1);
            for (size_t j = 0; j < n; j++) tensor_data[i][j] = pattern(i, j);
        }
        assert_int_equal(tn_gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->fill ? NULL : tensor_data[i]), TERN_OK);
    }
    return w;
}

static void check_model(const tn_gguf *g, uint32_t alignment) {
    uint32_t a = alignment ? alignment : 32;
    assert_int_equal(g->alignment, a);
    assert_int_equal(g->data_offset % a, 0);
    assert_int_equal(g->n_tensors, TN_ARRAY_LEN(tensors));
    uint64_t off = 0;
    for (size_t i = 0; i < TN_ARRAY_LEN(tensors); i++) {
        const tdesc *t = &tensors[i];
        const tn_gguf_tensor *gt = tn_gguf_find_tensor(g, t->name);
        assert_ptr_equal(gt, &g->tensors[i]);
        assert_string_equal(gt->name, t->name);
        assert_int_equal(gt->type, t->type);
        assert_int_equal(gt->n_dims, t->n_dims);
        for (uint32_t d = 0; d < 4; d++) assert_int_equal(gt->ne[d], d < t->n_dims ? t->ne[d] : 1);
        assert_int_equal(gt->nbytes, tbytes(t));
        assert_int_equal(gt->offset, off);
        assert_ptr_equal(gt->data, g->base + g->data_offset + off);
        for (size_t j = 0; j < gt->nbytes; j++) assert_int_equal(gt->data[j], pattern(i, j));
        off += (gt->nbytes + a - 1) / a * a;
    }
    assert_int_equal(g->size, g->data_offset + off);
    assert_null(tn_gguf_find_tensor(g, "missing"));
}

static void test_roundtrip_tensors(void **state) {
    (void)state;
    uint32_t aligns[] = {0, 64, 1, 4096};
    for (size_t k = 0; k < TN_ARRAY_LEN(aligns); k++) {
        tn_gguf_writer *w = build_model(aligns[k]);
        int calls = 0;
        uint8_t *buf = NULL;
        size_t size = 0;
        assert_int_equal(tn_gguf_write_mem(w, fill_cb, &calls, &buf, &size), TERN_OK);
        assert_int_equal(calls, 3);
        tn_gguf_writer_free(w);
        if (aligns[k] == 64) corpus_save("ok_tensor_types", buf, size);
        tn_gguf *g = NULL;
        assert_int_equal(tn_gguf_parse(buf, size, &g), TERN_OK);
        check_model(g, aligns[k]);
        tn_gguf_free(g);
        tn_free(buf);
    }
}

static void test_getters(void **state) {
    (void)state;
    tn_gguf_writer *w = NULL;
    assert_int_equal(tn_gguf_writer_create(&w), TERN_OK);
    assert_int_equal(build_kvs(w), TERN_OK);
    tn_gguf_kv kv = raw_kv("t.neg", TN_GGUF_I32);
    kv.v.i64 = -1;
    assert_int_equal(tn_gguf_set_kv(w, &kv), TERN_OK);
    uint8_t *buf = NULL;
    size_t size = 0;
    assert_int_equal(tn_gguf_write_mem(w, NULL, NULL, &buf, &size), TERN_OK);
    tn_gguf_writer_free(w);
    tn_gguf *g = NULL;
    assert_int_equal(tn_gguf_parse(buf, size, &g), TERN_OK);

    int64_t i64 = 7;
    uint32_t u32 = 7;
    float f = 0;
    bool b = false;
    tn_gguf_str s = {0};
    const tn_gguf_kv *arr = NULL;
    /* absent, optional: OK and untouched; absent, required: FORMAT naming the key */
    assert_int_equal(tn_gguf_get_i64(g, "no.such", false, &i64), TERN_OK);
    assert_int_equal(i64, 7);
    assert_int_equal(tn_gguf_get_u32(g, "no.such", true, &u32), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "missing key 'no.such'"));
    assert_int_equal(u32, 7);
    /* integer widening and range checks */
    assert_int_equal(tn_gguf_get_i64(g, "t.u8", true, &i64), TERN_OK);
    assert_int_equal(i64, 200);
    assert_int_equal(tn_gguf_get_i64(g, "t.i64", true, &i64), TERN_OK);
    assert_true(i64 == INT64_MIN);
    assert_int_equal(tn_gguf_get_i64(g, "t.u64", true, &i64), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "'t.u64'"));
    assert_non_null(strstr(tern_last_error(), "does not fit in i64"));
    assert_int_equal(tn_gguf_get_u32(g, "t.u32", true, &u32), TERN_OK);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(tn_gguf_get_u32(g, "t.i16", true, &u32), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "= -32768 does not fit in u32"));
    assert_int_equal(tn_gguf_get_u32(g, "t.neg", true, &u32), TERN_ERR_FORMAT);
    assert_int_equal(tn_gguf_get_u32(g, "t.u64", true, &u32), TERN_ERR_FORMAT);
    assert_int_equal(tn_gguf_get_u32(g, "t.f32", true, &u32), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "key 't.f32'"));
    assert_non_null(strstr(tern_last_error(), "has type f32, expected an integer"));
    /* floats */
    assert_int_equal(tn_gguf_get_f32(g, "t.f32", true, &f), TERN_OK);
    assert_true(f == 1e-5f);
    assert_int_equal(tn_gguf_get_f32(g, "t.f64", true, &f), TERN_OK);
    assert_true(fabsf(f - 3.1415927f) < 1e-6f);
    assert_int_equal(tn_gguf_get_f32(g, "t.u32", true, &f), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "has type u32, expected f32"));
    /* bool, string */
    assert_int_equal(tn_gguf_get_bool(g, "t.bool", true, &b), TERN_OK);
    assert_true(b);
    assert_int_equal(tn_gguf_get_bool(g, "t.u8", true, &b), TERN_ERR_FORMAT);
    assert_int_equal(tn_gguf_get_str(g, "general.architecture", true, &s), TERN_OK);
    assert_true(tn_gguf_str_eq(s, "llama"));
    assert_false(tn_gguf_str_eq(s, "llam"));
    assert_false(tn_gguf_str_eq(s, "llamas"));
    assert_int_equal(tn_gguf_get_str(g, "t.u8", true, &s), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "key 't.u8' (offset"));
    assert_non_null(strstr(tern_last_error(), "has type u8, expected string"));
    /* arrays */
    assert_int_equal(tn_gguf_get_arr(g, "arr.string", true, TN_GGUF_STRING, &arr), TERN_OK);
    assert_int_equal(arr->arr_n, 4);
    arr = NULL;
    assert_int_equal(tn_gguf_get_arr(g, "arr.i8", true, TN_GGUF_TYPE_COUNT, &arr), TERN_OK);
    assert_int_equal(arr->arr_type, TN_GGUF_I8);
    assert_int_equal(tn_gguf_get_arr(g, "arr.i8", true, TN_GGUF_F32, &arr), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "is an array of i8, expected an array of f32"));
    assert_int_equal(tn_gguf_get_arr(g, "t.u8", true, TN_GGUF_F32, &arr), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "has type u8, expected array of f32"));
    tn_gguf_free(g);
    tn_free(buf);
}

static void fmt_kv(tn_gguf *g, const char *key, char *buf, size_t cap) {
    const tn_gguf_kv *kv = tn_gguf_find(g, key);
    assert_non_null(kv);
    tn_gguf_kv_format(kv, buf, cap);
}

static void test_format(void **state) {
    (void)state;
    tn_gguf_writer *w = NULL;
    assert_int_equal(tn_gguf_writer_create(&w), TERN_OK);
    assert_int_equal(build_kvs(w), TERN_OK);
    char long_str[201];
    memset(long_str, 'x', 200);
    long_str[200] = 0;
    long_str[3] = '\n';
    assert_int_equal(tn_gguf_set_str(w, "t.long", long_str), TERN_OK);
    static float big[512];
    for (int i = 0; i < 512; i++) big[i] = (float)i * 0.5f;
    assert_int_equal(tn_gguf_set_arr(w, "t.big", TN_GGUF_F32, big, 512), TERN_OK);
    static const char *many[1000];
    for (int i = 0; i < 1000; i++) many[i] = i == 0 ? "<unk>" : "tok";
    assert_int_equal(tn_gguf_set_arr_str(w, "t.many", many, 1000), TERN_OK);
    uint8_t *buf = NULL;
    size_t size = 0;
    assert_int_equal(tn_gguf_write_mem(w, NULL, NULL, &buf, &size), TERN_OK);
    tn_gguf_writer_free(w);
    tn_gguf *g = NULL;
    assert_int_equal(tn_gguf_parse(buf, size, &g), TERN_OK);

    char out[256];
    fmt_kv(g, "t.u32", out, sizeof out);
    assert_string_equal(out, "4000000000");
    fmt_kv(g, "t.i32", out, sizeof out);
    assert_string_equal(out, "-123456");
    fmt_kv(g, "t.f32", out, sizeof out);
    assert_string_equal(out, "9.99999975e-06");
    fmt_kv(g, "t.f64", out, sizeof out);
    assert_string_equal(out, "3.1415926535897931");
    fmt_kv(g, "t.bool", out, sizeof out);
    assert_string_equal(out, "true");
    fmt_kv(g, "t.i8", out, sizeof out);
    assert_string_equal(out, "-100");
    fmt_kv(g, "general.architecture", out, sizeof out);
    assert_string_equal(out, "\"llama\"");
    fmt_kv(g, "t.str_nul", out, sizeof out);
    assert_string_equal(out, "\"a\\x00b\"");
    fmt_kv(g, "t.long", out, sizeof out);
    assert_non_null(strstr(out, "\"xxx\\nxxxx"));
    assert_non_null(strstr(out, "...\" (200 bytes)"));
    assert_true(strlen(out) < 110);
    fmt_kv(g, "arr.i16", out, sizeof out);
    assert_string_equal(out, "[-2, -1, 0, 1, 2]");
    fmt_kv(g, "arr.bool", out, sizeof out);
    assert_string_equal(out, "[false, true, false, true, false]");
    fmt_kv(g, "arr.f32", out, sizeof out);
    assert_string_equal(out, "[-1, -0.5, 0, 0.5, 1]");
    fmt_kv(g, "arr.string", out, sizeof out);
    assert_string_equal(out, "[\"<unk>\", \"\", \"hello \\\"world\\\"\", \"\xe2\x96\x81the\"]");
    fmt_kv(g, "arr.empty", out, sizeof out);
    assert_string_equal(out, "[]");
    fmt_kv(g, "t.big", out, sizeof out);
    assert_string_equal(out, "[f32 x 512: 0, 0.5, 1, ...]");
    fmt_kv(g, "t.many", out, sizeof out);
    assert_string_equal(out, "[1000 strings: \"<unk>\", \"tok\", \"tok\", ...]");
    /* tiny buffers: always terminated, never overrun (ASan checks the heap copy) */
    for (size_t cap = 1; cap < 40; cap++) {
        char *small = malloc(cap);
        fmt_kv(g, "t.many", small, cap);
        assert_true(strlen(small) < cap);
        fmt_kv(g, "t.long", small, cap);
        assert_true(strlen(small) < cap);
        fmt_kv(g, "t.f64", small, cap);
        assert_true(strlen(small) < cap);
        free(small);
    }
    tn_gguf_kv_format(tn_gguf_find(g, "t.u8"), out, 0); /* cap 0: no write */
    assert_string_equal(tn_gguf_type_name(TN_GGUF_F64), "f64");
    assert_string_equal(tn_gguf_type_name(99), "invalid");
    tn_gguf_free(g);
    tn_free(buf);
}

static void test_writer_validation(void **state) {
    (void)state;
    tn_gguf_writer *w = NULL;
    assert_int_equal(tn_gguf_writer_create(&w), TERN_OK);
    int64_t ne[4] = {32, 2, 1, 1};
    char name64[65];
    memset(name64, 'n', 64);
    name64[64] = 0;
    assert_int_equal(tn_gguf_add_tensor(w, name64, TN_F32, 2, ne, NULL), TERN_ERR_INVALID_ARG);
    assert_non_null(strstr(tern_last_error(), "has 64 bytes, must be 1..63"));
    name64[63] = 0;
    assert_int_equal(tn_gguf_add_tensor(w, name64, TN_F32, 2, ne, NULL), TERN_OK);
    assert_int_equal(tn_gguf_add_tensor(w, name64, TN_F32, 2, ne, NULL), TERN_ERR_INVALID_ARG);
    assert_non_null(strstr(tern_last_error(), "duplicate tensor name"));
    assert_int_equal(tn_gguf_add_tensor(w, "", TN_F32, 2, ne, NULL), TERN_ERR_INVALID_ARG);
    assert_int_equal(tn_gguf_add_tensor(w, "a", TN_F32, 0, ne, NULL), TERN_ERR_INVALID_ARG);
    assert_non_null(strstr(tern_last_error(), "n_dims 0 is not in 1..4"));
    assert_int_equal(tn_gguf_add_tensor(w, "a", TN_F32, 5, ne, NULL), TERN_ERR_INVALID_ARG);
    assert_int_equal(tn_gguf_add_tensor(w, "a", 4, 2, ne, NULL), TERN_ERR_UNSUPPORTED);
    assert_non_null(strstr(tern_last_error(), "unsupported tensor type type#4 (4)"));
    int64_t bad[2] = {100, 1};
    assert_int_equal(tn_gguf_add_tensor(w, "a", TN_Q4_K, 2, bad, NULL), TERN_ERR_INVALID_ARG);
    assert_non_null(strstr(tern_last_error(), "not a multiple of the q4_K block size 256"));
    int64_t neg[2] = {32, -1};
    assert_int_equal(tn_gguf_add_tensor(w, "a", TN_F32, 2, neg, NULL), TERN_ERR_INVALID_ARG);
    int64_t huge[4] = {(int64_t)1 << 40, (int64_t)1 << 40, 1, 1};
    assert_int_equal(tn_gguf_add_tensor(w, "a", TN_F32, 2, huge, NULL), TERN_ERR_INVALID_ARG);
    /* keys */
    assert_int_equal(tn_gguf_set_u32(w, "", 1), TERN_ERR_INVALID_ARG);
    assert_int_equal(tn_gguf_set_u32(w, "has space", 1), TERN_ERR_INVALID_ARG);
    assert_int_equal(tn_gguf_set_str(w, "k", NULL), TERN_ERR_INVALID_ARG);
    uint8_t bools[2] = {1, 2};
    assert_int_equal(tn_gguf_set_arr(w, "k", TN_GGUF_BOOL, bools, 2), TERN_ERR_INVALID_ARG);
    assert_int_equal(tn_gguf_set_arr(w, "k", TN_GGUF_STRING, bools, 2), TERN_ERR_INVALID_ARG);
    assert_int_equal(tn_gguf_set_arr(w, "k", TN_GGUF_ARRAY, bools, 2), TERN_ERR_INVALID_ARG);
    assert_int_equal(tn_gguf_set_arr(w, "k", TN_GGUF_U8, NULL, 2), TERN_ERR_INVALID_ARG);
    const char *strs[2] = {"a", NULL};
    assert_int_equal(tn_gguf_set_arr_str(w, "k", strs, 2), TERN_ERR_INVALID_ARG);
    tn_gguf_kv kv = raw_kv("k", 13);
    assert_int_equal(tn_gguf_set_kv(w, &kv), TERN_ERR_INVALID_ARG);
    /* tensor without data or fill */
    uint8_t *buf = NULL;
    size_t size = 0;
    assert_int_equal(tn_gguf_write_mem(w, NULL, NULL, &buf, &size), TERN_ERR_INVALID_ARG);
    assert_non_null(strstr(tern_last_error(), "has no data and no fill callback"));
    assert_null(buf);
    /* bad alignment values and type */
    assert_int_equal(tn_gguf_set_u32(w, "general.alignment", 13), TERN_OK);
    assert_int_equal(tn_gguf_write_mem(w, fill_cb, NULL, &buf, &size), TERN_ERR_INVALID_ARG);
    assert_non_null(strstr(tern_last_error(), "general.alignment must be a u32 power of two"));
    assert_int_equal(tn_gguf_set_i32(w, "general.alignment", 32), TERN_OK);
    assert_int_equal(tn_gguf_write_mem(w, fill_cb, NULL, &buf, &size), TERN_ERR_INVALID_ARG);
    assert_int_equal(tn_gguf_set_u32(w, "general.alignment", 0), TERN_OK);
    assert_int_equal(tn_gguf_write_mem(w, fill_cb, NULL, &buf, &size), TERN_ERR_INVALID_ARG);
    tn_gguf_writer_free(w);
}

static tern_status fill_fail(void *user, size_t index, void *dst, size_t nbytes) {
    (void)user, (void)dst, (void)nbytes;
    return tn_err(TERN_ERR_ABORTED, "stopped at tensor %zu", index);
}

static bool dir_has_prefix(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) found = true;
    closedir(d);
    return found;
}

static void test_files(void **state) {
    (void)state;
    char path[4096], bad[4096];
    snprintf(path, sizeof path, "%s/test_gguf_rt.gguf", tmp_dir());
    snprintf(bad, sizeof bad, "%s/test_gguf_bad.gguf", tmp_dir());
    unlink(path);
    tn_gguf_writer *w = build_model(64);
    int calls = 0;
    assert_int_equal(tn_gguf_write(w, path, fill_cb, &calls), TERN_OK);
    assert_int_equal(calls, 3);
    for (int mm = 0; mm < 2; mm++) {
        tn_gguf *g = NULL;
        assert_int_equal(tn_gguf_open(path, mm == 1, &g), TERN_OK);
        check_model(g, 64);
        tn_gguf_free(g);
    }
    /* a failing fill leaves the previous file intact and no temp file behind */
    tern_status st = tn_gguf_write(w, path, fill_fail, NULL);
    assert_int_equal(st, TERN_ERR_ABORTED);
    assert_non_null(strstr(tern_last_error(), "producing tensor 'blk.0.attn_q.weight'"));
    assert_non_null(strstr(tern_last_error(), "stopped at tensor 1"));
    assert_false(dir_has_prefix(tmp_dir(), "test_gguf_rt.gguf.tmp"));
    tn_gguf *g = NULL;
    assert_int_equal(tn_gguf_open(path, true, &g), TERN_OK);
    check_model(g, 64);
    tn_gguf_free(g);
    /* unwritable destination */
    assert_int_equal(tn_gguf_write(w, "/nonexistent-dir/x.gguf", fill_cb, &calls), TERN_ERR_IO);
    tn_gguf_writer_free(w);
    /* missing file: NOT_FOUND; malformed file: message prefixed with the path */
    g = (tn_gguf *)0x1;
    assert_int_equal(tn_gguf_open("/nonexistent-dir/none.gguf", true, &g), TERN_ERR_NOT_FOUND);
    assert_null(g);
    FILE *f = fopen(bad, "wb");
    assert_non_null(f);
    fwrite("GGUF\3\0\0\0\1", 1, 9, f);
    fclose(f);
    g = (tn_gguf *)0x1;
    assert_int_equal(tn_gguf_open(bad, false, &g), TERN_ERR_FORMAT);
    assert_null(g);
    assert_true(!strncmp(tern_last_error(), bad, strlen(bad)));
    assert_non_null(strstr(tern_last_error(), ": gguf: unexpected end of file at offset 8 reading n_tensors"));
    unlink(bad);
    unlink(path);
}

/* ---- allocation failure ------------------------------------------------------------------- */

static void test_alloc_fail_parse(void **state) {
    (void)state;
    tn_gguf_writer *w = build_model(0);
    assert_int_equal(build_kvs(w), TERN_OK);
    int calls = 0;
    uint8_t *buf = NULL;
    size_t size = 0;
    assert_int_equal(tn_gguf_write_mem(w, fill_cb, &calls, &buf, &size), TERN_OK);
    tn_gguf_writer_free(w);
    char path[4096];
    snprintf(path, sizeof path, "%s/test_gguf_oom.gguf", tmp_dir());
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(buf, 1, size, f);
    fclose(f);

    int ok_at = 0;
    for (int n = 1; n < 200 && !ok_at; n++) {
        tn_gguf *g = (tn_gguf *)0x1;
        tn_alloc_fail_at((uint64_t)n, false);
        tern_status st = tn_gguf_parse(buf, size, &g);
        tn_alloc_fail_at(0, false);
        if (st == TERN_OK) {
            check_model(g, 0);
            tn_gguf_free(g);
            ok_at = n;
        } else {
            assert_int_equal(st, TERN_ERR_NOMEM);
            assert_null(g);
        }
    }
    assert_true(ok_at > 1);
    /* persistent failure and the file path (no mmap: the read buffer is allocated too) */
    for (int n = 1; n < 200; n++) {
        tn_gguf *g = (tn_gguf *)0x1;
        tn_alloc_fail_at((uint64_t)n, true);
        tern_status st = tn_gguf_open(path, false, &g);
        tn_alloc_fail_at(0, false);
        if (st == TERN_OK) {
            tn_gguf_free(g);
            break;
        }
        assert_int_equal(st, TERN_ERR_NOMEM);
        assert_null(g);
    }
    unlink(path);
    tn_free(buf);
}

static void test_alloc_fail_write(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/test_gguf_oomw.gguf", tmp_dir());
    unlink(path);
    int done = 0;
    for (int n = 1; n < 400 && !done; n++) {
        tn_alloc_fail_at((uint64_t)n, false);
        tn_gguf_writer *w = NULL;
        tern_status st = tn_gguf_writer_create(&w);
        if (!st) st = build_kvs(w);
        int64_t ne[2] = {64, 2};
        if (!st) st = tn_gguf_add_tensor(w, "t", TN_Q8_0, 2, ne, NULL);
        if (!st) st = tn_gguf_set_str(w, "general.architecture", "replaced");
        if (!st) st = tn_gguf_remove(w, "t.u8");
        uint8_t *buf = NULL;
        size_t size = 0;
        if (!st) st = tn_gguf_write_mem(w, fill_any, NULL, &buf, &size);
        if (!st) st = tn_gguf_write(w, path, fill_any, NULL);
        tn_alloc_fail_at(0, false);
        if (st == TERN_OK) {
            done = n;
            tn_gguf *g = NULL;
            assert_int_equal(tn_gguf_parse(buf, size, &g), TERN_OK);
            assert_int_equal(g->n_kv, 26);
            assert_true(tn_gguf_str_eq(g->kv[0].v.str, "replaced"));
            assert_int_equal(g->tensors[0].data[5], pattern(0, 5));
            tn_gguf_free(g);
        } else {
            assert_int_equal(st, TERN_ERR_NOMEM);
            assert_false(access(path, F_OK) == 0); /* atomic: no partial output */
        }
        tn_free(buf);
        tn_gguf_writer_free(w);
    }
    assert_true(done > 1);
    unlink(path);
}

static int teardown(void **state) {
    (void)state;
    for (size_t i = 0; i < TN_ARRAY_LEN(tensor_data); i++) free(tensor_data[i]), tensor_data[i] = NULL;
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_values),
        cmocka_unit_test(test_roundtrip_tensors),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_writer_validation),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_alloc_fail_parse),
        cmocka_unit_test(test_alloc_fail_write),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
