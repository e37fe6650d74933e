/*
 * tq_plan.h (avx512) — how the tq decode / prefill kernels of this folder read a tern any-bit row
 * (layout: quant/tq.h, docs/formats.md) into VNNI registers. Internal to src/kern/avx512/.
 *
 * A row is walked in super-steps of 16 chunks (512 codes). A super-step is L sub-steps of
 * NC = 16 / L chunks; each sub-step yields J = 8 / L registers of 64 unsigned code bytes, summed
 * by VPDPBUSD into one int32 accumulator with L lanes per chunk (chunk c on dword lanes
 * L c .. L c + L - 1, 4 codes per lane per register). The L sub-step accumulators are then
 * folded (unpack / shuffle + add) into one register whose 16 lanes are the 16 chunks' exact
 * integer dot products (in the lane order `ord`), and the float work — int -> float, times
 * d_w * d_x, plus the asymmetric offset m_w * d_x * sum(x) — is done once per 512 codes.
 *
 * L is the width w0 of the widest plane (1, 2, 4, 8): a chunk's 4 w0 plane-0 bytes fill its L
 * lanes in stored order and register j takes field j of every byte ((P >> w0 j) & mask, done by
 * one GF2P8AFFINEQB bit-matrix multiply: on Zen 4 the shift + AND pair is what limits b = 1). Narrower
 * planes (b = 3, 5, 6, 7) are permuted once per sub-step so that every qword of a chunk's lanes
 * holds the chunk's whole plane (<= 8 bytes); VPMULTISHIFTQB then drops each code's field into
 * bit position and VPTERNLOG ORs it into the code bytes. Activations are rearranged once per
 * call into the same register order (tn_tq_prep_x), so the per-row loop only reads weights.
 *
 * Sub-steps read the row in one of two ways. win: the sub-step spans nbs >= 2 whole blocks,
 * read as one window of <= 128 bytes (two masked loads) from which VPERMT2B pulls every plane
 * and the block headers; when a sub-step is two blocks of 64 codes and w0 = 4 (b = 4..7, G = 64:
 * TQ_PAIR) plane 0 is instead the two blocks' 32-byte halves (two loads, one insert) and a 1-bit
 * plane the two blocks' 8-byte planes broadcast over their lanes (control ms shifted by 32 bits for the blocks' second chunks). blk: the sub-step is one block or part of one (nbs sub-steps per
 * block); plane 0 is one contiguous 64-byte load, other planes one masked load + VPERMB, the
 * header a scalar load. Headers collect in H as fp16 (asym: d_b, m_b at halves 2b, 2b + 1;
 * sym: d_b at half b, b = block within the super-step), converted with one VCVTPH2PS.
 *
 * Tables are built once per type by tn_tq_plans_init from the format definition (no per-type
 * code), before any kernel runs.
 */
#ifndef TN_KERN_AVX512_TQ_PLAN_H
#define TN_KERN_AVX512_TQ_PLAN_H

#include <stdint.h>

#include "kern/kern.h"

typedef struct tn_tq_plan {
    int bits, group, asym;
    int hdr, bb, cpb;               /* header bytes, block bytes, 32-code chunks per block         */
    int np, w[3], shift[3], off[3]; /* planes: width, bit position in the code, offset in block   */
    int L, J, NC;                   /* lanes per chunk, registers per sub-step, chunks per sub-step */
    int nbsup;                      /* blocks per super-step (512 / G)                             */
    int blk;                        /* 0: win sub-steps (nbs blocks each); 1: blk sub-steps        */
    int nbs;                        /* win: blocks per sub-step; blk: sub-steps per block          */
    int win;                        /* window bytes (win)                                           */
    int xmx;                        /* 64-byte vectors after DX in a super-step's activations      */
    uint64_t mA, mB;                /* window load masks (win)                                     */
    uint64_t ml[3];                 /* plane p >= 1 load masks (blk)                               */
    uint64_t hmask[8];              /* H bytes written by sub-step q (win)                          */
    uint8_t ip[64];                 /* plane-0 permute (win)                                       */
    uint8_t is[3][64];              /* plane p >= 1 permute (window offsets, or within its load)   */
    uint8_t ms[3][8][64];           /* plane p >= 1: multishift control of register j             */
    uint8_t ih[64];                 /* header permute (win): byte of H -> window offset            */
    uint8_t ihp[64];                /* header permute of two windows' first 64 bytes (TQ_HDR_IN_A)  */
    uint64_t hpair[4];              /* H bytes of sub-steps 2k, 2k + 1 (TQ_HDR_IN_A)                */
    int32_t didx[16];               /* lane -> H half holding its block's d                        */
    uint8_t ord[16];                /* lane of the folded accumulator -> chunk of the super-step   */
    tn_vec_dot_fn tail;             /* the row's blocks after the last whole super-step            */
    bool gemv;                      /* the CPU has GFNI: decode uses tq_gemv.c (else tail per row) */
} tn_tq_plan;

/* Plan of tq type index ti (dtype - TN_DTYPE_TERN_BASE); valid after tn_tq_plans_init. */
const tn_tq_plan *tn_tq_plan_get(int ti);
/* Builds every plan once (idempotent; called from the registration, under the registry's once);
 * tail dots are taken from t (the slots' vec_dot); gfni: the CPU has GF2P8AFFINEQB. */
void tn_tq_plans_init(const tn_kern_table *t, bool gfni);

/* Activations of one super-step: 8 registers of 64 code bytes (sub-step q, register j at
 * (q J + j) * 64), then 16 floats DX in lane order (d_x; sym: d_x / 2), then xmx vectors:
 * sym: 16 int32 NX = (2^b - 1) * sum(x) of the lane's chunk; asym: MXD, per H half h: 0 for d
 * halves, sum over the block's chunks of d_x * sum(x) for m halves (two vectors when G = 32). */
static inline size_t tn_tq_xsup_bytes(const tn_tq_plan *p) { return (size_t)(9 + p->xmx) * 64; }
/* Whole super-steps of a row of k codes. */
static inline int64_t tn_tq_nsup(int64_t k) { return k / 512; }
/* Rearranges one q8_0 activation row (k codes) into xs (tn_tq_nsup * tn_tq_xsup_bytes). */
void tn_tq_prep_x(const tn_tq_plan *p, const void *xq8, int64_t k, uint8_t *xs);

#endif
