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
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CuResult = 704;
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

/// The name and description of each code the double returns, as static C strings
/// (`cuGetErrorName` / `cuGetErrorString` hand out pointers that must live forever).
pub fn error_name(code: CuResult) -> Option<(&'static std::ffi::CStr, &'static std::ffi::CStr)> {
    Some(match code {
        CUDA_SUCCESS => (c"CUDA_SUCCESS", c"no error"),
        CUDA_ERROR_INVALID_VALUE => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        CUDA_ERROR_OUT_OF_MEMORY => (c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        CUDA_ERROR_NOT_INITIALIZED => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        CUDA_ERROR_DEINITIALIZED => (c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
        CUDA_ERROR_NO_DEVICE => (
            c"CUDA_ERROR_NO_DEVICE",
            c"no CUDA-capable device is detected",
        ),
        CUDA_ERROR_INVALID_DEVICE => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        CUDA_ERROR_INVALID_IMAGE => (
            c"CUDA_ERROR_INVALID_IMAGE",
            c"device kernel image is invalid",
        ),
        CUDA_ERROR_INVALID_CONTEXT => (c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        CUDA_ERROR_ALREADY_MAPPED => (c"CUDA_ERROR_ALREADY_MAPPED", c"resource already mapped"),
        CUDA_ERROR_NO_BINARY_FOR_GPU => (
            c"CUDA_ERROR_NO_BINARY_FOR_GPU",
            c"no kernel image is available for execution on the device",
        ),
        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => (
            c"CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
            c"peer access is not supported between these two devices",
        ),
        CUDA_ERROR_INVALID_SOURCE => (
            c"CUDA_ERROR_INVALID_SOURCE",
            c"device kernel image is invalid",
        ),
        CUDA_ERROR_FILE_NOT_FOUND => (c"CUDA_ERROR_FILE_NOT_FOUND", c"file not found"),
        CUDA_ERROR_INVALID_HANDLE => (c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        CUDA_ERROR_ILLEGAL_STATE => (
            c"CUDA_ERROR_ILLEGAL_STATE",
            c"the operation cannot be performed in the present state",
        ),
        CUDA_ERROR_NOT_FOUND => (c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        CUDA_ERROR_NOT_READY => (c"CUDA_ERROR_NOT_READY", c"device not ready"),
        CUDA_ERROR_ILLEGAL_ADDRESS => (
            c"CUDA_ERROR_ILLEGAL_ADDRESS",
            c"an illegal memory access was encountered",
        ),
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => (
            c"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
            c"too many resources requested for launch",
        ),
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => (
            c"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
            c"peer access is already enabled",
        ),
        CUDA_ERROR_LAUNCH_FAILED => (c"CUDA_ERROR_LAUNCH_FAILED", c"unspecified launch failure"),
        CUDA_ERROR_NOT_SUPPORTED => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        CUDA_ERROR_UNKNOWN => (c"CUDA_ERROR_UNKNOWN", c"unknown error"),
        _ => return None,
    })
}
