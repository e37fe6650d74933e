/*
 * tokenizer_impl.h — private to src/model/tokenizer*.c: the vocabulary struct, growable buffers,
 * the UTF-8 and byte-to-unicode helpers every part shares, and the entry points between parts:
 *
 *   tokenizer.c      load + validation, special-token split, driver, pieces, detokenize
 *   tokenizer_spm.c  SentencePiece-style merge by score over UTF-8 characters
 *   tokenizer_bpe.c  byte-level BPE merge by rank over pre-tokenized words
 *   tokenizer_pre.c  pre-tokenizer regex sets (PCRE2) and llama.cpp's word splitting rules
 *
 * Invariant: a loaded tn_vocab is never written again, except the pre-tokenizer's character
 * class cache, which uses relaxed atomics and only ever stores the one correct value.
 */
#ifndef TN_MODEL_TOKENIZER_IMPL_H
#define TN_MODEL_TOKENIZER_IMPL_H

#include <string.h>

#include "model/tokenizer.h"

enum { TN_VOCAB_SPM = 1, TN_VOCAB_BPE = 2 };

/* llama.cpp's llama_token_attr bits (the ones tern uses). */
enum {
    TN_ATTR_UNKNOWN = 1 << 0, TN_ATTR_UNUSED = 1 << 1, TN_ATTR_NORMAL = 1 << 2,
    TN_ATTR_CONTROL = 1 << 3, TN_ATTR_USER_DEFINED = 1 << 4, TN_ATTR_BYTE = 1 << 5,
    TN_ATTR_LSTRIP = 1 << 7, TN_ATTR_RSTRIP = 1 << 8
};

#define TN_SPM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's visible space (3 bytes) */
#define TN_VOCAB_MAX_TOKEN_LEN (1u << 20) /* bytes of one token text or merge (G31 cap) */

typedef struct tn_pretok tn_pretok;

struct tn_vocab {
    int kind;                /* TN_VOCAB_SPM / TN_VOCAB_BPE                                  */
    int32_t n;               /* tokens                                                      */
    char *blob;              /* token texts, each NUL-terminated                            */
    size_t *off;             /* [n] start of token i in blob                                */
    uint32_t *len;           /* [n] bytes of token i                                        */
    float *score;            /* [n] SPM merge priority (0 when the file has none)            */
    uint16_t *attr;          /* [n] TN_ATTR_* bits                                           */
    uint8_t *type;           /* [n] token type as read (0..6)                                */
    uint8_t *eog;            /* [n] 1 = end of generation                                   */
    int32_t *map;            /* open-addressing text -> id table, -1 = empty slot            */
    uint64_t map_mask;

    /* merges (BPE): "first second" pairs, rank = index of first occurrence */
    char *mblob;             /* first and second of each merge, back to back                */
    size_t *moff;            /* [n_merges]                                                  */
    uint32_t *mlen1, *mlen2; /* [n_merges] bytes of first / second                          */
    int64_t n_merges;
    int32_t *mmap;           /* open-addressing (first, second) -> merge index, -1 = empty  */
    uint64_t mmap_mask;

    /* pieces as llama_token_to_piece(special = true) renders them */
    char *pblob;
    size_t *poff;
    uint32_t *plen;

    /* special tokens (control, user-defined, unknown) by decreasing text length, and a
     * bucket index on their first two bytes for finding which of them occur in a text */
    int32_t *special;
    int32_t n_special;
    uint32_t *sp_start2;     /* [65537] bucket starts into sp_ids2 (tokens of >= 2 bytes)    */
    int32_t *sp_ids2;        /* positions in `special`                                      */
    uint32_t sp_start1[257]; /* same for one-byte tokens                                    */
    int32_t *sp_ids1;

    int32_t bos, eos, eot, eom, unk, sep, pad, mask;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    int32_t byte_tok[256];   /* SPM byte fallback: <0xXX> (or the raw byte) token, -1 none  */
    bool add_bos, add_eos, add_space_prefix, clean_spaces, ignore_merges;
    bool spm_split;          /* SPM: no token has U+2581 after a non-U+2581 byte, so merges never
                                cross the start of a U+2581 run and the text can be merged per word */

    int pre;                 /* index into the pre-tokenizer table                          */
    tn_pretok *pretok;       /* BPE only                                                    */
};

/* ---- growable buffers ---------------------------------------------------------------------- */
typedef struct tn_ivec {
    int32_t *p;
    size_t n, cap;
} tn_ivec;

typedef struct tn_bbuf {
    char *p;
    size_t n, cap;
} tn_bbuf;

tern_status tn_ivec_reserve(tn_ivec *v, size_t n);
static inline tern_status tn_ivec_push(tn_ivec *v, int32_t x) {
    if (v->n == v->cap) {
        tern_status s = tn_ivec_reserve(v, v->n + 1);
        if (s) return s;
    }
    v->p[v->n++] = x;
    return TERN_OK;
}
typedef struct tn_zvec {
    size_t *p;
    size_t n, cap;
} tn_zvec;

tern_status tn_bbuf_reserve(tn_bbuf *b, size_t n);
tern_status tn_zvec_push(tn_zvec *v, size_t x);
static inline tern_status tn_bbuf_put(tn_bbuf *b, const void *p, size_t n) {
    if (b->cap - b->n < n) {
        tern_status s = tn_bbuf_reserve(b, b->n + n);
        if (s) return s;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    return TERN_OK;
}

/* ---- lookups -------------------------------------------------------------------------------- */
static inline uint64_t tn_tok_hash_cont(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}
static inline uint64_t tn_tok_hash(const char *s, size_t n) {
    return tn_tok_hash_cont(0xcbf29ce484222325ull, s, n);
}
/* Token id of the exact text s[0..n), -1 if none. */
int32_t tn_vocab_find(const tn_vocab *v, const char *s, size_t n);
/* Rank of merge (l, r), -1 if none. */
int32_t tn_vocab_merge_rank(const tn_vocab *v, const char *l, size_t ln, const char *r, size_t rn);
static inline const char *tn_vocab_tok(const tn_vocab *v, int32_t id) { return v->blob + v->off[id]; }

/* ---- UTF-8, as llama.cpp's unicode.cpp reads and writes it ---------------------------------- */
/* Sequence length implied by a lead byte (continuation and invalid bytes count 1). */
static inline size_t tn_utf8_len(unsigned char c) {
    static const uint8_t lut[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lut[c >> 4];
}
/* Decodes one code point at s[*off] (*off < n) and advances. Continuation bytes are checked but
 * overlong forms and surrogates are accepted (llama.cpp does the same); anything invalid yields
 * U+FFFD and advances one byte. Values above U+10FFFF (llama.cpp throws on them later) also
 * become U+FFFD. */
static inline uint32_t tn_utf8_decode(const unsigned char *s, size_t n, size_t *off) {
    size_t i = *off;
    unsigned c = s[i];
    if (c < 0x80) {
        *off = i + 1;
        return c;
    }
    if ((c & 0xE0) == 0xC0) {
        if (i + 1 < n && (s[i + 1] & 0xC0) == 0x80) {
            *off = i + 2;
            return ((c & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
        }
    } else if ((c & 0xF0) == 0xE0) {
        if (i + 2 < n && (s[i + 1] & 0xC0) == 0x80 && (s[i + 2] & 0xC0) == 0x80) {
            *off = i + 3;
            return ((c & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu);
        }
    } else if ((c & 0xF8) == 0xF0) {
        if (i + 3 < n && (s[i + 1] & 0xC0) == 0x80 && (s[i + 2] & 0xC0) == 0x80 && (s[i + 3] & 0xC0) == 0x80) {
            uint32_t cp = ((c & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) | (s[i + 3] & 0x3Fu);
            *off = i + 4;
            return cp <= 0x10FFFF ? cp : 0xFFFD;
        }
    }
    *off = i + 1;
    return 0xFFFD;
}
/* Encodes cp (<= 0x10FFFF; surrogates are encoded as-is) into out, returns the byte count. */
static inline size_t tn_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2 byte-to-unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order. */
static inline uint32_t tn_byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 256u + b;             /* 0x00..0x20 -> U+0100..U+0120 */
    if (b <= 0xA0) return 256u + 33 + (b - 0x7F); /* 0x7F..0xA0 -> U+0121..U+0142 */
    return 256u + 33 + 34;                      /* 0xAD       -> U+0143          */
}
/* Inverse of tn_byte_to_cp; -1 for code points outside the mapping. */
static inline int tn_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp >= 256 && cp <= 256 + 32) return (int)(cp - 256);
    if (cp >= 256 + 33 && cp <= 256 + 66) return (int)(cp - 256 - 33 + 0x7F);
    if (cp == 256 + 67) return 0xAD;
    return -1;
}

/* ---- tokenizer parts -------------------------------------------------------------------------- */
/* SPM over already escaped text (spaces as U+2581, prefix added); appends ids to out. */
tern_status tn_spm_tokenize(const tn_vocab *v, const char *text, size_t n, tn_ivec *out);
/* Byte-level BPE over raw text (pre-tokenized here); appends ids to out. */
tern_status tn_bpe_tokenize(const tn_vocab *v, const char *text, size_t n, tn_ivec *out);

/* ---- pre-tokenizer ---------------------------------------------------------------------------- */
typedef struct tn_pre_info {
    const char *name;   /* canonical name of the regex set (e.g. "llama3")                   */
    bool supported;     /* false: known to llama.cpp but needs a splitter tern does not have */
    bool clean_spaces;  /* clean_up_tokenization_spaces when detokenizing                    */
    bool ignore_merges; /* a word that is a token is emitted whole                           */
    bool add_bos;       /* default for add_bos_token                                         */
    bool no_bos;        /* the default BOS id is "none"                                      */
} tn_pre_info;

/* Looks up a tokenizer.ggml.pre value; returns the table index, -1 if unknown. */
int tn_pretok_lookup(const char *name, size_t len);
void tn_pretok_info(int index, tn_pre_info *out);
tern_status tn_pretok_create(int index, tn_pretok **out);
void tn_pretok_free(tn_pretok *p);

/* Words of text after the regex set, as llama.cpp's unicode_regex_split(byte_encode = false)
 * returns them: UTF-8 re-encoded from the decoded code points, back to back in `bytes`, with
 * `lens` holding each word's byte count. Both buffers are appended to. */
tern_status tn_pretok_split(const tn_pretok *p, const char *text, size_t n, tn_bbuf *bytes, tn_zvec *lens);

#endif
