/*
 * kattn.cuh — the attention's device functions: the per-head norm and RoPE, the KV cache's rows
 * (f16, q8_0 / q4_0, tq, per-channel K groups: store, dot with the query, values), the chunk fold
 * and attn_unit, the body of a (token, head) block that the attention kernels (attn.cu) and the
 * persistent kernel (kernels.cu) both run.
 */
#ifndef TN_CUDA_KATTN_CUH
#define TN_CUDA_KATTN_CUH

#include "cuda/kcode.cuh"

/* qwen3's per-head RMSNorm of x [hd] by w, in place, by one warp (lane sums in double, the warp's
 * butterfly): k_rope_store and the fused attention share it, so they give the same bits. */
__device__ __forceinline__ void head_norm_warp(float *x, int hd, const float *w, float eps, int lane) {
    double s = 0;
    for (int i = lane; i < hd; i += WARP) s += (double)(x[i] * x[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float scale = 1.0f / sqrtf((float)(s / (double)hd) + eps);
    for (int i = lane; i < hd; i += WARP) x[i] = (x[i] * scale) * w[i];
}
/* RoPE of rotated pair i0 (even; cos, sin at c[i0], c[i0 + 1]) of head x, in place: neighbours
 * (2i, 2i+1), or the half split (i, i + n_rot/2) with neox. Rounded products, no fused multiply-add,
 * so that every kernel computing it gives the same bits. */
__device__ __forceinline__ void rope_pair(float *x, int i0, const float *c, int n_rot, int neox) {
    const float co = c[i0], si = c[i0 + 1];
    const int a = neox ? i0 / 2 : i0, b = neox ? i0 / 2 + n_rot / 2 : i0 + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = __fsub_rn(__fmul_rn(x0, co), __fmul_rn(x1, si));
    x[b] = __fadd_rn(__fmul_rn(x0, si), __fmul_rn(x1, co));
}

/* tern's rotation of a quantized cache's heads (blocks.c tn_kv_rot) on one head x [hd] in place, by
 * one warp: forward x <- H (D x), inverse x <- D (H x), with D = diag(sg) and H the normalized
 * Walsh-Hadamard matrix in blocks of B (a power of 2 dividing hd); the CPU's butterflies, element for
 * element (a + d, a - d per stage, then the scale 1/sqrt(B)). */
static __device__ void kv_rot_warp(float *x, int hd, const float *sg, int B, bool inverse, int lane) {
    if (!inverse) {
        for (int i = lane; i < hd; i += WARP) x[i] *= sg[i];
        __syncwarp();
    }
    const int hb = B / 2;
    for (int len = 1; len < B; len <<= 1) {
        for (int p = lane; p < hd / 2; p += WARP) { /* pair p: block p / hb, its (p % hb)-th pair at this stage */
            const int r = p % hb, j = (p / hb) * B + (r / len) * 2 * len + r % len;
            const float a = x[j], d = x[j + len];
            x[j] = a + d, x[j + len] = a - d;
        }
        __syncwarp();
    }
    const float s = 1.0f / sqrtf((float)B);
    for (int i = lane; i < hd; i += WARP) x[i] *= s;
    __syncwarp();
    if (inverse) {
        for (int i = lane; i < hd; i += WARP) x[i] *= sg[i];
        __syncwarp();
    }
}

/* The bits of a tq<b>g32a cache type (TN_CU_KV_TQ(b)), 0 for the others */
__device__ __forceinline__ int kv_tq_bits(int type) { return type >= TN_CU_KV_TQ(2) && type <= TN_CU_KV_TQ(8) ? type - TN_CU_KV_TQ(0) : 0; }
/* The bits of a per-channel K type (TN_CU_KV_TQC(b)), 0 for the others */
__host__ __device__ __forceinline__ int kv_kc_bits(int type) { return type >= TN_CU_KV_TQC(2) && type <= TN_CU_KV_TQC(4) ? type - TN_CU_KV_TQC(0) : 0; }
/* Bytes of a block of 32 values of a quantized cache type: q8_0 34, q4_0 18, tq<b>g32a 4 + 4 b;
 * a chunk of a per-channel K row 8 + 4 b. */
__device__ __forceinline__ int kv_block_bytes(int type) {
    return type == TN_CU_KV_Q8_0 ? 34 : type == TN_CU_KV_Q4_0 ? 18 : kv_kc_bits(type) ? 8 + 4 * kv_kc_bits(type) : 4 + 4 * kv_tq_bits(type);
}
/* Bytes of a head's first value in a cache row: f16 2 per value, the quantized types a block per 32. */
__device__ __forceinline__ int64_t kv_head_off(int type, int64_t h, int hd) {
    return type == TN_CU_KV_F16 ? h * hd * 2 : h * (hd / 32) * kv_block_bytes(type);
}

/* Writes one plane of width w of a chunk of 32 codes (lane n holds p, its w bits for this plane) to
 * dst (4 w bytes, 4-aligned) in tq's order, by the whole warp: w = 8 byte j = v[j]; 4 byte j = v[j] |
 * v[j+16] << 4; 2 byte j = v[j] | v[j+8] << 2 | v[j+16] << 4 | v[j+24] << 6; 1 bit n = v[n]. Each
 * lane shifts its code to its place in its 32-bit word, the lanes of a word OR theirs together
 * (butterflies over the lane bits that do not change the word), and the word's first lane stores it. */
__device__ __forceinline__ void tq_pack_plane(uint8_t *dst, uint32_t p, int w, int lane) {
    const int nb = 4 * w; /* the plane's bytes */
    uint32_t v = w == 1 ? p << lane : p << (8 * (lane % 4) + w * (lane / nb));
    for (int o = 1; o < WARP; o <<= 1) /* w is the warp's: every lane takes the same branches */
        if (w == 1 || o < 4 || o >= nb) v |= __shfl_xor_sync(0xffffffffu, v, o);
    if (w == 1 ? lane == 0 : lane % 4 == 0 && lane < nb) ((uint32_t *)dst)[w == 1 ? 0 : lane / 4] = v;
}
/* The warp's 32 codes (lane n holds code c of b bits) into tq's planes at codes (4 b bytes). */
__device__ __forceinline__ void tq_pack_code(uint8_t *codes, int bits, int c, int lane) {
    for (int pl = 0, s = 0; pl < 3; pl++) {
        const int w = tq_plane_width(bits, pl);
        if (!w) break;
        tq_pack_plane(codes, ((uint32_t)c >> s) & ((1u << w) - 1u), w, lane);
        s += w, codes += 4 * w;
    }
}
/* Code i (0..31) of a tq<b>g32a block's planes (at codes) */
__device__ __forceinline__ int tq_code(const uint8_t *codes, int bits, int i) {
    int c = 0, s = 0;
    for (int pl = 0; pl < 3; pl++) {
        const int w = tq_plane_width(bits, pl);
        if (!w) break;
        const int v = w == 1 ? (codes[i / 8] >> (i % 8)) & 1 : (codes[i % (4 * w)] >> (w * (i / (4 * w)))) & ((1 << w) - 1);
        c |= v << s;
        s += w, codes += 4 * w;
    }
    return c;
}

/* Stores value v (lane's element of a block of 32) as element e0 + lane of a cache row of type t, by
 * the whole warp: f16 as it is; q8_0 / q4_0 with ggml's reference quantizers (the CPU's
 * tn_quantize_row_q8_0_ref / _q4_0_ref, so the CPU and the GPU store the same bytes): q8_0 d =
 * amax/127, q = roundf(x / d); q4_0 d = max/-8 (max: the first element of largest magnitude, sign
 * kept), q = min(15, (int)(x / d + 8.5)), element j in the low nibble of byte j, j + 16 in the high. */
__device__ __forceinline__ void kv_store_warp(uint8_t *row, int t, int64_t e0, float v, int lane) {
    if (t == TN_CU_KV_F16) {
        ((__half *)row)[e0 + lane] = __float2half_rn(v);
        return;
    }
    const int64_t blk = e0 / 32;
    const float av = fabsf(v);
    if (kv_tq_bits(t)) { /* tn_tq_quantize_row_rtn: d = (max - min) / (2^b - 1), m = min, both rounded to
                          * fp16, c = clamp(rint((x - m) / d)) against the rounded values (tn_tq_finish_group) */
        const int bits = kv_tq_bits(t), nmax = (1 << bits) - 1;
        const float mn = -warp_max(-v), mx = warp_max(v);
        const __half dh = __float2half_rn(__fsub_rn(mx, mn) / (float)nmax), mh = __float2half_rn(mn);
        const float d = __half2float(dh), m = __half2float(mh);
        int c = 0;
        if (d != 0.0f) {
            c = __float2int_rn(__fmul_rn(__fsub_rn(v, m), 1.0f / d));
            c = c < 0 ? 0 : c > nmax ? nmax : c;
        }
        uint8_t *b = row + blk * kv_block_bytes(t);
        if (lane == 0) ((__half *)b)[0] = dh, ((__half *)b)[1] = mh;
        tq_pack_code(b + 4, bits, c, lane);
        return;
    }
    if (t == TN_CU_KV_Q8_0) {
        const float d = warp_max(av) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t *b = row + blk * 34;
        b[2 + lane] = (uint8_t)(int8_t)roundf(v * id);
        if (lane == 0) *(__half *)b = __float2half_rn(d);
        return;
    }
    /* q4_0: the lowest lane holding the largest magnitude */
    float am = av;
    int al = lane;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, am, o);
        const int ol = __shfl_xor_sync(0xffffffffu, al, o);
        if (om > am || (om == am && ol < al)) am = om, al = ol;
    }
    const float mx = __shfl_sync(0xffffffffu, v, al);
    const float d = mx / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const float hi_v = __shfl_down_sync(0xffffffffu, v, 16); /* element lane + 16 for lanes < 16 */
    uint8_t *b = row + blk * 18;
    if (lane < 16) {
        int lo = (int)__fadd_rn(__fmul_rn(v, id), 8.5f), hi = (int)__fadd_rn(__fmul_rn(hi_v, id), 8.5f); /* no fused multiply-add: the CPU's bytes */
        lo = lo < 15 ? lo : 15;
        hi = hi < 15 ? hi : 15;
        b[2 + lane] = (uint8_t)(lo | (hi << 4));
    }
    if (lane == 0) *(__half *)b = __float2half_rn(d);
}

/* Value i (of a head starting at p) of a cache row of type t, as the CPU dequantizes it. */
__device__ __forceinline__ float kv_value(const uint8_t *p, int t, int i) {
    if (t == TN_CU_KV_F16) return __half2float(((const __half *)p)[i]);
    if (t == TN_CU_KV_Q8_0) {
        const uint8_t *b = p + (i / 32) * 34;
        return (float)(int8_t)b[2 + i % 32] * h2f(*(const uint16_t *)b);
    }
    if (kv_tq_bits(t)) { /* d c + m */
        const uint8_t *b = p + (i / 32) * kv_block_bytes(t);
        return __fadd_rn(__fmul_rn(h2f(((const uint16_t *)b)[0]), (float)tq_code(b + 4, kv_tq_bits(t), i % 32)),
                         h2f(((const uint16_t *)b)[1]));
    }
    const uint8_t *b = p + (i / 32) * 18;
    const int j = i % 32, q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
    return (float)(q - 8) * h2f(*(const uint16_t *)b);
}

/* q . k for a tq<B>g32a K head at p and the query as q8 blocks (codes qq, 16-byte aligned; scales qd;
 * sums qs): per block d_q (d_k sum(c q) + m_k sum(q)), summed in block order, as the CPU's
 * tn_tq_vec_dot_ref (rounded operations: no contraction to fused multiply-adds). */
template <int B> __device__ float kv_dot_tq(const uint8_t *p, const int8_t *qq, const float *qd, const int32_t *qs, int hd) {
    float s = 0.0f;
    for (int b = 0; b < hd / 32; b++) {
        const uint8_t *kb = p + b * (4 + 4 * B);
        uint32_t c[8];
        load_chunk<B>(kb + 4, 0, 1, c);
        const int *a = (const int *)(qq + b * 32);
        int sq = 0;
#pragma unroll
        for (int g = 0; g < 8; g++) sq = dp4a_us(c[g], a[g], sq);
        const float d = h2f(((const uint16_t *)kb)[0]), m = h2f(((const uint16_t *)kb)[1]);
        s = __fadd_rn(s, __fmul_rn(qd[b], __fadd_rn(__fmul_rn(d, (float)sq), __fmul_rn(m, (float)qs[b]))));
    }
    return s;
}

/* q . k for a quantized K head at p and the query as q8 blocks (qq codes, qd fp16-rounded scales, qs
 * sums): q8_0 / q4_0 per block the integer sum, then sum += sumi * (d_k * d_q) in block order, as
 * the CPU's vec_dot_q8_0_q8_0 / q4_0_q8_0 reference; tq<b>g32a kv_dot_tq. */
__device__ __forceinline__ float kv_dot_q(const uint8_t *p, int t, const int8_t *qq, const float *qd, const int32_t *qs, int hd) {
    switch (kv_tq_bits(t)) {
    case 2: return kv_dot_tq<2>(p, qq, qd, qs, hd);
    case 3: return kv_dot_tq<3>(p, qq, qd, qs, hd);
    case 4: return kv_dot_tq<4>(p, qq, qd, qs, hd);
    case 5: return kv_dot_tq<5>(p, qq, qd, qs, hd);
    case 6: return kv_dot_tq<6>(p, qq, qd, qs, hd);
    case 7: return kv_dot_tq<7>(p, qq, qd, qs, hd);
    case 8: return kv_dot_tq<8>(p, qq, qd, qs, hd);
    default: break;
    }
    float s = 0.0f;
    for (int b = 0; b < hd / 32; b++) {
        int sumi = 0;
        const int8_t *qb = qq + b * 32;
        const uint8_t *kb = p + b * kv_block_bytes(t);
        if (t == TN_CU_KV_Q8_0)
            for (int i = 0; i < 32; i++) sumi += (int)(int8_t)kb[2 + i] * (int)qb[i];
        else
            for (int j = 0; j < 16; j++) sumi += ((kb[2 + j] & 15) - 8) * (int)qb[j] + ((kb[2 + j] >> 4) - 8) * (int)qb[j + 16];
        s += (float)sumi * (h2f(*(const uint16_t *)kb) * qd[b]);
    }
    return s;
}

#ifdef TN_CUDA_EMU /* (libstdc++ spells the attribute __noinline__: the emulator cannot define it) */
#define TN_NOINLINE __attribute__((noinline))
#else
#define TN_NOINLINE __noinline__
#endif
/* q . k of a key in a complete per-channel group (quant/kc.h): the kv head's part of the group's
 * first row at g0 (rows k_rb apart), the key its row r; sum over the channels in order of
 * q_c (d_c c + m_c), the stats (d, m) of channel 32 j + i in the group's row i / 2 (chunk j), as
 * the CPU's tn_attn1_kc dequantizes and dots them (rounded operations, no fused multiply-adds). */
template <int B> __device__ float kv_dot_kc(const uint8_t *g0, int64_t k_rb, int r, const float *q, int hd) {
    constexpr int cb = 8 + 4 * B; /* bytes of a chunk */
    float s = 0.0f;
    for (int j = 0; j < hd / 32; j++) {
        uint32_t c[8];
        load_chunk<B>(g0 + r * k_rb + j * cb + 8, 0, 1, c);
#pragma unroll 4
        for (int i = 0; i < 32; i++) {
            const uint16_t *st = (const uint16_t *)(g0 + (i / 2) * k_rb + j * cb) + 2 * (i % 2);
            const float code = (float)((c[i / 4] >> (8 * (i % 4))) & 0xFFu);
            s = __fadd_rn(s, __fmul_rn(q[32 * j + i], __fadd_rn(__fmul_rn(h2f(st[0]), code), h2f(st[1]))));
        }
    }
    return s;
}
/* (not inlined: the per-channel path's registers stay out of the attention kernels' other paths) */
static __device__ TN_NOINLINE float kv_dot_kc_b(int bits, const uint8_t *g0, int64_t k_rb, int r, const float *q, int hd) {
    return bits == 2 ? kv_dot_kc<2>(g0, k_rb, r, q, hd) : bits == 3 ? kv_dot_kc<3>(g0, k_rb, r, q, hd) : kv_dot_kc<4>(g0, k_rb, r, q, hd);
}
/* The f16 row of position p of token t's sequence in a per-channel K window, at kv head kvh. */
__device__ __forceinline__ const __half *kv_kc_win(const tn_cu_kv &kv, int64_t t, int p, int kv_dim, int kvh, int hd) {
    return (const __half *)kv.kw + (int64_t)(kv.wseq[t] + p % kv.kc_w) * kv_dim + (int64_t)kvh * hd;
}

/* The cache row of position p: p (the contiguous cache; p % ring in a sliding-window layer's
 * ring), or its block's row in the token's table at tbl + off (paged blocks of 16). */
__device__ __forceinline__ int64_t kv_pos_row(const tn_cu_kv &kv, int off, const int32_t *tbl, int p) {
    return off < 0 ? (kv.ring ? p % kv.ring : p) : (int64_t)tbl[off + p / 16] * 16 + p % 16;
}

#define ATT_THREADS 256
#define ATT_CHUNK TN_CU_ATT_CHUNK
/* Blocks of 256 threads per (token, head), positions in chunks of 512: the threads score a chunk's
 * positions in parallel (each a whole K row, 16-byte loads), the block takes the chunk's max m and
 * its sum l of exp(s - m), then thread (g, d) accumulates dimension d of V over the chunk's
 * positions g, g+G, .. (G = 256/hd groups; rows read whole by consecutive threads), the groups
 * summed into the chunk's o. The chunks' (m, l, o) are folded in order, each rescaled to the
 * running maximum (attn_fold), and the output is o / l. f32 throughout; K, V in f16 as the cache
 * holds them.
 * Flash-decoding (sp.part, S > 1): a (token, head) with K > 1 chunks has min(S, K) blocks, block s
 * taking chunks s, s + S, ..; each writes its chunks' (m, l, o) to sp.part, and the last block to
 * finish (counted on sp.cnt) folds all K in order. The same per-chunk arithmetic and the same fold
 * in the same order as one block doing every chunk: the same bits for any S. */
/* A quantized cache (kv.tk / kv.tv q8_0 or q4_0): a quantized K is dotted with the query as q8
 * blocks (the CPU's activation quantizer), integer sums per block, as the CPU's attention over such
 * a cache; V values are dequantized as they are accumulated. A rotated cache (kv.rot_k, kv.rot_v):
 * the query (rot_k) is rotated like the keys were, and the output (rot_v) rotated back. */
/* With ar.cs (one-token steps, kern_cuda.h's tn_cu_rope): the block first does what k_rope_store
 * would for its head: the query head's norm and RoPE in shared memory, and its key/value head's
 * new row normed, rotated and rounded to fp16, which it uses for the token's own position (the
 * leader of each group of query heads stores it to the cache: no block of this launch reads it
 * there). The same functions as k_rope_store, so the same bits. */
/* dot + q[0 .. 7] . the 8 f16 values in u, as fused multiply-adds in order (written out: the same
 * bits in every kernel that inlines it) */
__device__ __forceinline__ float dot8_h(float dot, const float *q, const uint4 &u) {
    const __half2 *h2 = (const __half2 *)&u;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const float2 f = __half22float2(h2[c]);
        dot = __fmaf_rn(q[2 * c + 1], f.y, __fmaf_rn(q[2 * c], f.x, dot));
    }
    return dot;
}
/* The running fold (M, L, O) of the chunks so far and one more chunk (m, l, o): both rescaled to
 * the larger maximum. Rounded as written (no contraction): the split and unsplit paths fold with
 * these same operations. The first chunk gives (m, l, o) exactly (a = 0, b = 1). */
__device__ __forceinline__ float attn_fold_add(float X, float x, float a, float b) { return __fadd_rn(__fmul_rn(X, a), __fmul_rn(x, b)); }
__device__ __forceinline__ void attn_fold(float &M, float &L, float &O, float m, float l, float o) {
    const float Mn = fmaxf(M, m), a = expf(M - Mn), b = expf(m - Mn);
    L = attn_fold_add(L, l, a, b);
    O = attn_fold_add(O, o, a, b);
    M = Mn;
}
/* The fold of K chunks' partials (m, l, o[hd]) at pp, in order, read through L2 (other blocks wrote
 * them): (M, L, O) for dimension tid < hd. Not inlined: a path taken once per split (token, head),
 * whose registers would otherwise add to the persistent kernel's. */
static __device__ TN_NOINLINE float3 attn_fold_parts(const float *pp, int K, int hd, int tid) {
    float M = -INFINITY, L = 0.0f, O = 0.0f;
    for (int c = 0; c < K; c++, pp += hd + 2) attn_fold(M, L, O, __ldcg(pp), __ldcg(pp + 1), tid < hd ? __ldcg(pp + 2 + tid) : 0.0f);
    return make_float3(M, L, O);
}
/* (The body of block s of S of `unit` = token * n_head + head; k_attn_block and the persistent
 * kernel call it with ATT_THREADS threads; a block with nothing to do returns at once.) */
__device__ __forceinline__ void attn_unit(int64_t unit, int s, int S, const tn_cu_attn_sched &sp, const float *q, int64_t ldq,
                                          const uint8_t *Kc, const uint8_t *Vc, int n_head, int n_head_kv, int hd,
                                          const int32_t *pos, const int32_t *tbl_off, const int32_t *tbl, float scale, float cap,
                                          int window, const float *sinks, float *out, const tn_cq &xq, const tn_cu_rope &ar,
                                          const tn_cu_kv &kv) {
    __shared__ __align__(16) float qs[2 * ATT_THREADS];
    __shared__ float sc[ATT_CHUNK];
    __shared__ int32_t rows[ATT_CHUNK];
    __shared__ float red[ATT_THREADS / WARP];
    __shared__ float part[ATT_THREADS];
    __shared__ __align__(16) float kf[ATT_THREADS], vf[ATT_THREADS];
    /* the token's own new K and V rows (one head) as the cache stores them: f16, or q8_0 / q4_0 blocks */
    __shared__ __align__(16) __half kh[ATT_THREADS], vh[ATT_THREADS];
    __shared__ __align__(16) int8_t qq[ATT_THREADS]; /* a quantized K: the query as q8 blocks (codes, scales, sums) */
    __shared__ float qd[ATT_THREADS / 32];
    __shared__ int32_t qsum[ATT_THREADS / 32];
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int64_t t = unit / n_head;
    const int h = (int)(unit % n_head), kvh = h / (n_head / n_head_kv), kv_dim = n_head_kv * hd;
    const bool f16kv = kv.tk == TN_CU_KV_F16 && kv.tv == TN_CU_KV_F16;
    const int64_t k_rb = f16kv ? (int64_t)kv_dim * 2 : kv.k_rb, v_rb = f16kv ? (int64_t)kv_dim * 2 : kv.v_rb;
    const int64_t koff = kv_head_off(kv.tk, kvh, hd), voff = kv_head_off(kv.tv, kvh, hd);
    /* positions p_lo .. T - 1 (all, or the last `window` on a sliding-window layer) in K chunks of
     * ATT_CHUNK from p_lo; chunk c by split block c % Se (Se = 1: this block does them all) */
    const int T = pos[t] + 1, off = tbl_off[t], p_lo = window > 0 && T > window ? T - window : 0;
    const int K = (T - p_lo + ATT_CHUNK - 1) / ATT_CHUNK;
    const int Se = sp.part && K <= sp.kmax ? min(S, K) : 1;
    if (s >= Se) return;
    for (int i = tid; i < hd; i += ATT_THREADS) qs[i] = q[t * ldq + (int64_t)h * hd + i];
    const bool fused = ar.cs != nullptr;
    if (fused) {
        for (int i = tid; i < hd; i += ATT_THREADS) {
            kf[i] = ar.k[t * ar.ldk + (int64_t)kvh * hd + i];
            vf[i] = ar.v[t * ar.ldk + (int64_t)kvh * hd + i];
        }
        __syncthreads();
        if (ar.qn && warp == 0) head_norm_warp(qs, hd, ar.qn, ar.eps, lane);
        if (ar.kn && warp == 1) head_norm_warp(kf, hd, ar.kn, ar.eps, lane);
        __syncthreads();
        const int np2 = ar.n_rot / 2;
        for (int u = tid; u < 2 * np2; u += ATT_THREADS)
            rope_pair(u < np2 ? qs : kf, 2 * (u % np2), ar.cs + t * ar.n_rot, ar.n_rot, ar.neox);
        __syncthreads();
        if (kv.rot_k && warp == 0) kv_rot_warp(qs, hd, kv.rot_sign, kv.rot_blk, false, lane);
        if (kv.rot_k && warp == 1) kv_rot_warp(kf, hd, kv.rot_sign, kv.rot_blk, false, lane);
        if (kv.rot_v && warp == 2) kv_rot_warp(vf, hd, kv.rot_sign, kv.rot_blk, false, lane);
        __syncthreads();
        if (f16kv) {
            for (int i = tid; i < hd; i += ATT_THREADS) {
                kh[i] = __float2half_rn(kf[i]);
                vh[i] = __float2half_rn(vf[i]);
            }
        } else {
            for (int b = warp; b < 2 * (hd / 32); b += ATT_THREADS / WARP) { /* the head's K blocks, then its V blocks */
                const bool isv = b >= hd / 32;
                const int e0 = (isv ? b - hd / 32 : b) * 32;
                kv_store_warp((uint8_t *)(isv ? vh : kh), isv ? kv.tv : kv.tk, e0, (isv ? vf : kf)[e0 + lane], lane);
            }
        }
        __syncthreads();
        if (h % (n_head / n_head_kv) == 0 && s == 0) { /* the group's leader stores the row's bytes */
            const int64_t r = ar.kvrow[t];
            const int kb = (int)(kv_head_off(kv.tk, 1, hd)), vb = (int)(kv_head_off(kv.tv, 1, hd)); /* a head's bytes */
            for (int i = tid; i < kb; i += ATT_THREADS) ((uint8_t *)ar.Kc)[r * k_rb + koff + i] = ((const uint8_t *)kh)[i];
            for (int i = tid; i < vb; i += ATT_THREADS) ((uint8_t *)ar.Vc)[r * v_rb + voff + i] = ((const uint8_t *)vh)[i];
        }
    } /* else: the query was normed, rotated (and turned, rot_k) by k_rope_store */
    /* per-channel K: keys below Qk (complete groups) from the cache, the others from the window */
    const int kcb = kv_kc_bits(kv.tk), Qk = T - T % 16;
    if (kv.tk != TN_CU_KV_F16 && !kcb) { /* the query as q8 blocks, a warp per block, as the CPU's activation quantizer */
        __syncthreads();
        const tn_cq sq = {qq, qd, qsum};
        for (int b = warp; b < hd / 32; b += ATT_THREADS / WARP) q8_block(qs[b * 32 + lane], lane, b, b * 32, sq);
    }
    const int G = ATT_THREADS / hd, gi = tid / hd, d0 = tid % hd; /* hd <= ATT_THREADS */
    const bool active = gi < G;
    const bool vec = (hd & 7) == 0 && (kv_dim & 7) == 0;
    float M = -INFINITY, L = 0.0f, O = 0.0f; /* the fold of the chunks so far (O: dimension tid < hd) */
    __syncthreads();
    for (int c = s; c < K; c += Se) {
        const int p0 = p_lo + c * ATT_CHUNK, np = min(ATT_CHUNK, T - p0);
        float cmax = -INFINITY;
        for (int j = tid; j < np; j += ATT_THREADS) {
            const int p = p0 + j;
            const int64_t row = kv_pos_row(kv, off, tbl, p);
            const bool own = fused && p == T - 1; /* the new row, in shared memory */
            rows[j] = own ? -1 : (int32_t)row;
            const uint8_t *krow = own ? (const uint8_t *)kh
                                  : kcb && p >= Qk ? (const uint8_t *)kv_kc_win(kv, t, p, kv_dim, kvh, hd) : Kc + row * k_rb + koff;
            float dot = 0.0f;
            if (kcb && p < Qk) { /* (rows of a block are consecutive: the group's first is row - p % 16) */
                dot = kv_dot_kc_b(kcb, krow - (int64_t)(p % 16) * k_rb, k_rb, p % 16, qs, hd);
            } else if (kv.tk != TN_CU_KV_F16 && !kcb) {
                dot = kv_dot_q(krow, kv.tk, qq, qd, qsum, hd);
            } else if (vec) {
                const __half *kr = (const __half *)krow;
#pragma unroll 8 /* the row's loads in flight together (hd <= 64: all of them) */
                for (int i = 0; i < hd; i += 8) dot = dot8_h(dot, qs + i, *(const uint4 *)(kr + i));
            } else {
                const __half *kr = (const __half *)krow;
                for (int i = 0; i < hd; i++) dot += qs[i] * __half2float(kr[i]);
            }
            float sco = dot * scale;
            if (cap > 0.0f) sco = cap * tanhf(sco); /* soft-capped scores (gemma2): scale is then 1/(sqrt(hd) cap) */
            sc[j] = sco;
            cmax = fmaxf(cmax, sco);
        }
        /* the chunk's own softmax: its max m, sum l, and o = sum_j exp(s_j - m) v_j */
        cmax = warp_max(cmax);
        if (lane == 0) red[warp] = cmax;
        __syncthreads();
        float m = red[0];
        for (int w = 1; w < ATT_THREADS / WARP; w++) m = fmaxf(m, red[w]);
        __syncthreads();
        float csum = 0.0f;
        for (int j = tid; j < np; j += ATT_THREADS) {
            const float e = expf(sc[j] - m);
            sc[j] = e;
            csum += e;
        }
        csum = warp_sum(csum);
        if (lane == 0) red[warp] = csum;
        __syncthreads();
        float l = 0.0f;
        for (int w = 0; w < ATT_THREADS / WARP; w++) l += red[w];
        float acc = 0.0f;
        if (active && kv.tv == TN_CU_KV_F16) {
#pragma unroll 8
            for (int j = gi; j < np; j += G) {
                const __half *vr = rows[j] < 0 ? vh : (const __half *)(Vc + (int64_t)rows[j] * v_rb + voff);
                acc = __fmaf_rn(sc[j], __half2float(vr[d0]), acc);
            }
        } else if (active) {
            for (int j = gi; j < np; j += G) {
                const uint8_t *vr = rows[j] < 0 ? (const uint8_t *)vh : Vc + (int64_t)rows[j] * v_rb + voff;
                acc = __fmaf_rn(sc[j], kv_value(vr, kv.tv, d0), acc);
            }
        }
        if (active) part[tid] = acc;
        __syncthreads();
        float o = 0.0f;
        if (tid < hd)
            for (int g = 0; g < G; g++) o += part[g * hd + tid];
        if (Se == 1) {
            attn_fold(M, L, O, m, l, o);
        } else { /* the chunk's partial, for the unit's last block to fold */
            float *pp = sp.part + ((int64_t)unit * sp.kmax + c) * (hd + 2);
            if (tid == 0) pp[0] = m, pp[1] = l;
            if (tid < hd) pp[2 + tid] = o;
        }
        __syncthreads(); /* sc, rows, red and part are rewritten by the next chunk */
    }
    if (Se > 1) { /* split: the unit's last block to finish folds every chunk's partial, in order */
        __shared__ int last;
        __threadfence();
        __syncthreads();
        if (tid == 0) last = atomicAdd(sp.cnt + unit, 1) == Se - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        const float3 f = attn_fold_parts(sp.part + (int64_t)unit * sp.kmax * (hd + 2), K, hd, tid);
        M = f.x, L = f.y, O = f.z;
        if (tid == 0) sp.cnt[unit] = 0;
    }
    if (sinks) L += expf(sinks[h] - M); /* gpt-oss: one more logit in the denominator */
    float *out_t = out + t * (int64_t)n_head * hd + (int64_t)h * hd;
    float r = tid < hd ? O / L : 0.0f;
    if (kv.rot_v) { /* the output rotated back (D H), in shared memory */
        __syncthreads();
        if (tid < hd) kf[tid] = r;
        __syncthreads();
        if (warp == 0) kv_rot_warp(kf, hd, kv.rot_sign, kv.rot_blk, true, lane);
        __syncthreads();
        if (tid < hd) r = kf[tid];
    }
    if (tid < hd) {
        out_t[tid] = r;
        /* the output quantized for Wo as it is written (hd % 32 == 0: whole warps, whole blocks) */
        if (xq.q) {
            const int64_t e = t * (int64_t)n_head * hd + (int64_t)h * hd + tid;
            q8_block(r, lane, e / 32, e - lane, xq);
        }
    }
}

#endif
