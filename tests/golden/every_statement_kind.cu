// rivet: CUDA C for function `statements` (target sm_80); generated, do not edit.
// <the rivet prelude: codegen/cuda/prelude.rs>

// kernel 0 of `statements` (`statements_kernel0`): reads A; writes C, D; block 32x1x1
// 64-bit index arithmetic: launched when some index may leave int32
extern "C" __global__ void __launch_bounds__(32) statements_kernel0(
    const float* __restrict__ A,
    float* C,
    int* D,
    long long A_s0,
    long long C_s0,
    long long D_s0,
    long long D_s1) {
  { // bx bound to blockIdx.x
    const int bx = (int)blockIdx.x;
    {
      __shared__ rivet_f16 S[32]; // stage S: shared [32]
      { // tx bound to threadIdx.x
        const int tx = (int)threadIdx.x;
        S[tx] = rivet_f32_to_f16(rivet_round_f16((float)A[((long long)((bx * 32) + tx)) * A_s0]));
      }
      __syncthreads();
      { // tx bound to threadIdx.x
        const int tx_1 = (int)threadIdx.x;
        {
          int L[4] = {}; // stage L: local [4]
          #pragma unroll
          for (int j = 3; j < 3 + 4; ++j) {
            L[j - 3] = ((int)((unsigned int)((int)j) * (unsigned int)rivet_f2i32((double)A[((long long)((bx * 32) + tx_1)) * A_s0])));
          }
          {
            const int t = tx_1 * 2;
            if (t < 40) {
              C[((long long)((bx * 32) + tx_1)) * C_s0] = (((float)rivet_f16_to_f32(S[31 - tx_1])) + ((float)L[1]));
            } else {
              C[((long long)((bx * 32) + tx_1)) * C_s0] = (-((float)rivet_f16_to_f32(S[tx_1])));
            }
          }
          for (int w = 0; w < 4; ++w) { // vectorized in the IR: a plain loop for now
            D[(((long long)((bx * 32) + tx_1)) * D_s0) + (((long long)w) * D_s1)] = L[w];
          }
        }
      }
    }
  }
}

// kernel 0 of `statements` (`statements_kernel0`): reads A; writes C, D; block 32x1x1
// 32-bit index arithmetic: launched when the host finds the 14 bounds of its indices inside int32
extern "C" __global__ void __launch_bounds__(32) statements_kernel0_i32(
    const float* __restrict__ A,
    float* C,
    int* D,
    int A_s0,
    int C_s0,
    int D_s0,
    int D_s1) {
  { // bx bound to blockIdx.x
    const int bx = (int)blockIdx.x;
    {
      __shared__ rivet_f16 S[32]; // stage S: shared [32]
      { // tx bound to threadIdx.x
        const int tx = (int)threadIdx.x;
        S[tx] = rivet_f32_to_f16(rivet_round_f16((float)A[((bx * 32) + tx) * A_s0]));
      }
      __syncthreads();
      { // tx bound to threadIdx.x
        const int tx_1 = (int)threadIdx.x;
        {
          int L[4] = {}; // stage L: local [4]
          #pragma unroll
          for (int j = 3; j < 3 + 4; ++j) {
            L[j - 3] = ((int)((unsigned int)((int)j) * (unsigned int)rivet_f2i32((double)A[((bx * 32) + tx_1) * A_s0])));
          }
          {
            const int t = tx_1 * 2;
            if (t < 40) {
              C[((bx * 32) + tx_1) * C_s0] = (((float)rivet_f16_to_f32(S[31 - tx_1])) + ((float)L[1]));
            } else {
              C[((bx * 32) + tx_1) * C_s0] = (-((float)rivet_f16_to_f32(S[tx_1])));
            }
          }
          for (int w = 0; w < 4; ++w) { // vectorized in the IR: a plain loop for now
            D[(((bx * 32) + tx_1) * D_s0) + (w * D_s1)] = L[w];
          }
        }
      }
    }
  }
}
