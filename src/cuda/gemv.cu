/*
 * gemv.cu — the weight products: decode GEMV of the code path (one template over the tq widths:
 * Tilus's point, any width from one description of the planes, not a kernel per width by hand; a
 * warp computes a row, each lane a 32-code chunk at a time rebuilt as 8 words of 4 bytes and
 * multiplied with the int8 activations by dp4a; up to TN_CU_GEMV_MAXN tokens share each weight
 * load), the int8 tensor-core product of batches (k_mmq_code), the float path (F16, BF16, K-quants,
 * i-quants, MXFP4) and their dispatch, the activations' q8 blocks, dequantization for cuBLAS.
 */
#include "cuda/kcode.cuh"

void tn_cu_flags_gemv(int early, int prefetch) { kdev_set_flags(early, prefetch); }

/* ---- activations ------------------------------------------------------------------------------ */

/* one warp per block of 32, as the CPU's activation quantizer (quant_act.c, ggml's x86 path):
 * d = amax/127 (fp16-rounded for the product, as q8_0 stores it), q = x * (127/amax) rounded half
 * to even */
__global__ void k_quantize_q8(const float *x, int64_t ldx, int64_t k, int64_t n, int8_t *q, float *dd, int32_t *ss) {
    gdc_enter();
    const int64_t nb = k / 32, blk = (int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (blk >= nb * n) return;
    const int64_t t = blk / nb, b = blk % nb;
    const float v = x[t * ldx + b * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int qi = __float2int_rn(v * id); /* half to even */
    q[t * k + b * 32 + lane] = (int8_t)qi;
    float s = warp_sum((float)qi);
    if (lane == 0) {
        dd[blk] = __half2float(__float2half_rn(d));
        ss[blk] = (int32_t)s;
    }
}


/* KIND: 0 tq (unsigned codes; sym offset (2^B-1)/2 or asym m), 1 q4_0 (offset 8), 2 q8_0 (signed),
 * 3 q5_0 (offset 16). Any number of tokens, in tiles of NT (TN_CU_GEMV_MAXN, or 1 for one-token
 * steps): every output is the same sequence of operations whatever n and NT are (lane partial sums
 * over chunks lane, lane+32, .., then the warp's butterfly), so a token's result does not depend
 * on the batch it came in (tern serve's batches equal one-at-a-time decoding). A tile after the
 * first finds the row in L1/L2. One-token steps may give each warp R consecutive rows at once (the
 * activation chunk loaded once, the rows' code loads in flight together; each row's arithmetic as
 * alone). Before waiting for the kernel before it, the block prefetches its weight rows into L2
 * (they depend on nothing earlier). */
template <int B, int KIND, bool ASYM, int NT, int R>
__global__ void __launch_bounds__(GEMV_WARPS_MAX * WARP, R == 1 ? GEMV_MIN_BLOCKS : GEMV_MIN_BLOCKS_R)
    k_gemv_code(tn_cw w, const int8_t *xq, const float *xd, const int32_t *xs, int n, float *y, int64_t ldy, const float *bias,
                int accumulate, int wpr, tn_cu_tail tail, tn_cu_glu gl, tn_cu_ex ex) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, part = warp % wpr, rpb = GEMV_WARPS_MAX / wpr * R;
    if constexpr (NT == 1) /* a (token, slot) pair per blockIdx.y: an expert's rows (which, after the wait) */
        if (ex.sel) w.m = ex.rows;
    const int64_t nc = w.k / 32, nbr = w.k / w.group;
    const int cpb = w.group / 32;
    /* gate|up pairs (R == 2): warp row "row0" is the pair (row0, row0 + half), a row group rpb / 2 pairs */
    const bool pair = R == 2 && gl.h != nullptr;
    const int64_t half = w.m / 2, units = pair ? half : w.m, upg = pair ? rpb / 2 : rpb;
    int64_t rg0, rg1;
    gemv_rows(units, upg, &rg0, &rg1);
    if (d_prefetch && (NT > 1 || !ex.sel) && rg0 < rg1) {
        const int64_t r0 = rg0 * upg, nr = min(units, rg1 * upg) - r0;
        for (int h = 0; h < (pair ? 2 : 1); h++) {
            const int64_t a = r0 + h * half;
            prefetch_l2((const uint8_t *)w.data + a * (int64_t)w.row_bytes, (size_t)(nr * (int64_t)w.row_bytes));
            prefetch_l2(w.d + a * nbr, (size_t)(nr * nbr * 2));
            if (ASYM) prefetch_l2(w.mn + a * nbr, (size_t)(nr * nbr * 2));
        }
    }
    gdc_wait();
    if constexpr (NT == 1) if (ex.sel) { /* the pair's expert, input row and output row */
        const int64_t p = blockIdx.y, e = ex.sel[p], r = p / ex.div;
        w.data = (const uint8_t *)w.data + e * w.m * (int64_t)w.row_bytes;
        w.d += e * w.m * nbr;
        if (ASYM) w.mn += e * w.m * nbr;
        xq += r * w.k, xd += r * nc, xs += r * nc;
        y += p * ldy;
        if (gl.h) gl.h += p * half;
        if (bias) bias += e * w.m; /* the expert's biases (gpt-oss) */
    }
    const float off = KIND == 1 ? 8.0f : KIND == 3 ? 16.0f : (float)((1 << B) - 1) * 0.5f;
    for (int64_t rg = rg0; rg < rg1; rg++) {
        if constexpr (R > 1) { /* one token (n == 1): R consecutive rows, or a gate|up pair, a warp */
            gemv_code_rows<B, KIND, ASYM, R, GEMV_WARPS_MAX>(w, xq, xd, xs, rg, wpr, pair, y, bias, accumulate, gl);
            continue;
        }
        const int64_t row = rg * rpb + warp / wpr;
        const bool valid = row < w.m;
        const uint8_t *rowp = (const uint8_t *)w.data + (valid ? row : 0) * (int64_t)w.row_bytes;
        const uint16_t *dr = w.d + (valid ? row : 0) * nbr, *mr = ASYM ? w.mn + (valid ? row : 0) * nbr : nullptr;
        if (rg + 1 < rg1 && row + rpb < w.m) { /* the warp's next row: its chunks into L1 meanwhile */
            const uint8_t *np = rowp + (int64_t)rpb * (int64_t)w.row_bytes;
            for (int64_t ci = lane + (int64_t)WARP * part; ci < nc; ci += (int64_t)WARP * wpr) {
                const uint8_t *bp = np + (ci / cpb) * (int64_t)(4 * B * cpb);
                prefetch_l1(bp);
                if (4 * B * cpb > 128) prefetch_l1(bp + 128);
                prefetch_l1(dr + (int64_t)rpb * nbr + ci / cpb);
            }
        }
        for (int t0 = 0; t0 < n; t0 += NT) {
            const int nt = min(NT, n - t0);
            float acc[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) acc[t] = 0.0f;
            for (int64_t ci = lane + (int64_t)WARP * part; valid && ci < nc; ci += (int64_t)WARP * wpr) {
                uint32_t q[8];
                load_chunk<B>(rowp, ci, cpb, q);
                const float d = h2f(dr[ci / cpb]);
                const float m = ASYM ? h2f(mr[ci / cpb]) : 0.0f;
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= nt) break;
                    const int64_t tt = t0 + t;
                    const int4 *a4 = (const int4 *)(xq + tt * w.k + ci * 32);
                    const int4 a0 = a4[0], a1 = a4[1];
                    const int a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                    int sq = 0;
                    if (KIND == 2) {
#pragma unroll
                        for (int g = 0; g < 8; g++) sq = __dp4a((int)q[g], a[g], sq);
                    } else {
#pragma unroll
                        for (int g = 0; g < 8; g++) sq = dp4a_us(q[g], a[g], sq);
                    }
                    const float da = xd[tt * nc + ci];
                    const float sa = (float)xs[tt * nc + ci];
                    acc[t] = chunk_acc<KIND, ASYM>(acc[t], da, d, m, sq, sa, off);
                }
            }
            gemv_finish(acc, nt, wpr, valid, row, t0, y, ldy, bias, accumulate);
        }
    }
    if constexpr (NT == 1) /* one-token steps only (the tiles' registers stay theirs) */
        if (tail.cnt) norm_tail(tail);
}
/* ---- tensor-core products of batches (k_mmq_code) --------------------------------------------- */

/* d = a b, one m16n8k32 product of the int8 tensor cores (sums in int32, exact), in the PTX ISA's
 * fragments: lane (g = lane / 4, t = lane % 4) holds a[0] = row g's bytes 4t .. 4t+3, a[1] = row g+8's,
 * a[2] = row g's bytes 16+4t .., a[3] = row g+8's; b[0] = column g's bytes 4t .., b[1] = its bytes
 * 16+4t ..; and gets d[0], d[1] = row g, columns 2t and 2t+1, d[2], d[3] = row g+8. AS: a's bytes
 * are int8 (q8_0's codes), else uint8 (every other code type); b's are int8 (q8 activations). Before
 * sm_80 (no m16n8k32), the same product from the lanes' fragments by shuffles and dp4a. */
template <bool AS> __device__ __forceinline__ void mma_i8(int d[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(TN_CUDA_EMU)
    tn_emu_mma_i8(d, a, b, AS ? 1 : 0);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    d[0] = d[1] = d[2] = d[3] = 0;
    if (AS)
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    const int lane = threadIdx.x % WARP, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] = 0;
#pragma unroll
    for (int q = 0; q < 4; q++) { /* bytes 4q .. 4q+3 and 16+4q .. of the rows and columns, from lane 4 row + q */
        const uint32_t a0 = __shfl_sync(0xffffffffu, a[0], 4 * g + q), a1 = __shfl_sync(0xffffffffu, a[1], 4 * g + q);
        const uint32_t a2 = __shfl_sync(0xffffffffu, a[2], 4 * g + q), a3 = __shfl_sync(0xffffffffu, a[3], 4 * g + q);
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int b0 = (int)__shfl_sync(0xffffffffu, b[0], 4 * (2 * t + c) + q);
            const int b1 = (int)__shfl_sync(0xffffffffu, b[1], 4 * (2 * t + c) + q);
            if (AS) {
                d[c] = __dp4a((int)a2, b1, __dp4a((int)a0, b0, d[c]));
                d[2 + c] = __dp4a((int)a3, b1, __dp4a((int)a1, b0, d[2 + c]));
            } else {
                d[c] = dp4a_us(a2, b1, dp4a_us(a0, b0, d[c]));
                d[2 + c] = dp4a_us(a3, b1, dp4a_us(a1, b0, d[2 + c]));
            }
        }
    }
#endif
}

/* An int32 sum of 32 products of bytes (|v| < 2^22) as a float: exact, as (float)v, with an integer
 * and a float addition instead of a conversion (a quarter-rate instruction) */
__device__ __forceinline__ float i2f_small(int v) { return __fsub_rn(__uint_as_float(0x4B400000u + (unsigned)v), 12582912.0f); }

#define MMQ_BM 64      /* rows a block */
#define MMQ_BN 64      /* tokens a block */
#define MMQ_THREADS 256 /* 8 warps: 2 along the rows (32 each) x 4 along the tokens (16 each) */
#define MMQ_LDS 20     /* words per row (token) of a stage in shared memory: 2 chunks and 4 of padding,
                        * so that a fragment's 32 loads fall in 32 banks */

/* One stage's global loads, held in registers while the tensor cores work on the stage before:
 * threads 0..127 a chunk of a row (its planes' words, scale, offset), 128..255 a chunk of a token
 * (32 int8 activations, scale, sum). */
template <int B> struct mmq_fetch {
    uint32_t raw[B];
    float d, m;
    int4 a0, a1;
};

/* The products of an n-token batch (n >= tn_cu_mmq(), 65 by default) on the int8 tensor cores,
 * giving every output the bits the GEMV kernels give it (k_gemv_code, every token alone): a
 * chunk's 32 products are one integer (the mma's, the GEMV's dp4a), scaled by chunk_acc's rounded operations; the
 * chunks of a GEMV lane's slot (chunks l + 32 p + 32 wpr j for j = 0, 1, ..: lane l of the row's
 * warp p) are accumulated in that order; the slots' sums are added in gemv_warp_sum's tree (slot 2i
 * with 2i+1, those pairs' sums pairwise, .. five levels) and the warps' trees in part order, then
 * the bias. So a block walks its chunks slot pair by slot pair — for part p, pair i = 0..15, the
 * chunks (2i, 2i+1) + 32 p + 32 wpr j for each j, two adjacent chunks a stage — keeps two slot sums
 * and four levels of the tree per output, and folds a pair into the tree once its last chunk is
 * in. A block is 64 rows x 64 tokens; its stages' codes (unpacked from the planes as load_chunk
 * unpacks them) and activations pass through shared memory, double-buffered: the next stage's
 * global loads are in flight while this one's products run. */
template <int B, int KIND, bool ASYM>
__global__ void __launch_bounds__(MMQ_THREADS) k_mmq_code(tn_cw w, const int8_t *xq, const float *xd, const int32_t *xs, int n,
                                                          float *y, int64_t ldy, const float *bias, int accumulate, int wpr) {
    constexpr int w0 = planes<B>::w0, w1 = planes<B>::w1, w2 = planes<B>::w2;
    __shared__ __align__(16) uint32_t sA[2][MMQ_BM * MMQ_LDS];
    __shared__ __align__(16) uint32_t sB[2][MMQ_BN * MMQ_LDS];
    __shared__ float sD[2][MMQ_BM][2], sM[2][MMQ_BM][2], sDa[2][MMQ_BN][2], sSa[2][MMQ_BN][2];
    gdc_wait();
    const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP, g = lane / 4, t = lane % 4;
    const int64_t r0 = (int64_t)blockIdx.x * MMQ_BM, t0 = (int64_t)blockIdx.y * MMQ_BN;
    const int64_t nc = w.k / 32, nbr = w.k / w.group, span = (int64_t)WARP * wpr, J = (nc + span - 1) / span;
    const int cpb = w.group / 32;
    const int64_t steps = (int64_t)wpr * 16 * J;
    const float off = KIND == 1 ? 8.0f : KIND == 3 ? 16.0f : (float)((1 << B) - 1) * 0.5f;
    /* this thread's loads: a chunk (lh) of row / token lr */
    const bool ldw = tid < 2 * MMQ_BM;
    const int lr = (tid % (2 * MMQ_BM)) / 2, lh = tid % 2;
    mmq_fetch<B> f;
    auto first_chunk = [&](int64_t s) { /* the stage's first chunk: part p, slot pair i, pass j */
        const int64_t p = s / (16 * J), i = (s / J) % 16, j = s % J;
        return 2 * i + WARP * p + span * j;
    };
    auto fetch = [&](int64_t s) {
        const int64_t ci = first_chunk(s) + lh;
        if (ldw) {
            const int64_t row = r0 + lr;
            const bool ok = row < w.m && ci < nc;
            const uint8_t *bp = (const uint8_t *)w.data + (ok ? row : 0) * (int64_t)w.row_bytes + (ok ? ci / cpb : 0) * (int64_t)(4 * B * cpb);
            const int c = ok ? (int)(ci % cpb) : 0;
#pragma unroll
            for (int e = 0; e < w0; e++) f.raw[e] = ok ? ((const uint32_t *)(bp + c * 4 * w0))[e] : 0u;
#pragma unroll
            for (int e = 0; e < w1; e++) f.raw[w0 + e] = ok ? ((const uint32_t *)(bp + 4 * cpb * w0 + c * 4 * w1))[e] : 0u;
#pragma unroll
            for (int e = 0; e < w2; e++)
                f.raw[w0 + w1 + e] = ok ? ((const uint32_t *)(bp + 4 * cpb * (w0 + w1) + c * 4 * w2))[e] : 0u;
            f.d = ok ? h2f(w.d[row * nbr + ci / cpb]) : 0.0f;
            f.m = ok && ASYM ? h2f(w.mn[row * nbr + ci / cpb]) : 0.0f;
        } else {
            const int64_t tok = t0 + lr;
            const bool ok = tok < n && ci < nc;
            const int4 z = {0, 0, 0, 0};
            const int4 *a4 = (const int4 *)(xq + (ok ? tok * w.k + ci * 32 : 0));
            f.a0 = ok ? a4[0] : z;
            f.a1 = ok ? a4[1] : z;
            f.d = ok ? xd[tok * nc + ci] : 0.0f;
            f.m = ok ? (float)xs[tok * nc + ci] : 0.0f;
        }
    };
    auto store = [&](int buf) {
        if (ldw) {
            uint32_t q[8];
#pragma unroll
            for (int e = 0; e < 8; e++) q[e] = 0;
            unpack_plane<w0, 0>(f.raw, q);
            if (w1) unpack_plane<w1, w0>(f.raw + w0, q);
            if (w2) unpack_plane<w2, w0 + w1>(f.raw + w0 + w1, q);
            uint4 *o = (uint4 *)(sA[buf] + lr * MMQ_LDS + lh * 8);
            o[0] = uint4{q[0], q[1], q[2], q[3]};
            o[1] = uint4{q[4], q[5], q[6], q[7]};
            sD[buf][lr][lh] = f.d;
            sM[buf][lr][lh] = f.m;
        } else {
            int4 *o = (int4 *)(sB[buf] + lr * MMQ_LDS + lh * 8);
            o[0] = f.a0;
            o[1] = f.a1;
            sDa[buf][lr][lh] = f.d;
            sSa[buf][lr][lh] = f.m;
        }
    };
    /* per output o = (row tile mt, token tile nt, fragment element e) = 8 mt + 4 nt + e: the two slots
     * of the current pair, the tree's levels 1..4 (the sums of 2, 4, 8, 16 slots waiting for their
     * partner), and the parts' running sum */
    float sl[2][16], L1[16], L2[16], L3[16], L4[16], part[16];
#pragma unroll
    for (int o = 0; o < 16; o++) sl[0][o] = sl[1][o] = L1[o] = L2[o] = L3[o] = L4[o] = part[o] = 0.0f;
    const int wm = (warp % 2) * 32, wn = (warp / 2) * 16;
    fetch(0);
    store(0);
    __syncthreads();
    for (int64_t s = 0; s < steps; s++) {
        const int buf = (int)(s & 1);
        if (s + 1 < steps) fetch(s + 1);
        const int64_t c0 = first_chunk(s);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (c0 + h >= nc) continue;
            uint32_t af[2][4], bf[2][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const uint32_t *pa = sA[buf] + (wm + mt * 16 + g) * MMQ_LDS + h * 8 + t;
                af[mt][0] = pa[0];
                af[mt][1] = pa[8 * MMQ_LDS];
                af[mt][2] = pa[4];
                af[mt][3] = pa[8 * MMQ_LDS + 4];
            }
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const uint32_t *pb = sB[buf] + (wn + nt * 8 + g) * MMQ_LDS + h * 8 + t;
                bf[nt][0] = pb[0];
                bf[nt][1] = pb[4];
            }
#pragma unroll
            for (int mn = 0; mn < 4; mn++) {
                const int mt = mn >> 1, nt = mn & 1;
                int dd[4];
                mma_i8<KIND == 2>(dd, af[mt], bf[nt]);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int rl = wm + mt * 16 + g + (e >> 1) * 8, tl = wn + nt * 8 + 2 * t + (e & 1), o = 4 * mn + e;
                    sl[h][o] = chunk_acc_f<KIND, ASYM>(sl[h][o], sDa[buf][tl][h], sD[buf][rl][h], ASYM ? sM[buf][rl][h] : 0.0f,
                                                       i2f_small(dd[e]), sSa[buf][tl][h], off);
                }
            }
        }
        if (s % J == J - 1) { /* the pair's slots are complete: into the tree */
            const int i = (int)((s / J) % 16);
            const bool first_part = s / (16 * J) == 0;
#pragma unroll
            for (int o = 0; o < 16; o++) {
                float v = __fadd_rn(sl[0][o], sl[1][o]);
                sl[0][o] = sl[1][o] = 0.0f;
                if (!(i & 1)) { L1[o] = v; continue; }
                v = __fadd_rn(L1[o], v);
                if (!(i & 2)) { L2[o] = v; continue; }
                v = __fadd_rn(L2[o], v);
                if (!(i & 4)) { L3[o] = v; continue; }
                v = __fadd_rn(L3[o], v);
                if (!(i & 8)) { L4[o] = v; continue; }
                v = __fadd_rn(L4[o], v);
                part[o] = first_part ? v : __fadd_rn(part[o], v);
            }
        }
        if (s + 1 < steps) store(buf ^ 1);
        __syncthreads();
    }
#pragma unroll
    for (int o = 0; o < 16; o++) {
        const int mt = o >> 3, nt = (o >> 2) & 1, e = o & 3;
        const int64_t row = r0 + wm + mt * 16 + g + (e >> 1) * 8, tok = t0 + wn + nt * 8 + 2 * t + (e & 1);
        if (row >= w.m || tok >= n) continue;
        const float r = part[o] + (bias ? bias[row] : 0.0f);
        float *yp = y + tok * ldy + row;
        *yp = accumulate ? *yp + r : r;
    }
}

template <int B, int KIND, bool ASYM>
__global__ void k_dequant_code(tn_cw w, int64_t r0, int64_t nr, void *out, int f16) {
    gdc_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* one chunk per thread */
    const int64_t nc = w.k / 32;
    if (i >= nr * nc) return;
    const int64_t row = r0 + i / nc, ci = i % nc;
    const int cpb = w.group / 32;
    uint32_t q[8];
    load_chunk<B>((const uint8_t *)w.data + row * (int64_t)w.row_bytes, ci, cpb, q);
    const int64_t nbr = w.k / w.group;
    const float d = h2f(w.d[row * nbr + ci / cpb]);
    const float m = ASYM        ? h2f(w.mn[row * nbr + ci / cpb])
                    : KIND == 1 ? -8.0f * d
                    : KIND == 3 ? -16.0f * d
                    : KIND == 2 ? 0.0f
                                : -d * (float)((1 << B) - 1) * 0.5f;
    const int64_t o = (i / nc) * w.k + ci * 32;
#pragma unroll
    for (int g2 = 0; g2 < 4; g2++) {
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint32_t byte = (q[2 * g2 + j / 4] >> (8 * (j % 4))) & 0xFFu;
            v[j] = KIND == 2 ? d * (float)(int8_t)byte : d * (float)byte + m;
        }
        store8(out, o + 8 * g2, v, f16);
    }
}

/* ---- float-path weights ---------------------------------------------------------------------- */

/* Scale and min of sub-block j of a q4_K / q5_K block (6-bit fields packed in 12 bytes: ggml's
 * get_scale_min_k4). */
__device__ __forceinline__ void kq_scale_min(const uint8_t *sc, int j, int *s, int *m) {
    if (j < 4) *s = sc[j] & 63, *m = sc[j + 4] & 63;
    else *s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
}

/* ggml's 16-entry tables of iq4_nl / iq4_xs (kvalues_iq4nl) and of mxfp4 (kvalues_mxfp4, e2m1
 * doubled), as bytes of two 64-bit constants: entry q is byte q % 8 of the (q < 8 ? lo : hi) word. */
__device__ __forceinline__ int iq4nl_value(uint32_t q) {
    const uint64_t lo = 0xF6EADDCFBFAD9881ull /* -127 -104 -83 -65 -49 -35 -22 -10 */,
                   hi = 0x7159453526190D01ull /* 1 13 25 38 53 69 89 113 */;
    return (int)(int8_t)(uint8_t)(((q & 8) ? hi : lo) >> (8 * (q & 7)));
}
__device__ __forceinline__ int mxfp4_value(uint32_t q) {
    const uint64_t lo = 0x0C08060403020100ull /* 0 1 2 3 4 6 8 12 */, hi = 0xF4F8FAFCFDFEFF00ull /* 0 -1 -2 -3 -4 -6 -8 -12 */;
    return (int)(int8_t)(uint8_t)(((q & 8) ? hi : lo) >> (8 * (q & 7)));
}
/* 2^(e-128): e8m0's value halved (the table above is doubled), as ggml_e8m0_to_fp32_half */
__device__ __forceinline__ float e8m0_half(uint32_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

/* The codebook i-quants (quant/quant_iq2.c tn_iq_sub_decode has the layouts): blocks of 256 in 8
 * sub-blocks of 32, each 4 groups of 8 elements; a group is one 8-byte grid entry (iq2, iq1) or
 * two 4-byte ones (iq3), with a sign byte (iq2, iq3; 7 stored bits and even parity for iq2_xxs,
 * iq2_xs, iq3_xxs) or a shift of +-1/8 (iq1). Blocks are only 2-byte aligned: bytes and 16-bit
 * words. */
__device__ __forceinline__ uint32_t rd16(const uint8_t *p) { return *(const uint16_t *)p; }
__device__ __forceinline__ uint32_t rd32_2(const uint8_t *p) { return rd16(p) | rd16(p + 2) << 16; }
__device__ __forceinline__ uint32_t iq_signs7(uint32_t s7) {
    s7 &= 127;
    return s7 | (uint32_t)(__popc(s7) & 1) << 7;
}
/* v[j] = db * (+-byte j of e), minus where bit j of sg is set (ggml's db * grid * sign) */
__device__ __forceinline__ void iq_grid8(uint64_t e, uint32_t sg, float db, float v[8]) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int g = (int)((e >> (8 * j)) & 0xFF);
        v[j] = db * (float)((sg >> j) & 1u ? -g : g);
    }
}
/* v[j] = db * (signed byte j of e + delta) (iq1) */
__device__ __forceinline__ void iq1_grid8(uint64_t e, float delta, float db, float v[8]) {
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = db * ((float)(int8_t)(uint8_t)(e >> (8 * j)) + delta);
}
#define TN_IQ1_DELTA_F 0.125f

/* Elements e0 .. e0+7 (e0 % 8 == 0) of a row (k elements) of the file type, as floats; grid: the
 * codebook of the i-quants. */
template <int KIND>
__device__ __forceinline__ void load8(const uint8_t *rowp, int64_t e0, int64_t k, const void *grid, float v[8]) {
    (void)k, (void)grid;
    if (KIND >= TN_CW_IQ2_XXS && KIND <= TN_CW_IQ1_M) { /* group l of sub-block ib; h: its half (scales per 16) */
        const int e = (int)(e0 % 256), ib = e / 32, l = (e % 32) / 8, h = (e % 32) / 16;
        const uint64_t *g8 = (const uint64_t *)grid;
        const uint32_t *g4 = (const uint32_t *)grid;
        if (KIND == TN_CW_IQ2_XXS) { /* 66 bytes: d, then per sub-block 4 grid bytes and 32 bits of signs | scale << 28 */
            const uint8_t *b = rowp + (e0 / 256) * 66, *qs = b + 2 + 8 * ib;
            const uint32_t sg = rd32_2(qs + 4);
            const float db = h2f((uint16_t)rd16(b)) * (0.5f + (float)(sg >> 28)) * 0.25f;
            iq_grid8(g8[qs[l]], iq_signs7(sg >> (7 * l)), db, v);
        } else if (KIND == TN_CW_IQ2_XS) { /* 74 bytes: d, qs u16[32] (9-bit index | 7 sign bits << 9), scales[8] */
            const uint8_t *b = rowp + (e0 / 256) * 74;
            const uint32_t q = rd16(b + 2 + 2 * (4 * ib + l)), s = (b[66 + ib] >> (4 * h)) & 15u;
            const float db = h2f((uint16_t)rd16(b)) * (0.5f + (float)s) * 0.25f;
            iq_grid8(g8[q & 511], iq_signs7(q >> 9), db, v);
        } else if (KIND == TN_CW_IQ2_S) { /* 82 bytes: d, qs[32] index bytes, signs[32], qh[8], scales[8] */
            const uint8_t *b = rowp + (e0 / 256) * 82;
            const uint32_t idx = b[2 + 4 * ib + l] | ((b[66 + ib] >> (2 * l)) & 3u) << 8, s = (b[74 + ib] >> (4 * h)) & 15u;
            const float db = h2f((uint16_t)rd16(b)) * (0.5f + (float)s) * 0.25f;
            iq_grid8(g8[idx], b[34 + 4 * ib + l], db, v);
        } else if (KIND == TN_CW_IQ3_XXS) { /* 98 bytes: d, qs[64] (8 index bytes a sub-block), 32 bits of signs | scale << 28 each */
            const uint8_t *b = rowp + (e0 / 256) * 98, *qs = b + 2 + 8 * ib;
            const uint32_t sg = rd32_2(b + 66 + 4 * ib);
            const float db = h2f((uint16_t)rd16(b)) * (0.5f + (float)(sg >> 28)) * 0.5f;
            iq_grid8((uint64_t)g4[qs[2 * l]] | (uint64_t)g4[qs[2 * l + 1]] << 32, iq_signs7(sg >> (7 * l)), db, v);
        } else if (KIND == TN_CW_IQ3_S) { /* 110 bytes: d, qs[64], qh[8], signs[32], scales[4] */
            const uint8_t *b = rowp + (e0 / 256) * 110, *qs = b + 2 + 8 * ib;
            const uint32_t qh = b[66 + ib], s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 15u;
            const uint32_t i0 = qs[2 * l] | ((qh >> (2 * l)) & 1u) << 8, i1 = qs[2 * l + 1] | ((qh >> (2 * l + 1)) & 1u) << 8;
            const float db = h2f((uint16_t)rd16(b)) * (float)(1 + 2 * (int)s);
            iq_grid8((uint64_t)g4[i0] | (uint64_t)g4[i1] << 32, b[74 + 4 * ib + l], db, v);
        } else if (KIND == TN_CW_IQ1_S) { /* 50 bytes: d, qs[32], qh u16[8] (3 index bits a group, scale, shift sign) */
            const uint8_t *b = rowp + (e0 / 256) * 50;
            const uint32_t qh = rd16(b + 34 + 2 * ib);
            const float db = h2f((uint16_t)rd16(b)) * (float)(2 * (int)((qh >> 12) & 7u) + 1);
            iq1_grid8(g8[b[2 + 4 * ib + l] | ((qh >> (3 * l)) & 7u) << 8], (qh & 0x8000u) ? -TN_IQ1_DELTA_F : TN_IQ1_DELTA_F, db, v);
        } else { /* IQ1_M, 56 bytes: qs[32], qh[16] (a nibble a group: 3 index bits, shift sign), scales[8] (and d's nibbles) */
            const uint8_t *b = rowp + (e0 / 256) * 56;
            const uint32_t s0 = rd16(b + 48), s1 = rd16(b + 50), s2 = rd16(b + 52), s3 = rd16(b + 54);
            const float d = h2f((uint16_t)((s0 >> 12) | ((s1 >> 8) & 0x00F0u) | ((s2 >> 4) & 0x0F00u) | (s3 & 0xF000u)));
            const uint32_t sc = rd16(b + 48 + 2 * (ib / 2)), hq = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) & 15u;
            const float db = d * (float)(2 * (int)((sc >> (6 * (ib % 2) + 3 * h)) & 7u) + 1);
            iq1_grid8(g8[b[4 * ib + l] | (hq & 7u) << 8], (hq & 8u) ? -TN_IQ1_DELTA_F : TN_IQ1_DELTA_F, db, v);
        }
        return;
    }
    if (KIND == TN_CW_VQ2) { /* 72-byte slots: d, sc[4], pad, qs[64]; weight 64 p + j = d (2 s_{j/8} + 1) cb[p][qs[j]] */
        const uint8_t *b = rowp + (e0 / 256) * TN_CU_VQ2_STRIDE;
        const int e = (int)(e0 % 256), p = e / 64, j0 = e % 64, gi = j0 / 8; /* 8 vectors of one scale group */
        const uint2 u = *(const uint2 *)(b + 8 + j0);
        const uint32_t w[2] = {u.x, u.y};
        const float *cb = (const float *)grid + 256 * p;
        const float s = h2f((uint16_t)rd16(b)) * (float)(2 * (int)((b[2 + gi / 2] >> (4 * (gi % 2))) & 15u) + 1);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = s * cb[(w[i / 4] >> (8 * (i % 4))) & 0xFFu];
        return;
    }
    if (KIND == TN_CW_TQ1_0) { /* 54 bytes: qs[48], qh[4] (5 / 4 base-3 digits a byte), d; value (trit - 1) d */
        const uint8_t *b = rowp + (e0 / 256) * 54;
        const int e = (int)(e0 % 256);
        const float d = h2f((uint16_t)rd16(b + 52));
        /* elements 0-159: digit e/32 of qs[e%32]; 160-239: digit (e-160)/16 of qs[32 + (e-160)%16];
         * 240-255: digit (e-240)/4 of qh[(e-240)%4] (quant_iq.c tq1_trits) */
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int ei = e + i;
            const uint32_t byte = ei < 160 ? b[ei % 32] : ei < 240 ? b[32 + (ei - 160) % 16] : b[48 + (ei - 240) % 4];
            const int n = ei < 160 ? ei / 32 : ei < 240 ? (ei - 160) / 16 : (ei - 240) / 4;
            const uint32_t p3 = n == 0 ? 1u : n == 1 ? 3u : n == 2 ? 9u : n == 3 ? 27u : 81u;
            const int t = (int)((((byte * p3) & 0xFFu) * 3u) >> 8);
            v[i] = (float)(t - 1) * d;
        }
        return;
    }
    if (KIND == TN_CW_TQ2_0) { /* 66 bytes: qs[64] (2-bit codes, 4 to a byte), d; value (q - 1) d */
        const uint8_t *b = rowp + (e0 / 256) * 66;
        const int e = (int)(e0 % 256), sh = 2 * ((e % 128) / 32);
        const float d = h2f((uint16_t)rd16(b + 64));
        const uint8_t *q = b + 32 * (e / 128) + e % 32;
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = (float)((int)((q[i] >> sh) & 3u) - 1) * d;
        return;
    }
    if (KIND == TN_CW_F32) {
        const float4 *p = (const float4 *)(rowp + e0 * 4);
        const float4 a = p[0], b = p[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else if (KIND == TN_CW_F16) {
        const uint4 u = *(const uint4 *)(rowp + e0 * 2);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) v[2 * i] = h2f((uint16_t)(w[i] & 0xFFFF)), v[2 * i + 1] = h2f((uint16_t)(w[i] >> 16));
    } else if (KIND == TN_CW_BF16) {
        const uint4 u = *(const uint4 *)(rowp + e0 * 2);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    } else if (KIND == TN_CW_Q4_K) { /* 144-byte blocks of 256: d, dmin, scales[12], qs[128] */
        const uint8_t *b = rowp + (e0 / 256) * 144;
        const int e = (int)(e0 % 256), j = e / 32;
        const float d = h2f(*(const uint16_t *)b), dmin = h2f(*(const uint16_t *)(b + 2));
        int s, mm;
        kq_scale_min(b + 4, j, &s, &mm);
        const uint2 u = *(const uint2 *)(b + 16 + 32 * (j / 2) + (e % 32));
        const uint32_t w[2] = {u.x, u.y};
        const float a = d * (float)s, c = dmin * (float)mm;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t byte = (w[i / 4] >> (8 * (i % 4))) & 0xFFu;
            v[i] = a * (float)((j & 1) ? byte >> 4 : byte & 0xF) - c;
        }
    } else if (KIND == TN_CW_Q5_K) { /* 176-byte blocks of 256: d, dmin, scales[12], qh[32], qs[128] */
        const uint8_t *b = rowp + (e0 / 256) * 176;
        const int e = (int)(e0 % 256), j = e / 32;
        const float d = h2f(*(const uint16_t *)b), dmin = h2f(*(const uint16_t *)(b + 2));
        int s, mm;
        kq_scale_min(b + 4, j, &s, &mm);
        const uint2 u = *(const uint2 *)(b + 48 + 32 * (j / 2) + (e % 32));
        const uint2 h = *(const uint2 *)(b + 16 + (e % 32));
        const uint32_t w[2] = {u.x, u.y}, hw[2] = {h.x, h.y};
        const float a = d * (float)s, c = dmin * (float)mm;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t byte = (w[i / 4] >> (8 * (i % 4))) & 0xFFu, hb = (hw[i / 4] >> (8 * (i % 4))) & 0xFFu;
            const uint32_t q = ((j & 1) ? byte >> 4 : byte & 0xF) | (((hb >> j) & 1u) << 4);
            v[i] = a * (float)q - c;
        }
    } else if (KIND == TN_CW_Q6_K) { /* blocks padded to 224 bytes at upload: ql[128], qh[64], scales[16], d */
        const uint8_t *b = rowp + (e0 / 256) * TN_CU_Q6K_STRIDE;
        const int e = (int)(e0 % 256), h = e / 128, ep = e % 128, qd = ep / 32, l0 = ep % 32;
        const uint2 lq = *(const uint2 *)(b + 64 * h + ((qd & 1) ? 32 : 0) + l0);
        const uint2 hq = *(const uint2 *)(b + 128 + 32 * h + l0);
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h;
        const float d = h2f(*(const uint16_t *)(b + 208));
        const float ds = d * (float)sc[l0 / 16 + 2 * qd]; /* l0 .. l0+7 share a scale (16 apart) */
        const uint32_t lw[2] = {lq.x, lq.y}, hw[2] = {hq.x, hq.y};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t lo = (lw[i / 4] >> (8 * (i % 4))) & 0xFFu, hi = (hw[i / 4] >> (8 * (i % 4))) & 0xFFu;
            const int q = (int)(((qd < 2 ? lo & 0xF : lo >> 4) | (((hi >> (2 * qd)) & 3u) << 4))) - 32;
            v[i] = ds * (float)q;
        }
    } else if (KIND == TN_CW_Q2_K) { /* 84-byte blocks of 256: scales[16] (4-bit scale | 4-bit min), qs[64], d, dmin */
        const uint8_t *b = rowp + (e0 / 256) * 84;
        const int e = (int)(e0 % 256);
        const uint32_t sc = b[e / 16]; /* e .. e+7 share a group of 16 */
        const float d = h2f(*(const uint16_t *)(b + 80)), dmin = h2f(*(const uint16_t *)(b + 82));
        const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
        const uint32_t *qp = (const uint32_t *)(b + 16 + 32 * (e / 128) + e % 32); /* blocks are 4-byte aligned */
        const uint32_t w[2] = {qp[0], qp[1]};
        const int sh = 2 * ((e % 128) / 32);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = dl * (float)((w[i / 4] >> (8 * (i % 4) + sh)) & 3u) - ml;
    } else if (KIND == TN_CW_Q3_K) { /* blocks padded to 112 bytes at upload: hmask[32], qs[64], scales[12], d */
        const uint8_t *b = rowp + (e0 / 256) * TN_CU_Q3K_STRIDE;
        const int e = (int)(e0 % 256), j = e / 16;
        const uint8_t *sc = b + 96;
        const int lo = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4, hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        const float dl = h2f(*(const uint16_t *)(b + 108)) * (float)((lo | (hi << 4)) - 32);
        const uint2 q = *(const uint2 *)(b + 32 + 32 * (e / 128) + e % 32);
        const uint2 h = *(const uint2 *)(b + e % 32);
        const uint32_t qw[2] = {q.x, q.y}, hw[2] = {h.x, h.y};
        const int sh = 2 * ((e % 128) / 32), hb = e / 32;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int low = (int)((qw[i / 4] >> (8 * (i % 4) + sh)) & 3u), high = (int)((hw[i / 4] >> (8 * (i % 4) + hb)) & 1u);
            v[i] = dl * (float)(low - (high ? 0 : 4));
        }
    } else if (KIND == TN_CW_IQ4_XS) { /* 136-byte blocks of 256: d, scales_h, scales_l[4], qs[128] */
        const uint8_t *b = rowp + (e0 / 256) * 136;
        const int e = (int)(e0 % 256), ib = e / 32;
        const uint32_t sh = *(const uint16_t *)(b + 2);
        const int ls = (int)(((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3u) << 4));
        const float dl = h2f(*(const uint16_t *)b) * (float)(ls - 32);
        const uint2 u = *(const uint2 *)(b + 8 + 16 * ib + e % 16);
        const uint32_t w[2] = {u.x, u.y};
        const int s = (e % 32) < 16 ? 0 : 4; /* elements 0-15 of a sub-block: low nibbles; 16-31: high */
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = dl * (float)iq4nl_value((w[i / 4] >> (8 * (i % 4) + s)) & 0xFu);
    } else if (KIND == TN_CW_IQ4_NL || KIND == TN_CW_MXFP4) { /* a row: codes [k/32][16], then the k/32 scales */
        const int64_t blk = e0 / 32;
        const uint2 u = *(const uint2 *)(rowp + blk * 16 + e0 % 16);
        const uint32_t w[2] = {u.x, u.y};
        const int s = (e0 % 32) < 16 ? 0 : 4;
        if (KIND == TN_CW_IQ4_NL) {
            const float d = h2f(*(const uint16_t *)(rowp + k / 2 + blk * 2));
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = d * (float)iq4nl_value((w[i / 4] >> (8 * (i % 4) + s)) & 0xFu);
        } else {
            const float d = e8m0_half(rowp[k / 2 + blk]);
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = (float)mxfp4_value((w[i / 4] >> (8 * (i % 4) + s)) & 0xFu) * d;
        }
    }
}

/* acc plus the dot product of 8 weights v and 8 activations at xp: one expression that every
 * float-path variant (token tiles, one token, gate|up pairs) inlines, so they compile to the same
 * operations (test_cuda checks their bits) */
__device__ __forceinline__ float dot8(float acc, const float v[8], const float *xp) {
    const float4 a = ((const float4 *)xp)[0], b = ((const float4 *)xp)[1];
    return acc + (v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y + v[6] * b.z + v[7] * b.w);
}

/* With gl.h (one token): gate|up pairs as k_gemv_code's, a warp's gate row i, then its up row i + m/2. */
template <int KIND, int NT>
__global__ void __launch_bounds__(GEMV_WARPS_MAX * WARP, GEMV_MIN_BLOCKS)
    k_gemv_float(tn_cw w, const float *x, int64_t ldx, int n, float *y, int64_t ldy, const float *bias, int accumulate, int wpr,
                 tn_cu_tail tail, tn_cu_glu gl, tn_cu_ex ex) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, part = warp % wpr, rpb = GEMV_WARPS_MAX / wpr;
    if constexpr (NT == 1) /* as k_gemv_code */
        if (ex.sel) w.m = ex.rows;
    const bool pair = NT == 1 && gl.h != nullptr;
    const int64_t half = w.m / 2, units = pair ? half : w.m;
    int64_t rg0, rg1;
    gemv_rows(units, rpb, &rg0, &rg1);
    if (d_prefetch && (NT > 1 || !ex.sel) && rg0 < rg1) {
        const int64_t r0 = rg0 * rpb, nr = min(units, rg1 * rpb) - r0;
        for (int h = 0; h < (pair ? 2 : 1); h++)
            prefetch_l2((const uint8_t *)w.data + (r0 + h * half) * (int64_t)w.row_bytes, (size_t)(nr * (int64_t)w.row_bytes));
    }
    gdc_wait();
    if constexpr (NT == 1) if (ex.sel) { /* the pair's expert and input row (its output row and biases where they are
                                           * written: held across the loop, the offsets cost the Q6_K kernel a spill) */
        const int64_t p = blockIdx.y, e = ex.sel[p];
        w.data = (const uint8_t *)w.data + e * w.m * (int64_t)w.row_bytes;
        x += p / ex.div * ldx;
    }
    for (int64_t rg = rg0; rg < rg1; rg++) {
        if (pair) {
            const int64_t i = rg * rpb + warp / wpr;
            const bool valid = i < half;
            float acc[2] = {0.0f, 0.0f};
            for (int r = 0; r < 2; r++) {
                const uint8_t *rowp = (const uint8_t *)w.data + (valid ? i + r * half : 0) * (int64_t)w.row_bytes;
#pragma unroll 4
                for (int64_t e0 = ((int64_t)lane + (int64_t)WARP * part) * 8; valid && e0 < w.k; e0 += (int64_t)WARP * wpr * 8) {
                    float v[8];
                    load8<KIND>(rowp, e0, w.k, w.grid, v);
                    acc[r] = dot8(acc[r], v, x + e0);
                }
            }
            tn_cu_glu gp = gl; /* a pair's h row (offsets applied here, not held across the loop) */
            if (ex.sel) gp.h += blockIdx.y * half;
            gemv_finish_glu(acc, wpr, i, half, gp);
            continue;
        }
        const int64_t row = rg * rpb + warp / wpr;
        const bool valid = row < w.m;
        const uint8_t *rowp = (const uint8_t *)w.data + (valid ? row : 0) * (int64_t)w.row_bytes;
        if (rg + 1 < rg1 && row + rpb < w.m) { /* the warp's next row into L1 meanwhile */
            const uint8_t *np = rowp + (int64_t)rpb * (int64_t)w.row_bytes;
            for (int64_t e0 = ((int64_t)lane + (int64_t)WARP * part) * 8; e0 < w.k; e0 += (int64_t)WARP * wpr * 8)
                prefetch_l1(np + (int64_t)w.row_bytes * e0 / w.k);
        }
        for (int t0 = 0; t0 < n; t0 += NT) { /* token tiles, as k_gemv_code */
            const int nt = min(NT, n - t0);
            float acc[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) acc[t] = 0.0f;
#pragma unroll(NT == 1 ? 4 : 1) /* one token: four loads of a lane in flight */
            for (int64_t e0 = ((int64_t)lane + (int64_t)WARP * part) * 8; valid && e0 < w.k; e0 += (int64_t)WARP * wpr * 8) {
                float v[8];
                load8<KIND>(rowp, e0, w.k, w.grid, v);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= nt) break;
                    acc[t] = dot8(acc[t], v, x + (int64_t)(t0 + t) * ldx + e0);
                }
            }
            gemv_finish(acc, nt, wpr, valid, row, t0, NT == 1 && ex.sel ? y + blockIdx.y * ldy : y, ldy,
                        NT == 1 && ex.sel && bias ? bias + ex.sel[blockIdx.y] * w.m : bias, accumulate); /* the expert's biases */
        }
    }
    if constexpr (NT == 1) /* one-token steps only (the tiles' registers stay theirs) */
        if (tail.cnt) norm_tail(tail);
}
template <int KIND> __global__ void k_dequant_float(tn_cw w, int64_t r0, int64_t nr, void *out, int f16) {
    gdc_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* 8 elements per thread */
    const int64_t n8 = w.k / 8;
    if (i >= nr * n8) return;
    const int64_t row = r0 + i / n8, e0 = (i % n8) * 8;
    float v[8];
    load8<KIND>((const uint8_t *)w.data + row * (int64_t)w.row_bytes, e0, w.k, w.grid, v);
    store8(out, (i / n8) * w.k + e0, v, f16);
}

/* Plain types whose rows are not whole groups of 8 (stories260K's n_ff = 172): element by element. */
template <int KIND> __device__ __forceinline__ float load1(const uint8_t *rowp, int64_t e) {
    if (KIND == TN_CW_F32) return ((const float *)rowp)[e];
    if (KIND == TN_CW_F16) return h2f(((const uint16_t *)rowp)[e]);
    return __uint_as_float((uint32_t)((const uint16_t *)rowp)[e] << 16);
}
template <int KIND>
__global__ void k_gemv_plain1(tn_cw w, const float *x, int64_t ldx, int n, float *y, int64_t ldy, const float *bias,
                              int accumulate) {
    gdc_wait();
    const int64_t row = (int64_t)blockIdx.x * GEMV_WARPS_MAX + threadIdx.x / WARP;
    const bool valid = row < w.m;
    const int lane = threadIdx.x % WARP;
    const uint8_t *rowp = (const uint8_t *)w.data + (valid ? row : 0) * (int64_t)w.row_bytes;
    for (int t0 = 0; t0 < n; t0 += TN_CU_GEMV_MAXN) {
        const int nt = min(TN_CU_GEMV_MAXN, n - t0);
        float acc[TN_CU_GEMV_MAXN];
#pragma unroll
        for (int t = 0; t < TN_CU_GEMV_MAXN; t++) acc[t] = 0.0f;
        for (int64_t e = lane; valid && e < w.k; e += WARP) {
            const float v = load1<KIND>(rowp, e);
#pragma unroll
            for (int t = 0; t < TN_CU_GEMV_MAXN; t++) {
                if (t >= nt) break;
                acc[t] += v * x[(int64_t)(t0 + t) * ldx + e];
            }
        }
        gemv_finish(acc, nt, 1, valid, row, t0, y, ldy, bias, accumulate);
    }
}
template <int KIND> __global__ void k_dequant_plain1(tn_cw w, int64_t r0, int64_t nr, void *out, int f16) {
    gdc_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nr * w.k) return;
    const float v = load1<KIND>((const uint8_t *)w.data + (r0 + i / w.k) * (int64_t)w.row_bytes, i % w.k);
    if (f16) ((__half *)out)[i] = __float2half_rn(v);
    else ((float *)out)[i] = v;
}

/* ---- dispatch ----------------------------------------------------------------------------------- */

/* One GEMV launch's shape: warps per row, and a grid of every row group or, with blocks per SM set
 * (tn_cu_configure), at most that many blocks per multiprocessor, each walking its rows. R: rows
 * of a warp at once (one-token steps). */
struct gemv_launch {
    int wpr;
    unsigned grid, block;
};
static gemv_launch gemv_shape(const tn_cw *w, int R) {
    gemv_launch L;
    L.wpr = gemv_wpr(w);
    const int64_t rpb = GEMV_WARPS_MAX / L.wpr * R, nrg = (w->m + rpb - 1) / rpb;
    const int64_t cap = g_grid_cap > 0 ? g_grid_cap : g_bps > 0 && g_sms > 0 ? (int64_t)g_bps * g_sms : nrg;
    L.grid = (unsigned)(nrg < cap ? nrg : cap);
    L.block = GEMV_WARPS_MAX * WARP;
    return L;
}

template <int B, bool ASYM, int NT, int R>
static void launch_gemv_tq(const tn_cw *w, const tn_cq *xq, int n, float *y, int64_t ldy, const float *bias, int acc,
                           const tn_cu_tail &tail, const tn_cu_glu &gl, const tn_cu_ex &ex, unsigned gy, cudaStream_t st) {
    const gemv_launch L = gemv_shape(w, R);
    launch(k_gemv_code<B, 0, ASYM, NT, R>, dim3(L.grid, gy), L.block, 0, st, *w, xq->q, xq->d, xq->s, n, y, ldy, bias, acc, L.wpr,
           tail, gl, ex);
}
template <int B, bool ASYM> static void launch_dq_tq(const tn_cw *w, int64_t r0, int64_t nr, void *out, int f16,
                                                   cudaStream_t st) {
    const int64_t nthr = nr * (w->k / 32);
    launch(k_dequant_code<B, 0, ASYM>, (unsigned)((nthr + 255) / 256), 256, 0, st, *w, r0, nr, out, f16);
}

#define TQ_SWITCH(FN, ...)                                                                                          \
    switch (w->bits * 2 + (w->asym ? 1 : 0)) {                                                                     \
    case 2: FN<1, false>(__VA_ARGS__); break; case 3: FN<1, true>(__VA_ARGS__); break;                            \
    case 4: FN<2, false>(__VA_ARGS__); break; case 5: FN<2, true>(__VA_ARGS__); break;                            \
    case 6: FN<3, false>(__VA_ARGS__); break; case 7: FN<3, true>(__VA_ARGS__); break;                            \
    case 8: FN<4, false>(__VA_ARGS__); break; case 9: FN<4, true>(__VA_ARGS__); break;                            \
    case 10: FN<5, false>(__VA_ARGS__); break; case 11: FN<5, true>(__VA_ARGS__); break;                          \
    case 12: FN<6, false>(__VA_ARGS__); break; case 13: FN<6, true>(__VA_ARGS__); break;                          \
    case 14: FN<7, false>(__VA_ARGS__); break; case 15: FN<7, true>(__VA_ARGS__); break;                          \
    case 16: FN<8, false>(__VA_ARGS__); break; case 17: FN<8, true>(__VA_ARGS__); break;                          \
    default: return (int)cudaErrorInvalidValue;                                                                    \
    }

extern "C" int tn_cu_quantize_q8(const float *x, int64_t ldx, int64_t k, int64_t n, tn_cq out, void *stream) {
    const int64_t nblk = n * (k / 32);
    if (nblk == 0) return 0;
    launch(k_quantize_q8, (unsigned)((nblk + 7) / 8), 8 * WARP, 0, (cudaStream_t)stream, x, ldx, k, n, out.q, out.d, out.s);
    return tn_cu_err();
}

/* Every float-path kind (kern_cuda.h): the GEMV and dequantization switches take their cases from this list. */
#define FLOAT_KINDS(X)                                                                                                        \
    X(TN_CW_F32) X(TN_CW_F16) X(TN_CW_BF16) X(TN_CW_Q2_K) X(TN_CW_Q3_K) X(TN_CW_Q4_K) X(TN_CW_Q5_K) X(TN_CW_Q6_K)            \
    X(TN_CW_IQ4_XS) X(TN_CW_IQ4_NL) X(TN_CW_MXFP4) X(TN_CW_IQ2_XXS) X(TN_CW_IQ2_XS) X(TN_CW_IQ2_S) X(TN_CW_IQ3_XXS)         \
    X(TN_CW_IQ3_S) X(TN_CW_IQ1_S) X(TN_CW_IQ1_M) X(TN_CW_TQ1_0) X(TN_CW_TQ2_0) X(TN_CW_VQ2)

/* The launch of a GEMV with NT-token tiles; R rows per warp for the code path (NT = 1 only). */
template <int NT, int R>
static int gemv_run(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, int nn, float *y, int64_t ldy,
                    const float *bias, int accumulate, const tn_cu_tail &tail, const tn_cu_glu &gl, const tn_cu_ex &ex, unsigned gy,
                    cudaStream_t st) {
    const gemv_launch L1 = gemv_shape(w, 1), LR = gemv_shape(w, R);
#define GEMV_FLOAT(K) \
    launch(k_gemv_float<K, NT>, dim3(L1.grid, gy), L1.block, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate, L1.wpr, tail, gl, ex)
#define GEMV_CODE(B, K)                                                                                                  \
    launch(k_gemv_code<B, K, false, NT, R>, dim3(LR.grid, gy), LR.block, 0, st, *w, xq->q, xq->d, xq->s, nn, y, ldy, bias,      \
           accumulate, LR.wpr, tail, gl, ex)
#define GEMV_FLOAT_CASE(K) \
    case K: GEMV_FLOAT(K); break;
#define GEMV_TQ(B, A) launch_gemv_tq<B, A, NT, R>(w, xq, nn, y, ldy, bias, accumulate, tail, gl, ex, gy, st)
    switch (w->kind) {
    FLOAT_KINDS(GEMV_FLOAT_CASE)
    case TN_CW_Q4_0: GEMV_CODE(4, 1); break;
    case TN_CW_Q8_0: GEMV_CODE(8, 2); break;
    case TN_CW_Q5_0: GEMV_CODE(5, 3); break;
    case TN_CW_TQ:
        switch (w->bits * 2 + (w->asym ? 1 : 0)) {
        case 2: GEMV_TQ(1, false); break;
        case 3: GEMV_TQ(1, true); break;
        case 4: GEMV_TQ(2, false); break;
        case 5: GEMV_TQ(2, true); break;
        case 6: GEMV_TQ(3, false); break;
        case 7: GEMV_TQ(3, true); break;
        case 8: GEMV_TQ(4, false); break;
        case 9: GEMV_TQ(4, true); break;
        case 10: GEMV_TQ(5, false); break;
        case 11: GEMV_TQ(5, true); break;
        case 12: GEMV_TQ(6, false); break;
        case 13: GEMV_TQ(6, true); break;
        case 14: GEMV_TQ(7, false); break;
        case 15: GEMV_TQ(7, true); break;
        case 16: GEMV_TQ(8, false); break;
        case 17: GEMV_TQ(8, true); break;
        default: return (int)cudaErrorInvalidValue;
        }
        break;
    default: return (int)cudaErrorInvalidValue;
    }
#undef GEMV_FLOAT
#undef GEMV_FLOAT_CASE
#undef GEMV_CODE
#undef GEMV_TQ
    return tn_cu_err();
}

/* A batch of code-path weights on the tensor cores (k_mmq_code) */
template <int B, int K, bool ASYM>
static void launch_mmq(const tn_cw *w, const tn_cq *xq, int n, float *y, int64_t ldy, const float *bias, int accumulate,
                       cudaStream_t st) {
    const dim3 grid((unsigned)((w->m + MMQ_BM - 1) / MMQ_BM), (unsigned)((n + MMQ_BN - 1) / MMQ_BN));
    launch(k_mmq_code<B, K, ASYM>, grid, MMQ_THREADS, 0, st, *w, xq->q, xq->d, xq->s, n, y, ldy, bias, accumulate, gemv_wpr(w));
}
template <int B, bool ASYM> static void launch_mmq_tq(const tn_cw *w, const tn_cq *xq, int n, float *y, int64_t ldy,
                                                    const float *bias, int accumulate, cudaStream_t st) {
    launch_mmq<B, 0, ASYM>(w, xq, n, y, ldy, bias, accumulate, st);
}
static int mmq_run(const tn_cw *w, const tn_cq *xq, int n, float *y, int64_t ldy, const float *bias, int accumulate, cudaStream_t st) {
    switch (w->kind) {
    case TN_CW_Q4_0: launch_mmq<4, 1, false>(w, xq, n, y, ldy, bias, accumulate, st); break;
    case TN_CW_Q8_0: launch_mmq<8, 2, false>(w, xq, n, y, ldy, bias, accumulate, st); break;
    case TN_CW_Q5_0: launch_mmq<5, 3, false>(w, xq, n, y, ldy, bias, accumulate, st); break;
    case TN_CW_TQ: TQ_SWITCH(launch_mmq_tq, w, xq, n, y, ldy, bias, accumulate, st); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return tn_cu_err();
}

static int gemv(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, int64_t n, float *y, int64_t ldy, const float *bias,
                int accumulate, const tn_cu_tail *tailp, const tn_cu_glu *glp, void *stream, const tn_cu_ex *exq = nullptr) {
    if (n < 1 || n > (1 << 24) || (tailp && n != 1)) return (int)cudaErrorInvalidValue;
    const tn_cu_tail tail = tailp ? *tailp : tn_cu_tail{};
    const tn_cu_glu gl = glp ? *glp : tn_cu_glu{};
    cudaStream_t st = (cudaStream_t)stream;
    const unsigned blk = GEMV_WARPS_MAX * WARP, grid1 = (unsigned)((w->m + GEMV_WARPS_MAX - 1) / GEMV_WARPS_MAX);
    const int nn = (int)n;
    const bool plain1 = w->k % 8 != 0 || ldx % 4 != 0 || ((uintptr_t)x & 15) != 0;
    if (plain1 && w->kind <= TN_CW_BF16) {
        if (w->kind == TN_CW_F32) launch(k_gemv_plain1<TN_CW_F32>, grid1, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate);
        if (w->kind == TN_CW_F16) launch(k_gemv_plain1<TN_CW_F16>, grid1, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate);
        if (w->kind == TN_CW_BF16) launch(k_gemv_plain1<TN_CW_BF16>, grid1, blk, 0, st, *w, x, ldx, nn, y, ldy, bias, accumulate);
        /* no tail in this kernel: the norm (or the quantization) on its own */
        if (tailp && !tail.w) return tn_cu_quantize_q8(tail.x, tail.d, tail.d, 1, tail.xq, stream);
        if (tailp) return tn_cu_rmsnorm(tail.x, NULL, tail.y, tail.w, 1, tail.d, tail.eps, tail.xq.q ? &tail.xq : NULL, stream);
        return tn_cu_err();
    }
    const tn_cq none = {NULL, NULL, NULL};
    if (!xq) xq = &none;
    const tn_cu_ex ex = exq ? *exq : tn_cu_ex{};
    const unsigned gy = exq ? (unsigned)exq->pairs : 1u;
    if (g_mmq && nn >= g_mmq && tn_cw_is_code(w->kind) && !exq && (nn + MMQ_BN - 1) / MMQ_BN <= 65535)
        return mmq_run(w, xq, nn, y, ldy, bias, accumulate, st);
    if (nn > 1) return gemv_run<TN_CU_GEMV_MAXN, 1>(w, x, ldx, xq, nn, y, ldy, bias, accumulate, tail, gl, ex, gy, st);
    return g_rows == 2 ? gemv_run<1, 2>(w, x, ldx, xq, nn, y, ldy, bias, accumulate, tail, gl, ex, gy, st)
                       : gemv_run<1, 1>(w, x, ldx, xq, nn, y, ldy, bias, accumulate, tail, gl, ex, gy, st);
}
extern "C" int tn_cu_gemv(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, int64_t n, float *y, int64_t ldy,
                          const float *bias, int accumulate, void *stream) {
    return gemv(w, x, ldx, xq, n, y, ldy, bias, accumulate, NULL, NULL, stream);
}
extern "C" int tn_cu_gemv_tail(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, float *y, const float *bias,
                               int accumulate, const tn_cu_tail *tail, void *stream) {
    if (!tail || !tail->cnt || (tail->xq.q && tail->d % 32 != 0)) return (int)cudaErrorInvalidValue;
    return gemv(w, x, ldx, xq, 1, y, w->m, bias, accumulate, tail, NULL, stream);
}
/* One token's gate|up product w (rows [gate | up], ff = w->m / 2 each) with its GLU into h (the q8
 * tail's contract checked here), for one token or, with ex, for ex->pairs (token, slot) pairs (h and
 * gu rows per pair): fused into the product, or (code rows one at a time) the product into gu, then
 * the GLU kernel. */
static int gemv_glu(const tn_cw *w, const float *x, int64_t ldx, const tn_cq *xq, float *gu, int64_t ldgu, const tn_cu_glu &gl,
                    const tn_cu_tail *tail, void *stream, const tn_cu_ex *ex) {
    const int64_t ff = w->m / 2, pairs = ex ? ex->pairs : 1;
    if (w->m % 2 != 0 || (tail && (!tail->cnt || tail->w || !tail->xq.q || tail->x != gl.h || ff % 32 != 0 || tail->d != pairs * ff)))
        return (int)cudaErrorInvalidValue;
    if (tn_cw_is_code(w->kind) && g_rows != 2) {
        const int e = gemv(w, x, ldx, xq, 1, gu, ldgu, NULL, 0, NULL, NULL, stream, ex);
        return e ? e : tn_cu_swiglu_pair(gu, gl.h, pairs, ff, gl.act, tail ? &tail->xq : NULL, stream);
    }
    return gemv(w, x, ldx, xq, 1, gu, ldgu, NULL, 0, tail, &gl, stream, ex);
}
extern "C" int tn_cu_gemv_glu(const tn_cw *w, const float *x, const tn_cq *xq, float *gu, float *h, int act, const tn_cu_tail *tail,
                              void *stream) {
    if (tn_cw_is_code(w->kind) ? w->k % 32 != 0 : w->k % 8 != 0 || ((uintptr_t)x & 15) != 0) return (int)cudaErrorInvalidValue;
    return gemv_glu(w, x, w->k, xq, gu, w->m, tn_cu_glu{h, act}, tail, stream, NULL);
}

extern "C" int tn_cu_gemv_experts(const tn_cw *w, const tn_cu_ex *ex, const float *x, int64_t ldx, const tn_cq *xq, float *y,
                                  int64_t ldy, const float *bias, const tn_cu_glu *glu, const tn_cu_tail *tail, void *stream) {
    if (!ex || !ex->sel || ex->pairs < 1 || ex->pairs > 65535 || ex->div < 1 || ex->rows < 1 || (tail && !glu) || (bias && glu) ||
        (tn_cw_is_code(w->kind) ? w->k % 32 != 0 : w->k % 8 != 0 || ldx % 4 != 0 || ((uintptr_t)x & 15) != 0))
        return (int)cudaErrorInvalidValue;
    tn_cw v = *w; /* an expert's shape: the kernels pick the launch by it */
    v.m = ex->rows;
    return glu ? gemv_glu(&v, x, ldx, xq, y, ldy, *glu, tail, stream, ex) : gemv(&v, x, ldx, xq, 1, y, ldy, bias, 0, NULL, NULL, stream, ex);
}

/* A warp per token: tn_cu_moe_route's contract, the CPU's arithmetic (the exponentials in parallel,
 * the double sums by one lane in expert order, the top k by k warp-wide arg-maxes) */
static int dequant(const tn_cw *w, int64_t r0, int64_t nr, void *out, int f16, cudaStream_t st) {
    if (nr <= 0) return 0;
    const int64_t n8 = nr * (w->k / 8), nc = nr * (w->k / 32);
    const unsigned gf = (unsigned)((n8 + 255) / 256), gc = (unsigned)((nc + 255) / 256);
    if (w->k % 8 != 0 && w->kind <= TN_CW_BF16) {
        const unsigned g1 = (unsigned)((nr * w->k + 255) / 256);
        if (w->kind == TN_CW_F32) launch(k_dequant_plain1<TN_CW_F32>, g1, 256, 0, st, *w, r0, nr, out, f16);
        if (w->kind == TN_CW_F16) launch(k_dequant_plain1<TN_CW_F16>, g1, 256, 0, st, *w, r0, nr, out, f16);
        if (w->kind == TN_CW_BF16) launch(k_dequant_plain1<TN_CW_BF16>, g1, 256, 0, st, *w, r0, nr, out, f16);
        return tn_cu_err();
    }
    switch (w->kind) {
#define DEQUANT_FLOAT_CASE(K) \
    case K: launch(k_dequant_float<K>, gf, 256, 0, st, *w, r0, nr, out, f16); break;
    FLOAT_KINDS(DEQUANT_FLOAT_CASE)
#undef DEQUANT_FLOAT_CASE
    case TN_CW_Q4_0: launch(k_dequant_code<4, 1, false>, gc, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_Q8_0: launch(k_dequant_code<8, 2, false>, gc, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_Q5_0: launch(k_dequant_code<5, 3, false>, gc, 256, 0, st, *w, r0, nr, out, f16); break;
    case TN_CW_TQ: TQ_SWITCH(launch_dq_tq, w, r0, nr, out, f16, st); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return tn_cu_err();
}

extern "C" int tn_cu_dequant_f16(const tn_cw *w, int64_t r0, int64_t nr, uint16_t *out, void *stream) {
    return dequant(w, r0, nr, out, 1, (cudaStream_t)stream);
}
extern "C" int tn_cu_dequant_f32(const tn_cw *w, int64_t r0, int64_t nr, float *out, void *stream) {
    return dequant(w, r0, nr, out, 0, (cudaStream_t)stream);
}

__global__ void k_f32_to_f16(const float *x, int64_t ldx, int64_t k, int64_t n, __half *out) {
    gdc_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * k) return;
    out[i] = __float2half_rn(x[(i / k) * ldx + i % k]);
}
extern "C" int tn_cu_f32_to_f16(const float *x, int64_t ldx, int64_t k, int64_t n, uint16_t *out, void *stream) {
    if (n * k == 0) return 0;
    launch(k_f32_to_f16, (unsigned)((n * k + 255) / 256), 256, 0, (cudaStream_t)stream, x, ldx, k, n, (__half *)out);
    return tn_cu_err();
}

