/*
 * test_model_load.c — the model loader's validation (robustness.md G25–G28): each case rewrites
 * a valid tiny model with one defect and expects the named status and a message naming the key
 * or tensor. Tied output embeddings (no output.weight) must load. Load-time repacking (q4_0 ->
 * q4_0_r16) gives the same model whether the file is mapped or read into memory, and the same
 * weights and (within float reordering) logits as the file layout.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/tiny_model.h"
#include "fmt/gguf.h"
#include "kern/kern.h"
#include "model/model.h"
#include "quant/repack.h"
#include "quant/tq.h"
#include "tern/tern.h"

static char base_path[512], qwen3_path[512];

typedef struct {
    const char *drop_key;
    const char *set_key;        /* set to set_u32 (or set_str if set_str != NULL) */
    uint32_t set_u32;
    const char *set_str;
    bool set_is_f32;            /* set to set_f32 instead */
    float set_f32;
    const char *drop_tensor;
    const char *reshape_tensor; /* swap ne0/ne1 (transposed) */
    const char *halve_experts;  /* a 3-D tensor written with half its experts (ne2 / 2)    */
    const char *add_tensor;     /* an extra f32 vector of add_len elements */
    int64_t add_len;
    const char *src;            /* the file mutated (NULL: the tiny llama base) */
} mutation;

static void write_mutant(const mutation *mu, const char *out) {
    tn_gguf *g = NULL;
    assert_int_equal(tn_gguf_open(mu->src ? mu->src : base_path, true, &g), TERN_OK);
    tn_gguf_writer *w = NULL;
    assert_int_equal(tn_gguf_writer_create(&w), TERN_OK);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (mu->drop_key && tn_gguf_str_eq(g->kv[i].key, mu->drop_key)) continue;
        assert_int_equal(tn_gguf_set_kv(w, &g->kv[i]), TERN_OK);
    }
    if (mu->set_key) {
        if (mu->set_is_f32) tn_gguf_set_f32(w, mu->set_key, mu->set_f32);
        else if (mu->set_str) tn_gguf_set_str(w, mu->set_key, mu->set_str);
        else tn_gguf_set_u32(w, mu->set_key, mu->set_u32);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        if (mu->drop_tensor && !strcmp(t->name, mu->drop_tensor)) continue;
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        if (mu->reshape_tensor && !strcmp(t->name, mu->reshape_tensor)) {
            ne[0] = t->ne[1];
            ne[1] = t->ne[0];
        }
        if (mu->halve_experts && !strcmp(t->name, mu->halve_experts)) ne[2] = t->ne[2] / 2;
        assert_int_equal(tn_gguf_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data), TERN_OK);
    }
    float extra[1024] = {0};
    if (mu->add_tensor) {
        assert_true(mu->add_len <= 1024);
        assert_int_equal(tn_gguf_add_tensor(w, mu->add_tensor, TN_F32, 1, (int64_t[4]){mu->add_len, 1, 1, 1}, extra), TERN_OK);
    }
    assert_int_equal(tn_gguf_write(w, out, NULL, NULL), TERN_OK);
    tn_gguf_writer_free(w);
    tn_gguf_free(g);
}

static void expect_fail(const mutation *mu, tern_status want, const char *phrase) {
    char out[512];
    tiny_tmp_path(out, sizeof out, "mutant");
    write_mutant(mu, out);
    tern_model *m = NULL;
    tern_status s = tern_model_load(out, NULL, &m);
    unlink(out);
    if (s != want || !strstr(tern_last_error(), phrase))
        fail_msg("want status %d with '%s', got %d: %s", want, phrase, s, tern_last_error());
    assert_null(m);
}

static void test_defects(void **state) {
    (void)state;
    expect_fail(&(mutation){.drop_key = "general.architecture"}, TERN_ERR_FORMAT, "general.architecture");
    expect_fail(&(mutation){.set_key = "general.architecture", .set_str = "gptx"}, TERN_ERR_UNSUPPORTED, "gptx");
    expect_fail(&(mutation){.drop_key = "llama.block_count"}, TERN_ERR_FORMAT, "llama.block_count");
    expect_fail(&(mutation){.set_key = "llama.attention.head_count", .set_u32 = 3}, TERN_ERR_FORMAT, "head_count");
    expect_fail(&(mutation){.set_key = "llama.attention.head_count_kv", .set_u32 = 3}, TERN_ERR_FORMAT, "head_count_kv");
    expect_fail(&(mutation){.set_key = "llama.attention.head_count_kv", .set_u32 = 0}, TERN_ERR_FORMAT, "head_count_kv");
    expect_fail(&(mutation){.set_key = "llama.context_length", .set_u32 = 0}, TERN_ERR_FORMAT, "context_length");
    expect_fail(&(mutation){.set_key = "llama.rope.dimension_count", .set_u32 = 1000}, TERN_ERR_FORMAT, "rope.dimension_count");
    expect_fail(&(mutation){.set_key = "llama.block_count", .set_u32 = 3}, TERN_ERR_FORMAT, "blk.2.attn_norm.weight");
    expect_fail(&(mutation){.set_key = "llama.block_count", .set_u32 = 1}, TERN_ERR_FORMAT, "blk.1.");
    expect_fail(&(mutation){.drop_tensor = "blk.1.attn_k.weight"}, TERN_ERR_FORMAT, "blk.1.attn_k.weight");
    expect_fail(&(mutation){.reshape_tensor = "blk.0.ffn_down.weight"}, TERN_ERR_FORMAT, "blk.0.ffn_down.weight");
    expect_fail(&(mutation){.set_key = "llama.embedding_length", .set_u32 = 128}, TERN_ERR_FORMAT, "token_embd.weight");
}

/* Mixture-of-experts files (a tiny qwen3moe: 8 experts, top 2; a tiny llama): a top-k above the
 * expert count, an expert count outside 1..512, an expert tensor with another number of experts,
 * a transposed router, a router missing, expert rows other than expert_feed_forward_length, a
 * dense llama file declaring experts, a Mixtral-style one declaring none or with a dense tensor: one error naming the key or tensor (and both shapes). */
static void test_moe_defects(void **state) {
    (void)state;
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.arch = "qwen3moe", cfg.n_expert = 8, cfg.n_expert_used = 2, cfg.n_ff_exp = 256;
    char src[512];
    tiny_tmp_path(src, sizeof src, "moe-base");
    assert_int_equal(tiny_model_write(src, &cfg), TERN_OK);
    tern_model *m = NULL;
    assert_int_equal(tern_model_load(src, NULL, &m), TERN_OK);
    assert_int_equal(m->hp.n_expert, 8);
    assert_int_equal(m->hp.n_expert_used, 2);
    assert_int_equal(m->hp.n_ff_exp, 256);
    assert_int_equal(m->layers[1].w[TN_ROLE_FFN_DOWN_EXPS].ne[2], 8);
    tern_model_free(m);
    expect_fail(&(mutation){.src = src, .set_key = "qwen3moe.expert_used_count", .set_u32 = 9}, TERN_ERR_FORMAT,
                "qwen3moe.expert_used_count 9 must be in 1..qwen3moe.expert_count 8");
    expect_fail(&(mutation){.src = src, .set_key = "qwen3moe.expert_used_count", .set_u32 = 0}, TERN_ERR_FORMAT,
                "expert_used_count 0");
    expect_fail(&(mutation){.src = src, .set_key = "qwen3moe.expert_count", .set_u32 = 1000}, TERN_ERR_FORMAT,
                "'qwen3moe.expert_count' = 1000 is outside 0..512");
    expect_fail(&(mutation){.src = src, .drop_key = "qwen3moe.expert_count"}, TERN_ERR_FORMAT,
                "qwen3moe needs qwen3moe.expert_count > 0");
    expect_fail(&(mutation){.src = src, .halve_experts = "blk.1.ffn_up_exps.weight"}, TERN_ERR_FORMAT,
                "tensor 'blk.1.ffn_up_exps.weight' has shape [256, 256, 4]: 4 experts, but qwen3moe.expert_count is 8");
    expect_fail(&(mutation){.src = src, .reshape_tensor = "blk.0.ffn_gate_inp.weight"}, TERN_ERR_FORMAT,
                "tensor 'blk.0.ffn_gate_inp.weight' has shape [8, 256], expected [256, 8]");
    expect_fail(&(mutation){.src = src, .drop_tensor = "blk.1.ffn_gate_inp.weight"}, TERN_ERR_FORMAT,
                "missing tensor 'blk.1.ffn_gate_inp.weight'");
    expect_fail(&(mutation){.src = src, .set_key = "qwen3moe.expert_feed_forward_length", .set_u32 = 128}, TERN_ERR_FORMAT,
                "blk.0.ffn_gate_exps.weight");
    /* a dense llama declaring experts; a gemma3 (no experts in tern) declaring them */
    expect_fail(&(mutation){.set_key = "llama.expert_count", .set_u32 = 8}, TERN_ERR_FORMAT, "llama.expert_used_count");
    unlink(src);
    cfg.arch = "llama", cfg.n_ff = 256, cfg.n_ff_exp = 0;
    assert_int_equal(tiny_model_write(src, &cfg), TERN_OK);
    assert_int_equal(tern_model_load(src, NULL, &m), TERN_OK); /* Mixtral-style */
    assert_null(m->layers[0].w[TN_ROLE_FFN_GATE].data);
    assert_int_equal(m->layers[0].w[TN_ROLE_FFN_GATE_EXPS].ne[1], 256);
    tern_model_free(m);
    expect_fail(&(mutation){.src = src, .drop_key = "llama.expert_count"}, TERN_ERR_FORMAT,
                "missing tensor 'blk.0.ffn_gate.weight'");
    expect_fail(&(mutation){.src = src, .add_tensor = "blk.1.ffn_down.weight", .add_len = 16}, TERN_ERR_FORMAT,
                "unexpected tensor 'blk.1.ffn_down.weight' (shape [16]): llama.expert_count is 8");
    unlink(src);
    /* qwen2moe: its shared expert's rows from expert_shared_feed_forward_length; a shared-expert
     * tensor missing or of other rows, a shared expert in a family without one */
    cfg.arch = "qwen2moe", cfg.n_ff = 256, cfg.n_ff_exp = 128, cfg.n_ff_shexp = 320;
    assert_int_equal(tiny_model_write(src, &cfg), TERN_OK);
    assert_int_equal(tern_model_load(src, NULL, &m), TERN_OK);
    assert_int_equal(m->hp.n_ff_shexp, 320);
    assert_int_equal(m->layers[1].w[TN_ROLE_FFN_DOWN_SHEXP].ne[0], 320);
    assert_non_null(m->layers[1].w[TN_ROLE_FFN_GATE_INP_SHEXP].data);
    tern_model_free(m);
    expect_fail(&(mutation){.src = src, .drop_tensor = "blk.1.ffn_up_shexp.weight"}, TERN_ERR_FORMAT,
                "missing tensor 'blk.1.ffn_up_shexp.weight'");
    expect_fail(&(mutation){.src = src, .drop_key = "qwen2moe.expert_shared_feed_forward_length"}, TERN_ERR_FORMAT,
                "tensor 'blk.0.ffn_gate_shexp.weight' has shape [256, 320], expected [256, 256]");
    unlink(src);
    cfg.arch = "qwen3moe", cfg.n_ff_shexp = 0;
    assert_int_equal(tiny_model_write(src, &cfg), TERN_OK);
    expect_fail(&(mutation){.src = src, .add_tensor = "blk.0.ffn_gate_inp_shexp.weight", .add_len = 256}, TERN_ERR_FORMAT,
                "unexpected tensor 'blk.0.ffn_gate_inp_shexp.weight' (shape [256]): architecture qwen3moe has no");
    unlink(src);
}

/* deepseek2 (a tiny MLA file from tiny_model.c, llama.cpp's deepseek2.cpp shapes: 4 heads of 64 +
 * 32 rotated over a latent of 64, values of 64, first layer dense): a kv_lora_rank that does not
 * match the file, the latent's norm or the rank key missing, an up-projection with fewer heads,
 * mismatched MLA head keys, a dense layer count that disagrees with the tensors, experts in a
 * dense layer, groups that do not divide the experts: one error naming the key or tensor. */
static void test_mla_defects(void **state) {
    (void)state;
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.arch = "deepseek2", cfg.n_layer = 3, cfg.n_head_kv = 1, cfg.head_dim = 96, cfg.n_rot = 32, cfg.kv_lora = 64;
    cfg.v_head = 64, cfg.dense_lead = 1, cfg.n_shared = 2, cfg.n_ff_exp = 128, cfg.n_expert = 8, cfg.n_expert_used = 2;
    char src[512];
    tiny_tmp_path(src, sizeof src, "mla-base");
    assert_int_equal(tiny_model_write(src, &cfg), TERN_OK);
    tern_model *m = NULL;
    assert_int_equal(tern_model_load(src, NULL, &m), TERN_OK);
    assert_int_equal(m->hp.n_lora_kv, 64);
    assert_int_equal(m->hp.head_dim, 96);
    assert_int_equal(m->hp.v_head, 64);
    assert_int_equal(m->hp.n_ff_shexp, 256);
    assert_non_null(m->layers[0].w[TN_ROLE_FFN_GATE].data);
    assert_null(m->layers[0].w[TN_ROLE_FFN_GATE_INP].data);
    assert_int_equal(m->layers[2].w[TN_ROLE_ATTN_K_B_MLA].ne[2], 4);
    tern_model_free(m);
    expect_fail(&(mutation){.src = src, .set_key = "deepseek2.attention.kv_lora_rank", .set_u32 = 32}, TERN_ERR_FORMAT,
                "deepseek2.attention.key_length 96 / value_length 64 must be kv_lora_rank + rope dims (64) / kv_lora_rank (32)");
    expect_fail(&(mutation){.src = src, .drop_key = "deepseek2.attention.kv_lora_rank"}, TERN_ERR_FORMAT,
                "deepseek2.attention.kv_lora_rank");
    expect_fail(&(mutation){.src = src, .drop_tensor = "blk.1.attn_kv_a_norm.weight"}, TERN_ERR_FORMAT,
                "missing tensor 'blk.1.attn_kv_a_norm.weight'");
    expect_fail(&(mutation){.src = src, .reshape_tensor = "blk.0.attn_kv_a_mqa.weight"}, TERN_ERR_FORMAT,
                "tensor 'blk.0.attn_kv_a_mqa.weight' has shape [96, 256], expected [256, 96]");
    expect_fail(&(mutation){.src = src, .halve_experts = "blk.2.attn_k_b.weight"}, TERN_ERR_FORMAT,
                "tensor 'blk.2.attn_k_b.weight' has shape [64, 64, 2], expected [64, 64, 4]");
    expect_fail(&(mutation){.src = src, .drop_key = "deepseek2.attention.value_length_mla"}, TERN_ERR_FORMAT,
                "key_length_mla and value_length_mla go together");
    expect_fail(&(mutation){.src = src, .set_key = "deepseek2.leading_dense_block_count", .set_u32 = 2}, TERN_ERR_FORMAT,
                "missing tensor 'blk.1.ffn_gate.weight'");
    expect_fail(&(mutation){.src = src, .add_tensor = "blk.0.exp_probs_b.bias", .add_len = 8}, TERN_ERR_FORMAT,
                "unexpected tensor 'blk.0.exp_probs_b.bias' (shape [8]): layer 0 of deepseek2 (leading_dense_block_count 1");
    expect_fail(&(mutation){.src = src, .set_key = "deepseek2.expert_group_count", .set_u32 = 3}, TERN_ERR_FORMAT,
                "deepseek2.expert_group_count 3");
    expect_fail(&(mutation){.src = src, .set_key = "deepseek2.rope.dimension_count", .set_u32 = 96}, TERN_ERR_FORMAT,
                "deepseek2.rope.dimension_count 96 must be below the q/k head size 96");
    unlink(src);
}

/* The registry's tensor sets: a qwen3 file (tiny_model.c's list, written from llama.cpp's
 * src/models/qwen3.cpp: n_embd 256, 4 heads of head_dim 128, so q rows are 512) with a q/k norm
 * missing or misshapen, attn_output transposed, value_length != key_length; a llama file with a
 * qwen3-only tensor, or a tensor no family has. One error naming the tensor, the expected and the
 * found shape. */
static void test_family_tensor_sets(void **state) {
    (void)state;
    const char *q3 = qwen3_path;
    tern_model *m = NULL;
    assert_int_equal(tern_model_load(q3, NULL, &m), TERN_OK);
    assert_int_equal(m->hp.head_dim, 128);
    assert_int_equal(tn_hp_q_dim(&m->hp), 512);
    assert_non_null(m->layers[1].w[TN_ROLE_ATTN_K_NORM].data);
    assert_null(m->layers[1].w[TN_ROLE_ATTN_Q_B].data);
    assert_non_null(strstr(tern_model_desc(m), "qwen3"));
    tern_model_free(m);
    expect_fail(&(mutation){.src = q3, .drop_tensor = "blk.1.attn_q_norm.weight"}, TERN_ERR_FORMAT,
                "missing tensor 'blk.1.attn_q_norm.weight' (qwen3 expects shape [128])");
    expect_fail(&(mutation){.src = q3, .drop_tensor = "blk.0.attn_k_norm.weight", .add_tensor = "blk.0.attn_k_norm.weight",
                            .add_len = 256},
                TERN_ERR_FORMAT, "tensor 'blk.0.attn_k_norm.weight' has shape [256], expected [128] (qwen3)");
    expect_fail(&(mutation){.src = q3, .reshape_tensor = "blk.1.attn_output.weight"}, TERN_ERR_FORMAT,
                "tensor 'blk.1.attn_output.weight' has shape [256, 512], expected [512, 256]");
    expect_fail(&(mutation){.src = q3, .set_key = "qwen3.attention.key_length", .set_u32 = 64}, TERN_ERR_UNSUPPORTED,
                "value_length 128 differs from key_length 64");
    expect_fail(&(mutation){.src = q3, .set_key = "qwen3.attention.value_length", .set_u32 = 64}, TERN_ERR_UNSUPPORTED,
                "value_length 64");
    /* key_length 64 for both: every q/k/v/o matrix and norm is the wrong size; the first named */
    char mid[512];
    tiny_tmp_path(mid, sizeof mid, "q3kl");
    write_mutant(&(mutation){.src = q3, .set_key = "qwen3.attention.key_length", .set_u32 = 64}, mid);
    expect_fail(&(mutation){.src = mid, .set_key = "qwen3.attention.value_length", .set_u32 = 64}, TERN_ERR_FORMAT,
                "tensor 'blk.0.attn_q.weight' has shape [256, 512], expected [256, 256]");
    unlink(mid);
    expect_fail(&(mutation){.add_tensor = "blk.0.attn_q_norm.weight", .add_len = 64}, TERN_ERR_FORMAT,
                "unexpected tensor 'blk.0.attn_q_norm.weight' (shape [64]): architecture llama has no attn_q_norm.weight");
    expect_fail(&(mutation){.add_tensor = "blk.1.ffn_gate_inp.weight", .add_len = 8}, TERN_ERR_FORMAT,
                "unexpected tensor 'blk.1.ffn_gate_inp.weight'");
    expect_fail(&(mutation){.add_tensor = "blk.01.attn_norm.weight", .add_len = 256}, TERN_ERR_FORMAT,
                "unexpected tensor 'blk.01.attn_norm.weight'");
    expect_fail(&(mutation){.src = q3, .add_tensor = "rope_freqs.weight", .add_len = 64}, TERN_ERR_FORMAT,
                "architecture qwen3 has no rope_freqs.weight");
    /* gemma3: a post norm missing; a sliding-window period of 0 */
    char g3[512];
    tiny_cfg gc;
    tiny_cfg_default(&gc);
    gc.arch = "gemma3", gc.n_layer = 2, gc.head_dim = 128, gc.n_swa = 4;
    tiny_tmp_path(g3, sizeof g3, "loadg3");
    assert_int_equal(tiny_model_write(g3, &gc), TERN_OK);
    assert_int_equal(tern_model_load(g3, NULL, &m), TERN_OK);
    assert_int_equal(m->hp.n_swa, 4);
    assert_int_equal(m->hp.swa_period, 6);
    assert_non_null(m->layers[1].w[TN_ROLE_FFN_POST_NORM].data);
    tern_model_free(m);
    expect_fail(&(mutation){.src = g3, .drop_tensor = "blk.1.post_ffw_norm.weight"}, TERN_ERR_FORMAT,
                "missing tensor 'blk.1.post_ffw_norm.weight' (gemma3 expects shape [256])");
    expect_fail(&(mutation){.src = g3, .set_key = "gemma3.attention.sliding_window_pattern", .set_u32 = 0}, TERN_ERR_FORMAT,
                "sliding_window_pattern' = 0");
    expect_fail(&(mutation){.src = q3, .add_tensor = "blk.0.post_ffw_norm.weight", .add_len = 256}, TERN_ERR_FORMAT,
                "architecture qwen3 has no post_ffw_norm.weight");
    unlink(g3);
    /* gemma2: its tensor set (post norms, no q/k norms, no output.weight) and its keys in range */
    char g2[512];
    gc.arch = "gemma2", gc.tied = true, gc.n_layer = 2, gc.attn_softcap = 2.0f;
    tiny_tmp_path(g2, sizeof g2, "loadg2");
    assert_int_equal(tiny_model_write(g2, &gc), TERN_OK);
    assert_int_equal(tern_model_load(g2, NULL, &m), TERN_OK);
    assert_int_equal(m->hp.n_swa, 4);
    assert_int_equal(m->hp.swa_period, 2);
    assert_true(m->hp.attn_softcap == 2.0f && m->hp.logit_softcap == 30.0f); /* the file's; llama.cpp's default */
    assert_true(tn_hp_layer_swa(&m->hp, 0) && !tn_hp_layer_swa(&m->hp, 1));
    assert_ptr_equal(m->output.data, m->tok_embd.data);
    tern_model_free(m);
    expect_fail(&(mutation){.src = g2, .drop_tensor = "blk.1.post_attention_norm.weight"}, TERN_ERR_FORMAT,
                "missing tensor 'blk.1.post_attention_norm.weight' (gemma2 expects shape [256])");
    expect_fail(&(mutation){.src = g2, .reshape_tensor = "blk.0.ffn_down.weight"}, TERN_ERR_FORMAT,
                "tensor 'blk.0.ffn_down.weight' has shape [256, 512], expected [512, 256] (gemma2)");
    expect_fail(&(mutation){.src = g2, .add_tensor = "blk.0.attn_q_norm.weight", .add_len = 128}, TERN_ERR_FORMAT,
                "unexpected tensor 'blk.0.attn_q_norm.weight' (shape [128]): architecture gemma2 has no attn_q_norm.weight");
    expect_fail(&(mutation){.src = g2, .add_tensor = "output.weight", .add_len = 256}, TERN_ERR_FORMAT,
                "architecture gemma2 has no output.weight");
    expect_fail(&(mutation){.src = g2, .set_key = "gemma2.attn_logit_softcapping", .set_is_f32 = true, .set_f32 = -1.0f},
                TERN_ERR_FORMAT, "key 'gemma2.attn_logit_softcapping' = -1 must be a number > 0");
    expect_fail(&(mutation){.src = g2, .set_key = "gemma2.final_logit_softcapping", .set_is_f32 = true, .set_f32 = NAN},
                TERN_ERR_FORMAT, "key 'gemma2.final_logit_softcapping' is not a finite number");
    expect_fail(&(mutation){.src = g2, .set_key = "gemma2.final_logit_softcapping", .set_is_f32 = true, .set_f32 = 0.0f},
                TERN_ERR_FORMAT, "key 'gemma2.final_logit_softcapping' = 0 must be a number > 0");
    expect_fail(&(mutation){.src = g2, .set_key = "gemma2.attention.sliding_window", .set_u32 = 0}, TERN_ERR_FORMAT,
                "key 'gemma2.attention.sliding_window' = 0 is outside 1..16777216");
    expect_fail(&(mutation){.src = g2, .set_key = "gemma2.attention.sliding_window", .set_u32 = 0x80000000u}, TERN_ERR_FORMAT,
                "key 'gemma2.attention.sliding_window' = 2147483648 is outside");
    unlink(g2);
    /* phi3: fused attn_qkv and gate|up ffn_up bound as row slices of the file's bytes; LongRoPE
     * factors picked by the context; defects named */
    char p3[512];
    tiny_cfg pc;
    tiny_cfg_default(&pc);
    pc.arch = "phi3", pc.n_rot = 48, pc.n_ctx_orig = 32, pc.rope_attn_factor = 1.5f;
    tiny_tmp_path(p3, sizeof p3, "loadp3");
    assert_int_equal(tiny_model_write(p3, &pc), TERN_OK);
    tern_model_params nr;
    tern_model_params_init(&nr);
    nr.repack = false; /* the views as bound, in the file mapping */
    assert_int_equal(tern_model_load(p3, &nr, &m), TERN_OK);
    {
        const tn_gguf_tensor *qkv = tn_gguf_find_tensor(m->gguf, "blk.1.attn_qkv.weight");
        const tn_gguf_tensor *up = tn_gguf_find_tensor(m->gguf, "blk.1.ffn_up.weight");
        const tn_tensor *w = m->layers[1].w;
        const size_t rb = 256 * sizeof(float); /* f32 rows of n_embd */
        assert_non_null(qkv);
        assert_non_null(up);
        /* q: rows 0..255, k: 256..383, v: 384..511 (2 kv heads of 64); gate then up, 512 rows each */
        assert_ptr_equal(w[TN_ROLE_ATTN_Q].data, qkv->data);
        assert_ptr_equal(w[TN_ROLE_ATTN_K].data, (const uint8_t *)qkv->data + 256 * rb);
        assert_ptr_equal(w[TN_ROLE_ATTN_V].data, (const uint8_t *)qkv->data + 384 * rb);
        assert_int_equal(w[TN_ROLE_ATTN_K].ne[1], 128);
        assert_null(w[TN_ROLE_ATTN_QKV].data);
        assert_ptr_equal(w[TN_ROLE_FFN_GATE].data, up->data);
        assert_ptr_equal(w[TN_ROLE_FFN_UP].data, (const uint8_t *)up->data + 512 * rb);
        assert_int_equal(w[TN_ROLE_FFN_UP].ne[1], 512);
        assert_int_equal(m->hp.n_rot, 48);
        assert_int_equal(m->hp.n_ctx_orig, 32);
        assert_true(m->hp.rope_attn_factor == 1.5f);
        assert_ptr_equal(tn_model_rope_factors(m, 32), m->rope_short.data);
        assert_ptr_equal(tn_model_rope_factors(m, 33), m->rope_long.data);
        assert_non_null(m->rope_long.data);
    }
    tern_model_free(m);
    expect_fail(&(mutation){.src = p3, .drop_tensor = "blk.0.attn_qkv.weight"}, TERN_ERR_FORMAT,
                "missing tensor 'blk.0.attn_qkv.weight' (phi3 expects shape [256, 512])");
    expect_fail(&(mutation){.src = p3, .reshape_tensor = "blk.1.ffn_up.weight"}, TERN_ERR_FORMAT,
                "tensor 'blk.1.ffn_up.weight' has shape [1024, 256], expected [256, 1024] (phi3)");
    expect_fail(&(mutation){.src = p3, .add_tensor = "blk.0.ffn_gate.weight", .add_len = 256}, TERN_ERR_FORMAT,
                "unexpected tensor 'blk.0.ffn_gate.weight' (shape [256]): architecture phi3 has no ffn_gate.weight");
    expect_fail(&(mutation){.src = p3, .add_tensor = "blk.0.attn_q.weight", .add_len = 256}, TERN_ERR_FORMAT,
                "architecture phi3 has no attn_q.weight");
    expect_fail(&(mutation){.src = p3, .drop_tensor = "rope_factors_long.weight", .add_tensor = "rope_factors_long.weight",
                            .add_len = 32},
                TERN_ERR_FORMAT, "tensor 'rope_factors_long.weight' has shape [32], expected [24] (phi3)");
    expect_fail(&(mutation){.src = p3, .set_key = "phi3.rope.scaling.attn_factor", .set_is_f32 = true, .set_f32 = -2.0f},
                TERN_ERR_FORMAT, "key 'phi3.rope.scaling.attn_factor' = -2 must be a number > 0");
    expect_fail(&(mutation){.src = p3, .set_key = "phi3.rope.scaling.original_context_length", .set_u32 = 0},
                TERN_ERR_FORMAT, "key 'phi3.rope.scaling.original_context_length' = 0 is outside 1..16777216");
    expect_fail(&(mutation){.src = p3, .set_key = "phi3.attention.sliding_window", .set_u32 = 0x80000000u},
                TERN_ERR_FORMAT, "key 'phi3.attention.sliding_window' = 2147483648 is outside 0..16777216");
    /* Phi-3-mini-4k's window (2047) loads and is not applied, as in llama.cpp */
    char p3w[512];
    tiny_tmp_path(p3w, sizeof p3w, "loadp3w");
    write_mutant(&(mutation){.src = p3, .set_key = "phi3.attention.sliding_window", .set_u32 = 2047}, p3w);
    assert_int_equal(tern_model_load(p3w, NULL, &m), TERN_OK);
    assert_int_equal(m->hp.n_swa, 0);
    tern_model_free(m);
    unlink(p3w);
    unlink(p3);
    /* a llama file can have the optional biases (llama.cpp's loader allows them) */
    char out[512];
    tiny_tmp_path(out, sizeof out, "llbias");
    write_mutant(&(mutation){.add_tensor = "blk.0.attn_q.bias", .add_len = 256}, out);
    assert_int_equal(tern_model_load(out, NULL, &m), TERN_OK);
    assert_non_null(m->layers[0].w[TN_ROLE_ATTN_Q_B].data);
    assert_null(m->layers[1].w[TN_ROLE_ATTN_Q_B].data);
    tern_model_free(m);
    unlink(out);
}

/* The registry itself: names round-trip through tn_role_parse; every family is found by name,
 * has the roles every block needs, and a shape for each of them. */
static void test_registry(void **state) {
    (void)state;
    assert_true(tn_arch_count() >= 3);
    for (size_t i = 0; i < tn_arch_count(); i++) {
        const tn_arch_desc *a = tn_arch_at(i);
        assert_ptr_equal(tn_arch_find(a->name, strlen(a->name)), a);
        /* the need of a dense model of the family, and of one with experts (where it may have them) */
        tn_hparams dense, moe;
        memset(&dense, 0, sizeof dense);
        dense.family = a;
        moe = dense;
        moe.n_expert = 8;
        const bool may_moe = a->need[TN_ROLE_FFN_GATE_INP] != TN_NEED_NO, always_moe = a->need[TN_ROLE_FFN_GATE_INP] == TN_NEED_REQ;
        const tn_role must[] = {TN_ROLE_ATTN_NORM, TN_ROLE_ATTN_OUT, TN_ROLE_TOKEN_EMBD, TN_ROLE_OUTPUT_NORM};
        for (size_t j = 0; j < sizeof must / sizeof must[0]; j++) assert_int_equal(a->need[must[j]], TN_NEED_REQ);
        /* a feed-forward: dense (up and down) or experts (router, gate, up, down), never both */
        const tn_role dense_ffn[] = {TN_ROLE_FFN_UP, TN_ROLE_FFN_DOWN};
        const tn_role moe_ffn[] = {TN_ROLE_FFN_GATE_INP, TN_ROLE_FFN_GATE_EXPS, TN_ROLE_FFN_UP_EXPS, TN_ROLE_FFN_DOWN_EXPS};
        for (size_t j = 0; j < 2; j++) {
            if (!always_moe) assert_int_equal(tn_arch_need(&dense, dense_ffn[j]), TN_NEED_REQ);
            if (may_moe) assert_int_equal(tn_arch_need(&moe, dense_ffn[j]), TN_NEED_NO);
        }
        for (size_t j = 0; j < 4; j++) {
            if (!always_moe) assert_int_equal(tn_arch_need(&dense, moe_ffn[j]), TN_NEED_NO);
            assert_int_equal(tn_arch_need(&moe, moe_ffn[j]), may_moe ? TN_NEED_REQ : TN_NEED_NO);
        }
        /* q, k, v: three matrices or one fused (its slices bound to them); gate: its own or in ffn_up;
         * latent attention (deepseek2): q direct or low-rank (tn_arch_need_layer), no k / v */
        if (a->mla) {
            assert_int_equal(a->need[TN_ROLE_ATTN_KV_A_MQA], TN_NEED_REQ);
            assert_int_equal(a->need[TN_ROLE_ATTN_K], TN_NEED_NO);
            moe.n_lora_q = 0;
            assert_int_equal(tn_arch_need_layer(&moe, 0, TN_ROLE_ATTN_Q), TN_NEED_REQ);
            moe.n_lora_q = 64;
            assert_int_equal(tn_arch_need_layer(&moe, 0, TN_ROLE_ATTN_Q), TN_NEED_NO);
            assert_int_equal(tn_arch_need_layer(&moe, 0, TN_ROLE_ATTN_Q_LB), TN_NEED_REQ);
            continue;
        }
        const bool fused_qkv = a->need[TN_ROLE_ATTN_QKV] == TN_NEED_REQ;
        assert_int_equal(a->need[TN_ROLE_ATTN_Q], fused_qkv ? TN_NEED_NO : TN_NEED_REQ);
        assert_int_equal(a->need[TN_ROLE_ATTN_K], fused_qkv ? TN_NEED_NO : TN_NEED_REQ);
        assert_int_equal(a->need[TN_ROLE_ATTN_V], fused_qkv ? TN_NEED_NO : TN_NEED_REQ);
        if (!always_moe) assert_int_equal(tn_arch_need(&dense, TN_ROLE_FFN_GATE), a->gate_up_fused ? TN_NEED_NO : TN_NEED_REQ);
    }
    assert_null(tn_arch_find("llam", 4));
    for (int r = 0; r < TN_ROLE_COUNT; r++) {
        char n[96];
        int32_t il = 0;
        tn_role back;
        tn_role_tensor_name((tn_role)r, 17, n, sizeof n);
        assert_true(tn_role_parse(n, &il, &back));
        assert_int_equal(back, r);
        assert_int_equal(il, r < TN_ROLE_N_LAYER ? 17 : -1);
    }
    int32_t il;
    tn_role r;
    assert_false(tn_role_parse("blk.x.attn_q.weight", &il, &r));
    assert_false(tn_role_parse("blk.3.attn_q", &il, &r));
    assert_false(tn_role_parse("attn_q.weight", &il, &r)); /* a layer role without its layer */
    assert_false(tn_role_parse("blk.0.token_embd.weight", &il, &r));
}

static void test_tied_output_loads(void **state) {
    (void)state;
    char out[512];
    tiny_tmp_path(out, sizeof out, "tied");
    write_mutant(&(mutation){.drop_tensor = "output.weight"}, out);
    tern_model *m = NULL;
    tern_status s = tern_model_load(out, NULL, &m);
    unlink(out);
    if (s) fail_msg("tied model failed to load: %s", tern_last_error());
    tern_ctx *c = NULL;
    assert_int_equal(tern_ctx_create(m, NULL, &c), TERN_OK);
    tern_token t = 1;
    assert_int_equal(tern_decode(c, &t, 1), TERN_OK);
    assert_non_null(tern_get_logits(c, -1));
    tern_ctx_free(c);
    tern_model_free(m);
}

static void test_alloc_failures(void **state) {
    (void)state;
    /* Every allocation failure during load and context creation is a clean NOMEM, no leak. */
    for (uint64_t n = 1; n < 100000; n++) {
        tn_alloc_fail_at(n, false);
        tern_model *m = NULL;
        tern_ctx *c = NULL;
        tern_status s = tern_model_load(base_path, NULL, &m);
        if (s == TERN_OK) s = tern_ctx_create(m, NULL, &c);
        tn_alloc_fail_at(0, false);
        tern_ctx_free(c);
        tern_model_free(m);
        if (s == TERN_OK) return; /* past the last allocation */
        assert_int_equal(s, TERN_ERR_NOMEM);
    }
    fail_msg("never succeeded");
}

static void test_null_args(void **state) {
    (void)state;
    tern_model *m = NULL;
    assert_int_equal(tern_model_load(NULL, NULL, &m), TERN_ERR_INVALID_ARG);
    assert_int_equal(tern_model_load(base_path, NULL, NULL), TERN_ERR_INVALID_ARG);
    tern_ctx *c = NULL;
    assert_int_equal(tern_ctx_create(NULL, NULL, &c), TERN_ERR_INVALID_ARG);
    assert_int_equal(tern_model_load("/nonexistent/x.gguf", NULL, &m), TERN_ERR_NOT_FOUND);
    assert_non_null(strstr(tern_last_error(), "/nonexistent/x.gguf"));
}

/* The last token's logits (nv of them, malloc'd) after decoding toks with 2 threads. */
static float *decode_logits(tern_model *m, const tern_token *toks, int n, int nv) {
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_threads = 2;
    tern_ctx *c = NULL;
    assert_int_equal(tern_ctx_create(m, &cp, &c), TERN_OK);
    assert_int_equal(tern_decode(c, toks, n), TERN_OK);
    float *l = malloc((size_t)nv * sizeof(float));
    assert_non_null(l);
    memcpy(l, tern_get_logits(c, -1), (size_t)nv * sizeof(float));
    tern_ctx_free(c);
    return l;
}

/* A model of type wt loaded three ways: mapped + repack, read + repack (in place), mapped, no
 * repack: the matrices in wt's load-time layout (when the SIMD kernels exist), every row reading
 * back as the file's, and the logits of the three within float rounding */
static void repack_load_modes_out(const char *arch, tn_dtype wt, tn_dtype ot, int64_t n_embd) {
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.arch = arch;
    cfg.wtype = wt;
    cfg.out_type = ot; /* an untied output is repacked too */
    cfg.n_embd = n_embd, cfg.n_ff = 2 * n_embd;
    char path[512];
    tiny_tmp_path(path, sizeof path, "repack");
    assert_int_equal(tiny_model_write(path, &cfg), TERN_OK);
    const tn_dtype lt = tn_repack_type_of(wt), lo = tn_repack_type_of(ot);
    assert_true(lt != 0 && lo != 0);
    const bool simd = tn_kern()->slot[lt].gemm_isa >= TN_ISA_AVX512;
    const bool simd_o = tn_kern()->slot[lo].gemm_isa >= TN_ISA_AVX512;
    tern_model *m[3] = {NULL};
    float *logits[3];
    const int nv = (int)cfg.n_vocab;
    const tern_token toks[6] = {1, 17, 42, 300, 5, 99};
    for (int v = 0; v < 3; v++) {
        tern_model_params mp;
        tern_model_params_init(&mp);
        assert_true(mp.repack); /* the default */
        mp.use_mmap = v != 1;
        mp.repack = v != 2;
        assert_int_equal(tern_model_load(path, &mp, &m[v]), TERN_OK);
        const tn_dtype want = v != 2 && simd ? lt : wt;
        assert_int_equal(m[v]->layers[0].w[TN_ROLE_ATTN_Q].type, want);
        assert_int_equal(m[v]->layers[1].w[TN_ROLE_FFN_DOWN].type, want);
        assert_int_equal(m[v]->output.type, v != 2 && simd_o ? lo : ot);
        assert_int_equal(m[v]->tok_embd.type, ot); /* row lookups: never moved */
        logits[v] = decode_logits(m[v], toks, 6, nv);
    }
    /* every row of every repacked matrix reads back as the file's row */
    const int64_t k = cfg.n_embd;
    float *a = malloc((size_t)k * sizeof(float)), *b = malloc((size_t)k * sizeof(float));
    for (int64_t r = 0; r < m[0]->layers[0].w[TN_ROLE_ATTN_Q].ne[1]; r++) {
        tn_tensor_get_row(&m[0]->layers[0].w[TN_ROLE_ATTN_Q], r, a);
        tn_tensor_get_row(&m[2]->layers[0].w[TN_ROLE_ATTN_Q], r, b);
        assert_memory_equal(a, b, (size_t)k * sizeof(float));
        tn_tensor_get_row(&m[1]->layers[0].w[TN_ROLE_ATTN_Q], r, b);
        assert_memory_equal(a, b, (size_t)k * sizeof(float));
    }
    free(a), free(b);
    /* mapped and in-place repacking: the same kernels on the same bytes */
    assert_memory_equal(logits[0], logits[1], (size_t)nv * sizeof(float));
    double num = 0, den = 0;
    for (int i = 0; i < nv; i++) {
        num += (double)(logits[0][i] - logits[2][i]) * (logits[0][i] - logits[2][i]);
        den += (double)logits[2][i] * logits[2][i];
    }
    if (!(sqrt(num / den) < 1e-4)) fail_msg("repacked vs file layout: logits rel err %.3g", sqrt(num / den));
    for (int v = 0; v < 3; v++) {
        free(logits[v]);
        tern_model_free(m[v]);
    }
    unlink(path);
}

static void repack_load_modes(const char *arch, tn_dtype wt, int64_t n_embd) {
    repack_load_modes_out(arch, wt, wt, n_embd);
}

/* By default q6_K matrices move to q6_K_r16 like q4_K ones (on AVX-512 VNNI; elsewhere both keep
 * the file layout); TERN_REPACK_Q6K=0 keeps q6_K ones in the file layout. */
static void test_q6k_default_repacked(void **state) {
    (void)state;
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.wtype = TN_Q4_K, cfg.out_type = TN_Q6_K, cfg.n_embd = 256, cfg.n_ff = 512;
    char path[512];
    tiny_tmp_path(path, sizeof path, "q6kdef");
    assert_int_equal(tiny_model_write(path, &cfg), TERN_OK);
    tern_model *m = NULL;
    assert_int_equal(tern_model_load(path, NULL, &m), TERN_OK);
    const bool vnni = tn_kern()->slot[TN_Q6_K_R16].gemm_isa >= TN_ISA_AVX512;
    assert_int_equal(m->output.type, vnni ? TN_Q6_K_R16 : TN_Q6_K);
    assert_int_equal(m->layers[0].w[TN_ROLE_ATTN_Q].type, vnni ? TN_Q4_K_R16 : TN_Q4_K);
    tern_model_free(m);
    /* TERN_REPACK_Q6K=0: q6_K stays in the file layout, q4_K still moves */
    char *saved = getenv("TERN_REPACK_Q6K") ? strdup(getenv("TERN_REPACK_Q6K")) : NULL;
    setenv("TERN_REPACK_Q6K", "0", 1);
    m = NULL;
    assert_int_equal(tern_model_load(path, NULL, &m), TERN_OK);
    assert_int_equal(m->output.type, TN_Q6_K);
    assert_int_equal(m->layers[0].w[TN_ROLE_ATTN_Q].type, vnni ? TN_Q4_K_R16 : TN_Q4_K);
    tern_model_free(m);
    if (saved) setenv("TERN_REPACK_Q6K", saved, 1), free(saved);
    else unsetenv("TERN_REPACK_Q6K");
    unlink(path);
}

static void test_repack_load_modes(void **state) {
    (void)state;
    /* q4_K_r16 / q5_K_r16 / q6_K_r16: Q4_K_M- and Q5_K_M-like pairs (q4_K or q5_K matrices, q6_K
     * output), and q6_K throughout; 6 tokens go through the batched (prefill) kernels */
    repack_load_modes_out("llama", TN_Q4_K, TN_Q6_K, 256);
    repack_load_modes_out("llama", TN_Q5_K, TN_Q6_K, 256);
    repack_load_modes("llama", TN_Q6_K, 512);
    repack_load_modes("llama", TN_Q4_0, 256);           /* q4_0_r16 */
    repack_load_modes("phi3", TN_Q4_0, 256);            /* the row slices of fused q|k|v, gate|up each */
    const tn_tq_params p5 = {5, 64, true}, p3 = {3, 32, false};
    repack_load_modes("llama", (tn_dtype)tn_tq_dtype(&p5), 512); /* tq5g64a_c16: whole super-steps */
    repack_load_modes("llama", (tn_dtype)tn_tq_dtype(&p3), 640); /* tq3g32_c16: and a tail of 4 blocks */
    repack_load_modes_out("llama", TN_IQ4_XS, TN_Q6_K, 256); /* iq4_xs_r16 */
    repack_load_modes_out("llama", TN_IQ4_NL, TN_Q6_K, 256); /* iq4_nl_r16 */
    repack_load_modes("llama", TN_IQ4_NL, 256);              /* and the output too */
    repack_load_modes_out("llama", TN_TQ2_0, TN_Q6_K, 256);  /* tq2_0_r16 */
    repack_load_modes("llama", TN_TQ2_0, 512);
}

/* The expanded layouts (iq2 p3, iq3 p4, iq1 p2, tq1_0_r16): larger than the file's blocks, so made only
 * for a mapped file (into the moved weights' buffer), not for one read into memory nor with
 * TERN_REPACK_IQ=0; rows read back as the file's and the logits agree with the file layout's */
static void xp_load_modes(tn_dtype wt) {
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.wtype = wt;
    cfg.out_type = TN_Q6_K;
    cfg.n_embd = 256, cfg.n_ff = 512;
    char path[512];
    tiny_tmp_path(path, sizeof path, "xp");
    assert_int_equal(tiny_model_write(path, &cfg), TERN_OK);
    const tn_dtype xt = tn_repack_type_of(wt);
    assert_true(xt != 0 && tn_repack_file_type(xt) == wt && tn_repack_grows(xt));
    const bool simd = tn_kern()->slot[xt].gemm_isa >= TN_ISA_AVX512;
    const int nv = (int)cfg.n_vocab;
    const tern_token toks[6] = {1, 17, 42, 300, 5, 99};
    tern_model *m[4] = {NULL};
    float *logits[4];
    for (int v = 0; v < 4; v++) { /* mapped + repack, read + repack, mapped without, TERN_REPACK_IQ=0 */
        tern_model_params mp;
        tern_model_params_init(&mp);
        mp.use_mmap = v != 1;
        mp.repack = v != 2;
        if (v == 3) setenv("TERN_REPACK_IQ", "0", 1);
        assert_int_equal(tern_model_load(path, &mp, &m[v]), TERN_OK);
        if (v == 3) unsetenv("TERN_REPACK_IQ");
        const tn_tensor *q = &m[v]->layers[0].w[TN_ROLE_ATTN_Q];
        assert_int_equal(q->type, v == 0 && simd ? xt : wt);
        assert_int_equal(m[v]->layers[1].w[TN_ROLE_FFN_DOWN].type, v == 0 && simd ? xt : wt);
        assert_int_equal(q->nbytes, (size_t)q->ne[1] * tn_dtype_row_size(q->type, q->ne[0]));
        assert_true(v == 0 && simd ? m[v]->repack_grown > 0 : m[v]->repack_grown == 0);
        logits[v] = decode_logits(m[v], toks, 6, nv);
    }
    const int64_t k = cfg.n_embd;
    float *a = malloc((size_t)k * sizeof(float)), *b = malloc((size_t)k * sizeof(float));
    for (int64_t r = 0; r < m[0]->layers[0].w[TN_ROLE_FFN_UP].ne[1]; r++) {
        tn_tensor_get_row(&m[0]->layers[0].w[TN_ROLE_FFN_UP], r, a);
        tn_tensor_get_row(&m[2]->layers[0].w[TN_ROLE_FFN_UP], r, b);
        assert_memory_equal(a, b, (size_t)k * sizeof(float));
    }
    free(a), free(b);
    for (int v = 1; v < 4; v++) {
        double num = 0, den = 0;
        for (int i = 0; i < nv; i++) {
            num += (double)(logits[0][i] - logits[v][i]) * (logits[0][i] - logits[v][i]);
            den += (double)logits[v][i] * logits[v][i];
        }
        if (!(sqrt(num / den) < 1e-4)) fail_msg("%s expanded vs file layout (mode %d): logits rel err %.3g", tn_dtype_name(wt), v, sqrt(num / den));
    }
    for (int v = 0; v < 4; v++) {
        free(logits[v]);
        tern_model_free(m[v]);
    }
    unlink(path);
}

static void test_xp_load_modes(void **state) {
    (void)state;
    xp_load_modes(TN_IQ2_XS);
    xp_load_modes(TN_IQ3_XXS);
    xp_load_modes(TN_IQ1_M);
    xp_load_modes(TN_TQ1_0); /* tq1_0_r16: tq1_0 expanded into tq2_0_r16's blocks */
}

/* matrices of types with no interleaved layout (q3_K, q2_K here) move out of a mapped file as they
 * are, into the one buffer of moved weights: same bytes, so the same logits bit for bit as the
 * file mapping; the embedding table stays in the mapping */
static void test_moved_as_is(void **state) {
    (void)state;
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.wtype = TN_Q3_K;
    cfg.out_type = TN_Q2_K;
    char path[512];
    tiny_tmp_path(path, sizeof path, "moved");
    assert_int_equal(tiny_model_write(path, &cfg), TERN_OK);
    tern_model *m[2] = {NULL};
    float *logits[2];
    const int nv = (int)cfg.n_vocab;
    const tern_token toks[5] = {1, 7, 250, 33, 2};
    for (int v = 0; v < 2; v++) {
        tern_model_params mp;
        tern_model_params_init(&mp);
        mp.repack = v == 0;
        assert_int_equal(tern_model_load(path, &mp, &m[v]), TERN_OK);
        logits[v] = decode_logits(m[v], toks, 5, nv);
    }
    assert_null(m[1]->repacked);
    assert_non_null(m[0]->repacked);
    size_t total = (m[0]->output.nbytes + 63) & ~(size_t)63;
    for (int64_t l = 0; l < m[0]->hp.n_layer; l++) {
        const tn_tensor *w = m[0]->layers[l].w;
        const tn_tensor *v[7] = {&w[TN_ROLE_ATTN_Q],   &w[TN_ROLE_ATTN_K], &w[TN_ROLE_ATTN_V],   &w[TN_ROLE_ATTN_OUT],
                                 &w[TN_ROLE_FFN_GATE], &w[TN_ROLE_FFN_UP], &w[TN_ROLE_FFN_DOWN]};
        for (int j = 0; j < 7; j++) total += (v[j]->nbytes + 63) & ~(size_t)63;
    }
    const uint8_t *lo = m[0]->repacked, *hi = lo + total;
    for (int64_t l = 0; l < m[0]->hp.n_layer; l++) {
        const tn_tensor *w0 = m[0]->layers[l].w, *w1 = m[1]->layers[l].w;
        const tn_role roles[7] = {TN_ROLE_ATTN_Q,    TN_ROLE_ATTN_K, TN_ROLE_ATTN_V,  TN_ROLE_ATTN_OUT,
                                  TN_ROLE_FFN_GATE, TN_ROLE_FFN_UP, TN_ROLE_FFN_DOWN};
        const tn_tensor *a[7], *b[7];
        for (int j = 0; j < 7; j++) a[j] = &w0[roles[j]], b[j] = &w1[roles[j]];
        for (int j = 0; j < 7; j++) {
            assert_int_equal(a[j]->type, TN_Q3_K);
            assert_true((const uint8_t *)a[j]->data >= lo && (const uint8_t *)a[j]->data + a[j]->nbytes <= hi);
            assert_memory_equal(a[j]->data, b[j]->data, a[j]->nbytes);
        }
    }
    assert_int_equal(m[0]->output.type, TN_Q2_K);
    assert_true((const uint8_t *)m[0]->output.data >= lo && (const uint8_t *)m[0]->output.data < hi);
    assert_true((const uint8_t *)m[0]->tok_embd.data < lo || (const uint8_t *)m[0]->tok_embd.data >= hi);
    assert_memory_equal(logits[0], logits[1], (size_t)nv * sizeof(float));
    for (int v = 0; v < 2; v++) {
        free(logits[v]);
        tern_model_free(m[v]);
    }
    unlink(path);
}

/* plm (a file tern synth --arch plm wrote, given as the argument): each defect one error naming it.
 * A file without a layer's attn_kv_b, with a kv_lora_rank that disagrees with attn_kv_a_mqa's rows,
 * without kv_lora_rank, with the split attn_k_b form's tensor, with a gate (PLM's FFN has none),
 * with the rope part as wide as the head, with fewer kv heads than heads. */
static const char *g_plm_path;
static void test_plm_defects(void **state) {
    (void)state;
    const char *src = g_plm_path;
    tern_model *m = NULL;
    if (tern_model_load(src, NULL, &m)) fail_msg("load %s: %s", src, tern_last_error());
    assert_int_equal(m->hp.arch, TN_ARCH_PLM);
    assert_true(m->output.data == m->tok_embd.data); /* tied */
    assert_int_equal(m->layers[0].w[TN_ROLE_ATTN_K_B_MLA].ne[2], m->hp.n_head); /* attn_kv_b split per head */
    tern_model_free(m);
    expect_fail(&(mutation){.src = src, .drop_tensor = "blk.1.attn_kv_b.weight"}, TERN_ERR_FORMAT, "blk.1.attn_kv_b.weight");
    expect_fail(&(mutation){.src = src, .set_key = "plm.attention.kv_lora_rank", .set_u32 = 16}, TERN_ERR_FORMAT,
                "blk.0.attn_kv_a_mqa.weight");
    expect_fail(&(mutation){.src = src, .drop_key = "plm.attention.kv_lora_rank"}, TERN_ERR_FORMAT, "plm.attention.kv_lora_rank");
    expect_fail(&(mutation){.src = src, .add_tensor = "blk.0.attn_k_b.weight", .add_len = 8}, TERN_ERR_FORMAT,
                "architecture plm has no attn_k_b.weight");
    expect_fail(&(mutation){.src = src, .add_tensor = "blk.0.ffn_gate.weight", .add_len = 8}, TERN_ERR_FORMAT,
                "architecture plm has no ffn_gate.weight");
    expect_fail(&(mutation){.src = src, .set_key = "plm.rope.dimension_count", .set_u32 = 48}, TERN_ERR_FORMAT,
                "plm.rope.dimension_count 48 must be below the q/k head size 48");
    expect_fail(&(mutation){.src = src, .set_key = "plm.attention.head_count_kv", .set_u32 = 2}, TERN_ERR_FORMAT,
                "plm.attention.head_count_kv 2 must equal head_count 4");
}

int main(int argc, char **argv) {
    if (argc > 1) { /* test_model_load PLM.gguf: the plm defects on that file */
        g_plm_path = argv[1];
        const struct CMUnitTest plm[] = {cmocka_unit_test(test_plm_defects)};
        return cmocka_run_group_tests(plm, NULL, NULL);
    }
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    tiny_tmp_path(base_path, sizeof base_path, "loadbase");
    if (tiny_model_write(base_path, &cfg)) {
        fprintf(stderr, "cannot write base model: %s\n", tern_last_error());
        return 1;
    }
    cfg.arch = "qwen3", cfg.head_dim = 128;
    tiny_tmp_path(qwen3_path, sizeof qwen3_path, "loadq3");
    if (tiny_model_write(qwen3_path, &cfg)) {
        fprintf(stderr, "cannot write qwen3 model: %s\n", tern_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defects),
        cmocka_unit_test(test_moe_defects),
        cmocka_unit_test(test_mla_defects),
        cmocka_unit_test(test_family_tensor_sets),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_tied_output_loads),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_null_args),
        cmocka_unit_test(test_repack_load_modes),
        cmocka_unit_test(test_q6k_default_repacked),
        cmocka_unit_test(test_xp_load_modes),
        cmocka_unit_test(test_moved_as_is),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(base_path);
    unlink(qwen3_path);
    return rc;
}
