/*
 * register.c (avx512) — fills the kernel-table entries implemented for avx512.
 */
#include "kern/kern.h"

void tn_kern_register_avx512(tn_kern_table *t) {
    (void)t;
}
