/*
 * metrics.c — server counters and latency histograms, rendered as Prometheus text (tern_* names
 * mirroring vLLM's semantics; ecosystem.md §1.6). Written by hand: a few printf lines.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "model/pcache.h"
#include "serve/serve.h"

static const double tn_bounds[TN_HIST_N] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                            0.25,  0.5,    1,     2.5,  5,     10,  30};

void tn_metrics_init(tn_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void tn_hist_add(tn_hist *h, double v) {
    h->sum += v;
    h->count++;
    for (int i = 0; i < TN_HIST_N; i++)
        if (v <= tn_bounds[i]) h->b[i]++;
}

static const int32_t tn_spec_len_bounds[TN_SPEC_LEN_N] = {0, 1, 2, 4, 8, 16, 32};

void tn_metrics_spec_len(tn_metrics *m, int32_t k) {
    m->spec_len_sum += (uint64_t)k;
    m->spec_len[TN_SPEC_LEN_N]++;
    for (int i = 0; i < TN_SPEC_LEN_N; i++)
        if (k <= tn_spec_len_bounds[i]) m->spec_len[i]++;
}

static void hist(tn_buf *b, const char *name, const char *help, const tn_hist *h) {
    tn_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < TN_HIST_N; i++) tn_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, tn_bounds[i], (unsigned long long)h->b[i]);
    tn_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->count, name, h->sum,
         name, (unsigned long long)h->count);
}

#define CTR(name, help, v) tn_buf_printf(&b, "# HELP " name " " help "\n# TYPE " name " counter\n" name " %llu\n", (unsigned long long)(v))
#define GAUGE(name, help, fmt, v) tn_buf_printf(&b, "# HELP " name " " help "\n# TYPE " name " gauge\n" name " " fmt "\n", v)

char *tn_metrics_render(tn_metrics *m, const char *model_id, const double cost[3], const tn_pcache_stats *pc) {
    tn_buf b = {0};
    pthread_mutex_lock(&m->mu);
    tn_buf_printf(&b, "# HELP tern_build_info Build information.\n# TYPE tern_build_info gauge\ntern_build_info{version=\"%s\",model=\"%s\"} 1\n",
         tern_version_string(), model_id);
    GAUGE("tern_requests_running", "Requests being decoded.", "%d", m->running);
    GAUGE("tern_requests_waiting", "Requests in the bounded queue.", "%d", m->waiting);
    tn_buf_printf(&b, "# HELP tern_requests_rejected_total Requests refused before running.\n# TYPE tern_requests_rejected_total counter\n"
             "tern_requests_rejected_total{reason=\"queue_full\"} %llu\ntern_requests_rejected_total{reason=\"slo\"} %llu\n"
             "tern_requests_rejected_total{reason=\"deadline\"} %llu\n"
             "tern_requests_rejected_total{reason=\"draining\"} %llu\ntern_requests_rejected_total{reason=\"invalid\"} %llu\n",
         (unsigned long long)m->rejected_queue, (unsigned long long)m->rejected_slo, (unsigned long long)m->rejected_deadline,
         (unsigned long long)m->rejected_draining, (unsigned long long)m->rejected_invalid);
    CTR("tern_requests_cancelled_total", "Requests cancelled by client disconnect or shutdown.", m->cancelled);
    CTR("tern_requests_failed_total", "Admitted requests that ended in a server error (e.g. out of memory).", m->finished_error);
    tn_buf_printf(&b, "# HELP tern_request_success_total Finished requests.\n# TYPE tern_request_success_total counter\n"
             "tern_request_success_total{finished_reason=\"stop\"} %llu\ntern_request_success_total{finished_reason=\"length\"} %llu\n",
         (unsigned long long)m->finished_stop, (unsigned long long)m->finished_length);
    CTR("tern_prompt_tokens_total", "Prompt tokens processed (including cached).", m->prompt_tokens);
    CTR("tern_prompt_tokens_cached_total", "Prompt tokens served from the prefix cache.", m->cached_tokens);
    CTR("tern_generation_tokens_total", "Generated tokens.", m->gen_tokens);
    CTR("tern_engine_steps_total", "Batched forward passes.", m->steps);
    CTR("tern_iteration_tokens_total", "Tokens over all forward passes.", m->batch_tokens);
    CTR("tern_slo_requests_total", "Finished requests checked against the SLOs.", m->slo_total);
    CTR("tern_slo_met_total", "Finished requests meeting both TTFT and TPOT objectives (goodput).", m->slo_met);
    GAUGE("tern_kv_cache_usage_ratio", "Fraction of KV blocks in use.", "%.6f", m->kv_usage);
    GAUGE("tern_kv_cache_blocks", "KV blocks reserved at start.", "%d", m->kv_blocks);
    GAUGE("tern_kv_blocks_used", "KV blocks held by running sequences (0 when idle).", "%d", m->kv_used);
    GAUGE("tern_kv_blocks_reserved", "KV blocks promised to admitted sequences, not yet taken (0 when idle).", "%d",
          m->kv_reserved);
    if (m->kv_swa_blocks) {
        GAUGE("tern_kv_swa_cache_blocks", "Window blocks of the sliding-window layers (their own pool).", "%d", m->kv_swa_blocks);
        GAUGE("tern_kv_swa_blocks_used", "Window blocks held by running sequences (0 when idle).", "%d", m->kv_swa_used);
    }
    GAUGE("tern_cost_step_base_seconds", "Cost model: fixed time per engine step.", "%.6g", cost[0]);
    GAUGE("tern_cost_decode_seconds", "Cost model: time per decoded sequence in a step.", "%.6g", cost[1]);
    GAUGE("tern_cost_prefill_token_seconds", "Cost model: time per prefill token in a step.", "%.6g", cost[2]);
    GAUGE("tern_step_load_factor", "Engine step time measured / predicted (exponentially weighted mean).", "%.4f", m->load_mean);
    GAUGE("tern_step_load_factor_sd", "Its exponentially weighted standard deviation (the planning margin).", "%.4f", m->load_sd);
    hist(&b, "tern_time_to_first_token_seconds", "Time to first token.", &m->ttft);
    hist(&b, "tern_inter_token_latency_seconds", "Time between output tokens.", &m->itl);
    hist(&b, "tern_e2e_request_latency_seconds", "End-to-end request latency.", &m->e2e);
    hist(&b, "tern_request_queue_time_seconds", "Time waiting in the queue.", &m->queue);
    if (m->spec) {
        CTR("tern_spec_drafted_total", "Draft tokens verified by speculative decoding.", m->spec_drafted);
        CTR("tern_spec_accepted_total", "Draft tokens kept (equal to the token the sampler picked).", m->spec_accepted);
        GAUGE("tern_spec_acceptance_ratio", "Accepted / drafted tokens since start (0 before any draft).", "%.6f",
              m->spec_drafted ? (double)m->spec_accepted / (double)m->spec_drafted : 0.0);
        const char *n = "tern_spec_length";
        tn_buf_printf(&b, "# HELP %s Speculation length chosen per decoding sequence and step (0: none).\n# TYPE %s histogram\n", n, n);
        for (int i = 0; i < TN_SPEC_LEN_N; i++)
            tn_buf_printf(&b, "%s_bucket{le=\"%d\"} %llu\n", n, tn_spec_len_bounds[i], (unsigned long long)m->spec_len[i]);
        tn_buf_printf(&b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %llu\n%s_count %llu\n", n,
                      (unsigned long long)m->spec_len[TN_SPEC_LEN_N], n, (unsigned long long)m->spec_len_sum, n,
                      (unsigned long long)m->spec_len[TN_SPEC_LEN_N]);
    }
    if (pc) {
        CTR("tern_prompt_cache_blocks_loaded_total", "Prompt blocks (16 tokens) loaded from the disk cache.", pc->blocks_loaded);
        CTR("tern_prompt_cache_blocks_stored_total", "Prompt blocks written to the disk cache.", pc->blocks_stored);
        CTR("tern_prompt_cache_blocks_skipped_total", "Block files found bad (checksum, format, model) and recomputed.",
            pc->blocks_skipped);
        CTR("tern_prompt_cache_blocks_dropped_total", "Blocks not stored: the writer's queue was full.", pc->blocks_dropped);
        CTR("tern_prompt_cache_blocks_evicted_total", "Block files deleted by --prompt-cache-max-gb.", pc->blocks_evicted);
        CTR("tern_prompt_cache_bytes_loaded_total", "Bytes of block files loaded.", pc->bytes_loaded);
        CTR("tern_prompt_cache_bytes_stored_total", "Bytes of block files written.", pc->bytes_stored);
        GAUGE("tern_prompt_cache_store_off", "1 once a full disk stopped storing (serving goes on).", "%d", pc->store_off ? 1 : 0);
        CTR("tern_prompt_cache_loads_declined_total", "Prompts whose first disk block loaded slower than prefill: the rest recomputed.",
            m->pc_declined);
    }
    pthread_mutex_unlock(&m->mu);
    return tn_buf_take(&b, NULL);
}
