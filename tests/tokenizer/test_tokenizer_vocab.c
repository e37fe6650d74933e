/*
 * test_tokenizer_vocab.c — tern's tokenizer against llama.cpp's own test vectors.
 *
 * For every $TERN_SHARED_DIR/models/vocab/ggml-vocab-*.gguf: split the .inp file into cases the
 * way llama.cpp's tests/test-tokenizer-0.cpp does (separator "\n__ggml_vocab_test__\n", the
 * text after the last separator is a case only if non-empty), tokenize each with
 * add_special = false, parse_special = false, and compare with the .out line (ids separated by
 * spaces, line stripped) exactly. SPM vocabularies (llama-spm, phi-3, stories260K) also get
 * llama.cpp's tests/test-tokenizer-1-spm.cpp checks: every token's piece re-tokenizes (with
 * parse_special) to something that detokenizes to the same text, and every code point outside
 * surrogates and U+40000..U+E0000 survives tokenize + detokenize. For every vocabulary, all
 * cases on which llama.cpp's detokenizer space cleaning cannot act must round-trip exactly.
 * With $TERN_SHARED_DIR/data/eval_200k.txt present, each vocabulary also tokenizes those 200 KB
 * (timed; must stay far below 10 s).
 *
 * Needs the shared folder: exits 77 (skipped) when $TERN_SHARED_DIR/models is absent. Plain C
 * (no cmocka) so that the skip is a process exit code.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt/gguf.h"
#include "model/tokenizer.h"

static int g_fail;

#define CHECK(c, ...)                                \
    do {                                             \
        if (!(c)) {                                  \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);            \
            fprintf(stderr, "\n");                   \
            g_fail++;                                \
        }                                            \
    } while (0)

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)sz + 1);
    if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) p[sz] = 0;
    *n = (size_t)sz;
    return p;
}

typedef struct ids {
    int32_t *p;
    int32_t n, cap;
} ids;

static int32_t *tokenize(const tn_vocab *v, const char *s, size_t n, bool add_special, bool parse_special, int32_t *count) {
    int32_t cap = (int32_t)n + 8, got = 0;
    int32_t *out = malloc((size_t)cap * sizeof *out);
    tern_status st = tn_tokenize(v, s, n, add_special, parse_special, out, cap, &got);
    if (st == TERN_ERR_FULL) {
        free(out);
        cap = got;
        out = malloc((size_t)(cap ? cap : 1) * sizeof *out);
        st = tn_tokenize(v, s, n, add_special, parse_special, out, cap, &got);
    }
    if (st != TERN_OK) {
        fprintf(stderr, "tokenize failed: %s\n", tern_last_error());
        g_fail++;
        got = 0;
    }
    *count = got;
    return out;
}

/* llama.cpp's common_detokenize(special): remove_leading_space is what llama_detokenize does
 * with remove_special = false. Returns a malloc'd NUL-terminated string. */
static char *detokenize(const tn_vocab *v, const int32_t *t, int32_t n, bool special, int32_t *len) {
    int32_t need = tn_detokenize(v, t, n, NULL, 0, true, special);
    if (need == INT32_MIN) {
        *len = -1;
        return NULL;
    }
    int32_t cap = need < 0 ? -need : need;
    char *buf = malloc((size_t)cap + 1);
    int32_t got = tn_detokenize(v, t, n, buf, cap, true, special);
    if (got < 0) got = 0;
    buf[got] = 0;
    *len = got;
    return buf;
}

static void print_ids(const char *what, const int32_t *t, int32_t n) {
    fprintf(stderr, "  %s:", what);
    for (int32_t i = 0; i < n; i++) fprintf(stderr, " %d", t[i]);
    fprintf(stderr, "\n");
}

/* Parses one .out line (string_strip + split on ' ' + stoi). */
static int32_t parse_ids(const char *line, size_t n, int32_t *out) {
    while (n && (line[n - 1] == ' ' || line[n - 1] == '\t' || line[n - 1] == '\r')) n--;
    while (n && (*line == ' ' || *line == '\t')) line++, n--;
    int32_t k = 0;
    size_t i = 0;
    while (i < n) {
        out[k++] = (int32_t)strtol(line + i, NULL, 10);
        const char *sp = memchr(line + i, ' ', n - i);
        if (!sp) break;
        i = (size_t)(sp - line) + 1;
    }
    return k;
}

/* Text on which llama.cpp's space cleaning (BPE detokenize) would act. */
static bool has_cleanable(const char *s, size_t n) {
    static const char *const pat[] = {" ?", " !", " .", " ,", " '"};
    for (size_t k = 0; k < sizeof pat / sizeof *pat; k++)
        for (size_t i = 0; i + 2 <= n; i++)
            if (memcmp(s + i, pat[k], 2) == 0) return true;
    return false;
}

static int run_cases(const tn_vocab *v, const char *name, const char *inp, size_t inp_n, const char *outf, size_t out_n) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_n = sizeof sep - 1;
    /* output lines */
    const char *lines[1024];
    size_t lens[1024];
    int n_lines = 0;
    for (size_t i = 0; i < out_n && n_lines < 1024;) {
        const char *nl = memchr(outf + i, '\n', out_n - i);
        size_t e = nl ? (size_t)(nl - outf) : out_n;
        lines[n_lines] = outf + i;
        lens[n_lines++] = e - i;
        i = e + 1;
    }
    int n_case = 0, n_pass = 0, n_rt = 0, n_rt_ok = 0;
    size_t pos = 0;
    while (pos < inp_n) {
        const char *nx = NULL;
        for (size_t j = pos; j + sep_n <= inp_n; j++)
            if (memcmp(inp + j, sep, sep_n) == 0) {
                nx = inp + j;
                break;
            }
        size_t cl = nx ? (size_t)(nx - inp) - pos : inp_n - pos;
        const char *cs = inp + pos;
        if (n_case >= n_lines) {
            CHECK(0, "%s: more cases than .out lines", name);
            return 1;
        }
        int32_t *expect = malloc((lens[n_case] + 1) * sizeof *expect);
        int32_t ne = parse_ids(lines[n_case], lens[n_case], expect);
        int32_t ng;
        int32_t *got = tokenize(v, cs, cl, false, false, &ng);
        bool ok = ng == ne && memcmp(got, expect, (size_t)ng * sizeof *got) == 0;
        if (ok) n_pass++;
        else {
            fprintf(stderr, "%s: case %d mismatch: '%.*s'\n", name, n_case, (int)cl, cs);
            print_ids("expected", expect, ne);
            print_ids("got     ", got, ng);
            g_fail++;
        }
        /* round trip, where clean_up_tokenization_spaces cannot change the text */
        if (!has_cleanable(cs, cl)) {
            int32_t dl;
            char *d = detokenize(v, got, ng, false, &dl);
            bool same = d && (size_t)dl == cl && memcmp(d, cs, cl) == 0;
            n_rt++;
            if (same) n_rt_ok++;
            else {
                fprintf(stderr, "%s: case %d '%.*s' detokenizes to '%s'\n", name, n_case, (int)cl, cs, d ? d : "(null)");
                g_fail++;
            }
            free(d);
        }
        free(expect);
        free(got);
        n_case++;
        if (!nx) break;
        pos = (size_t)(nx - inp) + sep_n;
    }
    CHECK(n_case == n_lines, "%s: %d cases but %d .out lines", name, n_case, n_lines);
    printf("%-32s %d/%d cases match llama.cpp; detokenize round-trips %d/%d\n", name, n_pass, n_case, n_rt_ok, n_rt);
    return 0;
}

/* llama.cpp tests/test-tokenizer-1-spm.cpp */
static void spm_roundtrips(const tn_vocab *v, const char *name) {
    int n = tn_vocab_n(v), bad = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t l1, nt, l2;
        char *str = detokenize(v, &i, 1, true, &l1);
        int32_t *t = tokenize(v, str, (size_t)l1, false, true, &nt);
        char *check = detokenize(v, t, nt, true, &l2);
        if (l1 != l2 || memcmp(str, check, (size_t)l1) != 0) {
            if (bad++ < 5) fprintf(stderr, "%s: token %d detokenizes to '%s' but its tokens give '%s'\n", name, i, str, check);
        }
        free(str);
        free(t);
        free(check);
    }
    CHECK(bad == 0, "%s: %d tokens do not round-trip", name, bad);
    int bad_cp = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if ((cp >= 0xD800 && cp <= 0xDFFF) || (cp >= 0x40000 && cp <= 0xE0000)) continue;
        char u[4];
        int m;
        if (cp < 0x80) u[0] = (char)cp, m = 1;
        else if (cp < 0x800) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)), m = 2;
        else if (cp < 0x10000) u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 63)), u[2] = (char)(0x80 | (cp & 63)), m = 3;
        else
            u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 63)), u[2] = (char)(0x80 | ((cp >> 6) & 63)),
            u[3] = (char)(0x80 | (cp & 63)), m = 4;
        int32_t t[16], nt = 0, l;
        if (tn_tokenize(v, u, (size_t)m, false, true, t, 16, &nt) != TERN_OK) {
            bad_cp++;
            continue;
        }
        char *check = detokenize(v, t, nt, true, &l);
        if (cp != 9601 && (l != m || memcmp(check, u, (size_t)m) != 0)) {
            if (bad_cp++ < 5) fprintf(stderr, "%s: code point 0x%x detokenizes to '%s'\n", name, cp, check);
        }
        free(check);
    }
    CHECK(bad_cp == 0, "%s: %d code points do not round-trip", name, bad_cp);
    printf("%-32s token and code point round trips: %d + %d failures\n", name, bad, bad_cp);
}

/* Tokenizing 200 KB must take well under a second; fail only on a gross regression (10 s),
 * since sanitizer builds and loaded CI machines are slower. */
static void timing(const tn_vocab *v, const char *name, const char *text, size_t n) {
    if (!text) return;
    int32_t cap = (int32_t)n + 16, got = 0;
    int32_t *out = malloc((size_t)cap * sizeof *out);
    double t0 = tn_time_s();
    tern_status s = tn_tokenize(v, text, n, true, true, out, cap, &got);
    double dt = tn_time_s() - t0;
    CHECK(s == TERN_OK, "%s: tokenizing %zu bytes: %s", name, n, tern_last_error());
    CHECK(dt < 10.0, "%s: tokenizing %zu bytes took %.2f s", name, n, dt);
    int32_t need = tn_detokenize(v, out, got, NULL, 0, true, false);
    printf("%-32s %zu bytes -> %d tokens in %.3f s (detokenized: %d bytes)\n", name, n, got, dt, need < 0 ? -need : need);
    free(out);
}

static tn_vocab *load(const char *path) {
    tn_gguf *g = NULL;
    tn_vocab *v = NULL;
    tern_status s = tn_gguf_open(path, true, &g);
    if (s == TERN_OK) s = tn_vocab_load(g, &v);
    tn_gguf_free(g); /* the vocab keeps copies of what it needs */
    if (s != TERN_OK) {
        fprintf(stderr, "FAIL: loading %s: %s\n", path, tern_last_error());
        g_fail++;
        return NULL;
    }
    return v;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(void) {
    const char *shared = getenv("TERN_SHARED_DIR");
    char dir[4096];
    struct stat st;
    snprintf(dir, sizeof dir, "%s/models", shared ? shared : "../shared");
    if (!shared || stat(dir, &st) != 0) {
        printf("skipped: %s not found\n", dir);
        return 77;
    }
    snprintf(dir, sizeof dir, "%s/models/vocab", shared);
    DIR *d = opendir(dir);
    char *names[64];
    int nn = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) && nn < 64) {
            size_t l = strlen(e->d_name);
            if (strncmp(e->d_name, "ggml-vocab-", 11) == 0 && l > 5 && strcmp(e->d_name + l - 5, ".gguf") == 0) names[nn++] = strdup(e->d_name);
        }
        closedir(d);
    }
    qsort(names, (size_t)nn, sizeof *names, cmp_str);
    char tpath[4300];
    size_t big_n = 0;
    snprintf(tpath, sizeof tpath, "%s/data/eval_200k.txt", shared);
    char *big = read_file(tpath, &big_n);
    CHECK(nn > 0, "no ggml-vocab-*.gguf in %s", dir);
    for (int i = 0; i < nn; i++) {
        char path[4300], pin[4400], pout[4400];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        snprintf(pin, sizeof pin, "%s.inp", path);
        snprintf(pout, sizeof pout, "%s.out", path);
        size_t ni, no;
        char *inp = read_file(pin, &ni), *outf = read_file(pout, &no);
        tn_vocab *v = load(path);
        if (v && inp && outf) {
            run_cases(v, names[i], inp, ni, outf, no);
            if (strcmp(tn_vocab_type_name(v), "spm") == 0) spm_roundtrips(v, names[i]);
            timing(v, names[i], big, big_n);
        } else {
            CHECK(inp && outf, "%s: missing .inp/.out", names[i]);
        }
        tn_vocab_free(v);
        free(inp);
        free(outf);
        free(names[i]);
    }

    /* stories260K: SPM, 512 tokens */
    char path[4300];
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K-F32.gguf", shared);
    tn_vocab *v = load(path);
    if (v) {
        CHECK(tn_vocab_n(v) == 512, "stories260K: %d tokens", tn_vocab_n(v));
        CHECK(strcmp(tn_vocab_type_name(v), "spm") == 0, "stories260K: type %s", tn_vocab_type_name(v));
        CHECK(tn_vocab_bos(v) == 1 && tn_vocab_eos(v) == 2 && tn_vocab_unk(v) == 0 && tn_vocab_pad(v) == -1, "stories260K: special ids");
        CHECK(tn_vocab_add_bos(v) && !tn_vocab_add_eos(v) && tn_vocab_add_space_prefix(v), "stories260K: flags");
        CHECK(tn_vocab_is_eog(v, 2) && !tn_vocab_is_eog(v, 1), "stories260K: eog");
        spm_roundtrips(v, "stories260K");
        timing(v, "stories260K", big, big_n);
        tn_vocab_free(v);
    }
    free(big);
    printf("%s\n", g_fail ? "FAILED" : "all passed");
    return g_fail ? 1 : 0;
}
