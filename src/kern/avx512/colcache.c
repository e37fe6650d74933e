/*
 * colcache.c — see colcache.h.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kern/avx512/colcache.h"

static pthread_key_t tn_cc_key;
static pthread_once_t tn_cc_once = PTHREAD_ONCE_INIT;
static bool tn_cc_key_ok;

static void tn_cc_free(void *p) {
    tn_colcache *c = p;
    if (c)
        for (int s = 0; s < TN_COLCACHE_NSLOT; s++) free(c[s].x), free(c[s].buf);
    free(c);
}
static void tn_cc_key_init(void) { tn_cc_key_ok = pthread_key_create(&tn_cc_key, tn_cc_free) == 0; }

tn_colcache *tn_colcache_get(int slot, size_t xbytes, size_t need) {
    if (slot < 0 || slot >= TN_COLCACHE_NSLOT) return NULL;
    pthread_once(&tn_cc_once, tn_cc_key_init);
    if (!tn_cc_key_ok) return NULL;
    tn_colcache *all = pthread_getspecific(tn_cc_key);
    if (!all) {
        if (!(all = calloc(TN_COLCACHE_NSLOT, sizeof *all))) return NULL;
        if (pthread_setspecific(tn_cc_key, all)) {
            free(all);
            return NULL;
        }
    }
    tn_colcache *c = &all[slot];
    if (c->cap_x < xbytes || c->cap_buf < need) {
        const size_t cap_x = xbytes ? xbytes : 1, cap_buf = need ? (need + 63) & ~(size_t)63 : 64;
        free(c->x), free(c->buf);
        *c = (tn_colcache){0};
        c->x = malloc(cap_x);
        c->buf = aligned_alloc(64, cap_buf);
        if (!c->x || !c->buf) {
            free(c->x), free(c->buf);
            *c = (tn_colcache){0};
            return NULL;
        }
        c->cap_x = cap_x, c->cap_buf = cap_buf;
    }
    return c;
}

void tn_colcache_set(tn_colcache *c, uint64_t key, const void *x, size_t xbytes) {
    memcpy(c->x, x, xbytes);
    c->key = key, c->xbytes = xbytes;
}
