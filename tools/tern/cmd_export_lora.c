/*
 * cmd_export_lora.c — `tern export-lora`: merges LoRA adapters into a base model and writes a new
 * GGUF (llama-export-lora's job). Each adapted tensor is read as f32, gets W + sum s * alpha / r
 * * B A (f64 sums, model/lora.c tn_lora_merge) and is written in --type (default: its own type);
 * every other tensor is copied byte for byte, every metadata key as it is. The adapters are
 * checked against the base exactly as --lora does (tern_lora_load). Written atomically.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fmt/gguf.h"
#include "model/lora.h"
#include "model/model.h"
#include "quant/quant.h"

static void usage(FILE *f) {
    fprintf(f, "usage: tern export-lora -m base.gguf --lora adapter.gguf[:S] [--lora ...] -o merged.gguf [--type T]\n"
               "  -m, --model FILE        base model (GGUF)\n"
               "      --lora FILE[:S]     adapter to merge with scale S (default 1); repeatable; --lora-scaled FILE S\n"
               "  -o, --output FILE       merged model to write (atomically)\n"
               "      --type T            type of the merged tensors (f32, f16, bf16, q8_0, q4_0, q4_K, ...; default:\n"
               "                          each tensor's own type); untouched tensors are copied as they are\n");
}

typedef struct {
    const tn_gguf *g;
    const tn_cli_lora *lora;
    const tn_dtype *types; /* output type of each tensor                       */
    const bool *merged;    /* whether an adapter touches it                       */
    float *w;              /* [the largest merged tensor] f32 scratch            */
} tn_export;

static tern_status tn_export_fill(void *user, size_t index, void *dst, size_t nbytes) {
    const tn_export *e = user;
    const tn_gguf_tensor *t = &e->g->tensors[index];
    if (!e->merged[index]) {
        memcpy(dst, t->data, nbytes);
        return TERN_OK;
    }
    const int64_t k = t->ne[0], m = t->ne[1];
    const size_t rb_in = tn_dtype_row_size((tn_dtype)t->type, k), rb_out = tn_dtype_row_size(e->types[index], k);
    for (int64_t r = 0; r < m; r++)
        if (!tn_dequantize_row((tn_dtype)t->type, t->data + (size_t)r * rb_in, e->w + r * k, k))
            return tn_err(TERN_ERR_UNSUPPORTED, "export-lora: tensor '%s': cannot read type %s", t->name, tn_dtype_name(t->type));
    for (int i = 0; i < e->lora->n; i++) tn_lora_merge(e->lora->a[i], e->lora->scale[i], t->name, e->w, k, m);
    for (int64_t r = 0; r < m; r++)
        if (!tn_quantize_row_ref(e->types[index], e->w + r * k, (uint8_t *)dst + (size_t)r * rb_out, k))
            return tn_err(TERN_ERR_UNSUPPORTED, "export-lora: tensor '%s': cannot write type %s", t->name,
                          tn_dtype_name(e->types[index]));
    return TERN_OK;
}

int cmd_export_lora(int argc, char **argv) {
    const char *model_path = NULL, *out_path = NULL, *type_name = NULL;
    tn_cli_lora lora = {0};
    int dv, rc = TN_EXIT_OK;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            tn_cli_lora_free(&lora);
            return 0;
        } else if ((dv = tn_cli_lora_flag(argc, argv, &i, &lora)) != 0) {
            if (dv < 0) return tn_cli_lora_free(&lora), TN_EXIT_USAGE;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "-o") || !strcmp(a, "--output") ||
                   !strcmp(a, "--type") || !strcmp(a, "--output-type")) {
            if (!val) return tn_cli_lora_free(&lora), tn_cli_usage_error("%s needs a value", a);
            i++;
            if (a[1] == 'm' || !strcmp(a, "--model")) model_path = val;
            else if (a[1] == 'o' || !strcmp(a, "--output")) out_path = val;
            else type_name = val;
        } else {
            usage(stderr);
            return tn_cli_lora_free(&lora), tn_cli_usage_error("unknown option '%s'", a);
        }
    }
    if (!model_path || !out_path || !lora.n) {
        usage(stderr);
        return tn_cli_lora_free(&lora), tn_cli_usage_error("export-lora needs -m, --lora and -o");
    }
    tn_dtype otype = TN_F32;
    if (type_name && (!tn_dtype_from_name(type_name, &otype) || !tn_dtype_get(otype)->supported || tn_dtype_is_internal(otype)))
        return tn_cli_lora_free(&lora), tn_cli_usage_error("--type: '%s' is not a type tern writes", type_name);
    const char *inputs[TN_CLI_MAX_LORA + 1] = {model_path};
    for (int i = 0; i < lora.n; i++) inputs[i + 1] = lora.path[i];
    if ((rc = tn_cli_check_output("-o", out_path, inputs, lora.n + 1)) != TN_EXIT_OK) return tn_cli_lora_free(&lora), rc;

    tern_model *m = NULL;
    tn_gguf_writer *w = NULL;
    tn_export e = {0};
    tn_dtype *types = NULL;
    bool *merged = NULL;
    tern_model_params mp;
    tern_model_params_init(&mp);
    mp.repack = false; /* the file's bytes are what is copied */
    tern_status s = tern_model_load(model_path, &mp, &m);
    if (s) {
        rc = tn_cli_fail(s, "loading the model");
        goto done;
    }
    for (int i = 0; i < lora.n; i++)
        if ((s = tern_lora_load(m, lora.path[i], &lora.a[i]))) {
            rc = tn_cli_fail(s, "loading the LoRA adapter");
            goto done;
        }
    const tn_gguf *g = m->gguf;
    types = calloc((size_t)g->n_tensors + 1, sizeof *types);
    merged = calloc((size_t)g->n_tensors + 1, sizeof *merged);
    if (!types || !merged || (s = tn_gguf_writer_create(&w))) {
        rc = tn_cli_fail(s ? s : TERN_ERR_NOMEM, "export-lora");
        goto done;
    }
    for (uint64_t i = 0; i < g->n_kv && !s; i++) s = tn_gguf_set_kv(w, &g->kv[i]);
    int64_t biggest = 0, n_merged = 0;
    for (uint64_t i = 0; i < g->n_tensors && !s; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        for (int j = 0; j < lora.n && !merged[i]; j++) merged[i] = tn_lora_adapts(lora.a[j], t->name);
        types[i] = merged[i] && type_name ? otype : (tn_dtype)t->type;
        if (merged[i]) {
            if (!tn_dtype_row_size(types[i], t->ne[0])) {
                rc = tn_cli_usage_error("--type %s: tensor '%s' has rows of %lld, not a multiple of the type's block", type_name,
                                        t->name, (long long)t->ne[0]);
                goto done;
            }
            biggest = TN_MAX(biggest, t->ne[0] * t->ne[1]), n_merged++;
        }
        s = tn_gguf_add_tensor(w, t->name, (uint32_t)types[i], t->n_dims, t->ne, NULL);
    }
    if (s || !(e.w = malloc(sizeof(float) * (size_t)(biggest ? biggest : 1)))) {
        rc = tn_cli_fail(s ? s : TERN_ERR_NOMEM, "export-lora");
        goto done;
    }
    e.g = g, e.lora = &lora, e.types = types, e.merged = merged;
    if ((s = tn_gguf_write(w, out_path, tn_export_fill, &e))) {
        rc = tn_cli_fail(s, "writing the merged model");
        goto done;
    }
    fprintf(stderr, "tern export-lora: %lld tensors merged, %lld copied -> %s\n", (long long)n_merged,
            (long long)g->n_tensors - n_merged, out_path);
done:
    free(e.w);
    free(types);
    free(merged);
    tn_gguf_writer_free(w);
    tn_cli_lora_free(&lora);
    tern_model_free(m);
    return rc;
}
