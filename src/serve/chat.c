/*
 * chat.c — chat templates (llama2, llama3, chatml) written out in C. The model's
 * tokenizer.chat_template (Jinja) is only scanned for recognisable markers, never executed.
 * BOS is not rendered: tokenization with add_special adds it as the model says.
 */
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
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

char *tn_chat_render(tn_chat_tmpl t, const tn_chat_msg *msgs, size_t n, size_t *len) {
    tn_buf b = {0};
    tn_buf_puts(&b, "");
    if (t == TN_CHAT_LLAMA3) {
        for (size_t i = 0; i < n; i++) {
            tn_buf_puts(&b, "<|start_header_id|>");
            tn_buf_puts(&b, msgs[i].role);
            tn_buf_puts(&b, "<|end_header_id|>\n\n");
            tn_buf_put(&b, msgs[i].content, msgs[i].len);
            tn_buf_puts(&b, "<|eot_id|>");
        }
        tn_buf_puts(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else if (t == TN_CHAT_LLAMA2) {
        /* [INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] assistant </s><s>[INST] user [/INST] */
        bool in_inst = false, sys_pending = false;
        for (size_t i = 0; i < n; i++) {
            const char *r = msgs[i].role;
            if (!strcmp(r, "system") || !strcmp(r, "developer")) {
                if (!in_inst) tn_buf_puts(&b, "[INST] ");
                in_inst = true;
                tn_buf_puts(&b, "<<SYS>>\n");
                tn_buf_put(&b, msgs[i].content, msgs[i].len);
                tn_buf_puts(&b, "\n<</SYS>>\n\n");
                sys_pending = true;
            } else if (!strcmp(r, "assistant")) {
                tn_buf_puts(&b, " ");
                tn_buf_put(&b, msgs[i].content, msgs[i].len);
                tn_buf_puts(&b, " </s><s>");
                in_inst = false;
            } else {
                if (!in_inst) tn_buf_puts(&b, "[INST] ");
                tn_buf_put(&b, msgs[i].content, msgs[i].len);
                tn_buf_puts(&b, " [/INST]");
                in_inst = false;
                sys_pending = false;
            }
        }
        (void)sys_pending;
    } else {
        for (size_t i = 0; i < n; i++) {
            tn_buf_puts(&b, "<|im_start|>");
            tn_buf_puts(&b, msgs[i].role);
            tn_buf_puts(&b, "\n");
            tn_buf_put(&b, msgs[i].content, msgs[i].len);
            tn_buf_puts(&b, "<|im_end|>\n");
        }
        tn_buf_puts(&b, "<|im_start|>assistant\n");
    }
    return tn_buf_take(&b, len);
}
