/*
 * imatrix.c — load / save importance matrices (see imatrix.h). Loading divides the sums by the
 * counts once, so lookups hand out ready importance vectors.
 */
#include <stdio.h>
#include <string.h>

#include "fmt/gguf.h"
#include "quant/imatrix.h"

struct tn_imatrix {
    size_t n;
    char **names;
    int64_t *ne0;
    float **vals;
};

void tn_imatrix_free(tn_imatrix *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) tn_free(m->names[i]), tn_free(m->vals[i]);
    tn_free(m->names);
    tn_free(m->ne0);
    tn_free(m->vals);
    tn_free(m);
}

tern_status tn_imatrix_load(const char *path, tn_imatrix **out) {
    *out = NULL;
    tn_gguf *g = NULL;
    tern_status s = tn_gguf_open(path, false, &g);
    if (s) return s;
    tn_imatrix *m = tn_calloc(1, sizeof *m);
    if (!m) goto nomem;
    m->names = tn_calloc(g->n_tensors + 1, sizeof *m->names);
    m->ne0 = tn_calloc(g->n_tensors + 1, sizeof *m->ne0);
    m->vals = tn_calloc(g->n_tensors + 1, sizeof *m->vals);
    if (!m->names || !m->ne0 || !m->vals) goto nomem;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        size_t len = strlen(t->name);
        if (len < 9 || strcmp(t->name + len - 8, ".in_sum2")) continue;
        if (t->type != 0) {
            s = tn_err(TERN_ERR_FORMAT, "imatrix %s: tensor '%s' is not f32", path, t->name);
            goto fail;
        }
        char cname[TN_GGUF_MAX_NAME + 8];
        snprintf(cname, sizeof cname, "%.*s.counts", (int)(len - 8), t->name);
        const tn_gguf_tensor *c = tn_gguf_find_tensor(g, cname);
        float cnt = 1;
        if (c && c->type == 0 && c->nbytes >= 4) memcpy(&cnt, c->data, 4);
        if (!(cnt > 0)) cnt = 1;
        const int64_t ne0 = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        size_t k = m->n;
        m->names[k] = tn_malloc(len - 7);
        m->vals[k] = tn_malloc((size_t)ne0 * sizeof(float));
        if (!m->names[k] || !m->vals[k]) {
            m->n++;
            goto nomem;
        }
        memcpy(m->names[k], t->name, len - 8);
        m->names[k][len - 8] = 0;
        m->ne0[k] = ne0;
        for (int64_t j = 0; j < ne0; j++) {
            float v;
            memcpy(&v, t->data + 4 * j, 4);
            m->vals[k][j] = v / cnt;
        }
        m->n++;
    }
    tn_gguf_free(g);
    *out = m;
    return TERN_OK;
nomem:
    s = tn_err(TERN_ERR_NOMEM, "imatrix %s: out of memory", path);
fail:
    tn_imatrix_free(m);
    tn_gguf_free(g);
    return s;
}

const float *tn_imatrix_find(const tn_imatrix *m, const char *name, int64_t ne0) {
    if (!m) return NULL;
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->names[i], name)) return m->ne0[i] == ne0 ? m->vals[i] : NULL;
    return NULL;
}

tern_status tn_imatrix_save(const char *path, size_t n, const char *const *names, const int64_t *ne0,
                            const float *const *sums, const float *counts, const char *dataset) {
    tn_gguf_writer *w = NULL;
    tern_status s = tn_gguf_writer_create(&w);
    if (s) return s;
    if ((s = tn_gguf_set_str(w, "general.type", "imatrix"))) goto out;
    if (dataset) {
        const char *ds[1] = {dataset};
        if ((s = tn_gguf_set_arr_str(w, "imatrix.datasets", ds, 1))) goto out;
    }
    for (size_t i = 0; i < n; i++) {
        char nm[TN_GGUF_MAX_NAME + 1];
        int64_t ne[2] = {ne0[i], 1};
        if (snprintf(nm, sizeof nm, "%s.in_sum2", names[i]) >= (int)sizeof nm) continue;
        if ((s = tn_gguf_add_tensor(w, nm, 0, 2, ne, sums[i]))) goto out;
        int64_t one[2] = {1, 1};
        snprintf(nm, sizeof nm, "%s.counts", names[i]);
        if ((s = tn_gguf_add_tensor(w, nm, 0, 2, one, &counts[i]))) goto out;
    }
    s = tn_gguf_write(w, path, NULL, NULL);
out:
    tn_gguf_writer_free(w);
    return s;
}
