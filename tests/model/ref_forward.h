/*
 * ref_forward.h — an independent, plain double-precision forward pass of every family for tests:
 * weights dequantized once to float, no activation quantization, no f16 KV cache, textbook
 * formulas (RoPE angles computed directly as pos * base^(-2i/n_rot)). It shares no code with
 * src/model/forward.c beyond reading the weights.
 */
#ifndef TN_TESTS_REF_FORWARD_H
#define TN_TESTS_REF_FORWARD_H

#include "model/model.h"

typedef struct ref_model ref_model;

ref_model *ref_create(const tern_model *m, int32_t n_ctx);
void ref_free(ref_model *r);
/* Runs one token at the next position; fills logits[n_vocab] and, if layers != NULL, the
 * residual stream after each layer (layers[il * n_embd ...], il < n_layer) and the final normed
 * vector at il = n_layer. */
void ref_step(ref_model *r, int32_t token, double *logits, double *layers);
/* Mixture of experts: the smallest gap seen so far between the k-th and the (k+1)-th largest
 * router probability of a token (INFINITY in a dense model). A gap within the forward's rounding
 * lets tern and the reference route differently, both correctly. */
double ref_min_route_gap(const ref_model *r);
/* A quantized KV cache's rounding (llama.cpp's flash attention over such a cache): each head of K
 * (type_k) and V (type_v) rounded through a q8_0 / q4_0 row before it is stored, and with a quantized
 * K each head of q through the q8_0 activation quantizer. f16 / 0: no rounding (the default). */
void ref_set_kv_types(ref_model *r, int32_t type_k, int32_t type_v);
/* Rotated cache halves (tern_ctx_params kv_rotate): with rot_k each head's q and k, with rot_v
 * each head's v are multiplied by R D before the rounding (D = diag(signs), R = the normalized
 * Sylvester-Hadamard matrix in blocks of the largest power of 2 dividing head_dim, written out
 * as a matrix here), and with rot_v each head's attention output by D R^T after it. signs: head_dim
 * values, copied (NULL: no rotation). */
void ref_set_kv_rot(ref_model *r, bool rot_k, bool rot_v, const float *signs);

#endif
