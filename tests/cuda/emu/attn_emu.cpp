/* src/cuda/attn.cu compiled for the CUDA emulator (tests/cuda/emu/include/tn_cuda_emu.h). */
#include "cuda/attn.cu"
