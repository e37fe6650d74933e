/*
 * cmd_synth.c — `tern synth`: writes a synthetic GGUF of any registered family (--arch; its
 * tensor set, shapes and metadata keys from the registry, model/arch/) with random weights and
 * realistic shapes (e.g. a 1B-class model), in any type tern can quantize to, so benchmarks need
 * no downloads. The vocabulary is SentencePiece-style: <unk> <s> </s>, 256 byte tokens, then
 * filler pieces. Weights ~ N(0, 0.02) (norms = 1, LongRoPE factors rising from 1), deterministic
 * from --seed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fmt/gguf.h"
#include "model/model.h"
#include "quant/quant.h"
#include "tensor/dtype.h"

typedef struct {
    const char *name, *arch; /* arch NULL: any family without a row of its own */
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx, head_dim; /* head_dim 0: n_embd / n_head */
    int64_t n_expert, n_expert_used, n_ff_exp; /* mixture of experts (0: dense); n_ff_exp 0: n_ff */
    int64_t n_ff_shexp;                        /* qwen2moe: the shared expert's rows (0: n_ff) */
} synth_preset;

/* deepseek2's presets, by name: q_lora_rank (0: q direct), kv_lora_rank, rope dims, value head,
 * leading dense layers; v3: DeepSeek-V3's routing (sigmoid, exp_probs_b, 4 groups of which 2 are
 * used, renormalised, scaled by 2.5) instead of V2-Lite's (softmax, weights as they are) */
typedef struct {
    const char *name, *arch;
    int64_t q_lora, kv_lora, n_rot, v_head, dense_lead;
    bool v3;
} synth_mla;
static const synth_mla mla_presets[] = {
    {"lite", "deepseek2", 0, 512, 64, 128, 1, false},
    {"tiny", "deepseek2", 0, 32, 16, 32, 1, false},
    {"tiny-v3", "deepseek2", 64, 32, 16, 32, 1, true},
    /* plm: no q low-rank, no experts; PLM-1.8B's latent 512, rope 64, values 128 */
    {"1.8b", "plm", 0, 512, 64, 128, 0, false},
    {"tiny", "plm", 0, 32, 16, 32, 0, false},
};

static const synth_preset presets[] = {
    /* deepseek2: DeepSeek-V2-Lite's shapes (27 layers, the first dense (10944 rows), 16 heads of
     * 128 + 64 rotated over a 512 latent, values of 128, 64 experts of 1408 rows, top 6, 2 shared;
     * one kv head as the MLA converter writes; a 32000 vocabulary and 4096 context here); tiny: 3 layers (1 dense), 4 heads of 32 + 16 over
     * a 32 latent, 8 experts of 32, top 2, 2 shared; tiny-v3: also q of rank 64 and V3's routing
     * (mla_presets) */
    /* plm: PLM-1.8B's shapes as its Hugging Face config.json gives them (PLM-Team/PLM-1.8B-Base:
     * hidden 2048, 32 layers, 16 heads (16 kv heads), q/k heads of 128 nope + 64 rope, values of
     * 128, kv_lora_rank 512, intermediate 8192, relu2; from the model card's config as recalled,
     * llama.cpp only confirms 32 layers = 1.8B; a 32000 vocabulary (151936 in the model) and a
     * 4096 context here); tiny: 3 layers, 4 heads of 32 + 16 over a 32 latent, values of 32 */
    {"1.8b", "plm", 2048, 32, 16, 16, 8192, 32000, 4096, 192, 0, 0, 0, 0},
    {"tiny", "plm", 64, 3, 4, 4, 128, 512, 128, 48, 0, 0, 0, 0},
    {"lite", "deepseek2", 2048, 27, 16, 1, 10944, 32000, 4096, 192, 64, 6, 1408, 2816},
    {"tiny", "deepseek2", 64, 3, 4, 1, 128, 512, 128, 48, 8, 2, 32, 64},
    {"tiny-v3", "deepseek2", 64, 3, 4, 1, 128, 512, 128, 48, 8, 2, 32, 64},
    /* qwen3moe: Qwen3-30B-A3B's shapes (48 layers, 32 q heads of 128 over 4 kv heads, 128 experts
     * of 768 rows, top 8; a 32000 vocabulary here); tiny: 8 experts, top 2 */
    {"30b-a3b", "qwen3moe", 2048, 48, 32, 4, 6144, 32000, 4096, 128, 128, 8, 768, 0},
    {"tiny", "qwen3moe", 64, 2, 4, 2, 256, 512, 128, 32, 8, 2, 128, 0},
    /* qwen2moe: Qwen1.5-MoE-A2.7B's shapes (24 layers, 16 heads of 128, 60 experts of 1408 rows,
     * top 4, a shared expert of 5632 rows; a 32000 vocabulary here); tiny: 8 experts of 128, top
     * 2, a shared expert of 192 */
    {"a2.7b", "qwen2moe", 2048, 24, 16, 16, 5632, 32000, 8192, 0, 60, 4, 1408, 5632},
    {"tiny", "qwen2moe", 64, 2, 4, 2, 256, 512, 128, 0, 8, 2, 128, 192},
    /* gpt-oss: gpt-oss-20b's shapes (24 layers, 64 q heads of 64 over 8 kv heads, 32 experts of 2880
     * rows, top 4, window 128; a 32000 vocabulary and a 4096 context here); tiny: 8 experts of 64,
     * top 4, heads of 32 (q rows 128 over n_embd 64) */
    {"20b", "gpt-oss", 2880, 24, 64, 8, 2880, 32000, 4096, 64, 32, 4, 2880, 0},
    {"tiny", "gpt-oss", 64, 2, 4, 2, 128, 512, 128, 32, 8, 4, 64, 0},
    /* olmoe: OLMoE-1B-7B's shapes (16 layers, 16 heads, 64 experts of 1024 rows, top 8; a 32000
     * vocabulary here) */
    {"1b", "olmoe", 2048, 16, 16, 16, 1024, 32000, 4096, 0, 64, 8, 0, 0},
    {"tiny", "olmoe", 64, 2, 4, 4, 128, 512, 128, 0, 8, 2, 0, 0},
    /* qwen3: head_dim 128 as in every Qwen3 (and != n_embd / n_head below 1b, as in Qwen3-0.6B) */
    {"1b", "qwen3", 2048, 16, 16, 8, 8192, 32000, 2048, 128, 0, 0, 0, 0},
    {"small", "qwen3", 512, 8, 8, 4, 1536, 4096, 1024, 128, 0, 0, 0, 0},
    {"tiny", "qwen3", 64, 2, 4, 2, 256, 512, 128, 32, 0, 0, 0, 0},
    /* gemma3: Gemma-3-1B's shapes (1 kv head, head_dim 256, window 512); tiny: 7 layers, layer 5
     * global, window 4 (desc synth_swa) */
    {"1b", "gemma3", 1152, 26, 4, 1, 6912, 32000, 2048, 256, 0, 0, 0, 0},
    /* gemma2: Gemma-2-2B's shapes (8 heads of 256 over 4 kv heads, window 512 here); tiny: the
     * llama row below, layer 0 local (window 4), layer 1 global */
    {"1b", "gemma2", 2304, 26, 8, 4, 9216, 32000, 2048, 256, 0, 0, 0, 0},
    {"tiny", "gemma3", 64, 7, 4, 2, 256, 512, 128, 32, 0, 0, 0, 0},
    /* smollm3: 4 layers, so that layer 3 is a NoPE layer */
    {"tiny", "smollm3", 64, 4, 4, 2, 256, 512, 128, 0, 0, 0, 0, 0},
    {"1b", NULL, 2048, 16, 32, 8, 8192, 32000, 2048, 0, 0, 0, 0, 0},   /* Llama-3.2-1B-like shapes, Llama-2 vocab */
    {"tinyllama", NULL, 2048, 22, 32, 4, 5632, 32000, 2048, 0, 0, 0, 0, 0},
    {"small", NULL, 512, 8, 8, 4, 1536, 4096, 1024, 0, 0, 0, 0, 0},
    {"tiny", NULL, 64, 2, 4, 2, 256, 512, 128, 0, 0, 0, 0, 0},
};

typedef struct {
    uint64_t seed;
    tn_dtype type;
    char **names;
    int64_t *ne0, *ne1;
    tn_dtype *types;
    float *row;
    size_t n;
} synth_ctx;

static uint64_t sm64(uint64_t *x) {
    uint64_t z = (*x += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Fills one tensor: rows of N(0, 0.02) (sum of 4 uniforms, scaled), or ones for norms. */
static tern_status synth_fill(void *user, size_t idx, void *dst, size_t nbytes) {
    synth_ctx *s = user;
    const int64_t ne0 = s->ne0[idx], ne1 = s->ne1[idx];
    const tn_dtype t = s->types[idx];
    const size_t rb = tn_dtype_row_size(t, ne0);
    if (rb * (size_t)ne1 != nbytes) return TERN_ERR_INTERNAL;
    uint64_t st = s->seed * 1000003u + idx;
    const bool norm = strstr(s->names[idx], "norm") != NULL;
    /* LongRoPE factors: > 0, rising over the frequencies (short 1..1.5, long 1..8, the shapes of
     * Phi-3's sets) so the two sets give different rotations */
    const float factor_top = strstr(s->names[idx], "rope_factors_long") ? 8.0f
                           : strstr(s->names[idx], "rope_factors_short") ? 1.5f : 0.0f;
    for (int64_t r = 0; r < ne1; r++) {
        for (int64_t i = 0; i < ne0; i++) {
            if (norm || factor_top > 0) {
                s->row[i] = norm ? 1.0f : 1.0f + (factor_top - 1.0f) * (float)i / (float)(ne0 > 1 ? ne0 - 1 : 1);
                continue;
            }
            uint64_t a = sm64(&st);
            float u = 0.0f;
            for (int k = 0; k < 4; k++) u += (float)((a >> (16 * k)) & 0xFFFF) / 65535.0f;
            s->row[i] = (u - 2.0f) * 0.02f * 1.7320508f; /* var of sum of 4 U(0,1) = 1/3 */
        }
        if (!tn_quantize_row_ref(t, s->row, (uint8_t *)dst + (size_t)r * rb, ne0)) return TERN_ERR_UNSUPPORTED;
    }
    return TERN_OK;
}

int cmd_synth(int argc, char **argv) {
    const char *out = NULL, *preset = "1b", *type_name = "f16", *arch = "llama";
    int64_t seed = 1, experts = -1, top_k = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            char names[256];
            tn_arch_names(names, sizeof names);
            printf("usage: tern synth -o out.gguf [--arch NAME] [--preset 1b|tinyllama|small|tiny|30b-a3b] [--type f32|f16|bf16|q8_0|q4_0|...] [--seed N]\n"
                   "                [--experts N --top-k K]\n"
                   "  --arch NAME   model family (default llama): %s\n"
                   "  --preset      qwen3moe: 30b-a3b (Qwen3-30B-A3B's shapes), tiny; qwen2moe: a2.7b (Qwen1.5-MoE-A2.7B's),\n"
                   "                tiny; gpt-oss: 20b, tiny; olmoe: 1b (OLMoE-1B-7B's), tiny;\n"
                   "                deepseek2: lite (DeepSeek-V2-Lite's), tiny, tiny-v3 (q low-rank, V3's routing);\n"
                   "                plm: 1.8b (PLM-1.8B's), tiny\n"
                   "  --experts N   llama: a Mixtral-style file, N experts of n_ff rows per layer (2..512)\n"
                   "  --top-k K     experts per token (1..N; default 2); also overrides a MoE preset's\n", names);
            return 0;
        } else if (!strcmp(a, "-o") && val) out = argv[++i];
        else if (!strcmp(a, "--preset") && val) preset = argv[++i];
        else if (!strcmp(a, "--arch") && val) arch = argv[++i];
        else if (!strcmp(a, "--type") && val) type_name = argv[++i];
        else if (!strcmp(a, "--experts") && val) {
            if (!tn_cli_parse_i64(argv[++i], 2, 512, &experts)) return tn_cli_usage_error("--experts: a number in 2..512");
        } else if (!strcmp(a, "--top-k") && val) {
            if (!tn_cli_parse_i64(argv[++i], 1, 512, &top_k)) return tn_cli_usage_error("--top-k: a number in 1..512");
        } else if (!strcmp(a, "--seed") && val) {
            if (!tn_cli_parse_i64(argv[++i], 0, INT64_MAX, &seed)) return tn_cli_usage_error("--seed: not a number");
        } else return tn_cli_usage_error("unknown option or missing value '%s'", a);
    }
    if (!out) return tn_cli_usage_error("synth needs -o out.gguf");
    const tn_arch_desc *ad = tn_arch_find(arch, strlen(arch));
    if (!ad) {
        char names[256];
        tn_arch_names(names, sizeof names);
        return tn_cli_usage_error("unknown --arch '%s' (%s)", arch, names);
    }
    const synth_preset *P = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0] && !P; i++)
        if (!strcmp(presets[i].name, preset) && (!presets[i].arch || !strcmp(presets[i].arch, ad->name))) P = &presets[i];
    if (!P) return tn_cli_usage_error("unknown preset '%s' for %s (1b, tinyllama, small, tiny; qwen3moe: 30b-a3b, tiny; qwen2moe: a2.7b, tiny; gpt-oss: 20b, tiny; olmoe: 1b, tiny; deepseek2: lite, tiny, tiny-v3; plm: 1.8b, tiny)",
                                      preset, ad->name);
    const bool may_moe = ad->need[TN_ROLE_FFN_GATE_INP] != TN_NEED_NO, always_moe = ad->need[TN_ROLE_FFN_GATE_INP] == TN_NEED_REQ;
    if (experts > 0 && (!may_moe || always_moe))
        return tn_cli_usage_error("--experts: only for llama (Mixtral-style); %s's presets set their experts", ad->name);
    int64_t n_expert = experts > 0 ? experts : P->n_expert, n_used = top_k > 0 ? top_k : experts > 0 ? 2 : P->n_expert_used;
    if (top_k > 0 && !n_expert) return tn_cli_usage_error("--top-k: %s preset '%s' has no experts (llama: with --experts)", ad->name, P->name);
    if (n_expert && n_used > n_expert)
        return tn_cli_usage_error("--top-k %lld is above the %lld experts", (long long)n_used, (long long)n_expert);
    tn_dtype wt;
    if (!tn_dtype_from_name(type_name, &wt) || !tn_dtype_get(wt)->supported)
        return tn_cli_usage_error("unknown or unsupported --type '%s'", type_name);

    const synth_mla *M = NULL; /* the MLA sizes; the routing keys the family's synth_keys writes */
    for (size_t i = 0; ad->mla && i < TN_ARRAY_LEN(mla_presets); i++)
        if (!strcmp(mla_presets[i].name, P->name) && !strcmp(mla_presets[i].arch, ad->name)) M = &mla_presets[i];
    if (ad->mla && !M) /* the latent sizes come only from a family preset */
        return tn_cli_usage_error("preset '%s' has no latent attention sizes for %s (deepseek2: lite, tiny, tiny-v3; plm: 1.8b, tiny)",
                                  P->name, ad->name);
    tn_gguf_writer *w = NULL;
    tern_status s = tn_gguf_writer_create(&w);
    if (s) return tn_cli_fail(s, "synth");
    /* the hyperparameters the registry's shapes are functions of */
    tn_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.arch = ad->id, hp.family = ad;
    hp.n_embd = (int32_t)P->n_embd, hp.n_layer = (int32_t)P->n_layer, hp.n_head = (int32_t)P->n_head;
    hp.n_head_kv = (int32_t)P->n_head_kv, hp.n_ff = (int32_t)P->n_ff, hp.n_vocab = (int32_t)P->n_vocab;
    hp.head_dim = (int32_t)(P->head_dim ? P->head_dim : P->n_embd / P->n_head), hp.n_rot = hp.head_dim;
    hp.n_ctx_train = (int32_t)P->n_ctx;
    hp.n_expert = (int32_t)n_expert, hp.n_expert_used = (int32_t)n_used;
    hp.n_ff_exp = (int32_t)(P->n_ff_exp ? P->n_ff_exp : P->n_ff);
    hp.n_ff_shexp = (int32_t)(P->n_ff_shexp ? P->n_ff_shexp : P->n_ff);
    if (M) {
        hp.n_lora_q = (int32_t)M->q_lora, hp.n_lora_kv = (int32_t)M->kv_lora, hp.n_rot = (int32_t)M->n_rot;
        hp.v_head = (int32_t)M->v_head, hp.n_layer_dense_lead = (int32_t)M->dense_lead;
        if (M->v3) hp.moe_sigmoid = hp.moe_norm = true, hp.moe_scale = 2.5f, hp.n_expert_groups = 4, hp.n_group_used = 2;
    }
    tn_gguf_set_str(w, "general.architecture", ad->name);
    char name[64], key[128];
    snprintf(name, sizeof name, "tern-synth-%s", P->name);
    tn_gguf_set_str(w, "general.name", name);
#define KEY(sfx) (snprintf(key, sizeof key, "%s." sfx, ad->name), key)
    if (ad->synth_keys) ad->synth_keys(w, &hp); /* the family's own (soft-caps, LongRoPE, partial rotary) */
    tn_gguf_set_u32(w, KEY("context_length"), (uint32_t)P->n_ctx);
    tn_gguf_set_u32(w, KEY("embedding_length"), (uint32_t)P->n_embd);
    tn_gguf_set_u32(w, KEY("block_count"), (uint32_t)P->n_layer);
    tn_gguf_set_u32(w, KEY("feed_forward_length"), (uint32_t)P->n_ff);
    tn_gguf_set_u32(w, KEY("attention.head_count"), (uint32_t)P->n_head);
    tn_gguf_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)P->n_head_kv);
    if (!ad->mla && (ad->head_dim_keys || hp.head_dim * hp.n_head != hp.n_embd)) {
        tn_gguf_set_u32(w, KEY("attention.key_length"), (uint32_t)hp.head_dim);
        tn_gguf_set_u32(w, KEY("attention.value_length"), (uint32_t)hp.head_dim);
    }
    if (ad->rope_dim_key) tn_gguf_set_u32(w, KEY("rope.dimension_count"), (uint32_t)hp.n_rot);
    if (ad->synth_swa) /* Gemma 3's window (512) at 1b; a few positions in the small presets */
        tn_gguf_set_u32(w, KEY("attention.sliding_window"),
                        (uint32_t)(P->n_layer < 16 ? ad->synth_swa : ad->id == TN_ARCH_GPT_OSS ? 128 : 512));
    if (n_expert) {
        tn_gguf_set_u32(w, KEY("expert_count"), (uint32_t)n_expert);
        tn_gguf_set_u32(w, KEY("expert_used_count"), (uint32_t)n_used);
    }
    tn_gguf_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), ad->rms_eps);
    tn_gguf_set_f32(w, KEY("rope.freq_base"), ad->rope_base);
#undef KEY
    tn_gguf_set_u32(w, "general.file_type", wt == TN_F32 ? 0 : wt == TN_F16 ? 1 : wt == TN_Q8_0 ? 7 : wt == TN_Q4_0 ? 2 : 1024);
    tn_gguf_set_u32(w, "general.quantization_version", 2);
    /* vocabulary */
    const int64_t nv = P->n_vocab;
    char **toks = calloc((size_t)nv, sizeof *toks);
    float *scores = calloc((size_t)nv, sizeof *scores);
    int32_t *ttype = calloc((size_t)nv, sizeof *ttype);
    synth_ctx sc = {(uint64_t)seed, wt, NULL, NULL, NULL, NULL, NULL, 0};
    size_t nt = (size_t)(5 + TN_ROLE_N_LAYER * P->n_layer);
    sc.names = calloc(nt, sizeof *sc.names);
    sc.ne0 = calloc(nt, sizeof *sc.ne0);
    sc.ne1 = calloc(nt, sizeof *sc.ne1);
    sc.types = calloc(nt, sizeof *sc.types);
    sc.row = malloc((size_t)TN_MAX(TN_MAX(TN_MAX(P->n_ff, P->n_embd), (int64_t)hp.n_head * hp.head_dim),
                                    TN_MAX(TN_MAX(hp.n_ff_exp, hp.n_ff_shexp), TN_MAX(hp.n_lora_q, hp.n_lora_kv))) * sizeof(float) + 64);
    if (!toks || !scores || !ttype || !sc.names || !sc.ne0 || !sc.ne1 || !sc.types || !sc.row) {
        s = TERN_ERR_NOMEM;
        fprintf(stderr, "tern: error: out of memory\n");
        goto done;
    }
    for (int64_t i = 0; i < nv; i++) {
        char buf[32];
        if (i == 0) snprintf(buf, sizeof buf, "<unk>");
        else if (i == 1) snprintf(buf, sizeof buf, "<s>");
        else if (i == 2) snprintf(buf, sizeof buf, "</s>");
        else if (i < 3 + 256) snprintf(buf, sizeof buf, "<0x%02X>", (unsigned)(i - 3));
        else if (i == 259) snprintf(buf, sizeof buf, "\xe2\x96\x81"); /* the space piece */
        else if (i < 260 + 26) snprintf(buf, sizeof buf, "%c", (char)('a' + (i - 260)));
        else snprintf(buf, sizeof buf, "\xe2\x96\x81t%lld", (long long)i);
        toks[i] = strdup(buf);
        scores[i] = i < 259 ? 0.0f : -(float)i;
        ttype[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    tn_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    tn_gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)nv);
    tn_gguf_set_arr(w, "tokenizer.ggml.scores", 6 /* f32 */, scores, (uint64_t)nv);
    tn_gguf_set_arr(w, "tokenizer.ggml.token_type", 5 /* i32 */, ttype, (uint64_t)nv);
    tn_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    tn_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    tn_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    /* tensors: the family's required roles (registry order: the order of llama.cpp's files) */
    size_t k = 0;
    const tn_role globals[5] = {TN_ROLE_TOKEN_EMBD, TN_ROLE_OUTPUT_NORM, TN_ROLE_OUTPUT, TN_ROLE_ROPE_FACTORS_LONG,
                                TN_ROLE_ROPE_FACTORS_SHORT};
    for (int64_t l = -1; l <= P->n_layer; l++) {
        const int r0 = l < 0 ? 0 : l < P->n_layer ? 0 : 1, r1 = l < 0 ? 1 : l < P->n_layer ? TN_ROLE_N_LAYER : 5;
        for (int j = r0; j < r1; j++) {
            const tn_role r = l >= 0 && l < P->n_layer ? (tn_role)j : globals[j];
            /* per layer the required roles; of the model-wide ones every one the family has (a
             * separate output where it may have one; gemma2 has none) */
            tn_need nd = tn_arch_need_layer(&hp, (int32_t)l, r);
            if (r == TN_ROLE_FFN_EXP_PROBS_B && nd != TN_NEED_NO && M && M->v3) nd = TN_NEED_REQ; /* V3's selection bias */
            if (nd == TN_NEED_NO || (l >= 0 && l < P->n_layer && nd != TN_NEED_REQ)) continue;
            char n[96];
            tn_role_tensor_name(r, (int32_t)l, n, sizeof n);
            const tn_role_info *ri = &tn_roles[r];
            sc.names[k] = strdup(n);
            sc.ne0[k] = tn_dim_value(&hp, ri->ne0);
            const int64_t ne[3] = {sc.ne0[k], tn_dim_value(&hp, ri->ne1), tn_dim_value(&hp, ri->ne2)};
            sc.ne1[k] = ne[1] * ne[2]; /* experts: n_expert matrices one after the other */
            /* the router stays f32, as llama.cpp's converters and llama-quantize keep it */
            sc.types[k] = ri->matrix && r != TN_ROLE_FFN_GATE_INP ? wt : TN_F32;
            if (!sc.names[k]) s = TERN_ERR_NOMEM;
            else s = tn_gguf_add_tensor(w, n, sc.types[k], ri->ne2 != TN_DIM_1 ? 3 : ri->ne1 == TN_DIM_1 ? 1 : 2, ne, NULL);
            if (s) goto fail;
            k++;
        }
    }
    sc.n = k;
    fprintf(stderr, "tern: writing %s (%s, %s, %zu tensors)...\n", out, P->name, tn_dtype_name(wt), k);
    if ((s = tn_gguf_write(w, out, synth_fill, &sc))) goto fail;
    fprintf(stderr, "tern: wrote %s\n", out);
    goto done;
fail:
    tn_cli_fail(s, "synth");
done:
    for (int64_t i = 0; toks && i < nv; i++) free(toks[i]);
    for (size_t i = 0; sc.names && i < nt; i++) free(sc.names[i]);
    free(toks);
    free(scores);
    free(ttype);
    free(sc.names);
    free(sc.ne0);
    free(sc.ne1);
    free(sc.types);
    free(sc.row);
    tn_gguf_writer_free(w);
    return s ? tn_cli_exit_code(s) : 0;
}
