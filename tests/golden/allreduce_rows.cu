// rivet: CUDA C for function `rows_sum_float32_256x1` (target sm_80); generated, do not edit.
// <the rivet prelude: codegen/cuda/prelude.rs>

// kernel 0 of `rows_sum_float32_256x1` (`rows_kernel0`): reads A; writes R; block 256x1x1
// 64-bit index arithmetic: launched when some index may leave int32
extern "C" __global__ void __launch_bounds__(256) rows_kernel0(
    const float* __restrict__ A,
    float* R,
    long long n,
    long long k,
    long long A_s0,
    long long A_s1,
    long long R_s0) {
  { // i bound to blockIdx.x
    const long long i = (long long)blockIdx.x;
    { // r.inner bound to threadIdx.x
      const int r_inner = (int)threadIdx.x;
      {
        float R_acc[1] = {}; // stage R.acc: local [1]
        R_acc[0] = 0.0f;
        for (long long r_outer = 0; r_outer < (rivet_floordiv_i64((k - 1LL), 256LL) + 1LL); ++r_outer) {
          if (((r_outer * 256LL) + ((long long)r_inner)) < k) {
            R_acc[0] = (R_acc[0] + A[(i * A_s0) + (((r_outer * 256LL) + ((long long)r_inner)) * A_s1)]);
          }
        }
        { // allreduce sum over threadIdx.x: 256 threads in each of 1 groups
          __shared__ float R_acc_red[8];
          R_acc[0] = rivet_allreduce_x<float>(R_acc[0], [](float rivet_a, float rivet_b) -> float { return rivet_a + rivet_b; }, R_acc_red, 256, 1, 256);
        }
        if (r_inner == 0) {
          R[i * R_s0] = R_acc[0];
        }
      }
    }
  }
}

// kernel 0 of `rows_sum_float32_256x1` (`rows_kernel0`): reads A; writes R; block 256x1x1
// 32-bit index arithmetic: launched when the host finds the 20 bounds of its indices inside int32
extern "C" __global__ void __launch_bounds__(256) rows_kernel0_i32(
    const float* __restrict__ A,
    float* R,
    int n,
    int k,
    int A_s0,
    int A_s1,
    int R_s0) {
  { // i bound to blockIdx.x
    const int i = (int)blockIdx.x;
    { // r.inner bound to threadIdx.x
      const int r_inner = (int)threadIdx.x;
      {
        float R_acc[1] = {}; // stage R.acc: local [1]
        R_acc[0] = 0.0f;
        for (int r_outer = 0; r_outer < (((int)rivet_floordiv_i64((long long)(k - 1), (long long)256)) + 1); ++r_outer) {
          if (((r_outer * 256) + r_inner) < k) {
            R_acc[0] = (R_acc[0] + A[(i * A_s0) + (((r_outer * 256) + r_inner) * A_s1)]);
          }
        }
        { // allreduce sum over threadIdx.x: 256 threads in each of 1 groups
          __shared__ float R_acc_red[8];
          R_acc[0] = rivet_allreduce_x<float>(R_acc[0], [](float rivet_a, float rivet_b) -> float { return rivet_a + rivet_b; }, R_acc_red, 256, 1, 256);
        }
        if (r_inner == 0) {
          R[i * R_s0] = R_acc[0];
        }
      }
    }
  }
}
