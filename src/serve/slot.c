/*
 * slot.c — tern serve's slot files (slot.h): encode a slot's KV blocks with the prompt cache's
 * codec into one file written atomically; read one back, trusting nothing until it is verified.
 */
#include "serve/slot.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base.h"
#include "core/file.h"
#include "core/le.h"
#include "model/ctx.h"
#include "model/pcache.h"
#include "tensor/dtype.h"

#ifdef TERN_HAVE_ZSTD
#include <zstd.h>
#endif

#define SLOT_MAGIC "TNSL"
#define SLOT_ZLEVEL 3


/* A cache half's type word in the header: the type, bit 16 set when its heads are rotated
 * (tern_ctx_params kv_rotate): a rotated slot never loads into an unrotated cache or back. */
#define SLOT_ROT 0x10000u
static uint32_t slot_kv_word(uint32_t type, bool rot) { return type | (rot ? SLOT_ROT : 0); }

const char *tn_slot_kv_name(uint32_t t, char buf[32]) {
    const char *n = tern_kv_type_name((int32_t)(t & ~SLOT_ROT));
    if (!n) return "unknown";
    snprintf(buf, 32, "%s%s", n, t & SLOT_ROT ? " rotated" : "");
    return buf;
}

static int64_t kv_dim_of(const tern_ctx *c) { return (int64_t)c->hp.n_head_kv * c->hp.head_dim; }

/* Bytes of one block's K (kv = 0) or V (kv = 1) of a layer once encoded, at most. */
static size_t part_max(const tern_ctx *c, int kv) {
    const int32_t t = kv ? c->type_v : c->type_k;
    return t == TN_F16 ? tn_pc_plane_max(kv_dim_of(c)) : (size_t)TN_PC_NTOK * (kv ? c->v_rb : c->k_rb);
}
static size_t raw_max(const tern_ctx *c) { return (size_t)c->hp.n_layer * (part_max(c, 0) + part_max(c, 1)); }

/* Rows of block b of layer il (K or V). */
static uint8_t *block_rows(const tern_ctx *c, int kv, int32_t il, int32_t b) {
    const size_t rb = kv ? c->v_rb : c->k_rb;
    return (kv ? c->v_cache : c->k_cache) + ((size_t)c->kv_off[il] + (size_t)b * TN_PC_NTOK) * rb;
}

void tn_slot_img_free(tn_slot_img *img) {
    tn_free(img->buf);
    tn_free(img->toks);
    tn_free(img->frame);
    memset(img, 0, sizeof *img);
}

#ifdef TERN_HAVE_ZSTD
/* Encodes block b of c (every layer's K then V) into out (raw_max bytes); returns the bytes. */
static size_t encode_block(const tern_ctx *c, int32_t b, uint8_t *out) {
    size_t o = 0;
    for (int32_t il = 0; il < c->hp.n_layer; il++)
        for (int kv = 0; kv < 2; kv++) {
            const uint8_t *rows = block_rows(c, kv, il, b);
            if ((kv ? c->type_v : c->type_k) == TN_F16) {
                const size_t k = tn_pc_plane_encode(TN_PC_LOSSLESS, il, kv, NULL, (const tn_fp16 *)rows, kv_dim_of(c), out + o);
                if (!k) return 0;
                o += k;
            } else {
                memcpy(out + o, rows, part_max(c, kv));
                o += part_max(c, kv);
            }
        }
    return o;
}
#endif

tern_status tn_slot_write(const tern_ctx *c, uint64_t model_hash, const char *path, const tern_token *toks, int32_t n_blocks,
                          const int32_t *ids, uint64_t *n_written) {
    *n_written = 0;
#ifndef TERN_HAVE_ZSTD
    (void)c, (void)model_hash, (void)path, (void)toks, (void)n_blocks, (void)ids, (void)block_rows, (void)raw_max;
    return tn_err(TERN_ERR_UNSUPPORTED, "slot files: this tern was built without libzstd (install libzstd-dev and rebuild)");
#else
    const size_t rmax = raw_max(c), fmax = ZSTD_compressBound(rmax);
    const size_t head = TN_SLOT_HDR + (size_t)n_blocks * TN_PC_NTOK * 4;
    uint8_t *raw = tn_malloc(rmax);
    size_t cap = head + (size_t)(n_blocks > 0 ? 1 : 0) * (8 + fmax) + 4, n = head;
    uint8_t *f = tn_malloc(cap);
    tern_status s = raw && f ? TERN_OK : tn_err(TERN_ERR_NOMEM, "slot save: out of memory");
    for (int32_t j = 0; !s && j < n_blocks; j++) {
        const size_t rn = encode_block(c, ids[j], raw);
        if (!rn) {
            s = tn_err(TERN_ERR_NOMEM, "slot save: out of memory");
            break;
        }
        if (n + 8 + fmax + 4 > cap) {
            size_t nc = 2 * cap > n + 8 + fmax + 4 ? 2 * cap : n + 8 + fmax + 4;
            uint8_t *g = tn_realloc(f, nc);
            if (!g) {
                s = tn_err(TERN_ERR_NOMEM, "slot save: out of memory");
                break;
            }
            f = g, cap = nc;
        }
        const size_t z = ZSTD_compress(f + n + 8, fmax, raw, rn, SLOT_ZLEVEL);
        if (ZSTD_isError(z)) {
            s = tn_err(TERN_ERR_INTERNAL, "slot save: zstd: %s", ZSTD_getErrorName(z));
            break;
        }
        tn_put_le32(f + n, (uint32_t)rn);
        tn_put_le32(f + n + 4, (uint32_t)z);
        n += 8 + z;
    }
    if (!s) {
        memcpy(f, SLOT_MAGIC, 4);
        tn_put_le32(f + 4, TN_SLOT_VERSION);
        tn_put_le64(f + 8, model_hash);
        tn_put_le32(f + 16, slot_kv_word((uint32_t)c->type_k, c->rot_k));
        tn_put_le32(f + 20, slot_kv_word((uint32_t)c->type_v, c->rot_v));
        tn_put_le32(f + 24, (uint32_t)c->hp.n_layer);
        tn_put_le32(f + 28, (uint32_t)kv_dim_of(c));
        tn_put_le32(f + 32, TN_PC_NTOK);
        tn_put_le32(f + 36, (uint32_t)n_blocks);
        tn_put_le64(f + 40, c->k_rb);
        tn_put_le64(f + 48, c->v_rb);
        tn_put_le64(f + 56, n - TN_SLOT_HDR);
        for (size_t t = 0; t < (size_t)n_blocks * TN_PC_NTOK; t++) tn_put_le32(f + TN_SLOT_HDR + 4 * t, (uint32_t)toks[t]);
        tn_put_le32(f + n, tn_pc_crc32(f, n));
        n += 4;
        tn_wfile w;
        if (!(s = tn_wfile_open(path, &w))) {
            tn_wfile_write(&w, f, n);
            s = tn_wfile_commit(&w);
        }
        if (!s) *n_written = n;
    }
    tn_free(raw);
    tn_free(f);
    return s;
#endif
}

tern_status tn_slot_read(const tern_ctx *c, uint64_t model_hash, const char *path, int32_t max_blocks, tn_slot_img *img) {
    memset(img, 0, sizeof *img);
#ifndef TERN_HAVE_ZSTD
    (void)c, (void)model_hash, (void)path, (void)max_blocks;
    return tn_err(TERN_ERR_UNSUPPORTED, "slot files: this tern was built without libzstd (install libzstd-dev and rebuild)");
#else
    const size_t fmax = ZSTD_compressBound(raw_max(c));
    const uint64_t most = TN_SLOT_HDR + (uint64_t)max_blocks * (TN_PC_NTOK * 4 + 8 + fmax) + 4;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? tn_err(TERN_ERR_NOT_FOUND, "no such file") : tn_err(TERN_ERR_IO, "%s", strerror(errno));
    struct stat sb;
    tern_status s = TERN_OK;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) s = tn_err(TERN_ERR_FORMAT, "not a regular file");
    else if ((uint64_t)sb.st_size < TN_SLOT_HDR + 4 || (uint64_t)sb.st_size > most)
        s = tn_err(TERN_ERR_FORMAT, "size %lld bytes is outside %d..%llu (a slot of %d blocks)", (long long)sb.st_size,
                   TN_SLOT_HDR + 4, (unsigned long long)most, max_blocks);
    const size_t n = s ? 0 : (size_t)sb.st_size;
    uint8_t *b = s ? NULL : tn_malloc(n);
    if (!s && !b) s = tn_err(TERN_ERR_NOMEM, "out of memory for %zu bytes", n);
    for (size_t got = 0; !s && got < n;) {
        ssize_t r = read(fd, b + got, n - got);
        if (r <= 0) s = tn_err(TERN_ERR_FORMAT, "read failed at byte %zu of %zu", got, n);
        else got += (size_t)r;
    }
    close(fd);
    if (s) {
        tn_free(b);
        return s;
    }
    img->buf = b, img->n = n;
    const uint32_t tk = tn_get_le32(b + 16), tv = tn_get_le32(b + 20), nb = tn_get_le32(b + 36);
    char nm[4][32]; /* the four type names of a mismatch */
    if (memcmp(b, SLOT_MAGIC, 4)) s = tn_err(TERN_ERR_FORMAT, "not a tern slot file (bad magic)");
    else if (tn_get_le32(b + 4) != TN_SLOT_VERSION)
        s = tn_err(TERN_ERR_FORMAT, "format version %u (this tern reads %d)", tn_get_le32(b + 4), TN_SLOT_VERSION);
    else if (tn_get_le64(b + 56) != n - TN_SLOT_HDR - 4)
        s = tn_err(TERN_ERR_FORMAT, "body of %llu bytes in a file of %zu (truncated?)", (unsigned long long)tn_get_le64(b + 56), n);
    else if (tn_get_le32(b + n - 4) != tn_pc_crc32(b, n - 4)) s = tn_err(TERN_ERR_FORMAT, "CRC-32 mismatch (the file is damaged)");
    else if (tn_get_le64(b + 8) != model_hash)
        s = tn_err(TERN_ERR_FORMAT, "saved from another model (fingerprint %016llx, this server's model is %016llx)",
                   (unsigned long long)tn_get_le64(b + 8), (unsigned long long)model_hash);
    else if (tk != slot_kv_word((uint32_t)c->type_k, c->rot_k) || tv != slot_kv_word((uint32_t)c->type_v, c->rot_v))
        s = tn_err(TERN_ERR_FORMAT, "holds a %s/%s KV cache, this server's is %s/%s (-ctk/-ctv, --kv-rotate)", tn_slot_kv_name(tk, nm[0]),
                   tn_slot_kv_name(tv, nm[1]), tn_slot_kv_name(slot_kv_word((uint32_t)c->type_k, c->rot_k), nm[2]),
                   tn_slot_kv_name(slot_kv_word((uint32_t)c->type_v, c->rot_v), nm[3]));
    else if (tn_get_le32(b + 24) != (uint32_t)c->hp.n_layer || tn_get_le32(b + 28) != (uint32_t)kv_dim_of(c) || tn_get_le32(b + 32) != TN_PC_NTOK ||
             tn_get_le64(b + 40) != c->k_rb || tn_get_le64(b + 48) != c->v_rb)
        s = tn_err(TERN_ERR_FORMAT, "layer count, KV width or block size differ from this model's");
    else if (nb > (uint32_t)max_blocks)
        s = tn_err(TERN_ERR_FORMAT, "%u blocks (%u tokens) do not fit a slot of %d tokens", nb, nb * TN_PC_NTOK, max_blocks * TN_PC_NTOK);
    size_t o = TN_SLOT_HDR + (size_t)nb * TN_PC_NTOK * 4;
    if (!s && o > n - 4) s = tn_err(TERN_ERR_FORMAT, "%u blocks' tokens run past the end", nb);
    if (!s) {
        img->n_blocks = (int32_t)nb;
        img->toks = tn_malloc(((size_t)nb * TN_PC_NTOK + 1) * sizeof *img->toks);
        img->frame = tn_malloc(((size_t)nb + 1) * sizeof *img->frame);
        if (!img->toks || !img->frame) s = tn_err(TERN_ERR_NOMEM, "out of memory");
    }
    for (size_t t = 0; !s && t < (size_t)nb * TN_PC_NTOK; t++) img->toks[t] = (tern_token)tn_get_le32(b + TN_SLOT_HDR + 4 * t);
    for (uint32_t j = 0; !s && j < nb; j++) { /* frame bounds */
        if (o + 8 > n - 4 || tn_get_le32(b + o + 4) > n - 4 - o - 8) {
            s = tn_err(TERN_ERR_FORMAT, "block %u's frame runs past the end", j);
            break;
        }
        img->frame[j] = o;
        o += 8 + tn_get_le32(b + o + 4);
    }
    if (!s && o != n - 4) s = tn_err(TERN_ERR_FORMAT, "%zu bytes after the last block", n - 4 - o);
    if (s) tn_slot_img_free(img);
    return s;
#endif
}

tern_status tn_slot_unpack(tern_ctx *c, const tn_slot_img *img, int32_t j, int32_t dst) {
#ifndef TERN_HAVE_ZSTD
    (void)c, (void)img, (void)j, (void)dst;
    return tn_err(TERN_ERR_UNSUPPORTED, "slot files: this tern was built without libzstd");
#else
    const uint8_t *h = img->buf + img->frame[j];
    const size_t rmax = raw_max(c), rn = tn_get_le32(h);
    if (rn > rmax) return tn_err(TERN_ERR_FORMAT, "block %d: %zu raw bytes, at most %zu", j, rn, rmax);
    uint8_t *raw = tn_malloc(rn ? rn : 1);
    if (!raw) return tn_err(TERN_ERR_NOMEM, "slot restore: out of memory");
    const size_t got = ZSTD_decompress(raw, rn, h + 8, tn_get_le32(h + 4));
    tern_status s = TERN_OK;
    if (ZSTD_isError(got)) s = tn_err(TERN_ERR_FORMAT, "block %d: zstd: %s", j, ZSTD_getErrorName(got));
    else if (got != rn) s = tn_err(TERN_ERR_FORMAT, "block %d: decoded to %zu bytes, header says %zu", j, got, rn);
    size_t o = 0;
    for (int32_t il = 0; !s && il < c->hp.n_layer; il++)
        for (int kv = 0; !s && kv < 2; kv++) {
            uint8_t *rows = block_rows(c, kv, il, dst);
            if ((kv ? c->type_v : c->type_k) == TN_F16) {
                size_t used = 0;
                s = tn_pc_plane_decode(raw + o, rn - o, kv_dim_of(c), kv, NULL, (tn_fp16 *)rows, &used);
                o += used;
            } else if (rn - o < part_max(c, kv)) {
                s = tn_err(TERN_ERR_FORMAT, "block %d: layer %d ends early", j, il);
            } else {
                memcpy(rows, raw + o, part_max(c, kv));
                o += part_max(c, kv);
            }
        }
    if (!s && o != rn) s = tn_err(TERN_ERR_FORMAT, "block %d: %zu bytes after the last layer", j, rn - o);
    tn_free(raw);
    return s;
#endif
}
