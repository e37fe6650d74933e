/*
 * test_lora.c — LoRA adapters at inference (model/lora.c, the blocks' adapter terms) and tern
 * export-lora, on tiny f32 models of llama and phi3 (fused attn_qkv and gate|up ffn_up):
 *   (a) an adapter at scale 0 gives exactly the base model's logits;
 *   (b) base + adapter at run time == a model whose weights this test merged itself
 *       (W + scale * alpha / r * B A in double from the f32 base) — prefill and one-token
 *       decode, 1 and 2 threads, two adapters at once;
 *   (c) tern export-lora's file == the run-time adapter's logits (when $TERN_BIN is set);
 *   (d) bad adapters: wrong architecture, wrong shape, rank mismatch, missing lora_b, not an
 *       adapter, a tensor the base lacks, an embedding adapter — each TERN_ERR_FORMAT /
 *       UNSUPPORTED with a message naming it; through tern generate, exit 65.
 * The adapter files are written here with tern's GGUF writer: A f32, B f16 (rounded values are
 * what the merge uses), random.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/tiny_model.h"
#include "core/fp16.h"
#include "fmt/gguf.h"
#include "tern/tern.h"

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static const char *const adapted[] = {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_qkv.weight", "attn_output.weight",
                                      "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};

static bool is_adapted(const char *name) {
    if (!strcmp(name, "output.weight")) return true;
    for (size_t i = 0; i < sizeof adapted / sizeof *adapted; i++) {
        const size_t n = strlen(name), k = strlen(adapted[i]);
        if (n > k && !strcmp(name + n - k, adapted[i]) && name[n - k - 1] == '.') return true;
    }
    return false;
}

/* One adapter in memory: per adapted base tensor i, A [r][k] and B [m][r] (f16-rounded). */
typedef struct {
    int n;
    char name[64][96];
    int64_t k[64], m[64];
    int32_t r;
    float *A[64], *B[64];
    float alpha;
} adapter;

enum fault { F_NONE, F_ARCH, F_SHAPE, F_RANK, F_NO_B, F_NOT_ADAPTER, F_MISSING_BASE, F_EMBD };

static void adapter_make(adapter *ad, const tn_gguf *base, int32_t r, float alpha, float amp) {
    memset(ad, 0, sizeof *ad);
    ad->r = r, ad->alpha = alpha;
    for (uint64_t i = 0; i < base->n_tensors; i++) {
        const tn_gguf_tensor *t = &base->tensors[i];
        if (!is_adapted(t->name)) continue;
        const int j = ad->n++;
        snprintf(ad->name[j], sizeof ad->name[j], "%s", t->name);
        ad->k[j] = t->ne[0], ad->m[j] = t->ne[1];
        ad->A[j] = malloc(sizeof(float) * (size_t)(r * t->ne[0]));
        ad->B[j] = malloc(sizeof(float) * (size_t)(r * t->ne[1]));
        for (int64_t q = 0; q < r * t->ne[0]; q++) ad->A[j][q] = amp * frand();
        for (int64_t q = 0; q < r * t->ne[1]; q++) ad->B[j][q] = tn_fp16_to_fp32(tn_fp32_to_fp16(amp * frand()));
    }
}

static void adapter_free(adapter *ad) {
    for (int j = 0; j < ad->n; j++) free(ad->A[j]), free(ad->B[j]);
}

static void adapter_write(const adapter *ad, const char *path, const char *arch, enum fault f) {
    tn_gguf_writer *w;
    CHECK(!tn_gguf_writer_create(&w), "writer");
    CHECK(!tn_gguf_set_str(w, "general.type", f == F_NOT_ADAPTER ? "model" : "adapter"), "kv");
    CHECK(!tn_gguf_set_str(w, "general.architecture", f == F_ARCH ? "qwen2" : arch), "kv");
    CHECK(!tn_gguf_set_str(w, "adapter.type", "lora"), "kv");
    CHECK(!tn_gguf_set_f32(w, "adapter.lora.alpha", ad->alpha), "kv");
    tn_fp16 **b16 = calloc((size_t)ad->n, sizeof *b16);
    float *wide = NULL;
    for (int j = 0; j < ad->n; j++) {
        char nm[128];
        const char *base = f == F_MISSING_BASE && j == 0 ? "blk.9.attn_q.weight" : f == F_EMBD && j == 0 ? "token_embd.weight" : ad->name[j];
        const int64_t k = f == F_SHAPE && j == 1 ? ad->k[j] + 32 : ad->k[j];
        int64_t ne_a[2] = {k, ad->r}, ne_b[2] = {f == F_RANK && j == 2 ? ad->r + 1 : ad->r, ad->m[j]};
        b16[j] = malloc(sizeof(tn_fp16) * (size_t)(ne_b[0] * ne_b[1]));
        for (int64_t q = 0; q < ne_b[0] * ne_b[1]; q++) b16[j][q] = tn_fp32_to_fp16(ad->B[j][q % (ad->r * ad->m[j])]);
        float *a = ad->A[j];
        if (f == F_SHAPE && j == 1) a = wide = calloc((size_t)(k * ad->r), sizeof(float)); /* n_in 32 too wide */
        snprintf(nm, sizeof nm, "%s.lora_a", base);
        CHECK(!tn_gguf_add_tensor(w, nm, TN_F32, 2, ne_a, a), "add %s", nm);
        snprintf(nm, sizeof nm, "%s.lora_b", base);
        if (!(f == F_NO_B && j == 3)) CHECK(!tn_gguf_add_tensor(w, nm, TN_F16, 2, ne_b, b16[j]), "add %s", nm);
    }
    CHECK(!tn_gguf_write(w, path, NULL, NULL), "write %s: %s", path, tern_last_error());
    tn_gguf_writer_free(w);
    for (int j = 0; j < ad->n; j++) free(b16[j]);
    free(b16);
    free(wide);
}

/* The fill of the merged model: each tensor's bytes, adapted ones as W + sum s B A in double. */
typedef struct {
    const tn_gguf *g;
    const adapter *ad;
    const float *scale;
    int n_ad;
} merge_job;

static tern_status merge_fill(void *user, size_t index, void *dst, size_t nbytes) {
    const merge_job *mj = user;
    const tn_gguf_tensor *t = &mj->g->tensors[index];
    memcpy(dst, t->data, nbytes);
    if (!is_adapted(t->name)) return TERN_OK;
    float *w = dst;
    CHECK(t->type == TN_F32, "base tensor %s is not f32", t->name);
    for (int a = 0; a < mj->n_ad; a++) {
        const adapter *ad = &mj->ad[a];
        int j = 0;
        while (j < ad->n && strcmp(ad->name[j], t->name)) j++;
        CHECK(j < ad->n, "no pair for %s", t->name);
        const double s = (double)mj->scale[a] * (ad->alpha != 0 ? (double)ad->alpha / ad->r : 1.0);
        for (int64_t row = 0; row < t->ne[1]; row++)
            for (int64_t col = 0; col < t->ne[0]; col++) {
                double acc = 0;
                for (int32_t q = 0; q < ad->r; q++) acc += (double)ad->B[j][row * ad->r + q] * (double)ad->A[j][q * t->ne[0] + col];
                w[row * t->ne[0] + col] = (float)((double)w[row * t->ne[0] + col] + s * acc);
            }
    }
    return TERN_OK;
}

static void merged_write(const char *base_path, const char *out, const adapter *ad, const float *scale, int n_ad) {
    tn_gguf *g;
    CHECK(!tn_gguf_open(base_path, true, &g), "open %s", base_path);
    tn_gguf_writer *w;
    CHECK(!tn_gguf_writer_create(&w), "writer");
    for (uint64_t i = 0; i < g->n_kv; i++) CHECK(!tn_gguf_set_kv(w, &g->kv[i]), "kv");
    for (uint64_t i = 0; i < g->n_tensors; i++)
        CHECK(!tn_gguf_add_tensor(w, g->tensors[i].name, g->tensors[i].type, g->tensors[i].n_dims, g->tensors[i].ne, NULL), "t");
    merge_job mj = {g, ad, scale, n_ad};
    CHECK(!tn_gguf_write(w, out, merge_fill, &mj), "write merged: %s", tern_last_error());
    tn_gguf_writer_free(w);
    tn_gguf_free(g);
}

/* run time vs merged weights: the same sums in another order (B (A x) against (W + s B A) x),
 * through K and V cached in f16 (a 1-ulp f16 flip is 5e-4 relative) */
#define TOL 1e-3

#define N_PROMPT 6
#define N_DECODE 3
#define N_ROWS (N_PROMPT + N_DECODE)

/* Logits of a prompt (prefill, every row) and N_DECODE one-token steps: rows [N_ROWS][n_vocab]. */
static float *run_logits(const char *model_path, const char *const *lora, const float *scales, int n_lora, int threads) {
    tern_model_params mp;
    tern_model_params_init(&mp);
    tern_model *m;
    CHECK(!tern_model_load(model_path, &mp, &m), "load %s: %s", model_path, tern_last_error());
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = 32, cp.n_batch = 16, cp.n_threads = threads, cp.logits_all = true;
    tern_ctx *c;
    CHECK(!tern_ctx_create(m, &cp, &c), "ctx");
    tern_lora *a[4] = {0};
    for (int i = 0; i < n_lora; i++) CHECK(!tern_lora_load(m, lora[i], &a[i]), "lora %s: %s", lora[i], tern_last_error());
    if (n_lora) CHECK(!tern_ctx_set_lora(c, a, scales, n_lora), "set lora: %s", tern_last_error());
    const int32_t nv = tern_model_n_vocab(m);
    float *out = malloc(sizeof(float) * (size_t)nv * N_ROWS);
    const tern_token prompt[N_PROMPT] = {1, 300, 17, 260, 99, 301};
    CHECK(!tern_decode(c, prompt, N_PROMPT), "prefill");
    for (int i = 0; i < N_PROMPT; i++) memcpy(out + (size_t)i * nv, tern_get_logits(c, i), sizeof(float) * (size_t)nv);
    for (int i = 0; i < N_DECODE; i++) {
        const tern_token t = (tern_token)(270 + 11 * i);
        CHECK(!tern_decode(c, &t, 1), "decode");
        memcpy(out + (size_t)(N_PROMPT + i) * nv, tern_get_logits(c, 0), sizeof(float) * (size_t)nv);
    }
    tern_ctx_free(c);
    for (int i = 0; i < n_lora; i++) tern_lora_free(a[i]);
    tern_model_free(m);
    return out;
}

/* max |x - y| / max(1, max |y|) */
static double rel_diff(const float *x, const float *y, int64_t n) {
    double d = 0, mx = 1;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)x[i] - (double)y[i]));
        mx = fmax(mx, fabs((double)y[i]));
    }
    return d / mx;
}

static void expect_bad(const char *model_path, const char *lora_path, tern_status want, const char *needle) {
    tern_model_params mp;
    tern_model_params_init(&mp);
    tern_model *m;
    CHECK(!tern_model_load(model_path, &mp, &m), "load");
    tern_lora *a = (tern_lora *)1;
    const tern_status s = tern_lora_load(m, lora_path, &a);
    CHECK(s == want, "%s: status %d, want %d (%s)", lora_path, (int)s, (int)want, tern_last_error());
    CHECK(a == NULL, "out not NULL on failure");
    CHECK(strstr(tern_last_error(), needle), "message '%s' lacks '%s'", tern_last_error(), needle);
    printf("  ok: %s\n", tern_last_error());
    tern_model_free(m);
}

static int run_cmd(const char *cmd) {
    const int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Everything above on the model cfg describes; a quantized base (full = false): (a) only. */
static void test_arch(tiny_cfg cfg, const char *tag, bool full) {
    const char *arch = cfg.arch;
    printf("== %s (%s)\n", arch, tag);
    char base[512], ad1p[512], ad2p[512], merged[512], exported[512], bad[512];
    char stem[64];
    snprintf(stem, sizeof stem, "lora-base-%s", tag), tiny_tmp_path(base, sizeof base, stem);
    snprintf(stem, sizeof stem, "lora-a1-%s", tag), tiny_tmp_path(ad1p, sizeof ad1p, stem);
    snprintf(stem, sizeof stem, "lora-a2-%s", tag), tiny_tmp_path(ad2p, sizeof ad2p, stem);
    snprintf(stem, sizeof stem, "lora-merged-%s", tag), tiny_tmp_path(merged, sizeof merged, stem);
    snprintf(stem, sizeof stem, "lora-export-%s", tag), tiny_tmp_path(exported, sizeof exported, stem);
    snprintf(stem, sizeof stem, "lora-bad-%s", tag), tiny_tmp_path(bad, sizeof bad, stem);
    CHECK(tiny_model_write(base, &cfg) == TERN_OK, "tiny model");
    tn_gguf *g;
    CHECK(!tn_gguf_open(base, true, &g), "open base");
    adapter ad[2];
    adapter_make(&ad[0], g, 8, 16.0f, 0.05f); /* alpha / r = 2 */
    adapter_make(&ad[1], g, 4, 0.0f, 0.05f);  /* no alpha: the scale alone */
    tn_gguf_free(g);
    adapter_write(&ad[0], ad1p, arch, F_NONE);
    adapter_write(&ad[1], ad2p, arch, F_NONE);
    const int32_t nv = (int32_t)cfg.n_vocab;
    const int64_t n = (int64_t)nv * N_ROWS;

    /* (a) scale 0 == base, bit for bit */
    for (int th = 1; th <= 2; th++) {
        float *lb = run_logits(base, NULL, NULL, 0, th);
        const char *l1[] = {ad1p};
        const float s0 = 0.0f;
        float *la = run_logits(base, l1, &s0, 1, th);
        CHECK(!memcmp(la, lb, sizeof(float) * (size_t)n), "(a) scale 0 differs from the base (%d threads)", th);
        /* and a real adapter does change them */
        const float s1 = 1.0f;
        float *lc = run_logits(base, l1, &s1, 1, th);
        /* the adapter's effect, far above the tolerances below */
        CHECK(rel_diff(lc, lb, n) > 20 * TOL, "(a) the adapter at scale 1 changes little (%g)", rel_diff(lc, lb, n));
        if (th == 1) printf("  (a) the adapter at scale 1 moves the logits by %.3g (max rel)\n", rel_diff(lc, lb, n));
        free(la), free(lb), free(lc);
    }
    printf("  (a) scale 0 == base exactly, 1 and 2 threads\n");
    const char *rm[] = {base, ad1p, ad2p, merged, exported, bad};
    if (!full) {
        adapter_free(&ad[0]), adapter_free(&ad[1]);
        for (size_t i = 0; i < sizeof rm / sizeof *rm; i++) remove(rm[i]);
        return;
    }

    /* (b) run time == merged by this test; two adapters, scales 0.7 and -1.3 */
    const float scales[2] = {0.7f, -1.3f};
    merged_write(base, merged, ad, scales, 2);
    float *lm = run_logits(merged, NULL, NULL, 0, 1);
    const char *l2[] = {ad1p, ad2p};
    for (int th = 1; th <= 2; th++) {
        float *lr = run_logits(base, l2, scales, 2, th);
        const double e = rel_diff(lr, lm, n);
        printf("  (b) run time vs merged, %d thread(s): max rel diff %.3g\n", th, e);
        CHECK(e < TOL, "(b) run-time adapters differ from the merged model by %g", e);
        free(lr);
    }
    free(lm);

    /* (c) tern export-lora == run time */
    const char *bin = getenv("TERN_BIN");
    if (bin && *bin) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s export-lora -m %s --lora %s:%g --lora-scaled %s %g -o %s", bin, base, ad1p,
                 (double)scales[0], ad2p, (double)scales[1], exported);
        CHECK(run_cmd(cmd) == 0, "(c) %s failed", cmd);
        float *le = run_logits(exported, NULL, NULL, 0, 2);
        float *lr = run_logits(base, l2, scales, 2, 2);
        const double e = rel_diff(le, lr, n);
        printf("  (c) export-lora (f32) vs run time: max rel diff %.3g\n", e);
        CHECK(e < TOL, "(c) export-lora's model differs from the run-time adapters by %g", e);
        free(le), free(lr);
        /* an output type: q8_0 merged tensors, within q8_0's error */
        snprintf(cmd, sizeof cmd, "%s export-lora -m %s --lora %s:%g --lora %s:%g -o %s --type q8_0", bin, base, ad1p,
                 (double)scales[0], ad2p, (double)scales[1], exported);
        CHECK(run_cmd(cmd) == 0, "(c) %s failed", cmd);
        le = run_logits(exported, NULL, NULL, 0, 1);
        lr = run_logits(base, l2, scales, 2, 1);
        const double eq = rel_diff(le, lr, n);
        printf("  (c) export-lora --type q8_0 vs run time: max rel diff %.3g\n", eq);
        /* test_forward's tolerance for q8_0 files (weights and activations quantized): 4e-2 */
        CHECK(eq < 4e-2 && eq > 0, "(c) q8_0 export differs by %g", eq);
        free(le), free(lr);
        tn_gguf *eg;
        CHECK(!tn_gguf_open(exported, true, &eg), "open the export");
        const tn_gguf_tensor *tq = tn_gguf_find_tensor(eg, "blk.0.ffn_down.weight"), *te = tn_gguf_find_tensor(eg, "token_embd.weight");
        CHECK(tq && tq->type == TN_Q8_0, "(c) the merged ffn_down is not q8_0");
        CHECK(te && te->type == TN_F32, "(c) token_embd (not adapted) was not copied as f32");
        tn_gguf_free(eg);
        /* (d) through the CLI: a bad adapter is exit 65, a missing one 66 */
        adapter_write(&ad[0], bad, arch, F_ARCH);
        snprintf(cmd, sizeof cmd, "%s generate -m %s --lora %s -p hi -n 2 >/dev/null 2>&1", bin, base, bad);
        CHECK(run_cmd(cmd) == 65, "(d) generate with a wrong-arch adapter: exit %d, want 65", run_cmd(cmd));
        FILE *tf = fopen(bad, "w"); /* a text for perplexity (the bad adapter's path, reused) */
        CHECK(tf, "text file");
        for (int i = 0; i < 200; i++) fputs("once upon a time there was a tiny model. ", tf);
        fclose(tf);
        snprintf(cmd, sizeof cmd, "%s perplexity -m %s --lora %s.none -f %s -c 16 >/dev/null 2>&1", bin, base, bad, bad);
        CHECK(run_cmd(cmd) == 66, "(d) perplexity with a missing adapter: exit %d, want 66", run_cmd(cmd));
        snprintf(cmd, sizeof cmd, "%s generate -m %s --lora %s:zz -p hi -n 2 >/dev/null 2>&1", bin, base, ad1p);
        CHECK(run_cmd(cmd) == 66, "(d) FILE:zz is a path (not found): exit %d", run_cmd(cmd));
        snprintf(cmd, sizeof cmd, "%s generate -m %s --lora-scaled %s x -p hi -n 2 >/dev/null 2>&1", bin, base, ad1p);
        CHECK(run_cmd(cmd) == 64, "(d) --lora-scaled with a bad scale: exit %d, want 64", run_cmd(cmd));
        printf("  (d) CLI exit codes 65 / 66 / 64\n");
    } else {
        printf("  (c) SKIP: $TERN_BIN not set (tern export-lora not run)\n");
    }

    /* (d) bad adapters */
    static const struct {
        enum fault f;
        tern_status want;
        const char *needle;
    } bads[] = {
        {F_ARCH, TERN_ERR_FORMAT, "general.architecture is 'qwen2'"},
        {F_SHAPE, TERN_ERR_FORMAT, "has n_in"},
        {F_RANK, TERN_ERR_FORMAT, "rank mismatch"},
        {F_NO_B, TERN_ERR_FORMAT, "has no partner"},
        {F_NOT_ADAPTER, TERN_ERR_FORMAT, "general.type is 'model'"},
        {F_MISSING_BASE, TERN_ERR_FORMAT, "which the base model does not have"},
        {F_EMBD, TERN_ERR_UNSUPPORTED, "token embeddings"},
    };
    for (size_t i = 0; i < sizeof bads / sizeof *bads; i++) {
        adapter_write(&ad[0], bad, arch, bads[i].f);
        expect_bad(base, bad, bads[i].want, bads[i].needle);
    }
    expect_bad(base, base, TERN_ERR_FORMAT, "general.type is missing"); /* a model file */
    tern_model_params mp; /* and an adapter given as the model */
    tern_model_params_init(&mp);
    tern_model *am = NULL;
    CHECK(tern_model_load(ad1p, &mp, &am) == TERN_ERR_FORMAT && !am, "an adapter loaded as a model");
    CHECK(strstr(tern_last_error(), "a LoRA adapter, not a model"), "message: %s", tern_last_error());
    adapter_free(&ad[0]), adapter_free(&ad[1]);
    for (size_t i = 0; i < sizeof rm / sizeof *rm; i++) remove(rm[i]);
}

/* --make DIR [ARCH]: writes DIR/base.gguf (tiny, f32; llama by default) and DIR/adapter.gguf
 * (rank 8, alpha 16) for the peer comparison (lora_peer.sh) and exits. */
static int make_files(const char *dir, const char *arch) {
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.arch = arch;
    if (!strcmp(arch, "qwen3")) cfg.head_dim = 128;
    if (!strcmp(arch, "gemma3")) cfg.n_layer = 7, cfg.head_dim = 128, cfg.n_swa = 4, cfg.rope_base = 1e6f;
    char base[512], adp[512];
    snprintf(base, sizeof base, "%s/base.gguf", dir);
    snprintf(adp, sizeof adp, "%s/adapter.gguf", dir);
    CHECK(tiny_model_write(base, &cfg) == TERN_OK, "tiny model");
    tn_gguf *g;
    CHECK(!tn_gguf_open(base, true, &g), "open base");
    adapter ad;
    adapter_make(&ad, g, 8, 16.0f, 0.05f);
    tn_gguf_free(g);
    adapter_write(&ad, adp, arch, F_NONE);
    adapter_free(&ad);
    return 0;
}

int main(int argc, char **argv) {
    if ((argc == 3 || argc == 4) && !strcmp(argv[1], "--make")) return make_files(argv[2], argc == 4 ? argv[3] : "llama");
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.n_embd = 128, cfg.n_ff = 256;
    test_arch(cfg, "llama", true);
    cfg.arch = "phi3"; /* fused attn_qkv and gate|up ffn_up: B's rows split per slice */
    test_arch(cfg, "phi3", true);
    tiny_cfg_default(&cfg);
    cfg.arch = "qwen3", cfg.head_dim = 128; /* q rows n_head * head_dim = 512 over n_embd 256 */
    test_arch(cfg, "qwen3", true);
    tiny_cfg_default(&cfg); /* gemma3: post norms (the adapter's term before them), GeGLU, window 4 */
    cfg.arch = "gemma3", cfg.n_layer = 7, cfg.head_dim = 128, cfg.n_swa = 4, cfg.rope_base = 1e6f;
    test_arch(cfg, "gemma3", true);
    tiny_cfg_default(&cfg); /* quantized, repacked bases: the adapter path leaves them untouched at scale 0 */
    cfg.wtype = TN_Q8_0;
    test_arch(cfg, "llama-q8_0", false);
    cfg.wtype = TN_Q4_0, cfg.arch = "qwen3";
    test_arch(cfg, "qwen3-q4_0", false);
    printf("test_lora: all passed\n");
    return 0;
}
