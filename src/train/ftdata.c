/*
 * ftdata.c — fine-tuning samples: JSONL chats (loss on assistant turns) and plain text. See ftdata.h.
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/file.h"
#include "model/chat.h"
#include "train/bpe.h"
#include "train/ftdata.h"

/* Growable samples: n rows of T+1 (tok, keep). */
typedef struct samples {
    int32_t *tok;
    uint8_t *keep;
    int64_t n, cap;
    int T;
} samples;

static tern_status samples_add(samples *S, const int32_t *tok, const uint8_t *keep, int64_t len, int32_t pad) {
    const size_t W = (size_t)S->T + 1;
    if (S->n == S->cap) {
        int64_t nc = S->cap ? S->cap * 2 : 64;
        int32_t *t = tn_realloc(S->tok, (size_t)nc * W * sizeof *t);
        if (t) S->tok = t;
        uint8_t *k = tn_realloc(S->keep, (size_t)nc * W);
        if (k) S->keep = k;
        if (!t || !k) return tn_err(TERN_ERR_NOMEM, "train: fine-tuning samples (%lld)", (long long)nc);
        S->cap = nc;
    }
    int32_t *dt = S->tok + (size_t)S->n * W;
    uint8_t *dk = S->keep + (size_t)S->n * W;
    for (size_t i = 0; i < W; i++) {
        const bool in = (int64_t)i < len;
        dt[i] = in ? tok[i] : pad;
        dk[i] = in ? keep[i] : 0;
    }
    S->n++;
    return TERN_OK;
}

/* A growable token list with keep flags. */
typedef struct toks {
    int32_t *id;
    uint8_t *keep;
    int64_t n, cap;
} toks;

static tern_status toks_tokenize(toks *L, const tern_model *m, const char *text, size_t len, bool parse_special, bool keep) {
    for (;;) {
        int32_t got = 0;
        const int64_t room = L->cap - L->n;
        tern_status s = tern_tokenize(m, text, len, false, parse_special, L->id ? L->id + L->n : NULL,
                                      (int32_t)(room > INT32_MAX ? INT32_MAX : room), &got);
        if (s == TERN_OK) {
            memset(L->keep + L->n, keep, (size_t)got);
            L->n += got;
            return TERN_OK;
        }
        if (s != TERN_ERR_FULL) return s;
        int64_t nc = TN_MAX(L->cap * 2, L->n + got + 256);
        int32_t *t = tn_realloc(L->id, (size_t)nc * sizeof *t);
        if (t) L->id = t;
        uint8_t *k = tn_realloc(L->keep, (size_t)nc);
        if (k) L->keep = k;
        if (!t || !k) return tn_err(TERN_ERR_NOMEM, "train: tokens (%lld)", (long long)nc);
        L->cap = nc;
    }
}

static tern_status toks_push(toks *L, int32_t id, bool keep) {
    if (L->n == L->cap) {
        int64_t nc = L->cap ? L->cap * 2 : 256;
        int32_t *t = tn_realloc(L->id, (size_t)nc * sizeof *t);
        if (t) L->id = t;
        uint8_t *k = tn_realloc(L->keep, (size_t)nc);
        if (k) L->keep = k;
        if (!t || !k) return tn_err(TERN_ERR_NOMEM, "train: tokens");
        L->cap = nc;
    }
    L->id[L->n] = id;
    L->keep[L->n++] = keep;
    return TERN_OK;
}

/* One chat line into L (BOS, then the rendered segments; assistant segments kept). FORMAT with a
 * message (no file:line: the caller adds it). */
static tern_status chat_line(const tern_model *m, tern_chat_template tpl, const char *line, size_t len, toks *L) {
    json_error_t je;
    json_t *root = json_loadb(line, len, 0, &je);
    tern_status s = TERN_OK;
    tern_chat_msg *msgs = NULL;
    if (!root) return tn_err(TERN_ERR_FORMAT, "not JSON (%s at column %d)", je.text, je.column);
    json_t *arr = json_is_object(root) ? json_object_get(root, "messages") : NULL;
    if (!json_is_array(arr) || !json_array_size(arr)) {
        s = tn_err(TERN_ERR_FORMAT, "expected {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}");
        goto done;
    }
    const size_t n = json_array_size(arr);
    msgs = tn_calloc(n, sizeof *msgs);
    if (!msgs) { s = tn_err(TERN_ERR_NOMEM, "train: chat"); goto done; }
    bool any_assistant = false;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(arr, i), *r = json_object_get(e, "role"), *c = json_object_get(e, "content");
        if (!json_is_string(r) || !json_is_string(c)) {
            s = tn_err(TERN_ERR_FORMAT, "message %zu needs string \"role\" and \"content\"", i + 1);
            goto done;
        }
        const char *role = json_string_value(r);
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) {
            s = tn_err(TERN_ERR_FORMAT, "message %zu: role '%.32s' (expected system, user or assistant)", i + 1, role);
            goto done;
        }
        any_assistant |= !strcmp(role, "assistant");
        msgs[i] = (tern_chat_msg){.role = role, .content = json_string_value(c), .len = json_string_length(c)};
    }
    if (!any_assistant) { s = tn_err(TERN_ERR_FORMAT, "the chat has no assistant turn (nothing to train on)"); goto done; }
    const int32_t bos = tern_token_bos(m);
    if (bos >= 0 && tern_vocab_add_bos(m) && (s = toks_push(L, bos, false))) goto done;
    size_t done_len = 0; /* bytes of the rendered chat already tokenized */
    for (size_t i = 0; i < n; i++) {
        const bool asst = !strcmp(msgs[i].role, "assistant");
        size_t plen = 0, flen = 0;
        char *prompt = asst ? tn_chat_render(tpl, msgs, i, true, &plen) : NULL;
        char *full = tn_chat_render(tpl, msgs, i + 1, false, &flen);
        if ((asst && !prompt) || !full) {
            s = tn_err(TERN_ERR_FORMAT, "the %s chat template cannot render message %zu: %s", tern_chat_template_name(tpl),
                       i + 1, tern_last_error());
        } else if ((asst && (plen < done_len || plen > flen || memcmp(prompt, full, plen))) || flen < done_len) {
            s = tn_err(TERN_ERR_UNSUPPORTED, "the %s chat template does not render this chat incrementally (message %zu); "
                       "the assistant tokens cannot be told apart", tern_chat_template_name(tpl), i + 1);
        } else {
            const size_t cut = asst ? plen : flen; /* prompt text up to cut, then the answer */
            s = toks_tokenize(L, m, full + done_len, cut - done_len, true, false);
            if (!s && asst) s = toks_tokenize(L, m, full + cut, flen - cut, true, true);
            done_len = flen;
        }
        tn_free(prompt);
        tn_free(full);
        if (s) goto done;
    }
done:
    tn_free(msgs);
    json_decref(root);
    return s;
}

static void notef(void (*note)(const char *, void *), void *user, const char *fmt, ...) TN_PRINTF(3, 4);
static void notef(void (*note)(const char *, void *), void *user, const char *fmt, ...) {
    if (!note) return;
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    note(buf, user);
}

tern_status tn_ft_samples(const tern_model *m, const char *const *paths, int n, int T, bool skip_bad,
                          void (*note)(const char *msg, void *user), void *user, int32_t **tok, uint8_t **keep,
                          int64_t *n_samples, tn_ft_stats *st) {
    *tok = NULL;
    *keep = NULL;
    *n_samples = 0;
    memset(st, 0, sizeof *st);
    samples S = {.T = T};
    toks text = {0}, chat = {0};
    tern_status s = TERN_OK;
    const tern_chat_template tpl = tern_chat_template_detect(m);
    const int32_t bos = tern_token_bos(m);
    for (int f = 0; f < n && !s; f++) {
        tn_map map;
        if ((s = tn_map_open(paths[f], true, &map))) break;
        const char *p = (const char *)map.data, *end = p + map.size;
        if ((s = tn_utf8_check(p, map.size, paths[f]))) { tn_map_close(&map); break; }
        if (tn_str_ends_with(paths[f], ".jsonl")) {
            for (int64_t line = 1; p < end && !s; line++) {
                const char *nl = memchr(p, '\n', (size_t)(end - p));
                const size_t len = (size_t)((nl ? nl : end) - p);
                size_t b = 0;
                while (b < len && (p[b] == ' ' || p[b] == '\t' || p[b] == '\r')) b++;
                if (b < len) {
                    chat.n = 0;
                    s = chat_line(m, tpl, p, len, &chat);
                    if (s == TERN_ERR_FORMAT || s == TERN_ERR_UNSUPPORTED) {
                        char msg[512];
                        snprintf(msg, sizeof msg, "%s", tern_last_error());
                        char *at = strrchr(msg, '[');  /* drop the inner " [file.c:line]" */
                        if (at && at > msg && at[-1] == ' ' && msg[strlen(msg) - 1] == ']') at[-1] = 0;
                        if (skip_bad) {
                            notef(note, user, "%s:%lld: skipped: %s", paths[f], (long long)line, msg);
                            st->n_skipped++;
                            s = TERN_OK;
                        } else {
                            s = tn_err(TERN_ERR_FORMAT, "train: %s:%lld: %s (--skip-bad-lines skips such lines)", paths[f],
                                       (long long)line, msg);
                        }
                    } else if (!s) {
                        st->n_chats++;
                        if (chat.n > T + 1) st->n_cut++;
                        const int64_t len2 = TN_MIN(chat.n, (int64_t)T + 1);
                        st->n_tokens += len2;
                        for (int64_t i = 1; i < len2; i++) st->n_trained += chat.keep[i];
                        s = samples_add(&S, chat.id, chat.keep, len2, 0);
                    }
                }
                p += len + (nl ? 1 : 0);
            }
        } else {
            /* paragraphs at blank lines, each with BOS */
            while (p < end && !s) {
                const char *q = p;
                while (q < end && !(q[0] == '\n' && q + 1 < end && q[1] == '\n')) q++;
                size_t b = 0;
                while (p + b < q && (p[b] == '\n' || p[b] == ' ' || p[b] == '\r' || p[b] == '\t')) b++;
                if (p + b < q) {
                    if (bos >= 0 && tern_vocab_add_bos(m)) s = toks_push(&text, bos, true);
                    if (!s) s = toks_tokenize(&text, m, p + b, (size_t)(q - p - b), false, true);
                }
                p = q < end ? q + 2 : q;
            }
        }
        tn_map_close(&map);
    }
    /* plain text: windows of T+1 overlapping by one */
    for (int64_t w = 0; !s && text.n >= 2 && w * T + 1 < text.n; w++) {
        const int64_t len = TN_MIN((int64_t)T + 1, text.n - w * T);
        st->n_text_windows++;
        st->n_tokens += len - (w ? 1 : 0);
        st->n_trained += len - 1;
        s = samples_add(&S, text.id + w * T, text.keep + w * T, len, 0);
    }
    tn_free(text.id);
    tn_free(text.keep);
    tn_free(chat.id);
    tn_free(chat.keep);
    if (!s && !st->n_trained)
        s = tn_err(TERN_ERR_FORMAT, "train: the data has no tokens to train on (%s%s)%s", n ? paths[0] : "?", n > 1 ? ", ..." : "",
                   st->n_cut ? ": every chat's answer lies past the context (--ctx)" : "");
    if (s) {
        tn_free(S.tok);
        tn_free(S.keep);
        return s;
    }
    *tok = S.tok;
    *keep = S.keep;
    *n_samples = S.n;
    return TERN_OK;
}
