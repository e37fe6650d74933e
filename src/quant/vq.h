/*
 * vq.h — tern's vector-quantized codebook type vq2 (VPTQ-style): weights in 4-vectors replaced by
 * 8-bit indices into a 256-entry int8 codebook learned per tensor, with a scale per 32 weights.
 *
 * Tensor (docs/formats.md has the diagram): rows, then the codebook (1024 bytes).
 *   row      u32 hdr | block[ne0 / 256]          hdr = bytes from the row to the codebook
 *   block    fp16 d | u8 sc[4] | u8 qs[64]       70 bytes per 256 weights (2.1875 bpw)
 *   codebook int8 cb[4][256]                     position-major: cb[p][i] = component p of entry i
 * In a block, vector j (0..63) holds the weights j, j + 64, j + 128, j + 192 (component p is
 * weight 64 p + j), so a lookup of the 64 indices in table p lands weight by weight where the 64
 * q8_K activation bytes 64 p .. 64 p + 63 are: no shuffles between the lookup and the dot product.
 * Vectors 8g .. 8g + 7 (g = 0..7) share the 4-bit scale s_g = sc[g / 2] >> 4 (g % 2) & 15:
 *   weight 64 p + j = fp16(d) * (2 s_{j/8} + 1) * cb[p][qs[j]]
 * The row header makes every row self-describing (a view of some rows, or a single row handed to
 * a kernel, still finds its codebook); the GGUF reader checks every header against the layout.
 *
 * Dot products run against q8_K activations (256 per block); k must be a multiple of 256.
 * Quantization is per tensor (the codebook is fitted to all its rows), see tn_vq_fit_codebook.
 */
#ifndef TN_QUANT_VQ_H
#define TN_QUANT_VQ_H

#include "core/fp16.h"
#include "tensor/dtype.h"

#define TN_VQ_QK 256      /* weights per block                  */
#define TN_VQ_DIM 4       /* vector length                      */
#define TN_VQ_K 256       /* codebook entries                   */
#define TN_VQ_NV 64       /* vectors per block                  */
#define TN_VQ_GROUP 8     /* vectors per scale (32 weights)     */
#define TN_VQ_HDR 4       /* row header bytes                   */
#define TN_VQ_CB_BYTES (TN_VQ_DIM * TN_VQ_K)

typedef struct block_vq2 {
    tn_fp16 d;                         /* block scale                                   */
    uint8_t sc[TN_VQ_NV / TN_VQ_GROUP / 2]; /* 4-bit group scales, low nibble = even group */
    uint8_t qs[TN_VQ_NV];              /* codebook index of each vector                 */
} block_vq2;
_Static_assert(sizeof(block_vq2) == 70, "block_vq2: 2 + 4 + 64 bytes (2.1875 bits per weight)");

static inline bool tn_vq_is(uint32_t t) { return t >= TN_DTYPE_VQ_BASE && t < TN_DTYPE_VQ_BASE + TN_DTYPE_VQ_COUNT; }

/* The codebook of the tensor that row `row` belongs to (its header's offset). */
static inline const int8_t *tn_vq_codebook(const void *row) {
    const uint8_t *p = (const uint8_t *)row;
    const uint32_t off = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return (const int8_t *)(p + off);
}
/* Group g's scale multiplier 2 s_g + 1 of block b. */
static inline int tn_vq_scale(const block_vq2 *b, int g) { return 2 * ((b->sc[g / 2] >> (4 * (g % 2))) & 15) + 1; }

/* Row of k weights (k % 256 == 0) into floats (the reference decode). */
void tn_vq2_dequantize_row(const void *row, float *y, int64_t k);

/* Fits the tensor's codebook: importance-weighted k-means (k-means++ seeding, Lloyd iterations on
 * a sample of scale-normalised vectors) of the rows x[rows][ne0] (ne0 % 256 == 0), importance
 * imp[ne0] per column or NULL (uniform). Deterministic for a given seed. cb receives the int8
 * codebook in the file's order. TERN_ERR_NOMEM or TERN_OK. */
tern_status tn_vq_fit_codebook(const float *x, int64_t rows, int64_t ne0, const float *imp, uint64_t seed,
                               int8_t cb[TN_VQ_CB_BYTES]);
/* Quantizes row r of a tensor of `rows` rows (x: that row's ne0 floats) against codebook cb into
 * y (tn_dtype_row_size(TN_VQ2, ne0) bytes, header included). Rows are independent: any thread
 * split gives the same bytes. */
void tn_vq_quantize_row(const int8_t cb[TN_VQ_CB_BYTES], const float *x, void *y, int64_t ne0, int64_t r, int64_t rows,
                        const float *imp);

#endif
