/*
 * register.c (avx2) — fills the kernel-table entries implemented for avx2.
 */
#include "kern/kern.h"

void tn_kern_register_avx2(tn_kern_table *t) {
    (void)t;
}
