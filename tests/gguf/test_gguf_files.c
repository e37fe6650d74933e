/*
 * test_gguf_files.c — reads the real GGUF files in $TERN_SHARED_DIR/models (stories260K in six
 * tensor types, tokenizer-only vocab files from llama.cpp): every file parses with and without
 * mmap, keys and tensors look as llama.cpp wrote them, every key formats, and re-writing a file
 * through tn_gguf_set_kv + tn_gguf_add_tensor reproduces it byte for byte.
 *
 * Exits 77 (CTest "skipped") when the shared folder is absent, before cmocka starts.
 */
#include <dirent.h>
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
#include "tensor/dtype.h"

static char models_dir[4096];

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Lists the .gguf files of dir into names (sorted), returns the count. */
static int list_gguf(const char *dir, char names[][512], int cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".gguf")) snprintf(names[n++], 512, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, 512, (int (*)(const void *, const void *))strcmp);
    return n;
}

/* Re-serializes g and compares with the file bytes. */
static void check_rewrite(const tn_gguf *g) {
    tn_gguf_writer *w = NULL;
    assert_int_equal(tn_gguf_writer_create(&w), TERN_OK);
    for (uint64_t i = 0; i < g->n_kv; i++) assert_int_equal(tn_gguf_set_kv(w, &g->kv[i]), TERN_OK);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        assert_int_equal(tn_gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data), TERN_OK);
    }
    uint8_t *buf = NULL;
    size_t size = 0;
    assert_int_equal(tn_gguf_write_mem(w, NULL, NULL, &buf, &size), TERN_OK);
    if (g->version == 3) {
        assert_int_equal(size, g->size);
        assert_memory_equal(buf, g->base, size);
    }
    tn_free(buf);
    tn_gguf_writer_free(w);
}

static void check_common(const tn_gguf *g) {
    char out[256];
    for (uint64_t i = 0; i < g->n_kv; i++) {
        tn_gguf_kv_format(&g->kv[i], out, sizeof out);
        assert_true(strlen(out) > 0 && strlen(out) < sizeof out);
        char *key = tn_gguf_str_dup(g->kv[i].key);
        assert_non_null(key);
        assert_ptr_equal(tn_gguf_find(g, key), &g->kv[i]);
        tn_free(key);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        assert_ptr_equal(tn_gguf_find_tensor(g, t->name), t);
        assert_non_null(tn_dtype_get(t->type));
        assert_true(t->data >= g->base && t->data + t->nbytes <= g->base + g->size);
    }
    check_rewrite(g);
}

static void test_stories(void **state) {
    (void)state;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/stories260K", models_dir);
    static char names[32][512];
    int n = list_gguf(dir, names, 32);
    assert_true(n >= 1);
    for (int f = 0; f < n; f++) {
        for (int mm = 0; mm < 2; mm++) {
            tn_gguf *g = NULL;
            tern_status st = tn_gguf_open(names[f], mm == 0, &g);
            if (st) {
                print_error("%s: %s\n", names[f], tern_last_error());
                fail();
            }
            assert_int_equal(g->version, 3);
            assert_int_equal(g->alignment, 32);
            tn_gguf_str arch = {0};
            assert_int_equal(tn_gguf_get_str(g, "general.architecture", true, &arch), TERN_OK);
            assert_true(tn_gguf_str_eq(arch, "llama"));
            uint32_t n_embd = 0, n_layer = 0;
            assert_int_equal(tn_gguf_get_u32(g, "llama.embedding_length", true, &n_embd), TERN_OK);
            assert_int_equal(tn_gguf_get_u32(g, "llama.block_count", true, &n_layer), TERN_OK);
            assert_int_equal(n_embd, 64);
            assert_int_equal(n_layer, 5);
            assert_int_equal(g->n_tensors, 48);
            const tn_gguf_tensor *emb = tn_gguf_find_tensor(g, "token_embd.weight");
            assert_non_null(emb);
            assert_int_equal(emb->ne[0], 64);
            assert_int_equal(emb->ne[1], 512);
            assert_non_null(tn_gguf_find_tensor(g, "blk.4.ffn_down.weight"));
            const tn_gguf_kv *toks = NULL;
            assert_int_equal(tn_gguf_get_arr(g, "tokenizer.ggml.tokens", true, TN_GGUF_STRING, &toks), TERN_OK);
            assert_int_equal(toks->arr_n, 512);
            check_common(g);
            tn_gguf_free(g);
        }
    }
}

static void test_vocab(void **state) {
    (void)state;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/vocab", models_dir);
    static char names[64][512];
    int n = list_gguf(dir, names, 64);
    assert_true(n >= 1);
    for (int f = 0; f < n; f++) {
        tn_gguf *g = NULL;
        tern_status st = tn_gguf_open(names[f], true, &g);
        if (st) {
            print_error("%s: %s\n", names[f], tern_last_error());
            fail();
        }
        tn_gguf_str model = {0};
        assert_int_equal(tn_gguf_get_str(g, "tokenizer.ggml.model", true, &model), TERN_OK);
        const tn_gguf_kv *toks = NULL, *types = NULL;
        assert_int_equal(tn_gguf_get_arr(g, "tokenizer.ggml.tokens", true, TN_GGUF_STRING, &toks), TERN_OK);
        assert_true(toks->arr_n > 100);
        assert_int_equal(tn_gguf_get_arr(g, "tokenizer.ggml.token_type", false, TN_GGUF_I32, &types), TERN_OK);
        if (types) assert_int_equal(types->arr_n, toks->arr_n);
        uint32_t bos = 0;
        assert_int_equal(tn_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", false, &bos), TERN_OK);
        assert_true(bos < toks->arr_n);
        check_common(g);
        tn_gguf_free(g);
    }
}

int main(void) {
    const char *shared = getenv("TERN_SHARED_DIR");
    if (!shared || !*shared) {
        fprintf(stderr, "TERN_SHARED_DIR not set: skipping\n");
        return 77;
    }
    snprintf(models_dir, sizeof models_dir, "%s/models", shared);
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/stories260K", models_dir);
    snprintf(b, sizeof b, "%s/vocab", models_dir);
    if (!is_dir(a) || !is_dir(b)) {
        fprintf(stderr, "%s or %s absent: skipping\n", a, b);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories),
        cmocka_unit_test(test_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
