/*
 * gguf_impl.h — limits and helpers shared by the GGUF reader and writer (private to src/fmt).
 *
 * The writer enforces the same limits the reader does, so tern never writes a file it would
 * refuse to read.
 */
#ifndef TN_FMT_GGUF_IMPL_H
#define TN_FMT_GGUF_IMPL_H

#include "fmt/gguf.h"

#define TN_GGUF__MAX_KEY 65535                      /* key bytes                              */
#define TN_GGUF__MAX_STRING ((uint64_t)1 << 30)     /* string value bytes (1 GiB)             */
#define TN_GGUF__MAX_ARRAY ((uint64_t)1 << 30)      /* array elements, also tensors and kvs   */
#define TN_GGUF__MAX_ALIGNMENT (1u << 24)           /* general.alignment upper bound (16 MiB) */

/* Bytes of one element of a fixed-size value type; 0 for string, array and invalid types. */
size_t tn_gguf__type_size(uint32_t t);
/* Key is 1..65535 bytes of printable ASCII without spaces. */
bool tn_gguf__key_ok(const char *s, uint64_t n);

#endif
