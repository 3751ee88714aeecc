//! `__cuda_array_interface__` (Numba's protocol, versions 2 and 3): what a producer's
//! dictionary says, checked and turned into a view description. The bindings read the
//! dictionary's fields; the driver gives the pointer's device (the protocol does not say it).
//!
//! Invariants: the typestr is one of the little-endian / byte-sized codes rivet has a dtype
//! for (`<f4`, `|u1`, `<b1`...; big-endian and unknown codes are refused); byte strides must
//! be multiples of the item size (rivet's strides are in elements); `mask` must be absent or
//! None; a v3 `stream` of 0 is refused (the protocol forbids it as ambiguous); the layout's
//! arithmetic is validated here (before the driver is asked about the pointer) and again,
//! with the address, by `Tensor::from_raw_parts`, as for every import.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{self, Dims};

/// The fields of one `__cuda_array_interface__` dictionary, as the bindings read them.
#[derive(Debug, Clone)]
pub struct Interface {
    pub version: i64,
    pub shape: Vec<i64>,
    pub typestr: String,
    pub data: u64,
    pub read_only: bool,
    /// Strides in bytes; `None`: C-contiguous.
    pub strides: Option<Vec<i64>>,
    /// Whether a non-None `mask` was given (masked arrays are not supported).
    pub masked: bool,
    /// v3: the stream the producer's pending work on the data is queued on.
    pub stream: Option<i64>,
}

/// A checked interface: what a view needs, less the device.
#[derive(Debug, Clone, PartialEq)]
pub struct Described {
    pub dtype: DType,
    pub shape: Dims,
    /// In elements.
    pub strides: Dims,
    pub data: u64,
    pub read_only: bool,
    /// The producer's stream to wait for (v3; `None`: nothing to wait for).
    pub stream: Option<u64>,
}

/// The dtype of a numpy-style type string (the inverse of `DType::typestr`, which also accepts
/// `<` for one-byte types: `<b1`, `<i1`, `<u1`); `what` names the producer in errors.
pub fn dtype_of_typestr(typestr: &str, what: &str) -> Result<DType> {
    let one_byte = typestr
        .strip_prefix('<')
        .filter(|code| code.ends_with('1'))
        .map(|code| format!("|{code}"));
    let canonical = one_byte.as_deref().unwrap_or(typestr);
    DType::ALL
        .into_iter()
        .find(|d| d.typestr() == Some(canonical))
        .ok_or_else(|| {
            Error::DType(format!(
                "{what}: __cuda_array_interface__ typestr '{typestr}' is not a dtype rivet supports; expected a little-endian bool, int, uint or float code such as '<f4', '<i8' or '|u1' (bfloat16 has no typestr: pass it through DLPack)"
            ))
        })
}

/// Checks an interface and converts its strides to elements.
pub fn describe(i: &Interface, what: &str) -> Result<Described> {
    let bad = |m: String| Error::DLPack(format!("{what}: __cuda_array_interface__ {m}"));
    if !(2..=3).contains(&i.version) {
        return Err(bad(format!(
            "version {} is not supported; rivet reads versions 2 and 3",
            i.version
        )));
    }
    if i.masked {
        return Err(bad(
            "has a mask; masked arrays are not supported (pass the data without its mask)".into(),
        ));
    }
    if i.shape.len() > layout::MAX_NDIM {
        return Err(bad(format!(
            "has {} dims; rivet supports at most {}",
            i.shape.len(),
            layout::MAX_NDIM
        )));
    }
    let dtype = dtype_of_typestr(&i.typestr, what)?;
    let size = dtype.size() as i64;
    let shape: Dims = i.shape.as_slice().into();
    let strides: Dims = match &i.strides {
        None => layout::compact_strides(&shape),
        Some(s) if s.len() != i.shape.len() => {
            return Err(bad(format!(
                "has {} strides for {} dims",
                s.len(),
                i.shape.len()
            )))
        }
        Some(s) => {
            if let Some(d) = s.iter().position(|b| b % size != 0) {
                return Err(bad(format!(
                    "stride {} bytes in dim {d} is not a multiple of the item size {size} of {dtype}; rivet needs element-aligned strides",
                    s[d]
                )));
            }
            s.iter().map(|b| b / size).collect()
        }
    };
    // The layout's arithmetic now, before anyone asks the driver about the pointer.
    layout::validate(&shape, &strides, dtype.size()).map_err(|e| match e {
        e @ (layout::LayoutError::NegativeDim { .. }
        | layout::LayoutError::TooManyElements { .. }) => {
            Error::Shape(format!("{what}: __cuda_array_interface__ {e}"))
        }
        e => bad(format!("describes an invalid layout: {e}")),
    })?;
    let stream = match i.stream {
        None => None,
        Some(0) => {
            return Err(bad(
                "stream is 0, which the protocol forbids (ambiguous); producers give 1 for the legacy default stream, 2 for the per-thread one".into(),
            ))
        }
        Some(s) if s < 0 => return Err(bad(format!("stream {s} is negative"))),
        Some(s) => Some(s as u64),
    };
    Ok(Described {
        dtype,
        shape,
        strides,
        data: i.data,
        read_only: i.read_only,
        stream,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface() -> Interface {
        Interface {
            version: 3,
            shape: vec![2, 3],
            typestr: "<f4".into(),
            data: 0x7000_0000,
            read_only: false,
            strides: None,
            masked: false,
            stream: None,
        }
    }

    #[test]
    fn compact_strided_and_refused() {
        let d = describe(&iface(), "x").unwrap();
        assert_eq!(
            (d.dtype, d.strides.as_slice()),
            (DType::F32, &[3i64, 1][..])
        );
        let mut t = iface();
        t.strides = Some(vec![4, 8]);
        assert_eq!(describe(&t, "x").unwrap().strides.as_slice(), &[1, 2]);
        t.strides = Some(vec![4, 6]);
        let e = describe(&t, "x").unwrap_err().to_string();
        assert!(e.contains("not a multiple of the item size 4"), "{e}");
        for (edit, want) in [
            (
                Box::new(|t: &mut Interface| t.typestr = ">f4".into()) as Box<dyn Fn(&mut _)>,
                "typestr '>f4'",
            ),
            (Box::new(|t: &mut Interface| t.version = 1), "version 1"),
            (Box::new(|t: &mut Interface| t.masked = true), "mask"),
            (
                Box::new(|t: &mut Interface| t.stream = Some(0)),
                "stream is 0",
            ),
            (
                Box::new(|t: &mut Interface| t.strides = Some(vec![4])),
                "1 strides for 2 dims",
            ),
        ] {
            let mut t = iface();
            edit(&mut t);
            let e = describe(&t, "x").unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let mut t = iface();
        t.stream = Some(1);
        assert_eq!(describe(&t, "x").unwrap().stream, Some(1));
    }

    #[test]
    fn typestrs_are_the_little_endian_codes_of_rivets_dtypes() {
        let accepted = [
            ("|b1", DType::Bool),
            ("<b1", DType::Bool),
            ("|i1", DType::I8),
            ("<i1", DType::I8),
            ("|u1", DType::U8),
            ("<u1", DType::U8),
            ("<i2", DType::I16),
            ("<u2", DType::U16),
            ("<i4", DType::I32),
            ("<u4", DType::U32),
            ("<i8", DType::I64),
            ("<u8", DType::U64),
            ("<f2", DType::F16),
            ("<f4", DType::F32),
            ("<f8", DType::F64),
        ];
        for (s, d) in accepted {
            assert_eq!(dtype_of_typestr(s, "x").unwrap(), d, "{s}");
        }
        for s in [
            "|i2", ">f4", "|f4", "<f1", "<1", "<", "", "<c8", "<V2", "<b2",
        ] {
            let e = dtype_of_typestr(s, "x").unwrap_err().to_string();
            assert!(e.contains(&format!("typestr '{s}'")), "{e}");
        }
    }
}
