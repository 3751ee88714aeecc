//! Element types. A `DType` is a plain value; its DLPack encoding is (code, bits, lanes=1).
//! Only the types rivet can store are representable: sub-byte, complex and fp8 types coming
//! through DLPack are rejected at import with a `DType` error naming the code and bits.

use crate::error::{Error, Result};
use dlpack_rs::ffi::{DLDataType, DLDataTypeCode};
use std::fmt;
use std::str::FromStr;

/// An element type. Parsed from and serialised by name ("float32"), the same spelling as the
/// Python API.
///
/// ```
/// use rivet_runtime::DType;
///
/// let d: DType = "bfloat16".parse().unwrap();
/// assert_eq!(d, DType::BF16);
/// assert_eq!(DType::F32.to_string(), "float32");
/// assert!("float128".parse::<DType>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DType {
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    BF16,
    F32,
    F64,
}

impl DType {
    pub const ALL: [DType; 13] = [
        DType::Bool,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Size of one element in bytes (bool is stored as one byte, as DLPack says).
    pub const fn size(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }

    /// numpy's array-interface type string (`__array_interface__`,
    /// `__cuda_array_interface__`): little-endian, `|` for one-byte types; `None` for
    /// bfloat16, which has no type string.
    pub const fn typestr(self) -> Option<&'static str> {
        Some(match self {
            DType::Bool => "|b1",
            DType::I8 => "|i1",
            DType::I16 => "<i2",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::U8 => "|u1",
            DType::U16 => "<u2",
            DType::U32 => "<u4",
            DType::U64 => "<u8",
            DType::F16 => "<f2",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
            DType::BF16 => return None,
        })
    }

    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    pub fn to_dlpack(self) -> DLDataType {
        let code = match self {
            DType::Bool => DLDataTypeCode::kDLBool,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 => DLDataTypeCode::kDLInt,
            DType::U8 | DType::U16 | DType::U32 | DType::U64 => DLDataTypeCode::kDLUInt,
            DType::F16 | DType::F32 | DType::F64 => DLDataTypeCode::kDLFloat,
            DType::BF16 => DLDataTypeCode::kDLBfloat,
        };
        DLDataType {
            code: code as u8,
            bits: (self.size() * 8) as u8,
            lanes: 1,
        }
    }

    /// The inverse of `to_dlpack` (a test checks it over every code and size), as one match:
    /// every tensor argument of every call comes through here, and a search of `ALL` through
    /// `to_dlpack` was a loop of calls. Some producers (older MXNet, numpy<1.25) export bool
    /// as uint8 with the bool code missing; those arrive as uint8 and stay uint8, which is
    /// what they are in memory.
    #[inline]
    pub fn from_dlpack(t: DLDataType) -> Result<DType> {
        const BOOL: u8 = DLDataTypeCode::kDLBool as u8;
        const INT: u8 = DLDataTypeCode::kDLInt as u8;
        const UINT: u8 = DLDataTypeCode::kDLUInt as u8;
        const FLOAT: u8 = DLDataTypeCode::kDLFloat as u8;
        const BFLOAT: u8 = DLDataTypeCode::kDLBfloat as u8;
        if t.lanes != 1 {
            return Err(unsupported_dlpack(t));
        }
        Ok(match (t.code, t.bits) {
            (BOOL, 8) => DType::Bool,
            (INT, 8) => DType::I8,
            (INT, 16) => DType::I16,
            (INT, 32) => DType::I32,
            (INT, 64) => DType::I64,
            (UINT, 8) => DType::U8,
            (UINT, 16) => DType::U16,
            (UINT, 32) => DType::U32,
            (UINT, 64) => DType::U64,
            (FLOAT, 16) => DType::F16,
            (FLOAT, 32) => DType::F32,
            (FLOAT, 64) => DType::F64,
            (BFLOAT, 16) => DType::BF16,
            _ => return Err(unsupported_dlpack(t)),
        })
    }
}

/// `from_dlpack`'s refusal, out of line: the accepted path stays small enough to inline.
#[cold]
#[inline(never)]
fn unsupported_dlpack(t: DLDataType) -> Error {
    Error::DType(format!(
        "unsupported DLPack dtype (code={}, bits={}, lanes={}); rivet supports {}",
        t.code,
        t.bits,
        t.lanes,
        DType::ALL.map(|d| d.name()).join(", ")
    ))
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<DType> for String {
    fn from(d: DType) -> String {
        d.name().to_string()
    }
}

impl TryFrom<String> for DType {
    type Error = Error;
    fn try_from(s: String) -> Result<DType> {
        s.parse()
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<DType> {
        let alias = match s {
            "float" => "float32",
            "double" => "float64",
            "half" => "float16",
            "int" => "int32",
            "long" => "int64",
            other => other,
        };
        DType::ALL
            .into_iter()
            .find(|d| d.name() == alias)
            .ok_or_else(|| {
                Error::DType(format!(
                    "unknown dtype '{s}'; expected one of {}",
                    DType::ALL.map(|d| d.name()).join(", ")
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_dlpack_and_names() {
        for d in DType::ALL {
            assert_eq!(DType::from_dlpack(d.to_dlpack()).unwrap(), d);
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            assert_eq!(d.to_string(), d.name());
        }
    }

    /// `from_dlpack`'s match accepts exactly the encodings `to_dlpack` makes, each as its
    /// dtype, over every code and size (and one lane count besides 1).
    #[test]
    fn from_dlpack_is_to_dlpacks_inverse_everywhere() {
        for code in 0..=u8::MAX {
            for bits in 0..=u8::MAX {
                for lanes in [1, 2] {
                    let t = DLDataType { code, bits, lanes };
                    let want = DType::ALL.into_iter().find(|d| {
                        let e = d.to_dlpack();
                        (e.code, e.bits, e.lanes) == (code, bits, lanes)
                    });
                    match (DType::from_dlpack(t), want) {
                        (Ok(d), Some(w)) => assert_eq!(d, w),
                        (Err(Error::DType(_)), None) => {}
                        (got, want) => panic!("{code}/{bits}/{lanes}: {got:?} vs {want:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn rejects_vector_and_exotic_types() {
        let mut t = DType::F32.to_dlpack();
        t.lanes = 4;
        assert!(matches!(DType::from_dlpack(t), Err(Error::DType(_))));
        let c = DLDataType {
            code: DLDataTypeCode::kDLComplex as u8,
            bits: 64,
            lanes: 1,
        };
        let e = DType::from_dlpack(c).unwrap_err().to_string();
        assert!(e.contains("code=5") && e.contains("bits=64"), "{e}");
        assert!("float17".parse::<DType>().is_err());
    }
}
