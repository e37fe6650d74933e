/*
 * iq_map.c — the codebook i-quants' search structures (iq_grid.h: tn_iq_map): for each grid, the
 * levels of every entry, a map from a group's level pattern to its entry and, for the patterns
 * that are not entries, the list of nearest entries the quantizers pick from. ggml builds the
 * same at ggml_quantize_init (iq2xs_init_impl, iq3xs_init_impl) from compressed copies of the
 * grids; here they come from tern's own tables (iq_grids.c), so the grid is written down once.
 *
 * Invariant: the lists hold exactly ggml's entries in ggml's order (distance, then grid index):
 * the quantizers keep the first of equally good entries, so the order is part of the output.
 * Built once per grid under a lock; readers see a published pointer (acquire/release). The
 * memory stays for the life of the process, as ggml's does until ggml_quantize_free.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "core/base.h"
#include "quant/iq_grid.h"

enum { K_IQ2XXS, K_IQ2XS, K_IQ2S, K_IQ1S, K_IQ3XXS, K_IQ3S, K_COUNT };

typedef struct kind_info {
    int dim, bits, grid_size, nwant, nlev;
    int8_t lev[8]; /* the grid's values per level, ascending: byte -> level by lookup */
} kind_info;

static const kind_info kinds[K_COUNT] = {
    [K_IQ2XXS] = {8, 2, 256, 2, 3, {8, 25, 43}},
    [K_IQ2XS] = {8, 2, 512, 2, 3, {8, 25, 43}},
    [K_IQ2S] = {8, 2, 1024, 1, 3, {8, 25, 43}},
    [K_IQ1S] = {8, 2, 2048, 3, 3, {-1, 0, 1}},
    [K_IQ3XXS] = {4, 3, 256, 2, 8, {4, 12, 20, 28, 36, 44, 52, 62}},
    [K_IQ3S] = {4, 3, 512, 3, 8, {1, 3, 5, 7, 9, 11, 13, 15}},
};

static tn_iq_map maps[K_COUNT];
static _Atomic(const tn_iq_map *) ready[K_COUNT];
static pthread_mutex_t build_lock = PTHREAD_MUTEX_INITIALIZER;

/* Value of element j of grid entry e of kind k (as the format stores it). */
static int grid_value(int k, int e, int j) {
    switch (k) {
    case K_IQ2XXS: return tn_iq_gbyte(tn_iq2xxs_grid[e], j);
    case K_IQ2XS: return tn_iq_gbyte(tn_iq2xs_grid[e], j);
    case K_IQ2S: return tn_iq_gbyte(tn_iq2s_grid[e], j);
    case K_IQ1S: return tn_iq_gsbyte(tn_iq1s_grid[e], j);
    case K_IQ3XXS: return tn_iq_gbyte(tn_iq3xxs_grid[e], j);
    default: return tn_iq_gbyte(tn_iq3s_grid[e], j);
    }
}

static void map_release(tn_iq_map *m) {
    tn_free((void *)m->grid);
    tn_free((void *)m->map);
    tn_free((void *)m->neighbours);
    memset(m, 0, sizeof *m);
}

static tern_status build(int k, tn_iq_map *m) {
    const kind_info *ki = &kinds[k];
    const int dim = ki->dim, gs = ki->grid_size, lmask = (1 << ki->bits) - 1;
    /* 2-bit keys stop at the pattern with every level 2 (0xAAAA), as ggml's table does */
    const int msize = ki->bits == 2 ? 0xAAAA + 2 : 1 << (ki->bits * dim);
    int8_t *grid = tn_malloc((size_t)gs * (size_t)dim);
    int32_t *map = tn_malloc((size_t)msize * sizeof *map);
    int *d2 = tn_malloc((size_t)gs * sizeof *d2);
    size_t cap = (size_t)msize * 8, used = 0;
    uint16_t *nb = tn_malloc(cap * sizeof *nb);
    tern_status s = TERN_OK;
    if (!grid || !map || !d2 || !nb) {
        s = tn_err(TERN_ERR_NOMEM, "iq map: out of memory building the %d-entry grid's search tables", gs);
        goto done;
    }
    for (int i = 0; i < msize; i++) map[i] = -1;
    for (int e = 0; e < gs; e++) {
        int key = 0;
        for (int j = 0; j < dim; j++) {
            const int v = grid_value(k, e, j);
            int l = 0;
            while (l < ki->nlev && ki->lev[l] != v) l++;
            if (l == ki->nlev) {
                s = tn_err(TERN_ERR_INTERNAL, "iq map: grid entry %d holds %d, not a level of its grid", e, v);
                goto done;
            }
            grid[e * dim + j] = (int8_t)(2 * l + 1);
            key |= l << (ki->bits * j);
        }
        map[key] = e;
    }
    for (int key = 0; key < msize; key++) {
        if (map[key] >= 0) continue;
        int8_t pos[8];
        for (int j = 0; j < dim; j++) pos[j] = (int8_t)(2 * (key >> (ki->bits * j) & lmask) + 1);
        for (int e = 0; e < gs; e++) {
            int d = 0;
            for (int j = 0; j < dim; j++) d += (grid[e * dim + j] - pos[j]) * (grid[e * dim + j] - pos[j]);
            d2[e] = d;
        }
        /* the nwant smallest distinct distances, then their entries by distance and index */
        int dist[3], nd = 0;
        for (; nd < ki->nwant; nd++) {
            int best = -1;
            for (int e = 0; e < gs; e++)
                if ((nd == 0 || d2[e] > dist[nd - 1]) && (best < 0 || d2[e] < best)) best = d2[e];
            if (best < 0) break;
            dist[nd] = best;
        }
        if (used + 1 + (size_t)gs > cap) {
            cap = (used + 1 + (size_t)gs) * 2;
            uint16_t *nn = tn_realloc(nb, cap * sizeof *nb);
            if (!nn) {
                s = tn_err(TERN_ERR_NOMEM, "iq map: out of memory for the neighbour lists of a %d-entry grid", gs);
                goto done;
            }
            nb = nn;
        }
        const size_t start = used++;
        for (int i = 0; i < nd; i++)
            for (int e = 0; e < gs; e++)
                if (d2[e] == dist[i]) nb[used++] = (uint16_t)e;
        nb[start] = (uint16_t)(used - start - 1);
        map[key] = -(int32_t)start - 1;
    }
    m->dim = dim, m->bits = ki->bits, m->grid_size = gs, m->map_size = msize;
    m->grid = grid, m->map = map, m->neighbours = nb;
    grid = NULL, map = NULL, nb = NULL;
done:
    tn_free(grid);
    tn_free(map);
    tn_free(nb);
    tn_free(d2);
    return s;
}

static int kind_of(tn_dtype t) {
    switch (t) {
    case TN_IQ2_XXS: return K_IQ2XXS;
    case TN_IQ2_XS: return K_IQ2XS;
    case TN_IQ2_S: return K_IQ2S;
    case TN_IQ1_S:
    case TN_IQ1_M: return K_IQ1S;
    case TN_IQ3_XXS: return K_IQ3XXS;
    case TN_IQ3_S: return K_IQ3S;
    default: return -1;
    }
}

const tn_iq_map *tn_iq_map_get(tn_dtype t) {
    const int k = kind_of(t);
    if (k < 0) return NULL;
    const tn_iq_map *m = atomic_load_explicit(&ready[k], memory_order_acquire);
    if (m) return m;
    pthread_mutex_lock(&build_lock);
    m = atomic_load_explicit(&ready[k], memory_order_relaxed);
    if (!m) {
        if (build(k, &maps[k]) == TERN_OK) {
            m = &maps[k];
            atomic_store_explicit(&ready[k], m, memory_order_release);
        } else {
            map_release(&maps[k]);
        }
    }
    pthread_mutex_unlock(&build_lock);
    return m;
}
