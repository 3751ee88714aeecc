// rivet: CUDA C for function `gemm` (target sm_80); generated, do not edit.
// <the rivet prelude: codegen/cuda/prelude.rs>

// kernel 0 of `gemm` (`gemm_kernel0`): reads A, B; writes C; block 16x16x1
// 64-bit index arithmetic: launched when some index may leave int32
extern "C" __global__ void __launch_bounds__(256) gemm_kernel0(
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
  { // i.outer bound to blockIdx.y
    const long long i_outer = (long long)blockIdx.y;
    { // j.outer bound to blockIdx.x
      const long long j_outer = (long long)blockIdx.x;
      {
        __shared__ float A_shared[1024]; // stage A.shared: shared [64, 16]
        __shared__ float B_shared[1024]; // stage B.shared: shared [16, 64]
        { // i.inner.outer bound to threadIdx.y
          const int i_inner_outer = (int)threadIdx.y;
          { // j.inner.outer bound to threadIdx.x
            const int j_inner_outer = (int)threadIdx.x;
            {
              float C_local[16] = {}; // stage C.local: local [4, 4]
              for (int ax0_init = 0; ax0_init < 4; ++ax0_init) {
                for (int ax1_init = 0; ax1_init < 4; ++ax1_init) {
                  if (((((((i_outer * 64LL) + ((long long)(i_inner_outer * 4))) + ((long long)ax0_init)) >= 0) && ((((i_outer * 64LL) + ((long long)(i_inner_outer * 4))) + ((long long)ax0_init)) < m)) && ((((j_outer * 64LL) + ((long long)(j_inner_outer * 4))) + ((long long)ax1_init)) >= 0)) && ((((j_outer * 64LL) + ((long long)(j_inner_outer * 4))) + ((long long)ax1_init)) < n)) {
                    C_local[(ax0_init * 4) + ax1_init] = 0.0f;
                  }
                }
              }
              for (long long r_outer = 0; r_outer < (rivet_floordiv_i64((k - 1LL), 16LL) + 1LL); ++r_outer) {
                __syncthreads();
                for (int ax0_ax1_fused_outer = 0; ax0_ax1_fused_outer < 4; ++ax0_ax1_fused_outer) {
                  if ((((((i_outer * 64LL) + ((long long)((16 * ax0_ax1_fused_outer) + i_inner_outer))) >= 0) && (((i_outer * 64LL) + ((long long)((16 * ax0_ax1_fused_outer) + i_inner_outer))) < m)) && (((r_outer * 16LL) + ((long long)j_inner_outer)) >= 0)) && (((r_outer * 16LL) + ((long long)j_inner_outer)) < k)) {
                    A_shared[(((16 * ax0_ax1_fused_outer) + i_inner_outer) * 16) + j_inner_outer] = A[(((i_outer * 64LL) + ((long long)((16 * ax0_ax1_fused_outer) + i_inner_outer))) * A_s0) + (((r_outer * 16LL) + ((long long)j_inner_outer)) * A_s1)];
                  }
                }
                for (int ax0_ax1_fused_outer_1 = 0; ax0_ax1_fused_outer_1 < 4; ++ax0_ax1_fused_outer_1) {
                  if ((((((r_outer * 16LL) + ((long long)(((ax0_ax1_fused_outer_1 * 256) + ((i_inner_outer * 16) + j_inner_outer)) / 64))) >= 0) && (((r_outer * 16LL) + ((long long)(((ax0_ax1_fused_outer_1 * 256) + ((i_inner_outer * 16) + j_inner_outer)) / 64))) < k)) && (((j_outer * 64LL) + ((long long)(((ax0_ax1_fused_outer_1 * 256) + ((i_inner_outer * 16) + j_inner_outer)) % 64))) >= 0)) && (((j_outer * 64LL) + ((long long)(((ax0_ax1_fused_outer_1 * 256) + ((i_inner_outer * 16) + j_inner_outer)) % 64))) < n)) {
                    B_shared[((256 * ax0_ax1_fused_outer_1) + (16 * i_inner_outer)) + j_inner_outer] = B[(((r_outer * 16LL) + ((long long)(((ax0_ax1_fused_outer_1 * 256) + ((i_inner_outer * 16) + j_inner_outer)) / 64))) * B_s0) + (((j_outer * 64LL) + ((long long)(((ax0_ax1_fused_outer_1 * 256) + ((i_inner_outer * 16) + j_inner_outer)) % 64))) * B_s1)];
                  }
                }
                __syncthreads();
                #pragma unroll
                for (int r_inner = 0; r_inner < 16; ++r_inner) {
                  #pragma unroll
                  for (int ax0 = 0; ax0 < 4; ++ax0) {
                    #pragma unroll
                    for (int ax1 = 0; ax1 < 4; ++ax1) {
                      if (((((((r_outer * 16LL) + ((long long)r_inner)) < k) && ((((i_outer * 64LL) + ((long long)(i_inner_outer * 4))) + ((long long)ax0)) >= 0)) && ((((i_outer * 64LL) + ((long long)(i_inner_outer * 4))) + ((long long)ax0)) < m)) && ((((j_outer * 64LL) + ((long long)(j_inner_outer * 4))) + ((long long)ax1)) >= 0)) && ((((j_outer * 64LL) + ((long long)(j_inner_outer * 4))) + ((long long)ax1)) < n)) {
                        C_local[(ax0 * 4) + ax1] = (C_local[(ax0 * 4) + ax1] + (A_shared[(((4 * i_inner_outer) + ax0) * 16) + r_inner] * B_shared[(r_inner * 64) + ((4 * j_inner_outer) + ax1)]));
                      }
                    }
                  }
                }
              }
              for (int i_inner_inner = 0; i_inner_inner < 4; ++i_inner_inner) {
                for (int j_inner_inner = 0; j_inner_inner < 4; ++j_inner_inner) {
                  if ((((j_outer * 64LL) + ((long long)((j_inner_outer * 4) + j_inner_inner))) < n) && (((i_outer * 64LL) + ((long long)((i_inner_outer * 4) + i_inner_inner))) < m)) {
                    C[(((i_outer * 64LL) + ((long long)((i_inner_outer * 4) + i_inner_inner))) * C_s0) + (((j_outer * 64LL) + ((long long)((j_inner_outer * 4) + j_inner_inner))) * C_s1)] = C_local[(i_inner_inner * 4) + j_inner_inner];
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

// kernel 0 of `gemm` (`gemm_kernel0`): reads A, B; writes C; block 16x16x1
// 32-bit index arithmetic: launched when the host finds the 43 bounds of its indices inside int32
extern "C" __global__ void __launch_bounds__(256) gemm_kernel0_i32(
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
  { // i.outer bound to blockIdx.y
    const int i_outer = (int)blockIdx.y;
    { // j.outer bound to blockIdx.x
      const int j_outer = (int)blockIdx.x;
      {
        __shared__ float A_shared[1024]; // stage A.shared: shared [64, 16]
        __shared__ float B_shared[1024]; // stage B.shared: shared [16, 64]
        { // i.inner.outer bound to threadIdx.y
          const int i_inner_outer = (int)threadIdx.y;
          { // j.inner.outer bound to threadIdx.x
            const int j_inner_outer = (int)threadIdx.x;
            {
              float C_local[16] = {}; // stage C.local: local [4, 4]
              for (int ax0_init = 0; ax0_init < 4; ++ax0_init) {
                for (int ax1_init = 0; ax1_init < 4; ++ax1_init) {
                  if (((((((i_outer * 64) + (i_inner_outer * 4)) + ax0_init) >= 0) && ((((i_outer * 64) + (i_inner_outer * 4)) + ax0_init) < m)) && ((((j_outer * 64) + (j_inner_outer * 4)) + ax1_init) >= 0)) && ((((j_outer * 64) + (j_inner_outer * 4)) + ax1_init) < n)) {
                    C_local[(ax0_init * 4) + ax1_init] = 0.0f;
                  }
                }
              }
              for (int r_outer = 0; r_outer < (((int)rivet_floordiv_i64((long long)(k - 1), (long long)16)) + 1); ++r_outer) {
                __syncthreads();
                for (int ax0_ax1_fused_outer = 0; ax0_ax1_fused_outer < 4; ++ax0_ax1_fused_outer) {
                  if ((((((i_outer * 64) + ((16 * ax0_ax1_fused_outer) + i_inner_outer)) >= 0) && (((i_outer * 64) + ((16 * ax0_ax1_fused_outer) + i_inner_outer)) < m)) && (((r_outer * 16) + j_inner_outer) >= 0)) && (((r_outer * 16) + j_inner_outer) < k)) {
                    A_shared[(((16 * ax0_ax1_fused_outer) + i_inner_outer) * 16) + j_inner_outer] = A[(((i_outer * 64) + ((16 * ax0_ax1_fused_outer) + i_inner_outer)) * A_s0) + (((r_outer * 16) + j_inner_outer) * A_s1)];
                  }
                }
                for (int ax0_ax1_fused_outer_1 = 0; ax0_ax1_fused_outer_1 < 4; ++ax0_ax1_fused_outer_1) {
                  if ((((((r_outer * 16) + (((ax0_ax1_fused_outer_1 * 256) + ((i_inner_outer * 16) + j_inner_outer)) / 64)) >= 0) && (((r_outer * 16) + (((ax0_ax1_fused_outer_1 * 256) + ((i_inner_outer * 16) + j_inner_outer)) / 64)) < k)) && (((j_outer * 64) + (((ax0_ax1_fused_outer_1 * 256) + ((i_inner_outer * 16) + j_inner_outer)) % 64)) >= 0)) && (((j_outer * 64) + (((ax0_ax1_fused_outer_1 * 256) + ((i_inner_outer * 16) + j_inner_outer)) % 64)) < n)) {
                    B_shared[((256 * ax0_ax1_fused_outer_1) + (16 * i_inner_outer)) + j_inner_outer] = B[(((r_outer * 16) + (((ax0_ax1_fused_outer_1 * 256) + ((i_inner_outer * 16) + j_inner_outer)) / 64)) * B_s0) + (((j_outer * 64) + (((ax0_ax1_fused_outer_1 * 256) + ((i_inner_outer * 16) + j_inner_outer)) % 64)) * B_s1)];
                  }
                }
                __syncthreads();
                #pragma unroll
                for (int r_inner = 0; r_inner < 16; ++r_inner) {
                  #pragma unroll
                  for (int ax0 = 0; ax0 < 4; ++ax0) {
                    #pragma unroll
                    for (int ax1 = 0; ax1 < 4; ++ax1) {
                      if (((((((r_outer * 16) + r_inner) < k) && ((((i_outer * 64) + (i_inner_outer * 4)) + ax0) >= 0)) && ((((i_outer * 64) + (i_inner_outer * 4)) + ax0) < m)) && ((((j_outer * 64) + (j_inner_outer * 4)) + ax1) >= 0)) && ((((j_outer * 64) + (j_inner_outer * 4)) + ax1) < n)) {
                        C_local[(ax0 * 4) + ax1] = (C_local[(ax0 * 4) + ax1] + (A_shared[(((4 * i_inner_outer) + ax0) * 16) + r_inner] * B_shared[(r_inner * 64) + ((4 * j_inner_outer) + ax1)]));
                      }
                    }
                  }
                }
              }
              for (int i_inner_inner = 0; i_inner_inner < 4; ++i_inner_inner) {
                for (int j_inner_inner = 0; j_inner_inner < 4; ++j_inner_inner) {
                  if ((((j_outer * 64) + ((j_inner_outer * 4) + j_inner_inner)) < n) && (((i_outer * 64) + ((i_inner_outer * 4) + i_inner_inner)) < m)) {
                    C[(((i_outer * 64) + ((i_inner_outer * 4) + i_inner_inner)) * C_s0) + (((j_outer * 64) + ((j_inner_outer * 4) + j_inner_inner)) * C_s1)] = C_local[(i_inner_inner * 4) + j_inner_inner];
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}
