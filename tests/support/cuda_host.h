// Stands in for the CUDA built-ins that src/kernels/cuda/kernels.cu uses, so that the same
// source compiles as host C++ (`c++ -include cuda_host.h -x c++ kernels.cu`) and each kernel can
// be called once per thread index from tests/gpu_emulated.rs. A kernel that starts using
// another built-in (shared memory, warp functions, atomics) needs it defined here too.
#include <math.h>
#include <string.h>

#define __global__
#define __device__ static inline

struct tessera_emu_dim3 {
    unsigned x, y, z;
};

static thread_local tessera_emu_dim3 blockIdx, threadIdx, blockDim;

// Sets the calling thread's block and thread index for the next kernel call.
extern "C" void tessera_emu_set_thread(unsigned block, unsigned thread, unsigned block_dim) {
    blockIdx = {block, 0, 0};
    threadIdx = {thread, 0, 0};
    blockDim = {block_dim, 1, 1};
}

static inline float __int_as_float(int bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
