/*
 * imatrix.c — load / save / accumulate importance matrices (see imatrix.h). Loading divides the
 * sums by the counts once (as llama-quantize's load_imatrix does, in float), so lookups hand out
 * ready importance vectors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt/gguf.h"
#include "quant/imatrix.h"

struct tn_imatrix {
    size_t n;
    char **names;
    int64_t *ne0;
    float **vals;
    float **counts;  /* [n_mat] rounded row counts per entry */
    int64_t *n_mat;
    uint32_t chunk_count, chunk_size;
    char *dataset;
};

void tn_imatrix_free(tn_imatrix *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) tn_free(m->names[i]), tn_free(m->vals[i]), tn_free(m->counts[i]);
    tn_free(m->counts);
    tn_free(m->n_mat);
    tn_free(m->names);
    tn_free(m->ne0);
    tn_free(m->vals);
    tn_free(m->dataset);
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
    m->counts = tn_calloc(g->n_tensors + 1, sizeof *m->counts);
    m->n_mat = tn_calloc(g->n_tensors + 1, sizeof *m->n_mat);
    if (!m->names || !m->ne0 || !m->vals || !m->counts || !m->n_mat) goto nomem;
    tn_gguf_get_u32(g, "imatrix.chunk_count", false, &m->chunk_count);
    tn_gguf_get_u32(g, "imatrix.chunk_size", false, &m->chunk_size);
    const tn_gguf_kv *ds = NULL;
    if (tn_gguf_get_arr(g, "imatrix.datasets", false, TN_GGUF_STRING, &ds) == TERN_OK && ds && ds->arr_n > 0) {
        const tn_gguf_str *d0 = &ds->arr_strs[0];
        if (!(m->dataset = tn_malloc(d0->len + 1))) goto nomem;
        memcpy(m->dataset, d0->data, d0->len);
        m->dataset[d0->len] = 0;
    }
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
        if (!c || c->type != 0 || c->nbytes < 4) {
            s = tn_err(TERN_ERR_FORMAT, "imatrix %s: '%s' has no f32 counts tensor '%s'", path, t->name, cname);
            goto fail;
        }
        const int64_t ne0 = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        /* one count per matrix (experts: ne[1] matrices of ne[0] columns) */
        const int64_t nmat = (int64_t)(c->nbytes / 4), row = nmat > 0 && ne0 % nmat == 0 ? ne0 / nmat : ne0;
        size_t k = m->n;
        m->names[k] = tn_malloc(len - 7);
        m->vals[k] = tn_malloc((size_t)ne0 * sizeof(float));
        m->n_mat[k] = row == ne0 ? 1 : ne0 / row;
        m->counts[k] = tn_malloc((size_t)m->n_mat[k] * sizeof(float));
        if (!m->names[k] || !m->vals[k] || !m->counts[k]) {
            m->n++;
            goto nomem;
        }
        memcpy(m->names[k], t->name, len - 8);
        m->names[k][len - 8] = 0;
        m->ne0[k] = ne0;
        for (int64_t j = 0; j < ne0; j++) {
            float v, cnt;
            const int64_t mi = row == ne0 ? 0 : j / row;
            memcpy(&v, t->data + 4 * j, 4);
            memcpy(&cnt, c->data + 4 * mi, 4);
            /* llama-quantize: counts are lround()ed, and a matrix without data gets importance 1 */
            const float count = (float)lroundf(cnt);
            m->vals[k][j] = count > 0 ? v / count : 1.0f;
        }
        for (int64_t mi = 0; mi < m->n_mat[k]; mi++) {
            float cnt;
            memcpy(&cnt, c->data + 4 * mi, 4);
            m->counts[k][mi] = TN_MAX((float)lroundf(cnt), 0.0f);
        }
        m->n++;
    }
    if (m->n == 0) {
        s = tn_err(TERN_ERR_FORMAT, "imatrix %s: no '<weight>.in_sum2' tensors (not an importance matrix)", path);
        goto fail;
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

const float *tn_imatrix_counts(const tn_imatrix *m, const char *name, int64_t *n_mat) {
    if (!m) return NULL;
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->names[i], name)) {
            if (n_mat) *n_mat = m->n_mat[i];
            return m->counts[i];
        }
    return NULL;
}

size_t tn_imatrix_count(const tn_imatrix *m) { return m ? m->n : 0; }

const char *tn_imatrix_name(const tn_imatrix *m, size_t i, int64_t *ne0) {
    if (!m || i >= m->n) return NULL;
    if (ne0) *ne0 = m->ne0[i];
    return m->names[i];
}

void tn_imatrix_meta(const tn_imatrix *m, uint32_t *chunk_count, uint32_t *chunk_size, const char **dataset) {
    if (chunk_count) *chunk_count = m->chunk_count;
    if (chunk_size) *chunk_size = m->chunk_size;
    if (dataset) *dataset = m->dataset;
}

tern_status tn_imatrix_save(const char *path, size_t n, const char *const *names, const int64_t *ne0,
                            const int64_t *n_mat, const float *const *sums, const float *const *counts, const char *dataset,
                            uint32_t chunk_count, uint32_t chunk_size) {
    tn_gguf_writer *w = NULL;
    size_t *ord = tn_malloc((n + 1) * sizeof *ord);
    if (!ord) return tn_err(TERN_ERR_NOMEM, "imatrix %s: out of memory", path);
    /* llama-imatrix sorts the names (std::sort of std::string: byte order) */
    for (size_t i = 0; i < n; i++) ord[i] = i;
    for (size_t i = 1; i < n; i++) /* insertion sort: stable, re-entrant, n is small */
        for (size_t j = i; j > 0 && strcmp(names[ord[j - 1]], names[ord[j]]) > 0; j--) {
            size_t t = ord[j];
            ord[j] = ord[j - 1];
            ord[j - 1] = t;
        }
    tern_status s = tn_gguf_writer_create(&w);
    if (s) goto out;
    if ((s = tn_gguf_set_str(w, "general.type", "imatrix"))) goto out;
    const char *ds[1] = {dataset ? dataset : ""};
    if ((s = tn_gguf_set_arr_str(w, "imatrix.datasets", ds, dataset ? 1 : 0))) goto out;
    if ((s = tn_gguf_set_u32(w, "imatrix.chunk_count", chunk_count))) goto out;
    if ((s = tn_gguf_set_u32(w, "imatrix.chunk_size", chunk_size))) goto out;
    for (size_t k = 0; k < n; k++) {
        const size_t i = ord[k];
        char nm[TN_GGUF_MAX_NAME + 1];
        /* experts (n_mat > 1): in_sum2 [ne0][n_mat] and counts [1][n_mat], as llama-imatrix */
        const int64_t nm_i = n_mat ? n_mat[i] : 1;
        const uint32_t nd = nm_i > 1 ? 2 : 1;
        int64_t ne[2] = {ne0[i], nm_i}, cne[2] = {1, nm_i};
        if (snprintf(nm, sizeof nm, "%s.in_sum2", names[i]) >= (int)sizeof nm) {
            s = tn_err(TERN_ERR_INVALID_ARG, "imatrix %s: weight name '%s' is too long for GGUF", path, names[i]);
            goto out;
        }
        if ((s = tn_gguf_add_tensor(w, nm, 0, nd, ne, sums[i]))) goto out;
        snprintf(nm, sizeof nm, "%s.counts", names[i]);
        if ((s = tn_gguf_add_tensor(w, nm, 0, nd, cne, counts[i]))) goto out;
    }
    s = tn_gguf_write(w, path, NULL, NULL);
out:
    tn_gguf_writer_free(w);
    tn_free(ord);
    return s;
}

/* ---- accumulation --------------------------------------------------------------------------- */

typedef struct {
    char name[TN_GGUF_MAX_NAME + 1];
    int64_t ne0, n_mat; /* n_mat matrices (experts) of ne0 columns                    */
    int64_t *count;     /* [n_mat] rows summed per matrix                              */
    double *sum;        /* [n_mat][ne0]                                                */
} acc_entry;

struct tn_imatrix_acc {
    acc_entry *e;
    size_t n, cap;
    double *scratch; /* squares of one add() call, reused */
    int64_t scratch_n;
};

tern_status tn_imatrix_acc_create(tn_imatrix_acc **out) {
    *out = tn_calloc(1, sizeof **out);
    return *out ? TERN_OK : tn_err(TERN_ERR_NOMEM, "imatrix: out of memory");
}

void tn_imatrix_acc_free(tn_imatrix_acc *a) {
    if (!a) return;
    for (size_t i = 0; i < a->n; i++) tn_free(a->e[i].sum), tn_free(a->e[i].count);
    tn_free(a->e);
    tn_free(a->scratch);
    tn_free(a);
}

tern_status tn_imatrix_acc_entry(tn_imatrix_acc *a, const char *name, int64_t ne0, size_t *idx) {
    return tn_imatrix_acc_entry_mat(a, name, ne0, 1, idx);
}

tern_status tn_imatrix_acc_entry_mat(tn_imatrix_acc *a, const char *name, int64_t ne0, int64_t n_mat, size_t *idx) {
    for (size_t i = 0; i < a->n; i++)
        if (!strcmp(a->e[i].name, name)) {
            if (a->e[i].ne0 != ne0 || a->e[i].n_mat != n_mat)
                return tn_err(TERN_ERR_INVALID_ARG, "imatrix: '%s' has %lld columns, now %lld", name,
                              (long long)a->e[i].ne0, (long long)ne0);
            *idx = i;
            return TERN_OK;
        }
    if (strlen(name) + 8 > TN_GGUF_MAX_NAME || ne0 <= 0 || n_mat <= 0)
        return tn_err(TERN_ERR_INVALID_ARG, "imatrix: bad entry '%s' (%lld columns)", name, (long long)ne0);
    if (a->n == a->cap) {
        size_t nc = a->cap ? 2 * a->cap : 64;
        acc_entry *ne = tn_realloc(a->e, nc * sizeof *ne);
        if (!ne) return tn_err(TERN_ERR_NOMEM, "imatrix: out of memory");
        a->e = ne;
        a->cap = nc;
    }
    acc_entry *e = &a->e[a->n];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ne0 = ne0, e->n_mat = n_mat;
    e->sum = tn_calloc((size_t)(ne0 * n_mat), sizeof *e->sum);
    e->count = tn_calloc((size_t)n_mat, sizeof *e->count);
    if (!e->sum || !e->count) {
        tn_free(e->sum), tn_free(e->count);
        return tn_err(TERN_ERR_NOMEM, "imatrix: out of memory");
    }
    *idx = a->n++;
    return TERN_OK;
}

tern_status tn_imatrix_acc_add(tn_imatrix_acc *a, const size_t *idx, size_t n_idx, const float *x, int64_t n, int64_t ne0) {
    return tn_imatrix_acc_add_rows(a, idx, n_idx, 0, x, NULL, n, ne0);
}

tern_status tn_imatrix_acc_add_rows(tn_imatrix_acc *a, const size_t *idx, size_t n_idx, int64_t mat, const float *x,
                                    const int32_t *rows, int64_t n, int64_t ne0) {
    for (size_t k = 0; k < n_idx; k++)
        if (idx[k] >= a->n || a->e[idx[k]].ne0 != ne0 || mat < 0 || mat >= a->e[idx[k]].n_mat)
            return tn_err(TERN_ERR_INVALID_ARG, "imatrix: bad entry index");
    if (a->scratch_n < ne0) {
        double *s = tn_realloc(a->scratch, (size_t)ne0 * sizeof *s);
        if (!s) return tn_err(TERN_ERR_NOMEM, "imatrix: out of memory");
        a->scratch = s;
        a->scratch_n = ne0;
    }
    double *sq = a->scratch;
    memset(sq, 0, (size_t)ne0 * sizeof *sq);
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + (rows ? rows[r] : r) * ne0;
        for (int64_t j = 0; j < ne0; j++) sq[j] += (double)xr[j] * xr[j];
    }
    for (int64_t j = 0; j < ne0; j++)
        if (!isfinite(sq[j]))
            return tn_err(TERN_ERR_FORMAT, "imatrix: non-finite activation in column %lld of '%s'", (long long)j,
                          n_idx ? a->e[idx[0]].name : "?");
    for (size_t k = 0; k < n_idx; k++) {
        acc_entry *e = &a->e[idx[k]];
        for (int64_t j = 0; j < ne0; j++) e->sum[mat * ne0 + j] += sq[j];
        e->count[mat] += n;
    }
    return TERN_OK;
}

const double *tn_imatrix_acc_get(const tn_imatrix_acc *a, size_t i, int64_t *ne0, int64_t *count) {
    if (i >= a->n) return NULL;
    if (ne0) *ne0 = a->e[i].ne0;
    if (count) *count = a->e[i].count[0];
    return a->e[i].sum;
}

tern_status tn_imatrix_acc_save(const tn_imatrix_acc *a, const char *path, const char *dataset, uint32_t chunk_count,
                                uint32_t chunk_size) {
    const size_t n = a->n;
    const char **names = tn_calloc(n + 1, sizeof *names);
    int64_t *ne0 = tn_calloc(n + 1, sizeof *ne0);
    float **sums = tn_calloc(n + 1, sizeof *sums);
    float **counts = tn_calloc(n + 1, sizeof *counts);
    int64_t *n_mat = tn_calloc(n + 1, sizeof *n_mat);
    tern_status s = TERN_OK;
    if (!names || !ne0 || !sums || !counts || !n_mat) {
        s = tn_err(TERN_ERR_NOMEM, "imatrix: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        names[i] = a->e[i].name;
        ne0[i] = a->e[i].ne0, n_mat[i] = a->e[i].n_mat;
        sums[i] = tn_malloc((size_t)(ne0[i] * n_mat[i]) * sizeof(float));
        counts[i] = tn_malloc((size_t)n_mat[i] * sizeof(float));
        if (!sums[i] || !counts[i]) {
            s = tn_err(TERN_ERR_NOMEM, "imatrix: out of memory");
            goto out;
        }
        for (int64_t j = 0; j < ne0[i] * n_mat[i]; j++) sums[i][j] = (float)a->e[i].sum[j];
        for (int64_t j = 0; j < n_mat[i]; j++) counts[i][j] = (float)a->e[i].count[j];
    }
    s = tn_imatrix_save(path, n, names, ne0, n_mat, (const float *const *)sums, (const float *const *)counts, dataset,
                        chunk_count, chunk_size);
out:
    if (sums)
        for (size_t i = 0; i < n; i++) tn_free(sums[i]);
    if (counts)
        for (size_t i = 0; i < n; i++) tn_free(counts[i]);
    tn_free(n_mat);
    tn_free(names);
    tn_free(ne0);
    tn_free(sums);
    tn_free(counts);
    return s;
}
