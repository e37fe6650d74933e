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

/* ---- error feedback with the layer's Hessian (GPTQ's update, VPTQ's objective) ---------------
 * With H = X^T X of the layer's calibration inputs X (rows of ne0), the output error of a
 * quantized row is (w - q) H (w - q)^T. Vectors are quantized one at a time in the order of the
 * layout (block by block, vector j = weights j, j + 64, j + 128, j + 192 of a block), each choosing
 * the codebook entry that least raises that error given the vectors before it (the 4x4 block of
 * the inverse Hessian of the weights still free), and the vector's error is folded into the
 * weights not yet quantized (GPTQ: W_rest -= E U_rest with H^-1 = U^T U). Group scales are picked
 * at the start of each block from the updated weights (tn_vq_quantize_row's search, the
 * importance = diag H). Columns H says are never active (zero diagonal) are quantized as zeros. */
typedef struct tn_vq_gptq tn_vq_gptq;

/* From H (ne0 x ne0 row-major, upper triangle read; ne0 % 256 == 0), dampened by damp * mean
 * diagonal (GPTQ's 0.01; raised tenfold up to 3 times if H is still not positive definite).
 * TERN_ERR_NOMEM, TERN_ERR_FORMAT (no factorization: H not finite or not positive), or TERN_OK. */
tern_status tn_vq_gptq_create(const float *H, int64_t ne0, float damp, tn_vq_gptq **out);
void tn_vq_gptq_free(tn_vq_gptq *g);
/* diag H (ne0 floats, file order): the importance to fit the codebook with. */
const float *tn_vq_gptq_diag(const tn_vq_gptq *g);
/* The codebook the rows are quantized against (before tn_vq_gptq_quantize_rows). */
void tn_vq_gptq_set_codebook(tn_vq_gptq *g, const int8_t cb[TN_VQ_CB_BYTES]);
/* Quantizes rows r0..r1 of the tensor x[rows][ne0] into y (the tensor's rows, row r at
 * r * tn_dtype_row_size(TN_VQ2, ne0)). Rows are independent: any split gives the same bytes. */
void tn_vq_gptq_quantize_rows(const tn_vq_gptq *g, const float *x, void *y, int64_t r0, int64_t r1, int64_t rows);

#endif
