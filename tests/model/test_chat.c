/*
 * test_chat.c — chat templates (src/model/chat.c): every template on a multi-turn conversation with
 * a system message, against strings written here by hand from each template's definition (the
 * model's own Jinja template, and llama.cpp's built-in rendering in src/llama-chat.cpp, quoted in
 * the comments), never from tern's output; detection from Jinja markers, special tokens and the
 * architecture; the buffer contract of tern_chat_apply; names and end-of-turn strings.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/base.h"
#include "fmt/gguf.h"
#include "model/chat.h"

/* The conversation every template renders: system, user, assistant, user. */
static const tern_chat_msg conv[] = {
    {"system", "You are terse.", 14}, {"user", "Hi", 2}, {"assistant", "Hello.", 6}, {"user", "Bye", 3}};

static void expect(tern_chat_template t, const tern_chat_msg *msgs, size_t n, bool add_assistant, const char *want) {
    char buf[1024];
    size_t len = 0;
    assert_int_equal(tern_chat_apply(t, msgs, n, add_assistant, buf, sizeof buf, &len), TERN_OK);
    assert_string_equal(buf, want);
    assert_int_equal(len, strlen(want));
}

static void t_chatml(void **st) {
    (void)st;
    /* llama.cpp: for each message "<|im_start|>" role "\n" content "<|im_end|>\n"; then
     * "<|im_start|>assistant\n" (Qwen2.5's and SmolLM2's Jinja templates render the same) */
    expect(TERN_CHAT_CHATML, conv, 4, true,
           "<|im_start|>system\nYou are terse.<|im_end|>\n"
           "<|im_start|>user\nHi<|im_end|>\n"
           "<|im_start|>assistant\nHello.<|im_end|>\n"
           "<|im_start|>user\nBye<|im_end|>\n"
           "<|im_start|>assistant\n");
    expect(TERN_CHAT_CHATML, conv + 1, 1, false, "<|im_start|>user\nHi<|im_end|>\n");
}

static void t_llama2(void **st) {
    (void)st;
    /* Meta's Llama 2 chat template: bos + "[INST] " + (first user: "<<SYS>>\n" + system +
     * "\n<</SYS>>\n\n") + user + " [/INST]", answers " " + answer + " " + eos; the BOS of the first
     * turn is the tokenizer's. No generation header: the answer follows "[/INST]". */
    expect(TERN_CHAT_LLAMA2, conv, 4, true,
           "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]");
    expect(TERN_CHAT_LLAMA2, conv + 1, 1, true, "[INST] Hi [/INST]");
}

static void t_llama3(void **st) {
    (void)st;
    /* Llama 3: "<|start_header_id|>" role "<|end_header_id|>\n\n" trim(content) "<|eot_id|>", then
     * "<|start_header_id|>assistant<|end_header_id|>\n\n" (llama.cpp's LLM_CHAT_TEMPLATE_LLAMA_3) */
    expect(TERN_CHAT_LLAMA3, conv, 4, true,
           "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    const tern_chat_msg padded[] = {{"user", "  Hi \n", 6}};
    expect(TERN_CHAT_LLAMA3, padded, 1, false, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"); /* | trim */
}

static void t_qwen3(void **st) {
    (void)st;
    /* Qwen3's template: chatml; an assistant message before the last user message is rendered as
     * content.split('</think>')[-1].lstrip('\n'), so an earlier answer's thinking is dropped. */
    const tern_chat_msg m[] = {{"system", "You are terse.", 14},
                               {"user", "Hi", 2},
                               {"assistant", "<think>\nA greeting.\n</think>\n\nHello.", 36},
                               {"user", "Bye", 3}};
    assert_int_equal(strlen(m[2].content), m[2].len);
    expect(TERN_CHAT_QWEN3, m, 4, true,
           "<|im_start|>system\nYou are terse.<|im_end|>\n"
           "<|im_start|>user\nHi<|im_end|>\n"
           "<|im_start|>assistant\nHello.<|im_end|>\n"
           "<|im_start|>user\nBye<|im_end|>\n"
           "<|im_start|>assistant\n");
    /* an answer after the last user message keeps its thinking:
     * '<|im_start|>assistant\n<think>\n' + reasoning + '\n</think>\n\n' + content */
    expect(TERN_CHAT_QWEN3, m + 1, 2, false,
           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nA greeting.\n</think>\n\nHello.<|im_end|>\n");
}

static void t_gemma(void **st) {
    (void)st;
    /* Gemma: no system role; the system text (trimmed) + "\n\n" opens the first user turn;
     * "<start_of_turn>" role "\n" trim(content) "<end_of_turn>\n" with assistant -> "model";
     * then "<start_of_turn>model\n" (Gemma 3's template; llama.cpp's LLM_CHAT_TEMPLATE_GEMMA) */
    expect(TERN_CHAT_GEMMA, conv, 4, true,
           "<start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
           "<start_of_turn>model\nHello.<end_of_turn>\n"
           "<start_of_turn>user\nBye<end_of_turn>\n"
           "<start_of_turn>model\n");
    const tern_chat_msg m[] = {{"user", " Hi\n", 4}};
    expect(TERN_CHAT_GEMMA, m, 1, true, "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
}

static void t_phi(void **st) {
    (void)st;
    /* Phi-3: "<|" role "|>\n" content "<|end|>\n", then "<|assistant|>\n" (LLM_CHAT_TEMPLATE_PHI_3) */
    expect(TERN_CHAT_PHI3, conv, 4, true,
           "<|system|>\nYou are terse.<|end|>\n"
           "<|user|>\nHi<|end|>\n"
           "<|assistant|>\nHello.<|end|>\n"
           "<|user|>\nBye<|end|>\n"
           "<|assistant|>\n");
    /* Phi-4: "<|im_start|>" role "<|im_sep|>" content "<|im_end|>" (no newlines), then
     * "<|im_start|>assistant<|im_sep|>" (LLM_CHAT_TEMPLATE_PHI_4) */
    expect(TERN_CHAT_PHI4, conv, 4, true,
           "<|im_start|>system<|im_sep|>You are terse.<|im_end|>"
           "<|im_start|>user<|im_sep|>Hi<|im_end|>"
           "<|im_start|>assistant<|im_sep|>Hello.<|im_end|>"
           "<|im_start|>user<|im_sep|>Bye<|im_end|>"
           "<|im_start|>assistant<|im_sep|>");
}

/* gpt-oss (harmony, written from OpenAI's harmony format and gpt-oss's chat_template.jinja): the
 * model's system message, the system message as developer instructions, final-channel answers; an
 * answer with raw channels keeps its final text only. */
static void t_gpt_oss(void **st) {
    (void)st;
    static const char sysmsg[] = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                                 "Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n"
                                 "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>";
    char want[1024];
    snprintf(want, sizeof want, "%s%s", sysmsg,
             "<|start|>developer<|message|># Instructions\n\nYou are terse.<|end|>"
             "<|start|>user<|message|>Hi<|end|>"
             "<|start|>assistant<|channel|>final<|message|>Hello.<|end|>"
             "<|start|>user<|message|>Bye<|end|>"
             "<|start|>assistant");
    expect(TERN_CHAT_GPT_OSS, conv, 4, true, want);
    const char raw[] = "<|channel|>analysis<|message|>Greet back.<|end|><|start|>assistant<|channel|>final<|message|>Hello.<|return|>";
    const tern_chat_msg m[] = {{"user", "Hi", 2}, {"assistant", raw, sizeof raw - 1}};
    snprintf(want, sizeof want, "%s%s", sysmsg,
             "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello.<|end|>");
    expect(TERN_CHAT_GPT_OSS, m, 2, false, want);
}

static void t_buffer_contract(void **st) {
    (void)st;
    const char *want = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    const size_t n = strlen(want);
    char buf[128];
    size_t len = 7;
    assert_int_equal(tern_chat_apply(TERN_CHAT_CHATML, conv + 1, 1, true, NULL, 0, &len), TERN_ERR_FULL);
    assert_int_equal(len, n);
    memset(buf, 'x', sizeof buf);
    assert_int_equal(tern_chat_apply(TERN_CHAT_CHATML, conv + 1, 1, true, buf, n, &len), TERN_ERR_FULL); /* no room for NUL */
    assert_int_equal(len, n);
    assert_memory_equal(buf, want, n - 1);
    assert_int_equal(tern_chat_apply(TERN_CHAT_CHATML, conv + 1, 1, true, buf, n + 1, &len), TERN_OK);
    assert_string_equal(buf, want);
    /* content is len bytes, not up to a NUL */
    const tern_chat_msg cut[] = {{"user", "Hi there", 2}};
    expect(TERN_CHAT_CHATML, cut, 1, false, "<|im_start|>user\nHi<|im_end|>\n");
    expect(TERN_CHAT_CHATML, NULL, 0, true, "<|im_start|>assistant\n");
    const tern_chat_msg bad[] = {{NULL, "x", 1}};
    assert_int_equal(tern_chat_apply(TERN_CHAT_CHATML, bad, 1, true, buf, sizeof buf, &len), TERN_ERR_INVALID_ARG);
    assert_int_equal(tern_chat_apply(TERN_CHAT_N_TEMPLATES, conv, 1, true, buf, sizeof buf, &len), TERN_ERR_INVALID_ARG);
    assert_int_equal(tern_chat_apply((tern_chat_template)-1, conv, 1, true, buf, sizeof buf, &len), TERN_ERR_INVALID_ARG);
}

static void t_names_and_stops(void **st) {
    (void)st;
    static const char *const names[] = {"chatml", "llama2", "llama3", "qwen3", "gemma", "phi3", "phi4", "gpt-oss"};
    assert_int_equal(sizeof names / sizeof *names, TERN_CHAT_N_TEMPLATES);
    for (int t = 0; t < TERN_CHAT_N_TEMPLATES; t++) {
        tern_chat_template back = TERN_CHAT_N_TEMPLATES;
        assert_string_equal(tern_chat_template_name((tern_chat_template)t), names[t]);
        assert_int_equal(tern_chat_template_from_name(names[t], &back), TERN_OK);
        assert_int_equal(back, t);
    }
    tern_chat_template t = TERN_CHAT_CHATML;
    assert_int_equal(tern_chat_template_from_name("vicuna", &t), TERN_ERR_INVALID_ARG);
    assert_non_null(strstr(tern_last_error(), "'vicuna'"));
    assert_non_null(strstr(tern_last_error(), "gemma"));
    assert_null(tern_chat_template_name(TERN_CHAT_N_TEMPLATES));
    /* the end of an assistant turn in each template's definition */
    assert_string_equal(tern_chat_template_stops(TERN_CHAT_CHATML)[0], "<|im_end|>");
    assert_string_equal(tern_chat_template_stops(TERN_CHAT_QWEN3)[0], "<|im_end|>");
    assert_string_equal(tern_chat_template_stops(TERN_CHAT_PHI4)[0], "<|im_end|>");
    assert_string_equal(tern_chat_template_stops(TERN_CHAT_LLAMA3)[0], "<|eot_id|>");
    assert_string_equal(tern_chat_template_stops(TERN_CHAT_GEMMA)[0], "<end_of_turn>");
    assert_string_equal(tern_chat_template_stops(TERN_CHAT_PHI3)[0], "<|end|>");
    assert_string_equal(tern_chat_template_stops(TERN_CHAT_LLAMA2)[0], "</s>");
    assert_string_equal(tern_chat_template_stops(TERN_CHAT_GPT_OSS)[0], "<|return|>");
    assert_string_equal(tern_chat_template_stops(TERN_CHAT_GPT_OSS)[1], "<|call|>");
    assert_null(tern_chat_template_stops(TERN_CHAT_GPT_OSS)[2]);
    for (int k = 0; k < TERN_CHAT_N_TEMPLATES; k++)
        if (k != TERN_CHAT_GPT_OSS) assert_null(tern_chat_template_stops((tern_chat_template)k)[1]);
}

#define DETECT(jinja, arch) tn_chat_detect(jinja, strlen(jinja), NULL, arch)

static void t_detect_jinja(void **st) {
    (void)st;
    /* fragments of the families' published templates */
    assert_int_equal(DETECT("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}", NULL),
                     TERN_CHAT_CHATML); /* Qwen2.5 */
    assert_int_equal(DETECT("{%- if message.reasoning_content is string %}{{- '<|im_start|>' + message.role }}", NULL), TERN_CHAT_QWEN3);
    assert_int_equal(DETECT("{{- '<|im_start|>' + message.role + '\\n' }}", "qwen3"), TERN_CHAT_QWEN3); /* chatml in a qwen3 file */
    assert_int_equal(DETECT("{{'<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + '<|im_end|>'}}", NULL), TERN_CHAT_PHI4);
    assert_int_equal(DETECT("{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}", NULL), TERN_CHAT_GEMMA);
    assert_int_equal(DETECT("{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}", NULL), TERN_CHAT_PHI3);
    assert_int_equal(DETECT("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}", NULL),
                     TERN_CHAT_LLAMA3);
    assert_int_equal(DETECT("{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}", NULL), TERN_CHAT_LLAMA2);
    assert_int_equal(DETECT("{{- '<|start|>' + message.role + '<|channel|>' + 'final<|message|>' }}", NULL), TERN_CHAT_GPT_OSS);
    assert_int_equal(tn_chat_detect(NULL, 0, NULL, "gpt-oss"), TERN_CHAT_GPT_OSS);
    /* nothing recognised: the architecture, else chatml */
    assert_int_equal(DETECT("{{ messages }}", NULL), TERN_CHAT_CHATML);
    assert_int_equal(DETECT("{{ messages }}", "gemma3"), TERN_CHAT_GEMMA);
    assert_int_equal(tn_chat_detect(NULL, 0, NULL, "gemma2"), TERN_CHAT_GEMMA);
    assert_int_equal(tn_chat_detect(NULL, 0, NULL, "phi3"), TERN_CHAT_PHI3);
    assert_int_equal(tn_chat_detect(NULL, 0, NULL, "qwen3"), TERN_CHAT_QWEN3);
    assert_int_equal(tn_chat_detect(NULL, 0, NULL, "llama"), TERN_CHAT_CHATML);
    /* the length bounds the scan: a marker past it does not count */
    const char *t = "{{ x }}<start_of_turn>";
    assert_int_equal(tn_chat_detect(t, 7, NULL, NULL), TERN_CHAT_CHATML);
}

/* A SentencePiece vocabulary (<unk> <s> </s>, 256 bytes) with the given control tokens. */
static tn_vocab *vocab_with(const char *const *extra, int n_extra) {
    enum { BASE = 3 + 256 };
    static char bytes[256][8];
    const char *toks[BASE + 8];
    float scores[BASE + 8] = {0};
    int32_t types[BASE + 8];
    toks[0] = "<unk>", types[0] = 2;
    toks[1] = "<s>", types[1] = 3;
    toks[2] = "</s>", types[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[3 + b] = bytes[b], types[3 + b] = 6;
    }
    for (int k = 0; k < n_extra; k++) toks[BASE + k] = extra[k], types[BASE + k] = 3;
    const int n = BASE + n_extra;
    tn_gguf_writer *w = NULL;
    uint8_t *mem = NULL;
    size_t size = 0;
    tn_gguf *g = NULL;
    tn_vocab *v = NULL;
    assert_int_equal(tn_gguf_writer_create(&w), TERN_OK);
    assert_int_equal(tn_gguf_set_str(w, "tokenizer.ggml.model", "llama"), TERN_OK);
    assert_int_equal(tn_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n), TERN_OK);
    assert_int_equal(tn_gguf_set_arr(w, "tokenizer.ggml.scores", TN_GGUF_F32, scores, (uint64_t)n), TERN_OK);
    assert_int_equal(tn_gguf_set_arr(w, "tokenizer.ggml.token_type", TN_GGUF_I32, types, (uint64_t)n), TERN_OK);
    assert_int_equal(tn_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1), TERN_OK);
    assert_int_equal(tn_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2), TERN_OK);
    assert_int_equal(tn_gguf_write_mem(w, NULL, NULL, &mem, &size), TERN_OK);
    tn_gguf_writer_free(w);
    assert_int_equal(tn_gguf_parse(mem, size, &g), TERN_OK);
    assert_int_equal(tn_vocab_load(g, &v), TERN_OK);
    tn_gguf_free(g);
    tn_free(mem);
    return v;
}

static void t_detect_tokens(void **st) {
    (void)st;
    static const struct {
        const char *toks[3];
        int n;
        const char *arch;
        tern_chat_template want;
    } cases[] = {
        {{"<start_of_turn>", "<end_of_turn>"}, 2, "gemma3", TERN_CHAT_GEMMA},
        {{"<|im_start|>", "<|im_end|>"}, 2, "qwen2", TERN_CHAT_CHATML},
        {{"<|im_start|>", "<|im_end|>"}, 2, "qwen3", TERN_CHAT_QWEN3},
        {{"<|im_start|>", "<|im_sep|>", "<|im_end|>"}, 3, "phi3", TERN_CHAT_PHI4}, /* Phi-4 files say phi3 */
        {{"<|user|>", "<|assistant|>", "<|end|>"}, 3, "llama", TERN_CHAT_PHI3},
        {{"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}, 3, "llama", TERN_CHAT_LLAMA3},
        {{"<|eot_id|>"}, 1, "llama", TERN_CHAT_CHATML},
        {{"<|start|>", "<|channel|>", "<|return|>"}, 3, "llama", TERN_CHAT_GPT_OSS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tn_vocab *v = vocab_with(cases[i].toks, cases[i].n);
        assert_int_equal(tn_chat_detect(NULL, 0, v, cases[i].arch), cases[i].want);
        tn_vocab_free(v);
    }
    /* the Jinja markers win over the tokens */
    const char *const gem[] = {"<start_of_turn>"};
    tn_vocab *v = vocab_with(gem, 1);
    const char *j = "{{ '<|start_header_id|>' + role + '<|end_header_id|>' }}";
    assert_int_equal(tn_chat_detect(j, strlen(j), v, "gemma3"), TERN_CHAT_LLAMA3);
    tn_vocab_free(v);
}

static void t_stop_tokens(void **st) {
    (void)st;
    const char *const chatml[] = {"<|im_start|>", "<|im_end|>"}, *const gemma[] = {"<start_of_turn>", "<end_of_turn>"};
    int32_t ids[4];
    tn_vocab *v = vocab_with(chatml, 2); /* ids 259, 260 after <unk> <s> </s> and 256 bytes */
    assert_int_equal(tn_chat_stop_tokens(v, TERN_CHAT_CHATML, ids, 4), 1);
    assert_int_equal(ids[0], 260);
    assert_int_equal(tn_chat_stop_tokens(v, TERN_CHAT_GEMMA, ids, 4), 0); /* no <end_of_turn> here */
    assert_int_equal(tn_chat_stop_tokens(v, TERN_CHAT_LLAMA2, ids, 4), 1);   /* </s> */
    assert_int_equal(ids[0], 2);
    assert_int_equal(tn_chat_stop_tokens(v, TERN_CHAT_CHATML, ids, 0), 0);
    tn_vocab_free(v);
    v = vocab_with(gemma, 2);
    assert_int_equal(tn_chat_stop_tokens(v, TERN_CHAT_GEMMA, ids, 4), 1);
    assert_int_equal(ids[0], 260);
    tn_vocab_free(v);
}

/* One streaming step: text so far, how much was printed; want the end found (and where) or how far
 * it may be printed. */
static void scan(const char *const *stops, const char *text, size_t shown, bool want_end, size_t want) {
    size_t len = strlen(text), upto = 12345;
    assert_int_equal(tn_chat_stop_scan(stops, text, &len, shown, &upto), want_end);
    if (want_end) assert_int_equal(len, want);
    else assert_int_equal(upto, want);
}

static void t_stop_text(void **st) {
    (void)st;
    const char *const im[] = {"<|im_end|>", NULL}, *const two[] = {"</s>", "<|eot_id|>", NULL};
    scan(im, "Hello", 0, false, 5);
    scan(im, "Hello<|im", 5, false, 5);          /* "<|im" may become <|im_end|>: held back */
    scan(im, "Hello<|im_end|>", 5, true, 5);     /* the end, cut where it begins */
    scan(im, "Hello<|im_end|>more", 5, true, 5);
    scan(im, "a<", 0, false, 1);
    scan(im, "a<b", 1, false, 3);                /* "<b" cannot: printed */
    scan(im, "x<|im_end|", 0, false, 1);         /* all but the last byte of the end string: held */
    scan(im, "caf\xc3", 0, false, 3);            /* half a UTF-8 sequence waits */
    scan(im, "caf\xc3\xa9", 3, false, 5);
    scan(two, "ok</s", 0, false, 2);
    scan(two, "ok<|eot", 0, false, 2);
    scan(two, "ok<|eot_id|>", 0, true, 2);
    scan(two, "ok</s>", 0, true, 2);
    const char *const none[] = {NULL};
    scan(none, "a<|im_end|>", 0, false, 11);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_chatml),          cmocka_unit_test(t_llama2),        cmocka_unit_test(t_llama3),
        cmocka_unit_test(t_qwen3),           cmocka_unit_test(t_gemma),         cmocka_unit_test(t_phi), cmocka_unit_test(t_gpt_oss),
        cmocka_unit_test(t_buffer_contract), cmocka_unit_test(t_names_and_stops), cmocka_unit_test(t_detect_jinja),
        cmocka_unit_test(t_detect_tokens),   cmocka_unit_test(t_stop_tokens),   cmocka_unit_test(t_stop_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
