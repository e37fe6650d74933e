/*
 * pcache.h — the prompt cache on disk: KV blocks of TN_KV_BLOCK (16) positions, every layer's K
 * and V, compressed and stored one file per block, so that a later run (or a restarted program)
 * loads a prompt prefix it has seen instead of recomputing it.
 *
 * Key: the chained hash of the block's tokens and every earlier block's (tn_tok_hash, the hash the
 * serve prefix cache chains) in a directory named after the model fingerprint (a hash of the
 * GGUF's bytes: metadata, shapes and tensor data, mixed with the KV row type, the codec and the
 * format version), so other models, cache types and formats never collide.
 *
 * Codec (CacheGen's idea, per layer over the block's 16 tokens; one plane = one layer's K or V):
 *  - lossless: values as f16 bit patterns mapped to an order-preserving code, differenced between
 *    neighbouring tokens in each channel (or kept raw, whichever has the smaller byte entropy),
 *    zigzagged, split into a low- and a high-byte plane; the block goes through zstd. Decoding
 *    gives the same bits (keys as cached: after RoPE).
 *  - high / medium (lossy): keys of a layer that rotates them are first un-rotated (the layer's
 *    RoPE undone at the block's positions, tn_pc_rope_plane) and RoPE is applied again at load:
 *    before RoPE a channel's statistics do not depend on the position (an outlier channel stays
 *    one), so steps fit and deltas between tokens stay small. Then per channel a step
 *    s = min(rms(plane) / div * (rms(channel) / rms(plane))^-tilt * w^-wexp, rms(channel) / div_ch)
 *    (div, tilt, div_ch, wexp: K's or V's, finer on the first layers: tn_pc_steps; w: how much the
 *    channel's error moves the model, from its weights: tn_pc_channel_weights), on a grid of eighth-octaves at or under it, integers
 *    c = round(x / s) (decoded x' = c * s: |x - x'| <= s / 2 before RoPE is re-applied and the
 *    result rounded to f16). The plane term gives every channel the same absolute error (what q.k
 *    and the attention-weighted sum of V see, so the bits go where the values are large); the
 *    channel term keeps small channels from being rounded to zero. The channels' step indices (as
 *    changes from channel to channel) and then the integers, channel by channel, as deltas between
 *    neighbouring tokens or raw (for the whole plane or chosen per channel, whichever codes
 *    smaller), go through an adaptive binary range coder (core/rc.h): zero flag, sign and
 *    Elias-gamma magnitude, with models chosen by the previous value's size and carried from
 *    plane to plane of a block (tn_pc_models). A plane holding a non-finite value, or one that
 *    codes larger than losslessly, is stored losslessly (keys as cached, after RoPE).
 * File (little-endian): header (TN_PC_HDR bytes, see pcache.c), the block's 16 token ids, the
 * zstd payload, a CRC-32 of everything before it. Files are written to a temp name and renamed
 * (fsync'd); a reader verifies size, CRC, magic, version, fingerprint, dimensions, both prefix
 * hashes and the tokens before using a file; anything wrong is skipped with a warning (tn_log)
 * and the tokens are recomputed. The directory is bounded (max_bytes, LRU by mtime: a load
 * touches its files). A full disk (ENOSPC, EDQUOT) turns storing off with one warning.
 *
 * A quantized cache (-ctk/-ctv q8_0, q4_0, tq<b>, rotated or not) is stored the same way: lossless
 * keeps its rows' bytes as they are in memory (a plane of mode ROWS, then zstd), so a load gives
 * the same bits; a lossy quality codes the rows' values (converted to f32 and un-rotated) with the
 * codec above (or keeps the rows where they are smaller: a q4_0 or tq cache at `high`) and a load
 * quantizes the decoded values into rows as the forward pass writes them.
 * The row types and rotation are part of the fingerprint: each combination has its own files.
 * Works on a CPU context without a sliding-window ring (tern generate, tern chat, tern serve);
 * tn_pcache_usable says why not otherwise. Built without libzstd (TERN_HAVE_ZSTD undefined),
 * tn_pcache_open returns TERN_ERR_UNSUPPORTED. Not thread-safe: one tn_pcache per thread; several
 * processes may share a directory (each file is written whole by rename).
 */
#ifndef TN_MODEL_PCACHE_H
#define TN_MODEL_PCACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/fp16.h"
#include "core/rc.h"
#include "model/model.h"
#include "tern/tern.h"

#define TN_PC_VERSION 3 /* 3: lossy key planes coded before RoPE; 2: after it (refused: recomputed) */
#define TN_PC_HASH_SEED 2 /* tn_pc_model_hash's seed: fixed (slot files keep their model hash) */
#define TN_PC_ROW_F16 1 /* KV row word of a block of f16 K and V rows (tn_pc_row_word)          */
#define TN_PC_NTOK 16   /* == TN_KV_BLOCK                                                     */

/* The value is stored in every file header (so BALANCED, added later, comes after MEDIUM); from
 * the finest: lossless, high, balanced, medium. */
typedef enum tn_pc_quality { TN_PC_LOSSLESS = 0, TN_PC_HIGH = 1, TN_PC_MEDIUM = 2, TN_PC_BALANCED = 3 } tn_pc_quality;
#define TN_PC_N_QUALITY 4
/* A quality's name as the flags and subdirectories spell it ("lossless", "high", "balanced",
 * "medium"), and back (-1: no such name). */
const char *tn_pc_quality_name(tn_pc_quality q);
int tn_pc_quality_from_name(const char *name);

/* Chained hash of one block of 16 tokens under a parent hash (0 for the first block); seed
 * selects one of independent chains (the serve prefix cache and the file key use seed 0). */
uint64_t tn_tok_hash(uint64_t seed, uint64_t parent_hash, const tern_token *toks);

/* CRC-32 (IEEE, zlib's) of p[0..n): the trailer of cache files (and of tern serve's slot files). */
uint32_t tn_pc_crc32(const uint8_t *p, size_t n);
/* A 64-bit hash of the model's GGUF bytes (metadata, shapes, tensor data); reads every byte. */
uint64_t tn_pc_model_hash(const tern_model *m);

/* ---- codec of one plane: [16][kv_dim] f16 values (one layer's K or V of a block) ---------- */
/* A lossy quality's steps: per K (0) and V (1) plane, steps per RMS of the plane (div) and of the
 * channel (div_ch; 0: no channel term); tilt leans the plane term by the channel's size: a
 * channel's plane step is rms(plane) / div * (rms(channel) / rms(plane))^-tilt (0: the same for
 * every channel; > 0: larger channels finer); on layers il < n_first all are mul_first times finer.
 * keys_pre_rope codes lossy keys before RoPE (undone at store, re-applied at load; bench/pcache_quality
 * --pre-rope compares): no gain on the default model and twice the KL divergence on stories260K,
 * so the built-in qualities code keys as cached, after RoPE.
 * Chosen with bench/pcache_quality on tuning windows (docs/prompt-cache.md): high at the KL
 * divergence of the q8_0 cache type, balanced at a fifth of the q8_0 bound (0.001) 4.4x
 * smaller than f16, medium under q4_0's at 8x smaller (default model).
 * The steps travel in the planes: a file decodes whatever steps wrote it. */
typedef struct tn_pc_steps {
    float div[2], div_ch[2];
    float mul_first;
    int32_t n_first;
    bool keys_pre_rope;
    float tilt[2];
    float wexp[2]; /* K, V: the plane term times w^-wexp, w the channel's weight (tn_pc_channel_weights) */
} tn_pc_steps;
/* The steps of quality q (lossless: all zero). */
tn_pc_steps tn_pc_steps_of(tn_pc_quality q);
/* How much an error in each cached channel moves the model, from its weights (no data needed):
 * w[il][kv][kv_dim] (kv 0 K, 1 V), per plane scaled to a geometric mean of 1. K channel j of KV
 * head g: sqrt(sum over the query heads h reading g of E[q_{h,j}^2]) (a key's error e moves the
 * score q.e), E[q_j^2] taken as |W_q row j (.) attn_norm|^2 (the normed input's channels as
 * independent with the norm's weights as scales), times q_norm_j^2 / the head's mean where the
 * layer norms its queries; on a rotated layer both channels of a RoPE pair get their mean (RoPE
 * moves a query's energy between them). V channel j of head g: sqrt(sum over h of |W_o column
 * (h, j)|^2) (the output projection reads it). Weights under 1/1024 of the plane's largest are
 * raised to it; a layer without the tensor gets 1s. NOMEM or TERN_OK. */
tern_status tn_pc_channel_weights(const tern_model *m, float *w);
/* Steps per RMS for plane kv (0 K, 1 V) of layer il: of the plane (ch false) or the channel. */
float tn_pc_div(const tn_pc_steps *st, int kv, int32_t il, bool ch);
/* Whether layer il's cached keys are rotated per head by RoPE (lossy key planes are coded before
 * it): not on NoPE layers, not in an MLA latent cache, not without rotated dimensions. */
bool tn_pc_layer_roped(const tn_hparams *hp, int32_t il);
/* Applies (dir +1) or undoes (dir -1) layer il's RoPE on a key plane x[16][n_head_kv * head_dim]
 * of positions pos0 .. pos0 + 15, as the forward pass rotates keys (tn_op_rope_cache with the
 * layer's base and scale and the context's frequency factors ff, then tn_op_rope); undoing divides
 * by the rotation's scale (YaRN's or rope_attn_factor's mscale), so dir -1 then +1 is the identity
 * up to float rounding. cs: room for n_rot floats. */
void tn_pc_rope_plane(const tn_hparams *hp, const float *ff, int32_t il, int64_t pos0, float *x, float *cs, int dir);
/* Largest encoded size of a plane. */
size_t tn_pc_plane_max(int64_t kv_dim);
/* The range coder's adaptive integer models, carried from plane to plane of one block (K planes
 * in one set, V planes in another, deltas and raw values apart), so a block's later layers code
 * with what its earlier ones taught; initialised per block, used in the same plane order by the
 * encoder and the decoder. */
#define TN_PC_NCTX 4
typedef struct tn_pc_models {
    tn_rc_int_model m[2][2][TN_PC_NCTX + 1]; /* [K, V][deltas, raw][context; the steps' model] */
    tn_rc_prob raw_ch[2];                    /* [K, V] a channel's raw flag in a mixed plane */
} tn_pc_models;
void tn_pc_models_init(tn_pc_models *m);
/* Encodes x[16][kv_dim], the K (kv 0) or V (kv 1) plane of layer il, into out
 * (tn_pc_plane_max bytes of room) at quality q with its steps, updating mod (NULL: lossless only);
 * keys as given (no RoPE undone: tn_pcache_store does that); returns the bytes written (0: out of
 * memory). */
size_t tn_pc_plane_encode(tn_pc_quality q, int32_t il, int kv, tn_pc_models *mod, const tn_fp16 *x, int64_t kv_dim, uint8_t *out);
/* Lossy only: x[16][kv_dim] in f32 with the steps st and the plane's channel weights w[kv_dim]
 * (NULL: all 1; tn_pc_channel_weights); pre_rope marks keys coded before RoPE (the
 * decoder reports it: the caller re-applies RoPE). 0: not coded (a non-finite value, larger than
 * a lossless plane, out of memory): the caller stores the plane losslessly. */
size_t tn_pc_plane_encode_lossy(const tn_pc_steps *st, int32_t il, int kv, tn_pc_models *mod, const float *x, const float *w,
                                int64_t kv_dim, bool pre_rope, uint8_t *out);
/* Decodes a plane from in[0..n) into x[16][kv_dim]; *used gets the bytes read. FORMAT when the
 * bytes are not a plane of this size (or are lossy and mod is NULL, or are keys before RoPE:
 * those need tn_pc_plane_decode_f32). */
tern_status tn_pc_plane_decode(const uint8_t *in, size_t n, int64_t kv_dim, int kv, tn_pc_models *mod, tn_fp16 *x,
                               size_t *used);
/* The same, and a lossy plane's values also in f32 into xf[16][kv_dim] (c * s, before f16
 * rounding); *pre_rope: the plane holds keys before RoPE, x is not written (the caller rotates xf
 * and rounds it to f16). */
tern_status tn_pc_plane_decode_f32(const uint8_t *in, size_t n, int64_t kv_dim, int kv, tn_pc_models *mod, tn_fp16 *x,
                                   float *xf, bool *pre_rope, size_t *used);

/* ---- the cache -------------------------------------------------------------------------- */
typedef struct tn_pcache tn_pcache;

typedef struct tn_pcache_stats {
    int64_t blocks_loaded, blocks_stored, blocks_skipped; /* skipped: files found bad       */
    int64_t blocks_evicted;
    uint64_t bytes_loaded, bytes_stored;                  /* on disk (file sizes)          */
    double load_s, store_s;                               /* time spent reading / writing  */
    bool store_off;                                       /* a full disk stopped storing    */
    uint64_t f16_bytes_per_token;                         /* K and V of every layer in f16   */
    int64_t planes_pre_rope;                              /* key planes stored before RoPE   */
    int64_t blocks_dropped;                               /* not stored: the writer's queue was full */
} tn_pcache_stats;

/* Opens (creates) dir and the subdirectory of the model and of c's KV rows (their types and
 * rotation, tn_pc_row_word; c NULL: f16 rows); max_bytes 0 = unbounded. Hashes the model's GGUF
 * (its bytes are read once). Statuses: UNSUPPORTED (built without zstd), IO (dir). The cache then
 * serves contexts with those rows only (tn_pcache_usable). */
tern_status tn_pcache_open(const tern_model *m, const tern_ctx *c, const char *dir, uint64_t max_bytes, tn_pc_quality q,
                           tn_pcache **out);
/* The word a file's header and the fingerprint carry for c's KV rows: TN_PC_ROW_F16 for f16 K and
 * V (c NULL too), else type_k | type_v << 12 | rot_k << 24 | rot_v << 25. */
uint32_t tn_pc_row_word(const tern_ctx *c);
/* Replaces a lossy cache's steps (bench/pcache_quality's sweeps; the files decode anywhere). */
void tn_pcache_set_steps(tn_pcache *pc, const tn_pc_steps *st);
void tn_pcache_free(tn_pcache *pc);
/* The model subdirectory (for messages and tests). */
const char *tn_pcache_subdir(const tn_pcache *pc);
/* TERN_OK when c can use the cache, else UNSUPPORTED naming the reason. */
tern_status tn_pcache_usable(const tn_pcache *pc, const tern_ctx *c);
/* Loads cached blocks of hist[0..n) into c, starting at the block at c's n_past (which must be
 * a multiple of 16; otherwise nothing is loaded), up to the last whole block that leaves at
 * least one token of hist to compute (its logits are needed). Stops at the first missing or bad
 * block, or when the cost model says recomputing the rest is cheaper (prefill_tok_s: measured
 * prefill speed, 0 = unknown: load). Advances c's n_past; *n_loaded = tokens loaded. */
tern_status tn_pcache_load(tn_pcache *pc, tern_ctx *c, const tern_token *hist, int32_t n, double prefill_tok_s,
                           int32_t *n_loaded);
/* Stores every whole block of hist[0..min(n, n_past)) that is not on disk yet. Failures are
 * warnings (storing is never fatal): returns TERN_OK unless the arguments are wrong. */
tern_status tn_pcache_store(tn_pcache *pc, const tern_ctx *c, const tern_token *hist, int32_t n);
/* A paged cache (tern serve): the chain of hashes up to and including a block, advanced block by
 * block from {0, 0}; loading block bi of a prompt into cache block dst (NOT_FOUND: absent, FORMAT:
 * bad, warned and counted) and storing block bi from cache block src (unless on disk; failures
 * are warnings). The caller has checked tn_pcache_usable. */
typedef struct tn_pc_chain {
    uint64_t h, h2;
} tn_pc_chain;
void tn_pc_chain_next(tn_pc_chain *ch, const tern_token *toks);
tern_status tn_pcache_load_block(tn_pcache *pc, tern_ctx *c, int32_t bi, tn_pc_chain chain, const tern_token *toks, int32_t dst);
/* Seconds the last tn_pcache_load_block spent loading (read, check, decode; not waiting for the
 * writer): the caller's cost model. */
double tn_pcache_last_load_s(const tn_pcache *pc);
tern_status tn_pcache_store_block(tn_pcache *pc, const tern_ctx *c, int32_t bi, tn_pc_chain chain, const tern_token *toks,
                                  int32_t src);
/* Stores in the background (tern serve): from now on tn_pcache_store_block copies the block's rows
 * from c's cache (the cache block may be reused at once) into a queue of at most max_queue_bytes
 * and returns; a thread of the cache encodes, compresses and writes them in order. A block that
 * would pass the bound is not stored (stats blocks_dropped). Loads and the writer's stores then take
 * turns on the cache's lock. tn_pcache_free writes what is queued before it returns; c must live
 * until then. Only store_block and load_block may be called while it runs (with tn_pcache_flush);
 * read the stats after tn_pcache_flush. NOMEM if the thread cannot start (stores stay in the
 * caller's thread), UNSUPPORTED without zstd. */
tern_status tn_pcache_start_writer(tn_pcache *pc, const tern_ctx *c, size_t max_queue_bytes);
/* Waits until every queued block is written (no writer: returns at once). */
void tn_pcache_flush(tn_pcache *pc);
/* Prefill speed remembered in the model subdirectory by tn_pcache_note_prefill (0: none yet). */
double tn_pcache_prefill_speed(const tn_pcache *pc);
void tn_pcache_note_prefill(tn_pcache *pc, int32_t n_tokens, double seconds);
/* A line about the last load decision (cost model), for -v. */
const char *tn_pcache_decision(const tn_pcache *pc);
const tn_pcache_stats *tn_pcache_get_stats(const tn_pcache *pc);
/* A copy of the stats that is safe while the writer runs (another thread may call it: it waits
 * for a block being stored or loaded). */
void tn_pcache_stats_copy(tn_pcache *pc, tn_pcache_stats *out);

#endif
