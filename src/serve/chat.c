/*
 * chat.c — chat templates (llama2, llama3, chatml) written out in C. The model's
 * tokenizer.chat_template (Jinja) is only scanned for recognisable markers, never executed.
 * BOS is not rendered: tokenization with add_special adds it as the model says.
 */
#include <stdlib.h>
#include <string.h>

#include "serve/serve.h"

tn_chat_tmpl tn_chat_detect(const char *t) {
    if (!t) return TN_CHAT_CHATML;
    if (strstr(t, "<|start_header_id|>") && strstr(t, "<|eot_id|>")) return TN_CHAT_LLAMA3;
    if (strstr(t, "<|im_start|>")) return TN_CHAT_CHATML;
    if (strstr(t, "[INST]")) return TN_CHAT_LLAMA2;
    return TN_CHAT_CHATML;
}

const char *tn_chat_name(tn_chat_tmpl t) {
    switch (t) {
    case TN_CHAT_LLAMA2: return "llama2";
    case TN_CHAT_LLAMA3: return "llama3";
    default: return "chatml";
    }
}

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

char *tn_chat_render(tn_chat_tmpl t, const tn_chat_msg *msgs, size_t n, size_t *len) {
    sbuf b = {0};
    puts_(&b, "");
    if (t == TN_CHAT_LLAMA3) {
        for (size_t i = 0; i < n; i++) {
            puts_(&b, "<|start_header_id|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "<|end_header_id|>\n\n");
            put(&b, msgs[i].content, msgs[i].len);
            puts_(&b, "<|eot_id|>");
        }
        puts_(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else if (t == TN_CHAT_LLAMA2) {
        /* [INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] assistant </s><s>[INST] user [/INST] */
        bool in_inst = false, sys_pending = false;
        for (size_t i = 0; i < n; i++) {
            const char *r = msgs[i].role;
            if (!strcmp(r, "system") || !strcmp(r, "developer")) {
                if (!in_inst) puts_(&b, "[INST] ");
                in_inst = true;
                puts_(&b, "<<SYS>>\n");
                put(&b, msgs[i].content, msgs[i].len);
                puts_(&b, "\n<</SYS>>\n\n");
                sys_pending = true;
            } else if (!strcmp(r, "assistant")) {
                puts_(&b, " ");
                put(&b, msgs[i].content, msgs[i].len);
                puts_(&b, " </s><s>");
                in_inst = false;
            } else {
                if (!in_inst) puts_(&b, "[INST] ");
                put(&b, msgs[i].content, msgs[i].len);
                puts_(&b, " [/INST]");
                in_inst = false;
                sys_pending = false;
            }
        }
        (void)sys_pending;
    } else {
        for (size_t i = 0; i < n; i++) {
            puts_(&b, "<|im_start|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "\n");
            put(&b, msgs[i].content, msgs[i].len);
            puts_(&b, "<|im_end|>\n");
        }
        puts_(&b, "<|im_start|>assistant\n");
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.n;
    return b.p;
}
