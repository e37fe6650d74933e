/*
 * quant_iq2.c — ggml's codebook i-quants: iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m.
 * One decoder (tn_iq_sub_decode) turns a 32-element sub-block into its signed integer grid values,
 * its 4-bit (iq1: 3-bit) scale codes per 16-element half and, for iq1, the sign of each group's
 * 1/8 shift; the dequantizers here and the scalar dot products (kern/scalar/dot_iq2.c) both read
 * blocks through it, so the layout is written down once (blocks.h describes it).
 *
 * Dequantization is bit-exact with ggml's dequantize_row_<t>: the same float operations in the
 * same order (a sign flip commutes with the rounding of db * grid, so db * (+-grid) is ggml's
 * db * grid * +-1).
 */
#include "quant/iq_grid.h"
#include "quant/quant.h"


/* 8 elements of a grid entry (8 bytes) with sign byte sg applied. */
static inline void put8(int8_t *q, uint64_t e, unsigned sg) {
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(sg >> j & 1 ? -tn_iq_gbyte(e, j) : tn_iq_gbyte(e, j));
}
/* 4 + 4 elements of two iq3 grid entries with one sign byte. */
static inline void put4x2(int8_t *q, uint32_t e0, uint32_t e1, unsigned sg) {
    put8(q, (uint64_t)e0 | (uint64_t)e1 << 32, sg);
}

void tn_iq_sub_decode(tn_dtype t, const void *blk, int ib, tn_iq_sub *o) {
    memset(o->delta, 1, sizeof o->delta);
    switch (t) {
    case TN_IQ2_XXS: {
        const block_iq2_xxs *b = blk;
        const uint32_t idx = tn_iq_rd32(b->qs + 4 * ib), sg = tn_iq_rd32(b->qs + 4 * ib + 2);
        for (int l = 0; l < 4; l++) put8(o->q + 8 * l, tn_iq2xxs_grid[idx >> 8 * l & 255], tn_iq_signs7(sg >> 7 * l));
        o->s[0] = o->s[1] = (uint8_t)(sg >> 28);
        break;
    }
    case TN_IQ2_XS: {
        const block_iq2_xs *b = blk;
        for (int l = 0; l < 4; l++) {
            const uint16_t v = b->qs[4 * ib + l];
            put8(o->q + 8 * l, tn_iq2xs_grid[v & 511], tn_iq_signs7(v >> 9));
        }
        o->s[0] = b->scales[ib] & 15, o->s[1] = b->scales[ib] >> 4;
        break;
    }
    case TN_IQ2_S: {
        const block_iq2_s *b = blk;
        for (int l = 0; l < 4; l++) {
            const int idx = b->qs[4 * ib + l] | (b->qh[ib] >> 2 * l & 3) << 8;
            put8(o->q + 8 * l, tn_iq2s_grid[idx], b->qs[QK_K / 8 + 4 * ib + l]);
        }
        o->s[0] = b->scales[ib] & 15, o->s[1] = b->scales[ib] >> 4;
        break;
    }
    case TN_IQ3_XXS: {
        const block_iq3_xxs *b = blk;
        const uint8_t *qs = b->qs + 8 * ib;
        const uint32_t sg = tn_iq_rd32(b->qs + QK_K / 4 + 4 * ib);
        for (int l = 0; l < 4; l++)
            put4x2(o->q + 8 * l, tn_iq3xxs_grid[qs[2 * l]], tn_iq3xxs_grid[qs[2 * l + 1]], tn_iq_signs7(sg >> 7 * l));
        o->s[0] = o->s[1] = (uint8_t)(sg >> 28);
        break;
    }
    case TN_IQ3_S: {
        const block_iq3_s *b = blk;
        const uint8_t *qs = b->qs + 8 * ib;
        for (int l = 0; l < 4; l++) {
            const int i0 = qs[2 * l] | (b->qh[ib] >> 2 * l & 1) << 8, i1 = qs[2 * l + 1] | (b->qh[ib] >> (2 * l + 1) & 1) << 8;
            put4x2(o->q + 8 * l, tn_iq3s_grid[i0], tn_iq3s_grid[i1], b->signs[4 * ib + l]);
        }
        o->s[0] = o->s[1] = (uint8_t)(b->scales[ib / 2] >> 4 * (ib % 2) & 15);
        break;
    }
    case TN_IQ1_S: {
        const block_iq1_s *b = blk;
        const uint16_t qh = b->qh[ib];
        for (int l = 0; l < 4; l++) {
            const uint64_t e = tn_iq1s_grid[b->qs[4 * ib + l] | (qh >> 3 * l & 7) << 8];
            for (int j = 0; j < 8; j++) o->q[8 * l + j] = (int8_t)tn_iq_gsbyte(e, j);
        }
        o->s[0] = o->s[1] = (uint8_t)(qh >> 12 & 7);
        memset(o->delta, qh & 0x8000 ? -1 : 1, sizeof o->delta);
        break;
    }
    case TN_IQ1_M: {
        const block_iq1_m *b = blk;
        const uint16_t sc = tn_iq_rd16(b->scales + 2 * (ib / 2));
        for (int l = 0; l < 4; l++) {
            const unsigned h = b->qh[2 * ib + l / 2] >> 4 * (l % 2) & 15;
            const uint64_t e = tn_iq1s_grid[b->qs[4 * ib + l] | (h & 7) << 8];
            for (int j = 0; j < 8; j++) o->q[8 * l + j] = (int8_t)tn_iq_gsbyte(e, j);
            o->delta[l] = h & 8 ? -1 : 1;
        }
        o->s[0] = (uint8_t)(sc >> 6 * (ib % 2) & 7), o->s[1] = (uint8_t)(sc >> (6 * (ib % 2) + 3) & 7);
        break;
    }
    case TN_IQ2_XXS_P3:
    case TN_IQ2_XS_P3:
    case TN_IQ2_S_P3: { /* the expanded layout (blocks.h block_iq2_p3) */
        static const int8_t mag[4] = {8, 25, 43, 0};
        const block_iq2_p3 *b = blk;
        const int c = ib / 2, j0 = 32 * (ib % 2);
        for (int j = j0; j < j0 + 32; j++) {
            const unsigned h = b->hi[j], n = (j < 32 ? b->lo[j] : b->lo[j - 32] >> 4) & 15;
            const unsigned code = c == 0 ? h & 7 : c == 1 ? h >> 3 & 7 : c == 2 ? (h >> 6) | (n & 1) << 2 : n >> 1;
            o->q[j - j0] = (int8_t)(code & 4 ? -mag[code & 3] : mag[code & 3]);
        }
        o->s[0] = b->scales[ib] & 15, o->s[1] = b->scales[ib] >> 4;
        break;
    }
    case TN_IQ3_XXS_P4:
    case TN_IQ3_S_P4: { /* the expanded layout (blocks.h block_iq3_p4) */
        static const int8_t mxxs[8] = {4, 12, 20, 28, 36, 44, 52, 62}, ms[8] = {1, 3, 5, 7, 9, 11, 13, 15};
        const int8_t *mag = t == TN_IQ3_XXS_P4 ? mxxs : ms;
        const block_iq3_p4 *b = blk;
        const int c = ib / 2, j0 = 32 * (ib % 2);
        for (int j = 0; j < 32; j++) {
            const unsigned code = b->qs[64 * (c / 2) + j0 + j] >> 4 * (c % 2) & 15;
            o->q[j] = (int8_t)(code & 8 ? -mag[code & 7] : mag[code & 7]);
        }
        o->s[0] = b->scales[ib] & 15, o->s[1] = b->scales[ib] >> 4;
        break;
    }
    case TN_IQ1_S_P2:
    case TN_IQ1_M_P2: { /* the expanded layout (blocks.h block_iq1_p2) */
        const block_iq1_p2 *b = blk;
        const int c = ib / 2, j0 = 32 * (ib % 2);
        for (int j = 0; j < 32; j++) o->q[j] = (int8_t)((b->codes[j0 + j] >> 2 * c & 3) - 1);
        for (int l = 0; l < 4; l++) o->delta[l] = (int8_t)(b->delta[ib / 2] >> (4 * (ib % 2) + l) & 1 ? -1 : 1);
        o->s[0] = b->scales[ib] & 15, o->s[1] = b->scales[ib] >> 4;
        break;
    }
    default: memset(o, 0, sizeof *o); break;
    }
}

float tn_iq_block_d(tn_dtype t, const void *blk) {
    /* every type but iq1_m starts with its fp16 d */
    return tn_fp16_to_fp32(t == TN_IQ1_M ? tn_iq1_m_scale(blk) : tn_iq_rd16(blk));
}

void tn_dequantize_row_iq(tn_dtype t, const void *x, float *y, int64_t k) {
    const size_t bs = tn_dtype_get(t)->type_size;
    const uint8_t *b = x;
    tn_iq_sub o;
    for (int64_t i = 0; i < k / QK_K; i++, b += bs) {
        const float d = tn_iq_block_d(t, b);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            tn_iq_sub_decode(t, b, ib, &o);
            for (int h = 0; h < 2; h++, y += 16) {
                const int s = o.s[h];
                const int8_t *q = o.q + 16 * h;
                float db;
                switch (t) {
                case TN_IQ3_XXS:
                case TN_IQ3_XXS_P4: db = d * (0.5f + s) * 0.5f; break;
                case TN_IQ3_S:
                case TN_IQ3_S_P4: db = d * (1 + 2 * s); break;
                case TN_IQ1_S:
                case TN_IQ1_M:
                case TN_IQ1_S_P2:
                case TN_IQ1_M_P2: db = d * (2 * s + 1); break;
                default: db = d * (0.5f + s) * 0.25f; break;
                }
                if (t == TN_IQ1_S || t == TN_IQ1_M || t == TN_IQ1_S_P2 || t == TN_IQ1_M_P2) {
                    for (int j = 0; j < 16; j++) y[j] = db * (q[j] + (o.delta[2 * h + j / 8] < 0 ? -TN_IQ1_DELTA : TN_IQ1_DELTA));
                } else {
                    for (int j = 0; j < 16; j++) y[j] = db * q[j];
                }
            }
        }
    }
}
