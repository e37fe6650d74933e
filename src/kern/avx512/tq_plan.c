/*
 * tq_plan.c (avx512) — the per-type tables of the tq decode / prefill kernels (see tq_plan.h):
 * permute indices, multishift controls and the activation order, all derived from the storage
 * layout of quant/tq.h, and the per-call rearrangement of a q8_0 activation row. Plain C: the
 * tables are data, built once.
 */
#include <immintrin.h>
#include <string.h>

#include "core/fp16.h"
#include "kern/avx512/tq_plan.h"
#include "kern/tq_list.inc"
#include "quant/tq.h"

static tn_tq_plan tn_tq_plans[TN_TQ_COUNT];

const tn_tq_plan *tn_tq_plan_get(int ti) { return &tn_tq_plans[ti]; }

/* Chunk-relative code stored in field f of plane byte t of a w-bit plane, and the inverse. */
static int code_of(int w, int t, int f) { return w == 8 ? t : w == 4 ? t + 16 * f : w == 2 ? t + 8 * f : 8 * t + f; }
static int byte_of(int w, int n) { return w == 8 ? n : w == 4 ? n % 16 : w == 2 ? n % 8 : n / 8; }
static int field_of(int w, int n) { return w == 8 ? 0 : w == 4 ? n / 16 : w == 2 ? n / 8 : n % 8; }
static uint64_t bytes_mask(int n) { return n >= 64 ? ~0ull : n <= 0 ? 0 : (1ull << n) - 1; }

/* ---- the fold of the L sub-step accumulators, simulated on chunk labels ----------------------
 * Mirrors the intrinsics the kernels use (tq_fold in tq_gemv.c) on arrays of 16 lane labels;
 * every add must meet equal labels. Gives ord: the chunk on each folded lane. */
typedef struct {
    int v[16];
} lab;

static lab lab_unpack32(lab a, lab b, int hi) {
    lab r;
    for (int q = 0; q < 4; q++) {
        const int o = 4 * q + (hi ? 2 : 0);
        r.v[4 * q] = a.v[o], r.v[4 * q + 1] = b.v[o], r.v[4 * q + 2] = a.v[o + 1], r.v[4 * q + 3] = b.v[o + 1];
    }
    return r;
}
static lab lab_unpack64(lab a, lab b, int hi) {
    lab r;
    for (int q = 0; q < 4; q++) {
        const int o = 4 * q + (hi ? 2 : 0);
        r.v[4 * q] = a.v[o], r.v[4 * q + 1] = a.v[o + 1], r.v[4 * q + 2] = b.v[o], r.v[4 * q + 3] = b.v[o + 1];
    }
    return r;
}
static lab lab_shufps(lab a, lab b, int imm) {
    lab r;
    for (int q = 0; q < 4; q++) {
        r.v[4 * q] = a.v[4 * q + (imm & 3)], r.v[4 * q + 1] = a.v[4 * q + ((imm >> 2) & 3)];
        r.v[4 * q + 2] = b.v[4 * q + ((imm >> 4) & 3)], r.v[4 * q + 3] = b.v[4 * q + ((imm >> 6) & 3)];
    }
    return r;
}
static lab lab_shuf128(lab a, lab b, int imm) {
    lab r;
    const int sel[4] = {imm & 3, (imm >> 2) & 3, (imm >> 4) & 3, (imm >> 6) & 3};
    for (int q = 0; q < 4; q++)
        for (int i = 0; i < 4; i++) r.v[4 * q + i] = (q < 2 ? a : b).v[4 * sel[q] + i];
    return r;
}
/* a + b where a and b hold the same chunks lane by lane (the intrinsic adds; here: check) */
static int lab_same(lab a, lab b, lab *out) {
    for (int i = 0; i < 16; i++)
        if (a.v[i] != b.v[i]) return 0;
    *out = a;
    return 1;
}

static int fold_ord(int L, int NC, uint8_t ord[16]) {
    lab A[8];
    memset(A, 0, sizeof A);
    for (int q = 0; q < L; q++)
        for (int l = 0; l < 16; l++) A[q].v[l] = q * NC + l / L;
    lab S = A[0];
    int ok = 1;
    if (L == 1) {
        S = A[0];
    } else if (L == 2) {
        ok = lab_same(lab_shufps(A[0], A[1], 0x88), lab_shufps(A[0], A[1], 0xDD), &S);
    } else {
        lab u[4] = {A[0], A[0], A[0], A[0]};
        for (int i = 0; i < L / 2; i++) ok &= lab_same(lab_unpack32(A[2 * i], A[2 * i + 1], 0), lab_unpack32(A[2 * i], A[2 * i + 1], 1), &u[i]);
        if (L == 4) {
            ok &= lab_same(lab_unpack64(u[0], u[1], 0), lab_unpack64(u[0], u[1], 1), &S);
        } else {
            lab v0 = A[0], v1 = A[0];
            ok &= lab_same(lab_unpack64(u[0], u[1], 0), lab_unpack64(u[0], u[1], 1), &v0);
            ok &= lab_same(lab_unpack64(u[2], u[3], 0), lab_unpack64(u[2], u[3], 1), &v1);
            ok &= lab_same(lab_shuf128(v0, v1, 0x88), lab_shuf128(v0, v1, 0xDD), &S);
        }
    }
    for (int l = 0; l < 16; l++) ord[l] = (uint8_t)S.v[l];
    return ok;
}

static void plan_build(tn_tq_plan *P, const tn_tq_params *tp) {
    memset(P, 0, sizeof *P);
    P->bits = tp->bits, P->group = tp->group, P->asym = tp->asym;
    P->hdr = tp->asym ? 4 : 2;
    P->bb = (int)tn_tq_block_bytes(tp);
    P->cpb = tp->group / 32;
    int wd[4];
    tn_tq_planes(tp->bits, wd);
    int off = P->hdr, sh = 0;
    for (int p = 0; p < 3 && wd[p]; p++) {
        P->w[p] = wd[p], P->shift[p] = sh, P->off[p] = off;
        sh += wd[p], off += tp->group * wd[p] / 8;
        P->np = p + 1;
    }
    const int w0 = P->w[0], hs = P->asym ? 4 : 2;
    P->L = w0, P->J = 8 / w0, P->NC = 16 / w0;
    P->nbsup = 512 / tp->group;
    P->blk = P->NC <= P->cpb;
    P->xmx = P->asym && tp->group == 32 ? 2 : 1;
    if (!P->blk) {
        P->nbs = P->NC / P->cpb;
        P->win = P->nbs * P->bb;
        P->mA = bytes_mask(P->win), P->mB = bytes_mask(P->win - 64);
        for (int q = 0; q < P->L; q++) P->hmask[q] = bytes_mask(P->nbs * hs) << (q * P->nbs * hs);
        for (int k = 0; k < P->L / 2; k++) P->hpair[k] = bytes_mask(2 * P->nbs * hs) << (2 * k * P->nbs * hs);
    } else {
        P->nbs = P->cpb / P->NC;
        for (int p = 1; p < P->np; p++) P->ml[p] = bytes_mask(P->NC * 4 * P->w[p]);
    }
    for (int pos = 0; pos < 64; pos++) {
        const int lane = pos / 4, i = pos % 4, c = lane / P->L, u = lane % P->L, t = 4 * u + i;
        /* window offset of chunk c's byte 0 of plane p (win sub-steps) */
#define CHUNK_AT(p) ((c / P->cpb) * P->bb + P->off[p] + (c % P->cpb) * 4 * P->w[p])
        P->ip[pos] = (uint8_t)(P->blk ? t + 4 * w0 * c : CHUNK_AT(0) + t);
        for (int p = 1; p < P->np; p++) {
            const int wp = P->w[p], tb = (pos % 8) % (4 * wp);
            P->is[p][pos] = (uint8_t)(P->blk ? c * 4 * wp + tb : CHUNK_AT(p) + tb);
            for (int j = 0; j < P->J; j++) {
                const int n = code_of(w0, t, j);
                P->ms[p][j][pos] = (uint8_t)((8 * byte_of(wp, n) + field_of(wp, n) * wp - P->shift[p]) & 63);
            }
        }
#undef CHUNK_AT
        const int hb = pos / hs; /* H byte -> block of the super-step */
        P->ih[pos] = (uint8_t)(P->blk || hb >= P->nbsup ? 0 : (hb % P->nbs) * P->bb + pos % hs);
        P->ihp[pos] = (uint8_t)(P->blk || hb >= P->nbsup ? 0 : ((hb / P->nbs) % 2) * 64 + (hb % P->nbs) * P->bb + pos % hs);
    }
    if (!fold_ord(P->L, P->NC, P->ord)) memset(P->ord, 0xFF, sizeof P->ord); /* cannot happen: caught by tests */
    for (int l = 0; l < 16; l++) {
        const int blkno = P->ord[l] / P->cpb;
        P->didx[l] = P->asym ? 2 * blkno : blkno;
    }
}

void tn_tq_plans_init(const tn_kern_table *t, bool gfni) {
    for (int ti = 0; ti < TN_TQ_COUNT; ti++) {
        tn_tq_params p;
        tn_tq_params_of((uint32_t)(TN_DTYPE_TERN_BASE + ti), &p);
        plan_build(&tn_tq_plans[ti], &p);
        tn_tq_plans[ti].tail = t->slot[TN_DTYPE_TERN_BASE + ti].vec_dot;
        tn_tq_plans[ti].gemv = gfni;
    }
}

/* Sub-step q, register j holds on chunk c's L lanes bytes [4 L j, 4 L (j + 1)) of chunk q NC + c's
 * codes in the order pi_L: the identity for L >= 2 (code_of(L, t, j) = t + 4 L j), and for L = 1
 * the permutation that puts codes j, 8 + j, 16 + j, 24 + j into dword j. */
void tn_tq_prep_x(const tn_tq_plan *P, const void *xq8, int64_t k, uint8_t *xs) {
    const block_q8_0 *xb = xq8;
    const int64_t ns = tn_tq_nsup(k);
    const size_t sb = tn_tq_xsup_bytes(P);
    const int L = P->L, J = P->J, NC = P->NC, nmax = (1 << P->bits) - 1;
    const __m256i pi1 = _mm256_setr_epi8(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27, 4, 12, 20, 28, 5, 13,
                                         21, 29, 6, 14, 22, 30, 7, 15, 23, 31);
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t s = 0; s < ns; s++) {
        uint8_t *o = xs + (size_t)s * sb;
        const block_q8_0 *xc = xb + s * 16;
        float dx[16], dxs[16];
        int32_t sum[16];
        for (int C = 0; C < 16; C++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)xc[C].qs);
            const __m256i sum8 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum8), _mm256_extracti128_si256(sum8, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            sum[C] = _mm_cvtsi128_si32(s4);
            dx[C] = tn_fp16_to_fp32(xc[C].d);
            dxs[C] = dx[C] * (float)sum[C];
            const int qq = C / NC, c = C % NC;
            uint8_t *dst = o + (size_t)qq * J * 64 + (size_t)c * 4 * L;
            switch (L) {
            case 1: {
                _Alignas(32) uint32_t d32[8];
                _mm256_store_si256((__m256i *)d32, _mm256_permutexvar_epi8(pi1, q));
                for (int j = 0; j < 8; j++) memcpy(dst + 64 * j, &d32[j], 4);
                break;
            }
            case 2:
                for (int j = 0; j < 4; j++) memcpy(dst + 64 * j, xc[C].qs + 8 * j, 8);
                break;
            case 4:
                for (int j = 0; j < 2; j++) memcpy(dst + 64 * j, xc[C].qs + 16 * j, 16);
                break;
            default: _mm256_storeu_si256((__m256i *)dst, q); break;
            }
        }
        float *DX = (float *)(o + 512), *MXD = DX + 16;
        int32_t *NX = (int32_t *)MXD;
        for (int l = 0; l < 16; l++) {
            const int C = P->ord[l];
            DX[l] = P->asym ? dx[C] : 0.5f * dx[C];
            if (!P->asym) NX[l] = nmax * sum[C];
        }
        if (P->asym)
            for (int h = 0; h < 16 * P->xmx; h++) {
                float v = 0.0f;
                if (h % 2 == 1 && h / 2 < P->nbsup)
                    for (int c = 0; c < P->cpb; c++) v += dxs[(h / 2) * P->cpb + c];
                MXD[h] = v;
            }
    }
}
