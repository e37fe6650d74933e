/*
 * emu.cpp — the CUDA emulator's runtime (tn_cuda_emu.h): memory, streams, events, cuBLAS's
 * GemmEx, and kernel launches run as blocks of cooperative fibers on the calling thread.
 *
 * A block's threads are ucontext fibers on stacks of their own. The scheduler resumes every
 * runnable thread until it blocks at a barrier (or returns); then it releases each warp whose live
 * threads all wait at a warp barrier (__syncwarp, a shuffle), and only when none does, the block if
 * all its live threads wait at __syncthreads. Anything else — a warp split between barriers, a
 * block whose threads wait at different kinds — is a deadlock on a GPU too, and aborts with the
 * block and thread named. Fibers switch with _setjmp/_longjmp after their first entry (no signal
 * mask system call per switch), and live as long as the emulator: a fiber that finishes the kernel
 * body parks at the top of its loop, and the next block (of any launch) that has a thread of its
 * index resumes it there — a fiber is created once, not per block.
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>

#include <vector>

#include "tn_cuda_emu.h"

namespace {

enum { RUN = 0, WAIT_BLOCK, WAIT_WARP, DONE, WAIT_GRID };
const size_t STACK = 256 << 10;

struct Fiber {
    jmp_buf jb;
    ucontext_t uc;
    int state;
    bool started;
    tn_emu_dim tid;
    uint64_t slot; /* shuffle: the value this lane offers */
    uint32_t frag[2][6]; /* tensor-core products: this lane's a (4 words) and b (2), by the products' parity */
    unsigned n_mma;       /* tensor-core products this thread has taken part in */
};

struct Emu {
    std::vector<Fiber> f;
    std::vector<char *> stacks;
    std::vector<size_t> order; /* the launch's blocks in the order they run */
    jmp_buf sched;
    ucontext_t sched_uc;
    int cur = -1, n = 0, base = 0; /* the running block's threads: fibers base .. base + n - 1 */
    tn_emu_dim grid{1, 1, 1}, block{1, 1, 1}, bidx{0, 0, 0};
    void (*body)(void *) = nullptr;
    void *arg = nullptr;
    long launches = 0, blocks = 0, switches = 0;
    cudaError_t last = cudaSuccess;
};
thread_local Emu E;


/* back to the scheduler from the current fiber */
void yield_to_sched() {
    Fiber &me = E.f[(size_t)E.cur];
    E.switches++;
    if (!_setjmp(me.jb)) _longjmp(E.sched, 1);
}

void trampoline() {
    Fiber &me = E.f[(size_t)E.cur];
    /* first entry came through swapcontext; from here on switch with setjmp/longjmp */
    if (!_setjmp(me.jb)) {
        me.started = true;
        setcontext(&E.sched_uc); /* back to the scheduler's swapcontext, which returns */
    }
    for (;;) { /* a block's thread, then parked until a later block resumes it (E.f may have moved: index it anew) */
        E.body(E.arg);
        Fiber &t = E.f[(size_t)E.cur];
        t.state = DONE;
        if (!_setjmp(t.jb)) _longjmp(E.sched, 1);
    }
}

[[noreturn]] void deadlock(const char *what) {
    fprintf(stderr, "tern CUDA emulator: %s in block (%u,%u,%u) of a launch of %ux%ux%u blocks x %ux%ux%u threads; states:", what,
            E.bidx.x, E.bidx.y, E.bidx.z, E.grid.x, E.grid.y, E.grid.z, E.block.x, E.block.y, E.block.z);
    for (int i = 0; i < E.n; i++) fprintf(stderr, "%s%d", i % 32 ? "" : " | ", E.f[(size_t)(E.base + i)].state);
    fprintf(stderr, "\n");
    abort();
}

/* into a started thread; back here when it blocks or returns */
__attribute__((noinline)) void jump_into(jmp_buf *jb) {
    if (!_setjmp(E.sched)) _longjmp(*jb, 1);
}

/* runs thread i until it blocks or returns (a frame of its own: nothing of the caller's lives
 * across the setjmp) */
__attribute__((noinline)) void resume(int i) {
    Fiber &t = E.f[(size_t)i];
    E.cur = i;
    E.switches++;
    threadIdx = dim3(t.tid);
    if (!t.started) swapcontext(&E.sched_uc, &t.uc); /* runs to the trampoline's setjmp, comes back */
    jump_into(&t.jb);
}

/* fiber i, ready to start at the trampoline on its own stack (a frame of its own: getcontext
 * counts as returning twice) */
__attribute__((noinline)) void init_fiber(int i) {
    Fiber &t = E.f[(size_t)i];
    t.started = false;
    getcontext(&t.uc);
    t.uc.uc_stack.ss_sp = E.stacks[(size_t)i];
    t.uc.uc_stack.ss_size = STACK;
    t.uc.uc_link = nullptr;
    makecontext(&t.uc, trampoline, 0);
}

/* the block's threads, ready to run from the kernel's start: fibers base .. base + n - 1, created
 * at their first block */
void init_block(int base) {
    for (int i = 0; i < E.n; i++) {
        Fiber &t = E.f[(size_t)(base + i)];
        if (!t.started) init_fiber(base + i);
        t.state = RUN;
        t.n_mma = 0;
        t.tid = tn_emu_dim{(unsigned)i % E.block.x, ((unsigned)i / E.block.x) % E.block.y, (unsigned)i / (E.block.x * E.block.y)};
    }
}

/* Runs the block whose threads are fibers base .. base + n - 1 until every thread has returned, or
 * (a cooperative launch) every live thread waits at the grid barrier. */
void run_block(int base) {
    const int n = E.n;
    E.base = base;
    const int nw = (n + 31) / 32;
    for (;;) {
        for (int i = base; i < base + n; i++)
            if (E.f[(size_t)i].state == RUN) resume(i);
        E.cur = -1;
        int live = 0, wblock = 0, wgrid = 0;
        bool released = false;
        for (int w = 0; w < nw; w++) {
            int wl = 0, ww = 0;
            for (int i = base + w * 32; i < base + n && i < base + w * 32 + 32; i++) {
                const int s = E.f[(size_t)i].state;
                if (s == DONE) continue;
                wl++, live++;
                if (s == WAIT_WARP) ww++;
                if (s == WAIT_BLOCK) wblock++;
                if (s == WAIT_GRID) wgrid++;
            }
            if (wl > 0 && ww == wl) {
                for (int i = base + w * 32; i < base + n && i < base + w * 32 + 32; i++)
                    if (E.f[(size_t)i].state == WAIT_WARP) E.f[(size_t)i].state = RUN;
                released = true;
            }
        }
        if (live == 0 || (wgrid > 0 && wgrid == live)) return;
        if (released) continue;
        if (wblock == live) {
            for (int i = base; i < base + n; i++)
                if (E.f[(size_t)i].state == WAIT_BLOCK) E.f[(size_t)i].state = RUN;
            continue;
        }
        deadlock("threads wait at different barriers (a warp split between __syncwarp/shuffles and __syncthreads, or a grid barrier)");
    }
}

Fiber &self() {
    if (E.cur < 0) {
        fprintf(stderr, "tern CUDA emulator: device code called outside a kernel\n");
        abort();
    }
    return E.f[(size_t)E.cur];
}

struct tn_emu_event_t {
    double t;
};

double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

} // namespace

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

extern "C" {

namespace {
/* fibers and stacks for nf threads; the launch's sizes */
cudaError_t launch_setup(tn_emu_dim grid, tn_emu_dim block, void (*body)(void *), void *arg, size_t nf) {
    if (E.cur >= 0) {
        fprintf(stderr, "tern CUDA emulator: a launch from device code\n");
        abort();
    }
    if (E.f.size() < nf) E.f.resize(nf);
    while (E.stacks.size() < nf) {
        void *p = mmap(nullptr, STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return E.last = cudaErrorMemoryAllocation;
        E.stacks.push_back((char *)p);
    }
    E.n = (int)(block.x * block.y * block.z);
    E.grid = grid, E.block = block, E.body = body, E.arg = arg;
    gridDim = dim3(grid), blockDim = dim3(block);
    E.launches++;
    return cudaSuccess;
}
/* the launch's blocks in a shuffled order (a fixed sequence per launch and phase): a GPU runs them
 * in any order, so a kernel whose result depends on it (which block is last, one block reading
 * what another wrote) gives different results here from run to run of its launches */
void shuffle_blocks(size_t nb, uint64_t salt) {
    E.order.resize(nb);
    for (size_t i = 0; i < nb; i++) E.order[i] = i;
    uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)E.launches + salt;
    for (size_t i = nb; i > 1; i--) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const size_t j = (size_t)((r >> 33) % i);
        const size_t t = E.order[i - 1];
        E.order[i - 1] = E.order[j], E.order[j] = t;
    }
}
void enter_block(size_t b) {
    const tn_emu_dim g = E.grid;
    const unsigned x = (unsigned)(b % g.x), y = (unsigned)(b / g.x % g.y), z = (unsigned)(b / ((size_t)g.x * g.y));
    E.bidx = tn_emu_dim{x, y, z};
    blockIdx = dim3(x, y, z);
}
bool bad_dims(tn_emu_dim grid, tn_emu_dim block) {
    const unsigned nt = block.x * block.y * block.z;
    return nt == 0 || nt > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0;
}
} // namespace

cudaError_t tn_emu_run(tn_emu_dim grid, tn_emu_dim block, void (*body)(void *), void *arg) {
    if (bad_dims(grid, block)) return E.last = cudaErrorInvalidConfiguration;
    const cudaError_t e = launch_setup(grid, block, body, arg, (size_t)block.x * block.y * block.z);
    if (e != cudaSuccess) return e;
    const size_t nb = (size_t)grid.x * grid.y * grid.z;
    shuffle_blocks(nb, 0);
    for (size_t i = 0; i < nb; i++) {
        enter_block(E.order[i]);
        E.blocks++;
        init_block(0);
        run_block(0);
    }
    return cudaSuccess;
}

/* A cooperative launch: every block's threads live at once (fibers of their own), run block by
 * block in phases between grid barriers (tn_emu_sync_grid): each block runs until all its live
 * threads wait at the barrier, then the next; when every block waits, all go on, in a new order.
 * __shared__ variables are static here, so a kernel must not keep shared values across a grid
 * barrier (nor can it on a GPU that runs other blocks' phases meanwhile: it may, but tern's
 * persistent kernel does not rely on it). A block that returns while others wait at a barrier is a
 * deadlock on a GPU, and here. */
cudaError_t tn_emu_run_coop(tn_emu_dim grid, tn_emu_dim block, void (*body)(void *), void *arg) {
    if (bad_dims(grid, block)) return E.last = cudaErrorInvalidConfiguration;
    const size_t nt = (size_t)block.x * block.y * block.z, nb = (size_t)grid.x * grid.y * grid.z;
    if (nb * nt > 65536) return E.last = cudaErrorInvalidConfiguration; /* the emulator's limit on live threads */
    const cudaError_t e = launch_setup(grid, block, body, arg, nb * nt);
    if (e != cudaSuccess) return e;
    for (size_t b = 0; b < nb; b++) {
        enter_block(b);
        init_block((int)(b * nt));
    }
    E.blocks += (long)nb;
    for (uint64_t phase = 0;; phase++) {
        shuffle_blocks(nb, phase);
        for (size_t i = 0; i < nb; i++) {
            enter_block(E.order[i]);
            run_block((int)(E.order[i] * nt));
        }
        size_t waiting = 0, exited = 0;
        for (size_t b = 0; b < nb; b++) {
            bool live = false;
            for (size_t i = b * nt; i < (b + 1) * nt; i++) live |= E.f[i].state != DONE;
            if (live) waiting++;
            else exited++;
        }
        if (waiting == 0) return cudaSuccess;
        if (exited > 0) {
            enter_block(0);
            E.base = 0;
            deadlock("a block returned while others wait at a grid barrier");
        }
        for (size_t i = 0; i < nb * nt; i++)
            if (E.f[i].state == WAIT_GRID) E.f[i].state = RUN;
    }
}

void tn_emu_sync_block(void) {
    self().state = WAIT_BLOCK;
    yield_to_sched();
}
void tn_emu_sync_warp(void) {
    self().state = WAIT_WARP;
    yield_to_sched();
}
void tn_emu_sync_grid(void) {
    self().state = WAIT_GRID;
    yield_to_sched();
}
uint64_t tn_emu_shfl(uint64_t v, int src) {
    const int me = E.cur, base = E.base + (me - E.base) / 32 * 32;
    self().slot = v;
    tn_emu_sync_warp(); /* every lane has offered its value */
    const int s = base + (src & 31);
    if (s >= E.base + E.n || E.f[(size_t)s].state == DONE) deadlock("a shuffle reads a lane that has exited or does not exist");
    const uint64_t r = E.f[(size_t)s].slot;
    tn_emu_sync_warp(); /* every lane has read before any offers again */
    return r;
}
void tn_emu_mma_i8(int d[4], const uint32_t a[4], const uint32_t b[2], int a_signed) {
    const int me = E.cur, base = E.base + (me - E.base) / 32 * 32, lane = (me - E.base) % 32;
    Fiber &f = self();
    /* the fragments go to one of two slots by the product's parity, so one barrier is enough: a lane
     * reaches the next product's barrier only after every lane has read this one's slot, and the
     * product after that (this slot again) only after every lane has passed that barrier */
    const unsigned par = f.n_mma++ & 1u;
    memcpy(f.frag[par], a, 16);
    memcpy(f.frag[par] + 4, b, 8);
    tn_emu_sync_warp(); /* every lane has offered its fragments */
    for (int s = base; s < base + 32; s++)
        if (s >= E.base + E.n || E.f[(size_t)s].state == DONE) deadlock("a tensor-core product without all 32 lanes of the warp");
    /* byte kk (0..31) of row r (0..15) and of column c (0..7), from the lanes that hold them */
    auto A = [&](int r, int kk) {
        const Fiber &o = E.f[(size_t)(base + (r % 8) * 4 + (kk % 16) / 4)];
        const uint32_t w = o.frag[par][(r >= 8 ? 1 : 0) + (kk >= 16 ? 2 : 0)];
        const uint32_t by = (w >> (8 * (kk % 4))) & 0xFFu;
        return a_signed ? (int)(int8_t)by : (int)by;
    };
    auto B = [&](int c, int kk) {
        const Fiber &o = E.f[(size_t)(base + c * 4 + (kk % 16) / 4)];
        const uint32_t w = o.frag[par][4 + (kk >= 16 ? 1 : 0)];
        return (int)(int8_t)((w >> (8 * (kk % 4))) & 0xFFu);
    };
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int r = g + (i >= 2 ? 8 : 0), c = 2 * t + (i & 1);
        int s = 0;
        for (int kk = 0; kk < 32; kk++) s += A(r, kk) * B(c, kk);
        d[i] = s;
    }
}
void tn_emu_stats(long *launches, long *blocks, long *switches) {
    *launches = E.launches, *blocks = E.blocks, *switches = E.switches;
}

/* ---- runtime ---------------------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev) {
    if (dev != 0) return cudaErrorInvalidValue;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "tern CUDA emulator (CPU)");
    p->totalGlobalMem = (size_t)8 << 30;
    p->major = 9, p->minor = 0, p->multiProcessorCount = 4;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaGetDevice(int *dev) {
    *dev = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev) {
    (void)dev;
    *v = a == cudaDevAttrMultiProcessorCount ? 4 : a == cudaDevAttrComputeCapabilityMajor ? 9 : 0;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    *free_b = (size_t)6 << 30, *total_b = (size_t)8 << 30;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
    *v = 13000;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = 13000;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    const cudaError_t e = E.last;
    E.last = cudaSuccess;
    return e;
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (emulator: no graphs)";
    default: return "emulated CUDA error";
    }
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) & ~(size_t)255);
    return *p ? cudaSuccess : (E.last = cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
    (void)k;
    if (n) memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t s) {
    (void)s;
    return cudaMemcpy(dst, src, n, k);
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    static char token;
    *s = (cudaStream_t)(void *)&token;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) {
    (void)s, (void)m;
    return cudaErrorStreamCaptureUnsupported;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    (void)s;
    *g = nullptr;
    return cudaErrorStreamCaptureUnsupported;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags) {
    (void)g, (void)flags;
    *e = nullptr;
    return cudaErrorNotSupported;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    (void)e, (void)s;
    return cudaErrorNotSupported;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    (void)g;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    (void)e;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = (cudaEvent_t)(void *)new tn_emu_event_t{0};
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete (tn_emu_event_t *)(void *)e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)s;
    ((tn_emu_event_t *)(void *)e)->t = now_ms();
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    (void)e;
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)(((tn_emu_event_t *)(void *)b)->t - ((tn_emu_event_t *)(void *)a)->t);
    return cudaSuccess;
}

/* ---- cuBLAS ----------------------------------------------------------------------------------- */

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    static char token;
    *h = (cublasHandle_t)(void *)&token;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    (void)h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    (void)h, (void)s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t comp, cublasGemmAlgo_t algo) {
    (void)h, (void)algo;
    if (at != CUDA_R_16F || bt != CUDA_R_16F || ct != CUDA_R_32F || comp != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    const __half *a = (const __half *)A, *b = (const __half *)B;
    float *c = (float *)C;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float s = 0.0f;
            for (int p = 0; p < k; p++) {
                const __half x = ta == CUBLAS_OP_N ? a[i + (size_t)p * lda] : a[p + (size_t)i * lda];
                const __half y = tb == CUBLAS_OP_N ? b[p + (size_t)j * ldb] : b[j + (size_t)p * ldb];
                s += __half2float(x) * __half2float(y);
            }
            float *o = c + i + (size_t)j * ldc;
            *o = be == 0.0f ? al * s : al * s + be * *o;
        }
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
