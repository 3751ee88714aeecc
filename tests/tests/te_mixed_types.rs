//! Numbers mixed with expressions in the Rust DSL: every case of `tests/mixed_types.txt`, the
//! table that `tests/python/test_mixed_types.py` runs through the Python DSL, so both languages
//! are seen to refuse and accept the same cases (`i * 0.5` is an error in both, never `i * 0`).

use rivet_compiler::ir::expr::{BinOp, CmpOp, ExprKind};
use rivet_compiler::ir::Expr;
use rivet_compiler::te::{self, Number, Operand};
use rivet_compiler::Error;
use rivet_runtime::DType;

const TABLE: &str = include_str!("../mixed_types.txt");

struct Case {
    line: usize,
    dtype: DType,
    op: String,
    number: Number,
    lhs: bool,
    expect: String,
}

fn parse_number(s: &str) -> Number {
    match s {
        "true" => Number::Bool(true),
        "false" => Number::Bool(false),
        _ if s.contains(['.', 'e', 'n']) => Number::Float(s.parse().expect("a float")),
        _ => Number::Int(s.parse().expect("an int")),
    }
}

fn cases() -> Vec<Case> {
    TABLE
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|(n, l)| {
            let f: Vec<&str> = l.split('|').map(str::trim).collect();
            assert_eq!(f.len(), 5, "line {}: {l}", n + 1);
            Case {
                line: n + 1,
                dtype: f[0].parse().expect("a dtype"),
                op: f[1].to_string(),
                number: parse_number(f[2]),
                lhs: match f[3] {
                    "lhs" => true,
                    "rhs" => false,
                    other => panic!("line {}: side {other}", n + 1),
                },
                expect: f[4].to_string(),
            }
        })
        .collect()
}

/// An error of a checked builder, or the `Invalid` node an operator leaves in the expression.
fn outcome(r: Result<Expr, Error>) -> Result<Expr, String> {
    let e = r.map_err(|e| e.to_string())?;
    match e.kind() {
        ExprKind::Invalid(m) => Err(m.clone()),
        _ => Ok(e),
    }
}

/// `x op n` through the Rust operators where they exist (the numbers' `impl Add<f64> for
/// Expr`, ...), through the DSL's functions otherwise.
fn rhs(op: &str, x: Expr, n: Number) -> Result<Expr, Error> {
    let operator = |x: Expr| -> Option<Expr> {
        let apply = |f: fn(Expr, f64) -> Expr, g: fn(Expr, i64) -> Expr| match n {
            Number::Float(v) => Some(f(x.clone(), v)),
            Number::Int(v) => Some(g(x.clone(), v)),
            Number::Bool(_) => None,
        };
        match op {
            "add" => apply(|a, b| a + b, |a, b| a + b),
            "sub" => apply(|a, b| a - b, |a, b| a - b),
            "mul" => apply(|a, b| a * b, |a, b| a * b),
            "div" => apply(|a, b| a / b, |a, b| a / b),
            "mod" => apply(|a, b| a % b, |a, b| a % b),
            _ => None,
        }
    };
    match operator(x.clone()) {
        Some(e) => Ok(e),
        None => func(op, x.into(), n.into()),
    }
}

/// `a op b` through the DSL's functions (the body functions carry their error in the
/// expression: `te::check` reports it).
fn func(op: &str, a: Operand, b: Operand) -> Result<Expr, Error> {
    let body = |e: Expr| te::check(e);
    match op {
        "add" => te::binary(BinOp::Add, a, b),
        "sub" => te::binary(BinOp::Sub, a, b),
        "mul" => te::binary(BinOp::Mul, a, b),
        "div" => te::binary(BinOp::Div, a, b),
        "mod" => body(te::floormod(a, b)),
        "floordiv" => body(te::floordiv(a, b)),
        "pow" => body(te::pow(a, b)),
        "max" => body(te::maximum(a, b)),
        "min" => body(te::minimum(a, b)),
        "lt" => te::compare(CmpOp::Lt, a, b),
        "eq" => te::compare(CmpOp::Eq, a, b),
        "and" => body(te::all(a, b)),
        "or" => body(te::any(a, b)),
        other => panic!("unknown op {other}"),
    }
}

#[test]
fn rust_dsl_follows_the_shared_table() {
    let cases = cases();
    assert!(cases.len() > 40, "the table was read");
    let mut failures = Vec::new();
    for c in &cases {
        let x = te::placeholder([4], c.dtype, "X").unwrap().at([0]);
        let got = if c.lhs {
            outcome(func(&c.op, c.number.into(), x.into()))
        } else {
            outcome(rhs(&c.op, x, c.number))
        };
        let ok = match (c.expect.strip_prefix("error: "), &got) {
            (Some(part), Err(m)) => m.contains(part),
            (None, Ok(e)) => {
                let (dt, printed) = match c.expect.split_once(" = ") {
                    Some((d, p)) => (d, Some(p)),
                    None => (c.expect.as_str(), None),
                };
                e.dtype().to_string() == dt && printed.is_none_or(|p| e.to_string() == p)
            }
            _ => false,
        };
        if !ok {
            let got = match &got {
                Ok(e) => format!("{} {e}", e.dtype()),
                Err(m) => format!("error: {m}"),
            };
            failures.push(format!(
                "line {}: {} {} {:?} ({}): expected {}, got {got}",
                c.line,
                c.dtype,
                c.op,
                c.number,
                if c.lhs { "lhs" } else { "rhs" },
                c.expect
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn refusals_name_the_operation_the_operand_and_both_dtypes() {
    let i = te::var("i");
    let Err(m) = outcome(Ok(&i * 0.5)) else {
        panic!("i * 0.5 was accepted")
    };
    for part in [
        "Mul",
        "float 0.5",
        "int64 constant",
        "the other operand, i, is int64",
    ] {
        assert!(m.contains(part), "{part:?} not in {m}");
    }
    let x = te::placeholder([4], DType::I8, "X").unwrap();
    let Err(m) = outcome(Ok(x.at([0]) + 300)) else {
        panic!("X[0] + 300 was accepted on int8")
    };
    for part in ["Add", "int 300", "does not fit in int8", "X[0]"] {
        assert!(m.contains(part), "{part:?} not in {m}");
    }
}

#[test]
fn compute_reports_a_float_number_in_an_index() {
    let a = te::placeholder([8], DType::F32, "A").unwrap();
    let r = te::compute([4], |[i]| a.at([i * 0.5]), "B");
    match r {
        Err(Error::Compile(m)) => {
            assert!(
                m.contains("compute 'B'") && m.contains("cannot be used as a int64"),
                "{m}"
            )
        }
        other => panic!("expected a CompileError, got {other:?}"),
    }
    // An integral float is the int: `i * 2.0` indexes like `i * 2`.
    let b = te::compute([4], |[i]| a.at([i * 2.0]), "B").unwrap();
    assert_eq!(b.body().unwrap().to_string(), "A[(i * 2)]");
}
