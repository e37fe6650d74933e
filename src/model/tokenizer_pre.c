/*
 * tokenizer_pre.c — BPE pre-tokenizers: the regex sets llama.cpp (34af94cd9) uses per
 * `tokenizer.ggml.pre`, run with PCRE2 so that the words come out exactly as llama.cpp's
 * unicode_regex_split() makes them.
 *
 * How llama.cpp splits, and how this file reproduces it:
 *   - The text is decoded to code points (invalid UTF-8 bytes become U+FFFD one byte at a time).
 *   - Each regex of the set refines the chunks of the previous one: inside every chunk, matches
 *     and the unmatched gaps between them all become chunks (std::regex_iterator semantics,
 *     including empty matches acting as split points).
 *   - A regex using \p{N} \p{L} \p{P} \p{M} \p{S} (or \p{Lu} ...) runs on a "collapsed" text with
 *     one byte per code point: ASCII stays, other whitespace becomes \v, other code points become
 *     a category byte (0xD1 number, 0xD2 letter, 0xD3 punctuation, 0xD4 mark, 0xD5 symbol, 0xD0
 *     anything else), and each \p{X} in the regex becomes [<byte><ASCII members>]. We do the same
 *     (PCRE2 8-bit, non-UTF) and take the categories from PCRE2's Unicode tables (PCRE2_UTF |
 *     PCRE2_UCP), cached per code point. Note the ASCII member list of \p{S} lacks '~', as
 *     llama.cpp's does.
 *   - A regex without categories runs on the code points with non-ASCII whitespace replaced by
 *     \v; we run it with PCRE2_UTF (no UCP: \s \d \w are ASCII, as in std::wregex).
 *   - For the gpt2, llama3, qwen2 and qwen35 regexes llama.cpp uses hand-written splitters; they
 *     split exactly like the regex on the collapsed text (whitespace = the Unicode White_Space
 *     set, which is what the collapsed \s matches), so the regex is used for them too.
 *
 * Deviations (inputs on which llama.cpp throws or aborts): code points above U+10FFFF decoded
 * from F4..F7 lead bytes become U+FFFD; PCRE2 match limits end the chunk's matching (the rest is
 * one gap) with a warning. Categories come from PCRE2's tables (10.42: Unicode 14) plus a small
 * table of the code points Unicode 15.0/15.1 added, which llama.cpp's generated table has (so
 * the two agree on every code point); a PCRE2 built on Unicode 16+ would classify the code
 * points added there while llama.cpp (34af94cd9) still treats them as unassigned.
 *
 * Not here: regex sets that need llama.cpp's other custom splitters (kimi-k2, afmoe,
 * tiny_aya), or non-byte-level BPE (gemma4, sarvam-moe, whitespace): reported unsupported.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdatomic.h>
#include <string.h>

#include "model/tokenizer_impl.h"

/* ---- regex sets (the strings are llama.cpp's, byte for byte) ---------------------------------- */
static const char *const re_llama3[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_jais2[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
};
static const char *const re_deepseek_llm[] = {
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
};
static const char *const re_deepseek3[] = {
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_youtu[] = {
    "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_deepseek_coder[] = {
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}",
};
static const char *const re_falcon[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "[0-9][0-9][0-9]",
};
static const char *const re_starcoder[] = {
    "\\p{N}",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
};
static const char *const re_gpt2[] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
};
static const char *const re_qwen2[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_qwen35[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_poro[] = {
    " ?[^(\\s|.,!?…。，、।۔،)]+",
};
static const char *const re_viking[] = {
    " ?[^(\\s|.,!?…。，、।۔،)]+",
    "\\p{N}",
};
static const char *const re_tekken[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_chameleon[] = {
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
};
static const char *const re_gpt4o[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_granite_emb[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_superbpe[] = {
    "\\p{N}+",
    "(?=(\\d{3})+(?!\\d))",
};
static const char *const re_bailingmoe[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
};
static const char *const re_seed_coder[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_grok2[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_laguna[] = {
    "[^\\n]+|[\\n]+",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_exaone_moe[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
};
static const char *const re_minicpm5[] = {
    "\\p{N}{1,3}",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_default[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
};

#define RE(x) x, (uint8_t)TN_ARRAY_LEN(x)
enum { PF_KEEP_SPACES = 1, PF_IGNORE_MERGES = 2, PF_ADD_BOS = 4, PF_NO_BOS = 8, PF_UNSUPPORTED = 16 };

typedef struct tn_pre_entry {
    const char *name;
    const char *const *re;
    uint8_t n_re;
    uint8_t flags;
} tn_pre_entry;

/* tokenizer.ggml.pre values llama.cpp knows, with the flags its loader sets for them. Index 0
 * is the fallback. */
static const tn_pre_entry tn_pre_table[] = {
    {"default", RE(re_default), 0},
    {"llama3", RE(re_llama3), PF_IGNORE_MERGES | PF_ADD_BOS},
    {"llama-v3", RE(re_llama3), PF_IGNORE_MERGES | PF_ADD_BOS},
    {"llama-bpe", RE(re_llama3), PF_IGNORE_MERGES | PF_ADD_BOS},
    {"falcon3", RE(re_llama3), PF_IGNORE_MERGES | PF_ADD_BOS},
    {"falcon-h1", RE(re_llama3), PF_IGNORE_MERGES | PF_ADD_BOS},
    {"pixtral", RE(re_llama3), PF_IGNORE_MERGES | PF_ADD_BOS},
    {"midm-2.0", RE(re_llama3), PF_IGNORE_MERGES | PF_ADD_BOS},
    {"lfm2", RE(re_llama3), PF_IGNORE_MERGES | PF_ADD_BOS},
    {"jina-v5-nano", RE(re_llama3), PF_IGNORE_MERGES | PF_ADD_BOS},
    {"dbrx", RE(re_llama3), 0},
    {"smaug-bpe", RE(re_llama3), 0},
    {"glm4", RE(re_llama3), PF_NO_BOS},
    {"chatglm-bpe", RE(re_llama3), PF_NO_BOS},
    {"jais-2", RE(re_jais2), 0},
    {"deepseek-llm", RE(re_deepseek_llm), PF_KEEP_SPACES},
    {"deepseek-coder", RE(re_deepseek_coder), PF_KEEP_SPACES},
    {"deepseek-v3", RE(re_deepseek3), PF_KEEP_SPACES},
    {"hunyuan-dense", RE(re_deepseek3), PF_KEEP_SPACES},
    {"joyai-llm", RE(re_deepseek3), PF_KEEP_SPACES},
    {"youtu", RE(re_youtu), PF_KEEP_SPACES | PF_IGNORE_MERGES},
    {"falcon", RE(re_falcon), 0},
    {"starcoder", RE(re_starcoder), 0},
    {"refact", RE(re_starcoder), 0},
    {"command-r", RE(re_starcoder), PF_KEEP_SPACES},
    {"smollm", RE(re_starcoder), PF_KEEP_SPACES},
    {"codeshell", RE(re_starcoder), 0},
    {"exaone", RE(re_starcoder), 0},
    {"minerva-7b", RE(re_starcoder), 0},
    {"mellum2", RE(re_starcoder), 0},
    {"gpt-2", RE(re_gpt2), 0},
    {"phi-2", RE(re_gpt2), 0},
    {"jina-es", RE(re_gpt2), 0},
    {"jina-de", RE(re_gpt2), 0},
    {"gigachat", RE(re_gpt2), 0},
    {"jina-v2-es", RE(re_gpt2), 0},
    {"jina-v2-de", RE(re_gpt2), 0},
    {"a.x-4.0", RE(re_gpt2), 0},
    {"mellum", RE(re_gpt2), 0},
    {"modern-bert", RE(re_gpt2), 0},
    {"jina-v1-en", RE(re_gpt2), 0},
    {"jina-v2-code", RE(re_gpt2), 0},
    {"roberta-bpe", RE(re_gpt2), 0},
    {"exaone4", RE(re_gpt2), 0},
    {"mpt", RE(re_gpt2), 0},
    {"olmo", RE(re_gpt2), 0},
    {"jais", RE(re_gpt2), 0},
    {"trillion", RE(re_gpt2), PF_KEEP_SPACES},
    {"granite-docling", RE(re_gpt2), PF_KEEP_SPACES},
    {"qwen2", RE(re_qwen2), PF_KEEP_SPACES},
    {"deepseek-r1-qwen", RE(re_qwen2), PF_KEEP_SPACES},
    {"kormo", RE(re_qwen2), PF_KEEP_SPACES},
    {"f2llmv2", RE(re_qwen2), PF_KEEP_SPACES},
    {"megrez", RE(re_qwen2), 0},
    {"stablelm2", RE(re_qwen2), 0},
    {"hunyuan", RE(re_qwen2), PF_KEEP_SPACES},
    {"solar-open", RE(re_qwen2), PF_KEEP_SPACES},
    {"qwen35", RE(re_qwen35), PF_KEEP_SPACES},
    {"poro-chat", RE(re_poro), PF_KEEP_SPACES},
    {"bloom", RE(re_poro), 0},
    {"gpt3-finnish", RE(re_poro), 0},
    {"viking", RE(re_viking), PF_KEEP_SPACES},
    {"tekken", RE(re_tekken), PF_KEEP_SPACES | PF_IGNORE_MERGES | PF_ADD_BOS},
    {"chameleon", RE(re_chameleon), PF_KEEP_SPACES | PF_ADD_BOS},
    {"gpt-4o", RE(re_gpt4o), PF_KEEP_SPACES},
    {"llama4", RE(re_gpt4o), PF_KEEP_SPACES},
    {"kanana2", RE(re_gpt4o), PF_KEEP_SPACES},
    {"talkie", RE(re_gpt4o), PF_KEEP_SPACES},
    {"minimax-m2", RE(re_gpt4o), PF_KEEP_SPACES},
    {"granite-embed-multi-97m", RE(re_granite_emb), PF_KEEP_SPACES | PF_IGNORE_MERGES},
    {"superbpe", RE(re_superbpe), PF_KEEP_SPACES},
    {"bailingmoe", RE(re_bailingmoe), PF_KEEP_SPACES},
    {"bailingmoe2", RE(re_bailingmoe), PF_KEEP_SPACES},
    {"llada-moe", RE(re_bailingmoe), PF_KEEP_SPACES},
    {"seed-coder", RE(re_seed_coder), PF_KEEP_SPACES},
    {"grok-2", RE(re_grok2), PF_KEEP_SPACES},
    {"laguna", RE(re_laguna), PF_KEEP_SPACES},
    {"exaone-moe", RE(re_exaone_moe), 0},
    {"minicpm5", RE(re_minicpm5), PF_IGNORE_MERGES},
    /* known to llama.cpp, but they need splitters or encodings tern does not implement */
    {"kimi-k2", NULL, 0, PF_UNSUPPORTED},
    {"afmoe", NULL, 0, PF_UNSUPPORTED},
    {"tiny_aya", NULL, 0, PF_UNSUPPORTED},
    {"cohere2moe", NULL, 0, PF_UNSUPPORTED},
    {"gemma4", NULL, 0, PF_UNSUPPORTED},
    {"granite-embed-multi-311m", NULL, 0, PF_UNSUPPORTED},
    {"sarvam-moe", NULL, 0, PF_UNSUPPORTED},
    {"whitespace", NULL, 0, PF_UNSUPPORTED},
};

int tn_pretok_lookup(const char *name, size_t len) {
    for (size_t i = 0; i < TN_ARRAY_LEN(tn_pre_table); i++) {
        const char *t = tn_pre_table[i].name;
        if (strlen(t) == len && memcmp(t, name, len) == 0) return (int)i;
    }
    return -1;
}

void tn_pretok_info(int index, tn_pre_info *out) {
    const tn_pre_entry *e = &tn_pre_table[index];
    out->name = e->name;
    out->supported = !(e->flags & PF_UNSUPPORTED);
    out->clean_spaces = !(e->flags & PF_KEEP_SPACES);
    out->ignore_merges = (e->flags & PF_IGNORE_MERGES) != 0;
    out->add_bos = (e->flags & PF_ADD_BOS) != 0;
    out->no_bos = (e->flags & PF_NO_BOS) != 0;
}

/* ---- compiled pre-tokenizer ------------------------------------------------------------------- */
#define TN_PRE_MAX_RE 8
#define TN_NCP 0x110000u

typedef struct tn_regex {
    pcre2_code *code;
    bool collapsed; /* runs on the one-byte-per-code-point text */
} tn_regex;

struct tn_pretok {
    int index;
    int n_re;
    tn_regex re[TN_PRE_MAX_RE];
    bool need_collapsed, need_utf;
    pcre2_general_context *gctx;
    pcre2_code *cls;                  /* (\p{N})|(\p{L})|(\p{P})|(\p{M})|(\p{S}), anchored use  */
    _Atomic unsigned char *cls_cache; /* [TN_NCP] collapsed byte per code point, 0 = not yet    */
};

static void *tn_pcre2_malloc(PCRE2_SIZE n, void *u) {
    TN_UNUSED(u);
    return tn_malloc(n);
}
static void tn_pcre2_free(void *p, void *u) {
    TN_UNUSED(u);
    tn_free(p);
}

/* llama.cpp's \p{...} names and what they collapse to. */
static const struct {
    const char *pat;
    unsigned char byte;
    const char *ascii; /* ASCII members, as a character-class body */
} tn_ucat[] = {
    {"\\p{N}", 0xD1, "0-9"},
    {"\\p{L}", 0xD2, "A-Za-z"},
    {"\\p{P}", 0xD3, "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"},
    {"\\p{M}", 0xD4, ""},
    {"\\p{S}", 0xD5, "\\$\\+<->^`\\|"},
    {"\\p{Lu}", 0xD2, "A-Za-z"},
    {"\\p{Ll}", 0xD2, "A-Za-z"},
    {"\\p{Lt}", 0xD2, "A-Za-z"},
    {"\\p{Lm}", 0xD2, "A-Za-z"},
    {"\\p{Lo}", 0xD2, "A-Za-z"},
};

static bool tn_re_uses_categories(const char *re) {
    for (size_t i = 0; i < TN_ARRAY_LEN(tn_ucat); i++)
        if (strstr(re, tn_ucat[i].pat)) return true;
    return false;
}

/* llama.cpp's regex collapsing: each known \p{X} becomes its byte plus ASCII members, wrapped
 * in [] unless already inside a class. Returns a tn_malloc'd pattern. */
static char *tn_re_collapse(const char *re) {
    size_t n = strlen(re);
    tn_bbuf b = {0};
    bool inside = false;
    tern_status s = TERN_OK;
    for (size_t i = 0; i < n && !s; i++) {
        char c = re[i];
        if (c == '[' && (i == 0 || re[i - 1] != '\\')) {
            inside = true;
            s = tn_bbuf_put(&b, "[", 1);
            continue;
        }
        if (inside && c == ']' && re[i - 1] != '\\') {
            inside = false;
            s = tn_bbuf_put(&b, "]", 1);
            continue;
        }
        if (c == '\\' && i + 3 < n && re[i + 1] == 'p' && re[i + 2] == '{') {
            const char *close = strchr(re + i + 3, '}');
            if (close && (size_t)(close - re) <= i + 10) {
                size_t plen = (size_t)(close - re) - i + 1;
                size_t k = 0;
                while (k < TN_ARRAY_LEN(tn_ucat) && !(strlen(tn_ucat[k].pat) == plen && memcmp(tn_ucat[k].pat, re + i, plen) == 0)) k++;
                if (k < TN_ARRAY_LEN(tn_ucat)) {
                    if (!inside) s = tn_bbuf_put(&b, "[", 1);
                    if (!s) s = tn_bbuf_put(&b, &tn_ucat[k].byte, 1);
                    if (!s) s = tn_bbuf_put(&b, tn_ucat[k].ascii, strlen(tn_ucat[k].ascii));
                    if (!s && !inside) s = tn_bbuf_put(&b, "]", 1);
                    i += plen - 1;
                    continue;
                }
            }
        }
        s = tn_bbuf_put(&b, &c, 1);
    }
    if (!s) s = tn_bbuf_put(&b, "", 1);
    if (s) {
        tn_free(b.p);
        return NULL;
    }
    return b.p;
}

static tern_status tn_re_compile(tn_pretok *p, const char *pat, size_t len, uint32_t opts, pcre2_code **out) {
    pcre2_compile_context *cc = pcre2_compile_context_create(p->gctx);
    if (!cc) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory compiling a regex");
    int err = 0;
    PCRE2_SIZE erroff = 0;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)pat, len, opts, &err, &erroff, cc);
    pcre2_compile_context_free(cc);
    if (!code) {
        if (err == PCRE2_ERROR_HEAP_FAILED)
            return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory compiling a regex");
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return tn_err(TERN_ERR_INTERNAL, "tokenizer: pre-tokenizer '%s': regex does not compile at %zu: %s",
                      tn_pre_table[p->index].name, (size_t)erroff, (const char *)msg);
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    *out = code;
    return TERN_OK;
}

void tn_pretok_free(tn_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n_re; i++) pcre2_code_free(p->re[i].code);
    pcre2_code_free(p->cls);
    tn_free((void *)p->cls_cache);
    pcre2_general_context_free(p->gctx);
    tn_free(p);
}

tern_status tn_pretok_create(int index, tn_pretok **out) {
    *out = NULL;
    const tn_pre_entry *e = &tn_pre_table[index];
    if ((e->flags & PF_UNSUPPORTED) || e->n_re > TN_PRE_MAX_RE)
        return tn_err(TERN_ERR_UNSUPPORTED, "tokenizer: pre-tokenizer '%s' is not supported", e->name);
    tn_pretok *p = tn_calloc(1, sizeof *p);
    if (!p) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
    p->index = index;
    tern_status s = TERN_OK;
    p->gctx = pcre2_general_context_create(tn_pcre2_malloc, tn_pcre2_free, NULL);
    if (!p->gctx) {
        s = tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
        goto fail;
    }
    for (int i = 0; i < e->n_re; i++) {
        const char *re = e->re[i];
        tn_regex *r = &p->re[i];
        if (tn_re_uses_categories(re)) {
            for (const char *c = re; *c; c++)
                if ((unsigned char)*c >= 0x80) {
                    s = tn_err(TERN_ERR_INTERNAL, "tokenizer: regex mixes categories and non-ASCII");
                    goto fail;
                }
            char *col = tn_re_collapse(re);
            if (!col) {
                s = tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
                goto fail;
            }
            s = tn_re_compile(p, col, strlen(col), PCRE2_DOLLAR_ENDONLY, &r->code);
            tn_free(col);
            r->collapsed = true;
            p->need_collapsed = true;
        } else {
            s = tn_re_compile(p, re, strlen(re), PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &r->code);
            p->need_utf = true;
        }
        if (s) goto fail;
        p->n_re = i + 1;
    }
    if (p->need_collapsed) {
        static const char cls[] = "(\\p{N})|(\\p{L})|(\\p{P})|(\\p{M})|(\\p{S})";
        s = tn_re_compile(p, cls, sizeof cls - 1, PCRE2_UTF | PCRE2_UCP, &p->cls);
        if (s) goto fail;
        p->cls_cache = tn_calloc(TN_NCP, 1);
        if (!p->cls_cache) {
            s = tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
            goto fail;
        }
    }
    *out = p;
    return TERN_OK;
fail:
    tn_pretok_free(p);
    return s;
}

/* ---- splitting -------------------------------------------------------------------------------- */
/* llama.cpp's unicode_set_whitespace (Unicode White_Space) beyond ASCII. */
static bool tn_is_wide_space(uint32_t cp) {
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Code points llama.cpp's table (Unicode 15.1) assigns but PCRE2 10.42 (Unicode 14) does not:
 * first, last, collapsed category byte. Consulted only when PCRE2 finds no category, so a
 * newer PCRE2 that knows them agrees anyway. */
static const struct {
    uint32_t first, last;
    unsigned char cat;
} tn_ucd_delta[] = {
    {0x00CF3, 0x00CF3, 0xD4}, {0x00ECE, 0x00ECE, 0xD4}, {0x02FFC, 0x02FFF, 0xD5}, {0x031EF, 0x031EF, 0xD5},
    {0x10EFD, 0x10EFF, 0xD4}, {0x1123F, 0x11240, 0xD2}, {0x11241, 0x11241, 0xD4}, {0x11B00, 0x11B09, 0xD3},
    {0x11F00, 0x11F01, 0xD4}, {0x11F02, 0x11F02, 0xD2}, {0x11F03, 0x11F03, 0xD4}, {0x11F04, 0x11F10, 0xD2},
    {0x11F12, 0x11F33, 0xD2}, {0x11F34, 0x11F3A, 0xD4}, {0x11F3E, 0x11F42, 0xD4}, {0x11F43, 0x11F4F, 0xD3},
    {0x11F50, 0x11F59, 0xD1}, {0x1342F, 0x1342F, 0xD2}, {0x13440, 0x13440, 0xD4}, {0x13441, 0x13446, 0xD2},
    {0x13447, 0x13455, 0xD4}, {0x1B132, 0x1B132, 0xD2}, {0x1B155, 0x1B155, 0xD2}, {0x1D2C0, 0x1D2D3, 0xD1},
    {0x1DF25, 0x1DF2A, 0xD2}, {0x1E030, 0x1E06D, 0xD2}, {0x1E08F, 0x1E08F, 0xD4}, {0x1E4D0, 0x1E4EB, 0xD2},
    {0x1E4EC, 0x1E4EF, 0xD4}, {0x1E4F0, 0x1E4F9, 0xD1}, {0x1F6DC, 0x1F6DC, 0xD5}, {0x1F774, 0x1F776, 0xD5},
    {0x1F77B, 0x1F77F, 0xD5}, {0x1F7D9, 0x1F7D9, 0xD5}, {0x1FA75, 0x1FA77, 0xD5}, {0x1FA87, 0x1FA88, 0xD5},
    {0x1FAAD, 0x1FAAF, 0xD5}, {0x1FABB, 0x1FABD, 0xD5}, {0x1FABF, 0x1FABF, 0xD5}, {0x1FACE, 0x1FACF, 0xD5},
    {0x1FADA, 0x1FADB, 0xD5}, {0x1FAE8, 0x1FAE8, 0xD5}, {0x1FAF7, 0x1FAF8, 0xD5}, {0x2B739, 0x2B739, 0xD2},
    {0x2EBF0, 0x2EE5D, 0xD2}, {0x31350, 0x323AF, 0xD2},
};

static unsigned char tn_delta_class(uint32_t cp) {
    size_t lo = 0, hi = TN_ARRAY_LEN(tn_ucd_delta);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < tn_ucd_delta[mid].first) hi = mid;
        else if (cp > tn_ucd_delta[mid].last) lo = mid + 1;
        else return tn_ucd_delta[mid].cat;
    }
    return 0xD0;
}

/* Collapsed byte of a non-ASCII code point, -1 if PCRE2 ran out of memory. */
static int tn_classify(const tn_pretok *p, uint32_t cp, pcre2_match_data *md) {
    if (tn_is_wide_space(cp)) return 0x0B;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0xD0; /* surrogates: category Cs */
    unsigned char c = atomic_load_explicit(&p->cls_cache[cp], memory_order_relaxed);
    if (c) return c;
    char u[4];
    size_t n = tn_utf8_encode(cp, u);
    int rc = pcre2_match(p->cls, (PCRE2_SPTR)u, n, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) return -1;
    /* the alternatives are exclusive: rc - 1 is the one group that matched */
    c = (rc >= 2 && rc <= 6) ? (unsigned char)(0xD0 + rc - 1) : tn_delta_class(cp);
    atomic_store_explicit(&p->cls_cache[cp], c, memory_order_relaxed);
    return c;
}

typedef struct tn_split_ctx {
    const tn_pretok *p;
    const uint32_t *cps;
    size_t n_cp;
    unsigned char *col;      /* collapsed text [n_cp]                   */
    char *utf;               /* UTF-8 text for non-category regexes     */
    size_t *boff;            /* [n_cp + 1] byte offset of code point i  */
    pcre2_match_data *md;
} tn_split_ctx;

/* Code point index of byte offset b (a code point boundary) within [lo, hi]. */
static size_t tn_cp_at(const size_t *boff, size_t lo, size_t hi, size_t b) {
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (boff[mid] < b) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Splits chunk [start, start+len) (code points) with regex r, appending piece lengths. */
static tern_status tn_split_chunk(tn_split_ctx *x, const tn_regex *r, size_t start, size_t len, tn_zvec *outv) {
    const unsigned char *subj;
    size_t slen;
    if (r->collapsed) {
        subj = x->col + start;
        slen = len;
    } else {
        subj = (const unsigned char *)x->utf + x->boff[start];
        slen = x->boff[start + len] - x->boff[start];
    }
    size_t base = r->collapsed ? 0 : x->boff[start];
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(x->md);
    size_t pos = 0, prev = 0; /* bytes within the subject */
    size_t prev_cp = 0;       /* code points within the chunk */
    uint32_t opts = r->collapsed ? 0 : PCRE2_NO_UTF_CHECK;
    uint32_t extra = 0;
    tern_status s = TERN_OK;
    while (pos <= slen) {
        int rc = pcre2_match(r->code, subj, slen, pos, opts | extra, x->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !(opts & PCRE2_NO_JIT)) {
            opts |= PCRE2_NO_JIT;
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH) {
            if (!extra) break;
            /* no non-empty match at an empty match's position: search on from the next char */
            extra = 0;
            pos += r->collapsed ? 1 : tn_utf8_len(subj[pos]);
            continue;
        }
        if (rc == PCRE2_ERROR_NOMEMORY) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory in regex match");
        if (rc < 0) {
            tn_log(TERN_LOG_WARN, "tokenizer: pre-tokenizer '%s': regex match failed (%d); rest of a %zu-byte chunk kept whole",
                   tn_pre_table[x->p->index].name, rc, slen);
            break;
        }
        size_t ms = ov[0], me = ov[1];
        size_t ms_cp = r->collapsed ? ms : tn_cp_at(x->boff, start, start + len, base + ms) - start;
        size_t me_cp = r->collapsed ? me : tn_cp_at(x->boff, start, start + len, base + me) - start;
        if (ms_cp > prev_cp && (s = tn_zvec_push(outv, ms_cp - prev_cp))) return s;
        if (me_cp > ms_cp && (s = tn_zvec_push(outv, me_cp - ms_cp))) return s;
        prev = me;
        prev_cp = me_cp;
        pos = me;
        if (me == ms) {
            if (me >= slen) break;
            extra = PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED;
        } else {
            extra = 0;
        }
    }
    TN_UNUSED(prev);
    if (prev_cp < len && (s = tn_zvec_push(outv, len - prev_cp))) return s;
    return TERN_OK;
}

tern_status tn_pretok_split(const tn_pretok *p, const char *text, size_t n, tn_bbuf *bytes, tn_zvec *lens) {
    const unsigned char *t = (const unsigned char *)text;
    tn_split_ctx x = {.p = p};
    tn_zvec a = {0}, b = {0};
    pcre2_match_data *cmd = NULL;
    tern_status s = TERN_OK;
    uint32_t *cps = NULL;
    if (n == 0) return TERN_OK;

    cps = tn_malloc(n * sizeof *cps);
    if (!cps) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
    size_t n_cp = 0;
    for (size_t off = 0; off < n;) cps[n_cp++] = tn_utf8_decode(t, n, &off);
    x.cps = cps;
    x.n_cp = n_cp;

    x.md = pcre2_match_data_create(1, p->gctx);
    if (!x.md) goto nomem;
    if (p->need_collapsed) {
        cmd = pcre2_match_data_create(6, p->gctx);
        x.col = tn_malloc(n_cp);
        if (!cmd || !x.col) goto nomem;
        for (size_t i = 0; i < n_cp; i++) {
            int c = cps[i] < 0x80 ? (int)cps[i] : tn_classify(p, cps[i], cmd);
            if (c < 0) goto nomem;
            x.col[i] = (unsigned char)c;
        }
    }
    if (p->need_utf) {
        x.utf = tn_malloc(n_cp * 4 + 1);
        x.boff = tn_malloc((n_cp + 1) * sizeof *x.boff);
        if (!x.utf || !x.boff) goto nomem;
        size_t o = 0;
        for (size_t i = 0; i < n_cp; i++) {
            uint32_t c = cps[i];
            if (c >= 0x80 && tn_is_wide_space(c)) c = 0x0B;
            else if (c >= 0xD800 && c <= 0xDFFF) c = 0xE000; /* stand-in a UTF regex can hold */
            x.boff[i] = o;
            o += tn_utf8_encode(c, x.utf + o);
        }
        x.boff[n_cp] = o;
    }

    if ((s = tn_zvec_push(&a, n_cp))) goto done;
    for (int i = 0; i < p->n_re; i++) {
        b.n = 0;
        size_t start = 0;
        for (size_t k = 0; k < a.n; k++) {
            if ((s = tn_split_chunk(&x, &p->re[i], start, a.p[k], &b))) goto done;
            start += a.p[k];
        }
        tn_zvec tmp = a;
        a = b;
        b = tmp;
    }

    /* words: the original code points, UTF-8 encoded */
    size_t start = 0;
    for (size_t k = 0; k < a.n; k++) {
        size_t before = bytes->n;
        for (size_t i = start; i < start + a.p[k]; i++) {
            char u[4];
            size_t m = tn_utf8_encode(cps[i], u);
            if ((s = tn_bbuf_put(bytes, u, m))) goto done;
        }
        if ((s = tn_zvec_push(lens, bytes->n - before))) goto done;
        start += a.p[k];
    }
    goto done;
nomem:
    s = tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
done:
    pcre2_match_data_free(x.md);
    pcre2_match_data_free(cmd);
    tn_free(x.col);
    tn_free(x.utf);
    tn_free(x.boff);
    tn_free(cps);
    tn_free(a.p);
    tn_free(b.p);
    return s;
}
