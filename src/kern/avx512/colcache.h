/*
 * colcache.h — per-thread memory of the last activation column a one-token kernel prepared.
 * A one-token matmul reaches a thread in several calls with the same column (its static share,
 * then tail chunks of tn_matmul_share; gate and up share it too), and some kernels spend real
 * work turning the column into their own form (the tq1 lookup tables, the row-major tq kernel's
 * register-ordered column). They keep that form here and reuse it while the key and the column's
 * bytes (compared in full, so never stale) match. One slot per kernel family; heap buffers
 * behind a thread key, freed at thread exit.
 */
#ifndef TN_KERN_AVX512_COLCACHE_H
#define TN_KERN_AVX512_COLCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { TN_COLCACHE_L32, TN_COLCACHE_TQ, TN_COLCACHE_NSLOT };

typedef struct {
    uint64_t key;      /* the kernel's own key (0 = empty): layout parameters, k, ...      */
    size_t xbytes;     /* bytes of the remembered column                                   */
    size_t cap_x, cap_buf;
    uint8_t *x;        /* the column as passed in                                          */
    uint8_t *buf;      /* its prepared form (64-byte aligned)                              */
} tn_colcache;

/* This thread's slot with room for xbytes of column and need bytes of prepared form (contents
 * kept when it already had the room, else emptied), or NULL when memory is short. */
tn_colcache *tn_colcache_get(int slot, size_t xbytes, size_t need);
/* Whether buf holds the prepared form of column x (xbytes) under key. */
static inline bool tn_colcache_hit(const tn_colcache *c, uint64_t key, const void *x, size_t xbytes) {
    return c->key == key && key != 0 && c->xbytes == xbytes && !memcmp(c->x, x, xbytes);
}
/* Records that buf now holds column x's prepared form under key. */
void tn_colcache_set(tn_colcache *c, uint64_t key, const void *x, size_t xbytes);

#endif
