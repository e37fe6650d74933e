/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader (and, on inputs that parse, the getters,
 * the formatter and a writer round trip).
 *
 * Properties checked beyond "no crash / no sanitizer report / no leak":
 *   - every tensor's bytes lie inside the input (read in full, so ASan sees any overrun);
 *   - whatever the reader accepts the writer can re-serialize, and the result parses again to
 *     the same keys and tensors (the writer and reader agree on the limits).
 *
 * Built two ways (tests/fuzz/CMakeLists.txt): with -fsanitize=fuzzer under TERN_FUZZ + clang,
 * and always as a replay driver (TN_FUZZ_REPLAY_MAIN) that feeds every file of the given
 * folders or files to the same entry point, so CI replays the corpus on every run.
 *
 * Typical run:  ./fuzz_gguf -dict=tests/fuzz/gguf.dict -max_len=65536 -rss_limit_mb=512
 *               -malloc_limit_mb=256 corpus-work/ tests/fuzz/corpus/
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "fmt/gguf.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_gguf: check failed: %s (%s:%d)\n", #c, __FILE__, __LINE__); abort(); } } while (0)

static void exercise_getters(const tn_gguf *g) {
    char buf[160], small[7];
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const tn_gguf_kv *kv = &g->kv[i];
        tn_gguf_kv_format(kv, buf, sizeof buf);
        CHECK(strlen(buf) < sizeof buf);
        tn_gguf_kv_format(kv, small, sizeof small);
        CHECK(strlen(small) < sizeof small);
        char *key = tn_gguf_str_dup(kv->key);
        if (!key) continue;
        CHECK(tn_gguf_find(g, key) == kv); /* keys are printable ASCII: no embedded NUL */
        int64_t i64;
        uint32_t u32;
        float f;
        bool b;
        tn_gguf_str s;
        const tn_gguf_kv *arr;
        (void)tn_gguf_get_i64(g, key, true, &i64);
        (void)tn_gguf_get_u32(g, key, true, &u32);
        (void)tn_gguf_get_f32(g, key, true, &f);
        (void)tn_gguf_get_bool(g, key, true, &b);
        if (tn_gguf_get_str(g, key, true, &s) == TERN_OK) {
            char *d = tn_gguf_str_dup(s);
            tn_free(d);
        }
        if (tn_gguf_get_arr(g, key, true, TN_GGUF_TYPE_COUNT, &arr) == TERN_OK && arr->arr_type == TN_GGUF_STRING)
            for (uint64_t j = 0; j < arr->arr_n; j++) CHECK(arr->arr_strs[j].len <= g->size);
        tn_free(key);
    }
    unsigned sum = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        CHECK(tn_gguf_find_tensor(g, t->name) == t);
        CHECK(t->data >= g->base && (size_t)(t->data - g->base) + t->nbytes <= g->size);
        for (size_t j = 0; j < t->nbytes; j++) sum += t->data[j];
    }
    (void)sum;
}

static void roundtrip(const tn_gguf *g) {
    tn_gguf_writer *w = NULL;
    if (tn_gguf_writer_create(&w)) return;
    tern_status st = TERN_OK;
    for (uint64_t i = 0; i < g->n_kv && !st; i++) st = tn_gguf_set_kv(w, &g->kv[i]);
    for (uint64_t i = 0; i < g->n_tensors && !st; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        st = tn_gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    uint8_t *buf = NULL;
    size_t size = 0;
    if (!st) st = tn_gguf_write_mem(w, NULL, NULL, &buf, &size);
    tn_gguf_writer_free(w);
    if (st == TERN_ERR_NOMEM) return;
    if (st) fprintf(stderr, "fuzz_gguf: writer refused what the reader accepted: %s\n", tern_last_error());
    CHECK(st == TERN_OK);
    tn_gguf *g2 = NULL;
    st = tn_gguf_parse(buf, size, &g2);
    if (st) fprintf(stderr, "fuzz_gguf: re-parse failed: %s\n", tern_last_error());
    CHECK(st == TERN_OK);
    CHECK(g2->n_kv == g->n_kv && g2->n_tensors == g->n_tensors && g2->alignment == g->alignment);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        CHECK(g2->kv[i].key.len == g->kv[i].key.len && !memcmp(g2->kv[i].key.data, g->kv[i].key.data, g->kv[i].key.len));
        CHECK(g2->kv[i].type == g->kv[i].type && g2->kv[i].arr_n == g->kv[i].arr_n);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tn_gguf_tensor *a = &g->tensors[i], *b = &g2->tensors[i];
        CHECK(!strcmp(a->name, b->name) && a->type == b->type && a->nbytes == b->nbytes && a->offset == b->offset);
        CHECK(a->nbytes == 0 || !memcmp(a->data, b->data, a->nbytes));
    }
    tn_gguf_free(g2);
    tn_free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tn_gguf *g = NULL;
    tern_status st = tn_gguf_parse(data, size, &g);
    if (st != TERN_OK) {
        CHECK(g == NULL);
        CHECK(st == TERN_ERR_FORMAT || st == TERN_ERR_UNSUPPORTED || st == TERN_ERR_NOMEM);
        CHECK(strncmp(tern_last_error(), "gguf: ", 6) == 0);
        return 0;
    }
    exercise_getters(g);
    roundtrip(g);
    tn_gguf_free(g);
    return 0;
}

#ifdef TN_FUZZ_REPLAY_MAIN
#include <dirent.h>
#include <sys/stat.h>

static int replay_file(const char *path, int *count) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_gguf_replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
        if (!buf) {
            fclose(f);
            return 1;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        if (r == 0) break;
        n += r;
    }
    fclose(f);
    /* exact-size copy so ASan catches over-reads past the input */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return 1;
    }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    (*count)++;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Replays every regular file in each folder argument (sorted), or each file argument. A
 * missing folder is skipped with a note: the generated corpus only exists after its test ran. */
int main(int argc, char **argv) {
    int count = 0, errors = 0;
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) {
            fprintf(stderr, "fuzz_gguf_replay: %s absent, skipped\n", argv[a]);
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            errors += replay_file(argv[a], &count);
            continue;
        }
        DIR *d = opendir(argv[a]);
        if (!d) {
            errors++;
            continue;
        }
        char **names = NULL;
        size_t n = 0, cap = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                char **nn = realloc(names, cap * sizeof *nn);
                if (!nn) break;
                names = nn;
            }
            size_t l = strlen(argv[a]) + strlen(e->d_name) + 2;
            names[n] = malloc(l);
            if (!names[n]) break;
            snprintf(names[n], l, "%s/%s", argv[a], e->d_name);
            n++;
        }
        closedir(d);
        if (n) qsort(names, n, sizeof *names, cmp_str);
        for (size_t i = 0; i < n; i++) {
            struct stat fs;
            if (stat(names[i], &fs) == 0 && S_ISREG(fs.st_mode)) errors += replay_file(names[i], &count);
            free(names[i]);
        }
        free(names);
    }
    printf("fuzz_gguf_replay: %d inputs replayed, %d unreadable\n", count, errors);
    return errors ? 1 : 0;
}
#endif
