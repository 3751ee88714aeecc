// rivet: CUDA C for function `rowsum` (target sm_80); generated, do not edit.
// <the rivet prelude: codegen/cuda/prelude.rs>

// kernel 0 of `rowsum` (`rowsum_kernel0`): reads X; writes Y; block 128x1x1
// 64-bit index arithmetic: launched when some index may leave int32
extern "C" __global__ void __launch_bounds__(128) rowsum_kernel0(
    const float* __restrict__ X,
    float* Y,
    long long X_s0,
    long long X_s1,
    long long Y_s0) {
  { // r bound to blockIdx.x
    const int r = (int)blockIdx.x;
    {
      __shared__ float S[128]; // stage S: shared [128]
      { // tx bound to threadIdx.x
        const int tx = (int)threadIdx.x;
        S[tx] = (X[(((long long)r) * X_s0) + (((long long)tx) * X_s1)] + X[(((long long)r) * X_s0) + (((long long)(tx + 128)) * X_s1)]);
        __syncthreads();
        if (tx < 64) {
          S[tx] = (S[tx] + S[tx + 64]);
        }
        __syncthreads();
        if (tx < 32) {
          S[tx] = (S[tx] + S[tx + 32]);
        }
        __syncthreads();
        if (tx < 16) {
          S[tx] = (S[tx] + S[tx + 16]);
        }
        __syncthreads();
        if (tx < 8) {
          S[tx] = (S[tx] + S[tx + 8]);
        }
        __syncthreads();
        if (tx < 4) {
          S[tx] = (S[tx] + S[tx + 4]);
        }
        __syncthreads();
        if (tx < 2) {
          S[tx] = (S[tx] + S[tx + 2]);
        }
        __syncthreads();
        if (tx < 1) {
          S[tx] = (S[tx] + S[tx + 1]);
        }
        __syncthreads();
        if (tx < 1) {
          Y[((long long)r) * Y_s0] = S[0];
        }
      }
    }
  }
}

// kernel 0 of `rowsum` (`rowsum_kernel0`): reads X; writes Y; block 128x1x1
// 32-bit index arithmetic: launched when the host finds the 15 bounds of its indices inside int32
extern "C" __global__ void __launch_bounds__(128) rowsum_kernel0_i32(
    const float* __restrict__ X,
    float* Y,
    int X_s0,
    int X_s1,
    int Y_s0) {
  { // r bound to blockIdx.x
    const int r = (int)blockIdx.x;
    {
      __shared__ float S[128]; // stage S: shared [128]
      { // tx bound to threadIdx.x
        const int tx = (int)threadIdx.x;
        S[tx] = (X[(r * X_s0) + (tx * X_s1)] + X[(r * X_s0) + ((tx + 128) * X_s1)]);
        __syncthreads();
        if (tx < 64) {
          S[tx] = (S[tx] + S[tx + 64]);
        }
        __syncthreads();
        if (tx < 32) {
          S[tx] = (S[tx] + S[tx + 32]);
        }
        __syncthreads();
        if (tx < 16) {
          S[tx] = (S[tx] + S[tx + 16]);
        }
        __syncthreads();
        if (tx < 8) {
          S[tx] = (S[tx] + S[tx + 8]);
        }
        __syncthreads();
        if (tx < 4) {
          S[tx] = (S[tx] + S[tx + 4]);
        }
        __syncthreads();
        if (tx < 2) {
          S[tx] = (S[tx] + S[tx + 2]);
        }
        __syncthreads();
        if (tx < 1) {
          S[tx] = (S[tx] + S[tx + 1]);
        }
        __syncthreads();
        if (tx < 1) {
          Y[r * Y_s0] = S[0];
        }
      }
    }
  }
}
