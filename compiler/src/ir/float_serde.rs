//! How a float constant is written in a module file: a JSON number when finite (as before this
//! module existed, so older files read the same), else the string `"inf"`, `"-inf"` or
//! `"nan"`. JSON has no infinities: serde_json wrote them as `null` and could not read them
//! back, so a saved max reduction (its `-inf` start) made an unloadable file.
//!
//! Invariants: every finite f64 round-trips bit for bit (serde_json prints the shortest
//! representation that parses back to the same value); infinities keep their sign; a NaN
//! reads back as the canonical quiet NaN (payload bits are not kept: no rivet operation reads
//! them). Any other string, or a value of another JSON type, is a decode error. Finite values
//! parse back exactly because serde_json is built with `float_roundtrip` (its default parser
//! could be one ulp off: 1.5e-300 was).

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};
use std::fmt;

pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.is_finite() {
        s.serialize_f64(*v)
    } else if v.is_nan() {
        s.serialize_str("nan")
    } else if *v > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_str("-inf")
    }
}

struct FloatVisitor;

impl Visitor<'_> for FloatVisitor {
    type Value = f64;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number, or \"inf\", \"-inf\" or \"nan\"")
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        match v {
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            "nan" => Ok(f64::NAN),
            _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    d.deserialize_any(FloatVisitor)
}

#[cfg(test)]
mod tests {
    use crate::ir::expr::Const;

    #[test]
    fn non_finite_constants_round_trip_and_finite_ones_are_plain_numbers() {
        for v in [
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            1.5e-300,
            f64::MAX,
            f64::MIN,
        ] {
            let text = serde_json::to_string(&Const::Float(v)).unwrap();
            let back: Const = serde_json::from_str(&text).unwrap();
            match back {
                Const::Float(b) => assert_eq!(b.to_bits(), v.to_bits(), "{text}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            serde_json::to_string(&Const::Float(1.5)).unwrap(),
            r#"{"Float":1.5}"#
        );
        assert_eq!(
            serde_json::to_string(&Const::Float(f64::NEG_INFINITY)).unwrap(),
            r#"{"Float":"-inf"}"#
        );
        let nan: Const = serde_json::from_str(r#"{"Float":"nan"}"#).unwrap();
        assert!(matches!(nan, Const::Float(v) if v.is_nan()));
        // Files written before: a finite number, or an integer-looking one.
        let old: Const = serde_json::from_str(r#"{"Float":2}"#).unwrap();
        assert!(matches!(old, Const::Float(v) if v == 2.0));
        for bad in [
            r#"{"Float":null}"#,
            r#"{"Float":"infinity"}"#,
            r#"{"Float":[1]}"#,
        ] {
            assert!(serde_json::from_str::<Const>(bad).is_err(), "{bad}");
        }
    }
}
