/*
 * cmd_perplexity.c — `tern perplexity -m model.gguf -f text.txt [-c 512]`: llama-perplexity's
 * method, so numbers compare across the two:
 *   - the whole text is tokenized once with BOS (if the vocab adds one);
 *   - it is cut into n_tokens / n_ctx non-overlapping chunks of n_ctx tokens;
 *   - each chunk starts from an empty cache with its first token replaced by BOS;
 *   - only the second half is scored: logits at positions n_ctx/2 .. n_ctx-2 predict the next
 *     token, nll = logsumexp(logits) - logit[next];  PPL = exp(mean nll).
 * With --kl-divergence-base F the scored logits are also saved (f16) to F; with
 * --kl-divergence (and the same F) a second model is compared against them: mean KL(base||model),
 * same-top-token rate, and both perplexities over the same tokens.
 *
 * KLD file: "TERNKLD1" u32 n_ctx u32 n_vocab u32 n_chunk u32 n_tokens, i32 tokens[n_tokens],
 * then per chunk (n_ctx - 1 - n_ctx/2) rows of n_vocab f16 logits.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "core/file.h"
#include "core/fp16.h"
#include "model/ops.h"

static volatile sig_atomic_t g_stop;
static void on_sigint(int sig) {
    (void)sig;
    g_stop = 1;
}

static void usage(void) {
    printf("usage: tern perplexity -m model.gguf -f text.txt [options]\n"
           "  -c, --ctx-size N          chunk length in tokens (default 512)\n"
           "  -t, --threads N           threads (default: all cores)\n"
           "  --chunks N                score at most N chunks (default: all)\n"
           "  --kl-divergence-base F    save the scored logits (f16) to F for later comparisons\n"
           "  --kl-divergence           compare against the logits in --kl-divergence-base F\n"
           "  --device cpu|cuda         run on the CPU (default) or an NVIDIA GPU; -ngl N: layers on the GPU\n"
           "  --lora FILE[:S]           apply a LoRA adapter with scale S (default 1); repeatable; also --lora-scaled FILE S\n"
           TN_CLI_CACHE_TYPE_HELP);
}

int cmd_perplexity(int argc, char **argv) {
    const char *model_path = NULL, *text_path = NULL, *kld_path = NULL;
    int64_t n_ctx = 512, threads = 0, max_chunks = -1;
    bool kld_mode = false;
    int32_t device = TERN_DEVICE_CPU, ngl = -1, type_k = 0, type_v = 0, kv_rot = 0;
    tn_cli_lora lora = {0};
    int dv;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const bool more = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && more) {
            model_path = argv[++i];
        } else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && more) {
            text_path = argv[++i];
        } else if ((!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) && more) {
            if (!tn_cli_parse_i64(argv[++i], 8, 1 << 20, &n_ctx)) return tn_cli_usage_error("bad context size '%s'", argv[i]);
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && more) {
            if (!tn_cli_parse_i64(argv[++i], 1, 1024, &threads)) return tn_cli_usage_error("bad thread count '%s'", argv[i]);
        } else if (!strcmp(a, "--chunks") && more) {
            if (!tn_cli_parse_i64(argv[++i], 1, INT32_MAX, &max_chunks)) return tn_cli_usage_error("bad chunk count '%s'", argv[i]);
        } else if (!strcmp(a, "--kl-divergence-base") && more) {
            kld_path = argv[++i];
        } else if (!strcmp(a, "--kl-divergence")) {
            kld_mode = true;
        } else if ((dv = tn_cli_device_flag(argc, argv, &i, &device, &ngl)) != 0 ||
                   (dv = tn_cli_lora_flag(argc, argv, &i, &lora)) != 0 ||
                   (dv = tn_cli_cache_type_flag(argc, argv, &i, &type_k, &type_v, &kv_rot)) != 0) {
            if (dv < 0) return tn_cli_lora_free(&lora), TN_EXIT_USAGE;
        } else {
            return tn_cli_usage_error("unknown argument '%s' (see tern perplexity --help)", a);
        }
    }
    if (!model_path) return tn_cli_lora_free(&lora), tn_cli_usage_error("missing -m model.gguf");
    if (!text_path && !kld_mode) return tn_cli_usage_error("missing -f text.txt");
    if (kld_mode && !kld_path) return tn_cli_usage_error("--kl-divergence needs --kl-divergence-base FILE");
    if (kld_path && !kld_mode) {
        const char *const inputs[] = {model_path, text_path};
        const int orc = tn_cli_check_output("--kl-divergence-base", kld_path, inputs, 2);
        if (orc != TN_EXIT_OK) return orc;
    }

    int rc = TN_EXIT_OK;
    tern_model *m = NULL;
    tern_ctx *c = NULL;
    char *text = NULL;
    tern_token *toks = NULL;
    FILE *kf = NULL;    /* --kl-divergence: the base file read */
    tn_wfile kw = {0};  /* --kl-divergence-base without it: the base file written (temp + rename) */
    bool kw_open = false;
    uint16_t *row16 = NULL;
    float *base = NULL;
    tern_model_params mp;
    tern_model_params_init(&mp);
    mp.repack = device == TERN_DEVICE_CPU; /* the GPU reads the file's layouts */
    tern_status s = tern_model_load(model_path, &mp, &m);
    if (s) return tn_cli_fail(s, "loading the model");
    const int n_vocab = tern_model_n_vocab(m);
    int64_t n_tok = 0;
    uint32_t hdr[4];

    if (kld_mode) {
        kf = fopen(kld_path, "rb");
        char magic[8];
        if (!kf) {
            rc = TN_EXIT_NOINPUT;
            fprintf(stderr, "tern: error: cannot open '%s': %s\n", kld_path, strerror(errno));
            goto out;
        }
        if (fread(magic, 1, 8, kf) != 8 || memcmp(magic, "TERNKLD1", 8) || fread(hdr, 4, 4, kf) != 4) {
            rc = TN_EXIT_DATAERR;
            fprintf(stderr, "tern: error: '%s' is not a tern KL-divergence base file\n", kld_path);
            goto out;
        }
        if ((int)hdr[1] != n_vocab) {
            rc = TN_EXIT_DATAERR;
            fprintf(stderr, "tern: error: '%s' has n_vocab %u, the model %d\n", kld_path, hdr[1], n_vocab);
            goto out;
        }
        /* the header as the writer makes it (n_ctx as -c allows, n_tokens = n_chunk x n_ctx), and
         * the file exactly as long as it implies: checked before anything is allocated or read */
        if (hdr[0] < 8 || hdr[0] > (1u << 20) || hdr[2] < 1 || (uint64_t)hdr[2] * hdr[0] != hdr[3]) {
            rc = TN_EXIT_DATAERR;
            fprintf(stderr, "tern: error: '%s' has an inconsistent header (n_ctx %u, %u chunks, %u tokens)\n", kld_path,
                    hdr[0], hdr[2], hdr[3]);
            goto out;
        }
        const uint64_t rows = (uint64_t)hdr[2] * (hdr[0] - 1 - hdr[0] / 2);
        const uint64_t want = 24 + 4 * (uint64_t)hdr[3] + rows * (uint64_t)n_vocab * 2;
        struct stat st;
        if (fstat(fileno(kf), &st) || (uint64_t)st.st_size != want) {
            rc = TN_EXIT_DATAERR;
            fprintf(stderr, "tern: error: '%s' has %lld bytes; its header (%u chunks of %u tokens, n_vocab %u) needs %llu%s\n",
                    kld_path, (long long)st.st_size, hdr[2], hdr[0], hdr[1], (unsigned long long)want,
                    (uint64_t)st.st_size < want ? " (truncated)" : "");
            goto out;
        }
        n_ctx = hdr[0];
        n_tok = hdr[3];
        toks = malloc(sizeof *toks * (size_t)(n_tok + 1));
        if (!toks) { rc = TN_EXIT_OSERR; fprintf(stderr, "tern: error: out of memory for %lld tokens\n", (long long)n_tok); goto out; }
        if (fread(toks, sizeof *toks, (size_t)n_tok, kf) != (size_t)n_tok) {
            rc = TN_EXIT_DATAERR;
            fprintf(stderr, "tern: error: '%s' is truncated (reading its tokens)\n", kld_path);
            goto out;
        }
        for (int64_t i = 0; i < n_tok; i++)
            if (toks[i] < 0 || toks[i] >= n_vocab) {
                rc = TN_EXIT_DATAERR;
                fprintf(stderr, "tern: error: '%s' holds token %d at %lld, outside the model's vocabulary (%d)\n", kld_path,
                        (int)toks[i], (long long)i, n_vocab);
                goto out;
            }
    } else {
        size_t len = 0;
        s = tn_cli_read_file(text_path, &text, &len);
        if (s) { rc = tn_cli_fail(s, "reading the text"); goto out; }
        /* (tn_cli_tokenize grows the buffer when byte fallback needs more tokens than bytes: a
         * binary text used to stop here with an internal error, exit 70) */
        int32_t n = 0;
        s = tn_cli_tokenize(m, text, len, true, false, &toks, &n);
        if (s) { rc = tn_cli_fail(s, "tokenizing"); goto out; }
        n_tok = n;
    }
    if (!kld_mode && n_tok < 2 * n_ctx) {
        fprintf(stderr, "tern: error: need at least %lld tokens for -c %lld; the text has %lld\n", (long long)(2 * n_ctx),
                (long long)n_ctx, (long long)n_tok);
        rc = TN_EXIT_DATAERR;
        goto out;
    }
    int64_t n_chunk = n_tok / n_ctx;
    if (kld_mode) n_chunk = hdr[2];
    if (max_chunks > 0 && n_chunk > max_chunks) n_chunk = max_chunks;
    const int first = (int)(n_ctx / 2), n_score = (int)(n_ctx - 1 - first);

    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = (int32_t)n_ctx;
    cp.n_batch = (int32_t)n_ctx;
    cp.logits_all = true;
    cp.device = device;
    cp.n_gpu_layers = ngl;
    cp.type_k = type_k, cp.type_v = type_v, cp.kv_rotate = kv_rot;
    if (threads > 0) cp.n_threads = (int32_t)threads;
    s = tern_ctx_create(m, &cp, &c);
    if (s) { rc = tn_cli_fail(s, "creating the context"); goto out; }
    if ((rc = tn_cli_lora_open(&lora, m, c)) != TN_EXIT_OK) goto out;

    row16 = malloc(sizeof *row16 * (size_t)n_vocab);
    base = malloc(sizeof *base * (size_t)n_vocab);
    if (!row16 || !base) { rc = TN_EXIT_OSERR; goto out; }
    if (kld_path && !kld_mode) {
        if ((s = tn_wfile_open(kld_path, &kw))) { rc = tn_cli_fail(s, "--kl-divergence-base"); goto out; }
        kw_open = true;
        uint32_t h[4] = {(uint32_t)n_ctx, (uint32_t)n_vocab, (uint32_t)n_chunk, (uint32_t)(n_chunk * n_ctx)};
        tn_wfile_write(&kw, "TERNKLD1", 8);
        tn_wfile_write(&kw, h, sizeof h);
        tn_wfile_write(&kw, toks, sizeof *toks * (size_t)(n_chunk * n_ctx));
    }

    fprintf(stderr, "perplexity: %lld tokens, %lld chunks of %lld (scoring the last %d of each), n_vocab %d\n",
            (long long)n_tok, (long long)n_chunk, (long long)n_ctx, n_score, n_vocab);
    signal(SIGINT, on_sigint);
    const tern_token bos = tern_token_bos(m);
    const bool add_bos = tern_vocab_add_bos(m) && bos >= 0;
    double nll = 0, nll2 = 0, nll_base = 0, kld = 0, kld2 = 0;
    int64_t count = 0, same_top = 0;
    const double t0 = tn_cli_now();
    tern_token *chunk = malloc(sizeof *chunk * (size_t)n_ctx);
    if (!chunk) { rc = TN_EXIT_OSERR; goto out; }
    for (int64_t ci = 0; ci < n_chunk && !g_stop && !(kw_open && kw.err); ci++) { /* a write error ends it early */
        memcpy(chunk, toks + ci * n_ctx, sizeof *chunk * (size_t)n_ctx);
        if (add_bos) chunk[0] = bos;
        if ((s = tern_ctx_truncate(c, 0)) || (s = tern_decode(c, chunk, (int32_t)n_ctx))) {
            free(chunk);
            rc = tn_cli_fail(s, "decoding");
            goto out;
        }
        for (int i = 0; i < n_score; i++) {
            const float *l = tern_get_logits(c, first + i);
            const int tok = chunk[first + i + 1];
            int64_t imax;
            const double z = tn_op_logsumexp(l, n_vocab, &imax);
            const double v = z - l[tok];
            nll += v;
            nll2 += v * v;
            if (kld_path && !kld_mode) {
                for (int j = 0; j < n_vocab; j++) row16[j] = tn_fp32_to_fp16(l[j]);
                tn_wfile_write(&kw, row16, 2 * (size_t)n_vocab);
            } else if (kld_mode) {
                if (fread(row16, 2, (size_t)n_vocab, kf) != (size_t)n_vocab) {
                    free(chunk);
                    rc = TN_EXIT_DATAERR;
                    fprintf(stderr, "\ntern: error: '%s' is truncated\n", kld_path);
                    goto out;
                }
                for (int j = 0; j < n_vocab; j++) base[j] = tn_fp16_to_fp32(row16[j]);
                int64_t ibase;
                const double zb = tn_op_logsumexp(base, n_vocab, &ibase);
                nll_base += zb - base[tok];
                double kl = 0;
                for (int j = 0; j < n_vocab; j++) {
                    const double lpb = base[j] - zb, lp = l[j] - z;
                    kl += exp(lpb) * (lpb - lp);
                }
                kld += kl;
                kld2 += kl * kl;
                same_top += imax == ibase;
            }
        }
        count += n_score;
        const double el = tn_cli_now() - t0;
        fprintf(stderr, "\rperplexity: [%lld/%lld] PPL %.4f  %.1f s, ETA %.1f s   ", (long long)ci + 1, (long long)n_chunk,
                exp(nll / count), el, el / (ci + 1) * (n_chunk - ci - 1));
        printf("[%lld]%.4f,", (long long)ci + 1, exp(nll / count));
        fflush(stdout);
    }
    free(chunk);
    fprintf(stderr, "\n");
    printf("\n");
    if (g_stop) {
        fprintf(stderr, "tern: interrupted\n");
        rc = TN_EXIT_INTERRUPTED;
        goto out; /* the base file's temp is removed below */
    }
    if (kw_open) { /* the base file complete: in place by rename */
        kw_open = false;
        if ((s = tn_wfile_commit(&kw))) { rc = tn_cli_fail(s, "--kl-divergence-base"); goto out; }
    }
    {
        const double mean = nll / count, var = nll2 / count - mean * mean;
        const double ppl = exp(mean);
        printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, var > 0 ? sqrt(var / (count - 1)) * ppl : 0.0);
        if (kld_mode) {
            const double mk = kld / count, vk = kld2 / count - mk * mk;
            printf("base PPL = %.4f (same tokens)\n", exp(nll_base / count));
            printf("Mean KLD: %.6f +/- %.6f\n", mk, vk > 0 ? sqrt(vk / (count - 1)) : 0.0);
            printf("Same top token: %.3f%%\n", 100.0 * (double)same_top / (double)count);
        }
    }
out:
    if (kf) fclose(kf);
    if (kw_open) tn_wfile_abort(&kw);
    free(base);
    free(row16);
    free(toks);
    free(text);
    tern_ctx_free(c);
    tn_cli_lora_free(&lora);
    tern_model_free(m);
    return rc;
}
