/*
 * quant_act.c — activation quantizers for q8_0 and q8_1 as ggml computes them on x86 CPUs
 * (ggml-cpu arch/x86 quantize_row_q8_0/q8_1, used for the activations of every q4_0/q5_0/q8_0
 * and q4_1/q5_1 product in llama.cpp there): the multiplier is 127/amax (not 1/(amax/127) as in
 * the weight quantizer quantize_row_q8_0_ref) and products round half to even (not roundf).
 * Both differences move a quant by one step now and then; matching them keeps tern's logits
 * next to llama.cpp's (perplexity to the third decimal). Weights keep the reference quantizers.
 */
#include <math.h>

#include "quant/quant.h"

static float tn_act_block(const float *x, int8_t *qs, int *sum) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int s = 0;
    for (int j = 0; j < 32; j++) {
        const int q = (int)nearbyintf(x[j] * id); /* default rounding mode: half to even */
        qs[j] = (int8_t)q;
        s += q;
    }
    *sum = s;
    return d;
}

void tn_quantize_row_q8_0_act(const float *x, block_q8_0 *y, int64_t k) {
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        int sum;
        y[i].d = tn_fp32_to_fp16(tn_act_block(x, y[i].qs, &sum));
    }
}

void tn_quantize_row_q8_1_act(const float *x, block_q8_1 *y, int64_t k) {
    for (int64_t i = 0; i < k / QK8_1; i++, x += QK8_1) {
        int sum;
        const float d = tn_act_block(x, y[i].qs, &sum);
        y[i].d = tn_fp32_to_fp16(d);
        y[i].s = tn_fp32_to_fp16(d * (float)sum);
    }
}
