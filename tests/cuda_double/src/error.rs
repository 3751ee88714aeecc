//! CUresult values the double returns (the numbers of `cuda.h`), and how misuse is reported.

/// A `CUresult`.
pub type CuResult = u32;

pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CuResult = 3;
pub const CUDA_ERROR_DEINITIALIZED: CuResult = 4;
pub const CUDA_ERROR_NO_DEVICE: CuResult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CuResult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CuResult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CuResult = 201;
pub const CUDA_ERROR_ALREADY_MAPPED: CuResult = 208;
pub const CUDA_ERROR_NO_BINARY_FOR_GPU: CuResult = 209;
pub const CUDA_ERROR_INVALID_SOURCE: CuResult = 300;
pub const CUDA_ERROR_FILE_NOT_FOUND: CuResult = 301;
pub const CUDA_ERROR_INVALID_HANDLE: CuResult = 400;
pub const CUDA_ERROR_ILLEGAL_STATE: CuResult = 401;
pub const CUDA_ERROR_NOT_FOUND: CuResult = 500;
pub const CUDA_ERROR_NOT_READY: CuResult = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CuResult = 700;
pub const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: CuResult = 701;
pub const CUDA_ERROR_LAUNCH_FAILED: CuResult = 719;
pub const CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: CuResult = 217;
pub const CUDA_ERROR_NOT_SUPPORTED: CuResult = 801;
pub const CUDA_ERROR_UNKNOWN: CuResult = 999;

/// Why the double refused something: the code the caller gets and the line on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: CuResult,
    pub why: String,
}

impl Refusal {
    pub fn new(code: CuResult, why: impl Into<String>) -> Self {
        Refusal {
            code,
            why: why.into(),
        }
    }
}
