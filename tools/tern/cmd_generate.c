/*
 * cmd_generate.c — `tern generate`: run a GGUF model on a prompt and stream the continuation to
 * stdout; timings to stderr. With no -m it runs tern's default model.
 */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/file.h"
#include "cli_spec.h"
#include "cli_pcache.h"

static volatile sig_atomic_t tn_interrupted;
static void on_sigint(int sig) {
    (void)sig;
    tn_interrupted = 1;
}

static void gen_usage(FILE *f) {
    fprintf(f,
            "usage: tern generate [-m model.gguf] [-p PROMPT | -f FILE] [options]\n"
            "  -m, --model FILE        GGUF model (default: tern's built-in default model)\n"
            "  -p, --prompt TEXT       prompt text\n"
            "  -f, --file FILE         read the prompt from a file\n"
            "  -n, --n-predict N       tokens to generate (default 128; -1 = until end or context full)\n"
            "  -c, --ctx-size N        context size (default: the model's, capped at 4096)\n"
            "  -t, --threads N         threads (default: number of CPUs)\n"
            "  -b, --batch-size N      prompt tokens per forward pass (default 512)\n"
            "  -s, --seed N            RNG seed (default: random; printed to stderr)\n"
            "      --temp X            temperature (default 0.8; 0 = greedy)\n"
            "      --top-k N           top-k (default 40; 0 = off)\n"
            "      --top-p X           top-p (default 0.95; 1 = off)\n"
            "      --min-p X           min-p (default 0.05; 0 = off)\n"
            "      --repeat-penalty X  repetition penalty (default 1.0 = off)\n"
            "      --repeat-last-n N   tokens the penalty looks back over (default 64)\n"
            "      --ignore-eos        keep generating past end-of-generation tokens\n"
            "      --no-mmap           read the model into memory instead of mapping it\n"
            "      --device cpu|cuda   run on the CPU (default) or an NVIDIA GPU (builds with the CUDA backend)\n"
            "      --spec ngram        speculative decoding with drafts from n-grams of the prompt and the text so far\n"
            "      --draft FILE        speculative decoding with a small draft model of the same vocabulary (both: n-grams first)\n"
            "      --draft-max N       at most N drafted tokens per step (default 8, 1..32); --draft-min N: fewer are not tried (default 1)\n"
            "      --draft-p-min P     the draft model stops drafting before a token it gives less than P (default 0)\n"
            "      --spec-ngram N      longest n-gram matched (default 3)\n"
            "  -ngl, --n-gpu-layers N  with --device cuda: the first N layers on the GPU, the rest on the CPU (-1: all)\n"
            "      --no-repack         keep q4_0/q8_0/q4_K/q5_K/q6_K/tq4/tq1 weights in the file layout (no interleaved copy)\n"
            TN_CLI_HOT_EXPERTS_HELP
            "      --lora FILE[:S]     apply a LoRA adapter (llama.cpp GGUF) with scale S (default 1); repeatable;\n"
            "                          --lora-scaled FILE S does the same\n"
            "      --swa-full          sliding-window layers keep every position (default: their window plus a batch)\n"
            TN_CLI_CACHE_TYPE_HELP
            "      --no-display-prompt do not echo the prompt\n"
            "      --dump-margins FILE with --temp 0: write the prompt's token ids, then per generated token its id and\n"
            "                          the margin top-1 minus top-2 and the RMS of the logits it was chosen from\n");
    tn_cli_pcache_usage(f);
}

/* Writes pending bytes up to the last complete UTF-8 sequence; keeps the rest for later. */
static void flush_utf8(char *buf, int *len, bool all) {
    int n = *len, cut = all ? n : (int)tn_utf8_complete(buf, (size_t)n);
    fwrite(buf, 1, (size_t)cut, stdout);
    fflush(stdout);
    memmove(buf, buf + cut, (size_t)(n - cut));
    *len = n - cut;
}

/* The lead of the largest logit over the runner-up (logit units; 0 for a tie) and the RMS of
 * the row (the scale a margin is judged against). */
static float top2_margin(const float *lg, int32_t n, double *rms) {
    float v1 = -INFINITY, v2 = -INFINITY;
    double ss = 0;
    for (int32_t i = 0; i < n; i++) {
        ss += (double)lg[i] * lg[i];
        if (lg[i] > v1) {
            v2 = v1, v1 = lg[i];
        } else if (lg[i] > v2) {
            v2 = lg[i];
        }
    }
    *rms = n > 0 ? sqrt(ss / n) : 0.0;
    return n > 1 ? v1 - v2 : 0.0f;
}

/* --dump-margins: a text file, "# ..." comment lines, "prompt ID ID ...", then one line
 * "STEP ID MARGIN RMS" per generated token (RMS: of the whole row of logits); written to a temp
 * file and renamed at the end. */
static void dump_line(tn_wfile *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void dump_line(tn_wfile *w, const char *fmt, ...) {
    char line[128];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (k > 0) tn_wfile_write(w, line, (size_t)TN_MIN(k, (int)sizeof line - 1));
}

int cmd_generate(int argc, char **argv) {
    const char *prompt = NULL, *prompt_file = NULL;
    int64_t n_predict = 128, seed = -1;
    bool ignore_eos = false, display_prompt = true;
    tn_cli_run run;
    tn_cli_run_init(&run);
    int dv;
    const char *dump_path = NULL;
    tn_cli_spec sr;
    tn_cli_spec_init(&sr);
    tn_cli_pcache pcf;
    tn_cli_pcache_init(&pcf);
    tern_sampler_params sp;
    tern_sampler_params_init(&sp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            gen_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            TN_CLI_NEED_VAL();
            prompt = val;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            TN_CLI_NEED_VAL();
            prompt_file = val;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            TN_CLI_NEED_VAL();
            if (!tn_cli_parse_i64(val, -1, 1 << 24, &n_predict)) return tn_cli_usage_error("%s: '%s' is not a number in -1..16777216", a, val);
        } else if ((dv = tn_cli_sampling_flag(argc, argv, &i, &sp, &seed)) != 0) {
            if (dv < 0) return TN_EXIT_USAGE;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
        } else if (!strcmp(a, "--no-display-prompt")) {
            display_prompt = false;
        } else if (!strcmp(a, "--dump-margins")) {
            TN_CLI_NEED_VAL();
            dump_path = val;
        } else if ((dv = tn_cli_run_flag(argc, argv, &i, &run)) != 0) {
            if (dv < 0) return TN_EXIT_USAGE;
        } else if ((dv = tn_cli_spec_flag(argc, argv, &i, &sr)) != 0) {
            if (dv < 0) return TN_EXIT_USAGE;
        } else if ((dv = tn_cli_pcache_flag(argc, argv, &i, &pcf)) != 0) {
            if (dv < 0) return TN_EXIT_USAGE;
        } else {
            gen_usage(stderr);
            return tn_cli_usage_error("unknown option '%s'", a);
        }
    }
    if (prompt && prompt_file) return tn_cli_usage_error("give either -p or -f, not both");
    if (dump_path && sp.temp != 0.0f) return tn_cli_usage_error("--dump-margins needs --temp 0 (greedy decoding)");
    if (dump_path && tn_cli_spec_on(&sr)) return tn_cli_usage_error("--dump-margins does not combine with --spec or --draft");
    {
        const char *ins[] = {run.model_path, prompt_file};
        int rc_out = dump_path ? tn_cli_check_output("--dump-margins", dump_path, ins, 2) : TN_EXIT_OK;
        if (rc_out != TN_EXIT_OK) return rc_out;
    }
    char *file_text = NULL;
    if (prompt_file) {
        size_t len = 0;
        tern_status s = tn_cli_read_file(prompt_file, &file_text, &len);
        if (s) return tn_cli_fail(s, "reading the prompt file");
        prompt = file_text;
    }
    if (!prompt) prompt = "";
    sp.seed = seed < 0 ? TERN_SEED_RANDOM : (uint64_t)seed;

    int rc = 0;
    tern_model *m = NULL;
    tern_ctx *c = NULL;
    tern_sampler *smp = NULL;
    tern_token *toks = NULL;
    tn_wfile dw = {0};
    bool dw_open = false;
    tern_status s = TERN_OK;
    if ((rc = tn_cli_run_open(&run, &m, &c)) != TN_EXIT_OK) goto done;
    const tern_ctx_params cp = run.cp;
    const char *model_path = run.model_path;
    const double t_load = run.t_load;
    const int32_t device = run.device;
    if ((rc = tn_cli_pcache_open(&pcf, m, c)) != TN_EXIT_OK) goto done;
    if ((s = tern_sampler_create(m, &sp, &smp))) {
        rc = tn_cli_fail(s, "creating the sampler");
        goto done;
    }
    if (tn_cli_spec_on(&sr) && (rc = tn_cli_spec_open(&sr, m, c, &cp, tern_ctx_n_ctx(c))) != TN_EXIT_OK) goto done;
    if (tn_cli_spec_on(&sr) && sr.kmax + 1 > tern_ctx_n_ctx(c)) {
        rc = tn_cli_usage_error("--draft-max %lld needs a context of more than %lld tokens", (long long)sr.kmax, (long long)sr.kmax);
        goto done;
    }
    size_t plen = strlen(prompt);
    int32_t n_prompt = 0;
    if ((s = tn_cli_tokenize(m, prompt, plen, true, true, &toks, &n_prompt))) {
        rc = tn_cli_fail(s, "tokenizing the prompt");
        goto done;
    }
    if (n_prompt == 0) { /* room for the start token added below */
        free(toks);
        toks = malloc(sizeof *toks);
        if (!toks) {
            rc = TN_EXIT_OSERR;
            goto done;
        }
    }
    if (n_prompt == 0) { /* a model needs at least one token to start from */
        tern_token b = tern_token_bos(m);
        toks[n_prompt++] = b >= 0 ? b : 0;
    }
    int32_t n_ctx_real = tern_ctx_n_ctx(c);
    if (n_prompt >= n_ctx_real) {
        fprintf(stderr, "tern: error: the prompt has %d tokens; the context holds %d (raise -c)\n", n_prompt, n_ctx_real);
        rc = TN_EXIT_USAGE;
        goto done;
    }
    fprintf(stderr, "tern: model %s (%s), %s, %d threads, ctx %d (KV %.1f MiB, K %s%s, V %s%s), seed %llu\n", model_path,
            tern_model_desc(m), device == TERN_DEVICE_CUDA ? "device cuda" : "device cpu", cp.n_threads, n_ctx_real,
            (double)tern_ctx_kv_bytes(c) / 1048576.0, tern_kv_type_name(tern_ctx_type_k(c)),
            tern_ctx_kv_rotated(c) & 1 ? " rotated" : "", tern_kv_type_name(tern_ctx_type_v(c)),
            tern_ctx_kv_rotated(c) & 2 ? " rotated" : "", (unsigned long long)tern_sampler_seed(smp));
    if (dump_path) {
        if ((s = tn_wfile_open(dump_path, &dw))) {
            rc = tn_cli_fail(s, "--dump-margins");
            goto done;
        }
        dw_open = true;
        dump_line(&dw, "# tern generate --dump-margins: the prompt's token ids, then per generated token: step id top1-top2 rms(logits)\n");
        dump_line(&dw, "prompt");
        for (int32_t i = 0; i < n_prompt; i++) dump_line(&dw, " %d", (int)toks[i]);
        dump_line(&dw, "\n");
    }
    signal(SIGINT, on_sigint);
    signal(SIGPIPE, SIG_IGN);
    char out[512];
    int out_len = 0;
    if (display_prompt) {
        fwrite(prompt, 1, plen, stdout);
        fflush(stdout);
    }
    for (int32_t i = 0; i < n_prompt; i++) tern_sampler_accept(smp, toks[i]);
    double t0 = tn_cli_now();
    const int32_t n_cached = tn_cli_pcache_load(&pcf, c, toks, n_prompt); /* whole blocks, never the last token */
    const double t_cached = tn_cli_now();
    if ((s = tern_decode(c, toks + n_cached, n_prompt - n_cached))) {
        rc = tn_cli_fail(s, "prompt processing");
        goto done;
    }
    double t_prompt = tn_cli_now() - t0;
    const double t_computed = tn_cli_now() - t_cached; /* the prefill alone: the cost model's speed */
    int64_t n_gen = 0;
    double t1 = tn_cli_now();
    if (!tn_cli_spec_on(&sr)) {
        while ((n_predict < 0 || n_gen < n_predict) && !tn_interrupted) {
            const float *lg = tern_get_logits(c, -1);
            tern_token t = tern_sampler_sample(smp, lg);
            if (dw_open) { /* the token chosen (greedy: the argmax) and its lead over the runner-up */
                double rms;
                const float mg = top2_margin(lg, tern_model_n_vocab(m), &rms);
                dump_line(&dw, "%lld %d %.6f %.6f\n", (long long)n_gen, (int)t, (double)mg, rms);
            }
            if (!ignore_eos && tern_token_is_eog(m, t)) break;
            n_gen++;
            int32_t k = tern_token_to_piece(m, t, out + out_len, (int32_t)sizeof out - out_len, false);
            if (k > 0) out_len += k;
            flush_utf8(out, &out_len, false);
            if (ferror(stdout)) break; /* reader went away (SIGPIPE ignored): stop quietly */
            if (tern_ctx_n_past(c) >= n_ctx_real) break;
            if ((s = tern_decode(c, &t, 1))) {
                rc = tn_cli_fail(s, "decoding");
                goto done;
            }
        }
    } else { /* speculative: the same tokens, several per verification pass where the drafts hold */
        memcpy(sr.hist, toks, sizeof *toks * (size_t)n_prompt);
        sr.n_hist = n_prompt;
        tern_token emit[64];
        int32_t n_emit = 1;
        emit[0] = tern_sampler_sample(smp, tern_get_logits(c, -1));
        bool stop = false;
        while (!stop && !tn_interrupted) {
            for (int32_t j = 0; j < n_emit && !stop; j++) { /* accepted drafts, then the new current token */
                const tern_token t = emit[j];
                if ((!ignore_eos && tern_token_is_eog(m, t)) || (n_predict >= 0 && n_gen >= n_predict)) {
                    stop = true;
                    break;
                }
                n_gen++;
                sr.hist[sr.n_hist++] = t;
                int32_t k = tern_token_to_piece(m, t, out + out_len, (int32_t)sizeof out - out_len, false);
                if (k > 0) out_len += k;
                flush_utf8(out, &out_len, false);
                if (ferror(stdout)) stop = true;
            }
            if (stop || (n_predict >= 0 && n_gen >= n_predict) || tern_ctx_n_past(c) >= n_ctx_real) break;
            /* room: the current token and the drafts must fit; no more drafts than tokens still wanted */
            int32_t kmax = (int32_t)TN_MIN(sr.kmax, n_ctx_real - tern_ctx_n_past(c) - 1);
            if (n_predict >= 0) kmax = (int32_t)TN_MIN((int64_t)kmax, n_predict - n_gen);
            /* emit: the accepted drafts, then the sampler's own next token (printed next round) */
            if ((s = tn_cli_spec_step(&sr, c, smp, kmax, emit, &n_emit))) {
                rc = tn_cli_fail(s, "decoding");
                goto done;
            }
        }
    }
    double t_gen = tn_cli_now() - t1;
    /* the prompt's blocks go to disk after the answer (positions < n_prompt are unchanged), so
     * storing never delays the first token */
    tn_cli_pcache_store(&pcf, c, toks, n_prompt, n_prompt - n_cached, t_computed);
    flush_utf8(out, &out_len, true);
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "\ntern: load %.0f ms | prompt %d tokens in %.0f ms (%.2f tok/s) | generated %lld tokens in %.0f ms (%.2f tok/s)\n",
            t_load * 1e3, n_prompt, t_prompt * 1e3, n_prompt / (t_prompt > 0 ? t_prompt : 1e-9), (long long)n_gen,
            t_gen * 1e3, n_gen / (t_gen > 0 ? t_gen : 1e-9));
    if (sr.steps)
        fprintf(stderr, "tern: speculation: %lld verification passes, %lld drafted, %lld accepted (%.1f%%), %.2f tokens per pass\n",
                (long long)sr.steps, (long long)sr.drafted, (long long)sr.accepted,
                sr.drafted ? 100.0 * (double)sr.accepted / (double)sr.drafted : 0.0, (double)n_gen / (double)sr.steps);
    tn_cli_hot_experts_report(c);
    if (tn_interrupted) rc = TN_EXIT_INTERRUPTED;
    else if (dw_open) { /* complete: in place by rename */
        dw_open = false;
        if ((s = tn_wfile_commit(&dw))) rc = tn_cli_fail(s, "--dump-margins");
    }
done:
    tn_cli_pcache_close(&pcf);
    if (dw_open) tn_wfile_abort(&dw);
    tn_cli_spec_free(&sr);
    free(toks);
    free(file_text);
    tern_sampler_free(smp);
    tern_ctx_free(c);
    tern_model_free(m);
    tn_cli_run_close(&run);
    return rc;
}
