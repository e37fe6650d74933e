/* tern CUDA emulator (tests only): see tn_cuda_emu.h */
#include "tn_cuda_emu.h"
