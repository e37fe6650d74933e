/*
 * kc.c — per-channel K groups of the KV cache (layout and rounding in kc.h): the reference
 * quantizer and dequantizer. The codes are packed by tq's plane packer (a tq<b>g32a block's
 * planes, its 4-byte header left out), so the kernels unpack them as they unpack tq rows.
 */
#include "quant/kc.h"

#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "quant/tq.h"

static inline uint8_t *chunk_of(uint8_t *row, int bits, int64_t j) { return row + (size_t)j * (size_t)(4 * bits + 8); }

void tn_kc_quantize_group(int bits, const float *x, int64_t ldx, int64_t n, uint8_t *const rows[TN_KC_ROWS]) {
    const int nmax = (1 << bits) - 1;
    const tn_tq_params tp = {bits, 32, true};
    for (int64_t j = 0; j < n / 32; j++) {
        uint8_t q[TN_KC_ROWS][32];
        uint16_t dh[32], mh[32];
        for (int c = 0; c < 32; c++) {
            const float *xc = x + j * 32 + c;
            float mn = xc[0], mx = xc[0];
            for (int r = 1; r < TN_KC_ROWS; r++) mn = fminf(mn, xc[r * ldx]), mx = fmaxf(mx, xc[r * ldx]);
            dh[c] = tn_fp32_to_fp16((mx - mn) / (float)nmax);
            mh[c] = tn_fp32_to_fp16(mn);
            const float d = tn_fp16_to_fp32(dh[c]), m = tn_fp16_to_fp32(mh[c]);
            const float id = d != 0 ? 1.0f / d : 0.0f;
            for (int r = 0; r < TN_KC_ROWS; r++) {
                const long v = d != 0 ? lrintf((xc[r * ldx] - m) * id) : 0;
                q[r][c] = (uint8_t)(v < 0 ? 0 : v > nmax ? nmax : v);
            }
        }
        for (int r = 0; r < TN_KC_ROWS; r++) {
            uint8_t *o = chunk_of(rows[r], bits, j), blk[4 + 32];
            const uint16_t st[4] = {dh[2 * r], mh[2 * r], dh[2 * r + 1], mh[2 * r + 1]};
            memcpy(o, st, 8);
            tn_tq_pack_block(&tp, q[r], 0, 0, blk);
            memcpy(o + 8, blk + 4, (size_t)(4 * bits));
        }
    }
}

void tn_kc_chunk_stats(const uint8_t *const rows[TN_KC_ROWS], int bits, int64_t j, float d[32], float m[32]) {
    for (int r = 0; r < TN_KC_ROWS; r++) {
        uint16_t st[4];
        memcpy(st, rows[r] + (size_t)j * (size_t)(4 * bits + 8), 8);
        d[2 * r] = tn_fp16_to_fp32(st[0]), m[2 * r] = tn_fp16_to_fp32(st[1]);
        d[2 * r + 1] = tn_fp16_to_fp32(st[2]), m[2 * r + 1] = tn_fp16_to_fp32(st[3]);
    }
}

void tn_kc_chunk_codes(const uint8_t *row, int bits, int64_t j, uint8_t q[32]) {
    const tn_tq_params tp = {bits, 32, true};
    uint8_t blk[4 + 32] = {0};
    memcpy(blk + 4, row + (size_t)j * (size_t)(4 * bits + 8) + 8, (size_t)(4 * bits));
    float d, m;
    tn_tq_unpack_block(&tp, blk, q, &d, &m);
}

void tn_kc_dequantize_group(int bits, const uint8_t *const rows[TN_KC_ROWS], int64_t n, float *y, int64_t ldy) {
    for (int64_t j = 0; j < n / 32; j++) {
        float d[32], m[32];
        tn_kc_chunk_stats(rows, bits, j, d, m);
        for (int r = 0; r < TN_KC_ROWS; r++) {
            uint8_t q[32];
            tn_kc_chunk_codes(rows[r], bits, j, q);
            for (int c = 0; c < 32; c++) y[r * ldy + j * 32 + c] = d[c] * (float)q[c] + m[c];
        }
    }
}
