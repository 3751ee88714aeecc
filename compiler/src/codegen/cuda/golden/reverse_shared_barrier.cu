// rivet: CUDA C for function `reverse` (target sm_80); generated, do not edit.
// <the rivet prelude: codegen/cuda/prelude.rs>

// kernel 0 of `reverse` (`reverse_kernel0`): reads A; writes C; block 64x1x1
extern "C" __global__ void __launch_bounds__(64) reverse_kernel0(
    const float* __restrict__ A,
    float* C,
    long long A_s0,
    long long C_s0) {
  { // bx bound to blockIdx.x
    const long long bx = (long long)blockIdx.x;
    {
      __shared__ float S[64]; // stage S: shared [64]
      const long long S_s0 = 1;
      { // tx bound to threadIdx.x
        const long long tx = (long long)threadIdx.x;
        S[tx * S_s0] = A[((bx * 64LL) + tx) * A_s0];
      }
      __syncthreads();
      { // tx bound to threadIdx.x
        const long long tx_1 = (long long)threadIdx.x;
        C[((bx * 64LL) + tx_1) * C_s0] = S[(63LL - tx_1) * S_s0];
      }
    }
  }
}
