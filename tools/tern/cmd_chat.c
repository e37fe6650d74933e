/*
 * cmd_chat.c — `tern chat`: an interactive conversation with a model in its chat template
 * (llama-cli's conversation mode). Reads a line (a trailing '\' continues it on the next line),
 * streams the answer to stdout, keeps the KV cache across turns: each turn renders the whole
 * conversation, tokenizes it, and decodes only what differs from the tokens already in the cache.
 * /reset starts over, /exit or end of input quits. Ctrl-C stops an answer; at the prompt it quits
 * (exit 130). The prompt "> ", the notes and the timings go to stderr (the prompt only when stdin
 * is a terminal), so piped input gives the answers alone on stdout, one per line.
 * The end of an answer: an end-of-generation token, the template's end-of-turn token(s), or the
 * template's end-of-turn text (held back until it cannot be the start of one, never printed).
 * A full context: the oldest exchanges are dropped (the system prompt stays), with a note.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "model/chat.h"
#include "cli_pcache.h"

static volatile sig_atomic_t tn_chat_sigint;
static void on_sigint(int sig) {
    (void)sig;
    tn_chat_sigint = 1;
}

static void chat_usage(FILE *f) {
    fprintf(f,
            "usage: tern chat [-m model.gguf] [-sys TEXT] [options]\n"
            "  -m, --model FILE        GGUF model (default: tern's built-in default model)\n"
            "  -sys, --system-prompt TEXT  system message that opens the conversation\n"
            "      --chat-template NAME  chat template (default: the model's): chatml, llama2, llama3, qwen3, gemma, phi3, phi4, gpt-oss\n"
            "  -n, --n-predict N       most tokens per answer (default -1: until the end of the turn or a full context)\n"
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
            "      --no-mmap           read the model into memory instead of mapping it\n"
            "      --no-repack         keep q4_0/q8_0/q4_K/q5_K/q6_K/tq4/tq1 weights in the file layout\n"
            TN_CLI_HOT_EXPERTS_HELP
            "      --lora FILE[:S]     apply a LoRA adapter (llama.cpp GGUF) with scale S (default 1); repeatable;\n"
            "                          --lora-scaled FILE S does the same\n"
            "      --device cpu|cuda   run on the CPU (default) or an NVIDIA GPU; -ngl N: layers on the GPU\n"
            TN_CLI_CACHE_TYPE_HELP
            "In the conversation: a line ending in '\\' continues on the next line; /reset clears the\n"
            "conversation, /exit (or Ctrl-D) quits; Ctrl-C stops an answer, at the prompt it quits.\n");
    tn_cli_pcache_usage(f);
}

typedef struct {
    const char *role; /* a string literal */
    char *text;
    size_t len;
} chat_turn;

typedef struct {
    const tern_model *m;
    tern_ctx *c;
    tern_sampler *smp;
    tern_chat_template tmpl;
    const char *const *stops; /* the template's end-of-turn strings                              */
    tern_token stop_tok[4];   /* ... those of them that are one token of the vocabulary          */
    int n_stop_tok;
    chat_turn *turns;
    size_t n_turns, cap_turns;
    size_t n_keep;            /* turns never dropped: the system prompt                          */
    tern_token *cached;       /* the tokens in the KV cache, in order                            */
    int32_t n_cached, n_ctx;
    int64_t n_predict;
    tn_cli_pcache pcf;        /* --prompt-cache: blocks loaded before a prefill, stored after a turn */
} chat_state;

static bool push_turn(chat_state *st, const char *role, const char *text, size_t len) {
    if (st->n_turns == st->cap_turns) {
        size_t cap = st->cap_turns ? 2 * st->cap_turns : 16;
        chat_turn *t = realloc(st->turns, cap * sizeof *t);
        if (!t) return false;
        st->turns = t, st->cap_turns = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) return false;
    memcpy(copy, text, len);
    copy[len] = 0;
    st->turns[st->n_turns++] = (chat_turn){role, copy, len};
    return true;
}

static void drop_turns(chat_state *st, size_t from, size_t n) {
    for (size_t i = from; i < from + n; i++) free(st->turns[i].text);
    memmove(st->turns + from, st->turns + from + n, (st->n_turns - from - n) * sizeof *st->turns);
    st->n_turns -= n;
}

/* The conversation rendered with the assistant header and tokenized (BOS as the model wants). */
static tern_status render_tokens(chat_state *st, tern_token **toks, int32_t *n) {
    tern_chat_msg *msgs = malloc((st->n_turns + 1) * sizeof *msgs);
    if (!msgs) return TERN_ERR_NOMEM;
    for (size_t i = 0; i < st->n_turns; i++) msgs[i] = (tern_chat_msg){st->turns[i].role, st->turns[i].text, st->turns[i].len};
    size_t len = 0;
    char *text = NULL;
    tern_status s = tern_chat_apply(st->tmpl, msgs, st->n_turns, true, NULL, 0, &len);
    if (s == TERN_ERR_FULL) s = (text = malloc(len + 1)) ? tern_chat_apply(st->tmpl, msgs, st->n_turns, true, text, len + 1, &len) : TERN_ERR_NOMEM;
    if (!s) s = tn_cli_tokenize(st->m, text, len, true, true, toks, n);
    free(text);
    free(msgs);
    return s;
}

/* Makes the KV cache hold toks[0..n): keeps the common prefix with what it holds, decodes the rest.
 * *reused gets the number of tokens kept. */
static tern_status sync_cache(chat_state *st, const tern_token *toks, int32_t n, int32_t *reused) {
    int32_t p = 0;
    while (p < n && p < st->n_cached && toks[p] == st->cached[p]) p++;
    if (p == n) p = n - 1; /* the last token is decoded again: its logits start the answer */
    tern_status s = tern_ctx_truncate(st->c, p);
    if (s) return s;
    p = tern_ctx_n_past(st->c); /* less when sliding-window layers lost the window (0) */
    st->n_cached = p;
    for (int32_t i = p; i < n; i++) tern_sampler_accept(st->smp, toks[i]);
    const int32_t loaded = tn_cli_pcache_load(&st->pcf, st->c, toks, n); /* whole blocks from the disk cache */
    memcpy(st->cached + p, toks + p, (size_t)loaded * sizeof *toks);
    p += loaded;
    st->n_cached = p;
    if ((s = tern_decode(st->c, toks + p, n - p))) return s;
    memcpy(st->cached + p, toks + p, (size_t)(n - p) * sizeof *toks);
    st->n_cached = n;
    *reused = p;
    return TERN_OK;
}

static bool is_stop_token(const chat_state *st, tern_token t) {
    if (tern_token_is_eog(st->m, t)) return true;
    for (int k = 0; k < st->n_stop_tok; k++)
        if (st->stop_tok[k] == t) return true;
    return false;
}

typedef enum { ANSWER_DONE, ANSWER_LIMIT, ANSWER_INTERRUPTED, ANSWER_CTX_FULL } answer_end;

/* Samples and streams one answer; its text (as printed) goes to *out (malloc'd). */
static tern_status answer(chat_state *st, char **out, size_t *out_len, int64_t *n_gen, answer_end *end) {
    size_t cap = 256, len = 0, shown = 0; /* text[0..shown) is printed; the rest is held back */
    char *text = malloc(cap);
    if (!text) return TERN_ERR_NOMEM;
    *end = ANSWER_DONE;
    *n_gen = 0;
    tern_status s = TERN_OK;
    for (;;) {
        if (tn_chat_sigint) {
            *end = ANSWER_INTERRUPTED;
            break;
        }
        if (st->n_predict >= 0 && *n_gen >= st->n_predict) {
            *end = ANSWER_LIMIT;
            break;
        }
        const tern_token t = tern_sampler_sample(st->smp, tern_get_logits(st->c, -1));
        if (is_stop_token(st, t)) break;
        (*n_gen)++;
        char piece[256];
        int32_t k = tern_token_to_piece(st->m, t, piece, sizeof piece, false);
        if (k < 0) k = 0;
        if (len + (size_t)k + 1 > cap) {
            char *bigger = realloc(text, cap = 2 * cap + (size_t)k);
            if (!bigger) {
                s = TERN_ERR_NOMEM;
                break;
            }
            text = bigger;
        }
        memcpy(text + len, piece, (size_t)k);
        len += (size_t)k;
        size_t upto = shown;
        if (tn_chat_stop_scan(st->stops, text, &len, shown, &upto)) break; /* the end string as text */
        if (upto > shown) {
            fwrite(text + shown, 1, upto - shown, stdout);
            fflush(stdout);
            shown = upto;
        }
        if (st->n_cached >= st->n_ctx) {
            *end = ANSWER_CTX_FULL;
            break;
        }
        if ((s = tern_decode(st->c, &t, 1))) break;
        st->cached[st->n_cached++] = t;
    }
    fwrite(text + shown, 1, len - shown, stdout); /* what was held back and is not an end string */
    fputc('\n', stdout);
    fflush(stdout);
    *out = text;
    *out_len = len;
    return s;
}

/* Reads one user message: a line, continued while it ends in '\'. NULL at end of input or after
 * a Ctrl-C. */
static char *read_message(bool tty, size_t *len) {
    char *msg = NULL, *line = NULL;
    size_t n = 0, cap = 0;
    *len = 0;
    if (tty) fputs("> ", stderr);
    for (;;) {
        if (tn_chat_sigint) break; /* Ctrl-C since the last answer: quit */
        ssize_t k = getline(&line, &cap, stdin);
        if (k < 0) {
            if (msg && !tn_chat_sigint) { /* input ended after a '\': send what there is */
                free(line);
                *len = n;
                return msg;
            }
            break;
        }
        if (k && line[k - 1] == '\n') line[--k] = 0;
        const bool more = k && line[k - 1] == '\\';
        if (more) line[--k] = '\n'; /* the continuation becomes a newline of the message */
        char *grown = realloc(msg, n + (size_t)k + 1);
        if (!grown) break;
        msg = grown;
        memcpy(msg + n, line, (size_t)k);
        n += (size_t)k;
        msg[n] = 0;
        if (!more) {
            free(line);
            *len = n;
            return msg;
        }
        if (tty) fputs(". ", stderr);
    }
    free(line);
    free(msg);
    return NULL;
}

/* Drops the oldest exchanges (the turns after the system prompt up to the next user message)
 * until the rendered conversation leaves `room` tokens free; *toks gets its tokens. TERN_ERR_FULL
 * when even the last message alone does not fit. */
static tern_status fit_context(chat_state *st, int32_t room, tern_token **toks, int32_t *n, size_t *dropped) {
    *dropped = 0;
    for (;;) {
        tern_status s = render_tokens(st, toks, n);
        if (s) return s;
        if (*n + room <= st->n_ctx) return TERN_OK;
        free(*toks);
        *toks = NULL;
        if (st->n_turns <= st->n_keep + 1) return TERN_ERR_FULL;
        size_t k = 1; /* one turn, and the answers after it */
        while (st->n_keep + k < st->n_turns - 1 && strcmp(st->turns[st->n_keep + k].role, "user")) k++;
        drop_turns(st, st->n_keep, k);
        *dropped += k;
    }
}

int cmd_chat(int argc, char **argv) {
    const char *system = NULL, *tmpl_name = NULL;
    int64_t n_predict = -1, seed = -1;
    tn_cli_run run;
    tn_cli_run_init(&run);
    int dv;
    tern_sampler_params sp;
    tern_sampler_params_init(&sp);
    chat_state st;
    memset(&st, 0, sizeof st);
    tn_cli_pcache_init(&st.pcf);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            chat_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-sys") || !strcmp(a, "--system-prompt")) {
            TN_CLI_NEED_VAL();
            system = val;
        } else if (!strcmp(a, "--chat-template")) {
            TN_CLI_NEED_VAL();
            tmpl_name = val;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            TN_CLI_NEED_VAL();
            if (!tn_cli_parse_i64(val, -1, 1 << 24, &n_predict)) return tn_cli_usage_error("%s: '%s' is not a number in -1..16777216", a, val);
        } else if ((dv = tn_cli_sampling_flag(argc, argv, &i, &sp, &seed)) != 0 ||
                   (dv = tn_cli_run_flag(argc, argv, &i, &run)) != 0 || (dv = tn_cli_pcache_flag(argc, argv, &i, &st.pcf)) != 0) {
            if (dv < 0) return TN_EXIT_USAGE;
        } else {
            chat_usage(stderr);
            return tn_cli_usage_error("unknown option '%s'", a);
        }
    }
    if (tmpl_name && !tn_cli_chat_template(tmpl_name, &st.tmpl)) return TN_EXIT_USAGE;
    sp.seed = seed < 0 ? TERN_SEED_RANDOM : (uint64_t)seed;

    int rc = 0;
    tern_model *m = NULL;
    if ((rc = tn_cli_run_open(&run, &m, &st.c)) != TN_EXIT_OK) return rc;
    tern_status s;
    st.m = m;
    if (!tmpl_name) st.tmpl = tern_chat_template_detect(m);
    st.stops = tern_chat_template_stops(st.tmpl);
    st.n_stop_tok = tern_chat_stop_tokens(m, st.tmpl, st.stop_tok, 4);
    if ((rc = tn_cli_pcache_open(&st.pcf, m, st.c)) != TN_EXIT_OK) goto done;
    if ((s = tern_sampler_create(m, &sp, &st.smp))) {
        rc = tn_cli_fail(s, "creating the sampler");
        goto done;
    }
    st.n_ctx = tern_ctx_n_ctx(st.c);
    st.n_predict = n_predict;
    st.cached = malloc((size_t)st.n_ctx * sizeof *st.cached);
    if (!st.cached || (system && !push_turn(&st, "system", system, strlen(system)))) {
        rc = tn_cli_fail(TERN_ERR_NOMEM, "starting the conversation");
        goto done;
    }
    st.n_keep = st.n_turns;
    const bool tty = isatty(STDIN_FILENO);
    fprintf(stderr, "tern chat: model %s (%s), chat template %s, ctx %d, %d threads, seed %llu\n", run.model_path, tern_model_desc(m),
            tern_chat_template_name(st.tmpl), st.n_ctx, run.cp.n_threads, (unsigned long long)tern_sampler_seed(st.smp));
    if (tty) fprintf(stderr, "tern chat: /reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C stops an answer\n");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint; /* no SA_RESTART: Ctrl-C at the prompt interrupts the read */
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* a turn must leave room for an answer: n_predict tokens, else a quarter of the context */
    const int32_t room = n_predict > 0 && n_predict < st.n_ctx / 2 ? (int32_t)n_predict : st.n_ctx / 4 > 0 ? st.n_ctx / 4 : 1;
    for (;;) {
        size_t len = 0;
        char *line = read_message(tty, &len);
        if (!line) {
            if (tn_chat_sigint) rc = TN_EXIT_INTERRUPTED;
            break;
        }
        const char *b = line;
        size_t blen = len;
        while (blen && (*b == ' ' || *b == '\t')) b++, blen--;
        while (blen && (b[blen - 1] == ' ' || b[blen - 1] == '\t' || b[blen - 1] == '\r')) blen--;
        if (blen == 5 && !memcmp(b, "/exit", 5)) {
            free(line);
            break;
        }
        if (blen == 6 && !memcmp(b, "/reset", 6)) {
            drop_turns(&st, st.n_keep, st.n_turns - st.n_keep);
            st.n_cached = 0;
            tern_ctx_truncate(st.c, 0);
            fprintf(stderr, "tern chat: conversation reset\n");
            free(line);
            continue;
        }
        if (blen == 0) {
            free(line);
            continue;
        }
        bool ok = push_turn(&st, "user", line, len);
        free(line);
        if (!ok) {
            rc = tn_cli_fail(TERN_ERR_NOMEM, "adding the message");
            break;
        }
        tern_token *toks = NULL;
        int32_t n = 0, reused = 0;
        size_t dropped = 0;
        s = fit_context(&st, room, &toks, &n, &dropped);
        if (s == TERN_ERR_FULL) {
            fprintf(stderr, "tern chat: this message does not fit the context of %d tokens with room for an answer "
                            "(raise -c or write less); it was not sent\n", st.n_ctx);
            drop_turns(&st, st.n_turns - 1, 1);
            fputc('\n', stdout); /* one line per message in */
            fflush(stdout);
            continue;
        }
        if (s) {
            rc = tn_cli_fail(s, "rendering the conversation");
            break;
        }
        if (dropped)
            fprintf(stderr, "tern chat: context full (%d tokens): dropped the %zu oldest message%s of the conversation\n", st.n_ctx,
                    dropped, dropped == 1 ? "" : "s");
        double t0 = tn_cli_now();
        s = sync_cache(&st, toks, n, &reused);
        free(toks);
        if (s) {
            rc = tn_cli_fail(s, "prompt processing");
            break;
        }
        double t1 = tn_cli_now();
        char *text = NULL;
        size_t text_len = 0;
        int64_t n_gen = 0;
        answer_end end;
        s = answer(&st, &text, &text_len, &n_gen, &end);
        double t2 = tn_cli_now();
        tn_cli_pcache_store(&st.pcf, st.c, st.cached, st.n_cached, 0, 0); /* the turn's new whole blocks */
        if (s) {
            free(text);
            rc = tn_cli_fail(s, "decoding");
            break;
        }
        ok = push_turn(&st, "assistant", text, text_len);
        free(text);
        if (!ok) {
            rc = tn_cli_fail(TERN_ERR_NOMEM, "adding the answer");
            break;
        }
        if (end == ANSWER_INTERRUPTED) {
            tn_chat_sigint = 0; /* that Ctrl-C was for the answer; the next one at the prompt quits */
            fprintf(stderr, "tern chat: answer stopped (Ctrl-C)\n");
        }
        else if (end == ANSWER_CTX_FULL)
            fprintf(stderr, "tern chat: context full (%d tokens): answer cut; the oldest messages will be dropped next turn\n", st.n_ctx);
        fprintf(stderr, "tern chat: prompt %d tokens (%d cached, %d new) in %.0f ms | answer %lld tokens in %.0f ms (%.2f tok/s)\n", n,
                reused, n - reused, (t1 - t0) * 1e3, (long long)n_gen, (t2 - t1) * 1e3, n_gen / (t2 - t1 > 0 ? t2 - t1 : 1e-9));
    }
done:
    tn_cli_pcache_close(&st.pcf);
    for (size_t i = 0; i < st.n_turns; i++) free(st.turns[i].text);
    free(st.turns);
    free(st.cached);
    tern_sampler_free(st.smp);
    tern_ctx_free(st.c);
    tern_model_free(m);
    tn_cli_run_close(&run);
    return rc;
}
