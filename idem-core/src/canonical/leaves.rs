//! Writing leaves: escaped strings, integers, and numbers as RFC 8785 writes them.

use std::fmt;

use super::*;

// Leaves.

/// What RFC 8785 §3.2.2.2 escapes: 0 = nothing, `u` = `\u00xx`, else the letter after `\`.
pub(super) static ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0a] = b'n';
    t[0x0c] = b'f';
    t[0x0d] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

pub(super) const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether any of the 8 bytes of `w` is escaped: below 0x20, a quote or a backslash. Exact: the
/// has-zero-byte and has-byte-less-than tests of Sean Anderson's "Bit Twiddling Hacks" tell
/// whether such a byte exists (only its position may be wrong, which is not used).
pub(super) fn word_needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    (below_space | zero(w ^ (ONES * u64::from(b'"'))) | zero(w ^ (ONES * u64::from(b'\\')))) != 0
}

/// Appends the escaped contents of a string (without quotes). Only ASCII bytes are escaped, so
/// valid UTF-8 stays valid. Text is checked 8 bytes at a time (the last word overlapping the one
/// before); runs that need none are copied whole.
pub(super) fn escape_into(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut run = 0;
    let mut i = 0;
    loop {
        let clean = match bytes.get(i..i + 8) {
            Some(word) => !word_needs_escape(u64::from_le_bytes(word.try_into().unwrap_or([0; 8]))),
            // The last 8 bytes, overlapping some already checked: no copy of the tail.
            None if bytes.len() >= 8 => {
                let word = bytes.get(bytes.len() - 8..).unwrap_or_default();
                !word_needs_escape(u64::from_le_bytes(word.try_into().unwrap_or([0; 8])))
            }
            None => bytes.iter().skip(i).all(|&b| ESCAPE[usize::from(b)] == 0),
        };
        if clean {
            i += 8;
            if i < bytes.len() {
                continue;
            }
            out.extend_from_slice(&bytes[run..]);
            return;
        }
        let stop = (i + 8).min(bytes.len());
        for (j, &b) in bytes.iter().enumerate().take(stop).skip(i) {
            let e = ESCAPE[usize::from(b)];
            if e != 0 {
                out.extend_from_slice(&bytes[run..j]);
                write_escape(out, b, e);
                run = j + 1;
            }
        }
        i = stop;
        if i >= bytes.len() {
            out.extend_from_slice(&bytes[run..]);
            return;
        }
    }
}

/// A short string that needs no escape (member names, ids, codes: up to 16 bytes) quoted, in the
/// first `len` of 18 bytes; `None` for any other. Read with loads of a fixed size, overlapping
/// where the string is shorter than two of them, and checked as one or two words: no copy of a
/// variable length, which would be a call.
fn short_quoted(bytes: &[u8]) -> Option<([u8; SHORT + 2], usize)> {
    let n = bytes.len();
    // Spaces need no escape: the bytes after the string's pass the check.
    let mut buf = [b' '; SHORT + 2];
    let word =
        |b: &[u8]| u64::from_le_bytes(b.get(..8).and_then(|w| w.try_into().ok()).unwrap_or([0; 8]));
    match n {
        8..=SHORT => {
            let (head, tail) = (bytes.get(..8)?, bytes.get(n - 8..)?);
            if word_needs_escape(word(head)) || word_needs_escape(word(tail)) {
                return None;
            }
            buf.get_mut(1..9)?.copy_from_slice(head);
            buf.get_mut(n - 7..=n)?.copy_from_slice(tail);
        }
        4..=7 => {
            buf.get_mut(1..5)?.copy_from_slice(bytes.get(..4)?);
            buf.get_mut(n - 3..=n)?.copy_from_slice(bytes.get(n - 4..)?);
            if word_needs_escape(word(buf.get(1..9)?)) {
                return None;
            }
        }
        1..=3 => {
            // The first, middle and last bytes are all of them.
            buf[1] = bytes[0];
            buf[n / 2 + 1] = bytes[n / 2];
            buf[n] = bytes[n - 1];
            if word_needs_escape(word(buf.get(1..9)?)) {
                return None;
            }
        }
        0 => {}
        _ => return None,
    }
    buf[0] = b'"';
    buf[n + 1] = b'"';
    Some((buf, n + 2))
}

/// The longest string [`short_quoted`] writes.
const SHORT: usize = 16;

fn write_escape(out: &mut Vec<u8>, b: u8, e: u8) {
    if e == b'u' {
        out.extend_from_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(b >> 4)],
            HEX[usize::from(b & 0xf)],
        ]);
    } else {
        out.extend_from_slice(&[b'\\', e]);
    }
}

/// Appends a string with its quotes and escapes.
pub(super) fn write_str(out: &mut Vec<u8>, bytes: &[u8]) {
    if let Some((quoted, len)) = short_quoted(bytes) {
        // A copy of a fixed size (inline, no call), then what followed the string cut off.
        let end = out.len() + len;
        out.extend_from_slice(&quoted);
        out.truncate(end);
        return;
    }
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    escape_into(out, bytes);
    out.push(b'"');
}

pub(super) fn write_int<I: itoa::Integer>(out: &mut Vec<u8>, v: I) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// 2^53: every integer of smaller magnitude is exactly one double.
pub(super) const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_992.0;

pub(super) fn write_f64(out: &mut Vec<u8>, v: f64) -> Result<(), Fail> {
    if !v.is_finite() {
        let name = if v.is_nan() {
            "NaN"
        } else if v > 0.0 {
            "inf"
        } else {
            "-inf"
        };
        return Err(Fail::new(Kind::NonFinite(name)));
    }
    if v == 0.0 {
        // ECMAScript prints -0 as "0".
        out.push(b'0');
    } else if v.fract() == 0.0 && v.abs() < MAX_SAFE_INTEGER {
        // Fast path for whole amounts: below 2^53 every integer is a double one unit or less
        // from its neighbours, so its shortest round-trip digits are its exact decimal digits,
        // which is what Number::toString prints for values below 1e21.
        write_int(out, v as i64);
    } else {
        out.extend_from_slice(ryu_js::Buffer::new().format_finite(v).as_bytes());
    }
    Ok(())
}

/// `fmt::Write` into the output, escaping as a JSON string body.
pub(super) struct Escaping<'a>(pub(super) &'a mut Vec<u8>);

impl fmt::Write for Escaping<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        escape_into(self.0, s.as_bytes());
        Ok(())
    }
}

/// `fmt::Write` into a byte buffer, unescaped.
pub(super) struct Bytes<'a>(pub(super) &'a mut Vec<u8>);

impl fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// The first number in `text` (valid JSON) that the canonical form would write as another
/// number: read as serde_json reads it (an integer within `u64` / `i64` exactly, anything else
/// as the nearest `f64`), written back (ECMAScript's shortest digits), and compared by decimal
/// value with the text's own digits. `1.0`, `1e2`, `0.1` and `-0` are exact; `18446744073709551617`
/// and `1.000000000000000001` are not (each shares its float with other numbers). `None` when
/// every number is exact.
pub(super) fn inexact_number(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => {
                // A string: skipped to its closing quote, escapes included.
                i += 1;
                while let Some(&c) = bytes.get(i) {
                    i += if c == b'\\' { 2 } else { 1 };
                    if c == b'"' {
                        break;
                    }
                }
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while bytes
                    .get(i)
                    .is_some_and(|c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                {
                    i += 1;
                }
                let number = text.get(start..i).unwrap_or_default();
                if !number_is_exact(number) {
                    return Some(number);
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// Whether the JSON number `number` is written by the canonical form as the same decimal value.
fn number_is_exact(number: &str) -> bool {
    let digits = number.strip_prefix('-').unwrap_or(number);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        let exact = if number.starts_with('-') {
            number.parse::<i64>().is_ok()
        } else {
            digits.parse::<u64>().is_ok()
        };
        if exact {
            return true;
        }
    }
    let Ok(float) = number.parse::<f64>() else { return false };
    let mut written = Vec::new();
    if write_f64(&mut written, float).is_err() {
        return false;
    }
    let written = std::str::from_utf8(&written).unwrap_or_default();
    matches!((decimal(number), decimal(written)), (Some(a), Some(b)) if a == b)
}

/// A JSON number's decimal value as (negative, significant digits, power of ten): `-1.50e2` is
/// `(true, "15", 1)`; zero is `(false, "", 0)` whatever its sign. `None` for an exponent beyond
/// `i64`.
fn decimal(number: &str) -> Option<(bool, String, i64)> {
    let (negative, unsigned) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (unsigned, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all: String = format!("{int}{frac}");
    let significant = all.trim_start_matches('0');
    if significant.is_empty() {
        return Some((false, String::new(), 0));
    }
    let exponent: i64 = match exponent {
        Some(e) => e.strip_prefix('+').unwrap_or(e).parse().ok()?,
        None => 0,
    };
    let trimmed = significant.trim_end_matches('0');
    let zeros = i64::try_from(significant.len() - trimmed.len()).ok()?;
    let scale = exponent.checked_sub(i64::try_from(frac.len()).ok()?)?.checked_add(zeros)?;
    Some((negative, trimmed.to_owned(), scale))
}
