/*
 * cmd_tokenizer_train.c — `tern tokenizer-train`: learn a byte-fallback BPE vocabulary from text
 * and write it as a GGUF holding only tokenizer.ggml.* metadata (SentencePiece-style "llama"
 * vocabulary, train/bpe.h), then check that tern's tokenizer round-trips a sample of the corpus.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/file.h"
#include "model/tokenizer.h"
#include "train/bpe.h"

static void tt_usage(FILE *f) {
    fprintf(f, "usage: tern tokenizer-train [--vocab N] -o tok.gguf corpus.txt...\n"
               "  --vocab N        vocabulary size (default 4096; >= 260: 3 special + 256 bytes + characters)\n"
               "  -o, --output F   output GGUF (tokenizer metadata only; use with tern train --tokenizer)\n");
}

int cmd_tokenizer_train(int argc, char **argv) {
    int64_t vocab = 4096;
    const char *out = NULL;
    const char **files = calloc((size_t)argc, sizeof *files);
    int nf = 0, rc = 0;
    if (!files) return tn_cli_fail(TERN_ERR_NOMEM, "tokenizer-train");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { tt_usage(stdout); free(files); return 0; }
        if (!strcmp(a, "--vocab") || !strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (i + 1 >= argc) { free(files); return tn_cli_usage_error("%s needs a value", a); }
            const char *val = argv[++i];
            if (a[1] == 'o' || a[2] == 'o') out = val;
            else if (!tn_cli_parse_i64(val, 260, 1 << 20, &vocab)) { free(files); return tn_cli_usage_error("--vocab: '%s' is not an integer in [260, 1048576]", val); }
        } else if (a[0] == '-' && a[1]) {
            free(files);
            return tn_cli_usage_error("tokenizer-train: unknown option '%s'", a);
        } else files[nf++] = a;
    }
    if (!out || !nf) { free(files); tt_usage(stderr); return TN_EXIT_USAGE; }
    if ((rc = tn_cli_check_output("-o", out, files, nf)) != TN_EXIT_OK) { free(files); return rc; }
    tn_map *maps = calloc((size_t)nf, sizeof *maps);
    const char **texts = calloc((size_t)nf, sizeof *texts);
    size_t *lens = calloc((size_t)nf, sizeof *lens);
    tn_vocab_data *v = NULL;
    tn_gguf_writer *w = NULL;
    tern_status s = TERN_OK;
    double t0 = tn_cli_now();
    size_t total = 0;
    if (!maps || !texts || !lens) { rc = tn_cli_fail(TERN_ERR_NOMEM, "tokenizer-train"); goto done; }
    for (int i = 0; i < nf; i++) {
        if ((s = tn_map_open(files[i], true, &maps[i]))) { rc = tn_cli_fail(s, "tokenizer-train"); goto done; }
        texts[i] = (const char *)maps[i].data;
        lens[i] = maps[i].size;
        total += lens[i];
        if ((s = tn_utf8_check(texts[i], lens[i], files[i]))) { rc = tn_cli_fail(s, "tokenizer-train"); goto done; }
    }
    if ((s = tn_bpe_train(texts, lens, nf, (int32_t)vocab, &v))) { rc = tn_cli_fail(s, "tokenizer-train"); goto done; }
    if ((s = tn_gguf_writer_create(&w)) || (s = tn_gguf_set_str(w, "general.architecture", "llama")) ||
        (s = tn_gguf_set_str(w, "general.name", "tern tokenizer")) || (s = tn_vocab_data_write(v, w)) ||
        (s = tn_gguf_write(w, out, NULL, NULL))) {
        rc = tn_cli_fail(s, "tokenizer-train");
        goto done;
    }
    /* round trip through tern's own tokenizer on a sample of each file */
    {
        tn_gguf *g;
        tn_vocab *tv = NULL;
        if ((s = tn_gguf_open(out, true, &g)) || (s = tn_vocab_load(g, &tv))) {
            if (g) tn_gguf_free(g);
            rc = tn_cli_fail(s, "tokenizer-train: reloading the vocabulary");
            goto done;
        }
        tn_gguf_free(g);
        size_t checked = 0, ntok = 0;
        bool ok = true;
        for (int i = 0; i < nf && ok; i++) {
            size_t n = lens[i] < 65536 ? lens[i] : 65536;
            while (n && n < lens[i] && (texts[i][n] & 0xC0) == 0x80) n--; /* whole characters */
            int32_t cnt = 0;
            tn_tokenize(tv, texts[i], n, false, false, NULL, 0, &cnt);
            int32_t *ids = malloc(((size_t)cnt + 1) * sizeof *ids);
            char *back = malloc(n + 64);
            if (!ids || !back) { free(ids); free(back); break; }
            tn_tokenize(tv, texts[i], n, false, false, ids, cnt, &cnt);
            int32_t bl = tn_detokenize(tv, ids, cnt, back, (int32_t)n + 64, true, false);
            ok = bl == (int32_t)n && !memcmp(back, texts[i], n);
            checked += n;
            ntok += (size_t)cnt;
            free(ids);
            free(back);
        }
        tn_vocab_free(tv);
        if (!ok) {
            fprintf(stderr, "tern: error: tokenizer-train: tern's tokenizer does not round-trip the corpus with the new "
                            "vocabulary (a bug; please report)\n");
            rc = TN_EXIT_SOFTWARE;
            goto done;
        }
        fprintf(stderr, "tern tokenizer-train: %d tokens from %.2f MB in %.1f s -> %s; round trip of %zu bytes ok "
                        "(%.2f bytes/token)\n", v->n, total / 1e6, tn_cli_now() - t0, out, checked,
                ntok ? (double)checked / (double)ntok : 0.0);
    }
done:
    if (maps)
        for (int i = 0; i < nf; i++) tn_map_close(&maps[i]);
    free(maps);
    free(texts);
    free(lens);
    free(files);
    tn_vocab_data_free(v);
    tn_gguf_writer_free(w);
    return rc;
}
