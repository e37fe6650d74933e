/*
 * chat.c — chat templates written out in C, shared by `tern serve` and `tern chat`: their names,
 * their detection and their rendering. A file's tokenizer.chat_template (Jinja) is only scanned for
 * markers, never executed (the marker order is llama.cpp's llm_chat_detect_template, restricted to
 * the templates below). BOS is never rendered: tokenizing with add_special adds it as the model says.
 * The renderings follow llama.cpp's built-in ones (src/llama-chat.cpp) except where noted:
 *  - llama2 follows Meta's template: an answer is " answer </s><s>" (llama.cpp: "answer</s>"), a
 *    system message is wrapped in <<SYS>> inside the first [INST].
 *  - qwen3 is chatml, plus what Qwen3's own template does with an earlier answer: an assistant
 *    message before the last user message keeps only the text after its last "</think>", leading
 *    newlines dropped (llama.cpp's built-in renders Qwen3 as plain chatml). The generation prompt is
 *    "<|im_start|>assistant\n" (thinking on, the template's default), so the model may think first.
 * Rendering writes into the caller's buffer and counts what did not fit (snprintf's contract), so
 * it allocates nothing and cannot fail half way.
 */
#include <string.h>

#include "core/base.h"
#include "model/chat.h"
#include "model/model.h"
#include "model/tokenizer_impl.h"

static const char *const tn_chat_names[TERN_CHAT_N_TEMPLATES] = {
    [TERN_CHAT_CHATML] = "chatml", [TERN_CHAT_LLAMA2] = "llama2", [TERN_CHAT_LLAMA3] = "llama3", [TERN_CHAT_QWEN3] = "qwen3",
    [TERN_CHAT_GEMMA] = "gemma",   [TERN_CHAT_PHI3] = "phi3",     [TERN_CHAT_PHI4] = "phi4",
    [TERN_CHAT_GPT_OSS] = "gpt-oss",
};

const char *tern_chat_template_name(tern_chat_template t) {
    return (unsigned)t < TERN_CHAT_N_TEMPLATES ? tn_chat_names[t] : NULL;
}

tern_status tern_chat_template_from_name(const char *name, tern_chat_template *out) {
    for (int t = 0; name && t < TERN_CHAT_N_TEMPLATES; t++)
        if (!strcmp(name, tn_chat_names[t])) {
            *out = (tern_chat_template)t;
            return TERN_OK;
        }
    return tn_err(TERN_ERR_INVALID_ARG, "chat: unknown template '%s' (known: chatml, llama2, llama3, qwen3, gemma, phi3, phi4, gpt-oss)",
                  name ? name : "(null)");
}

const char *const *tern_chat_template_stops(tern_chat_template t) {
    static const char *const im_end[] = {"<|im_end|>", NULL}, *const eot_id[] = {"<|eot_id|>", NULL},
                             *const eot[] = {"<end_of_turn>", NULL}, *const end[] = {"<|end|>", NULL},
                             *const eos[] = {"</s>", NULL}, *const none[] = {NULL},
                             *const harmony[] = {"<|return|>", "<|call|>", NULL};
    switch (t) {
    case TERN_CHAT_CHATML:
    case TERN_CHAT_QWEN3:
    case TERN_CHAT_PHI4: return im_end;
    case TERN_CHAT_LLAMA3: return eot_id;
    case TERN_CHAT_GEMMA: return eot;
    case TERN_CHAT_PHI3: return end;
    case TERN_CHAT_LLAMA2: return eos;
    case TERN_CHAT_GPT_OSS: return harmony;
    default: return none;
    }
}

int32_t tern_chat_stop_tokens(const tern_model *m, tern_chat_template t, tern_token *out, int32_t cap) {
    return tn_chat_stop_tokens(m->vocab, t, out, cap);
}

int32_t tn_chat_stop_tokens(const tn_vocab *v, tern_chat_template t, int32_t *out, int32_t cap) {
    int32_t n = 0;
    for (const char *const *p = tern_chat_template_stops(t); *p && n < cap; p++) {
        const int32_t id = tn_vocab_find(v, *p, strlen(*p));
        if (id >= 0) out[n++] = id;
    }
    return n;
}

bool tn_chat_stop_scan(const char *const *stops, const char *text, size_t *len, size_t shown, size_t *upto) {
    const size_t n = *len;
    size_t hold = 0;
    for (const char *const *p = stops; *p; p++) {
        const size_t k = strlen(*p);
        for (size_t i = shown; k && i + k <= n; i++)
            if (!memcmp(text + i, *p, k)) {
                *len = i;
                return true;
            }
        for (size_t m = TN_MIN(k ? k - 1 : 0, n - shown); m > hold; m--) /* a tail that may grow into it */
            if (!memcmp(text + n - m, *p, m)) {
                hold = m;
                break;
            }
    }
    *upto = tn_utf8_complete(text, n - hold);
    if (*upto < shown) *upto = shown;
    return false;
}

/* ---- detection ------------------------------------------------------------------------------- */
static bool has(const char *s, size_t n, const char *needle) {
    const size_t k = strlen(needle);
    for (size_t i = 0; s && k <= n && i <= n - k; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, k)) return true;
    return false;
}

static bool has_tok(const tn_vocab *v, const char *text) { return v && tn_vocab_find(v, text, strlen(text)) >= 0; }

tern_chat_template tn_chat_detect(const char *jinja, size_t len, const tn_vocab *v, const char *arch) {
    const bool qwen3_arch = arch && !strcmp(arch, "qwen3");
    if (jinja && len) {
        if (has(jinja, len, "<|start|>") && has(jinja, len, "<|channel|>")) return TERN_CHAT_GPT_OSS;
        if (has(jinja, len, "<|im_start|>")) {
            if (has(jinja, len, "<|im_sep|>")) return TERN_CHAT_PHI4;
            /* Qwen3's template reads message.reasoning_content and splits answers at </think> */
            return qwen3_arch || has(jinja, len, "reasoning_content") ? TERN_CHAT_QWEN3 : TERN_CHAT_CHATML;
        }
        if (has(jinja, len, "[INST]")) return TERN_CHAT_LLAMA2;
        if (has(jinja, len, "<|assistant|>") && has(jinja, len, "<|end|>")) return TERN_CHAT_PHI3;
        if (has(jinja, len, "<start_of_turn>")) return TERN_CHAT_GEMMA;
        if (has(jinja, len, "<|start_header_id|>") && has(jinja, len, "<|end_header_id|>")) return TERN_CHAT_LLAMA3;
    }
    if (has_tok(v, "<|start|>") && has_tok(v, "<|channel|>")) return TERN_CHAT_GPT_OSS;
    if (has_tok(v, "<|im_sep|>")) return TERN_CHAT_PHI4;
    if (has_tok(v, "<|im_start|>")) return qwen3_arch ? TERN_CHAT_QWEN3 : TERN_CHAT_CHATML;
    if (has_tok(v, "<start_of_turn>")) return TERN_CHAT_GEMMA;
    if (has_tok(v, "<|start_header_id|>")) return TERN_CHAT_LLAMA3;
    if (has_tok(v, "<|assistant|>") && has_tok(v, "<|end|>")) return TERN_CHAT_PHI3;
    if (qwen3_arch) return TERN_CHAT_QWEN3;
    if (arch && !strncmp(arch, "gemma", 5)) return TERN_CHAT_GEMMA;
    if (arch && !strcmp(arch, "phi3")) return TERN_CHAT_PHI3;
    if (arch && !strcmp(arch, "gpt-oss")) return TERN_CHAT_GPT_OSS;
    return TERN_CHAT_CHATML;
}

tern_chat_template tern_chat_template_detect(const tern_model *m) {
    tn_gguf_str jinja = {0, NULL}, arch = {0, NULL};
    char a[32] = "";
    if (tn_gguf_get_str(m->gguf, "tokenizer.chat_template", false, &jinja)) jinja.len = 0; /* wrong type: none */
    if (!tn_gguf_get_str(m->gguf, "general.architecture", false, &arch) && arch.data && arch.len < sizeof a) {
        memcpy(a, arch.data, arch.len);
        a[arch.len] = 0;
    }
    return tn_chat_detect(jinja.data, (size_t)jinja.len, m->vocab, a[0] ? a : NULL);
}

/* ---- rendering ------------------------------------------------------------------------------- */
typedef struct {
    char *buf;
    size_t cap, len; /* len counts every byte rendered, also those past cap */
} tn_chat_out;

static void put(tn_chat_out *o, const char *s, size_t n) {
    if (o->len < o->cap) memcpy(o->buf + o->len, s, TN_MIN(n, o->cap - o->len));
    o->len += n;
}
static void puts_(tn_chat_out *o, const char *s) { put(o, s, strlen(s)); }

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Content without leading and trailing white space (Jinja's trim, llama.cpp's trim()). */
static void put_trimmed(tn_chat_out *o, const char *s, size_t n) {
    while (n && is_space(*s)) s++, n--;
    while (n && is_space(s[n - 1])) n--;
    put(o, s, n);
}

static bool role_is(const tern_chat_msg *m, const char *r) { return !strcmp(m->role, r); }
static bool is_system(const tern_chat_msg *m) { return role_is(m, "system") || role_is(m, "developer"); }

static void render_chatml(tn_chat_out *o, const tern_chat_msg *msgs, size_t n, bool add_assistant, bool qwen3) {
    size_t last_user = SIZE_MAX;
    for (size_t i = 0; i < n; i++)
        if (role_is(&msgs[i], "user")) last_user = i;
    for (size_t i = 0; i < n; i++) {
        const char *c = msgs[i].content;
        size_t len = msgs[i].len;
        if (qwen3 && last_user != SIZE_MAX && i < last_user && role_is(&msgs[i], "assistant")) {
            for (size_t k = len; k >= 8; k--) /* after the last </think>, leading newlines dropped */
                if (!memcmp(c + k - 8, "</think>", 8)) {
                    c += k, len -= k;
                    while (len && *c == '\n') c++, len--;
                    break;
                }
        }
        puts_(o, "<|im_start|>");
        puts_(o, msgs[i].role);
        puts_(o, "\n");
        put(o, c, len);
        puts_(o, "<|im_end|>\n");
    }
    if (add_assistant) puts_(o, "<|im_start|>assistant\n");
}

/* Meta's Llama 2 template: [INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A </s><s>[INST] V [/INST] */
static void render_llama2(tn_chat_out *o, const tern_chat_msg *msgs, size_t n) {
    bool in_inst = false;
    for (size_t i = 0; i < n; i++) {
        const tern_chat_msg *m = &msgs[i];
        if (role_is(m, "assistant")) {
            puts_(o, " ");
            put(o, m->content, m->len);
            puts_(o, " </s><s>");
            in_inst = false;
            continue;
        }
        if (!in_inst) puts_(o, "[INST] ");
        if (is_system(m)) {
            puts_(o, "<<SYS>>\n");
            put(o, m->content, m->len);
            puts_(o, "\n<</SYS>>\n\n");
            in_inst = true;
        } else {
            put(o, m->content, m->len);
            puts_(o, " [/INST]");
            in_inst = false;
        }
    }
}

static void render_llama3(tn_chat_out *o, const tern_chat_msg *msgs, size_t n, bool add_assistant) {
    for (size_t i = 0; i < n; i++) {
        puts_(o, "<|start_header_id|>");
        puts_(o, msgs[i].role);
        puts_(o, "<|end_header_id|>\n\n");
        put_trimmed(o, msgs[i].content, msgs[i].len);
        puts_(o, "<|eot_id|>");
    }
    if (add_assistant) puts_(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Gemma has no system role: system text (trimmed) opens the next user turn, followed by "\n\n". */
static void render_gemma(tn_chat_out *o, const tern_chat_msg *msgs, size_t n, bool add_assistant) {
    const tern_chat_msg *sys = NULL;
    for (size_t i = 0; i < n; i++) {
        const tern_chat_msg *m = &msgs[i];
        if (is_system(m)) {
            sys = m;
            continue;
        }
        const bool model = role_is(m, "assistant") || role_is(m, "model");
        puts_(o, "<start_of_turn>");
        puts_(o, model ? "model" : m->role);
        puts_(o, "\n");
        if (sys && !model) {
            put_trimmed(o, sys->content, sys->len);
            puts_(o, "\n\n");
            sys = NULL;
        }
        put_trimmed(o, m->content, m->len);
        puts_(o, "<end_of_turn>\n");
    }
    if (add_assistant) puts_(o, "<start_of_turn>model\n");
}

static void render_phi(tn_chat_out *o, const tern_chat_msg *msgs, size_t n, bool add_assistant, bool phi4) {
    for (size_t i = 0; i < n; i++) {
        puts_(o, phi4 ? "<|im_start|>" : "<|");
        puts_(o, msgs[i].role);
        puts_(o, phi4 ? "<|im_sep|>" : "|>\n");
        put(o, msgs[i].content, msgs[i].len);
        puts_(o, phi4 ? "<|im_end|>" : "<|end|>\n");
    }
    if (add_assistant) puts_(o, phi4 ? "<|im_start|>assistant<|im_sep|>" : "<|assistant|>\n");
}

/* OpenAI's harmony format (gpt-oss's template): the model's system message (identity, knowledge
 * cutoff, reasoning effort, channels; no current date, so that a rendering is reproducible), a
 * system or developer message as the developer's "# Instructions", user turns, earlier answers in
 * the final channel — an answer that still holds the model's raw channels keeps only the text after
 * its last "<|channel|>final<|message|>", up to an "<|end|>" or "<|return|>" — and, for the reply,
 * "<|start|>assistant" (the model then opens its analysis channel, then its final one, and ends with
 * <|return|>, or <|call|> for a tool call). */
static void render_harmony(tn_chat_out *o, const tern_chat_msg *msgs, size_t n, bool add_assistant) {
    puts_(o, "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
             "Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n"
             "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>");
    static const char fin[] = "<|channel|>final<|message|>";
    for (size_t i = 0; i < n; i++) {
        const tern_chat_msg *m = &msgs[i];
        const char *c = m->content;
        size_t len = m->len;
        if (is_system(m)) {
            puts_(o, "<|start|>developer<|message|># Instructions\n\n");
            put(o, c, len);
            puts_(o, "<|end|>");
        } else if (role_is(m, "assistant")) {
            for (size_t k = len; k >= sizeof fin - 1; k--)
                if (!memcmp(c + k - (sizeof fin - 1), fin, sizeof fin - 1)) {
                    c += k, len -= k;
                    break;
                }
            for (size_t k = 0; k + 7 <= len; k++)
                if (!memcmp(c + k, "<|end|>", 7) || (k + 10 <= len && !memcmp(c + k, "<|return|>", 10))) {
                    len = k;
                    break;
                }
            puts_(o, "<|start|>assistant");
            puts_(o, fin);
            put(o, c, len);
            puts_(o, "<|end|>");
        } else {
            puts_(o, "<|start|>");
            puts_(o, m->role);
            puts_(o, "<|message|>");
            put(o, c, len);
            puts_(o, "<|end|>");
        }
    }
    if (add_assistant) puts_(o, "<|start|>assistant");
}

tern_status tern_chat_apply(tern_chat_template t, const tern_chat_msg *msgs, size_t n, bool add_assistant, char *buf,
                            size_t cap, size_t *len) {
    if (len) *len = 0;
    if (!len || (!buf && cap) || (!msgs && n)) return tn_err(TERN_ERR_INVALID_ARG, "chat: NULL argument");
    if ((unsigned)t >= TERN_CHAT_N_TEMPLATES) return tn_err(TERN_ERR_INVALID_ARG, "chat: unknown template %d", (int)t);
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || (!msgs[i].content && msgs[i].len))
            return tn_err(TERN_ERR_INVALID_ARG, "chat: message %zu has no %s", i, msgs[i].role ? "content" : "role");
    tn_chat_out o = {buf, cap, 0};
    switch (t) {
    case TERN_CHAT_CHATML: render_chatml(&o, msgs, n, add_assistant, false); break;
    case TERN_CHAT_QWEN3: render_chatml(&o, msgs, n, add_assistant, true); break;
    case TERN_CHAT_LLAMA2: render_llama2(&o, msgs, n); break; /* the answer follows [/INST] */
    case TERN_CHAT_LLAMA3: render_llama3(&o, msgs, n, add_assistant); break;
    case TERN_CHAT_GEMMA: render_gemma(&o, msgs, n, add_assistant); break;
    case TERN_CHAT_PHI3: render_phi(&o, msgs, n, add_assistant, false); break;
    case TERN_CHAT_PHI4: render_phi(&o, msgs, n, add_assistant, true); break;
    case TERN_CHAT_GPT_OSS: render_harmony(&o, msgs, n, add_assistant); break;
    default: break;
    }
    *len = o.len;
    if (o.len >= cap) return tn_err(TERN_ERR_FULL, "chat: the rendered conversation needs %zu bytes, the buffer holds %zu", o.len + 1, cap);
    buf[o.len] = 0;
    return TERN_OK;
}

char *tn_chat_render(tern_chat_template t, const tern_chat_msg *msgs, size_t n, bool add_assistant, size_t *len) {
    size_t need = 0;
    tern_status s = tern_chat_apply(t, msgs, n, add_assistant, NULL, 0, &need);
    if (s != TERN_ERR_FULL) return NULL;
    char *buf = tn_malloc(need + 1);
    if (!buf) return NULL;
    if (tern_chat_apply(t, msgs, n, add_assistant, buf, need + 1, len)) {
        tn_free(buf);
        return NULL;
    }
    return buf;
}
