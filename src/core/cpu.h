/*
 * cpu.h — x86 CPU feature detection (CPUID + XGETBV), done once. TERN_ISA=scalar|avx2|avx512
 * caps the level used by kernel dispatch (for debugging and golden tests).
 */
#ifndef TN_CORE_CPU_H
#define TN_CORE_CPU_H

#include <stdbool.h>

typedef enum tn_isa { TN_ISA_SCALAR = 0, TN_ISA_AVX2 = 1, TN_ISA_AVX512 = 2, TN_ISA_COUNT } tn_isa;

typedef struct tn_cpu {
    bool sse3, ssse3, avx, f16c, fma, avx2, bmi2;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16, avx512vbmi, avxvnni;
    char brand[64];
} tn_cpu;

const tn_cpu *tn_cpu_get(void);
/* Highest usable ISA level, after the TERN_ISA cap. */
tn_isa tn_cpu_isa(void);
const char *tn_isa_name(tn_isa isa);
/* Number of online CPUs (>= 1). */
int tn_cpu_count(void);

#endif
