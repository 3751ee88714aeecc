// rivet: CUDA C for function `double` (target sm_80); generated, do not edit.
// <the rivet prelude: codegen/cuda/prelude.rs>

// kernel 0 of `double` (`double_kernel0`): reads A; writes C; block 64x1x1
// 64-bit index arithmetic: launched when some index may leave int32
extern "C" __global__ void __launch_bounds__(64) double_kernel0(
    const float* __restrict__ A,
    float* C,
    long long n,
    long long A_s0,
    long long C_s0) {
  { // bx bound to blockIdx.x
    const long long bx = (long long)blockIdx.x;
    { // tx bound to threadIdx.x
      const int tx = (int)threadIdx.x;
      if (((bx * 64LL) + ((long long)tx)) < n) {
        C[((bx * 64LL) + ((long long)tx)) * C_s0] = (A[((bx * 64LL) + ((long long)tx)) * A_s0] * 2.0f);
      }
    }
  }
}

// kernel 0 of `double` (`double_kernel0`): reads A; writes C; block 64x1x1
// 32-bit index arithmetic: launched when the host finds the 10 bounds of its indices inside int32
extern "C" __global__ void __launch_bounds__(64) double_kernel0_i32(
    const float* __restrict__ A,
    float* C,
    int n,
    int A_s0,
    int C_s0) {
  { // bx bound to blockIdx.x
    const int bx = (int)blockIdx.x;
    { // tx bound to threadIdx.x
      const int tx = (int)threadIdx.x;
      if (((bx * 64) + tx) < n) {
        C[((bx * 64) + tx) * C_s0] = (A[((bx * 64) + tx) * A_s0] * 2.0f);
      }
    }
  }
}
