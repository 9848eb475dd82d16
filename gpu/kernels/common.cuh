// Shared by every specmla kernel file; the host prepends it before NVRTC compiles.

// NVRTC has no math.h, so infinity comes from its bits.
#define NEG_INF __int_as_float(0xff800000)
// What a read of a position with no block gives, as the CPU cache poisons unwritten slots.
#define NAN_F __int_as_float(0x7fffffff)
#define THREADS 128

// Sum over a THREADS-wide block; every thread gets the result.
__device__ float block_sum(float v, float* scratch) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < THREADS / 32; ++w) total += scratch[w];
    return total;
}
