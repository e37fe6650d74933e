/* src/cuda/kernels.cu compiled for the CUDA emulator (tests/cuda/emu/include/tn_cuda_emu.h). */
#include "cuda/kernels.cu"
