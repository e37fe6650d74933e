/*
 * gguf_build.h — a raw GGUF byte builder for tests: emits exactly the bytes it is told to, with
 * no validation, so tests can produce every malformed variant (the real writer refuses them).
 *
 * tb_model() builds a tiny valid model (3 tensors: f32, q8_0, f32; the last one ends on the
 * alignment so truncating anywhere must fail) and lets a spec override any header field, append
 * raw key/values and replace the tensor list. Memory comes from plain malloc so it does not
 * disturb allocation counting in fault-injection tests.
 */
#ifndef TN_TESTS_GGUF_BUILD_H
#define TN_TESTS_GGUF_BUILD_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/dtype.h"

typedef struct tb {
    uint8_t *p;
    size_t n, cap;
} tb;

static inline void tb_bytes(tb *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *np = realloc(b->p, cap);
        if (!np) abort();
        b->p = np;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}
static inline void tb_u8(tb *b, uint8_t v) { tb_bytes(b, &v, 1); }
static inline void tb_u32(tb *b, uint32_t v) { tb_bytes(b, &v, 4); }
static inline void tb_u64(tb *b, uint64_t v) { tb_bytes(b, &v, 8); }
static inline void tb_strn(tb *b, const char *s, size_t n) {
    tb_u64(b, n);
    tb_bytes(b, s, n);
}
static inline void tb_str(tb *b, const char *s) { tb_strn(b, s, strlen(s)); }
static inline void tb_pad(tb *b, size_t align) {
    while (b->n % align) tb_u8(b, 0);
}
static inline void tb_free(tb *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* key/value helpers (key, type, value) */
static inline void tb_kv_u32(tb *b, const char *k, uint32_t v) { tb_str(b, k); tb_u32(b, 4); tb_u32(b, v); }
static inline void tb_kv_str(tb *b, const char *k, const char *v) { tb_str(b, k); tb_u32(b, 8); tb_str(b, v); }

typedef struct tb_tensor {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    bool set_offset; /* else the running padded sum */
    uint64_t offset;
} tb_tensor;

typedef struct tb_spec {
    const char *magic;         /* default "GGUF" */
    uint32_t version;          /* default 3 */
    bool set_n_tensors, set_n_kv;
    uint64_t n_tensors, n_kv;  /* header overrides */
    const tb *extra_kv;        /* raw kv bytes appended after the default kvs */
    uint64_t n_extra_kv;
    const tb_tensor *tensors;  /* default: the 3 tiny tensors */
    int n_tensor_specs;
    uint32_t alignment;        /* layout alignment (add general.alignment via extra_kv); default 32 */
    size_t trim;               /* bytes cut from the end */
    bool raw_tensor_bytes;     /* tensors given as raw bytes in tensor_raw (n_tensor_specs ignored) */
    const tb *tensor_raw;
    uint64_t n_tensor_raw;
} tb_spec;

static const tb_tensor tb_default_tensors[3] = {
    {"token_embd.weight", 2, {8, 2, 1, 1}, TN_F32, false, 0},  /* 64 bytes */
    {"blk.0.attn_q.weight", 2, {32, 1, 1, 1}, TN_Q8_0, false, 0}, /* 34 bytes, padded to 64 */
    {"output_norm.weight", 1, {8, 1, 1, 1}, TN_F32, false, 0}, /* 32 bytes, ends aligned */
};

static inline uint64_t tb_tensor_bytes(const tb_tensor *t) {
    const tn_dtype_traits *tr = tn_dtype_get(t->type);
    if (!tr) return 0;
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims && d < 4; d++) {
        if (t->ne[d] > (1u << 20)) return 0; /* absurd shapes get no data */
        n *= t->ne[d];
    }
    if (n % (uint64_t)tr->blck_size) return 0;
    return n / (uint64_t)tr->blck_size * tr->type_size;
}

static inline void tb_model(tb *b, const tb_spec *s) {
    const tb_tensor *ts = s->tensors ? s->tensors : tb_default_tensors;
    int nt = s->tensors ? s->n_tensor_specs : 3;
    uint32_t align = s->alignment ? s->alignment : 32;
    tb_bytes(b, s->magic ? s->magic : "GGUF", 4);
    tb_u32(b, s->version ? s->version : 3);
    tb_u64(b, s->set_n_tensors ? s->n_tensors : s->raw_tensor_bytes ? s->n_tensor_raw : (uint64_t)nt);
    tb_u64(b, s->set_n_kv ? s->n_kv : 3 + s->n_extra_kv);
    tb_kv_str(b, "general.architecture", "llama");
    tb_kv_str(b, "general.name", "tiny");
    tb_kv_u32(b, "llama.block_count", 1);
    if (s->extra_kv) tb_bytes(b, s->extra_kv->p, s->extra_kv->n);
    uint64_t off = 0, total = 0;
    if (s->raw_tensor_bytes) {
        tb_bytes(b, s->tensor_raw->p, s->tensor_raw->n);
    } else {
        for (int i = 0; i < nt; i++) {
            const tb_tensor *t = &ts[i];
            tb_str(b, t->name);
            tb_u32(b, t->n_dims);
            for (uint32_t d = 0; d < t->n_dims; d++) tb_u64(b, d < 4 ? t->ne[d] : 1);
            tb_u32(b, t->type);
            tb_u64(b, t->set_offset ? t->offset : off);
            uint64_t nb = tb_tensor_bytes(t);
            off += (nb + align - 1) / align * align;
        }
        total = off;
    }
    tb_pad(b, align);
    for (uint64_t i = 0; i < total; i++) tb_u8(b, (uint8_t)(i * 7 + 1));
    b->n -= s->trim < b->n ? s->trim : b->n;
}

#endif
