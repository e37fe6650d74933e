/*
 * cpu.c — CPUID/XGETBV feature detection. AVX2 requires OS support for YMM state, AVX-512 for
 * ZMM/opmask state; both checked through XGETBV. The ISA level is computed once.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
static unsigned long long tn_xgetbv(unsigned idx) {
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(idx));
    return ((unsigned long long)edx << 32) | eax;
}
#endif

static tn_cpu tn_cpu_info;
static tn_isa tn_cpu_level;
static pthread_once_t tn_cpu_once = PTHREAD_ONCE_INIT;

static void tn_cpu_detect(void) {
    tn_cpu *c = &tn_cpu_info;
    memset(c, 0, sizeof *c);
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, cx, d;
    if (__get_cpuid(1, &a, &b, &cx, &d)) {
        c->sse3 = cx & (1u << 0);
        c->ssse3 = cx & (1u << 9);
        c->fma = cx & (1u << 12);
        c->f16c = cx & (1u << 29);
        bool osxsave = cx & (1u << 27);
        bool avx_hw = cx & (1u << 28);
        unsigned long long xcr0 = osxsave ? tn_xgetbv(0) : 0;
        bool ymm_os = (xcr0 & 0x6) == 0x6;
        bool zmm_os = (xcr0 & 0xe6) == 0xe6;
        c->avx = avx_hw && ymm_os;
        if (!c->avx) c->fma = c->f16c = false;
        if (__get_cpuid_count(7, 0, &a, &b, &cx, &d)) {
            c->avx2 = c->avx && (b & (1u << 5));
            c->bmi2 = b & (1u << 8);
            if (zmm_os) {
                c->avx512f = b & (1u << 16);
                c->avx512dq = b & (1u << 17);
                c->avx512bw = b & (1u << 30);
                c->avx512vl = b & (1u << 31);
                c->avx512vbmi = cx & (1u << 1);
                c->avx512vnni = cx & (1u << 11);
            }
            unsigned a1, b1, c1, d1;
            if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) {
                c->avxvnni = c->avx && (a1 & (1u << 4));
                c->avx512bf16 = zmm_os && (a1 & (1u << 5));
            }
        }
    }
    unsigned regs[12];
    if (__get_cpuid(0x80000000, &a, &b, &cx, &d) && a >= 0x80000004) {
        for (unsigned i = 0; i < 3; i++) __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
        memcpy(c->brand, regs, 48);
        c->brand[48] = 0;
    }
#endif
    tn_isa lvl = TN_ISA_SCALAR;
    if (c->avx2 && c->fma && c->f16c) lvl = TN_ISA_AVX2;
    if (lvl == TN_ISA_AVX2 && c->avx512f && c->avx512bw && c->avx512vl && c->avx512dq) lvl = TN_ISA_AVX512;
    const char *cap = getenv("TERN_ISA");
    if (cap && *cap) {
        tn_isa want = lvl;
        if (!strcasecmp(cap, "scalar")) want = TN_ISA_SCALAR;
        else if (!strcasecmp(cap, "avx2")) want = TN_ISA_AVX2;
        else if (!strcasecmp(cap, "avx512")) want = TN_ISA_AVX512;
        if (want < lvl) lvl = want;
    }
    tn_cpu_level = lvl;
}

const tn_cpu *tn_cpu_get(void) {
    pthread_once(&tn_cpu_once, tn_cpu_detect);
    return &tn_cpu_info;
}

tn_isa tn_cpu_isa(void) {
    pthread_once(&tn_cpu_once, tn_cpu_detect);
    return tn_cpu_level;
}

const char *tn_isa_name(tn_isa isa) {
    switch (isa) {
    case TN_ISA_SCALAR: return "scalar";
    case TN_ISA_AVX2: return "avx2";
    case TN_ISA_AVX512: return "avx512";
    default: return "?";
    }
}

int tn_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
