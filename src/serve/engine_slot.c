/*
 * engine_slot.c — llama-server's /slots API on the serving engine (serve.h; files: serve/slot.h):
 * list the slots, and save, restore or erase an idle slot's cached prompt. Actions run on the
 * engine thread between steps; tn_engine_slot_action hands one over and waits.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "core/trace.h"
#include "model/ctx.h"
#include "serve/engine_impl.h"
#include "serve/slot.h"

void tn_eng_slot_refuse(struct tn_slot_task *t, int status, const char *msg) {
    const char *type = status == 404 ? "not_found_error" : status == 501 ? "not_supported_error"
                       : status == 503 ? "unavailable_error" : status >= 500 ? "server_error" : "invalid_request_error";
    tn_http_err_set(&t->err, status, type, NULL, "%s", msg);
}

static json_t *slot_list(tn_engine *e, struct tn_slot_task *t) {
    json_t *a = json_array();
    bool idle = false;
    for (int i = 0; a && i < e->np; i++) {
        const tn_seq *s = &e->seqs[i];
        const int32_t n = s->active ? s->n_toks : s->n_held;
        json_t *toks = json_array();
        for (int32_t k = 0; toks && k < n; k++) json_array_append_new(toks, json_integer(s->toks[k]));
        json_t *o = json_pack("{s:i, s:i, s:b, s:b, s:i, s:o*}", "id", i, "n_ctx", e->n_ctx_seq, "speculative", e->spec.kmax > 0,
                              "is_processing", s->active, "n_tokens", n, "tokens", toks);
        if (o && s->active) json_object_set_new(o, "id_task", json_string(s->r->id));
        if (!o || json_array_append_new(a, o)) {
            json_decref(a);
            a = NULL;
        }
        idle |= !s->active;
    }
    if (a && t->fail_on_no_slot && !idle) {
        json_decref(a);
        tn_eng_slot_refuse(t, 503, "no slot available");
        return NULL;
    }
    if (!a) tn_eng_slot_refuse(t, 500, "out of memory");
    return a;
}

/* Why slot files cannot work with this engine (NULL: they can). */
static const char *slot_unsupported(const tn_engine *e) {
    if (e->ctx->cuda) return "slot save/restore works on the CPU device only (the KV cache is on the GPU)";
    if (e->kv_swa.n_blocks) return "slot save/restore does not support sliding-window layers' own block pool (use --swa-full)";
    if (e->ctx->lora_sites) return "slot save/restore does not support LoRA adapters (--lora): files would not say which";
    if (e->dctx) return "slot save/restore does not support --draft (the draft model's KV would be missing)";
    return NULL;
}

/* The cache blocks of the slot's tokens, prefix first, while they are in the prefix cache. */
static int32_t slot_blocks(const tn_engine *e, const tn_seq *s, int32_t *ids) {
    int32_t nb = 0;
    uint64_t h = 0;
    for (; nb < s->n_held / TN_KVB; nb++) {
        const tern_token *tk = s->toks + (size_t)nb * TN_KVB;
        const int32_t id = tn_kv_find(&e->kv, nb ? ids[nb - 1] : -1, h, tk);
        if (id < 0) break;
        ids[nb] = id;
        h = tn_kv_hash(h, tk);
    }
    return nb;
}

static void slot_save(tn_engine *e, struct tn_slot_task *t, tn_seq *s) {
    const double t0 = tn_srv_now();
    int32_t *ids = tn_malloc((size_t)e->max_blocks_seq * sizeof *ids);
    if (!ids) return tn_eng_slot_refuse(t, 500, "out of memory");
    const int32_t nb = slot_blocks(e, s, ids);
    uint64_t written = 0;
    tern_status st = tn_slot_write(e->ctx, e->model_hash, t->path, s->toks, nb, ids, &written);
    tn_free(ids);
    if (st) {
        char msg[300];
        snprintf(msg, sizeof msg, "cannot save slot %d to '%s': %s", t->id, t->filename, tern_last_error());
        return tn_eng_slot_refuse(t, st == TERN_ERR_NOMEM ? 500 : st == TERN_ERR_UNSUPPORTED ? 501 : 500, msg);
    }
    t->out = json_pack("{s:i, s:s, s:i, s:I, s:{s:f}}", "id_slot", t->id, "filename", t->filename, "n_saved", nb * TN_KVB,
                       "n_written", (json_int_t)written, "timings", "save_ms", (tn_srv_now() - t0) * 1e3);
}

static void slot_restore(tn_engine *e, struct tn_slot_task *t, tn_seq *s) {
    const double t0 = tn_srv_now();
    tn_slot_img img;
    char msg[320];
    tern_status st = tn_slot_read(e->ctx, e->model_hash, t->path, e->n_ctx_seq / TN_KVB, &img);
    if (st) {
        snprintf(msg, sizeof msg, "cannot restore slot %d from '%s': %s", t->id, t->filename, tern_last_error());
        return tn_eng_slot_refuse(t, st == TERN_ERR_NOT_FOUND ? 404 : st == TERN_ERR_FORMAT ? 400 : st == TERN_ERR_UNSUPPORTED ? 501 : 500, msg);
    }
    const int32_t nb = img.n_blocks;
    int32_t *ids = tn_malloc(((size_t)nb + 1) * sizeof *ids);
    bool *fresh = tn_malloc(((size_t)nb + 1) * sizeof *fresh);
    int32_t got = 0;
    uint64_t h = 0;
    st = ids && fresh ? TERN_OK : TERN_ERR_NOMEM;
    msg[0] = 0;
    /* every block into the cache first: one already in the prefix cache is shared, the others
     * are decoded into fresh blocks (never at the cost of a running sequence's reservation) */
    for (; !st && got < nb; got++) {
        const tern_token *tk = img.toks + (size_t)got * TN_KVB;
        const int32_t parent = got ? ids[got - 1] : -1;
        int32_t id = tn_kv_find(&e->kv, parent, h, tk) >= 0 ? tn_kv_lookup(&e->kv, parent, h, tk) : -1;
        fresh[got] = id < 0;
        if (id < 0 && tn_kv_available(&e->kv) > 0) id = tn_kv_alloc(&e->kv, false);
        if (id < 0) {
            snprintf(msg, sizeof msg, "cannot restore slot %d: %d KV blocks are needed and only %d are free (requests hold the rest); retry later",
                     t->id, nb, got);
            st = TERN_ERR_NOMEM;
            break;
        }
        ids[got] = id;
        h = tn_kv_hash(h, tk);
        if (fresh[got] && (st = tn_slot_unpack(e->ctx, &img, got, id))) {
            snprintf(msg, sizeof msg, "cannot restore slot %d from '%s': %s", t->id, t->filename, tern_last_error());
            got++;
            break;
        }
    }
    if (!st) { /* all decoded: publish them, then they are cached blocks like any finished request's */
        h = 0;
        for (int32_t j = 0; j < nb; j++) {
            const tern_token *tk = img.toks + (size_t)j * TN_KVB;
            if (fresh[j]) tn_kv_publish(&e->kv, ids[j], j ? ids[j - 1] : -1, h, tk);
            h = tn_kv_hash(h, tk);
        }
        memcpy(s->toks, img.toks, (size_t)nb * TN_KVB * sizeof *s->toks);
        s->n_held = nb * TN_KVB;
        t->out = json_pack("{s:i, s:s, s:i, s:I, s:{s:f}}", "id_slot", t->id, "filename", t->filename, "n_restored", nb * TN_KVB,
                           "n_read", (json_int_t)img.n, "timings", "restore_ms", (tn_srv_now() - t0) * 1e3);
    } else if (msg[0]) {
        tn_eng_slot_refuse(t, st == TERN_ERR_FORMAT ? 400 : 503, msg);
    } else {
        tn_eng_slot_refuse(t, 500, "out of memory");
    }
    for (int32_t j = 0; j < got; j++) tn_kv_release(&e->kv, ids[j]); /* unpublished ones go back to the free list */
    tn_free(ids);
    tn_free(fresh);
    tn_slot_img_free(&img);
}

static void slot_erase(tn_engine *e, struct tn_slot_task *t, tn_seq *s) {
    int32_t *ids = tn_malloc((size_t)e->max_blocks_seq * sizeof *ids);
    if (!ids) return tn_eng_slot_refuse(t, 500, "out of memory");
    const int32_t nb = slot_blocks(e, s, ids), n = s->n_held;
    for (int32_t j = nb - 1; j >= 0; j--) (void)tn_kv_forget(&e->kv, ids[j]); /* blocks in use by requests stay */
    tn_free(ids);
    s->n_held = 0;
    t->out = json_pack("{s:i, s:i}", "id_slot", t->id, "n_erased", n);
}

void tn_eng_slot_run(tn_engine *e, struct tn_slot_task *t) {
    if (t->action == TN_SLOT_LIST) {
        t->out = slot_list(e, t);
        return;
    }
    char msg[160];
    if (t->id < 0 || t->id >= e->np) {
        snprintf(msg, sizeof msg, "Invalid slot ID %d: this server has slots 0..%d (--parallel %d)", t->id, e->np - 1, e->np);
        return tn_eng_slot_refuse(t, 400, msg);
    }
    tn_seq *s = &e->seqs[t->id];
    if (s->active) {
        snprintf(msg, sizeof msg, "slot %d is processing a request (GET /slots: is_processing); retry when it is idle", t->id);
        return tn_eng_slot_refuse(t, 409, msg);
    }
    const char *why = t->action == TN_SLOT_ERASE ? NULL : slot_unsupported(e);
    if (why) return tn_eng_slot_refuse(t, 501, why);
    if (t->action != TN_SLOT_ERASE && !e->have_hash) { /* reads the whole model file once */
        e->model_hash = tn_pc_model_hash(e->m);
        e->have_hash = true;
    }
    if (t->action == TN_SLOT_SAVE) slot_save(e, t, s);
    else if (t->action == TN_SLOT_RESTORE) slot_restore(e, t, s);
    else slot_erase(e, t, s);
    if (!t->out && !t->err.status) tn_eng_slot_refuse(t, 500, "out of memory");
}

json_t *tn_engine_slot_action(tn_engine *e, int action, int id, const char *path, const char *filename, bool fail_on_no_slot,
                              tn_http_err *err) {
    struct tn_slot_task t = {action, id, fail_on_no_slot, path, filename, NULL, {0}};
    pthread_mutex_lock(&e->slot_mu); /* one action at a time */
    pthread_mutex_lock(&e->mu);
    if (e->stop) {
        tn_eng_slot_refuse(&t, 503, "the server is shutting down");
    } else {
        e->task = &t;
        pthread_cond_broadcast(&e->cv);
        while (e->task == &t) pthread_cond_wait(&e->task_cv, &e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_unlock(&e->slot_mu);
    if (!t.out) *err = t.err;
    return t.out;
}
