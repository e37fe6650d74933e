/*
 * gguf.h — GGUF v2/v3 reader and writer.
 *
 * The format (little-endian; ggml docs/gguf.md):
 *
 *   u32 magic "GGUF" (bytes 47 47 55 46)   u32 version (2 or 3; v1 rejected)
 *   u64 n_tensors                          u64 n_kv
 *   kv[n_kv]:      gguf_string key; u32 value_type; value
 *   tensor_info[]: gguf_string name (<= 63 bytes); u32 n_dims (1..4); u64 ne[n_dims];
 *                  u32 type; u64 offset (relative to the data section, multiple of alignment)
 *   zero padding to `alignment` (general.alignment, u32 power of two, default 32)
 *   data section: each tensor's bytes, padded to `alignment`, in offset order
 *   gguf_string = u64 length + bytes (no NUL)
 *   value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (1 byte, 0/1),
 *                8 string, 9 array (u32 elem_type, u64 count, elems; no nested arrays),
 *                10 u64, 11 i64, 12 f64
 *
 * Reader invariants: every read is checked against the bytes remaining; every length is capped
 * (key <= 65535, string <= 1 GiB, array count <= 2^30 and <= bytes remaining); every product
 * and sum is overflow-checked; tensor offsets must equal the running sum of padded sizes and the
 * data section must hold the last tensor, all checked before any tensor is touched. Errors are
 * TERN_ERR_FORMAT (TERN_ERR_UNSUPPORTED for valid-but-unsupported such as an unknown tensor
 * type) with a message naming the field and its byte offset. Strings point into the file bytes
 * and are not NUL-terminated; use tn_gguf_str_eq / tn_gguf_str_dup.
 *
 * The writer builds metadata and a tensor list in memory and writes the file atomically
 * (temp + fsync + rename, core/file.h).
 */
#ifndef TN_FMT_GGUF_H
#define TN_FMT_GGUF_H

#include "core/base.h"
#include "core/file.h"

#define TN_GGUF_MAGIC 0x46554747u /* "GGUF" read as little-endian u32 */
#define TN_GGUF_DEFAULT_ALIGNMENT 32
#define TN_GGUF_MAX_NAME 63
#define TN_GGUF_MAX_DIMS 4

typedef enum tn_gguf_type {
    TN_GGUF_U8 = 0, TN_GGUF_I8 = 1, TN_GGUF_U16 = 2, TN_GGUF_I16 = 3, TN_GGUF_U32 = 4,
    TN_GGUF_I32 = 5, TN_GGUF_F32 = 6, TN_GGUF_BOOL = 7, TN_GGUF_STRING = 8, TN_GGUF_ARRAY = 9,
    TN_GGUF_U64 = 10, TN_GGUF_I64 = 11, TN_GGUF_F64 = 12, TN_GGUF_TYPE_COUNT = 13
} tn_gguf_type;

typedef struct tn_gguf_str {
    uint64_t len;
    const char *data; /* not NUL-terminated */
} tn_gguf_str;

typedef struct tn_gguf_kv {
    tn_gguf_str key;
    uint32_t type;          /* tn_gguf_type                                                   */
    uint64_t offset;        /* byte offset of this kv in the file                             */
    union {
        uint64_t u64;       /* all unsigned ints and bool widened                             */
        int64_t i64;        /* all signed ints widened                                        */
        double f64;         /* f32 and f64 widened                                            */
        tn_gguf_str str;
    } v;
    /* arrays */
    uint32_t arr_type;      /* element type                                                   */
    uint64_t arr_n;         /* element count                                                  */
    const uint8_t *arr_data;/* raw little-endian elements (not for string arrays)            */
    tn_gguf_str *arr_strs;  /* string arrays: arr_n entries, indexed at parse time           */
} tn_gguf_kv;

typedef struct tn_gguf_tensor {
    char name[TN_GGUF_MAX_NAME + 1]; /* NUL-terminated                                      */
    uint32_t n_dims;
    int64_t ne[TN_GGUF_MAX_DIMS];    /* unused dims are 1                                   */
    uint32_t type;                   /* tn_dtype id                                         */
    uint64_t offset;                 /* relative to the data section                        */
    size_t nbytes;
    const uint8_t *data;             /* base + data_offset + offset                         */
} tn_gguf_tensor;

typedef struct tn_gguf {
    uint32_t version;
    uint64_t n_kv;
    tn_gguf_kv *kv;
    uint64_t n_tensors;
    tn_gguf_tensor *tensors;
    uint32_t alignment;
    uint64_t data_offset;            /* start of the data section in the file               */
    const uint8_t *base;             /* file bytes                                          */
    size_t size;
    tn_map map;                      /* owned mapping when opened from a path               */
} tn_gguf;

/* Opens and validates a file. NOT_FOUND for missing/unreadable paths, FORMAT/UNSUPPORTED for
 * bad contents (message prefixed with the path). */
tern_status tn_gguf_open(const char *path, bool use_mmap, tn_gguf **out);
/* Parses bytes in memory (not copied; must outlive the result). Used by the fuzzer and tests. */
tern_status tn_gguf_parse(const uint8_t *data, size_t size, tn_gguf **out);
void tn_gguf_free(tn_gguf *g);

const tn_gguf_kv *tn_gguf_find(const tn_gguf *g, const char *key);
int64_t tn_gguf_find_index(const tn_gguf *g, const char *key); /* -1 if absent */
const tn_gguf_tensor *tn_gguf_find_tensor(const tn_gguf *g, const char *name);

/* Typed getters. If the key is absent: TERN_OK and *out untouched when !required, else
 * TERN_ERR_FORMAT "missing key". A present key of the wrong type is TERN_ERR_FORMAT naming key,
 * expected and actual type. Integer getters accept any integer type whose value fits. */
tern_status tn_gguf_get_i64(const tn_gguf *g, const char *key, bool required, int64_t *out);
tern_status tn_gguf_get_u32(const tn_gguf *g, const char *key, bool required, uint32_t *out);
tern_status tn_gguf_get_f32(const tn_gguf *g, const char *key, bool required, float *out);
tern_status tn_gguf_get_bool(const tn_gguf *g, const char *key, bool required, bool *out);
tern_status tn_gguf_get_str(const tn_gguf *g, const char *key, bool required, tn_gguf_str *out);
/* Array of the given element type (TN_GGUF_TYPE_COUNT = any). */
tern_status tn_gguf_get_arr(const tn_gguf *g, const char *key, bool required, uint32_t elem_type, const tn_gguf_kv **out);

bool tn_gguf_str_eq(tn_gguf_str s, const char *c);
char *tn_gguf_str_dup(tn_gguf_str s); /* tn_malloc'd NUL-terminated copy, NULL on OOM */
const char *tn_gguf_type_name(uint32_t t);
/* Renders a value as text ("[512 strings]" for long arrays) into buf; for `tern info`. */
void tn_gguf_kv_format(const tn_gguf_kv *kv, char *buf, size_t cap);

/* ---- writer ------------------------------------------------------------------------------ */
typedef struct tn_gguf_writer tn_gguf_writer;

/* Produces the bytes of tensor `index` into dst (nbytes long). Used for tensors added with
 * data == NULL, called in tensor order while writing, so outputs can be computed on the fly. */
typedef tern_status (*tn_gguf_fill_fn)(void *user, size_t index, void *dst, size_t nbytes);

tern_status tn_gguf_writer_create(tn_gguf_writer **out);
void tn_gguf_writer_free(tn_gguf_writer *w);
/* Setters replace an existing key of the same name (order of first insertion is kept). */
tern_status tn_gguf_set_u32(tn_gguf_writer *w, const char *key, uint32_t v);
tern_status tn_gguf_set_i32(tn_gguf_writer *w, const char *key, int32_t v);
tern_status tn_gguf_set_u64(tn_gguf_writer *w, const char *key, uint64_t v);
tern_status tn_gguf_set_f32(tn_gguf_writer *w, const char *key, float v);
tern_status tn_gguf_set_bool(tn_gguf_writer *w, const char *key, bool v);
tern_status tn_gguf_set_str(tn_gguf_writer *w, const char *key, const char *v);
/* Array of fixed-size elements (not STRING/ARRAY); data is copied. */
tern_status tn_gguf_set_arr(tn_gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n);
tern_status tn_gguf_set_arr_str(tn_gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Copies one key/value (any type, including arrays) from a parsed file. */
tern_status tn_gguf_set_kv(tn_gguf_writer *w, const tn_gguf_kv *kv);
tern_status tn_gguf_remove(tn_gguf_writer *w, const char *key);
/* Adds a tensor. data (borrowed until the write) may be NULL if fill is given to write(). */
tern_status tn_gguf_add_tensor(tn_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                               const int64_t *ne, const void *data);
/* Writes the file atomically. fill may be NULL if every tensor has data. */
tern_status tn_gguf_write(tn_gguf_writer *w, const char *path, tn_gguf_fill_fn fill, void *user);
/* Writes into a tn_malloc'd buffer (tests, fuzz corpora). */
tern_status tn_gguf_write_mem(tn_gguf_writer *w, tn_gguf_fill_fn fill, void *user, uint8_t **out, size_t *out_size);

#endif
