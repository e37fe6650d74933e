/*
 * rc.c — adaptive binary range coder (see rc.h). The coder keeps low (33 bits used) and range
 * (32 bits); a bit splits range at bound = (range >> 12) * P(0) (1 <= P(0) <= 4095: an update
 * moves it at most halfway to 0 or 4096); when range falls under 2^24 a
 * byte is shifted out. A carry out of low's 32 bits propagates into the bytes not yet written:
 * the last byte (cache) and a run of 0xFF bytes behind it (cache_n counts them).
 */
#include "core/rc.h"

#define TOP (1u << 24)
#define PMASK ((1u << TN_RC_PROB_BITS) - 1)

/* A probability's update after a bit: toward it by 1 / (n + 2) for the n-th time it is used
 * (n < 15: a new context learns fast), then by 1 / 32 (in 1/256ths: round(256 / (n + 2))). */
static const uint8_t rate[16] = {128, 85, 64, 51, 43, 37, 32, 28, 26, 23, 21, 20, 18, 17, 16, 8};
static inline void adapt(tn_rc_prob *p, int bit) {
    const uint32_t n = *p >> TN_RC_PROB_BITS, q = *p & PMASK, r = rate[n];
    const uint32_t q2 = bit ? q - ((q * r) >> 8) : q + ((((1u << TN_RC_PROB_BITS) - q) * r) >> 8);
    *p = (tn_rc_prob)((n < 15 ? n + 1 : n) << TN_RC_PROB_BITS | q2);
}

static void put(tn_rc_enc *e, uint8_t b) {
    if (e->n < e->cap) e->out[e->n] = b;
    else e->overflow = true;
    e->n++;
}

static void shift_low(tn_rc_enc *e) {
    if ((uint32_t)e->low < 0xFF000000u || (e->low >> 32) != 0) {
        const uint8_t carry = (uint8_t)(e->low >> 32);
        uint8_t b = e->cache;
        do {
            put(e, (uint8_t)(b + carry));
            b = 0xFF;
        } while (--e->cache_n != 0);
        e->cache = (uint8_t)(e->low >> 24);
    }
    e->cache_n++;
    e->low = (uint32_t)(e->low << 8);
}

void tn_rc_enc_init(tn_rc_enc *e, uint8_t *out, size_t cap) {
    *e = (tn_rc_enc){0, 0xFFFFFFFFu, 0, 1, out, 0, cap, false};
}

void tn_rc_enc_bit(tn_rc_enc *e, tn_rc_prob *p, int bit) {
    const uint32_t bound = (e->range >> TN_RC_PROB_BITS) * (*p & PMASK);
    if (!bit) {
        e->range = bound;
    } else {
        e->low += bound;
        e->range -= bound;
    }
    adapt(p, bit);
    while (e->range < TOP) {
        e->range <<= 8;
        shift_low(e);
    }
}

size_t tn_rc_enc_finish(tn_rc_enc *e) {
    for (int i = 0; i < 5; i++) shift_low(e);
    return e->overflow ? 0 : e->n;
}

static uint8_t get(tn_rc_dec *d) {
    if (d->pos < d->n) return d->in[d->pos++];
    d->overrun = true;
    return 0;
}

void tn_rc_dec_init(tn_rc_dec *d, const uint8_t *in, size_t n) {
    *d = (tn_rc_dec){0xFFFFFFFFu, 0, in, n, 0, false};
    for (int i = 0; i < 5; i++) d->code = d->code << 8 | get(d);
}

int tn_rc_dec_bit(tn_rc_dec *d, tn_rc_prob *p) {
    const uint32_t bound = (d->range >> TN_RC_PROB_BITS) * (*p & PMASK);
    int bit;
    if (d->code < bound) {
        d->range = bound;
        bit = 0;
    } else {
        d->code -= bound;
        d->range -= bound;
        bit = 1;
    }
    adapt(p, bit);
    while (d->range < TOP) {
        d->range <<= 8;
        d->code = d->code << 8 | get(d);
    }
    return bit;
}

/* ---- integers: zero flag, sign, then m = |v| as Elias gamma: k = floor(log2 m) ones-then-zero
 * on the prefix probabilities, then the k bits under the leading one, each with a probability of
 * its own (per k and bit position) ---------------------------------------------------------- */
void tn_rc_int_model_init(tn_rc_int_model *m) {
    m->zero = m->sign = TN_RC_PROB_INIT;
    for (int i = 0; i < TN_RC_INT_MAXLOG; i++) {
        m->pre[i] = TN_RC_PROB_INIT;
        for (int j = 0; j < TN_RC_INT_MAXLOG; j++) m->suf[i][j] = TN_RC_PROB_INIT;
    }
}

void tn_rc_enc_int(tn_rc_enc *e, tn_rc_int_model *m, int32_t v) {
    const int32_t lim = (1 << (TN_RC_INT_MAXLOG - 1)) - 1;
    if (v > lim) v = lim;
    if (v < -lim) v = -lim;
    tn_rc_enc_bit(e, &m->zero, v != 0);
    if (!v) return;
    tn_rc_enc_bit(e, &m->sign, v < 0);
    const uint32_t a = (uint32_t)(v < 0 ? -v : v);
    int k = 0;
    while ((a >> (k + 1)) != 0) k++;
    for (int i = 0; i < k; i++) tn_rc_enc_bit(e, &m->pre[i], 1);
    tn_rc_enc_bit(e, &m->pre[k], 0);
    for (int j = k - 1; j >= 0; j--) tn_rc_enc_bit(e, &m->suf[k][j], (int)(a >> j) & 1);
}

int32_t tn_rc_dec_int(tn_rc_dec *d, tn_rc_int_model *m, bool *ok) {
    if (!tn_rc_dec_bit(d, &m->zero)) return 0;
    const int neg = tn_rc_dec_bit(d, &m->sign);
    int k = 0;
    while (tn_rc_dec_bit(d, &m->pre[k])) {
        if (++k >= TN_RC_INT_MAXLOG - 1) {
            *ok = false;
            return 0;
        }
    }
    uint32_t a = 1;
    for (int j = k - 1; j >= 0; j--) a = a << 1 | (uint32_t)tn_rc_dec_bit(d, &m->suf[k][j]);
    return neg ? -(int32_t)a : (int32_t)a;
}
