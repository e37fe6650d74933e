/*
 * kv.h — the server's paged KV block manager: fixed-size blocks (TN_KV_BLOCK positions) of the
 * context's cache, a free list, reference counts, and a prefix cache keyed by chained block hashes
 * (hash(parent block, 16 tokens)) so that sequences sharing a prompt prefix share its blocks.
 *
 * Invariants: every block is in exactly one of three states — free (ref 0, not hashed), cached
 * (ref 0, hashed, in the LRU list; may be evicted), in use (ref > 0; hashed if full and
 * published). A hashed block's tokens and parent are stored and compared on lookup, so a hash
 * collision never shares wrong KV. Reservations let the scheduler admit a sequence only when its
 * worst-case block count is guaranteed, so decoding never runs out of blocks.
 * Not thread-safe: owned by the engine thread.
 */
#ifndef TN_SERVE_KV_H
#define TN_SERVE_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "tern/tern.h"

#define TN_KVB 16 /* == TN_KV_BLOCK */

typedef struct tn_kvb_meta {
    int32_t ref;
    int32_t parent;     /* parent block id in the chain (-1 for the first block) */
    uint64_t hash;      /* valid if hashed                                       */
    bool hashed;
    int32_t hnext;      /* next in hash bucket                                    */
    int32_t lru_prev, lru_next; /* LRU list of cached blocks (ref 0, hashed)      */
    int32_t fnext;      /* free list                                              */
    tern_token toks[TN_KVB];
} tn_kvb_meta;

typedef struct tn_kv {
    int32_t n_blocks;
    tn_kvb_meta *b;
    int32_t *buckets; /* [n_buckets] head block id or -1 */
    uint32_t n_buckets;
    int32_t free_head, n_free;
    int32_t lru_head, lru_tail, n_cached; /* head = oldest */
    int32_t n_reserved; /* blocks promised to admitted sequences, not yet allocated */
    uint64_t hits, lookups; /* prefix cache stats (blocks) */
} tn_kv;

tern_status tn_kv_init(tn_kv *kv, int32_t n_blocks);
void tn_kv_free(tn_kv *kv);

/* Blocks that could be handed out now (free + evictable cached) minus outstanding reservations. */
int32_t tn_kv_available(const tn_kv *kv);
/* Blocks in use (ref > 0). */
int32_t tn_kv_used(const tn_kv *kv);

/* Reserves n blocks for later tn_kv_alloc(reserved=true) calls. false if not enough. */
bool tn_kv_reserve(tn_kv *kv, int32_t n);
void tn_kv_unreserve(tn_kv *kv, int32_t n);
/* Takes a block (ref 1), evicting the least recently used cached block if none is free.
 * reserved: consume one reservation. Returns -1 when nothing is available. */
int32_t tn_kv_alloc(tn_kv *kv, bool reserved);
/* Drops one reference; at 0 a hashed block becomes cached (evictable), others free. */
void tn_kv_release(tn_kv *kv, int32_t id);

/* Chained hash of one full block of tokens under a parent hash (0 for the first block). */
uint64_t tn_kv_hash(uint64_t parent_hash, const tern_token *toks);
/* Looks up a full block with these tokens after parent block `parent` (-1 at the start). On a
 * hit takes a reference (reviving a cached block) and returns its id, else -1. */
int32_t tn_kv_lookup(tn_kv *kv, int32_t parent, uint64_t parent_hash, const tern_token *toks);
/* The published block with these tokens after block `parent`, or -1; takes no reference. */
int32_t tn_kv_find(const tn_kv *kv, int32_t parent, uint64_t parent_hash, const tern_token *toks);
/* Drops a cached block (ref 0, published) from the prefix cache: it becomes free. false when the
 * block is in use or not cached. */
bool tn_kv_forget(tn_kv *kv, int32_t id);
/* Publishes a full, computed, in-use block under (parent, toks). No-op if an equal block is
 * already published (then this one stays private). */
void tn_kv_publish(tn_kv *kv, int32_t id, int32_t parent, uint64_t parent_hash, const tern_token *toks);

#endif
