/*
 * simple.c — the smallest complete use of libtern: load a GGUF model, tokenize a prompt, decode,
 * sample greedily, print the continuation.
 *
 *   cc simple.c $(pkg-config --cflags --libs tern) -o simple
 *   ./simple model.gguf "Once upon a time" 32
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/tern.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s model.gguf PROMPT [N]\n", argv[0]);
        return 64;
    }
    const char *path = argv[1], *prompt = argv[2];
    int n_predict = argc > 3 ? atoi(argv[3]) : 32;

    tern_model *model = NULL;
    if (tern_model_load(path, NULL, &model) != TERN_OK) {
        fprintf(stderr, "error: %s\n", tern_last_error());
        return 65;
    }
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = 256;
    tern_ctx *ctx = NULL;
    tern_sampler_params sp;
    tern_sampler_params_init(&sp);
    sp.temp = 0.0f; /* greedy */
    tern_sampler *smp = NULL;
    if (tern_ctx_create(model, &cp, &ctx) != TERN_OK || tern_sampler_create(model, &sp, &smp) != TERN_OK) {
        fprintf(stderr, "error: %s\n", tern_last_error());
        tern_ctx_free(ctx);
        tern_model_free(model);
        return 70;
    }
    tern_token toks[1024]; /* a token per byte at most, plus BOS, for prompts up to ~300 bytes */
    int32_t n = 0;
    if (tern_tokenize(model, prompt, strlen(prompt), true, false, toks, 1024, &n) != TERN_OK || n == 0) {
        fprintf(stderr, "error: cannot tokenize the prompt: %s\n", tern_last_error());
        return 65;
    }
    printf("%s", prompt);
    tern_status s = tern_decode(ctx, toks, n);
    for (int i = 0; i < n_predict && s == TERN_OK; i++) {
        tern_token t = tern_sampler_sample(smp, tern_get_logits(ctx, -1));
        if (tern_token_is_eog(model, t)) break;
        char piece[64];
        int32_t k = tern_token_to_piece(model, t, piece, sizeof piece, false);
        if (k > 0) fwrite(piece, 1, (size_t)k, stdout);
        s = tern_decode(ctx, &t, 1);
    }
    printf("\n");
    tern_sampler_free(smp);
    tern_ctx_free(ctx);
    tern_model_free(model);
    return s == TERN_OK ? 0 : 70;
}
