/*
 * gguf_write.c — GGUF v3 writer: key/values and a tensor list kept in memory, serialized in one
 * pass to an atomic output file (core/file.h: temp + fsync + rename) or to a memory buffer.
 *
 * What it does: validates everything it is given against the reader's limits (keys, string and
 * array sizes, tensor names, ranks, shapes, types, alignment) so it never produces a file the
 * reader would refuse. What it does not: check tensor bytes (they are borrowed or produced by a
 * fill callback) or know which keys a model needs.
 *
 * Invariant: every setter either fully applies or leaves the writer unchanged (on NOMEM or a
 * bad argument). Layout = header, kvs, tensor infos, zero padding to the alignment, then each
 * tensor's bytes padded to the alignment, offsets being the running sum of padded sizes.
 */
#include <inttypes.h>
#include <string.h>

#include "fmt/gguf.h"
#include "fmt/gguf_impl.h"
#include "tensor/dtype.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tern's GGUF writer stores host-order values; big-endian hosts are not supported"
#endif

typedef struct wstr {
    uint64_t len;
    char *data; /* may contain NUL bytes (copied from parsed files) */
} wstr;

typedef struct wkv {
    char *key;
    size_t key_len;
    uint32_t type;
    uint8_t scalar[8];  /* fixed-size value, little-endian                 */
    wstr str;           /* STRING                                           */
    uint32_t arr_type;  /* ARRAY                                            */
    uint64_t arr_n;
    uint8_t *arr_data;  /* fixed-size elements, arr_n * size                */
    wstr *arr_strs;     /* string elements                                  */
} wkv;

typedef struct wtensor {
    char name[TN_GGUF_MAX_NAME + 1];
    uint32_t n_dims;
    int64_t ne[TN_GGUF_MAX_DIMS];
    uint32_t type;
    size_t nbytes;
    const void *data; /* borrowed; NULL = produced by the fill callback */
} wtensor;

struct tn_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
};

tern_status tn_gguf_writer_create(tn_gguf_writer **out) {
    *out = tn_calloc(1, sizeof **out);
    return *out ? TERN_OK : tn_err(TERN_ERR_NOMEM, "gguf: out of memory creating a writer");
}

static void wkv_free_value(wkv *k) {
    tn_free(k->str.data);
    tn_free(k->arr_data);
    if (k->arr_strs)
        for (uint64_t i = 0; i < k->arr_n; i++) tn_free(k->arr_strs[i].data);
    tn_free(k->arr_strs);
    k->str.data = NULL;
    k->arr_data = NULL;
    k->arr_strs = NULL;
}

void tn_gguf_writer_free(tn_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        wkv_free_value(&w->kv[i]);
        tn_free(w->kv[i].key);
    }
    tn_free(w->kv);
    tn_free(w->t);
    tn_free(w);
}

/* ---- key/values --------------------------------------------------------------------------- */

static tern_status check_key(const tn_gguf_writer *w, const char *key) {
    if (!w || !key) return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: NULL writer or key");
    size_t n = strlen(key);
    if (!tn_gguf__key_ok(key, n))
        return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: key '%.80s' must be 1..%d bytes of printable ASCII without spaces", key,
                      TN_GGUF__MAX_KEY);
    return TERN_OK;
}

static tern_status dup_str(wstr *d, const char *s, uint64_t n) {
    if (n > TN_GGUF__MAX_STRING)
        return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: string of %" PRIu64 " bytes exceeds the limit of %" PRIu64, n,
                      TN_GGUF__MAX_STRING);
    d->data = tn_malloc(n ? (size_t)n : 1);
    if (!d->data) return tn_err(TERN_ERR_NOMEM, "gguf writer: out of memory copying a string of %" PRIu64 " bytes", n);
    if (n) memcpy(d->data, s, (size_t)n);
    d->len = n;
    return TERN_OK;
}

/* Stores v (whose value parts the writer now owns) under key: replaces in place or appends.
 * On failure v's value is freed and the writer is unchanged. */
static tern_status put(tn_gguf_writer *w, const char *key, wkv *v) {
    tern_status st = check_key(w, key);
    if (st) goto fail;
    size_t n = strlen(key);
    for (size_t i = 0; i < w->n_kv; i++) {
        if (w->kv[i].key_len == n && !memcmp(w->kv[i].key, key, n)) {
            wkv_free_value(&w->kv[i]);
            v->key = w->kv[i].key;
            v->key_len = n;
            w->kv[i] = *v;
            return TERN_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *nk = tn_realloc(w->kv, cap * sizeof *nk);
        if (!nk) {
            st = tn_err(TERN_ERR_NOMEM, "gguf writer: out of memory adding key '%.80s'", key);
            goto fail;
        }
        w->kv = nk;
        w->cap_kv = cap;
    }
    v->key = tn_strndup(key, n);
    if (!v->key) {
        st = tn_err(TERN_ERR_NOMEM, "gguf writer: out of memory adding key '%.80s'", key);
        goto fail;
    }
    v->key_len = n;
    w->kv[w->n_kv++] = *v;
    return TERN_OK;
fail:
    wkv_free_value(v);
    return st;
}

static tern_status set_scalar(tn_gguf_writer *w, const char *key, uint32_t type, const void *p) {
    wkv v = {.type = type};
    memcpy(v.scalar, p, tn_gguf__type_size(type));
    return put(w, key, &v);
}

tern_status tn_gguf_set_u32(tn_gguf_writer *w, const char *key, uint32_t v) { return set_scalar(w, key, TN_GGUF_U32, &v); }
tern_status tn_gguf_set_i32(tn_gguf_writer *w, const char *key, int32_t v) { return set_scalar(w, key, TN_GGUF_I32, &v); }
tern_status tn_gguf_set_u64(tn_gguf_writer *w, const char *key, uint64_t v) { return set_scalar(w, key, TN_GGUF_U64, &v); }
tern_status tn_gguf_set_f32(tn_gguf_writer *w, const char *key, float v) { return set_scalar(w, key, TN_GGUF_F32, &v); }
tern_status tn_gguf_set_bool(tn_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, key, TN_GGUF_BOOL, &b);
}

static tern_status set_string(tn_gguf_writer *w, const char *key, const char *s, uint64_t n) {
    wkv v = {.type = TN_GGUF_STRING};
    tern_status st = dup_str(&v.str, s, n);
    return st ? st : put(w, key, &v);
}

tern_status tn_gguf_set_str(tn_gguf_writer *w, const char *key, const char *v) {
    if (!v) return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: NULL string for key '%.80s'", key ? key : "(null)");
    return set_string(w, key, v, strlen(v));
}

static tern_status check_arr(const char *key, uint32_t elem_type, uint64_t n, bool strings) {
    if (strings ? elem_type != TN_GGUF_STRING : tn_gguf__type_size(elem_type) == 0)
        return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: key '%.80s': arrays of %s are not supported here", key ? key : "(null)",
                      tn_gguf_type_name(elem_type));
    if (n > TN_GGUF__MAX_ARRAY)
        return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: key '%.80s': array of %" PRIu64 " elements exceeds the limit of %" PRIu64,
                      key ? key : "(null)", n, TN_GGUF__MAX_ARRAY);
    return TERN_OK;
}

tern_status tn_gguf_set_arr(tn_gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n) {
    tern_status st = check_arr(key, elem_type, n, false);
    if (st) return st;
    size_t bytes = (size_t)n * tn_gguf__type_size(elem_type); /* n <= 2^30, size <= 8 */
    if (bytes && !data) return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: key '%.80s': NULL array data", key ? key : "(null)");
    if (elem_type == TN_GGUF_BOOL)
        for (size_t i = 0; i < bytes; i++)
            if (((const uint8_t *)data)[i] > 1)
                return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: key '%.80s': bool element %zu is %u, not 0 or 1", key ? key : "(null)", i,
                              ((const uint8_t *)data)[i]);
    wkv v = {.type = TN_GGUF_ARRAY, .arr_type = elem_type, .arr_n = n};
    v.arr_data = tn_malloc(bytes ? bytes : 1);
    if (!v.arr_data) return tn_err(TERN_ERR_NOMEM, "gguf writer: out of memory copying an array of %zu bytes", bytes);
    if (bytes) memcpy(v.arr_data, data, bytes);
    return put(w, key, &v);
}

/* Copies n strings (given as C strings or as tn_gguf_str) into a new array value. */
static tern_status set_strs(tn_gguf_writer *w, const char *key, const char *const *cs, const tn_gguf_str *gs, uint64_t n) {
    tern_status st = check_arr(key, TN_GGUF_STRING, n, true);
    if (st) return st;
    if (n && !cs && !gs) return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: key '%.80s': NULL string array", key ? key : "(null)");
    wkv v = {.type = TN_GGUF_ARRAY, .arr_type = TN_GGUF_STRING, .arr_n = 0};
    v.arr_strs = tn_calloc(n ? (size_t)n : 1, sizeof *v.arr_strs);
    if (!v.arr_strs) return tn_err(TERN_ERR_NOMEM, "gguf writer: out of memory for %" PRIu64 " strings", n);
    for (uint64_t i = 0; i < n; i++) {
        if (cs && !cs[i]) st = tn_err(TERN_ERR_INVALID_ARG, "gguf writer: key '%.80s': string %" PRIu64 " is NULL", key ? key : "(null)", i);
        else st = cs ? dup_str(&v.arr_strs[i], cs[i], strlen(cs[i])) : dup_str(&v.arr_strs[i], gs[i].data, gs[i].len);
        if (st) {
            wkv_free_value(&v);
            return st;
        }
        v.arr_n = i + 1; /* so a failure frees exactly what was copied */
    }
    return put(w, key, &v);
}

tern_status tn_gguf_set_arr_str(tn_gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    return set_strs(w, key, strs, NULL, n);
}

tern_status tn_gguf_set_kv(tn_gguf_writer *w, const tn_gguf_kv *kv) {
    if (!w || !kv || (!kv->key.data && kv->key.len)) return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: NULL writer or kv");
    if (kv->key.len == 0 || kv->key.len > TN_GGUF__MAX_KEY || memchr(kv->key.data, 0, kv->key.len))
        return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: invalid key of %" PRIu64 " bytes", kv->key.len);
    char *key = tn_strndup(kv->key.data, (size_t)kv->key.len);
    if (!key) return tn_err(TERN_ERR_NOMEM, "gguf writer: out of memory copying a key");
    tern_status st;
    uint8_t raw[8] = {0};
    switch (kv->type) {
    case TN_GGUF_STRING: st = set_string(w, key, kv->v.str.data, kv->v.str.len); break;
    case TN_GGUF_ARRAY:
        if (kv->arr_type == TN_GGUF_STRING) st = set_strs(w, key, NULL, kv->arr_strs, kv->arr_n);
        else st = tn_gguf_set_arr(w, key, kv->arr_type, kv->arr_data, kv->arr_n);
        break;
    case TN_GGUF_U8: case TN_GGUF_U16: case TN_GGUF_U32: case TN_GGUF_U64: case TN_GGUF_BOOL:
    case TN_GGUF_I8: case TN_GGUF_I16: case TN_GGUF_I32: case TN_GGUF_I64:
        /* Narrowing the widened value back (two's complement, little-endian) restores the bytes. */
        memcpy(raw, &kv->v.u64, 8);
        if (kv->type == TN_GGUF_BOOL && kv->v.u64 > 1) {
            st = tn_err(TERN_ERR_INVALID_ARG, "gguf writer: key '%.80s': bool value %" PRIu64, key, kv->v.u64);
            break;
        }
        st = set_scalar(w, key, kv->type, raw);
        break;
    case TN_GGUF_F32: {
        float f = (float)kv->v.f64;
        st = set_scalar(w, key, kv->type, &f);
        break;
    }
    case TN_GGUF_F64: st = set_scalar(w, key, kv->type, &kv->v.f64); break;
    default: st = tn_err(TERN_ERR_INVALID_ARG, "gguf writer: key '%.80s': invalid value type %" PRIu32, key, kv->type);
    }
    tn_free(key);
    return st;
}

tern_status tn_gguf_remove(tn_gguf_writer *w, const char *key) {
    if (!w || !key) return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: NULL writer or key");
    size_t n = strlen(key);
    for (size_t i = 0; i < w->n_kv; i++) {
        if (w->kv[i].key_len == n && !memcmp(w->kv[i].key, key, n)) {
            wkv_free_value(&w->kv[i]);
            tn_free(w->kv[i].key);
            memmove(&w->kv[i], &w->kv[i + 1], (w->n_kv - i - 1) * sizeof *w->kv);
            w->n_kv--;
            return TERN_OK;
        }
    }
    return TERN_OK; /* absent: nothing to do */
}

/* ---- tensors ------------------------------------------------------------------------------ */

tern_status tn_gguf_add_tensor(tn_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne, const void *data) {
    if (!w || !name || !ne) return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: NULL writer, name or shape");
    size_t len = strlen(name);
    if (len == 0 || len > TN_GGUF_MAX_NAME)
        return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: tensor name '%.80s' has %zu bytes, must be 1..%d", name, len, TN_GGUF_MAX_NAME);
    if (n_dims < 1 || n_dims > TN_GGUF_MAX_DIMS)
        return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: tensor '%s': n_dims %" PRIu32 " is not in 1..%d", name, n_dims, TN_GGUF_MAX_DIMS);
    const tn_dtype_traits *tr = tn_dtype_get(type);
    if (!tr || tn_dtype_is_internal(type)) return tn_err(TERN_ERR_UNSUPPORTED, "gguf writer: tensor '%s': unsupported tensor type %s (%" PRIu32 ")", name, tn_dtype_name(type), type);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 0 || ne[d] >= ((int64_t)1 << 62) || !tn_mul_ok(nel, (uint64_t)ne[d], &nel) || nel >= ((uint64_t)1 << 62))
            return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: tensor '%s': dimension %" PRIu32 " = %" PRId64 " is negative or too large",
                          name, d, ne[d]);
    }
    uint64_t rows = nel ? nel / (uint64_t)ne[0] : 0; /* empty tensors have 0 bytes */
    if (ne[0] % tr->blck_size)
        return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: tensor '%s': ne[0] = %" PRId64 " is not a multiple of the %s block size %" PRId64,
                      name, ne[0], tr->name, tr->blck_size);
    uint64_t row = (uint64_t)(ne[0] / tr->blck_size), nbytes;
    if (!tn_mul_ok(row, tr->type_size, &row) || !tn_add_ok(row, tn_dtype_row_hdr(type), &row) || !tn_mul_ok(row, rows, &nbytes) ||
        (rows && !tn_add_ok(nbytes, tn_dtype_tensor_tail(type), &nbytes)) || nbytes > SIZE_MAX / 2)
        return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: tensor '%s': byte size overflows", name);
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: duplicate tensor name '%s'", name);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 16;
        wtensor *nt = tn_realloc(w->t, cap * sizeof *nt);
        if (!nt) return tn_err(TERN_ERR_NOMEM, "gguf writer: out of memory adding tensor '%s'", name);
        w->t = nt;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t++];
    memset(t, 0, sizeof *t);
    memcpy(t->name, name, len + 1);
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < TN_GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->type = type;
    t->nbytes = (size_t)nbytes;
    t->data = data;
    return TERN_OK;
}

/* ---- serialization ------------------------------------------------------------------------ */

typedef struct sink {
    tn_wfile *wf;  /* file output, or */
    uint8_t *buf;  /* memory output of exactly the computed size */
    size_t pos;
} sink;

static void sk_put(sink *s, const void *p, size_t n) {
    if (!n) return;
    if (s->wf) tn_wfile_write(s->wf, p, n);
    else memcpy(s->buf + s->pos, p, n);
    s->pos += n;
}
static void sk_u32(sink *s, uint32_t v) { sk_put(s, &v, 4); }
static void sk_u64(sink *s, uint64_t v) { sk_put(s, &v, 8); }
static void sk_str(sink *s, const char *p, uint64_t n) {
    sk_u64(s, n);
    sk_put(s, p, (size_t)n);
}
static void sk_pad(sink *s, size_t n) {
    if (s->wf) tn_wfile_pad(s->wf, n);
    else memset(s->buf + s->pos, 0, n);
    s->pos += n;
}

typedef struct layout {
    uint32_t alignment;
    uint64_t meta;       /* bytes of header + kvs + tensor infos  */
    uint64_t data_off;   /* meta padded to alignment              */
    uint64_t total;      /* data_off + padded tensor bytes        */
    size_t max_fill;     /* largest tensor produced by fill       */
} layout;

static tern_status plan(const tn_gguf_writer *w, bool have_fill, layout *L) {
    memset(L, 0, sizeof *L);
    L->alignment = TN_GGUF_DEFAULT_ALIGNMENT;
    uint64_t m = 24;
    bool ok = true;
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *k = &w->kv[i];
        uint64_t v;
        if (k->type == TN_GGUF_STRING) v = 8 + k->str.len;
        else if (k->type == TN_GGUF_ARRAY) {
            v = 12;
            if (k->arr_type == TN_GGUF_STRING)
                for (uint64_t j = 0; j < k->arr_n; j++) ok &= tn_add_ok(v, 8 + k->arr_strs[j].len, &v);
            else v += k->arr_n * tn_gguf__type_size(k->arr_type);
        } else v = tn_gguf__type_size(k->type);
        ok &= tn_add_ok(m, 8 + k->key_len + 4, &m) && tn_add_ok(m, v, &m);
        if (k->key_len == strlen("general.alignment") && !memcmp(k->key, "general.alignment", k->key_len)) {
            uint32_t a = 0;
            if (k->type == TN_GGUF_U32) memcpy(&a, k->scalar, 4);
            if (k->type != TN_GGUF_U32 || a == 0 || (a & (a - 1)) || a > TN_GGUF__MAX_ALIGNMENT)
                return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: general.alignment must be a u32 power of two in 1..%u",
                              TN_GGUF__MAX_ALIGNMENT);
            L->alignment = a;
        }
    }
    for (size_t i = 0; i < w->n_t; i++) ok &= tn_add_ok(m, 8 + strlen(w->t[i].name) + 4 + 8 * w->t[i].n_dims + 4 + 8, &m);
    /* Without tensors there is no data section and no padding (as llama.cpp writes vocab files). */
    uint64_t a = L->alignment, d = w->n_t ? TN_PAD(m, a) : m, sz = d;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        ok &= tn_add_ok(sz, TN_PAD((uint64_t)t->nbytes, a), &sz);
        if (!t->data && t->nbytes) {
            if (!have_fill)
                return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: tensor '%s' has no data and no fill callback was given", t->name);
            L->max_fill = TN_MAX(L->max_fill, t->nbytes);
        }
    }
    if (!ok || sz > SIZE_MAX / 2) return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: file size overflows");
    L->meta = m;
    L->data_off = d;
    L->total = sz;
    return TERN_OK;
}

static void emit_meta(const tn_gguf_writer *w, const layout *L, sink *s) {
    sk_u32(s, TN_GGUF_MAGIC);
    sk_u32(s, 3);
    sk_u64(s, w->n_t);
    sk_u64(s, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *k = &w->kv[i];
        sk_str(s, k->key, k->key_len);
        sk_u32(s, k->type);
        if (k->type == TN_GGUF_STRING) sk_str(s, k->str.data, k->str.len);
        else if (k->type == TN_GGUF_ARRAY) {
            sk_u32(s, k->arr_type);
            sk_u64(s, k->arr_n);
            if (k->arr_type == TN_GGUF_STRING)
                for (uint64_t j = 0; j < k->arr_n; j++) sk_str(s, k->arr_strs[j].data, k->arr_strs[j].len);
            else sk_put(s, k->arr_data, (size_t)k->arr_n * tn_gguf__type_size(k->arr_type));
        } else sk_put(s, k->scalar, tn_gguf__type_size(k->type));
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        sk_str(s, t->name, strlen(t->name));
        sk_u32(s, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) sk_u64(s, (uint64_t)t->ne[d]);
        sk_u32(s, t->type);
        sk_u64(s, off);
        off += TN_PAD((uint64_t)t->nbytes, L->alignment);
    }
    sk_pad(s, (size_t)(L->data_off - L->meta));
}

/* Writes tensor bytes; scratch (max_fill bytes) is used for filled tensors on file output. */
static tern_status emit_data(const tn_gguf_writer *w, const layout *L, sink *s, tn_gguf_fill_fn fill, void *user, uint8_t *scratch) {
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        if (t->data) sk_put(s, t->data, t->nbytes);
        else if (t->nbytes) {
            uint8_t *dst = s->wf ? scratch : s->buf + s->pos;
            tern_status st = fill(user, i, dst, t->nbytes);
            if (st) return tn_err_prefix(st, "gguf writer: producing tensor '%s'", t->name);
            if (s->wf) sk_put(s, dst, t->nbytes);
            else s->pos += t->nbytes;
        }
        sk_pad(s, TN_PAD(t->nbytes, L->alignment) - t->nbytes);
    }
    return TERN_OK;
}

tern_status tn_gguf_write(tn_gguf_writer *w, const char *path, tn_gguf_fill_fn fill, void *user) {
    if (!w || !path) return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: NULL writer or path");
    layout L;
    tern_status st = plan(w, fill != NULL, &L);
    if (st) return tn_err_prefix(st, "%s", path);
    uint8_t *scratch = NULL;
    if (L.max_fill && !(scratch = tn_malloc(L.max_fill)))
        return tn_err(TERN_ERR_NOMEM, "%s: gguf writer: out of memory for a %zu-byte tensor buffer", path, L.max_fill);
    tn_wfile f;
    st = tn_wfile_open(path, &f);
    if (st) {
        tn_free(scratch);
        return st;
    }
    sink s = {.wf = &f};
    emit_meta(w, &L, &s);
    st = emit_data(w, &L, &s, fill, user, scratch);
    tn_free(scratch);
    if (st) {
        tn_wfile_abort(&f);
        return tn_err_prefix(st, "%s", path);
    }
    return tn_wfile_commit(&f);
}

tern_status tn_gguf_write_mem(tn_gguf_writer *w, tn_gguf_fill_fn fill, void *user, uint8_t **out, size_t *out_size) {
    if (out) *out = NULL;
    if (out_size) *out_size = 0;
    if (!w || !out || !out_size) return tn_err(TERN_ERR_INVALID_ARG, "gguf writer: NULL writer or output");
    layout L;
    tern_status st = plan(w, fill != NULL, &L);
    if (st) return st;
    sink s = {.buf = tn_malloc((size_t)L.total)};
    if (!s.buf) return tn_err(TERN_ERR_NOMEM, "gguf writer: out of memory for a %" PRIu64 "-byte file", L.total);
    emit_meta(w, &L, &s);
    if ((st = emit_data(w, &L, &s, fill, user, NULL))) {
        tn_free(s.buf);
        return st;
    }
    *out = s.buf;
    *out_size = s.pos;
    return TERN_OK;
}
