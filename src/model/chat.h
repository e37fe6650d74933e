/*
 * chat.h — chat template detection without a loaded model (the tests' and tern_chat_template_detect's
 * entry). Rendering is the public tern_chat_apply (tern.h); the templates are written out in chat.c.
 */
#ifndef TN_MODEL_CHAT_H
#define TN_MODEL_CHAT_H

#include "model/tokenizer.h"
#include "tern/tern.h"

/* Picks a template from, in order: the markers of the Jinja text jinja[0..len) (NULL: none), the
 * special tokens of v (NULL: none), the architecture name arch (NULL: none); chatml otherwise. */
tern_chat_template tn_chat_detect(const char *jinja, size_t len, const tn_vocab *v, const char *arch);

/* The ids of the end-of-turn strings of t that are tokens of v (exact text), at most cap; returns
 * how many. */
int32_t tn_chat_stop_tokens(const tn_vocab *v, tern_chat_template t, int32_t *out, int32_t cap);

/* Streaming end-of-turn text: text[0..*len) is an answer so far, text[0..shown) already printed.
 * If an end string of `stops` (NULL-terminated) begins at or after `shown`, cuts *len to where it
 * begins and returns true. Else returns false and sets *upto to how far the text can be printed
 * now: up to the start of a tail that could still become an end string, and never inside a UTF-8
 * sequence. */
bool tn_chat_stop_scan(const char *const *stops, const char *text, size_t *len, size_t shown, size_t *upto);

/* tern_chat_apply into a tn_malloc'd string (*len: its length); NULL when out of memory or when
 * tern_chat_apply refuses the arguments (tern_last_error() says which). */
char *tn_chat_render(tern_chat_template t, const tern_chat_msg *msgs, size_t n, bool add_assistant, size_t *len);

#endif
