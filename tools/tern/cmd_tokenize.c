/*
 * cmd_tokenize.c — `tern tokenize -m model.gguf -p TEXT`: token ids and pieces, one per line, and
 * a check that detokenizing gives the text back.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cmd_tokenize(int argc, char **argv) {
    const char *model_path = NULL, *text = NULL, *file = NULL;
    bool add_special = true, ids_only = false, parse_special = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: tern tokenize [-m model.gguf] (-p TEXT | -f FILE) [--ids] [--no-bos] [--no-parse-special]\n");
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && val) {
            model_path = argv[++i];
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && val) {
            text = argv[++i];
        } else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && val) {
            file = argv[++i];
        } else if (!strcmp(a, "--ids")) {
            ids_only = true;
        } else if (!strcmp(a, "--no-bos")) {
            add_special = false;
        } else if (!strcmp(a, "--no-parse-special")) {
            parse_special = false;
        } else {
            return tn_cli_usage_error("unknown option or missing value '%s'", a);
        }
    }
    if (!text && !file) return tn_cli_usage_error("tokenize needs -p TEXT or -f FILE");
    char *buf = NULL;
    size_t len = text ? strlen(text) : 0;
    if (file) {
        tern_status s = tn_cli_read_file(file, &buf, &len);
        if (s) return tn_cli_fail(s, "reading the text");
        text = buf;
    }
    char defp[4096];
    if (!model_path) {
        if (!tn_cli_default_model(defp, sizeof defp)) {
            free(buf);
            fprintf(stderr, "tern: error: no -m given and the default model was not found\n");
            return TN_EXIT_NOINPUT;
        }
        model_path = defp;
    }
    tern_model *m = NULL;
    tern_status s = tern_model_load(model_path, NULL, &m);
    if (s) {
        free(buf);
        return tn_cli_fail(s, "loading the model");
    }
    int rc = 0;
    int32_t n = 0;
    tern_token *toks = NULL;
    char *piece = malloc(1024), *back = NULL;
    if (!piece) {
        rc = TN_EXIT_OSERR;
        goto done;
    }
    if ((s = tn_cli_tokenize(m, text, len, add_special, parse_special, &toks, &n))) {
        rc = tn_cli_fail(s, "tokenizing");
        goto done;
    }
    if (ids_only) {
        printf("[");
        for (int32_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", toks[i]);
        printf("]\n");
    } else {
        for (int32_t i = 0; i < n; i++) {
            int32_t k = tern_token_to_piece(m, toks[i], piece, 1023, true);
            if (k < 0) k = 0;
            printf("%6d -> '", toks[i]);
            for (int32_t j = 0; j < k; j++) {
                unsigned char ch = (unsigned char)piece[j];
                if (ch == '\n') printf("\\n");
                else if (ch == '\t') printf("\\t");
                else if (ch < 0x20 || ch == 0x7f) printf("\\x%02x", ch);
                else putchar(ch);
            }
            printf("'\n");
        }
        fprintf(stderr, "tern: %d tokens\n", n);
    }
    /* round trip: detokenizing the ids must give the text back */
    int32_t bcap = (int32_t)(len * 2 + 64);
    back = malloc((size_t)bcap);
    if (back) {
        int32_t skip = n > 0 && toks[0] == tern_token_bos(m) ? 1 : 0; /* the BOS that tokenize added */
        int32_t k = tern_detokenize(m, toks + skip, n - skip, back, bcap, true, false);
        bool same = k >= 0 && (size_t)k == len && memcmp(back, text, len) == 0;
        fprintf(stderr, "tern: detokenized text %s the input\n", same ? "matches" : "differs from");
    }
done:
    free(back);
    free(piece);
    free(toks);
    free(buf);
    tern_model_free(m);
    return rc;
}
