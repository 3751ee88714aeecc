// rivet: CUDA C for function `reverse` (target sm_80); generated, do not edit.
// <the rivet prelude: codegen/cuda/prelude.rs>

// kernel 0 of `reverse` (`reverse_kernel0`): reads A; writes C; block 64x1x1
// 64-bit index arithmetic: launched when some index may leave int32
extern "C" __global__ void __launch_bounds__(64) reverse_kernel0(
    const float* __restrict__ A,
    float* C,
    long long A_s0,
    long long C_s0) {
  { // bx bound to blockIdx.x
    const int bx = (int)blockIdx.x;
    {
      __shared__ float S[64]; // stage S: shared [64]
      { // tx bound to threadIdx.x
        const int tx = (int)threadIdx.x;
        S[tx] = A[((long long)((bx * 64) + tx)) * A_s0];
      }
      __syncthreads();
      { // tx bound to threadIdx.x
        const int tx_1 = (int)threadIdx.x;
        C[((long long)((bx * 64) + tx_1)) * C_s0] = S[63 - tx_1];
      }
    }
  }
}

// kernel 0 of `reverse` (`reverse_kernel0`): reads A; writes C; block 64x1x1
// 32-bit index arithmetic: launched when the host finds the 6 bounds of its indices inside int32
extern "C" __global__ void __launch_bounds__(64) reverse_kernel0_i32(
    const float* __restrict__ A,
    float* C,
    int A_s0,
    int C_s0) {
  { // bx bound to blockIdx.x
    const int bx = (int)blockIdx.x;
    {
      __shared__ float S[64]; // stage S: shared [64]
      { // tx bound to threadIdx.x
        const int tx = (int)threadIdx.x;
        S[tx] = A[((bx * 64) + tx) * A_s0];
      }
      __syncthreads();
      { // tx bound to threadIdx.x
        const int tx_1 = (int)threadIdx.x;
        C[((bx * 64) + tx_1) * C_s0] = S[63 - tx_1];
      }
    }
  }
}
