/*
 * ckpt.c — GGUF export of trained weights and atomic checkpoints. See ckpt.h and train.h.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant/quant.h"
#include "train/bpe.h"
#include "train/ckpt.h"

uint64_t tn_hash64(const void *p, size_t n, uint64_t h) {
    const uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * UINT64_C(0x100000001B3) + UINT64_C(0x9E3779B97F4A7C15);
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ b[i]) * UINT64_C(0x100000001B3);
    return h;
}

/* ---- export ------------------------------------------------------------------------------- */
bool tn_export_type_ok(tn_dtype t) {
    if (t == TN_F32) return true;
    const tn_dtype_traits *tr = tn_dtype_get(t);
    if (!tr || !tr->name || !tr->supported || tn_dtype_is_internal(t) || tr->blck_size > 256) return false;
    float x[256];
    for (int i = 0; i < 256; i++) x[i] = (float)((i * 37) % 17 - 8) * 0.01f;
    uint8_t y[1024];
    return tr->type_size * (size_t)(256 / tr->blck_size) <= sizeof y && tn_quantize_row_ref(t, x, y, 256);
}

/* llama.cpp's general.file_type (LLAMA_FTYPE_*) of a file whose matrices are mostly t; -1: none. */
static int ftype_of(tn_dtype t) {
    switch (t) {
    case TN_F32: return 0;
    case TN_F16: return 1;
    case TN_Q4_0: return 2;
    case TN_Q4_1: return 3;
    case TN_Q8_0: return 7;
    case TN_Q5_0: return 8;
    case TN_Q5_1: return 9;
    case TN_Q2_K: return 10;
    case TN_Q3_K: return 12;
    case TN_Q4_K: return 15;
    case TN_Q5_K: return 17;
    case TN_Q6_K: return 18;
    case TN_BF16: return 32;
    default: return -1;
    }
}

tern_status tn_tmodel_export(const tn_tmodel *m, const tn_vocab_data *voc, const char *name, tn_dtype mtype,
                             const char *path) {
    return tn_tmodel_export_tok(m, voc, NULL, name, mtype, path);
}

tern_status tn_tmodel_export_tok(const tn_tmodel *m, const tn_vocab_data *voc, const tn_gguf *tok_src, const char *name,
                                 tn_dtype mtype, const char *path) {
    if (!tn_export_type_ok(mtype))
        return tn_err(TERN_ERR_UNSUPPORTED, "train: export type %s has no reference quantizer", tn_dtype_name(mtype));
    if (m->base) return tn_err(TERN_ERR_STATE, "train: a LoRA model holds no full weights; write its adapter (tn_lora_export)");
    if (!voc == !tok_src) return tn_err(TERN_ERR_INVALID_ARG, "train: export needs a vocabulary or a tokenizer source");
    if (voc && voc->n != m->cfg.n_vocab)
        return tn_err(TERN_ERR_INVALID_ARG, "train: vocabulary has %d tokens, model %d", voc->n, m->cfg.n_vocab);
    tn_gguf_writer *w;
    tern_status s = tn_gguf_writer_create(&w);
    if (s) return s;
    void **qbufs = tn_calloc((size_t)m->n_tensors, sizeof *qbufs);
    if (!qbufs) { tn_gguf_writer_free(w); return tn_err(TERN_ERR_NOMEM, "train: export"); }
    const tn_train_cfg *c = &m->cfg;
    const tn_arch_desc *a = m->hp.family;
    const uint32_t hd = (uint32_t)m->hp.head_dim;
    char key[128];
#define KEY(sfx) (snprintf(key, sizeof key, "%s." sfx, a->name), key)
#define T(x) do { if ((s = (x))) goto done; } while (0)
    T(tn_gguf_set_str(w, "general.architecture", a->name));
    T(tn_gguf_set_str(w, "general.name", name ? name : "tern-trained"));
    if (ftype_of(mtype) >= 0) T(tn_gguf_set_u32(w, "general.file_type", (uint32_t)ftype_of(mtype)));
    T(tn_gguf_set_u32(w, KEY("vocab_size"), (uint32_t)c->n_vocab));
    T(tn_gguf_set_u32(w, KEY("context_length"), (uint32_t)c->n_ctx));
    T(tn_gguf_set_u32(w, KEY("embedding_length"), (uint32_t)c->n_embd));
    T(tn_gguf_set_u32(w, KEY("block_count"), (uint32_t)c->n_layer));
    T(tn_gguf_set_u32(w, KEY("feed_forward_length"), (uint32_t)c->n_ff));
    T(tn_gguf_set_u32(w, KEY("attention.head_count"), (uint32_t)c->n_head));
    T(tn_gguf_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_head_kv));
    /* the keys the family's converter writes; key_length whenever head_dim is not n_embd / n_head */
    if (a->head_dim_keys || (int64_t)hd * c->n_head != c->n_embd) {
        T(tn_gguf_set_u32(w, KEY("attention.key_length"), hd));
        T(tn_gguf_set_u32(w, KEY("attention.value_length"), hd));
    }
    if (a->rope_dim_key) T(tn_gguf_set_u32(w, KEY("rope.dimension_count"), hd));
    T(tn_gguf_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->rms_eps));
    T(tn_gguf_set_f32(w, KEY("rope.freq_base"), c->rope_base));
#undef KEY
    if (voc) T(tn_vocab_data_write(voc, w));
    else /* the source file's tokenizer as it is (its model, merges, special ids, chat template) */
        for (uint64_t i = 0; i < tok_src->n_kv; i++)
            if (tok_src->kv[i].key.len > 10 && !memcmp(tok_src->kv[i].key.data, "tokenizer.", 10)) T(tn_gguf_set_kv(w, &tok_src->kv[i]));
    for (int i = 0; i < m->n_tensors; i++) {
        const tn_tparam *t = &m->t[i];
        const float *p = m->params + t->off;
        int64_t ne[2] = {t->ne[0], t->ne[1]};
        /* matrices in mtype (rows that are not whole blocks stay f32), vectors f32 */
        const size_t rb = t->n_dims == 2 && mtype != TN_F32 ? tn_dtype_row_size(mtype, t->ne[0]) : 0;
        if (rb) {
            qbufs[i] = tn_malloc(rb * (size_t)t->ne[1]);
            if (!qbufs[i]) { s = tn_err(TERN_ERR_NOMEM, "train: export"); goto done; }
            for (int64_t r = 0; r < t->ne[1]; r++)
                if (!tn_quantize_row_ref(mtype, p + r * t->ne[0], (uint8_t *)qbufs[i] + rb * (size_t)r, t->ne[0])) {
                    s = tn_err(TERN_ERR_UNSUPPORTED, "train: export: cannot convert %s to %s", t->name, tn_dtype_name(mtype));
                    goto done;
                }
            T(tn_gguf_add_tensor(w, t->name, mtype, 2, ne, qbufs[i]));
        } else {
            T(tn_gguf_add_tensor(w, t->name, TN_F32, (uint32_t)t->n_dims, ne, p));
        }
    }
    T(tn_gguf_write(w, path, NULL, NULL));
#undef T
done:
    for (int i = 0; i < m->n_tensors; i++) tn_free(qbufs[i]);
    tn_free(qbufs);
    tn_gguf_writer_free(w);
    return s;
}

/* ---- LoRA adapter (llama.cpp's GGUF LoRA format) ----------------------------------------------- */
tern_status tn_lora_export(const tn_tmodel *m, const char *name, const char *path) {
    if (!m->base || !m->n_lora) return tn_err(TERN_ERR_STATE, "train: not a LoRA model: no adapter to write");
    tn_gguf_writer *w;
    tern_status s = tn_gguf_writer_create(&w);
    if (s) return s;
#define T(x) do { if ((s = (x))) goto done; } while (0)
    T(tn_gguf_set_str(w, "general.architecture", m->hp.family->name));
    T(tn_gguf_set_str(w, "general.type", "adapter"));
    T(tn_gguf_set_str(w, "general.name", name ? name : "tern-lora"));
    T(tn_gguf_set_str(w, "adapter.type", "lora"));
    T(tn_gguf_set_f32(w, "adapter.lora.alpha", m->lora_alpha));
    T(tn_gguf_set_u32(w, "tern.lora.rank", (uint32_t)m->lora_rank));
    for (int i = 0; i < m->n_tensors; i++) {
        const tn_tparam *t = &m->t[i];
        if (!t->base || !t->lora) continue;
        for (int j = 0; j < 2; j++) { /* lora_a ne [k, rank], lora_b ne [rank, m] */
            const tn_tparam *a = &m->t[t->lora + j];
            int64_t ne[2] = {a->ne[0], a->ne[1]};
            T(tn_gguf_add_tensor(w, a->name, TN_F32, 2, ne, m->params + a->off));
        }
    }
    T(tn_gguf_write(w, path, NULL, NULL));
#undef T
done:
    tn_gguf_writer_free(w);
    return s;
}

/* ---- state ---------------------------------------------------------------------------------- */
void tn_train_state_free(tn_train_state *s) {
    tn_free(s->loss); tn_free(s->lr); tn_free(s->val_step); tn_free(s->val_loss);
    s->loss = s->lr = s->val_loss = NULL;
    s->val_step = NULL;
    s->loss_cap = s->val_cap = s->n_val = 0;
}

tern_status tn_train_state_push(tn_train_state *s, float loss, float lr) {
    if (s->step >= s->loss_cap) {
        int64_t nc = s->loss_cap ? s->loss_cap * 2 : 1024;
        while (nc <= s->step) nc *= 2;
        float *a = tn_realloc(s->loss, (size_t)nc * sizeof *a);
        if (!a) return tn_err(TERN_ERR_NOMEM, "train: loss history");
        s->loss = a;
        float *b = tn_realloc(s->lr, (size_t)nc * sizeof *b);
        if (!b) return tn_err(TERN_ERR_NOMEM, "train: loss history");
        s->lr = b;
        s->loss_cap = nc;
    }
    s->loss[s->step] = loss;
    s->lr[s->step] = lr;
    return TERN_OK;
}

tern_status tn_train_state_push_val(tn_train_state *s, int32_t step, float loss) {
    if (s->n_val >= s->val_cap) {
        int64_t nc = s->val_cap ? s->val_cap * 2 : 256;
        int32_t *a = tn_realloc(s->val_step, (size_t)nc * sizeof *a);
        if (!a) return tn_err(TERN_ERR_NOMEM, "train: loss history");
        s->val_step = a;
        float *b = tn_realloc(s->val_loss, (size_t)nc * sizeof *b);
        if (!b) return tn_err(TERN_ERR_NOMEM, "train: loss history");
        s->val_loss = b;
        s->val_cap = nc;
    }
    s->val_step[s->n_val] = step;
    s->val_loss[s->n_val++] = loss;
    return TERN_OK;
}

/* ---- checkpoints ------------------------------------------------------------------------- */
static tern_status file_hash(const char *path, uint64_t *size, uint64_t *hash) {
    tn_map mp;
    tern_status s = tn_map_open(path, true, &mp);
    if (s) return s;
    *size = mp.size;
    *hash = tn_hash64(mp.data, mp.size, UINT64_C(0xCBF29CE484222325));
    tn_map_close(&mp);
    return TERN_OK;
}

static void ckpt_name(char *buf, size_t cap, int64_t step) { snprintf(buf, cap, "ckpt-%08lld.gguf", (long long)step); }

/* After a new manifest is durable: keep the new checkpoint and the previous one (keep = 2), and
 * remove temp files of writers that no longer run (a kill -9 during a save leaves one). */
static void prune(const char *dir, const char *keep_name, const char *keep_prev_path) {
    DIR *d = opendir(dir);
    if (!d) return;
    const char *prev_name = keep_prev_path[0] ? strrchr(keep_prev_path, '/') + 1 : "";
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        const char *tmp = strstr(n, ".tmp.");
        bool drop = false;
        if (tmp) { /* "<file>.tmp.<pid>.<n>" from tn_wfile */
            long pid = strtol(tmp + 5, NULL, 10);
            drop = pid > 0 && pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
        } else if (!strncmp(n, "ckpt-", 5) && strstr(n, ".gguf")) {
            drop = strcmp(n, keep_name) && strcmp(n, prev_name);
        }
        if (drop) {
            snprintf(path, sizeof path, "%s/%s", dir, n);
            unlink(path);
        }
    }
    closedir(d);
}

/* The LoRA layout of m as text ("" for full training): a checkpoint resumes only the same one. */
static void lora_desc(const tn_tmodel *m, char *buf, size_t cap) {
    buf[0] = 0;
    if (!m->base) return;
    uint32_t targets = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->t[i].base && m->t[i].lora) targets |= 1u << m->t[i].role;
    snprintf(buf, cap, "rank %d, alpha %g, targets 0x%x", m->lora_rank, (double)m->lora_alpha, targets);
}

tern_status tn_ckpt_save(const tn_tmodel *m, const tn_train_state *st, const char *dir) {
    if (mkdir(dir, 0777) && errno != EEXIST) return tn_err(TERN_ERR_IO, "train: cannot create checkpoint dir %s: %s", dir, strerror(errno));
    char name[64], path[4096], mpath[4096], prev[4096] = "";
    ckpt_name(name, sizeof name, st->step);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(mpath, sizeof mpath, "%s/latest", dir);
    /* the checkpoint the current manifest names, deleted once the new one is committed */
    {
        FILE *f = fopen(mpath, "r");
        if (f) {
            char line[512], fn[256];
            while (fgets(line, sizeof line, f))
                if (sscanf(line, "file %255s", fn) == 1 && strcmp(fn, name)) snprintf(prev, sizeof prev, "%s/%s", dir, fn);
            fclose(f);
        }
    }
    tn_gguf_writer *w;
    tern_status s = tn_gguf_writer_create(&w);
    if (s) return s;
    const tn_train_cfg *c = &m->cfg;
#define T(x) do { if ((s = (x))) goto done; } while (0)
    T(tn_gguf_set_str(w, "general.architecture", "tern-train-checkpoint"));
    T(tn_gguf_set_u32(w, "tern.train.version", 1));
    T(tn_gguf_set_u64(w, "tern.train.step", (uint64_t)st->step));
    T(tn_gguf_set_u64(w, "tern.train.epoch", (uint64_t)st->epoch));
    T(tn_gguf_set_u64(w, "tern.train.pos", (uint64_t)st->pos));
    T(tn_gguf_set_u64(w, "tern.train.seed", st->seed));
    T(tn_gguf_set_u64(w, "tern.train.vocab_hash", st->vocab_hash));
    T(tn_gguf_set_u64(w, "tern.train.n_params", (uint64_t)m->n_params));
    if (st->zo_clip > 0) T(tn_gguf_set_f32(w, "tern.train.zo_clip", st->zo_clip));
    int32_t cf[7] = {c->n_vocab, c->n_ctx, c->n_embd, c->n_layer, c->n_head, c->n_head_kv, c->n_ff};
    T(tn_gguf_set_arr(w, "tern.train.config", TN_GGUF_I32, cf, 7));
    float cff[2] = {c->rms_eps, c->rope_base};
    T(tn_gguf_set_arr(w, "tern.train.config_f", TN_GGUF_F32, cff, 2));
    /* the family and head_dim (absent in checkpoints before them: llama, n_embd / n_head) */
    T(tn_gguf_set_str(w, "tern.train.arch", m->hp.family->name));
    T(tn_gguf_set_u32(w, "tern.train.head_dim", (uint32_t)m->hp.head_dim));
    char ld[96];
    lora_desc(m, ld, sizeof ld);
    if (ld[0]) T(tn_gguf_set_str(w, "tern.train.lora", ld));
    if (st->step) {
        T(tn_gguf_set_arr(w, "tern.train.loss", TN_GGUF_F32, st->loss, (uint64_t)st->step));
        T(tn_gguf_set_arr(w, "tern.train.lr", TN_GGUF_F32, st->lr, (uint64_t)st->step));
    }
    if (st->n_val) {
        T(tn_gguf_set_arr(w, "tern.train.val_step", TN_GGUF_I32, st->val_step, (uint64_t)st->n_val));
        T(tn_gguf_set_arr(w, "tern.train.val_loss", TN_GGUF_F32, st->val_loss, (uint64_t)st->n_val));
    }
    int64_t ne[1] = {(int64_t)m->n_params};
    T(tn_gguf_add_tensor(w, "train.params", TN_F32, 1, ne, m->params));
    if (m->m) { /* a forward-only (zeroth-order) model has no moments */
        T(tn_gguf_add_tensor(w, "train.adam_m", TN_F32, 1, ne, m->m));
        T(tn_gguf_add_tensor(w, "train.adam_v", TN_F32, 1, ne, m->v));
    }
    T(tn_gguf_write(w, path, NULL, NULL));
    uint64_t size, hash;
    T(file_hash(path, &size, &hash));
    {
        char man[1024];
        int n = snprintf(man, sizeof man, "tern-checkpoint 1\nfile %s\nstep %lld\nsize %llu\nhash %016llx\n", name,
                         (long long)st->step, (unsigned long long)size, (unsigned long long)hash);
        tn_wfile mf;
        T(tn_wfile_open(mpath, &mf));
        tn_wfile_write(&mf, man, (size_t)n);
        T(tn_wfile_commit(&mf));
    }
    prune(dir, name, prev);
#undef T
done:
    tn_gguf_writer_free(w);
    return s;
}

static tern_status get_u64(const tn_gguf *g, const char *k, uint64_t *out) {
    int64_t v;
    tern_status s = tn_gguf_get_i64(g, k, true, &v);
    if (!s) *out = (uint64_t)v;
    else {
        /* u64 values above INT64_MAX (seeds) */
        const tn_gguf_kv *kv = tn_gguf_find(g, k);
        if (kv && kv->type == TN_GGUF_U64) { tn_err_clear(); *out = kv->v.u64; return TERN_OK; }
    }
    return s;
}

tern_status tn_ckpt_load(tn_tmodel *m, tn_train_state *st, const char *dir, bool *found) {
    *found = false;
    char mpath[4096], path[4096];
    snprintf(mpath, sizeof mpath, "%s/latest", dir);
    FILE *f = fopen(mpath, "r");
    if (!f) {
        if (errno == ENOENT) return TERN_OK;
        return tn_err(TERN_ERR_IO, "train: cannot read %s: %s", mpath, strerror(errno));
    }
    char line[512], fn[256] = "";
    unsigned long long size = 0, hash = 0;
    int got = 0;
    bool magic = fgets(line, sizeof line, f) && !strncmp(line, "tern-checkpoint 1", 17);
    while (magic && fgets(line, sizeof line, f)) {
        if (sscanf(line, "file %255s", fn) == 1) got |= 1;
        else if (sscanf(line, "size %llu", &size) == 1) got |= 2;
        else if (sscanf(line, "hash %llx", &hash) == 1) got |= 4;
    }
    fclose(f);
    if (!magic || got != 7 || strchr(fn, '/'))
        return tn_err(TERN_ERR_FORMAT, "train: checkpoint manifest %s is corrupt (remove the checkpoint dir to start over)", mpath);
    snprintf(path, sizeof path, "%s/%s", dir, fn);
    uint64_t fs, fh;
    tern_status s = file_hash(path, &fs, &fh);
    if (s) return tn_err(TERN_ERR_FORMAT, "train: checkpoint %s named by %s is missing or unreadable", path, mpath);
    if (fs != size || fh != hash)
        return tn_err(TERN_ERR_FORMAT, "train: checkpoint %s is corrupt (size %llu, hash %016llx; the manifest says size %llu, "
                      "hash %016llx)", path, (unsigned long long)fs, (unsigned long long)fh, size, hash);
    tn_gguf *g;
    if ((s = tn_gguf_open(path, true, &g))) return s;
    uint64_t step, epoch, pos, seed, vh, np;
#define T(x) do { if ((s = (x))) goto done; } while (0)
    T(get_u64(g, "tern.train.step", &step));
    T(get_u64(g, "tern.train.epoch", &epoch));
    T(get_u64(g, "tern.train.pos", &pos));
    T(get_u64(g, "tern.train.seed", &seed));
    T(get_u64(g, "tern.train.vocab_hash", &vh));
    T(get_u64(g, "tern.train.n_params", &np));
    {
        tn_gguf_str an = {5, "llama"};
        uint32_t hd = (uint32_t)(m->cfg.n_embd / m->cfg.n_head);
        T(tn_gguf_get_str(g, "tern.train.arch", false, &an));
        T(tn_gguf_get_u32(g, "tern.train.head_dim", false, &hd));
        if (!tn_gguf_str_eq(an, m->hp.family->name) || hd != (uint32_t)m->hp.head_dim) {
            s = tn_err(TERN_ERR_INVALID_ARG, "train: checkpoint %s was made for architecture %.*s with head_dim %u; this run "
                       "is %s with head_dim %d (use the same --arch / --head-dim or another --ckpt-dir)", path,
                       (int)TN_MIN(an.len, 64), an.data, hd, m->hp.family->name, m->hp.head_dim);
            goto done;
        }
    }
    {
        char ld[96];
        lora_desc(m, ld, sizeof ld);
        tn_gguf_str have = {0, ""};
        T(tn_gguf_get_str(g, "tern.train.lora", false, &have));
        if (!tn_gguf_str_eq(have, ld)) {
            s = tn_err(TERN_ERR_INVALID_ARG, "train: checkpoint %s holds %s%.*s; this run %s%s (use the same LoRA flags or "
                       "another --ckpt-dir)", path, have.len ? "a LoRA adapter of " : "full training", (int)TN_MIN(have.len, 96),
                       have.data, ld[0] ? "trains a LoRA adapter of " : "is full training", ld);
            goto done;
        }
    }
    const tn_gguf_kv *cf, *cff;
    T(tn_gguf_get_arr(g, "tern.train.config", true, TN_GGUF_I32, &cf));
    T(tn_gguf_get_arr(g, "tern.train.config_f", true, TN_GGUF_F32, &cff));
    {
        const tn_train_cfg *c = &m->cfg;
        int32_t want[7] = {c->n_vocab, c->n_ctx, c->n_embd, c->n_layer, c->n_head, c->n_head_kv, c->n_ff};
        float wf[2] = {c->rms_eps, c->rope_base};
        if (cf->arr_n != 7 || memcmp(cf->arr_data, want, sizeof want) || cff->arr_n != 2 || memcmp(cff->arr_data, wf, sizeof wf) ||
            np != m->n_params) {
            int32_t got7[7] = {0};
            if (cf->arr_n == 7) memcpy(got7, cf->arr_data, sizeof got7);
            s = tn_err(TERN_ERR_INVALID_ARG, "train: checkpoint %s was made with a different model config (vocab %d ctx %d "
                       "embd %d layers %d heads %d/%d ff %d); use the same flags or another --ckpt-dir", path, got7[0],
                       got7[1], got7[2], got7[3], got7[4], got7[5], got7[6]);
            goto done;
        }
    }
    if (vh != st->vocab_hash) { s = tn_err(TERN_ERR_INVALID_ARG, "train: checkpoint %s was made with a different vocabulary", path); goto done; }
    float zo_clip = 0.0f; /* absent: not a --zo one-byte run (or one from before it was saved) */
    T(tn_gguf_get_f32(g, "tern.train.zo_clip", false, &zo_clip));
    if (!(zo_clip >= 0.0f) || !isfinite(zo_clip)) {
        s = tn_err(TERN_ERR_FORMAT, "train: checkpoint %s: tern.train.zo_clip %g is not a finite value >= 0", path, (double)zo_clip);
        goto done;
    }
    const char *names[3] = {"train.params", "train.adam_m", "train.adam_v"};
    float *dst[3] = {m->params, m->m, m->v};
    for (int i = 0; i < 3 && dst[i]; i++) { /* forward-only: the parameters alone */
        const tn_gguf_tensor *t = tn_gguf_find_tensor(g, names[i]);
        if (!t || t->type != TN_F32 || t->n_dims != 1 || (uint64_t)t->ne[0] != np) {
            s = tn_err(TERN_ERR_FORMAT, "train: checkpoint %s: tensor %s missing or of the wrong shape", path, names[i]);
            goto done;
        }
        memcpy(dst[i], t->data, np * sizeof(float));
    }
    const tn_gguf_kv *lo = NULL, *lr = NULL, *vs = NULL, *vl = NULL;
    T(tn_gguf_get_arr(g, "tern.train.loss", false, TN_GGUF_F32, &lo));
    T(tn_gguf_get_arr(g, "tern.train.lr", false, TN_GGUF_F32, &lr));
    T(tn_gguf_get_arr(g, "tern.train.val_step", false, TN_GGUF_I32, &vs));
    T(tn_gguf_get_arr(g, "tern.train.val_loss", false, TN_GGUF_F32, &vl));
    if ((step && (!lo || !lr || lo->arr_n != step || lr->arr_n != step)) || (!vs) != (!vl) || (vs && vs->arr_n != vl->arr_n)) {
        s = tn_err(TERN_ERR_FORMAT, "train: checkpoint %s: loss history inconsistent with step %llu", path, (unsigned long long)step);
        goto done;
    }
    tn_train_state_free(st);
    st->step = 0;
    for (uint64_t i = 0; i < step; i++) {
        float a, b;
        memcpy(&a, lo->arr_data + 4 * i, 4);
        memcpy(&b, lr->arr_data + 4 * i, 4);
        T(tn_train_state_push(st, a, b));
        st->step++;
    }
    for (uint64_t i = 0; vs && i < vs->arr_n; i++) {
        int32_t a;
        float b;
        memcpy(&a, vs->arr_data + 4 * i, 4);
        memcpy(&b, vl->arr_data + 4 * i, 4);
        T(tn_train_state_push_val(st, a, b));
    }
    st->step = (int64_t)step;
    st->epoch = (int64_t)epoch;
    st->pos = (int64_t)pos;
    st->seed = seed;
    st->zo_clip = zo_clip;
    *found = true;
#undef T
done:
    tn_gguf_free(g);
    return s;
}
