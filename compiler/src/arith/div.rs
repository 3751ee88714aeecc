//! Python's floor division and modulo, the one definition every layer uses: the simplifier
//! folds constants with them, exact evaluation decides checks with them, and every backend's
//! scalar semantics (`codegen::cpu_lib::math`) are these functions.
//!
//! Integer `//` and `%` round toward negative infinity; a zero divisor gives 0 for both (no
//! trap, as generated code does), and `i64::MIN // -1` wraps. Float `//` is `floor(a / b)` and
//! `%` is `a - floor(a / b) * b`, from `libm` so that every backend agrees bit for bit.

pub fn floordiv_i64(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let q = a.wrapping_div(b);
    if (a.wrapping_rem(b) != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

pub fn floormod_i64(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let r = a.wrapping_rem(b);
    if r != 0 && ((r < 0) != (b < 0)) {
        r + b
    } else {
        r
    }
}

/// Python's float `//` and `%`: floor(a / b) and a - floor(a / b) * b.
pub fn floordiv_f64(a: f64, b: f64) -> f64 {
    libm::floor(a / b)
}
pub fn floormod_f64(a: f64, b: f64) -> f64 {
    a - libm::floor(a / b) * b
}
pub fn floordiv_f32(a: f32, b: f32) -> f32 {
    libm::floorf(a / b)
}
pub fn floormod_f32(a: f32, b: f32) -> f32 {
    a - libm::floorf(a / b) * b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_floor_semantics() {
        for (a, b) in [
            (7i64, 2i64),
            (-7, 2),
            (7, -2),
            (-7, -2),
            (6, 3),
            (-6, 3),
            (0, 5),
        ] {
            let (q, r) = (floordiv_i64(a, b), floormod_i64(a, b));
            assert_eq!(q * b + r, a, "{a} {b}");
            assert!(r == 0 || (r < 0) == (b < 0), "{a} % {b} = {r}");
        }
        assert_eq!((floordiv_i64(5, 0), floormod_i64(5, 0)), (0, 0));
        assert_eq!(floordiv_i64(i64::MIN, -1), i64::MIN);
        assert_eq!(floormod_f64(-7.0, 2.0), 1.0);
    }
}
