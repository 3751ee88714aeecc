// rivet: CUDA C for function `double` (target sm_80); generated, do not edit.
// <the rivet prelude: codegen/cuda/prelude.rs>

// kernel 0 of `double` (`double_kernel0`): reads A; writes C; block 64x1x1
extern "C" __global__ void __launch_bounds__(64) double_kernel0(
    const float* __restrict__ A,
    float* C,
    long long n,
    long long A_s0,
    long long C_s0) {
  { // bx bound to blockIdx.x
    const long long bx = (long long)blockIdx.x;
    { // tx bound to threadIdx.x
      const long long tx = (long long)threadIdx.x;
      if (((bx * 64LL) + tx) < n) {
        C[((bx * 64LL) + tx) * C_s0] = (A[((bx * 64LL) + tx) * A_s0] * 2.0f);
      }
    }
  }
}
