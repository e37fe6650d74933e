/*
 * rc.h — an adaptive binary range coder (the kind LZMA uses): each coded bit carries a 12-bit
 * probability that adapts toward what was coded, by 1 / (n + 2) for its n-th use while n < 15
 * (a context learns from its first few bits, which matters when models start fresh every 16
 * tokens) and by 1 / 32 after that, so a stream of decisions costs close to its empirical
 * entropy under the model the caller builds from contexts. Integers are coded
 * as a zero flag, a sign and an Elias-gamma magnitude whose prefix and suffix bits have their
 * own adaptive probabilities (tn_rc_int_*).
 *
 * The encoder writes into a caller's buffer and reports overflow instead of writing past it; the
 * decoder reads zeros past the end of its input and says so (tn_rc_dec_overrun), so corrupt or
 * truncated input decodes to some values, never out of bounds.
 */
#ifndef TN_CORE_RC_H
#define TN_CORE_RC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TN_RC_PROB_BITS 12
#define TN_RC_PROB_INIT (1u << (TN_RC_PROB_BITS - 1))
typedef uint16_t tn_rc_prob; /* P(bit = 0) in 1 / 2^12 (low 12 bits), uses so far (high 4, to 15) */

typedef struct tn_rc_enc {
    uint64_t low;
    uint32_t range;
    uint8_t cache;
    uint64_t cache_n;
    uint8_t *out;
    size_t n, cap;
    bool overflow;
} tn_rc_enc;

typedef struct tn_rc_dec {
    uint32_t range, code;
    const uint8_t *in;
    size_t n, pos;
    bool overrun;
} tn_rc_dec;

void tn_rc_enc_init(tn_rc_enc *e, uint8_t *out, size_t cap);
void tn_rc_enc_bit(tn_rc_enc *e, tn_rc_prob *p, int bit);
/* Flushes; returns the bytes written, 0 on overflow (cap too small). */
size_t tn_rc_enc_finish(tn_rc_enc *e);

void tn_rc_dec_init(tn_rc_dec *d, const uint8_t *in, size_t n);
int tn_rc_dec_bit(tn_rc_dec *d, tn_rc_prob *p);
/* True when the decoder needed bytes past the end of its input (the input was not what the
 * encoder wrote). */
static inline bool tn_rc_dec_overrun(const tn_rc_dec *d) { return d->overrun; }

/* ---- integers ------------------------------------------------------------------------------ */
#define TN_RC_INT_MAXLOG 24 /* |v| < 2^24 */
typedef struct tn_rc_int_model {
    tn_rc_prob zero, sign, pre[TN_RC_INT_MAXLOG], suf[TN_RC_INT_MAXLOG][TN_RC_INT_MAXLOG];
} tn_rc_int_model;

void tn_rc_int_model_init(tn_rc_int_model *m);
/* Codes v, |v| < 2^TN_RC_INT_MAXLOG - 1 (larger values are clamped: the caller keeps in range). */
void tn_rc_enc_int(tn_rc_enc *e, tn_rc_int_model *m, int32_t v);
/* Decodes a value; *ok false when its prefix is longer than any the encoder writes. */
int32_t tn_rc_dec_int(tn_rc_dec *d, tn_rc_int_model *m, bool *ok);

#endif
