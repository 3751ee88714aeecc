// rivet: CUDA C for function `mm` (target sm_80); generated, do not edit.
// <the rivet prelude: codegen/cuda/prelude.rs>

// kernel 0 of `mm` (`mm_kernel0`): reads A, B; writes C; block 8x8x1
// 64-bit index arithmetic: launched when some index may leave int32
extern "C" __global__ void __launch_bounds__(64) mm_kernel0(
    const float* __restrict__ A,
    const float* __restrict__ B,
    float* C,
    long long m,
    long long k,
    long long n,
    long long A_s0,
    long long A_s1,
    long long B_s0,
    long long B_s1,
    long long C_s0,
    long long C_s1) {
  { // by bound to blockIdx.y
    const long long by = (long long)blockIdx.y;
    { // bx bound to blockIdx.x
      const long long bx = (long long)blockIdx.x;
      {
        __shared__ float As[64]; // stage As: shared [8, 8]
        {
          __shared__ float Bs[64]; // stage Bs: shared [8, 8]
          { // ty bound to threadIdx.y
            const int ty = (int)threadIdx.y;
            { // tx bound to threadIdx.x
              const int tx = (int)threadIdx.x;
              {
                float acc[1] = {}; // stage acc: local [1]
                acc[0] = 0.0f;
                for (long long kt = 0; kt < ((k + 7LL) / 8LL); ++kt) {
                  As[(ty * 8) + tx] = (((((by * 8LL) + ((long long)ty)) < m) && (((kt * 8LL) + ((long long)tx)) < k)) ? A[(((by * 8LL) + ((long long)ty)) * A_s0) + (((kt * 8LL) + ((long long)tx)) * A_s1)] : 0.0f);
                  Bs[(ty * 8) + tx] = (((((kt * 8LL) + ((long long)ty)) < k) && (((bx * 8LL) + ((long long)tx)) < n)) ? B[(((kt * 8LL) + ((long long)ty)) * B_s0) + (((bx * 8LL) + ((long long)tx)) * B_s1)] : 0.0f);
                  __syncthreads();
                  #pragma unroll
                  for (int kk = 0; kk < 8; ++kk) {
                    acc[0] = (acc[0] + (As[(ty * 8) + kk] * Bs[(kk * 8) + tx]));
                  }
                  __syncthreads();
                }
                if ((((by * 8LL) + ((long long)ty)) < m) && (((bx * 8LL) + ((long long)tx)) < n)) {
                  C[(((by * 8LL) + ((long long)ty)) * C_s0) + (((bx * 8LL) + ((long long)tx)) * C_s1)] = acc[0];
                }
              }
            }
          }
        }
      }
    }
  }
}

// kernel 0 of `mm` (`mm_kernel0`): reads A, B; writes C; block 8x8x1
// 32-bit index arithmetic: launched when the host finds the 38 bounds of its indices inside int32
extern "C" __global__ void __launch_bounds__(64) mm_kernel0_i32(
    const float* __restrict__ A,
    const float* __restrict__ B,
    float* C,
    int m,
    int k,
    int n,
    int A_s0,
    int A_s1,
    int B_s0,
    int B_s1,
    int C_s0,
    int C_s1) {
  { // by bound to blockIdx.y
    const int by = (int)blockIdx.y;
    { // bx bound to blockIdx.x
      const int bx = (int)blockIdx.x;
      {
        __shared__ float As[64]; // stage As: shared [8, 8]
        {
          __shared__ float Bs[64]; // stage Bs: shared [8, 8]
          { // ty bound to threadIdx.y
            const int ty = (int)threadIdx.y;
            { // tx bound to threadIdx.x
              const int tx = (int)threadIdx.x;
              {
                float acc[1] = {}; // stage acc: local [1]
                acc[0] = 0.0f;
                for (int kt = 0; kt < ((k + 7) / 8); ++kt) {
                  As[(ty * 8) + tx] = (((((by * 8) + ty) < m) && (((kt * 8) + tx) < k)) ? A[(((by * 8) + ty) * A_s0) + (((kt * 8) + tx) * A_s1)] : 0.0f);
                  Bs[(ty * 8) + tx] = (((((kt * 8) + ty) < k) && (((bx * 8) + tx) < n)) ? B[(((kt * 8) + ty) * B_s0) + (((bx * 8) + tx) * B_s1)] : 0.0f);
                  __syncthreads();
                  #pragma unroll
                  for (int kk = 0; kk < 8; ++kk) {
                    acc[0] = (acc[0] + (As[(ty * 8) + kk] * Bs[(kk * 8) + tx]));
                  }
                  __syncthreads();
                }
                if ((((by * 8) + ty) < m) && (((bx * 8) + tx) < n)) {
                  C[(((by * 8) + ty) * C_s0) + (((bx * 8) + tx) * C_s1)] = acc[0];
                }
              }
            }
          }
        }
      }
    }
  }
}
