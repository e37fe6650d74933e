/*
 * gguf_read.c — bounded GGUF v2/v3 parser, lookups, typed getters and value formatting.
 *
 * What it does: validates a whole file before returning it — header, every key/value, every
 * tensor info, the packing of tensor offsets and the extent of the data section — so callers
 * can index tensor bytes without further checks. What it does not: interpret keys (the model
 * loader does) or decide whether a known tensor type is computable (traits' `supported`).
 *
 * Invariant: no byte is read unless the reader checked it lies inside [0, size); every length
 * read from the file is capped before it is used in arithmetic or an allocation; every product
 * and sum of file-controlled numbers goes through tn_mul_ok/tn_add_ok. Counts are checked
 * against what the remaining bytes could hold before anything is allocated, so memory use is
 * bounded by a small multiple of the file size. On failure nothing leaks and *out stays NULL.
 *
 * The parsed object is a tn_gguf embedded at the start of a private struct that also holds hash
 * indexes of keys and tensor names (so duplicate detection and lookups are O(1)); a tn_gguf must
 * therefore only come from tn_gguf_open / tn_gguf_parse.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fmt/gguf.h"
#include "fmt/gguf_impl.h"
#include "tensor/dtype.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tern's GGUF reader exposes raw little-endian arrays; big-endian hosts are not supported"
#endif

/* Smallest encodings, used to bound counts before allocating:
 * kv = key len (8) + key (>= 1) + type (4) + smallest value (1);
 * tensor info = name len (8) + name (>= 1) + n_dims (4) + ne[0] (8) + type (4) + offset (8). */
#define KV_MIN_BYTES 14u
#define TI_MIN_BYTES 33u
#define NE_MAX ((uint64_t)1 << 62)

typedef struct tn_gguf_impl {
    tn_gguf pub;         /* first member: tn_gguf* <-> impl* */
    uint32_t *kv_idx;    /* open addressing, UINT32_MAX = empty */
    uint32_t kv_cap;     /* power of two */
    uint32_t *t_idx;
    uint32_t t_cap;
} tn_gguf_impl;

/* ---- hashing ------------------------------------------------------------------------------ */

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint32_t table_cap(uint64_t n) {
    uint32_t c = 8;
    while (c < 2 * n) c <<= 1; /* n <= 2^30 so this terminates below 2^32 */
    return c;
}

static bool kv_key_eq(const tn_gguf_kv *kv, const char *s, size_t n) {
    return kv->key.len == n && memcmp(kv->key.data, s, n) == 0;
}

/* Returns the slot holding key, or the empty slot where it would go. */
static uint32_t kv_slot(const tn_gguf_impl *im, const char *s, size_t n) {
    uint32_t mask = im->kv_cap - 1, i = (uint32_t)hash_bytes(s, n) & mask;
    while (im->kv_idx[i] != UINT32_MAX && !kv_key_eq(&im->pub.kv[im->kv_idx[i]], s, n)) i = (i + 1) & mask;
    return i;
}

static uint32_t t_slot(const tn_gguf_impl *im, const char *s, size_t n) {
    uint32_t mask = im->t_cap - 1, i = (uint32_t)hash_bytes(s, n) & mask;
    while (im->t_idx[i] != UINT32_MAX) {
        const char *name = im->pub.tensors[im->t_idx[i]].name;
        if (strlen(name) == n && memcmp(name, s, n) == 0) break;
        i = (i + 1) & mask;
    }
    return i;
}

/* ---- bounded reading ---------------------------------------------------------------------- */

/* Names the field being read, formatted only when an error is reported. */
typedef struct fld {
    const char *sec;     /* "header", "kv", "tensor_info", "data"            */
    uint64_t idx;        /* kv / tensor index                                 */
    const char *key;     /* key or tensor name once known (may be NULL)       */
    uint64_t key_len;
    const char *name;    /* field: "key", "value", "ne", ...                  */
    int64_t sub;         /* element index or -1                               */
} fld;

typedef struct rd {
    const uint8_t *p;
    uint64_t size;
    uint64_t pos;
} rd;

static void esc_into(char *dst, size_t cap, const char *s, uint64_t n, size_t max_chars);

static const char *fld_str(const fld *f, char *buf, size_t cap) {
    char key[96] = "";
    if (f->key) {
        char e[80];
        esc_into(e, sizeof e, f->key, f->key_len, 48);
        snprintf(key, sizeof key, " of '%s'", e);
    }
    char sub[32] = "";
    if (f->sub >= 0) snprintf(sub, sizeof sub, "[%" PRId64 "]", f->sub);
    if (!strcmp(f->sec, "header")) snprintf(buf, cap, "%s", f->name);
    else snprintf(buf, cap, "%s[%" PRIu64 "].%s%s%s", f->sec, f->idx, f->name, sub, key);
    return buf;
}

static tern_status rd_err_eof(const rd *r, const fld *f, uint64_t need) {
    char b[256];
    return tn_err(TERN_ERR_FORMAT, "gguf: unexpected end of file at offset %" PRIu64 " reading %s (%" PRIu64
                  " bytes needed, %" PRIu64 " left)", r->pos, fld_str(f, b, sizeof b), need, r->size - r->pos);
}

static inline uint64_t rd_left(const rd *r) { return r->size - r->pos; }

static tern_status rd_need(const rd *r, uint64_t n, const fld *f) {
    return n <= rd_left(r) ? TERN_OK : rd_err_eof(r, f, n);
}

static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static tern_status rd_u32(rd *r, const fld *f, uint32_t *v) {
    if (rd_left(r) < 4) return rd_err_eof(r, f, 4);
    *v = le32(r->p + r->pos);
    r->pos += 4;
    return TERN_OK;
}

static tern_status rd_u64(rd *r, const fld *f, uint64_t *v) {
    if (rd_left(r) < 8) return rd_err_eof(r, f, 8);
    *v = le64(r->p + r->pos);
    r->pos += 8;
    return TERN_OK;
}

/* gguf_string with a length cap; the bytes stay in the file. */
static tern_status rd_str(rd *r, const fld *f, uint64_t cap, tn_gguf_str *s) {
    uint64_t at = r->pos, n = 0;
    tern_status st = rd_u64(r, f, &n);
    if (st) return st;
    if (n > cap) {
        char b[256];
        r->pos = at;
        return tn_err(TERN_ERR_FORMAT, "gguf: string length %" PRIu64 " at offset %" PRIu64 " in %s exceeds the limit of %" PRIu64
                      " bytes", n, at, fld_str(f, b, sizeof b), cap);
    }
    if (n > rd_left(r)) {
        char b[256];
        return tn_err(TERN_ERR_FORMAT, "gguf: unexpected end of file at offset %" PRIu64 " reading %s: string of %" PRIu64
                      " bytes, %" PRIu64 " left", r->pos, fld_str(f, b, sizeof b), n, rd_left(r));
    }
    s->len = n;
    s->data = (const char *)r->p + r->pos;
    r->pos += n;
    return TERN_OK;
}

/* ---- value types -------------------------------------------------------------------------- */

static const char *const type_names[TN_GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *tn_gguf_type_name(uint32_t t) { return t < TN_GGUF_TYPE_COUNT ? type_names[t] : "invalid"; }

size_t tn_gguf__type_size(uint32_t t) {
    switch (t) {
    case TN_GGUF_U8: case TN_GGUF_I8: case TN_GGUF_BOOL: return 1;
    case TN_GGUF_U16: case TN_GGUF_I16: return 2;
    case TN_GGUF_U32: case TN_GGUF_I32: case TN_GGUF_F32: return 4;
    case TN_GGUF_U64: case TN_GGUF_I64: case TN_GGUF_F64: return 8;
    default: return 0; /* string, array, invalid */
    }
}

static bool is_uint(uint32_t t) {
    return t == TN_GGUF_U8 || t == TN_GGUF_U16 || t == TN_GGUF_U32 || t == TN_GGUF_U64;
}
static bool is_sint(uint32_t t) {
    return t == TN_GGUF_I8 || t == TN_GGUF_I16 || t == TN_GGUF_I32 || t == TN_GGUF_I64;
}

/* Decodes a fixed-size element at p into the kv's widened union. */
static void decode_scalar(uint32_t t, const uint8_t *p, tn_gguf_kv *kv) {
    switch (t) {
    case TN_GGUF_U8: case TN_GGUF_BOOL: kv->v.u64 = p[0]; break;
    case TN_GGUF_I8: kv->v.i64 = (int8_t)p[0]; break;
    case TN_GGUF_U16: kv->v.u64 = (uint16_t)(p[0] | p[1] << 8); break;
    case TN_GGUF_I16: kv->v.i64 = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
    case TN_GGUF_U32: kv->v.u64 = le32(p); break;
    case TN_GGUF_I32: kv->v.i64 = (int32_t)le32(p); break;
    case TN_GGUF_U64: kv->v.u64 = le64(p); break;
    case TN_GGUF_I64: kv->v.i64 = (int64_t)le64(p); break;
    case TN_GGUF_F32: { uint32_t u = le32(p); float f; memcpy(&f, &u, 4); kv->v.f64 = f; break; }
    case TN_GGUF_F64: { uint64_t u = le64(p); double d; memcpy(&d, &u, 8); kv->v.f64 = d; break; }
    default: break;
    }
}

static tern_status parse_value(rd *r, fld *f, tn_gguf_kv *kv) {
    char b[256];
    uint32_t t = kv->type;
    if (t == TN_GGUF_STRING) return rd_str(r, f, TN_GGUF__MAX_STRING, &kv->v.str);
    if (t != TN_GGUF_ARRAY) {
        size_t n = tn_gguf__type_size(t);
        uint64_t at = r->pos;
        tern_status st = rd_need(r, n, f);
        if (st) return st;
        if (t == TN_GGUF_BOOL && r->p[at] > 1)
            return tn_err(TERN_ERR_FORMAT, "gguf: bool value %u at offset %" PRIu64 " in %s is not 0 or 1", r->p[at], at,
                          fld_str(f, b, sizeof b));
        decode_scalar(t, r->p + at, kv);
        r->pos += n;
        return TERN_OK;
    }
    /* array */
    uint64_t at = r->pos, n;
    f->name = "value.elem_type";
    tern_status st = rd_u32(r, f, &kv->arr_type);
    if (st) return st;
    uint32_t et = kv->arr_type;
    if (et == TN_GGUF_ARRAY)
        return tn_err(TERN_ERR_FORMAT, "gguf: nested array at offset %" PRIu64 " in %s: arrays of arrays are not supported", at,
                      fld_str(f, b, sizeof b));
    if (et >= TN_GGUF_TYPE_COUNT)
        return tn_err(TERN_ERR_FORMAT, "gguf: invalid array element type %" PRIu32 " at offset %" PRIu64 " in %s", et, at,
                      fld_str(f, b, sizeof b));
    at = r->pos;
    f->name = "value.count";
    if ((st = rd_u64(r, f, &n))) return st;
    uint64_t esz = et == TN_GGUF_STRING ? 8 : tn_gguf__type_size(et);
    if (n > TN_GGUF__MAX_ARRAY)
        return tn_err(TERN_ERR_FORMAT, "gguf: array count %" PRIu64 " at offset %" PRIu64 " in %s exceeds the limit of %" PRIu64,
                      n, at, fld_str(f, b, sizeof b), (uint64_t)TN_GGUF__MAX_ARRAY);
    if (n * esz > rd_left(r)) /* n <= 2^30, esz <= 8: no overflow */
        return tn_err(TERN_ERR_FORMAT, "gguf: array count %" PRIu64 " of %s at offset %" PRIu64 " in %s needs at least %" PRIu64
                      " bytes, only %" PRIu64 " left", n, tn_gguf_type_name(et), at, fld_str(f, b, sizeof b), n * esz, rd_left(r));
    kv->arr_n = n;
    kv->arr_data = r->p + r->pos;
    f->name = "value";
    if (et != TN_GGUF_STRING) {
        if (et == TN_GGUF_BOOL) {
            for (uint64_t i = 0; i < n; i++) {
                if (r->p[r->pos + i] > 1) {
                    f->sub = (int64_t)i;
                    return tn_err(TERN_ERR_FORMAT, "gguf: bool value %u at offset %" PRIu64 " in %s is not 0 or 1", r->p[r->pos + i],
                                  r->pos + i, fld_str(f, b, sizeof b));
                }
            }
        }
        r->pos += n * esz;
        return TERN_OK;
    }
    kv->arr_strs = tn_calloc(n ? n : 1, sizeof *kv->arr_strs);
    if (!kv->arr_strs) return tn_err(TERN_ERR_NOMEM, "gguf: out of memory indexing %" PRIu64 " strings", n);
    for (uint64_t i = 0; i < n; i++) {
        f->sub = (int64_t)i;
        if ((st = rd_str(r, f, TN_GGUF__MAX_STRING, &kv->arr_strs[i]))) return st;
    }
    return TERN_OK;
}

bool tn_gguf__key_ok(const char *s, uint64_t n) {
    if (n == 0 || n > TN_GGUF__MAX_KEY) return false;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c >= 0x7f) return false;
    }
    return true;
}

static tern_status parse_kv(tn_gguf_impl *im, rd *r, uint64_t i) {
    char b[256];
    tn_gguf_kv *kv = &im->pub.kv[i];
    fld f = {"kv", i, NULL, 0, "key", -1};
    kv->offset = r->pos;
    uint64_t at = r->pos;
    tern_status st = rd_str(r, &f, TN_GGUF__MAX_KEY, &kv->key);
    if (st) return st;
    if (kv->key.len == 0) return tn_err(TERN_ERR_FORMAT, "gguf: empty key at offset %" PRIu64 " in kv[%" PRIu64 "]", at, i);
    f.key = kv->key.data;
    f.key_len = kv->key.len;
    if (!tn_gguf__key_ok(kv->key.data, kv->key.len))
        return tn_err(TERN_ERR_FORMAT, "gguf: key at offset %" PRIu64 " in %s has bytes outside printable ASCII", at, fld_str(&f, b, sizeof b));
    uint32_t slot = kv_slot(im, kv->key.data, kv->key.len);
    if (im->kv_idx[slot] != UINT32_MAX) {
        f.name = "key";
        return tn_err(TERN_ERR_FORMAT, "gguf: duplicate key at offset %" PRIu64 " in %s (first at offset %" PRIu64 ")", at,
                      fld_str(&f, b, sizeof b), im->pub.kv[im->kv_idx[slot]].offset);
    }
    im->kv_idx[slot] = (uint32_t)i;
    f.name = "type";
    at = r->pos;
    if ((st = rd_u32(r, &f, &kv->type))) return st;
    if (kv->type >= TN_GGUF_TYPE_COUNT)
        return tn_err(TERN_ERR_FORMAT, "gguf: invalid value type %" PRIu32 " at offset %" PRIu64 " in %s", kv->type, at,
                      fld_str(&f, b, sizeof b));
    f.name = "value";
    return parse_value(r, &f, kv);
}

/* ---- tensor infos ------------------------------------------------------------------------- */

static tern_status parse_tensor_info(tn_gguf_impl *im, rd *r, uint64_t i) {
    char b[256];
    tn_gguf_tensor *t = &im->pub.tensors[i];
    fld f = {"tensor_info", i, NULL, 0, "name", -1};
    uint64_t at = r->pos;
    tn_gguf_str name;
    tern_status st = rd_str(r, &f, TN_GGUF_MAX_NAME, &name);
    if (st) return st;
    if (name.len == 0) return tn_err(TERN_ERR_FORMAT, "gguf: empty tensor name at offset %" PRIu64 " in tensor_info[%" PRIu64 "]", at, i);
    if (memchr(name.data, 0, name.len))
        return tn_err(TERN_ERR_FORMAT, "gguf: tensor name at offset %" PRIu64 " in tensor_info[%" PRIu64 "] contains a NUL byte", at, i);
    memcpy(t->name, name.data, name.len);
    t->name[name.len] = 0;
    f.key = t->name;
    f.key_len = name.len;
    uint32_t slot = t_slot(im, t->name, name.len);
    if (im->t_idx[slot] != UINT32_MAX)
        return tn_err(TERN_ERR_FORMAT, "gguf: duplicate tensor name at offset %" PRIu64 " in %s (also tensor_info[%" PRIu32 "])", at,
                      fld_str(&f, b, sizeof b), im->t_idx[slot]);
    im->t_idx[slot] = (uint32_t)i;

    f.name = "n_dims";
    at = r->pos;
    if ((st = rd_u32(r, &f, &t->n_dims))) return st;
    if (t->n_dims < 1 || t->n_dims > TN_GGUF_MAX_DIMS)
        return tn_err(TERN_ERR_FORMAT, "gguf: n_dims %" PRIu32 " at offset %" PRIu64 " in %s is not in 1..%d", t->n_dims, at,
                      fld_str(&f, b, sizeof b), TN_GGUF_MAX_DIMS);
    f.name = "ne";
    for (uint32_t d = 0; d < TN_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        f.sub = d;
        at = r->pos;
        if ((st = rd_u64(r, &f, &v))) return st;
        if (v >= NE_MAX)
            return tn_err(TERN_ERR_FORMAT, "gguf: dimension %" PRId64 " at offset %" PRIu64 " in %s is negative or too large (limit 2^62)",
                          (int64_t)v, at, fld_str(&f, b, sizeof b));
        t->ne[d] = (int64_t)v;
    }
    f.sub = -1;
    f.name = "type";
    at = r->pos;
    if ((st = rd_u32(r, &f, &t->type))) return st;
    const tn_dtype_traits *tr = tn_dtype_get(t->type);
    if (!tr || tn_dtype_is_internal(t->type))
        return tn_err(TERN_ERR_UNSUPPORTED, "gguf: unsupported tensor type %s (%" PRIu32 ") at offset %" PRIu64 " in %s",
                      tn_dtype_name(t->type), t->type, at, fld_str(&f, b, sizeof b));
    /* Element count, then byte size = row size * rows; each step overflow-checked. */
    uint64_t nel = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (!tn_mul_ok(nel, (uint64_t)t->ne[d], &nel) || nel >= NE_MAX)
            return tn_err(TERN_ERR_FORMAT, "gguf: element count of %s overflows at dimension %" PRIu32 " (offset %" PRIu64 ")",
                          fld_str(&f, b, sizeof b), d, at);
    }
    if (t->ne[0] % tr->blck_size)
        return tn_err(TERN_ERR_FORMAT, "gguf: %s: ne[0] = %" PRId64 " is not a multiple of the %s block size %" PRId64 " (offset %" PRIu64 ")",
                      fld_str(&f, b, sizeof b), t->ne[0], tr->name, tr->blck_size, at);
    /* An empty tensor (some ne = 0) has 0 bytes; otherwise bytes = row size * (nel / ne[0]). */
    uint64_t rows = nel ? nel / (uint64_t)t->ne[0] : 0, row = (uint64_t)(t->ne[0] / tr->blck_size), nbytes;
    if (!tn_mul_ok(row, tr->type_size, &row) || !tn_add_ok(row, tn_dtype_row_hdr(t->type), &row) || !tn_mul_ok(row, rows, &nbytes) ||
        (rows && !tn_add_ok(nbytes, tn_dtype_tensor_tail(t->type), &nbytes)) || nbytes > SIZE_MAX)
        return tn_err(TERN_ERR_FORMAT, "gguf: byte size of %s overflows (offset %" PRIu64 ")", fld_str(&f, b, sizeof b), at);
    if (tn_dtype_tensor_tail(t->type) && rows && rows != (uint64_t)t->ne[1])
        return tn_err(TERN_ERR_FORMAT, "gguf: %s: a %s tensor must be 2-D (its codebook follows its rows); offset %" PRIu64,
                      fld_str(&f, b, sizeof b), tr->name, at);
    if (nbytes > r->size)
        return tn_err(TERN_ERR_FORMAT, "gguf: %s: tensor of %" PRIu64 " bytes cannot fit in a file of %" PRIu64 " bytes (offset %" PRIu64 ")",
                      fld_str(&f, b, sizeof b), nbytes, r->size, at);
    t->nbytes = (size_t)nbytes;
    f.name = "offset";
    at = r->pos;
    return rd_u64(r, &f, &t->offset);
}

/* Codebook types (tensor/dtype.h tn_dtype_row_hdr): row r's header is the little-endian u32 byte distance
 * from the row to the tensor's tail (its codebook), (rows - r) * row size — checked here once, so
 * kernels that follow it from a row never leave the tensor. */
static tern_status check_row_headers(const tn_gguf *g) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        const tn_dtype_traits *tr = tn_dtype_get(t->type);
        if (!tn_dtype_row_hdr(t->type) || !t->nbytes) continue;
        const uint64_t rb = tn_dtype_row_size((tn_dtype)t->type, t->ne[0]), rows = (t->nbytes - tn_dtype_tensor_tail(t->type)) / rb;
        for (uint64_t r = 0; r < rows; r++) {
            const uint8_t *p = t->data + r * rb;
            const uint64_t off = (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
            if (off != (rows - r) * rb)
                return tn_err(TERN_ERR_FORMAT, "gguf: tensor '%s' (%s): row %" PRIu64 " header says its codebook is %" PRIu64
                              " bytes on, expected %" PRIu64, t->name, tr->name, r, off, (rows - r) * rb);
        }
    }
    return TERN_OK;
}

/* Offsets must be the running sum of padded sizes; then the data section must hold them all. */
static tern_status check_layout(tn_gguf_impl *im, uint64_t infos_end) {
    tn_gguf *g = &im->pub;
    uint64_t a = g->alignment, expect = 0, end = 0;
    char b[256];
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        tn_gguf_tensor *t = &g->tensors[i];
        fld f = {"tensor_info", i, t->name, strlen(t->name), "offset", -1};
        if (t->offset % a)
            return tn_err(TERN_ERR_FORMAT, "gguf: %s = %" PRIu64 " is not a multiple of the alignment %" PRIu64, fld_str(&f, b, sizeof b),
                          t->offset, a);
        if (t->offset != expect)
            return tn_err(TERN_ERR_FORMAT, "gguf: %s = %" PRIu64 ", expected %" PRIu64 " (tensors must be stored in order, each padded "
                          "to %" PRIu64 " bytes, without gaps or overlap)", fld_str(&f, b, sizeof b), t->offset, expect, a);
        /* nbytes <= file size, so these sums stay far below 2^64 unless the file is absurd. */
        if (!tn_add_ok(t->offset, t->nbytes, &end) || !tn_add_ok(end, a - 1, &expect))
            return tn_err(TERN_ERR_FORMAT, "gguf: data size overflows at %s", fld_str(&f, b, sizeof b));
        expect -= expect % a;
    }
    uint64_t data_off;
    if (!tn_add_ok(infos_end, a - 1, &data_off)) return tn_err(TERN_ERR_FORMAT, "gguf: data offset overflows");
    data_off -= data_off % a;
    g->data_offset = data_off;
    if (end == 0) { /* no tensor bytes: the data section may be absent */
        for (uint64_t i = 0; i < g->n_tensors; i++) g->tensors[i].data = g->base + TN_MIN(data_off, (uint64_t)g->size);
        return TERN_OK;
    }
    uint64_t need;
    if (!tn_add_ok(data_off, end, &need) || need > g->size) {
        const tn_gguf_tensor *last = &g->tensors[g->n_tensors - 1];
        return tn_err(TERN_ERR_FORMAT, "gguf: data section too short: tensor '%s' ends at file offset %" PRIu64 ", past the file size %zu"
                      " (data section starts at %" PRIu64 ")", last->name, data_off + end, g->size, data_off);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) g->tensors[i].data = g->base + data_off + g->tensors[i].offset;
    return check_row_headers(g);
}

/* ---- header ------------------------------------------------------------------------------- */

static tern_status check_magic(const uint8_t *p, size_t size) {
    if (size < 4) {
        rd r = {p, size, 0};
        fld f = {"header", 0, NULL, 0, "magic", -1};
        return rd_err_eof(&r, &f, 4);
    }
    if (!memcmp(p, "GGUF", 4)) return TERN_OK;
    if (!memcmp(p, "FUGG", 4))
        return tn_err(TERN_ERR_UNSUPPORTED, "gguf: magic 'FUGG' at offset 0: this looks like a byte-swapped (big-endian) GGUF file; tern "
                      "reads little-endian files only");
    static const char *const legacy[] = {"lmgg", "fmgg", "tjgg", "algg", "GGML", "GGMF", "GGJT", "GGLA"};
    for (size_t i = 0; i < TN_ARRAY_LEN(legacy); i++)
        if (!memcmp(p, legacy[i], 4))
            return tn_err(TERN_ERR_UNSUPPORTED, "gguf: legacy GGML/GGJT file (magic '%.4s' at offset 0); convert it to GGUF with "
                          "llama.cpp's convert_hf_to_gguf.py", legacy[i]);
    char e[40];
    esc_into(e, sizeof e, (const char *)p, 4, 16);
    return tn_err(TERN_ERR_FORMAT, "gguf: bad magic '%s' at offset 0 (expected 'GGUF'); not a GGUF file", e);
}

static tern_status check_version(uint32_t v) {
    if (v == 2 || v == 3) return TERN_OK;
    uint32_t sw = __builtin_bswap32(v);
    if (v > 0xffff && (sw == 1 || sw == 2 || sw == 3))
        return tn_err(TERN_ERR_UNSUPPORTED, "gguf: version 0x%08" PRIx32 " at offset 4 looks byte-swapped (version %" PRIu32 " of a "
                      "big-endian file); tern reads little-endian files only", v, sw);
    if (v == 1)
        return tn_err(TERN_ERR_UNSUPPORTED, "gguf: version 1 at offset 4 is obsolete (32-bit counts); tern reads versions 2 and 3 — "
                      "re-convert the model");
    if (v == 0) return tn_err(TERN_ERR_FORMAT, "gguf: invalid version 0 at offset 4");
    return tn_err(TERN_ERR_UNSUPPORTED, "gguf: unsupported version %" PRIu32 " at offset 4; tern reads versions 2 and 3", v);
}

void tn_gguf_free(tn_gguf *g) {
    if (!g) return;
    tn_gguf_impl *im = (tn_gguf_impl *)g;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) tn_free(g->kv[i].arr_strs);
    tn_free(g->kv);
    tn_free(g->tensors);
    tn_free(im->kv_idx);
    tn_free(im->t_idx);
    tn_map_close(&g->map);
    tn_free(im);
}

static tern_status alloc_table(uint64_t n, uint32_t **tab, uint32_t *cap) {
    *cap = table_cap(n);
    *tab = tn_malloc((size_t)*cap * sizeof **tab);
    if (!*tab) return tn_err(TERN_ERR_NOMEM, "gguf: out of memory for an index of %" PRIu64 " entries", n);
    memset(*tab, 0xff, (size_t)*cap * sizeof **tab);
    return TERN_OK;
}

/* Header checks, done before anything is allocated. */
typedef struct hdr {
    uint32_t version;
    uint64_t n_t, n_kv;
} hdr;

static tern_status parse_header(rd *r, hdr *h) {
    tern_status st = check_magic(r->p, (size_t)r->size);
    if (st) return st;
    r->pos = 4;
    fld f = {"header", 0, NULL, 0, "version", -1};
    if ((st = rd_u32(r, &f, &h->version)) || (st = check_version(h->version))) return st;
    f.name = "n_tensors";
    if ((st = rd_u64(r, &f, &h->n_t))) return st;
    f.name = "n_kv";
    if ((st = rd_u64(r, &f, &h->n_kv))) return st;
    /* Bound both counts by what the remaining bytes could hold. */
    uint64_t left = rd_left(r), need_kv, need_t, need, n_t = h->n_t, n_kv = h->n_kv;
    if (n_t > left / TI_MIN_BYTES || n_t > TN_GGUF__MAX_ARRAY)
        return tn_err(TERN_ERR_FORMAT, "gguf: n_tensors = %" PRIu64 " at offset 8 cannot fit in the %" PRIu64 " bytes after the header "
                      "(each tensor info needs at least %u)", n_t, left, TI_MIN_BYTES);
    if (n_kv > left / KV_MIN_BYTES || n_kv > TN_GGUF__MAX_ARRAY)
        return tn_err(TERN_ERR_FORMAT, "gguf: n_kv = %" PRIu64 " at offset 16 cannot fit in the %" PRIu64 " bytes after the header "
                      "(each key/value needs at least %u)", n_kv, left, KV_MIN_BYTES);
    if (!tn_mul_ok(n_t, TI_MIN_BYTES, &need_t) || !tn_mul_ok(n_kv, KV_MIN_BYTES, &need_kv) || !tn_add_ok(need_t, need_kv, &need) ||
        need > left)
        return tn_err(TERN_ERR_FORMAT, "gguf: n_tensors = %" PRIu64 " and n_kv = %" PRIu64 " cannot fit in the %" PRIu64
                      " bytes after the header", n_t, n_kv, left);
    return TERN_OK;
}

static tern_status parse_body(tn_gguf_impl *im, rd *r, const hdr *h) {
    tn_gguf *g = &im->pub;
    tern_status st;
    uint64_t n_t = h->n_t, n_kv = h->n_kv;
    g->version = h->version;
    g->kv = tn_calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kv);
    g->tensors = tn_calloc(n_t ? (size_t)n_t : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors)
        return tn_err(TERN_ERR_NOMEM, "gguf: out of memory for %" PRIu64 " key/values and %" PRIu64 " tensors", n_kv, n_t);
    g->n_kv = n_kv; /* kv[] is zeroed, so tn_gguf_free may walk all n_kv entries */
    if ((st = alloc_table(n_kv, &im->kv_idx, &im->kv_cap)) || (st = alloc_table(n_t, &im->t_idx, &im->t_cap))) return st;

    for (uint64_t i = 0; i < n_kv; i++)
        if ((st = parse_kv(im, r, i))) return st;
    const tn_gguf_kv *al = tn_gguf_find(g, "general.alignment");
    if (al) {
        if (al->type != TN_GGUF_U32)
            return tn_err(TERN_ERR_FORMAT, "gguf: general.alignment at offset %" PRIu64 " has type %s, expected u32", al->offset,
                          tn_gguf_type_name(al->type));
        if (al->v.u64 == 0 || (al->v.u64 & (al->v.u64 - 1)) || al->v.u64 > TN_GGUF__MAX_ALIGNMENT)
            return tn_err(TERN_ERR_FORMAT, "gguf: general.alignment = %" PRIu64 " at offset %" PRIu64 " is not a power of two in 1..%u",
                          al->v.u64, al->offset, TN_GGUF__MAX_ALIGNMENT);
        g->alignment = (uint32_t)al->v.u64;
    }
    g->n_tensors = n_t;
    for (uint64_t i = 0; i < n_t; i++)
        if ((st = parse_tensor_info(im, r, i))) return st;
    return check_layout(im, r->pos);
}

tern_status tn_gguf_parse(const uint8_t *data, size_t size, tn_gguf **out) {
    *out = NULL;
    if (!data && size) return tn_err(TERN_ERR_INVALID_ARG, "gguf: NULL data of %zu bytes", size);
    if (!data) data = (const uint8_t *)"";
    rd r = {data, size, 0};
    hdr h;
    tern_status st = parse_header(&r, &h);
    if (st) return st;
    tn_gguf_impl *im = tn_calloc(1, sizeof *im);
    if (!im) return tn_err(TERN_ERR_NOMEM, "gguf: out of memory");
    im->pub.base = data;
    im->pub.size = size;
    im->pub.alignment = TN_GGUF_DEFAULT_ALIGNMENT;
    if ((st = parse_body(im, &r, &h))) {
        tn_gguf_free(&im->pub);
        return st;
    }
    *out = &im->pub;
    return TERN_OK;
}

tern_status tn_gguf_open(const char *path, bool use_mmap, tn_gguf **out) {
    *out = NULL;
    tn_map m;
    tern_status st = tn_map_open(path, use_mmap, &m);
    if (st) return st;
    tn_gguf *g = NULL;
    st = tn_gguf_parse(m.data, m.size, &g);
    if (st) {
        tn_map_close(&m);
        return tn_err_prefix(st, "%s", path);
    }
    g->map = m;
    *out = g;
    return TERN_OK;
}

/* ---- lookups and getters ------------------------------------------------------------------ */

int64_t tn_gguf_find_index(const tn_gguf *g, const char *key) {
    const tn_gguf_impl *im = (const tn_gguf_impl *)g;
    if (!g || !key || !im->kv_idx) return -1;
    uint32_t i = im->kv_idx[kv_slot(im, key, strlen(key))];
    return i == UINT32_MAX ? -1 : (int64_t)i;
}

const tn_gguf_kv *tn_gguf_find(const tn_gguf *g, const char *key) {
    int64_t i = tn_gguf_find_index(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

const tn_gguf_tensor *tn_gguf_find_tensor(const tn_gguf *g, const char *name) {
    const tn_gguf_impl *im = (const tn_gguf_impl *)g;
    if (!g || !name || !im->t_idx) return NULL;
    uint32_t i = im->t_idx[t_slot(im, name, strlen(name))];
    return i == UINT32_MAX ? NULL : &g->tensors[i];
}

static tern_status get_kv(const tn_gguf *g, const char *key, bool required, const tn_gguf_kv **kv) {
    *kv = tn_gguf_find(g, key);
    if (!*kv && required) return tn_err(TERN_ERR_FORMAT, "gguf: missing key '%s'", key);
    return TERN_OK;
}

static tern_status wrong_type(const tn_gguf_kv *kv, const char *key, const char *expected) {
    return tn_err(TERN_ERR_FORMAT, "gguf: key '%s' (offset %" PRIu64 ") has type %s, expected %s", key, kv->offset,
                  tn_gguf_type_name(kv->type), expected);
}

static tern_status out_of_range(const tn_gguf_kv *kv, const char *key, const char *target) {
    char v[64];
    if (is_uint(kv->type)) snprintf(v, sizeof v, "%" PRIu64, kv->v.u64);
    else snprintf(v, sizeof v, "%" PRId64, kv->v.i64);
    return tn_err(TERN_ERR_FORMAT, "gguf: key '%s' (offset %" PRIu64 ") = %s does not fit in %s", key, kv->offset, v, target);
}

tern_status tn_gguf_get_i64(const tn_gguf *g, const char *key, bool required, int64_t *out) {
    const tn_gguf_kv *kv;
    tern_status st = get_kv(g, key, required, &kv);
    if (st || !kv) return st;
    if (is_sint(kv->type)) *out = kv->v.i64;
    else if (is_uint(kv->type)) {
        if (kv->v.u64 > INT64_MAX) return out_of_range(kv, key, "i64");
        *out = (int64_t)kv->v.u64;
    } else return wrong_type(kv, key, "an integer");
    return TERN_OK;
}

tern_status tn_gguf_get_u32(const tn_gguf *g, const char *key, bool required, uint32_t *out) {
    const tn_gguf_kv *kv;
    tern_status st = get_kv(g, key, required, &kv);
    if (st || !kv) return st;
    if (is_uint(kv->type)) {
        if (kv->v.u64 > UINT32_MAX) return out_of_range(kv, key, "u32");
        *out = (uint32_t)kv->v.u64;
    } else if (is_sint(kv->type)) {
        if (kv->v.i64 < 0 || kv->v.i64 > (int64_t)UINT32_MAX) return out_of_range(kv, key, "u32");
        *out = (uint32_t)kv->v.i64;
    } else return wrong_type(kv, key, "an integer");
    return TERN_OK;
}

tern_status tn_gguf_get_f32(const tn_gguf *g, const char *key, bool required, float *out) {
    const tn_gguf_kv *kv;
    tern_status st = get_kv(g, key, required, &kv);
    if (st || !kv) return st;
    if (kv->type != TN_GGUF_F32 && kv->type != TN_GGUF_F64) return wrong_type(kv, key, "f32");
    *out = (float)kv->v.f64;
    return TERN_OK;
}

tern_status tn_gguf_get_bool(const tn_gguf *g, const char *key, bool required, bool *out) {
    const tn_gguf_kv *kv;
    tern_status st = get_kv(g, key, required, &kv);
    if (st || !kv) return st;
    if (kv->type != TN_GGUF_BOOL) return wrong_type(kv, key, "bool");
    *out = kv->v.u64 != 0;
    return TERN_OK;
}

tern_status tn_gguf_get_str(const tn_gguf *g, const char *key, bool required, tn_gguf_str *out) {
    const tn_gguf_kv *kv;
    tern_status st = get_kv(g, key, required, &kv);
    if (st || !kv) return st;
    if (kv->type != TN_GGUF_STRING) return wrong_type(kv, key, "string");
    *out = kv->v.str;
    return TERN_OK;
}

tern_status tn_gguf_get_arr(const tn_gguf *g, const char *key, bool required, uint32_t elem_type, const tn_gguf_kv **out) {
    const tn_gguf_kv *kv;
    tern_status st = get_kv(g, key, required, &kv);
    if (st || !kv) return st;
    if (kv->type != TN_GGUF_ARRAY) {
        char e[32];
        snprintf(e, sizeof e, "array of %s", elem_type < TN_GGUF_TYPE_COUNT ? tn_gguf_type_name(elem_type) : "any");
        return wrong_type(kv, key, e);
    }
    if (elem_type < TN_GGUF_TYPE_COUNT && kv->arr_type != elem_type)
        return tn_err(TERN_ERR_FORMAT, "gguf: key '%s' (offset %" PRIu64 ") is an array of %s, expected an array of %s", key, kv->offset,
                      tn_gguf_type_name(kv->arr_type), tn_gguf_type_name(elem_type));
    *out = kv;
    return TERN_OK;
}

bool tn_gguf_str_eq(tn_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.data, c, n) == 0);
}

char *tn_gguf_str_dup(tn_gguf_str s) {
    if (s.len >= SIZE_MAX) return NULL;
    return tn_strndup(s.len ? s.data : "", (size_t)s.len);
}

/* ---- formatting --------------------------------------------------------------------------- */

/* Length of a valid UTF-8 sequence starting at s (n bytes available), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, uint64_t n) {
    unsigned char c = s[0];
    size_t k;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) k = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) k = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) k = 4, cp = c & 0x07;
    else return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if ((k == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
    return k;
}

/* Escapes s (n bytes) into dst (always NUL-terminated): quotes, backslashes and control bytes
 * escaped, invalid UTF-8 as \xNN; stops after max_chars output characters and appends "...". */
static void esc_into(char *dst, size_t cap, const char *s, uint64_t n, size_t max_chars) {
    if (!cap) return;
    size_t o = 0, chars = 0;
    const unsigned char *u = (const unsigned char *)s;
    uint64_t i = 0;
    while (i < n) {
        char tmp[8];
        size_t tl, adv = 1;
        unsigned char c = u[i];
        if (c == '"' || c == '\\') tmp[0] = '\\', tmp[1] = (char)c, tl = 2;
        else if (c == '\n') memcpy(tmp, "\\n", 2), tl = 2;
        else if (c == '\t') memcpy(tmp, "\\t", 2), tl = 2;
        else if (c == '\r') memcpy(tmp, "\\r", 2), tl = 2;
        else if (c < 0x20 || c == 0x7f) tl = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
        else if (c < 0x80) tmp[0] = (char)c, tl = 1;
        else if ((adv = utf8_len(u + i, n - i)) > 0) memcpy(tmp, u + i, adv), tl = adv;
        else adv = 1, tl = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
        if (chars >= max_chars || o + tl + 4 > cap) {
            if (o + 4 <= cap) memcpy(dst + o, "...", 3), o += 3;
            break;
        }
        memcpy(dst + o, tmp, tl);
        o += tl;
        i += adv;
        chars++;
    }
    dst[o] = 0;
}

/* Appends formatted text to buf at *o, never past cap - 1. */
static void app(char *buf, size_t cap, size_t *o, const char *fmt, ...) TN_PRINTF(4, 5);
static void app(char *buf, size_t cap, size_t *o, const char *fmt, ...) {
    if (*o + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *o, cap - *o, fmt, ap);
    va_end(ap);
    if (n > 0) *o = TN_MIN(*o + (size_t)n, cap - 1);
}

static void fmt_scalar(const tn_gguf_kv *kv, char *buf, size_t cap, size_t *o) {
    switch (kv->type) {
    case TN_GGUF_BOOL: app(buf, cap, o, "%s", kv->v.u64 ? "true" : "false"); break;
    case TN_GGUF_F32: app(buf, cap, o, "%.9g", kv->v.f64); break;
    case TN_GGUF_F64: app(buf, cap, o, "%.17g", kv->v.f64); break;
    default:
        if (is_uint(kv->type)) app(buf, cap, o, "%" PRIu64, kv->v.u64);
        else app(buf, cap, o, "%" PRId64, kv->v.i64);
    }
}

static void fmt_str(tn_gguf_str s, size_t max_chars, char *buf, size_t cap, size_t *o) {
    char e[4 * 128 + 8];
    esc_into(e, sizeof e, s.data, s.len, TN_MIN(max_chars, 128));
    app(buf, cap, o, "\"%s\"", e);
}

void tn_gguf_kv_format(const tn_gguf_kv *kv, char *buf, size_t cap) {
    if (!buf || !cap) return;
    buf[0] = 0;
    if (!kv) return;
    size_t o = 0;
    if (kv->type == TN_GGUF_STRING) {
        fmt_str(kv->v.str, 80, buf, cap, &o);
        if (kv->v.str.len > 80) app(buf, cap, &o, " (%" PRIu64 " bytes)", kv->v.str.len);
        return;
    }
    if (kv->type != TN_GGUF_ARRAY) {
        if (kv->type < TN_GGUF_TYPE_COUNT) fmt_scalar(kv, buf, cap, &o);
        else app(buf, cap, &o, "<invalid type %" PRIu32 ">", kv->type);
        return;
    }
    /* Arrays: short ones in full, long ones as a summary plus the first few elements. */
    const uint64_t show_all = 8, show_some = 3;
    uint64_t n = kv->arr_n, shown = n <= show_all ? n : show_some;
    bool strs = kv->arr_type == TN_GGUF_STRING;
    app(buf, cap, &o, "[");
    if (n > show_all) {
        if (strs) app(buf, cap, &o, "%" PRIu64 " strings: ", n);
        else app(buf, cap, &o, "%s x %" PRIu64 ": ", tn_gguf_type_name(kv->arr_type), n);
    }
    size_t esz = tn_gguf__type_size(kv->arr_type);
    for (uint64_t i = 0; i < shown; i++) {
        if (i) app(buf, cap, &o, ", ");
        if (strs) {
            if (!kv->arr_strs) break;
            fmt_str(kv->arr_strs[i], 24, buf, cap, &o);
        } else if (esz && kv->arr_data) {
            tn_gguf_kv e = {.type = kv->arr_type};
            decode_scalar(kv->arr_type, kv->arr_data + i * esz, &e);
            fmt_scalar(&e, buf, cap, &o);
        }
    }
    if (n > shown) app(buf, cap, &o, ", ...");
    app(buf, cap, &o, "]");
    /* Anything cut by cap ends with "..." rather than mid-element. */
    if (o + 1 >= cap && cap > 4) memcpy(buf + cap - 4, "...", 4);
}
