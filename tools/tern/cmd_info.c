/*
 * cmd_info.c — `tern info [model.gguf]`: with a file, its metadata, hyperparameters, tensor table
 * and size / bits per weight; without, the CPU features found and the kernel chosen per slot.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "core/cpu.h"
#include "cuda/cuda.h"
#include "fmt/gguf.h"
#include "kern/kern.h"
#include "model/model.h"

/* `tern info --arch NAME`: a family's registry entry (model/arch/): its block and its tensors. */
static int print_arch(const char *name) {
    const tn_arch_desc *a = tn_arch_find(name, strlen(name));
    if (!a) {
        char names[256];
        tn_arch_names(names, sizeof names);
        return tn_cli_usage_error("unknown architecture '%s' (%s)", name, names);
    }
    const char *dims[] = {
        [TN_DIM_1] = "1", [TN_DIM_EMBD] = "n_embd", [TN_DIM_Q] = "n_head*head_dim", [TN_DIM_KV] = "n_head_kv*head_dim",
        [TN_DIM_HEAD] = "head_dim", [TN_DIM_FF] = "n_ff", [TN_DIM_VOCAB] = "n_vocab", [TN_DIM_ROT_HALF] = "n_rot/2",
        [TN_DIM_QKV] = "(n_head+2*n_head_kv)*head_dim", [TN_DIM_FF_UP] = "n_ff", [TN_DIM_EXPERT] = "n_expert",
        [TN_DIM_FF_EXP] = "n_ff_exp", [TN_DIM_Q_NORM] = a->qk_norm_full ? "n_head*head_dim" : "head_dim",
        [TN_DIM_K_NORM] = a->qk_norm_full ? "n_head_kv*head_dim" : "head_dim", [TN_DIM_FF_SHEXP] = "n_ff_shexp",
        [TN_DIM_HEADS] = "n_head", [TN_DIM_O] = a->mla ? "n_head*v_head" : "n_head*head_dim",
        [TN_DIM_Q_LORA] = "q_lora_rank", [TN_DIM_KV_LORA] = "kv_lora_rank", [TN_DIM_KV_A] = "kv_lora_rank+n_rot",
        [TN_DIM_NOPE] = "head_dim-n_rot", [TN_DIM_V_HEAD] = "v_head", [TN_DIM_KV_B] = "n_head*(head_dim-n_rot+v_head)"};
    printf("architecture %s: rope %s, ffn %s, defaults rms eps %g, rope base %g\n", a->name,
           a->rope == TN_ROPE_NEOX ? "neox (halves)" : "norm (adjacent pairs)", a->ffn == TN_FFN_GEGLU ? "geglu" : "swiglu",
           a->rms_eps, a->rope_base);
    printf("  %-34s %-8s %-32s %s\n", "tensor", "", "shape (ne0, ne1)", "type");
    for (int r = 0; r < TN_ROLE_COUNT; r++) {
        if (a->need[r] == TN_NEED_NO) continue;
        const tn_role_info *ri = &tn_roles[r];
        char n[96], shape[64];
        snprintf(n, sizeof n, "%s%s", r < TN_ROLE_N_LAYER ? "blk.N." : "", ri->name);
        const char *ne1 = ri->ne1 == TN_DIM_FF_UP && a->gate_up_fused ? "2*n_ff (gate|up)" : dims[ri->ne1];
        if (ri->ne2 != TN_DIM_1) snprintf(shape, sizeof shape, "[%s, %s, %s]", dims[ri->ne0], ne1, dims[ri->ne2]);
        else if (ri->ne1 == TN_DIM_1) snprintf(shape, sizeof shape, "[%s]", dims[ri->ne0]);
        else snprintf(shape, sizeof shape, "[%s, %s]", dims[ri->ne0], ne1);
        printf("  %-34s %-8s %-32s %s\n", n, a->need[r] == TN_NEED_REQ ? "required" : "optional", shape,
               ri->matrix ? "any matrix type" : "f32");
    }
    return 0;
}

static void print_cpu(void) {
    const tn_cpu *c = tn_cpu_get();
    printf("tern %s\n", tern_version_string());
    printf("cpu: %s (%d online)\n", c->brand[0] ? c->brand : "unknown", tn_cpu_count());
    printf("features:");
    struct {
        const char *n;
        bool v;
    } f[] = {{"avx", c->avx},           {"avx2", c->avx2},         {"fma", c->fma},           {"f16c", c->f16c},
             {"bmi2", c->bmi2},         {"avx512f", c->avx512f},   {"avx512bw", c->avx512bw}, {"avx512vl", c->avx512vl},
             {"avx512dq", c->avx512dq}, {"avx512vnni", c->avx512vnni}, {"avx512bf16", c->avx512bf16},
             {"avx512vbmi", c->avx512vbmi}, {"avxvnni", c->avxvnni}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v) printf(" %s", f[i].n);
    printf("\nisa: %s (cap with TERN_ISA=scalar|avx2|avx512)\n\n", tn_isa_name(tn_cpu_isa()));
    const tn_kern_table *kt = tn_kern();
    printf("%-6s %-8s %-10s %-8s %-10s %-8s\n", "type", "vec_dot", "gemm", "to_f32", "from_f32", "act");
    for (uint32_t i = 0; i < TN_DTYPE_GGML_COUNT + TN_DTYPE_VQ_COUNT; i++) { /* ggml's types, then tern's vq */
        const uint32_t t = i < TN_DTYPE_GGML_COUNT ? i : TN_DTYPE_VQ_BASE + (i - TN_DTYPE_GGML_COUNT);
        const tn_dtype_traits *tr = tn_dtype_get(t);
        const tn_kern_slot *s = &kt->slot[t];
        if (!tr || (!s->vec_dot && !s->from_float && !s->to_float)) continue;
#define ISA(fn, isa) ((fn) ? tn_isa_name(isa) : "-")
        printf("%-6s %-8s %-10s %-8s %-10s %-8s\n", tr->name, ISA(s->vec_dot, s->vec_dot_isa), ISA(s->gemm, s->gemm_isa),
               ISA(s->to_float, s->to_float_isa), ISA(s->from_float, s->from_float_isa),
               s->vec_dot ? tn_dtype_name(tr->vec_dot_type) : "-");
#undef ISA
    }
    /* the CUDA backend: devices, memory, kernels per type */
    const char *why = NULL;
    const int nd = tn_cuda_device_count(&why);
    if (nd < 1) {
        printf("\ncuda: %s\n", why ? why : "no device");
        return;
    }
    for (int d = 0; d < nd; d++) {
        tn_cuda_info gi;
        if (tn_cuda_device_info(d, &gi) == TERN_OK)
            printf("\ncuda device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f GiB free), driver %d, runtime %d\n", d,
                   gi.name, gi.cc_major, gi.cc_minor, gi.n_sm, (double)gi.mem_total / 1073741824.0,
                   (double)gi.mem_free / 1073741824.0, gi.driver_version, gi.runtime_version);
    }
    static const tn_dtype shown[] = {TN_F32, TN_F16, TN_BF16, TN_Q8_0, TN_Q4_0, TN_Q2_K, TN_Q4_K, TN_Q6_K, TN_IQ4_XS, TN_IQ4_NL,
                                     TN_IQ2_XXS, TN_MXFP4};
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++)
        printf("  %-7s %s\n", tn_dtype_name(shown[i]), tn_cuda_kernel_name(shown[i]));
    printf("  %-7s %s\n", "tq1..8", tn_cuda_kernel_name((tn_dtype)TN_DTYPE_TERN_BASE));
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    bool all_kv = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            char names[256];
            tn_arch_names(names, sizeof names);
            printf("usage: tern info [model.gguf] [--all]\n       tern info --arch NAME\n"
                   "  --all        print long arrays' values in full\n"
                   "  --arch NAME  a model family's block and tensors (%s)\n", names);
            return 0;
        } else if (!strcmp(argv[i], "--arch")) {
            if (i + 1 >= argc) return tn_cli_usage_error("--arch needs a value");
            return print_arch(argv[i + 1]);
        } else if (!strcmp(argv[i], "--all")) {
            all_kv = true;
        } else if (argv[i][0] == '-') {
            return tn_cli_usage_error("unknown option '%s'", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return tn_cli_usage_error("unexpected argument '%s'", argv[i]);
        }
    }
    (void)all_kv;
    if (!path) {
        print_cpu();
        return 0;
    }
    tn_gguf *g = NULL;
    tern_status s = tn_gguf_open(path, true, &g);
    if (s) return tn_cli_fail(s, "reading the model");
    printf("file: %s\nGGUF v%u, %llu metadata keys, %llu tensors, alignment %u, data at offset %llu\n\n", path, g->version,
           (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, g->alignment,
           (unsigned long long)g->data_offset);
    printf("metadata:\n");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        char val[256];
        tn_gguf_kv_format(&g->kv[i], val, sizeof val);
        printf("  %-45.*s %-7s %s\n", (int)(g->kv[i].key.len > 200 ? 200 : g->kv[i].key.len), g->kv[i].key.data,
               tn_gguf_type_name(g->kv[i].type), val);
    }
    printf("\ntensors:\n  %-4s %-32s %-24s %-7s %12s\n", "#", "name", "shape", "type", "bytes");
    uint64_t bytes = 0, elems = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        char shape[64];
        int n = snprintf(shape, sizeof shape, "[%lld", (long long)t->ne[0]);
        for (uint32_t d = 1; d < t->n_dims; d++) n += snprintf(shape + n, sizeof shape - (size_t)n, ", %lld", (long long)t->ne[d]);
        snprintf(shape + n, sizeof shape - (size_t)n, "]");
        printf("  %-4llu %-32s %-24s %-7s %12zu\n", (unsigned long long)i, t->name, shape, tn_dtype_name(t->type), t->nbytes);
        bytes += t->nbytes;
        elems += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    }
    printf("\ntotal: %llu parameters, %.2f MiB of weights, %.3f bits per weight\n", (unsigned long long)elems,
           (double)bytes / 1048576.0, elems ? 8.0 * (double)bytes / (double)elems : 0.0);
    tn_gguf_free(g);

    /* Hyperparameters as tern would run the file (if it is a complete model). */
    tern_model *m = NULL;
    s = tern_model_load(path, NULL, &m);
    if (s) {
        printf("\nnot runnable by tern: %s\n", tern_last_error());
        return tn_cli_exit_code(s);
    }
    printf("\nmodel: %s | n_vocab %d | n_ctx_train %d | n_embd %d | n_layer %d\n", tern_model_desc(m), tern_model_n_vocab(m),
           tern_model_n_ctx_train(m), tern_model_n_embd(m), tern_model_n_layer(m));
    /* the family's block as the registry (model/arch/) and the file make it */
    const tn_hparams *hp = &m->hp;
    const tn_tensor *w0 = m->layers[0].w;
    printf("block: %s | heads %d / kv %d of %d (q rows %lld) | n_ff %d | rope %s, %d dims, base %g | rms eps %g%s%s%s%s%s | ffn %s\n",
           hp->family->name, hp->n_head, hp->n_head_kv, hp->head_dim, (long long)tn_hp_q_dim(hp), hp->n_ff,
           hp->rope_mode == TN_ROPE_NEOX ? "neox" : "norm", hp->n_rot, hp->rope_freq_base, hp->rms_eps,
           w0[TN_ROLE_ATTN_Q_B].data ? " | qkv bias" : "", w0[TN_ROLE_ATTN_Q_NORM].data ? " | q/k norm" : "",
           w0[TN_ROLE_ATTN_POST_NORM].data ? " | post norms" : "", hp->embd_scale > 0 ? " | embd * sqrt(n_embd)" : "",
           m->output.data == m->tok_embd.data ? " | tied output" : "", hp->ffn == TN_FFN_GEGLU ? "geglu (tanh gelu)" : "swiglu");
    if (hp->n_swa > 0)
        printf("sliding window: %d positions on layers il %% %d < %d (rope base %g), the others global\n", hp->n_swa,
               hp->swa_period, hp->swa_period - 1, hp->rope_base_swa);
    if (hp->nope_step > 0) printf("no RoPE on layers il with (il + 1) %% %d == 0\n", hp->nope_step);
    if (m->rope_long.data || m->rope_short.data)
        printf("LongRoPE: long factors in a context > %d positions, short ones within; rotated dims scaled by %g\n",
               hp->n_ctx_orig, hp->rope_attn_factor);
    if (hp->n_expert > 0) /* parameters a token reads: all but the experts it is not routed to */
        printf("experts: %d, %d used per token (top-k, softmax router, weights %s) | expert n_ff %d | parameters %.4g M, "
               "active per token %.4g M\n",
               hp->n_expert, hp->n_expert_used, hp->family->moe_renorm ? "renormalised to sum 1" : "not renormalised",
               hp->n_ff_exp, (double)m->n_params / 1e6, (double)m->n_params_active / 1e6);
    if (hp->attn_softcap > 0) printf("attention score soft-capping at %g\n", hp->attn_softcap);
    if (hp->logit_softcap > 0) printf("final logit soft-capping at %g\n", hp->logit_softcap);
    tern_model_free(m);
    return 0;
}
