//! C types of dtypes (in memory and in registers) and C identifiers of IR names (sanitised,
//! clear of C++ and CUDA reserved words).

use rivet_runtime::DType;

/// C type of a `dt` element in memory.
pub fn storage_type(dt: DType) -> &'static str {
    match dt {
        DType::Bool => "unsigned char",
        DType::I8 => "signed char",
        DType::I16 => "short",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::U8 => "unsigned char",
        DType::U16 => "unsigned short",
        DType::U32 => "unsigned int",
        DType::U64 => "unsigned long long",
        DType::F16 => "rivet_f16",
        DType::BF16 => "rivet_bf16",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// C type of a `dt` value in registers (what an expression of dtype `dt` evaluates to).
pub fn value_type(dt: DType) -> &'static str {
    match dt {
        DType::Bool => "bool",
        DType::F16 | DType::BF16 => "float",
        other => storage_type(other),
    }
}

/// The unsigned type integer arithmetic of `dt` is done in (wrapping, no UB).
pub(super) fn unsigned_type(dt: DType) -> &'static str {
    match dt {
        DType::I64 | DType::U64 => "unsigned long long",
        _ => "unsigned int",
    }
}

pub(super) fn is_int(dt: DType) -> bool {
    !dt.is_float() && dt != DType::Bool
}

const RESERVED: &[&str] = &[
    "alignas",
    "alignof",
    "and",
    "asm",
    "auto",
    "bool",
    "break",
    "case",
    "catch",
    "char",
    "class",
    "const",
    "constexpr",
    "continue",
    "decltype",
    "default",
    "delete",
    "do",
    "double",
    "else",
    "enum",
    "explicit",
    "export",
    "extern",
    "false",
    "float",
    "for",
    "friend",
    "goto",
    "if",
    "inline",
    "int",
    "long",
    "mutable",
    "namespace",
    "new",
    "noexcept",
    "not",
    "nullptr",
    "operator",
    "or",
    "private",
    "protected",
    "public",
    "register",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "struct",
    "switch",
    "template",
    "this",
    "throw",
    "true",
    "try",
    "typedef",
    "typeid",
    "typename",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "while",
    "xor",
    "threadIdx",
    "blockIdx",
    "blockDim",
    "gridDim",
    "warpSize",
    "main",
    "NULL",
    "exp",
    "expf",
    "log",
    "logf",
    "sqrt",
    "sqrtf",
    "tanh",
    "tanhf",
    "erf",
    "erff",
    "pow",
    "powf",
    "floor",
    "floorf",
    "ceil",
    "ceilf",
    "fabs",
    "fabsf",
    "min",
    "max",
];

/// A C identifier for `name` (not yet made unique).
pub fn sanitize(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert_str(0, "v_");
    }
    // Leading underscores are the implementation's; `rivet_` is the prelude's.
    if s.starts_with('_') || s.starts_with("rivet_") || s.starts_with("RIVET_") {
        s.insert(0, 'v');
    }
    if RESERVED.contains(&s.as_str()) {
        s.push('_');
    }
    s
}
