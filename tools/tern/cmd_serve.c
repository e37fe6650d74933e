/*
 * cmd_serve.c — `tern serve`: flag parsing only; the server lives in src/serve (tn_serve_run).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "cli_pcache.h"
#include "serve/serve.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: tern serve -m model.gguf [options]\n"
            "  -m, --model FILE        GGUF model (default: tern's built-in default model)\n"
            "      --host ADDR         IPv4 address to bind (default 127.0.0.1)\n"
            "      --port N            port (default 8080; 0 = any free port, printed on stderr)\n"
            "  -np, --parallel N       sequences decoded together in one batch (default 4, max 64)\n"
            "  -c, --ctx-size N        KV cache tokens for all sequences (default np x min(model ctx, 4096))\n"
            "  -b, --batch-size N      most tokens per forward pass (default 512)\n"
            "  -t, --threads N         threads (default: number of CPUs)\n"
            "      --api-key KEY       require 'Authorization: Bearer KEY' (or X-Api-Key) on all but /health\n"
            "                          (also read from $TERN_API_KEY)\n"
            "      --alias NAME        model id in the API (default: file name without .gguf)\n"
            "      --metrics           expose Prometheus metrics on /metrics\n"
            "      --max-queue N       waiting requests beyond the running ones (default 64); more get 429\n"
            "      --ttft-slo MS       time-to-first-token objective: refuse (429) what cannot meet it\n"
            "      --tpot-slo MS       time-per-output-token objective: prefill chunks sized to keep it\n"
            "      --drain-timeout S   on SIGTERM, wait this long for in-flight requests (default 30)\n"
            "      --timeout S         idle connection / slow client timeout (default 30)\n"
            "      --max-body BYTES    largest request body (default 4194304); larger gets 413\n"
            "      --device cpu|cuda   run the model on the CPU (default) or an NVIDIA GPU; -ngl N: layers on the GPU\n"
            "      --chat-template NAME chat template of /v1/chat/completions (default: the model's):\n"
            "                          chatml, llama2, llama3, qwen3, gemma, phi3, phi4, gpt-oss\n"
            "      --spec ngram        speculative decoding: each step verifies n-gram drafts of every sequence's\n"
            "                          prompt + output (prompt lookup); the same output, faster when it copies\n"
            "      --draft-max N       at most N drafts per sequence and step (default 8, 1..32); the length is\n"
            "                          chosen per step from the cost model and each sequence's acceptance rate\n"
            "      --draft-min N       fewer drafts are not tried (default 1)\n"
            "      --spec-ngram N      longest n-gram matched (default 3, 1..64)\n"
            "      --spec-fixed K      always verify K drafts where found (no cost model; for comparison)\n"
            "      --lora FILE[:S]     apply a LoRA adapter (llama.cpp GGUF) with scale S (default 1) to every request;\n"
            "                          repeatable; --lora-scaled FILE S does the same (CPU only)\n"
            "  -md, --draft FILE       speculative decoding with a small draft model of the same vocabulary: it\n"
            "                          drafts greedily, batched over the sequences (--draft-max default 4)\n"
            "      --draft-p-min P     the draft model stops drafting before a token it gives less than P (default 0)\n"
            "      --no-repack         keep q4_0/q8_0/q4_K/q5_K/q6_K/tq4/tq1 weights in the file layout (no interleaved copy)\n"
            TN_CLI_HOT_EXPERTS_HELP
            "      --slot-save-path DIR  POST /slots/{id}?action=save|restore|erase (llama-server's API) with\n"
            "                          files in DIR (created if missing); GET /slots lists the slots\n"
            "      --swa-full          sliding-window layers (Gemma 2/3) keep every position in the paged cache\n"
            "                          (default: each sequence's window, in a block pool of their own)\n"
            TN_CLI_CACHE_TYPE_HELP);
    tn_cli_pcache_usage(f);
}

int cmd_serve(int argc, char **argv) {
    tn_serve_config cfg;
    tn_serve_config_init(&cfg);
    const char *env_key = getenv("TERN_API_KEY");
    if (env_key && *env_key) cfg.api_key = env_key;
    int64_t v;
    float f;
    int dv;
    int32_t spec_fixed = 0;
    bool draft_max_set = false, draft_min_set = false;
    tn_cli_lora lora = {0};
    tn_cli_pcache pcf; /* --prompt-cache flags (the engine opens the cache) */
    tn_cli_pcache_init(&pcf);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define INT_FLAG(lo, hi, dst)                                                                                   \
    do {                                                                                                        \
        TN_CLI_NEED_VAL();                                                                                      \
        if (!tn_cli_parse_i64(val, lo, hi, &v)) return tn_cli_usage_error("%s: '%s' is not a number in %lld..%lld", a, val, \
                                                                          (long long)(lo), (long long)(hi));   \
        dst = v;                                                                                                \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            TN_CLI_NEED_VAL();
            cfg.model_path = val;
        } else if (!strcmp(a, "--no-repack")) {
            cfg.no_repack = true;
        } else if (!strcmp(a, "--hot-experts")) {
            if (tn_cli_hot_experts_flag(argc, argv, &i, &cfg.hot_experts) < 0) return TN_EXIT_USAGE;
        } else if (!strcmp(a, "--swa-full")) {
            cfg.swa_full = true;
        } else if (!strcmp(a, "--chat-template")) {
            TN_CLI_NEED_VAL();
            tern_chat_template t;
            if (!tn_cli_chat_template(val, &t)) return TN_EXIT_USAGE;
            cfg.chat_template = (int)t;
        } else if (!strcmp(a, "--host")) {
            TN_CLI_NEED_VAL();
            cfg.host = val;
        } else if (!strcmp(a, "--port")) {
            INT_FLAG(0, 65535, cfg.port);
        } else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) {
            INT_FLAG(1, 64, cfg.n_parallel);
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            INT_FLAG(0, 1 << 22, cfg.n_ctx);
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            INT_FLAG(1, 65536, cfg.n_batch);
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            INT_FLAG(1, 1024, cfg.n_threads);
        } else if (!strcmp(a, "--api-key")) {
            TN_CLI_NEED_VAL();
            cfg.api_key = val;
        } else if (!strcmp(a, "--alias")) {
            TN_CLI_NEED_VAL();
            cfg.alias = val;
        } else if (!strcmp(a, "--metrics")) {
            cfg.metrics = true;
        } else if (!strcmp(a, "--max-queue")) {
            INT_FLAG(0, 1 << 20, cfg.max_queue);
        } else if (!strcmp(a, "--ttft-slo")) {
            TN_CLI_NEED_VAL();
            if (!tn_cli_parse_f32(val, 0.0f, 3.6e6f, &f)) return tn_cli_usage_error("--ttft-slo: '%s' is not milliseconds", val);
            cfg.ttft_slo_ms = f;
        } else if (!strcmp(a, "--tpot-slo")) {
            TN_CLI_NEED_VAL();
            if (!tn_cli_parse_f32(val, 0.0f, 3.6e6f, &f)) return tn_cli_usage_error("--tpot-slo: '%s' is not milliseconds", val);
            cfg.tpot_slo_ms = f;
        } else if (!strcmp(a, "--drain-timeout")) {
            TN_CLI_NEED_VAL();
            if (!tn_cli_parse_f32(val, 0.0f, 86400.0f, &f)) return tn_cli_usage_error("--drain-timeout: '%s' is not seconds", val);
            cfg.drain_timeout_s = f;
        } else if (!strcmp(a, "--timeout")) {
            INT_FLAG(1, 86400, cfg.conn_timeout_s);
        } else if (!strcmp(a, "--debug-step-delay")) { /* testing: slow every engine step down */
            TN_CLI_NEED_VAL();
            if (!tn_cli_parse_f32(val, 0.0f, 10000.0f, &f)) return tn_cli_usage_error("--debug-step-delay: '%s' is not milliseconds", val);
            cfg.step_delay_ms = f;
        } else if (!strcmp(a, "--debug-fail-alloc")) { /* testing: X-Tern-Fail-Alloc: N fails an allocation */
            cfg.debug_fail_alloc = true;
        } else if (!strcmp(a, "--spec")) {
            TN_CLI_NEED_VAL();
            if (!strcmp(val, "ngram")) cfg.spec_ngram = true;
            else if (strcmp(val, "none")) return tn_cli_usage_error("--spec: '%s' is not ngram or none", val);
        } else if (!strcmp(a, "--draft-max")) {
            INT_FLAG(1, 32, cfg.draft_max);
            draft_max_set = true;
        } else if (!strcmp(a, "--draft-min")) {
            INT_FLAG(0, 32, cfg.draft_min);
            draft_min_set = true;
        } else if (!strcmp(a, "--draft") || !strcmp(a, "-md") || !strcmp(a, "--model-draft")) {
            TN_CLI_NEED_VAL();
            cfg.draft_path = val;
        } else if (!strcmp(a, "--draft-p-min")) {
            TN_CLI_NEED_VAL();
            if (!tn_cli_parse_f32(val, 0.0f, 1.0f, &cfg.draft_p_min))
                return tn_cli_usage_error("--draft-p-min: '%s' is not a probability in 0..1", val);
        } else if (!strcmp(a, "--spec-ngram")) {
            INT_FLAG(1, 64, cfg.spec_ngram_n);
        } else if (!strcmp(a, "--spec-fixed")) {
            INT_FLAG(1, 32, spec_fixed);
        } else if (!strcmp(a, "--slot-save-path")) {
            TN_CLI_NEED_VAL();
            cfg.slot_save_path = val;
        } else if (!strcmp(a, "--max-body")) {
            INT_FLAG(1024, (int64_t)1 << 30, cfg.max_body);
        } else if ((dv = tn_cli_device_flag(argc, argv, &i, &cfg.device, &cfg.n_gpu_layers)) != 0 ||
                   (dv = tn_cli_lora_flag(argc, argv, &i, &lora)) != 0 ||
                   (dv = tn_cli_cache_type_flag(argc, argv, &i, &cfg.type_k, &cfg.type_v, &cfg.kv_rot)) != 0) {
            if (dv < 0) return TN_EXIT_USAGE;
        } else if ((dv = tn_cli_pcache_flag(argc, argv, &i, &pcf)) != 0) {
            if (dv < 0) return TN_EXIT_USAGE;
            cfg.prompt_cache_dir = pcf.dir;
            cfg.prompt_cache_max_bytes = (uint64_t)((double)pcf.max_gb * 1e9);
            cfg.prompt_cache_quality = (int)pcf.quality;
        } else {
            serve_usage(stderr);
            return tn_cli_usage_error("unknown option '%s'", a);
        }
#undef INT_FLAG
    }
    if (spec_fixed > 0) {
        if (draft_max_set && cfg.draft_max != spec_fixed)
            return tn_cli_usage_error("--spec-fixed %d contradicts --draft-max %d", spec_fixed, cfg.draft_max);
        cfg.draft_max = spec_fixed;
        cfg.spec_fixed = true;
    } else if (draft_min_set && cfg.draft_min == cfg.draft_max) {
        cfg.spec_fixed = true; /* --draft-max K --draft-min K: a fixed length */
    }
    if (cfg.draft_min > cfg.draft_max)
        return tn_cli_usage_error("--draft-min %d is more than --draft-max %d", cfg.draft_min, cfg.draft_max);
    if (cfg.spec_ngram && cfg.draft_path) return tn_cli_usage_error("--spec ngram and --draft: choose one drafter");
    if (cfg.draft_p_min > 0 && !cfg.draft_path) return tn_cli_usage_error("--draft-p-min needs --draft FILE");
    cfg.prompt_cache_prefill_tok_s = tn_cli_pcache_prefill_env();
    if (!cfg.spec_ngram && !cfg.draft_path && (spec_fixed > 0 || draft_max_set || draft_min_set))
        return tn_cli_usage_error("--draft-max / --draft-min / --spec-fixed need --spec ngram or --draft");
    if (cfg.draft_path && !draft_max_set && spec_fixed == 0) cfg.draft_max = 4; /* a model's drafts cost passes */
    if (cfg.slot_save_path) { /* a directory of its own: created here, one level */
        struct stat sb;
        if (!*cfg.slot_save_path) return tn_cli_usage_error("--slot-save-path: an empty path");
        if (stat(cfg.slot_save_path, &sb) && mkdir(cfg.slot_save_path, 0755))
            return tn_cli_usage_error("--slot-save-path: cannot create '%s': %s", cfg.slot_save_path, strerror(errno));
        if (stat(cfg.slot_save_path, &sb) || !S_ISDIR(sb.st_mode))
            return tn_cli_usage_error("--slot-save-path: '%s' is not a directory", cfg.slot_save_path);
    }
    char default_path[4096];
    if (!cfg.model_path) {
        if (!tn_cli_default_model(default_path, sizeof default_path)) {
            fprintf(stderr, "tern: error: no -m given and tern's default model was not found\n");
            return TN_EXIT_NOINPUT;
        }
        cfg.model_path = default_path;
    }
    cfg.n_lora = lora.n;
    cfg.lora_paths = (const char *const *)lora.path;
    cfg.lora_scales = lora.scale;
    if (cfg.prompt_cache_dir) tn_cli_pcache_log_on(); /* skipped files and a full disk: warnings in the log */
    const int rc = tn_serve_run(&cfg);
    tn_cli_lora_free(&lora);
    return rc;
}
