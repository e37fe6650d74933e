/*
 * slot.h — tern serve's slot files (POST /slots/{id}?action=save|restore, llama-server's API): the
 * whole 16-token blocks a slot holds, their tokens and every layer's K and V, in one file. The
 * block encoding is the prompt cache's (model/pcache.h): f16 rows go through the lossless plane
 * codec (same bits back), q8_0 / q4_0 rows are stored as they are; each block is one zstd frame.
 *
 * File (little-endian), written whole to a temp name and renamed (tn_wfile):
 *     0 "TNSL"   4 u32 version   8 u64 model hash (tn_pc_model_hash: the GGUF's bytes)
 *    16 u32 K row type   20 u32 V row type (TN_F16, TN_Q8_0, TN_Q4_0, tq<b>g32a; bit 16: rotated)   24 u32 n_layer
 *    28 u32 kv_dim   32 u32 tokens per block (16)   36 u32 n_blocks   40 u64 K row bytes
 *    48 u64 V row bytes   56 u64 body bytes (from 64 to the CRC)
 *    64 i32 tokens[16 * n_blocks], then per block: u32 raw bytes, u32 frame bytes, zstd frame
 *   end u32 CRC-32 of every byte before it
 * A reader checks size, CRC, magic, version, model hash, row types, dimensions and every frame's
 * bounds before a byte reaches the KV cache (tn_slot_read), and each frame's decoded size
 * (tn_slot_unpack). Needs libzstd (TERN_HAVE_ZSTD); without it both answer UNSUPPORTED.
 */
#ifndef TN_SERVE_SLOT_H
#define TN_SERVE_SLOT_H

#include <stddef.h>
#include <stdint.h>

#include "tern/tern.h"

#define TN_SLOT_VERSION 1
#define TN_SLOT_HDR 64

/* A verified slot file in memory. */
typedef struct tn_slot_img {
    uint8_t *buf;          /* the whole file                                                 */
    size_t n;
    int32_t n_blocks;
    tern_token *toks;      /* [16 * n_blocks]                                                */
    size_t *frame;         /* [n_blocks] offset of each block's frame header in buf          */
} tn_slot_img;

/* Writes the blocks ids[0..n_blocks) of c's paged cache (tokens toks[0..16 * n_blocks)) to path
 * atomically; *n_written: the file's bytes. FORMAT when c's cache cannot be saved (GPU), IO with
 * the path and errno. */
tern_status tn_slot_write(const tern_ctx *c, uint64_t model_hash, const char *path, const tern_token *toks, int32_t n_blocks,
                          const int32_t *ids, uint64_t *n_written);
/* Reads and verifies path against c and model_hash (at most max_blocks blocks). NOT_FOUND when
 * absent; FORMAT naming the first thing wrong; NOMEM. img is empty on failure. */
tern_status tn_slot_read(const tern_ctx *c, uint64_t model_hash, const char *path, int32_t max_blocks, tn_slot_img *img);
/* Decodes block j of img into cache block dst of c. FORMAT when its frame does not decode to the
 * exact planes of one block (dst is then partly written). */
tern_status tn_slot_unpack(tern_ctx *c, const tn_slot_img *img, int32_t j, int32_t dst);
void tn_slot_img_free(tn_slot_img *img);
/* Name of a slot file's KV word t for messages ("f16", "q8_0 rotated", "tq3", ...; "unknown"),
 * written into buf (or a constant). */
const char *tn_slot_kv_name(uint32_t t, char buf[32]);

#endif
