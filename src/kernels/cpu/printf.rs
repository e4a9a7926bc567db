//! C's `printf` conversions of numbers and strings (`%d`, `%f`, `%e`, `%g`, `%s` with the flags
//! `-+ 0#`, a width and a precision), as glibc writes them: TensorFlow's `AsString` builds such
//! a format from its attrs, and its tensor summaries write floats with `%.*g`.
//!
//! Rust's own float formatting is exact and rounds ties to even, as glibc does, so `%f` and
//! `%e` are Rust's digits in C's layout (`1.50e+00`, not `1.5e0`); `%g` picks between them by
//! the decimal exponent after rounding, as C specifies.

/// The flags, width and precision of one conversion.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Spec {
    /// `-`: pad on the right.
    pub left: bool,
    /// `+`: a sign on positive numbers too.
    pub plus: bool,
    /// ` `: a space where a positive number has no sign.
    pub space: bool,
    /// `0`: pad numbers with zeros after the sign.
    pub zero: bool,
    /// `#`: `%g` keeps its trailing zeros, `%f`/`%e` their point.
    pub alt: bool,
    /// The minimum width.
    pub width: usize,
    /// The precision (`None`: the conversion's default).
    pub precision: Option<usize>,
}

impl Spec {
    /// A spec with one flag character (`AsString`'s `fill`): `-`, `+`, ` `, `0` or `#`.
    pub fn with_flag(mut self, flag: Option<u8>) -> Self {
        match flag {
            Some(b'-') => self.left = true,
            Some(b'+') => self.plus = true,
            Some(b' ') => self.space = true,
            Some(b'0') => self.zero = true,
            Some(b'#') => self.alt = true,
            _ => {}
        }
        self
    }

    fn sign(&self, negative: bool) -> &'static str {
        if negative {
            "-"
        } else if self.plus {
            "+"
        } else if self.space {
            " "
        } else {
            ""
        }
    }

    /// `sign` and `digits` padded to the width; zeros go between them when `zeros` allows.
    fn pad(&self, sign: &str, digits: &str, zeros: bool) -> String {
        let len = sign.len() + digits.len();
        let fill = self.width.saturating_sub(len);
        if self.left {
            format!("{sign}{digits}{}", " ".repeat(fill))
        } else if self.zero && zeros {
            format!("{sign}{}{digits}", "0".repeat(fill))
        } else {
            format!("{}{sign}{digits}", " ".repeat(fill))
        }
    }
}

/// `%d` (`%lld`).
pub(super) fn int(v: i64, spec: &Spec) -> String {
    spec.pad(spec.sign(v < 0), &v.unsigned_abs().to_string(), true)
}

/// `%s`: the bytes, padded to the width (`0` pads with spaces, as glibc does).
pub(super) fn string(s: &[u8], spec: &Spec) -> Vec<u8> {
    let fill = vec![b' '; spec.width.saturating_sub(s.len())];
    if spec.left {
        [s, &fill].concat()
    } else {
        [&fill, s].concat()
    }
}

/// A float conversion: `%f`, `%e` or `%g`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Conv {
    Fixed,
    Exp,
    General,
}

/// `%f`, `%e` or `%g` of `v` under `spec`.
pub(super) fn float(v: f64, spec: &Spec, conv: Conv) -> String {
    let sign = spec.sign(v.is_sign_negative());
    if v.is_nan() {
        return spec.pad(sign, "nan", false);
    }
    if v.is_infinite() {
        return spec.pad(sign, "inf", false);
    }
    let a = v.abs();
    let digits = match conv {
        Conv::Fixed => fixed(a, spec.precision.unwrap_or(6), spec.alt),
        Conv::Exp => exp(a, spec.precision.unwrap_or(6), spec.alt),
        Conv::General => general(a, spec.precision.unwrap_or(6), spec.alt),
    };
    spec.pad(sign, &digits, true)
}

fn fixed(a: f64, precision: usize, alt: bool) -> String {
    let mut s = format!("{a:.precision$}");
    if alt && precision == 0 {
        s.push('.');
    }
    s
}

/// `%e` of a non-negative finite `a`: Rust's `1.50e0` as C's `1.50e+00`.
fn exp(a: f64, precision: usize, alt: bool) -> String {
    let s = format!("{a:.precision$e}");
    let (mantissa, e) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    let point = if alt && precision == 0 { "." } else { "" };
    let esign = if e < 0 { '-' } else { '+' };
    format!("{mantissa}{point}e{esign}{:02}", e.unsigned_abs())
}

/// `%g` of a non-negative finite `a`.
fn general(a: f64, precision: usize, alt: bool) -> String {
    let p = precision.max(1);
    // The exponent %e would show at precision p - 1, after its rounding.
    let e_form = format!("{a:.*e}", p - 1);
    let x: i64 = e_form
        .split_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .unwrap_or(0);
    let mut s = if x < p as i64 && x >= -4 {
        fixed(a, (p as i64 - 1 - x) as usize, alt)
    } else {
        exp(a, p - 1, alt)
    };
    if !alt {
        s = strip_zeros(&s);
    }
    s
}

/// Drops the trailing zeros of the fraction (and a point left alone), keeping any exponent.
fn strip_zeros(s: &str) -> String {
    let (mantissa, rest) = match s.find('e') {
        Some(i) => s.split_at(i),
        None => (s, ""),
    };
    if !mantissa.contains('.') {
        return s.to_string();
    }
    let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
    format!("{mantissa}{rest}")
}

/// TensorFlow's `FloatToBuffer`: `%.6g`, or `%.9g` when that does not read back as `v`.
pub(super) fn shortest_f32(v: f32) -> String {
    if v.is_nan() {
        return if v.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    let spec = |p| Spec {
        precision: Some(p),
        ..Spec::default()
    };
    let short = float(f64::from(v), &spec(6), Conv::General);
    if short.parse::<f32>().ok() == Some(v) {
        short
    } else {
        float(f64::from(v), &spec(9), Conv::General)
    }
}

/// TensorFlow's `DoubleToBuffer`: `%.15g`, or `%.17g` when that does not read back as `v`.
pub(super) fn shortest_f64(v: f64) -> String {
    if v.is_nan() {
        return if v.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    let spec = |p| Spec {
        precision: Some(p),
        ..Spec::default()
    };
    let short = float(v, &spec(15), Conv::General);
    if short.parse::<f64>().ok() == Some(v) {
        short
    } else {
        float(v, &spec(17), Conv::General)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(flag: Option<u8>, width: usize, precision: Option<usize>) -> Spec {
        Spec {
            width,
            precision,
            ..Spec::default()
        }
        .with_flag(flag)
    }

    #[test]
    fn conversions_read_as_glibcs() {
        let plain = Spec::default();
        assert_eq!(float(0.5, &plain, Conv::Fixed), "0.500000");
        assert_eq!(float(-0.0, &plain, Conv::Fixed), "-0.000000");
        assert_eq!(
            float(2.5, &spec(Some(b'-'), 6, Some(0)), Conv::Fixed),
            "2     "
        );
        assert_eq!(
            float(-0.25, &spec(Some(b'0'), 8, Some(1)), Conv::Fixed),
            "-00000.2"
        );
        assert_eq!(
            float(f64::NAN, &spec(Some(b'0'), 5, None), Conv::Fixed),
            "  nan"
        );
        assert_eq!(float(1e20, &spec(None, 0, Some(2)), Conv::Exp), "1.00e+20");
        assert_eq!(float(1.5e-300, &plain, Conv::Exp), "1.500000e-300");
        assert_eq!(float(123456789.0, &plain, Conv::General), "1.23457e+08");
        assert_eq!(float(0.0001, &plain, Conv::General), "0.0001");
        assert_eq!(float(0.00001, &plain, Conv::General), "1e-05");
        assert_eq!(
            float(123.456, &spec(None, 0, Some(0)), Conv::General),
            "1e+02"
        );
        assert_eq!(
            float(0.5, &spec(Some(b'#'), 0, None), Conv::General),
            "0.500000"
        );
        assert_eq!(int(-5, &spec(Some(b'0'), 4, None)), "-005");
        assert_eq!(int(333, &spec(Some(b'+'), 5, None)), " +333");
        assert_eq!(string(b"ab", &spec(Some(b'-'), 4, None)), b"ab  ");
    }

    #[test]
    fn summaries_write_the_shortest_of_two_precisions() {
        assert_eq!(shortest_f32(0.1), "0.1");
        assert_eq!(shortest_f32(1.0 / 3.0), "0.333333343");
        assert_eq!(shortest_f32(1e20), "1e+20");
        assert_eq!(shortest_f32(-0.0), "-0");
        assert_eq!(shortest_f64(1.0 / 3.0), "0.33333333333333331");
        assert_eq!(shortest_f64(0.1), "0.1");
    }
}
