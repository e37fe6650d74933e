/*
 * test_gguf_malformed.c — the malformed-GGUF corpus (robustness.md §4.1, cases G1..G24 that
 * belong to the format layer): each case is built byte by byte, copied into a heap buffer of
 * exactly its size (so ASan sees any over-read), parsed, and must fail with the expected status
 * AND a message naming the problem. A few valid edge cases must parse. Truncation of a tiny
 * valid model at every offset must fail cleanly.
 *
 * Side effect: every case is also written to $TERN_TEST_TMP/gguf-corpus/ so the fuzz replay test
 * (tests/fuzz) runs the same inputs through the fuzz harness.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "core/base.h"
#include "fmt/gguf.h"
#include "gguf/gguf_build.h"

static char corpus_dir[4096];

static void corpus_init(void) {
    const char *tmp = getenv("TERN_TEST_TMP");
    if (!tmp || !*tmp) return;
    snprintf(corpus_dir, sizeof corpus_dir, "%s/gguf-corpus", tmp);
    if (mkdir(corpus_dir, 0755) != 0 && errno != EEXIST) corpus_dir[0] = 0;
}

static void corpus_save(const char *name, const uint8_t *p, size_t n) {
    if (!corpus_dir[0]) return;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.gguf", corpus_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

/* Parses an exact-size heap copy (so ASan sees any over-read); returns the status. */
static tern_status parse_copy(const uint8_t *p, size_t n) {
    uint8_t *c = malloc(n ? n : 1);
    assert_non_null(c);
    if (n) memcpy(c, p, n);
    tn_gguf *g = (tn_gguf *)0x1;
    tern_status st = tn_gguf_parse(c, n, &g);
    if (st != TERN_OK) assert_null(g);
    else {
        /* touch every tensor byte: any bound the parser got wrong shows up under ASan */
        unsigned sum = 0;
        for (uint64_t i = 0; i < g->n_tensors; i++)
            for (size_t j = 0; j < g->tensors[i].nbytes; j++) sum += g->tensors[i].data[j];
        (void)sum;
        tn_gguf_free(g);
    }
    free(c);
    return st;
}

typedef struct mcase {
    const char *name;
    void (*build)(tb *b);
    tern_status status;
    const char *phrase;
    bool no_alloc; /* must be rejected before any allocation */
} mcase;

/* ---- builders ----------------------------------------------------------------------------- */

static void b_spec(tb *b, const tb_spec *s) { tb_model(b, s); }
static void b_valid(tb *b) { b_spec(b, &(tb_spec){0}); }

/* header */
static void b_empty(tb *b) { (void)b; }
static void b_magic_fugg(tb *b) { b_spec(b, &(tb_spec){.magic = "FUGG"}); }
static void b_magic_ggml(tb *b) { b_spec(b, &(tb_spec){.magic = "GGML"}); }
static void b_magic_lmgg(tb *b) { b_spec(b, &(tb_spec){.magic = "lmgg"}); }
static void b_magic_ggjt(tb *b) { b_spec(b, &(tb_spec){.magic = "tjgg"}); }
static void b_magic_bad(tb *b) { b_spec(b, &(tb_spec){.magic = "GGUX"}); }
static void b_ver0(tb *b) { tb_bytes(b, "GGUF", 4); tb_u32(b, 0); tb_u64(b, 0); tb_u64(b, 0); }
static void b_ver1(tb *b) { b_spec(b, &(tb_spec){.version = 1}); }
static void b_ver4(tb *b) { b_spec(b, &(tb_spec){.version = 4}); }
static void b_ver_be(tb *b) { b_spec(b, &(tb_spec){.version = 0x03000000}); }
static void b_nt_max(tb *b) { b_spec(b, &(tb_spec){.set_n_tensors = true, .n_tensors = UINT64_MAX}); }
static void b_nt_2_63(tb *b) { b_spec(b, &(tb_spec){.set_n_tensors = true, .n_tensors = (uint64_t)1 << 63}); }
static void b_nt_sizemax(tb *b) {
    b_spec(b, &(tb_spec){.set_n_tensors = true, .n_tensors = SIZE_MAX / sizeof(tn_gguf_tensor) + 1});
}
static void b_nt_file(tb *b) { b_spec(b, &(tb_spec){.set_n_tensors = true, .n_tensors = 1000}); }
static void b_nkv_max(tb *b) { b_spec(b, &(tb_spec){.set_n_kv = true, .n_kv = UINT64_MAX}); }
static void b_nkv_file(tb *b) { b_spec(b, &(tb_spec){.set_n_kv = true, .n_kv = 1000}); }
static void b_counts_sum(tb *b) {
    /* each count alone fits the ~600 bytes left, both together do not */
    b_spec(b, &(tb_spec){.set_n_kv = true, .n_kv = 30, .set_n_tensors = true, .n_tensors = 12});
}

/* key/values: one extra kv appended to the valid model */
static void extra(tb *b, void (*kv)(tb *)) {
    tb e = {0};
    kv(&e);
    b_spec(b, &(tb_spec){.extra_kv = &e, .n_extra_kv = 1});
    tb_free(&e);
}
static void kv_keylen_max(tb *e) { tb_u64(e, UINT64_MAX); tb_bytes(e, "abc", 3); tb_u32(e, 4); tb_u32(e, 1); }
static void kv_keylen_64k(tb *e) { tb_u64(e, 65536); tb_bytes(e, "abc", 3); tb_u32(e, 4); tb_u32(e, 1); }
static void kv_key_empty(tb *e) { tb_u64(e, 0); tb_u32(e, 4); tb_u32(e, 1); }
static void kv_key_utf8(tb *e) { tb_kv_u32(e, "g\xc3\xa9n\xc3\xa9ral.x", 1); }
static void kv_key_space(tb *e) { tb_kv_u32(e, "general x", 1); }
static void kv_key_dup(tb *e) { tb_kv_str(e, "general.architecture", "gptx"); }
static void kv_type_13(tb *e) { tb_str(e, "x.y"); tb_u32(e, 13); tb_u32(e, 1); }
static void kv_type_ff(tb *e) { tb_str(e, "x.y"); tb_u32(e, 0xffffffffu); tb_u32(e, 1); }
static void kv_strlen_max(tb *e) { tb_str(e, "x.s"); tb_u32(e, 8); tb_u64(e, UINT64_MAX); tb_bytes(e, "abc", 3); }
static void kv_strlen_over(tb *e) { tb_str(e, "x.s"); tb_u32(e, 8); tb_u64(e, 100000); tb_bytes(e, "abc", 3); }
static void kv_strlen_1g(tb *e) { tb_str(e, "x.s"); tb_u32(e, 8); tb_u64(e, ((uint64_t)1 << 30) + 1); tb_bytes(e, "abc", 3); }
static void kv_arr_max(tb *e) { tb_str(e, "x.a"); tb_u32(e, 9); tb_u32(e, 4); tb_u64(e, UINT64_MAX); }
static void kv_arr_2_30(tb *e) { tb_str(e, "x.a"); tb_u32(e, 9); tb_u32(e, 0); tb_u64(e, ((uint64_t)1 << 30) + 1); }
static void kv_arr_over(tb *e) { tb_str(e, "x.a"); tb_u32(e, 9); tb_u32(e, 4); tb_u64(e, 1000); tb_u32(e, 1); }
static void kv_arr_str_over(tb *e) { tb_str(e, "x.a"); tb_u32(e, 9); tb_u32(e, 8); tb_u64(e, 1000); tb_str(e, "a"); }
static void kv_arr_nested(tb *e) { tb_str(e, "x.a"); tb_u32(e, 9); tb_u32(e, 9); tb_u64(e, 1); tb_u32(e, 4); tb_u64(e, 1); tb_u32(e, 1); }
static void kv_arr_type13(tb *e) { tb_str(e, "x.a"); tb_u32(e, 9); tb_u32(e, 13); tb_u64(e, 1); tb_u32(e, 1); }
static void kv_arr_str_trunc(tb *e) { tb_str(e, "x.a"); tb_u32(e, 9); tb_u32(e, 8); tb_u64(e, 2); tb_str(e, "a"); tb_u64(e, 1u << 20); }
static void kv_bool2(tb *e) { tb_str(e, "x.b"); tb_u32(e, 7); tb_u8(e, 2); }
static void kv_bool_arr2(tb *e) { tb_str(e, "x.b"); tb_u32(e, 9); tb_u32(e, 7); tb_u64(e, 3); tb_u8(e, 0); tb_u8(e, 1); tb_u8(e, 2); }
static void kv_align0(tb *e) { tb_kv_u32(e, "general.alignment", 0); }
static void kv_align13(tb *e) { tb_kv_u32(e, "general.alignment", 13); }
static void kv_align2_31(tb *e) { tb_kv_u32(e, "general.alignment", 1u << 31); }
static void kv_align_i32(tb *e) { tb_str(e, "general.alignment"); tb_u32(e, 5); tb_u32(e, 32); }
static void kv_align_u64(tb *e) { tb_str(e, "general.alignment"); tb_u32(e, 10); tb_u64(e, 32); }
static void kv_align_str(tb *e) { tb_kv_str(e, "general.alignment", "32"); }
#define EXTRA(fn) static void b_##fn(tb *b) { extra(b, fn); }
EXTRA(kv_keylen_max) EXTRA(kv_keylen_64k) EXTRA(kv_key_empty) EXTRA(kv_key_utf8) EXTRA(kv_key_space) EXTRA(kv_key_dup)
EXTRA(kv_type_13) EXTRA(kv_type_ff) EXTRA(kv_strlen_max) EXTRA(kv_strlen_over) EXTRA(kv_strlen_1g) EXTRA(kv_arr_max)
EXTRA(kv_arr_2_30) EXTRA(kv_arr_over) EXTRA(kv_arr_str_over) EXTRA(kv_arr_nested) EXTRA(kv_arr_type13)
EXTRA(kv_arr_str_trunc) EXTRA(kv_bool2) EXTRA(kv_bool_arr2) EXTRA(kv_align0) EXTRA(kv_align13) EXTRA(kv_align2_31)
EXTRA(kv_align_i32) EXTRA(kv_align_u64) EXTRA(kv_align_str)

/* tensor infos: the default list with one tensor changed */
static void with_tensor(tb *b, int i, tb_tensor t) {
    tb_tensor ts[3];
    memcpy(ts, tb_default_tensors, sizeof ts);
    ts[i] = t;
    b_spec(b, &(tb_spec){.tensors = ts, .n_tensor_specs = 3});
}
static void b_tname_64(tb *b) {
    with_tensor(b, 1, (tb_tensor){"a123456789b123456789c123456789d123456789e123456789f123456789abcd", 1, {32}, TN_F32, false, 0});
}
static void b_tname_empty(tb *b) { with_tensor(b, 0, (tb_tensor){"", 1, {16}, TN_F32, false, 0}); }
static void b_tname_dup(tb *b) { with_tensor(b, 2, (tb_tensor){"token_embd.weight", 1, {8}, TN_F32, false, 0}); }
static void b_tname_nul(tb *b) {
    tb t = {0};
    tb_strn(&t, "ab\0cd", 5);
    tb_u32(&t, 1); tb_u64(&t, 8); tb_u32(&t, TN_F32); tb_u64(&t, 0);
    b_spec(b, &(tb_spec){.raw_tensor_bytes = true, .tensor_raw = &t, .n_tensor_raw = 1});
    tb_free(&t);
}
static void b_ndims0(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 0, {0}, TN_F32, false, 0}); }
static void b_ndims5(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 5, {1, 1, 1, 1}, TN_F32, false, 0}); }
static void b_ndims255(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 255, {1, 1, 1, 1}, TN_F32, false, 0}); }
static void b_ne_neg1(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 2, {8, UINT64_MAX}, TN_F32, false, 0}); }
static void b_ne_2_63(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 1, {(uint64_t)1 << 63}, TN_F32, false, 0}); }
static void b_ne_2_62(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 1, {(uint64_t)1 << 62}, TN_F32, false, 0}); }
static void b_nel_ovf(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 2, {(uint64_t)1 << 33, (uint64_t)1 << 33}, TN_F32, false, 0}); }
static void b_nel_ovf4(tb *b) {
    uint64_t d = 4ull * INT32_MAX;
    with_tensor(b, 0, (tb_tensor){"x", 4, {d, d, d, d}, TN_F32, false, 0});
}
static void b_bytes_ovf(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 1, {((uint64_t)1 << 61) + 1}, 28 /* f64 */, false, 0}); }
static void b_f32_pad_wrap(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 1, {SIZE_MAX / 4}, TN_F32, false, 0}); }
static void b_q4_0_huge(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 2, {(uint64_t)1 << 37, (uint64_t)1 << 24}, TN_Q4_0, false, 0}); }
static void b_huge_pair(tb *b) {
    tb_tensor ts[2] = {{"a", 1, {(uint64_t)1 << 61}, TN_F32, false, 0}, {"b", 1, {(uint64_t)1 << 61}, TN_F32, true, (uint64_t)1 << 63}};
    b_spec(b, &(tb_spec){.tensors = ts, .n_tensor_specs = 2});
}
static void b_type4(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 1, {32}, 4, false, 0}); }
static void b_type5(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 1, {32}, 5, false, 0}); }
static void b_type31(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 1, {32}, 31, false, 0}); }
static void b_type43(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 1, {32}, 43, false, 0}); }
static void b_type1000(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 1, {32}, 1000, false, 0}); }
static void b_type_ff(tb *b) { with_tensor(b, 0, (tb_tensor){"x", 1, {32}, 0xffffffffu, false, 0}); }
static void b_q4k_100(tb *b) { with_tensor(b, 1, (tb_tensor){"x", 2, {100, 2}, TN_Q4_K, false, 0}); }
static void b_q8_0_33(tb *b) { with_tensor(b, 1, (tb_tensor){"x", 1, {33}, TN_Q8_0, false, 0}); }
static void offsets(tb *b, uint64_t o0, uint64_t o1, uint64_t o2) {
    tb_tensor ts[3];
    memcpy(ts, tb_default_tensors, sizeof ts);
    uint64_t o[3] = {o0, o1, o2};
    for (int i = 0; i < 3; i++) ts[i].set_offset = true, ts[i].offset = o[i];
    b_spec(b, &(tb_spec){.tensors = ts, .n_tensor_specs = 3});
}
static void b_off_misaligned(tb *b) { offsets(b, 0, 65, 128); }
static void b_off_gap(tb *b) { offsets(b, 0, 96, 160); }
static void b_off_overlap(tb *b) { offsets(b, 0, 32, 96); }
static void b_off_reorder(tb *b) { offsets(b, 0, 128, 64); }
static void b_off_first(tb *b) { offsets(b, 32, 96, 160); }
static void b_off_max(tb *b) { offsets(b, UINT64_MAX, 64, 128); }
static void b_off_max_al(tb *b) { offsets(b, 0, 64, UINT64_MAX - 31); }
static void b_data_short(tb *b) { b_spec(b, &(tb_spec){.trim = 1}); }
static void b_data_none(tb *b) { b_spec(b, &(tb_spec){.trim = 160}); }
static void b_nt_more(tb *b) { b_spec(b, &(tb_spec){.set_n_tensors = true, .n_tensors = 4}); }
static void b_nkv_more(tb *b) { b_spec(b, &(tb_spec){.set_n_kv = true, .n_kv = 4}); }

static const mcase cases[] = {
    /* G1 */
    {"empty", b_empty, TERN_ERR_FORMAT, "unexpected end of file at offset 0 reading magic", true},
    /* G2 */
    {"magic_fugg", b_magic_fugg, TERN_ERR_UNSUPPORTED, "big-endian", true},
    {"magic_ggml", b_magic_ggml, TERN_ERR_UNSUPPORTED, "convert_hf_to_gguf", true},
    {"magic_lmgg", b_magic_lmgg, TERN_ERR_UNSUPPORTED, "legacy GGML/GGJT", true},
    {"magic_ggjt", b_magic_ggjt, TERN_ERR_UNSUPPORTED, "legacy GGML/GGJT", true},
    {"magic_bad", b_magic_bad, TERN_ERR_FORMAT, "bad magic 'GGUX' at offset 0", true},
    /* G3 */
    {"version_0", b_ver0, TERN_ERR_FORMAT, "invalid version 0", true},
    {"version_1", b_ver1, TERN_ERR_UNSUPPORTED, "version 1 at offset 4 is obsolete", true},
    {"version_4", b_ver4, TERN_ERR_UNSUPPORTED, "unsupported version 4", true},
    {"version_be", b_ver_be, TERN_ERR_UNSUPPORTED, "0x03000000 at offset 4 looks byte-swapped", true},
    /* G4 */
    {"n_tensors_max", b_nt_max, TERN_ERR_FORMAT, "n_tensors = 18446744073709551615 at offset 8 cannot fit", true},
    {"n_tensors_2_63", b_nt_2_63, TERN_ERR_FORMAT, "n_tensors = 9223372036854775808", true},
    {"n_tensors_sizemax", b_nt_sizemax, TERN_ERR_FORMAT, "n_tensors = ", true},
    {"n_tensors_file", b_nt_file, TERN_ERR_FORMAT, "n_tensors = 1000 at offset 8 cannot fit", true},
    /* G5 */
    {"n_kv_max", b_nkv_max, TERN_ERR_FORMAT, "n_kv = 18446744073709551615 at offset 16 cannot fit", true},
    {"n_kv_file", b_nkv_file, TERN_ERR_FORMAT, "n_kv = 1000 at offset 16 cannot fit", true},
    {"counts_sum", b_counts_sum, TERN_ERR_FORMAT, "n_tensors = 12 and n_kv = 30 cannot fit", true},
    /* G6 */
    {"key_len_max", b_kv_keylen_max, TERN_ERR_FORMAT, "string length 18446744073709551615 at offset 138 in kv[3].key exceeds the limit of 65535", false},
    {"key_len_64k", b_kv_keylen_64k, TERN_ERR_FORMAT, "in kv[3].key exceeds the limit of 65535", false},
    {"key_empty", b_kv_key_empty, TERN_ERR_FORMAT, "empty key at offset 138 in kv[3]", false},
    {"key_utf8", b_kv_key_utf8, TERN_ERR_FORMAT, "printable ASCII", false},
    {"key_space", b_kv_key_space, TERN_ERR_FORMAT, "kv[3].key of 'general x' has bytes outside printable ASCII", false},
    /* G7 */
    {"key_dup", b_kv_key_dup, TERN_ERR_FORMAT, "duplicate key at offset 138 in kv[3].key of 'general.architecture' (first at offset 24)", false},
    /* G8 */
    {"value_type_13", b_kv_type_13, TERN_ERR_FORMAT, "invalid value type 13 at offset 149 in kv[3].type of 'x.y'", false},
    {"value_type_ff", b_kv_type_ff, TERN_ERR_FORMAT, "invalid value type 4294967295", false},
    /* G9 */
    {"str_len_max", b_kv_strlen_max, TERN_ERR_FORMAT, "string length 18446744073709551615 at offset 153 in kv[3].value of 'x.s' exceeds the limit of 1073741824", false},
    {"str_len_over", b_kv_strlen_over, TERN_ERR_FORMAT, "unexpected end of file at offset 161 reading kv[3].value of 'x.s': string of 100000 bytes", false},
    {"str_len_1g", b_kv_strlen_1g, TERN_ERR_FORMAT, "string length 1073741825", false},
    /* G11 */
    {"arr_count_max", b_kv_arr_max, TERN_ERR_FORMAT, "array count 18446744073709551615 at offset 157 in kv[3].value.count of 'x.a' exceeds the limit", false},
    {"arr_count_2_30", b_kv_arr_2_30, TERN_ERR_FORMAT, "array count 1073741825", false},
    {"arr_count_over", b_kv_arr_over, TERN_ERR_FORMAT, "array count 1000 of u32 at offset 157 in kv[3].value.count of 'x.a' needs at least 4000 bytes", false},
    {"arr_str_count_over", b_kv_arr_str_over, TERN_ERR_FORMAT, "array count 1000 of string", false},
    {"arr_str_trunc", b_kv_arr_str_trunc, TERN_ERR_FORMAT, "reading kv[3].value[1] of 'x.a': string of 1048576 bytes", false},
    /* G12 */
    {"arr_nested", b_kv_arr_nested, TERN_ERR_FORMAT, "nested array at offset 153", false},
    {"arr_type_13", b_kv_arr_type13, TERN_ERR_FORMAT, "invalid array element type 13", false},
    /* G13 */
    {"bool_2", b_kv_bool2, TERN_ERR_FORMAT, "bool value 2 at offset 153 in kv[3].value of 'x.b' is not 0 or 1", false},
    {"bool_arr_2", b_kv_bool_arr2, TERN_ERR_FORMAT, "bool value 2 at offset 167 in kv[3].value[2] of 'x.b'", false},
    /* G14 */
    {"align_0", b_kv_align0, TERN_ERR_FORMAT, "general.alignment = 0 at offset 138 is not a power of two", false},
    {"align_13", b_kv_align13, TERN_ERR_FORMAT, "general.alignment = 13", false},
    {"align_2_31", b_kv_align2_31, TERN_ERR_FORMAT, "general.alignment = 2147483648", false},
    {"align_i32", b_kv_align_i32, TERN_ERR_FORMAT, "general.alignment at offset 138 has type i32, expected u32", false},
    {"align_u64", b_kv_align_u64, TERN_ERR_FORMAT, "has type u64, expected u32", false},
    {"align_str", b_kv_align_str, TERN_ERR_FORMAT, "has type string, expected u32", false},
    /* G15 */
    {"tname_64", b_tname_64, TERN_ERR_FORMAT, "string length 64 at offset", false},
    {"tname_empty", b_tname_empty, TERN_ERR_FORMAT, "empty tensor name at offset 138 in tensor_info[0]", false},
    {"tname_dup", b_tname_dup, TERN_ERR_FORMAT, "duplicate tensor name at offset", false},
    {"tname_nul", b_tname_nul, TERN_ERR_FORMAT, "contains a NUL byte", false},
    /* G16 */
    {"ndims_0", b_ndims0, TERN_ERR_FORMAT, "n_dims 0 at offset 147 in tensor_info[0].n_dims of 'x' is not in 1..4", false},
    {"ndims_5", b_ndims5, TERN_ERR_FORMAT, "n_dims 5", false},
    {"ndims_255", b_ndims255, TERN_ERR_FORMAT, "n_dims 255", false},
    /* G17 */
    {"ne_neg1", b_ne_neg1, TERN_ERR_FORMAT, "dimension -1 at offset 159 in tensor_info[0].ne[1] of 'x' is negative", false},
    {"ne_2_63", b_ne_2_63, TERN_ERR_FORMAT, "in tensor_info[0].ne[0] of 'x' is negative or too large", false},
    /* G18 */
    {"nel_ovf", b_nel_ovf, TERN_ERR_FORMAT, "element count of tensor_info[0].type of 'x' overflows", false},
    {"nel_ovf4", b_nel_ovf4, TERN_ERR_FORMAT, "element count", false},
    /* G19 */
    {"bytes_ovf", b_bytes_ovf, TERN_ERR_FORMAT, "byte size of tensor_info[0].type of 'x' overflows", false},
    {"f32_pad_wrap", b_f32_pad_wrap, TERN_ERR_FORMAT, "tensor of 18446744073709551612 bytes cannot fit in a file", false},
    {"ne_2_62", b_ne_2_62, TERN_ERR_FORMAT, "negative or too large", false},
    {"q4_0_huge", b_q4_0_huge, TERN_ERR_FORMAT, "cannot fit in a file", false},
    /* G20 */
    {"type_4", b_type4, TERN_ERR_UNSUPPORTED, "unsupported tensor type type#4 (4) at offset", false},
    {"type_5", b_type5, TERN_ERR_UNSUPPORTED, "unsupported tensor type type#5 (5)", false},
    {"type_31", b_type31, TERN_ERR_UNSUPPORTED, "unsupported tensor type type#31 (31)", false},
    {"type_43", b_type43, TERN_ERR_UNSUPPORTED, "unsupported tensor type type#43 (43)", false},
    {"type_1000", b_type1000, TERN_ERR_UNSUPPORTED, "unsupported tensor type type#1000 (1000)", false},
    {"type_ff", b_type_ff, TERN_ERR_UNSUPPORTED, "(4294967295)", false},
    /* G21 */
    {"q4_K_ne0_100", b_q4k_100, TERN_ERR_FORMAT, "ne[0] = 100 is not a multiple of the q4_K block size 256", false},
    {"q8_0_ne0_33", b_q8_0_33, TERN_ERR_FORMAT, "is not a multiple of the q8_0 block size 32", false},
    /* G22 */
    {"off_misaligned", b_off_misaligned, TERN_ERR_FORMAT, "tensor_info[1].offset of 'blk.0.attn_q.weight' = 65 is not a multiple of the alignment 32", false},
    {"off_gap", b_off_gap, TERN_ERR_FORMAT, "tensor_info[1].offset of 'blk.0.attn_q.weight' = 96, expected 64", false},
    {"off_overlap", b_off_overlap, TERN_ERR_FORMAT, "= 32, expected 64", false},
    {"off_reorder", b_off_reorder, TERN_ERR_FORMAT, "= 128, expected 64", false},
    {"off_first", b_off_first, TERN_ERR_FORMAT, "tensor_info[0].offset of 'token_embd.weight' = 32, expected 0", false},
    {"off_max", b_off_max, TERN_ERR_FORMAT, "= 18446744073709551615 is not a multiple of the alignment", false},
    {"off_max_aligned", b_off_max_al, TERN_ERR_FORMAT, "= 18446744073709551584, expected 128", false},
    /* G23 */
    {"data_short", b_data_short, TERN_ERR_FORMAT, "data section too short: tensor 'output_norm.weight' ends at file offset", false},
    {"data_none", b_data_none, TERN_ERR_FORMAT, "data section too short", false},
    /* G24 */
    {"huge_pair", b_huge_pair, TERN_ERR_FORMAT, "cannot fit in a file", false},
    /* counts larger than what follows */
    {"n_tensors_more", b_nt_more, TERN_ERR_FORMAT, "tensor_info[3]", false},
    {"n_kv_more", b_nkv_more, TERN_ERR_FORMAT, "in tensor_info[0].name exceeds the limit of 63 bytes", false},
};

static void run_case(const mcase *c) {
    tb b = {0};
    c->build(&b);
    corpus_save(c->name, b.p, b.n);
    tn_err_clear();
    uint64_t allocs = tn_alloc_count();
    tern_status st = parse_copy(b.p, b.n);
    const char *msg = tern_last_error();
    if (st != c->status || !strstr(msg, c->phrase)) {
        print_error("case %s: status %s (want %s)\n  message: %s\n  wanted phrase: %s\n", c->name, tern_status_str(st),
                    tern_status_str(c->status), msg, c->phrase);
        fail();
    }
    if (c->no_alloc && tn_alloc_count() != allocs) {
        print_error("case %s: rejected after %llu allocations, expected none\n", c->name,
                    (unsigned long long)(tn_alloc_count() - allocs));
        fail();
    }
    tb_free(&b);
}

static void test_cases(void **state) {
    (void)state;
    for (size_t i = 0; i < TN_ARRAY_LEN(cases); i++) run_case(&cases[i]);
}

/* G1: every prefix of the valid model fails cleanly (EOF, count bound or data section). */
static void test_truncation(void **state) {
    (void)state;
    tb b = {0};
    b_valid(&b);
    tn_gguf *g = NULL;
    assert_int_equal(tn_gguf_parse(b.p, b.n, &g), TERN_OK);
    assert_int_equal(g->n_tensors, 3);
    tn_gguf_free(g);
    for (size_t n = 0; n < b.n; n++) {
        tern_status st = parse_copy(b.p, n);
        const char *m = tern_last_error();
        if (st != TERN_ERR_FORMAT ||
            (!strstr(m, "unexpected end of file at offset") && !strstr(m, "cannot fit") && !strstr(m, "data section too short"))) {
            print_error("truncated at %zu of %zu: %s: %s\n", n, b.n, tern_status_str(st), m);
            fail();
        }
        if (n < 24) assert_non_null(strstr(m, "unexpected end of file"));
        if (n % 41 == 0) {
            char name[64];
            snprintf(name, sizeof name, "trunc_%zu", n);
            corpus_save(name, b.p, n);
        }
    }
    /* the expected message shape for a cut inside a tensor info */
    tb_spec s = {0};
    tb full = {0};
    tb_model(&full, &s);
    /* tensor_info[2].ne[0] starts 8 bytes before its type; find it by cutting just after the name */
    size_t cut = 0;
    for (size_t i = 0; i + 18 <= full.n; i++)
        if (!memcmp(full.p + i, "output_norm.weight", 18)) cut = i + 18 + 4 + 3; /* inside ne[0] */
    assert_true(cut > 0);
    assert_int_equal(parse_copy(full.p, cut), TERN_ERR_FORMAT);
    char want[160];
    snprintf(want, sizeof want, "unexpected end of file at offset %zu reading tensor_info[2].ne[0] of 'output_norm.weight'", cut - 3);
    assert_non_null(strstr(tern_last_error(), want));
    tb_free(&full);
    tb_free(&b);
}

/* Valid edge cases that must parse. */
static void expect_ok(tb *b, tn_gguf **g) {
    tern_status st = tn_gguf_parse(b->p, b->n, g);
    if (st) {
        print_error("expected OK: %s: %s\n", tern_status_str(st), tern_last_error());
        fail();
    }
}

static void test_valid_edges(void **state) {
    (void)state;
    tn_gguf *g = NULL;
    /* v2 */
    tb b = {0};
    b_spec(&b, &(tb_spec){.version = 2});
    expect_ok(&b, &g);
    assert_int_equal(g->version, 2);
    tn_gguf_free(g);
    corpus_save("ok_v2", b.p, b.n);
    tb_free(&b);
    /* alignment 64 and 1 */
    uint32_t aligns[] = {64, 1, 8};
    for (size_t i = 0; i < 3; i++) {
        tb e = {0};
        tb_kv_u32(&e, "general.alignment", aligns[i]);
        b_spec(&b, &(tb_spec){.extra_kv = &e, .n_extra_kv = 1, .alignment = aligns[i]});
        expect_ok(&b, &g);
        assert_int_equal(g->alignment, aligns[i]);
        assert_int_equal(g->data_offset % aligns[i], 0);
        assert_int_equal(g->tensors[2].offset, aligns[i] == 1 ? 98 : aligns[i] == 8 ? 104 : 128);
        tn_gguf_free(g);
        char name[32];
        snprintf(name, sizeof name, "ok_align_%u", aligns[i]);
        corpus_save(name, b.p, b.n);
        tb_free(&b);
        tb_free(&e);
    }
    /* zero-sized dimension (G17) and a type ggml knows but tern does not compute (iq2_xxs) */
    tb_tensor ts[3] = {{"empty", 2, {8, 0}, TN_F32, false, 0}, {"iq", 1, {256}, 16, false, 0}, {"last", 1, {8}, TN_F32, false, 0}};
    b_spec(&b, &(tb_spec){.tensors = ts, .n_tensor_specs = 3});
    expect_ok(&b, &g);
    assert_int_equal(g->tensors[0].nbytes, 0);
    assert_int_equal(g->tensors[0].ne[1], 0);
    assert_int_equal(g->tensors[1].nbytes, 66);
    assert_int_equal(g->tensors[1].type, 16);
    assert_int_equal(g->tensors[2].offset, 96);
    tn_gguf_free(g);
    corpus_save("ok_edge_tensors", b.p, b.n);
    tb_free(&b);
    /* ne[0] = 0 with huge other dimensions: 0 elements, 0 bytes, no overflow in the row count */
    tb_tensor tz[1] = {{"zero", 3, {0, (uint64_t)1 << 61, (uint64_t)1 << 61}, TN_F32, false, 0}};
    b_spec(&b, &(tb_spec){.tensors = tz, .n_tensor_specs = 1});
    expect_ok(&b, &g);
    assert_int_equal(g->tensors[0].nbytes, 0);
    tn_gguf_free(g);
    tb_free(&b);
    /* last tensor not padded (a 34-byte q8_0 last): accepted, the data section holds its bytes */
    tb_tensor tq[1] = {{"q", 1, {32}, TN_Q8_0, false, 0}};
    b_spec(&b, &(tb_spec){.tensors = tq, .n_tensor_specs = 1, .trim = 30});
    expect_ok(&b, &g);
    assert_int_equal(g->tensors[0].nbytes, 34);
    assert_int_equal(g->data_offset + 34, b.n);
    tn_gguf_free(g);
    assert_int_equal(parse_copy(b.p, b.n - 1), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "data section too short"));
    tb_free(&b);
    /* vocab-style: no tensors, file ends right after the key/values (no padding) */
    tb_bytes(&b, "GGUF", 4); tb_u32(&b, 3); tb_u64(&b, 0); tb_u64(&b, 1);
    tb_kv_str(&b, "tokenizer.ggml.model", "llama");
    expect_ok(&b, &g);
    assert_int_equal(g->n_tensors, 0);
    tn_gguf_free(g);
    corpus_save("ok_vocab", b.p, b.n);
    tb_free(&b);
    /* G10: embedded NUL and invalid UTF-8 are accepted as bytes and printed escaped */
    tb e = {0};
    tb_str(&e, "general.desc"); tb_u32(&e, 8); tb_strn(&e, "a\0b\xff\xc3\xa9", 6);
    b_spec(&b, &(tb_spec){.extra_kv = &e, .n_extra_kv = 1});
    expect_ok(&b, &g);
    const tn_gguf_kv *kv = tn_gguf_find(g, "general.desc");
    assert_non_null(kv);
    assert_int_equal(kv->v.str.len, 6);
    char buf[128];
    tn_gguf_kv_format(kv, buf, sizeof buf);
    assert_string_equal(buf, "\"a\\x00b\\xff\xc3\xa9\"");
    tn_gguf_free(g);
    corpus_save("ok_nul_string", b.p, b.n);
    tb_free(&b);
    tb_free(&e);
}

int main(void) {
    corpus_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_valid_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
