/*
 * tokenizer.c — loading a vocabulary from GGUF metadata and the tokenizer's outer layer:
 * special-token splitting, BOS/EOS, token pieces and detokenization, all as llama.cpp
 * (34af94cd9, src/llama-vocab.cpp) does them. The merge loops live in tokenizer_spm.c and
 * tokenizer_bpe.c, the pre-tokenizer regexes in tokenizer_pre.c.
 *
 * Loading validates what llama.cpp validates and what tern's robustness list adds (G29/G30):
 * array types and equal lengths, token types 0..6, unique token texts, merges with a space,
 * special ids inside the vocabulary, byte tokens spelled <0xXX>. It then derives, like
 * llama.cpp: default special ids per tokenizer type, end-of-generation tokens recognised by
 * their text, the attribute fixes (control-looking EOG tokens become control, gpt-oss
 * channel tokens become user-defined, phi-3 special tokens strip whitespace on their right),
 * the special-token list (longest first) and every token's piece.
 *
 * Where llama.cpp iterates a hash map (auto-detected EOT/FIM tokens), tern takes the candidate
 * texts in llama.cpp's list order, so the choice is deterministic; where it sorts specials by
 * length with an unstable sort, tern breaks ties by id.
 *
 * Invariant: after tn_vocab_load returns, nothing in the vocab changes (see tokenizer_impl.h).
 */
#include <stdio.h>
#include <stdlib.h>

#include "model/tokenizer_impl.h"

/* ---- small buffers ---------------------------------------------------------------------------- */
tern_status tn_ivec_reserve(tn_ivec *v, size_t n) {
    if (n <= v->cap) return TERN_OK;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *p = tn_realloc(v->p, cap * sizeof *p);
    if (!p) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
    v->p = p;
    v->cap = cap;
    return TERN_OK;
}

tern_status tn_bbuf_reserve(tn_bbuf *b, size_t n) {
    if (n <= b->cap) return TERN_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < n) cap *= 2;
    char *p = tn_realloc(b->p, cap);
    if (!p) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
    b->p = p;
    b->cap = cap;
    return TERN_OK;
}

tern_status tn_zvec_push(tn_zvec *v, size_t x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        size_t *p = tn_realloc(v->p, cap * sizeof *p);
        if (!p) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return TERN_OK;
}

/* ---- hash tables ------------------------------------------------------------------------------ */
int32_t tn_vocab_find(const tn_vocab *v, const char *s, size_t n) {
    for (uint64_t i = tn_tok_hash(s, n) & v->map_mask;; i = (i + 1) & v->map_mask) {
        int32_t id = v->map[i];
        if (id < 0) return -1;
        if (v->len[id] == n && memcmp(v->blob + v->off[id], s, n) == 0) return id;
    }
}

static uint64_t tn_pair_hash(const char *l, size_t ln, const char *r, size_t rn) {
    uint64_t h = tn_tok_hash(l, ln);
    h = (h ^ (uint64_t)ln) * 0x100000001b3ull;
    return tn_tok_hash_cont(h, r, rn);
}

int32_t tn_vocab_merge_rank(const tn_vocab *v, const char *l, size_t ln, const char *r, size_t rn) {
    if (!v->mmap) return -1;
    for (uint64_t i = tn_pair_hash(l, ln, r, rn) & v->mmap_mask;; i = (i + 1) & v->mmap_mask) {
        int32_t m = v->mmap[i];
        if (m < 0) return -1;
        const char *t = v->mblob + v->moff[m];
        if (v->mlen1[m] == ln && v->mlen2[m] == rn && memcmp(t, l, ln) == 0 && memcmp(t + ln, r, rn) == 0) return m;
    }
}

static uint64_t tn_table_size(uint64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

/* ---- load ------------------------------------------------------------------------------------- */
void tn_vocab_free(tn_vocab *v) {
    if (!v) return;
    tn_free(v->blob);
    tn_free(v->off);
    tn_free(v->len);
    tn_free(v->score);
    tn_free(v->attr);
    tn_free(v->type);
    tn_free(v->eog);
    tn_free(v->map);
    tn_free(v->mblob);
    tn_free(v->moff);
    tn_free(v->mlen1);
    tn_free(v->mlen2);
    tn_free(v->mmap);
    tn_free(v->pblob);
    tn_free(v->poff);
    tn_free(v->plen);
    tn_free(v->special);
    tn_free(v->sp_start2);
    tn_free(v->sp_ids2);
    tn_free(v->sp_ids1);
    tn_pretok_free(v->pretok);
    tn_free(v);
}

static bool tn_is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static int tn_hex_val(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

/* Copies the token texts, builds the text -> id table. */
static tern_status tn_load_tokens(tn_vocab *v, const tn_gguf_kv *kv) {
    int32_t n = v->n;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        uint64_t len = kv->arr_strs[i].len;
        if (len > TN_VOCAB_MAX_TOKEN_LEN)
            return tn_err(TERN_ERR_FORMAT, "tokenizer: token %d is %llu bytes long (limit %u)", i, (unsigned long long)len,
                          TN_VOCAB_MAX_TOKEN_LEN);
        total += (len ? len : 24) + 1; /* "[EMPTY_<i>]" replaces an empty text */
    }
    v->blob = tn_malloc(total);
    v->off = tn_malloc((size_t)n * sizeof *v->off);
    v->len = tn_malloc((size_t)n * sizeof *v->len);
    uint64_t cap = tn_table_size((uint64_t)n);
    v->map = tn_malloc(cap * sizeof *v->map);
    if (!v->blob || !v->off || !v->len || !v->map) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory for %d tokens", n);
    v->map_mask = cap - 1;
    memset(v->map, 0xFF, cap * sizeof *v->map);
    size_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        tn_gguf_str s = kv->arr_strs[i];
        v->off[i] = o;
        if (s.len == 0) {
            /* llama.cpp renames empty tokens the same way */
            int m = snprintf(v->blob + o, 25, "[EMPTY_%d]", i);
            tn_log(TERN_LOG_WARN, "tokenizer: empty token at index %d", i);
            v->len[i] = (uint32_t)m;
        } else {
            memcpy(v->blob + o, s.data, s.len);
            v->len[i] = (uint32_t)s.len;
        }
        v->blob[o + v->len[i]] = 0;
        const char *t = v->blob + o;
        o += v->len[i] + 1;
        uint64_t h = tn_tok_hash(t, v->len[i]) & v->map_mask;
        for (;; h = (h + 1) & v->map_mask) {
            int32_t j = v->map[h];
            if (j < 0) break;
            if (v->len[j] == v->len[i] && memcmp(tn_vocab_tok(v, j), t, v->len[i]) == 0)
                return tn_err(TERN_ERR_FORMAT, "tokenizer: tokens %d and %d have the same text", j, i);
        }
        v->map[h] = i;
    }
    return TERN_OK;
}

static tern_status tn_load_types(tn_vocab *v, const tn_gguf *g) {
    int32_t n = v->n;
    v->attr = tn_malloc((size_t)n * sizeof *v->attr);
    v->type = tn_malloc((size_t)n);
    v->score = tn_calloc((size_t)n, sizeof *v->score);
    v->eog = tn_calloc((size_t)n, 1);
    if (!v->attr || !v->type || !v->score || !v->eog) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");

    const tn_gguf_kv *kv = tn_gguf_find(g, "tokenizer.ggml.scores");
    if (kv) {
        if (kv->type != TN_GGUF_ARRAY || kv->arr_type != TN_GGUF_F32)
            return tn_err(TERN_ERR_FORMAT, "tokenizer: tokenizer.ggml.scores must be an array of f32, not %s of %s",
                          tn_gguf_type_name(kv->type), tn_gguf_type_name(kv->arr_type));
        if (kv->arr_n != (uint64_t)n)
            return tn_err(TERN_ERR_FORMAT, "tokenizer: tokenizer.ggml.scores has %llu entries for %d tokens",
                          (unsigned long long)kv->arr_n, n);
        memcpy(v->score, kv->arr_data, (size_t)n * sizeof(float));
    }

    kv = tn_gguf_find(g, "tokenizer.ggml.token_type");
    if (kv) {
        if (kv->type != TN_GGUF_ARRAY || kv->arr_type != TN_GGUF_I32)
            return tn_err(TERN_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type must be an array of i32, not %s of %s",
                          tn_gguf_type_name(kv->type), tn_gguf_type_name(kv->arr_type));
        if (kv->arr_n != (uint64_t)n)
            return tn_err(TERN_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type has %llu entries for %d tokens",
                          (unsigned long long)kv->arr_n, n);
    }
    static const uint16_t type_attr[7] = {TN_ATTR_NORMAL,  TN_ATTR_NORMAL,       TN_ATTR_UNKNOWN, TN_ATTR_CONTROL,
                                          TN_ATTR_USER_DEFINED, TN_ATTR_UNUSED, TN_ATTR_BYTE};
    for (int32_t i = 0; i < n; i++) {
        int32_t t = TN_TOKEN_TYPE_NORMAL;
        if (kv) memcpy(&t, kv->arr_data + (size_t)i * 4, 4);
        if (t < 0 || t > 6) return tn_err(TERN_ERR_FORMAT, "tokenizer: token %d has type %d (valid: 0..6)", i, t);
        v->type[i] = (uint8_t)t;
        v->attr[i] = type_attr[t];
        if (t == TN_TOKEN_TYPE_BYTE) {
            const char *s = tn_vocab_tok(v, i);
            if (v->len[i] != 6 || memcmp(s, "<0x", 3) != 0 || !tn_is_hex(s[3]) || !tn_is_hex(s[4]) || s[5] != '>')
                return tn_err(TERN_ERR_FORMAT, "tokenizer: byte token %d is '%.16s', not <0xXX>", i, s);
        }
    }
    return TERN_OK;
}

static tern_status tn_load_merges(tn_vocab *v, const tn_gguf *g) {
    const tn_gguf_kv *kv = tn_gguf_find(g, "tokenizer.ggml.merges");
    if (!kv) return tn_err(TERN_ERR_FORMAT, "tokenizer: gpt2 vocabulary without tokenizer.ggml.merges");
    if (kv->type != TN_GGUF_ARRAY || kv->arr_type != TN_GGUF_STRING)
        return tn_err(TERN_ERR_FORMAT, "tokenizer: tokenizer.ggml.merges must be an array of strings");
    if (kv->arr_n > (uint64_t)INT32_MAX) return tn_err(TERN_ERR_FORMAT, "tokenizer: %llu merges", (unsigned long long)kv->arr_n);
    int64_t nm = (int64_t)kv->arr_n;
    size_t total = 0;
    for (int64_t i = 0; i < nm; i++) {
        tn_gguf_str s = kv->arr_strs[i];
        if (s.len > TN_VOCAB_MAX_TOKEN_LEN)
            return tn_err(TERN_ERR_FORMAT, "tokenizer: merge %lld is %llu bytes long", (long long)i, (unsigned long long)s.len);
        total += s.len;
    }
    v->n_merges = nm;
    v->mblob = tn_malloc(total + 1);
    v->moff = tn_malloc((size_t)(nm ? nm : 1) * sizeof *v->moff);
    v->mlen1 = tn_malloc((size_t)(nm ? nm : 1) * sizeof *v->mlen1);
    v->mlen2 = tn_malloc((size_t)(nm ? nm : 1) * sizeof *v->mlen2);
    uint64_t cap = tn_table_size((uint64_t)nm);
    v->mmap = tn_malloc(cap * sizeof *v->mmap);
    if (!v->mblob || !v->moff || !v->mlen1 || !v->mlen2 || !v->mmap) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory for merges");
    v->mmap_mask = cap - 1;
    memset(v->mmap, 0xFF, cap * sizeof *v->mmap);
    size_t o = 0;
    for (int64_t i = 0; i < nm; i++) {
        tn_gguf_str s = kv->arr_strs[i];
        /* llama.cpp splits at the first space after the first byte */
        const char *sp = s.len > 1 ? memchr(s.data + 1, ' ', s.len - 1) : NULL;
        if (!sp)
            return tn_err(TERN_ERR_FORMAT, "tokenizer: merge %lld ('%.*s') has no space between its two parts", (long long)i,
                          (int)TN_MIN(s.len, 32), s.data);
        size_t l1 = (size_t)(sp - s.data), l2 = s.len - l1 - 1;
        v->moff[i] = o;
        v->mlen1[i] = (uint32_t)l1;
        v->mlen2[i] = (uint32_t)l2;
        memcpy(v->mblob + o, s.data, l1);
        memcpy(v->mblob + o + l1, sp + 1, l2);
        o += l1 + l2;
        uint64_t h = tn_pair_hash(s.data, l1, sp + 1, l2) & v->mmap_mask;
        bool dup = false;
        for (;; h = (h + 1) & v->mmap_mask) {
            int32_t m = v->mmap[h];
            if (m < 0) break;
            const char *t = v->mblob + v->moff[m];
            if (v->mlen1[m] == l1 && v->mlen2[m] == l2 && memcmp(t, s.data, l1) == 0 && memcmp(t + l1, sp + 1, l2) == 0) {
                dup = true; /* the first rank wins, as with llama.cpp's emplace */
                break;
            }
        }
        if (!dup) v->mmap[h] = (int32_t)i;
    }
    return TERN_OK;
}

/* Reads one special-token id key into *slot. strict: an id outside the vocabulary is an error,
 * else a warning that keeps the previous value. 0xFFFFFFFF and -1 mean "none". */
static tern_status tn_load_id(tn_vocab *v, const tn_gguf *g, const char *key, int32_t *slot, bool strict) {
    if (!tn_gguf_find(g, key)) return TERN_OK;
    int64_t id = 0;
    tern_status s = tn_gguf_get_i64(g, key, true, &id);
    if (s) return tn_err_prefix(s, "tokenizer");
    if (id == -1 || id == (int64_t)UINT32_MAX) {
        *slot = -1;
        return TERN_OK;
    }
    if (id < 0 || id >= v->n) {
        if (strict) return tn_err(TERN_ERR_FORMAT, "tokenizer: %s = %lld is outside the vocabulary (%d tokens)", key, (long long)id, v->n);
        tn_log(TERN_LOG_WARN, "tokenizer: ignoring %s = %lld (vocabulary has %d tokens)", key, (long long)id, v->n);
        return TERN_OK;
    }
    *slot = (int32_t)id;
    return TERN_OK;
}

static tern_status tn_load_bool(const tn_gguf *g, const char *key, bool *out) {
    tern_status s = tn_gguf_get_bool(g, key, false, out);
    return s ? tn_err_prefix(s, "tokenizer") : TERN_OK;
}

/* First token (in list order) whose text is one of the candidates, -1 if none. */
static int32_t tn_find_any(const tn_vocab *v, const char *const *texts, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = tn_vocab_find(v, texts[i], strlen(texts[i]));
        if (id >= 0) return id;
    }
    return -1;
}

static int32_t tn_find_cstr(const tn_vocab *v, const char *s) { return tn_vocab_find(v, s, strlen(s)); }

/* llama.cpp's text-based detection of EOT/EOM/FIM and end-of-generation tokens. */
static void tn_detect_specials(tn_vocab *v) {
    static const char *const eot[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                      "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                                      "<｜end▁of▁sentence｜>", "<end_of_utterance>"};
    static const char *const eom[] = {"<|eom_id|>"};
    static const char *const fim_pre[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>",
                                          "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"};
    static const char *const fim_suf[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>",
                                          "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"};
    static const char *const fim_mid[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>",
                                          "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"};
    static const char *const fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
    static const char *const fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
    static const char *const fim_sep[] = {"<|file_sep|>"};
    static const struct {
        const char *const *texts;
        size_t n;
        size_t slot;
    } detect[] = {
        {eot, TN_ARRAY_LEN(eot), offsetof(tn_vocab, eot)},             {eom, TN_ARRAY_LEN(eom), offsetof(tn_vocab, eom)},
        {fim_pre, TN_ARRAY_LEN(fim_pre), offsetof(tn_vocab, fim_pre)}, {fim_suf, TN_ARRAY_LEN(fim_suf), offsetof(tn_vocab, fim_suf)},
        {fim_mid, TN_ARRAY_LEN(fim_mid), offsetof(tn_vocab, fim_mid)}, {fim_pad, TN_ARRAY_LEN(fim_pad), offsetof(tn_vocab, fim_pad)},
        {fim_rep, TN_ARRAY_LEN(fim_rep), offsetof(tn_vocab, fim_rep)}, {fim_sep, TN_ARRAY_LEN(fim_sep), offsetof(tn_vocab, fim_sep)},
    };
    for (size_t k = 0; k < TN_ARRAY_LEN(detect); k++) {
        int32_t *slot = (int32_t *)((char *)v + detect[k].slot);
        if (*slot >= 0) continue;
        int32_t id = tn_find_any(v, detect[k].texts, detect[k].n);
        if (id < 0) continue;
        *slot = id;
        if (!(v->attr[id] & TN_ATTR_CONTROL)) {
            tn_log(TERN_LOG_WARN, "tokenizer: control-looking token %d '%s' was not control-type; made control", id, tn_vocab_tok(v, id));
            v->attr[id] |= TN_ATTR_CONTROL;
        }
    }

    /* control tokens named "unused..." are unused */
    for (int32_t i = 0; i < v->n; i++)
        if ((v->attr[i] & TN_ATTR_CONTROL) && strstr(tn_vocab_tok(v, i), "unused")) v->attr[i] |= TN_ATTR_UNUSED;

    /* end of generation */
    if (v->fim_pad >= 0) v->eog[v->fim_pad] = 1;
    if (v->fim_rep >= 0) v->eog[v->fim_rep] = 1;
    if (v->fim_sep >= 0) v->eog[v->fim_sep] = 1;
    static const char *const eog[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                                      "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                                      "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                                      "<｜end▁of▁sentence｜>", "[e~["};
    for (size_t k = 0; k < TN_ARRAY_LEN(eog); k++) {
        int32_t id = tn_find_cstr(v, eog[k]);
        if (id < 0) continue;
        v->eog[id] = 1;
        if (!(v->attr[id] & TN_ATTR_CONTROL)) {
            tn_log(TERN_LOG_WARN, "tokenizer: control-looking token %d '%s' was not control-type; made control", id, eog[k]);
            v->attr[id] |= TN_ATTR_CONTROL;
        }
    }
    /* gpt-oss: always render these */
    static const char *const gptoss[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};
    for (size_t k = 0; k < TN_ARRAY_LEN(gptoss); k++) {
        int32_t id = tn_find_cstr(v, gptoss[k]);
        if (id >= 0) v->attr[id] = TN_ATTR_USER_DEFINED;
    }
    if (v->eos >= 0) v->eog[v->eos] = 1;
    if (v->eot >= 0) v->eog[v->eot] = 1;
    if (v->eom >= 0) v->eog[v->eom] = 1;

    /* o200k_harmony / solar-open: <|end|> is not EOG when <|return|>+<|call|> or <|calls|>+<|flush|> are */
    int32_t ret = tn_find_cstr(v, "<|return|>"), call = tn_find_cstr(v, "<|call|>"), calls = tn_find_cstr(v, "<|calls|>");
    int32_t flush = tn_find_cstr(v, "<|flush|>"), end = tn_find_cstr(v, "<|end|>");
    bool has_ret = ret >= 0 && v->eog[ret], has_call = (call >= 0 && v->eog[call]) || (calls >= 0 && v->eog[calls]);
    bool has_flush = flush >= 0 && v->eog[flush], has_end = end >= 0 && v->eog[end];
    if ((has_ret && has_call && has_end) || (has_call && has_flush && has_end)) {
        v->eog[end] = 0;
        v->attr[end] = TN_ATTR_USER_DEFINED;
    }
    /* gemma4 / paddleocr: </s> is not EOG when <|tool_response> is */
    int32_t tr = tn_find_cstr(v, "<|tool_response>"), es = tn_find_cstr(v, "</s>");
    if (tr >= 0 && v->eog[tr] && es >= 0 && v->eog[es]) {
        v->eog[es] = 0;
        v->attr[es] = TN_ATTR_NORMAL;
    }
}

/* Sort keys: longer text first, then lower id. */
static int tn_cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The special-token list (control, user-defined, unknown), longest text first, ties by id. */
static tern_status tn_build_specials(tn_vocab *v) {
    int32_t ns = 0;
    for (int32_t i = 0; i < v->n; i++)
        if (v->attr[i] & (TN_ATTR_CONTROL | TN_ATTR_USER_DEFINED | TN_ATTR_UNKNOWN)) ns++;
    v->n_special = ns;
    if (ns == 0) return TERN_OK;
    v->special = tn_malloc((size_t)ns * sizeof *v->special);
    if (!v->special) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
    uint64_t *keys = tn_malloc((size_t)ns * sizeof *keys);
    if (!keys) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
    ns = 0;
    for (int32_t i = 0; i < v->n; i++)
        if (v->attr[i] & (TN_ATTR_CONTROL | TN_ATTR_USER_DEFINED | TN_ATTR_UNKNOWN))
            keys[ns++] = (uint64_t)(UINT32_MAX - v->len[i]) << 32 | (uint32_t)i;
    qsort(keys, (size_t)ns, sizeof *keys, tn_cmp_u64);
    for (int32_t k = 0; k < ns; k++) v->special[k] = (int32_t)(uint32_t)keys[k];
    tn_free(keys);

    /* buckets on the first two bytes (one byte for one-byte tokens) */
    v->sp_start2 = tn_calloc(65537, sizeof *v->sp_start2);
    v->sp_ids2 = tn_malloc((size_t)ns * sizeof *v->sp_ids2);
    v->sp_ids1 = tn_malloc((size_t)ns * sizeof *v->sp_ids1);
    if (!v->sp_start2 || !v->sp_ids2 || !v->sp_ids1) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
    memset(v->sp_start1, 0, sizeof v->sp_start1);
    for (int32_t k = 0; k < ns; k++) {
        const unsigned char *t = (const unsigned char *)tn_vocab_tok(v, v->special[k]);
        if (v->len[v->special[k]] >= 2) v->sp_start2[((unsigned)t[0] << 8 | t[1]) + 1]++;
        else v->sp_start1[t[0] + 1]++;
    }
    for (unsigned i = 0; i < 65536; i++) v->sp_start2[i + 1] += v->sp_start2[i];
    for (unsigned i = 0; i < 256; i++) v->sp_start1[i + 1] += v->sp_start1[i];
    uint32_t *fill2 = tn_malloc(65536 * sizeof *fill2);
    if (!fill2) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(fill2, v->sp_start2, 65536 * sizeof *fill2);
    uint32_t fill1[256];
    memcpy(fill1, v->sp_start1, sizeof fill1);
    for (int32_t k = 0; k < ns; k++) {
        const unsigned char *t = (const unsigned char *)tn_vocab_tok(v, v->special[k]);
        if (v->len[v->special[k]] >= 2) v->sp_ids2[fill2[(unsigned)t[0] << 8 | t[1]]++] = k;
        else v->sp_ids1[fill1[t[0]]++] = k;
    }
    tn_free(fill2);
    return TERN_OK;
}

/* Appends the piece llama.cpp renders for token id with special = true. */
static tern_status tn_render_piece(const tn_vocab *v, int32_t id, tn_bbuf *b) {
    const char *t = tn_vocab_tok(v, id);
    size_t n = v->len[id];
    uint16_t a = v->attr[id];
    if (a & (TN_ATTR_UNKNOWN | TN_ATTR_CONTROL | TN_ATTR_USER_DEFINED)) return tn_bbuf_put(b, t, n);
    if (a & TN_ATTR_NORMAL) {
        tern_status s = TERN_OK;
        if (v->kind == TN_VOCAB_SPM) {
            for (size_t i = 0; i < n && !s;) {
                if (i + 3 <= n && memcmp(t + i, TN_SPM_SPACE, 3) == 0) {
                    s = tn_bbuf_put(b, " ", 1);
                    i += 3;
                } else {
                    s = tn_bbuf_put(b, t + i, 1);
                    i++;
                }
            }
            return s;
        }
        /* byte-level BPE: each code point maps back to one byte */
        for (size_t off = 0; off < n && !s;) {
            uint32_t cp = tn_utf8_decode((const unsigned char *)t, n, &off);
            int byte = tn_cp_to_byte(cp);
            if (byte >= 0) {
                char c = (char)byte;
                s = tn_bbuf_put(b, &c, 1);
            } else {
                /* llama.cpp: "[UNK_BYTE_0x" + hex of the re-encoded code point + whole text + "]" */
                char u[4], hex[16];
                size_t m = tn_utf8_encode(cp, u);
                s = tn_bbuf_put(b, "[UNK_BYTE_0x", 12);
                for (size_t k = 0; k < m && !s; k++) {
                    snprintf(hex, sizeof hex, "%02x", (unsigned char)u[k]);
                    s = tn_bbuf_put(b, hex, 2);
                }
                if (!s) s = tn_bbuf_put(b, t, n);
                if (!s) s = tn_bbuf_put(b, "]", 1);
            }
        }
        return s;
    }
    if (a & TN_ATTR_BYTE) {
        char c = (char)(tn_hex_val(t[3]) * 16 + tn_hex_val(t[4]));
        return tn_bbuf_put(b, &c, 1);
    }
    return TERN_OK; /* unused and other tokens render empty */
}

static tern_status tn_build_pieces(tn_vocab *v) {
    tn_bbuf b = {0};
    v->poff = tn_malloc((size_t)v->n * sizeof *v->poff);
    v->plen = tn_malloc((size_t)v->n * sizeof *v->plen);
    if (!v->poff || !v->plen) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
    tern_status s = TERN_OK;
    for (int32_t i = 0; i < v->n && !s; i++) {
        size_t before = b.n;
        s = tn_render_piece(v, i, &b);
        v->poff[i] = before;
        if (b.n - before > (size_t)INT32_MAX / 2) s = tn_err(TERN_ERR_FORMAT, "tokenizer: piece of token %d is too long", i);
        v->plen[i] = (uint32_t)(b.n - before);
    }
    if (!s) s = tn_bbuf_put(&b, "", 1); /* never a NULL blob */
    if (s) {
        tn_free(b.p);
        return s;
    }
    v->pblob = b.p;
    return TERN_OK;
}

static bool tn_ascii_contains_ci(tn_gguf_str s, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; s.data && i + m <= s.len; i++) {
        size_t k = 0;
        while (k < m && (char)((s.data[i + k] >= 'A' && s.data[i + k] <= 'Z') ? s.data[i + k] + 32 : s.data[i + k]) == needle[k]) k++;
        if (k == m) return true;
    }
    return false;
}

static bool tn_str_contains(tn_gguf_str s, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; s.data && i + m <= s.len; i++)
        if (memcmp(s.data + i, needle, m) == 0) return true;
    return false;
}

/* llama.cpp's per-model attribute fixes, keyed on names in the metadata. */
static void tn_model_attrs(tn_vocab *v, const tn_gguf *g) {
    tn_gguf_str name = {0, NULL}, pre = {0, NULL}, arch = {0, NULL};
    const tn_gguf_kv *kv;
    if ((kv = tn_gguf_find(g, "general.name")) && kv->type == TN_GGUF_STRING) name = kv->v.str;
    if ((kv = tn_gguf_find(g, "tokenizer.ggml.pre")) && kv->type == TN_GGUF_STRING) pre = kv->v.str;
    if ((kv = tn_gguf_find(g, "general.architecture")) && kv->type == TN_GGUF_STRING) arch = kv->v.str;
    if (tn_str_contains(pre, "jina-v2-de") || tn_str_contains(pre, "jina-v2-es") || tn_str_contains(pre, "jina-v2-code") ||
        tn_str_contains(arch, "nomic-bert-moe") || tn_str_contains(arch, "jina-bert-v3")) {
        int32_t id = tn_find_cstr(v, "<mask>");
        if (id >= 0) v->attr[id] |= TN_ATTR_LSTRIP;
    } else if (tn_ascii_contains_ci(name, "phi-3") || tn_ascii_contains_ci(name, "phi3")) {
        for (int32_t k = 0; k < v->n_special; k++) v->attr[v->special[k]] |= TN_ATTR_RSTRIP;
        int32_t id = tn_find_cstr(v, "</s>");
        if (id >= 0) v->attr[id] |= TN_ATTR_RSTRIP;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (size_t k = 0; k < TN_ARRAY_LEN(keep); k++)
            if ((id = tn_find_cstr(v, keep[k])) >= 0) v->attr[id] &= (uint16_t)~TN_ATTR_RSTRIP;
    } else if (tn_ascii_contains_ci(name, "modern-bert")) {
        int32_t id = tn_find_cstr(v, "[MASK]");
        if (id >= 0) v->attr[id] |= TN_ATTR_LSTRIP;
    }
}

tern_status tn_vocab_load(const tn_gguf *g, tn_vocab **out) {
    tern_status s;
    if (!g || !out) return tn_err(TERN_ERR_INVALID_ARG, "tokenizer: NULL argument");
    *out = NULL;

    tn_gguf_str model = {0, NULL}, pre = {0, NULL};
    if ((s = tn_gguf_get_str(g, "tokenizer.ggml.model", true, &model))) return tn_err_prefix(s, "tokenizer");
    if ((s = tn_gguf_get_str(g, "tokenizer.ggml.pre", false, &pre))) return tn_err_prefix(s, "tokenizer");
    int kind;
    if (tn_gguf_str_eq(model, "llama")) kind = TN_VOCAB_SPM;
    else if (tn_gguf_str_eq(model, "gpt2")) kind = TN_VOCAB_BPE;
    else
        return tn_err(TERN_ERR_UNSUPPORTED, "tokenizer: tokenizer.ggml.model '%.*s' is not supported (tern reads 'llama' and 'gpt2')",
                      (int)TN_MIN(model.len, 64), model.data ? model.data : "");

    const tn_gguf_kv *tok = tn_gguf_find(g, "tokenizer.ggml.tokens");
    if (!tok) return tn_err(TERN_ERR_FORMAT, "tokenizer: missing key tokenizer.ggml.tokens");
    if (tok->type != TN_GGUF_ARRAY || tok->arr_type != TN_GGUF_STRING)
        return tn_err(TERN_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens must be an array of strings");
    if (tok->arr_n == 0 || tok->arr_n >= (uint64_t)INT32_MAX)
        return tn_err(TERN_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens has %llu entries", (unsigned long long)tok->arr_n);

    tn_vocab *v = tn_calloc(1, sizeof *v);
    if (!v) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
    v->kind = kind;
    v->n = (int32_t)tok->arr_n;
    v->bos = v->eos = v->eot = v->eom = v->unk = v->sep = v->pad = v->mask = -1;
    v->fim_pre = v->fim_suf = v->fim_mid = v->fim_pad = v->fim_rep = v->fim_sep = -1;

    if ((s = tn_load_tokens(v, tok))) goto fail;
    if ((s = tn_load_types(v, g))) goto fail;

    tn_pre_info info = {0};
    if (kind == TN_VOCAB_BPE) {
        if ((s = tn_load_merges(v, g))) goto fail;
        int idx = 0;
        if (!pre.data || pre.len == 0) {
            tn_log(TERN_LOG_WARN, "tokenizer: missing pre-tokenizer type, using 'default' (tokenization may be degraded)");
        } else if ((idx = tn_pretok_lookup(pre.data, pre.len)) < 0) {
            tn_log(TERN_LOG_WARN, "tokenizer: unknown pre-tokenizer '%.*s', using 'default' (tokenization may be degraded)",
                   (int)TN_MIN(pre.len, 64), pre.data);
            idx = 0;
        }
        tn_pretok_info(idx, &info);
        if (!info.supported) {
            s = tn_err(TERN_ERR_UNSUPPORTED, "tokenizer: pre-tokenizer '%s' is not supported", info.name);
            goto fail;
        }
        v->pre = idx;
        v->add_space_prefix = false;
        v->clean_spaces = info.clean_spaces;
        v->ignore_merges = info.ignore_merges;
        v->add_bos = info.add_bos;
        v->add_eos = false;
        v->bos = info.no_bos ? -1 : 11; /* llama.cpp's BPE defaults */
        v->eos = 11;
    } else {
        v->pre = 0;
        v->add_space_prefix = true;
        v->clean_spaces = false;
        v->add_bos = true;
        v->add_eos = false;
        v->bos = 1;
        v->eos = 2;
        v->unk = 0;
    }
    if (v->bos >= v->n) v->bos = -1;
    if (v->eos >= v->n) v->eos = -1;
    if (v->unk >= v->n) v->unk = -1;
    if ((s = tn_load_bool(g, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix))) goto fail;

    static const struct {
        const char *key;
        size_t slot;
        bool strict;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", offsetof(tn_vocab, bos), true},
        {"tokenizer.ggml.eos_token_id", offsetof(tn_vocab, eos), true},
        {"tokenizer.ggml.eot_token_id", offsetof(tn_vocab, eot), false},
        {"tokenizer.ggml.eom_token_id", offsetof(tn_vocab, eom), false},
        {"tokenizer.ggml.unknown_token_id", offsetof(tn_vocab, unk), true},
        {"tokenizer.ggml.seperator_token_id", offsetof(tn_vocab, sep), false},
        {"tokenizer.ggml.separator_token_id", offsetof(tn_vocab, sep), false},
        {"tokenizer.ggml.padding_token_id", offsetof(tn_vocab, pad), false},
        {"tokenizer.ggml.mask_token_id", offsetof(tn_vocab, mask), false},
        {"tokenizer.ggml.fim_pre_token_id", offsetof(tn_vocab, fim_pre), false},
        {"tokenizer.ggml.fim_suf_token_id", offsetof(tn_vocab, fim_suf), false},
        {"tokenizer.ggml.fim_mid_token_id", offsetof(tn_vocab, fim_mid), false},
        {"tokenizer.ggml.fim_pad_token_id", offsetof(tn_vocab, fim_pad), false},
        {"tokenizer.ggml.fim_rep_token_id", offsetof(tn_vocab, fim_rep), false},
        {"tokenizer.ggml.fim_sep_token_id", offsetof(tn_vocab, fim_sep), false},
        {"tokenizer.ggml.prefix_token_id", offsetof(tn_vocab, fim_pre), false},
        {"tokenizer.ggml.suffix_token_id", offsetof(tn_vocab, fim_suf), false},
        {"tokenizer.ggml.middle_token_id", offsetof(tn_vocab, fim_mid), false},
    };
    for (size_t k = 0; k < TN_ARRAY_LEN(ids); k++)
        if ((s = tn_load_id(v, g, ids[k].key, (int32_t *)((char *)v + ids[k].slot), ids[k].strict))) goto fail;
    if ((s = tn_load_bool(g, "tokenizer.ggml.add_bos_token", &v->add_bos))) goto fail;
    if ((s = tn_load_bool(g, "tokenizer.ggml.add_eos_token", &v->add_eos))) goto fail;
    if (v->add_bos && v->bos < 0) {
        tn_log(TERN_LOG_WARN, "tokenizer: add_bos_token is set but there is no BOS token; not adding one");
        v->add_bos = false;
    }
    if (v->add_eos && v->eos < 0) {
        tn_log(TERN_LOG_WARN, "tokenizer: add_eos_token is set but there is no EOS token; not adding one");
        v->add_eos = false;
    }

    tn_detect_specials(v);
    if ((s = tn_build_specials(v))) goto fail;
    if ((s = tn_build_pieces(v))) goto fail;
    tn_model_attrs(v, g);

    if (kind == TN_VOCAB_SPM) {
        v->spm_split = true;
        for (int32_t i = 0; i < v->n && v->spm_split; i++) {
            const char *t = tn_vocab_tok(v, i);
            for (uint32_t k = 1; k + 3 <= v->len[i]; k++)
                if (memcmp(t + k, TN_SPM_SPACE, 3) == 0 && (k < 3 || memcmp(t + k - 3, TN_SPM_SPACE, 3) != 0)) {
                    v->spm_split = false;
                    break;
                }
        }
    }
    for (int b = 0; b < 256; b++) {
        v->byte_tok[b] = -1;
        if (kind != TN_VOCAB_SPM) continue;
        char hex[8], raw = (char)b;
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        v->byte_tok[b] = tn_vocab_find(v, hex, 6);
        if (v->byte_tok[b] < 0) v->byte_tok[b] = tn_vocab_find(v, &raw, 1);
    }
    if (kind == TN_VOCAB_BPE && (s = tn_pretok_create(v->pre, &v->pretok))) goto fail;

    *out = v;
    return TERN_OK;
fail:
    tn_vocab_free(v);
    return s;
}

/* ---- accessors -------------------------------------------------------------------------------- */
int32_t tn_vocab_n(const tn_vocab *v) { return v->n; }
int32_t tn_vocab_bos(const tn_vocab *v) { return v->bos; }
int32_t tn_vocab_eos(const tn_vocab *v) { return v->eos; }
int32_t tn_vocab_eot(const tn_vocab *v) { return v->eot; }
int32_t tn_vocab_unk(const tn_vocab *v) { return v->unk; }
int32_t tn_vocab_pad(const tn_vocab *v) { return v->pad; }
bool tn_vocab_is_eog(const tn_vocab *v, int32_t id) { return id >= 0 && id < v->n && v->eog[id]; }
bool tn_vocab_add_bos(const tn_vocab *v) { return v->add_bos; }
bool tn_vocab_add_eos(const tn_vocab *v) { return v->add_eos; }
bool tn_vocab_add_space_prefix(const tn_vocab *v) { return v->add_space_prefix; }
const char *tn_vocab_type_name(const tn_vocab *v) { return v->kind == TN_VOCAB_SPM ? "spm" : "bpe"; }
const char *tn_vocab_pre_name(const tn_vocab *v) {
    tn_pre_info info;
    tn_pretok_info(v->pre, &info);
    return info.name;
}
const char *tn_vocab_text(const tn_vocab *v, int32_t id) { return id >= 0 && id < v->n ? tn_vocab_tok(v, id) : NULL; }
int32_t tn_vocab_token_type(const tn_vocab *v, int32_t id) { return id >= 0 && id < v->n ? v->type[id] : -1; }

/* ---- special-token split ---------------------------------------------------------------------- */
typedef struct tn_frag {
    size_t off, len;
    int32_t tok; /* >= 0: a special token; else raw text [off, off+len) */
} tn_frag;

typedef struct tn_fragv {
    tn_frag *p;
    size_t n, cap;
} tn_fragv;

static tern_status tn_frag_push(tn_fragv *f, size_t off, size_t len, int32_t tok) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        tn_frag *p = tn_realloc(f->p, cap * sizeof *p);
        if (!p) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
        f->p = p;
        f->cap = cap;
    }
    f->p[f->n++] = (tn_frag){off, len, tok};
    return TERN_OK;
}

static const char *tn_find_bytes(const char *hay, size_t n, const char *needle, size_t m) {
    if (m == 0 || m > n) return NULL;
    const char *end = hay + n - m + 1;
    for (const char *p = hay; p < end;) {
        p = memchr(p, needle[0], (size_t)(end - p));
        if (!p) return NULL;
        if (memcmp(p, needle, m) == 0) return p;
        p++;
    }
    return NULL;
}

static bool tn_isspace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* llama.cpp's tokenizer_st_partition: for each special token in order (longest first), every
 * occurrence inside a raw fragment becomes a token fragment; LSTRIP/RSTRIP tokens eat the
 * whitespace beside them. Control and unknown tokens only count when parse_special. */
static tern_status tn_partition(const tn_vocab *v, const char *text, size_t len, bool parse_special, tn_fragv *frags) {
    tern_status s = tn_frag_push(frags, 0, len, -1);
    if (s || v->n_special == 0) return s;

    uint8_t *present = tn_calloc((size_t)v->n_special, 1);
    if (!present) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
    bool any = false;
    const unsigned char *t = (const unsigned char *)text;
    for (size_t i = 0; i < len; i++) {
        for (uint32_t j = v->sp_start1[t[i]]; j < v->sp_start1[t[i] + 1]; j++) present[v->sp_ids1[j]] = 1, any = true;
        if (i + 1 >= len) break;
        unsigned key = (unsigned)t[i] << 8 | t[i + 1];
        for (uint32_t j = v->sp_start2[key]; j < v->sp_start2[key + 1]; j++) {
            int32_t k = v->sp_ids2[j], id = v->special[k];
            if (!present[k] && v->len[id] <= len - i && memcmp(text + i, tn_vocab_tok(v, id), v->len[id]) == 0) present[k] = 1, any = true;
        }
    }

    tn_fragv next = {0};
    for (int32_t k = 0; any && k < v->n_special && !s; k++) {
        if (!present[k]) continue;
        int32_t id = v->special[k];
        uint16_t attr = v->attr[id];
        if (!parse_special && (attr & (TN_ATTR_CONTROL | TN_ATTR_UNKNOWN))) continue;
        const char *tok = tn_vocab_tok(v, id);
        size_t tl = v->len[id];
        next.n = 0;
        for (size_t f = 0; f < frags->n && !s; f++) {
            tn_frag fr = frags->p[f];
            if (fr.tok >= 0) {
                s = tn_frag_push(&next, fr.off, fr.len, fr.tok);
                continue;
            }
            size_t base = fr.off, blen = fr.len;
            while (!s) {
                const char *m = tn_find_bytes(text + base, blen, tok, tl);
                if (!m) {
                    if (blen > 0) s = tn_frag_push(&next, base, blen, -1);
                    break;
                }
                size_t mo = (size_t)(m - text);
                size_t ll = mo - base;
                if (attr & TN_ATTR_LSTRIP)
                    while (ll > 0 && tn_isspace(text[base + ll - 1])) ll--;
                if (ll > 0 && (s = tn_frag_push(&next, base, ll, -1))) break;
                if ((s = tn_frag_push(&next, 0, 0, id))) break;
                size_t ro = mo + tl, rl = base + blen - ro;
                if (attr & TN_ATTR_RSTRIP)
                    while (rl > 0 && tn_isspace(text[ro])) ro++, rl--;
                base = ro;
                blen = rl;
            }
        }
        tn_fragv tmp = *frags;
        *frags = next;
        next = tmp;
    }
    tn_free(next.p);
    tn_free(present);
    return s;
}

/* ---- tokenize --------------------------------------------------------------------------------- */
tern_status tn_tokenize(const tn_vocab *v, const char *text, size_t len, bool add_special, bool parse_special, int32_t *out,
                        int32_t cap, int32_t *n_out) {
    if (!v || !n_out || (!text && len) || cap < 0 || (!out && cap > 0))
        return tn_err(TERN_ERR_INVALID_ARG, "tokenizer: tokenize called with a NULL or negative argument");
    *n_out = 0;
    tn_ivec res = {0};
    tn_fragv frags = {0};
    tn_bbuf buf = {0};
    tern_status s = TERN_OK;
    if (len > 0) s = tn_partition(v, text, len, parse_special, &frags);

    if (!s && add_special && v->add_bos) s = tn_ivec_push(&res, v->bos);
    bool prev_special = true; /* SPM: a space prefix goes before the first text and after tokens */
    for (size_t f = 0; f < frags.n && !s; f++) {
        tn_frag fr = frags.p[f];
        if (fr.tok >= 0) {
            s = tn_ivec_push(&res, fr.tok);
            prev_special = true;
            continue;
        }
        if (v->kind == TN_VOCAB_BPE) {
            s = tn_bpe_tokenize(v, text + fr.off, fr.len, &res);
            continue;
        }
        buf.n = 0;
        if (v->add_space_prefix && prev_special) s = tn_bbuf_put(&buf, TN_SPM_SPACE, 3);
        for (size_t i = 0; i < fr.len && !s; i++) {
            char c = text[fr.off + i];
            s = c == ' ' ? tn_bbuf_put(&buf, TN_SPM_SPACE, 3) : tn_bbuf_put(&buf, &c, 1);
        }
        if (!s) s = tn_spm_tokenize(v, buf.p, buf.n, &res);
        prev_special = false;
    }
    if (!s && add_special && v->add_eos) s = tn_ivec_push(&res, v->eos);

    if (!s && res.n > (size_t)INT32_MAX) s = tn_err(TERN_ERR_INVALID_ARG, "tokenizer: %zu tokens do not fit an int32 count", res.n);
    if (!s) {
        *n_out = (int32_t)res.n;
        size_t m = TN_MIN(res.n, (size_t)cap);
        if (m) memcpy(out, res.p, m * sizeof *out);
        if (res.n > (size_t)cap) s = tn_err(TERN_ERR_FULL, "tokenizer: %zu tokens do not fit in %d", res.n, cap);
    }
    tn_free(res.p);
    tn_free(frags.p);
    tn_free(buf.p);
    return s;
}

/* ---- pieces ----------------------------------------------------------------------------------- */
/* Piece of id with up to `lstrip` leading spaces removed, or NULL/0 for a hidden special. */
static const char *tn_piece(const tn_vocab *v, int32_t id, bool special, int lstrip, size_t *n) {
    if (!special && (v->attr[id] & (TN_ATTR_UNKNOWN | TN_ATTR_CONTROL))) {
        *n = 0;
        return v->pblob;
    }
    const char *p = v->pblob + v->poff[id];
    size_t m = v->plen[id];
    for (int i = 0; i < lstrip && m && *p == ' '; i++) p++, m--;
    *n = m;
    return p;
}

int32_t tn_token_to_piece(const tn_vocab *v, int32_t id, char *buf, int32_t cap, bool special) {
    if (!v || id < 0 || id >= v->n) return INT32_MIN;
    size_t n;
    const char *p = tn_piece(v, id, special, 0, &n);
    if (cap < 0 || (size_t)cap < n || (!buf && n)) return -(int32_t)n;
    if (n) memcpy(buf, p, n);
    return (int32_t)n;
}

int32_t tn_detokenize(const tn_vocab *v, const int32_t *ids, int32_t n, char *buf, int32_t cap, bool remove_leading_space,
                      bool special) {
    if (!v || n < 0 || (!ids && n)) return INT32_MIN;
    int lstrip = remove_leading_space && v->add_space_prefix ? 1 : 0;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->n) return INT32_MIN;
        size_t m;
        tn_piece(v, ids[i], special, i == 0 ? lstrip : 0, &m);
        total += m;
        if (total > (size_t)INT32_MAX) return INT32_MIN;
    }
    if (cap < 0 || total > (size_t)cap || (!buf && total)) return -(int32_t)total;
    size_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t m;
        const char *p = tn_piece(v, ids[i], special, i == 0 ? lstrip : 0, &m);
        if (m) memcpy(buf + o, p, m);
        o += m;
    }
    int32_t t = (int32_t)total;
    if (v->clean_spaces && t > 0) {
        /* llama.cpp's clean_up_tokenization_spaces, three passes */
        char *x = buf;
        int32_t t1 = t;
        t = 1;
        for (int32_t i = 1; i < t1; i++) { /* " ?", " !", " .", " ," */
            char c = x[i];
            if (x[i - 1] == ' ' && (c == '?' || c == '!' || c == '.' || c == ',')) t--;
            x[t++] = c;
        }
        int32_t t2 = t;
        t = 1;
        for (int32_t i = 1; i < t2; i++) { /* " ' " -> "'" */
            char c = x[i];
            if (c == '\'' && i + 1 < t2 && x[i - 1] == ' ' && x[i + 1] == ' ') {
                t--;
                x[++i] = '\0';
            }
            x[t++] = c;
        }
        int32_t t3 = t;
        t = 1;
        for (int32_t i = 1; i < t3; i++) { /* " 's", " 'm", " 're", " 've" */
            char c = x[i];
            if (x[i - 1] == ' ' && c == '\'' && i + 1 < t3) {
                char c1 = x[i + 1];
                if (c1 == 's' || c1 == 'm') t--;
                else if (c1 != 't' && c1 != 'd' && i + 2 < t3) {
                    char c2 = x[i + 2];
                    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e')) t--;
                }
            }
            x[t++] = c;
        }
    }
    return t;
}
