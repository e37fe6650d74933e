/*
 * bench_train.c — training throughput of tern's trainer on a fixed config with random tokens:
 * tokens/s of full steps (forward + backward + clip + AdamW) and peak RSS. Compared against
 * PyTorch eager (bench_torch.py) by run_bench.sh; not a test.
 * usage: bench_train n_embd n_layer n_head n_head_kv n_ff ctx vocab batch threads steps
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "train/rng.h"
#include "train/train.h"

int main(int argc, char **argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: %s n_embd n_layer n_head n_head_kv n_ff ctx vocab batch threads steps\n", argv[0]);
        return 64;
    }
    int a[10];
    for (int i = 0; i < 10; i++) a[i] = atoi(argv[i + 1]);
    tn_train_cfg c = {.n_vocab = a[6], .n_ctx = a[5], .n_embd = a[0], .n_layer = a[1], .n_head = a[2], .n_head_kv = a[3],
                      .n_ff = a[4], .rms_eps = 1e-5f, .rope_base = 10000.0f};
    const int B = a[7], T = a[5], threads = a[8], steps = a[9];
    tn_tmodel *m;
    if (tn_tmodel_create(&c, threads, &m) || tn_tmodel_plan(m, B, T)) {
        fprintf(stderr, "error: %s\n", tern_last_error());
        return 71;
    }
    tn_tmodel_init_random(m, 1);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * T), *tgt = malloc(sizeof(int32_t) * (size_t)B * T);
    uint64_t rng = 7;
    tn_adamw o;
    tn_adamw_default(&o);
    double t0 = 0, loss = 0;
    for (int s = 0; s <= steps; s++) {
        if (s == 1) t0 = tn_time_s(); /* step 0 is warmup (page faults, BLAS buffers) */
        for (int i = 0; i < B * T; i++) { tok[i] = (int32_t)tn_rng_below(&rng, (uint64_t)c.n_vocab); tgt[i] = (int32_t)tn_rng_below(&rng, (uint64_t)c.n_vocab); }
        tn_tmodel_forward(m, tok, tgt, &loss);
        tn_tmodel_zero_grad(m);
        tn_tmodel_backward(m);
        double gn = tn_grad_norm(m);
        tn_adamw_step(m, &o, 1e-4f, s + 1, gn > 1.0 ? (float)(1.0 / (gn + 1e-6)) : 1.0f);
    }
    double dt = tn_time_s() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("tern   params %.2fM  batch %dx%d  threads %d  %.1f tokens/s  %.3f s/step  peak RSS %.1f MiB  (loss %.3f)\n",
           m->n_params / 1e6, B, T, threads, (double)B * T * steps / dt, dt / steps, ru.ru_maxrss / 1024.0, loss);
    tn_tmodel_free(m);
    free(tok);
    free(tgt);
    return 0;
}
