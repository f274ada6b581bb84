//! How the repeats report writes numbers, times, operation keys and CSV cells. The
//! rules are the ones the Ruby gem's report printed before the core owned it (Ruby's
//! `Float#round` and `Float#to_s`, `Time#iso8601`, `String#inspect`, the `csv`
//! library's quoting), so both bindings print the same text byte for byte.

use chrono::DateTime;

/// `value` rounded to `digits` decimal places (0 to 14), half away from zero, the way
/// Ruby's `Float#round(digits)` rounds: a value too large to have such digits is kept,
/// a positive one too small to reach them reads 0.0.
pub fn round(value: f64, digits: i32) -> f64 {
    if value == 0.0 || !value.is_finite() {
        return value;
    }
    let binexp = binary_exponent(value);
    if digits
        >= 17
            - if binexp > 0 {
                binexp / 4
            } else {
                binexp / 3 - 1
            }
    {
        return value;
    }
    if value > 0.0
        && digits
            < -(if binexp > 0 {
                binexp / 3 + 1
            } else {
                binexp / 4
            })
    {
        return 0.0;
    }
    let s = 10f64.powi(digits);
    let mut f = (value * s).round();
    if value > 0.0 {
        if (f + 0.5) / s <= value {
            f += 1.0;
        }
    } else if (f - 0.5) / s >= value {
        f -= 1.0;
    }
    f / s
}

/// C's `frexp` exponent: `value` = m × 2^e with 0.5 ≤ |m| < 1.
fn binary_exponent(value: f64) -> i32 {
    let bits = value.abs().to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    if biased == 0 {
        // subnormal: the exponent of its highest set bit
        let mantissa = bits & ((1 << 52) - 1);
        -1022 - (mantissa.leading_zeros() as i32 - 12)
    } else {
        biased - 1022
    }
}

/// A number as Ruby's `Float#to_s` writes it: the shortest digits that read back as
/// the same number, `.0` on a whole number (`3600.0`), and exponent form outside
/// 0.0001 ≤ |value| < 10^15 (`1.0e-05`, `1.0e+15`).
pub fn float(value: f64) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let magnitude = value.abs();
    if magnitude != 0.0 && !(1e-4..1e15).contains(&magnitude) {
        let text = format!("{value:e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let exponent: i32 = exponent.parse().unwrap_or(0);
        let point = if mantissa.contains('.') { "" } else { ".0" };
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{mantissa}{point}e{sign}{:02}", exponent.abs());
    }
    let text = format!("{value}");
    if text.contains('.') {
        text
    } else {
        text + ".0"
    }
}

/// Epoch seconds as ISO 8601 UTC text with `fraction` digits (0 or 6), truncated as
/// Ruby's `Time#iso8601` truncates the exact value: `2025-12-01T00:07:30Z`,
/// `2025-12-01T01:00:00.000000Z`. None outside the years chrono can write.
pub fn iso8601(seconds: f64, fraction: usize) -> Option<String> {
    if !seconds.is_finite() {
        return None;
    }
    let whole = seconds.floor();
    let micros = micros_of(seconds - whole); // exact: whole and seconds are close
    let time = DateTime::from_timestamp(whole as i64, 0)?;
    let head = time.format("%Y-%m-%dT%H:%M:%S");
    Some(if fraction == 0 {
        format!("{head}Z")
    } else {
        format!("{head}.{micros:06}Z")
    })
}

/// The whole microseconds of `fraction` (0 ≤ fraction < 1), its exact binary value
/// truncated.
fn micros_of(fraction: f64) -> u64 {
    if fraction <= 0.0 {
        return 0;
    }
    let bits = fraction.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i64;
    let (mantissa, exponent) = if biased == 0 {
        (bits & ((1 << 52) - 1), -1074)
    } else {
        ((bits & ((1 << 52) - 1)) | (1 << 52), biased - 1075)
    };
    // fraction = mantissa × 2^exponent, exponent < 0 for a fraction below 1
    let shift = -exponent;
    if shift >= 128 {
        return 0;
    }
    ((u128::from(mantissa) * 1_000_000) >> shift) as u64
}

/// Text in double quotes as Ruby's `String#inspect` writes it: `"` and `\` escaped,
/// `\#` before `{`, `$` and `@`, `\n`, `\t`, `\e`… for the C0 controls that have a
/// name and `\u0000`-style escapes for the other controls (C0, DEL, C1), the line and
/// paragraph separators and the noncharacters (`\u{10FFFF}` above U+FFFF); everything
/// else as it is. (Ruby also escapes code points Unicode has not assigned yet; C1
/// controls are escaped here where Ruby writes some as they are.)
pub fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '#' if matches!(chars.peek(), Some('{' | '$' | '@')) => out.push_str("\\#"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0c' => out.push_str("\\f"),
            '\x0b' => out.push_str("\\v"),
            '\x08' => out.push_str("\\b"),
            '\x07' => out.push_str("\\a"),
            '\x1b' => out.push_str("\\e"),
            c if escaped(c) && u32::from(c) < 0x10000 => {
                out.push_str(&format!("\\u{:04X}", u32::from(c)));
            }
            c if escaped(c) => out.push_str(&format!("\\u{{{:X}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A name in the text report (a job type, producer or job class): written as it is
/// when it is plain, else [`quoted`], so a name cannot forge report lines or list
/// items. Plain: not empty, no leading or trailing whitespace, and nothing [`quoted`]
/// escapes (controls such as a newline, `"`, `\`, the line separators) nor the report's
/// own separators `,` and `;`.
pub fn named(text: &str) -> String {
    let plain = !text.is_empty()
        && text.trim() == text
        && !text
            .chars()
            .any(|c| escaped(c) || matches!(c, '"' | '\\' | ',' | ';'));
    if plain {
        text.to_owned()
    } else {
        quoted(text)
    }
}

fn escaped(c: char) -> bool {
    let n = u32::from(c);
    c.is_control()
        || c == '\u{2028}'
        || c == '\u{2029}'
        || (0xFDD0..=0xFDEF).contains(&n)
        || n & 0xFFFE == 0xFFFE
}

/// A text cell that a spreadsheet would read as a formula — it starts with `=`, `+`,
/// `-`, `@`, a tab or a carriage return (OWASP's CSV injection list) — gets a leading
/// single quote, so an operation key or producer such as `=HYPERLINK(…)` opens as text.
pub fn neutralised(cell: &str) -> String {
    if cell.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{cell}")
    } else {
        cell.to_owned()
    }
}

/// One CSV field as Ruby's `csv` library writes it: absent as nothing, an empty text
/// as `""`, a text holding `,`, `"`, CR or LF in double quotes (its quotes doubled),
/// anything else as it is.
pub fn csv_field(cell: Option<&str>) -> String {
    match cell {
        None => String::new(),
        Some("") => "\"\"".into(),
        Some(c) if c.contains([',', '"', '\r', '\n']) => format!("\"{}\"", c.replace('"', "\"\"")),
        Some(c) => c.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_numbers_as_ruby_does() {
        for (value, text) in [
            (3600.0, "3600.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (0.5, "0.5"),
            (0.0001, "0.0001"),
            (0.00001, "1.0e-05"),
            (9.99e-5, "9.99e-05"),
            (999_999_999_999_999.0, "999999999999999.0"),
            (1e15, "1.0e+15"),
            (1_234_567_890_123_456.0, "1.234567890123456e+15"),
        ] {
            assert_eq!(float(value), text, "{value}");
        }
        assert_eq!(round(0.05, 1), 0.1);
        assert_eq!(round(0.25, 1), 0.3);
        assert_eq!(round(2.675, 2), 2.68);
        assert_eq!(round(-0.04, 1) + 0.0, 0.0);
        assert_eq!(round(1e-10, 6), 0.0);
        assert_eq!(round(3_599.999_999_5, 6), 3600.0);
    }

    #[test]
    fn writes_times_truncated_as_ruby_does() {
        let t0 = 1_764_547_200.0;
        assert_eq!(
            iso8601(t0 + 0.01, 6).unwrap(),
            "2025-12-01T00:00:00.009999Z"
        );
        assert_eq!(iso8601(t0 + 1.2, 6).unwrap(), "2025-12-01T00:00:01.200000Z");
        assert_eq!(
            iso8601(t0 + 0.000001, 6).unwrap(),
            "2025-12-01T00:00:00.000000Z"
        );
        assert_eq!(iso8601(t0 + 450.9, 0).unwrap(), "2025-12-01T00:07:30Z");
        assert_eq!(iso8601(f64::NAN, 0), None);
    }

    #[test]
    fn quotes_keys_as_ruby_inspects_them() {
        assert_eq!(quoted("1"), r#""1""#);
        assert_eq!(quoted("a#{b}#c#$x#@y#"), r#""a\#{b}#c\#$x\#@y#""#);
        assert_eq!(
            quoted("\x1b\0\x0b\x0c\x07\x08\"\\"),
            r#""\e\u0000\v\f\a\b\"\\""#
        );
        assert_eq!(
            quoted("\x7f\u{2028}\u{10FFFF}"),
            r#""\u007F\u2028\u{10FFFF}""#
        );
        assert_eq!(quoted("é☃\u{a0}😀"), "\"é☃\u{a0}😀\"");
    }

    #[test]
    fn writes_plain_names_as_they_are_and_quotes_the_others() {
        assert_eq!(named("Billing::Charge"), "Billing::Charge");
        assert_eq!(named("orders-api é"), "orders-api é");
        assert_eq!(named("a\nb"), r#""a\nb""#);
        assert_eq!(named("a, b"), r#""a, b""#);
        assert_eq!(named("x;y"), r#""x;y""#);
        assert_eq!(named(""), r#""""#);
        assert_eq!(named(" lead"), r#"" lead""#);
        assert_eq!(named("say \"hi\""), r#""say \"hi\"""#);
    }

    #[test]
    fn quotes_csv_fields_and_neutralises_formulas() {
        assert_eq!(csv_field(None), "");
        assert_eq!(csv_field(Some("")), r#""""#);
        assert_eq!(csv_field(Some("a,b")), r#""a,b""#);
        assert_eq!(csv_field(Some("say \"hi\"")), r#""say ""hi""""#);
        assert_eq!(csv_field(Some("plain")), "plain");
        assert_eq!(neutralised("=1+1"), "'=1+1");
        assert_eq!(neutralised("\rcmd"), "'\rcmd");
        assert_eq!(neutralised("a=b"), "a=b");
    }
}
