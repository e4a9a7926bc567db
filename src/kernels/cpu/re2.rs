//! RE2, as TensorFlow's regex kernels use it, on top of the `regex` crate: the pattern
//! syntax translated where the two differ, and RE2's `Replace` / `GlobalReplace` with its
//! rewrite strings (`\0` to `\9`, `\\`) reimplemented step for step.
//!
//! Where the syntaxes differ, the pattern is rewritten before `regex` compiles it:
//! - RE2's Perl classes and word boundaries are ASCII (`\d` is `[0-9]`, `\s` is
//!   `[\t\n\f\r ]`, `\w` is `[0-9A-Za-z_]`, `\b` between ASCII word and non-word bytes);
//!   `regex` makes them Unicode. They become the ASCII classes, inside brackets too.
//! - `\C` (any byte) becomes `(?s-u:.)`; `\Q...\E` becomes the escaped literal.
//! - `\<` and `\>` are literal `<` and `>` in RE2, word boundaries in `regex`; a `[` inside a
//!   class and `&&`, `--`, `~~` there are literals in RE2, nested classes and set operations
//!   in `regex`; a `{` that starts no repetition is a literal in RE2, an error in `regex`.
//!   All are escaped.
//!
//! What still differs: `regex` accepts a few things RE2 refuses (repetitions above 1000,
//! `(?x)` with `#` comments), so such patterns run here where TensorFlow fails with "Invalid
//! pattern"; and a bad pattern's explanation is `regex`'s words, after TensorFlow's
//! `Invalid pattern: <pattern>, error: `. Matching is leftmost-first in both, on bytes that
//! need not be UTF-8.

use regex::bytes::{CaptureLocations, Regex};

/// A compiled RE2 pattern.
pub(super) struct Re2 {
    regex: Regex,
}

impl Re2 {
    /// Compiles `pattern` (RE2 syntax); the error is TensorFlow's message.
    pub fn new(pattern: &str) -> std::result::Result<Self, String> {
        Regex::new(&translate(pattern))
            .map(|regex| Re2 { regex })
            .map_err(|e| {
                let why = e.to_string();
                let why = why.lines().last().unwrap_or_default().trim().to_string();
                format!("Invalid pattern: {pattern}, error: {why}")
            })
    }

    /// The number of capturing groups.
    fn groups(&self) -> usize {
        self.regex.captures_len() - 1
    }

    /// RE2's `Replace`: the first match rewritten; `None` (unchanged) when nothing matches or
    /// the rewrite names a group the pattern lacks or is malformed.
    pub fn replace(&self, s: &[u8], rewrite: &[u8]) -> Option<Vec<u8>> {
        if max_submatch(rewrite) > self.groups() {
            return None;
        }
        let mut locs = self.regex.capture_locations();
        let m = self.regex.captures_read(&mut locs, s)?;
        let mut out = s[..m.start()].to_vec();
        if !apply(&mut out, rewrite, &locs, s) {
            return None;
        }
        out.extend_from_slice(&s[m.end()..]);
        Some(out)
    }

    /// RE2's `GlobalReplace`: every match rewritten, an empty match right after the previous
    /// match skipped (one UTF-8 character, or one byte of invalid UTF-8); `None` (unchanged)
    /// when nothing matches or the rewrite names a group the pattern lacks.
    pub fn global_replace(&self, s: &[u8], rewrite: &[u8]) -> Option<Vec<u8>> {
        if max_submatch(rewrite) > self.groups() {
            return None;
        }
        let mut locs = self.regex.capture_locations();
        let mut out = Vec::with_capacity(s.len());
        let (mut p, mut last_end, mut count) = (0usize, None, 0usize);
        while p <= s.len() {
            let Some(m) = self.regex.captures_read_at(&mut locs, s, p) else {
                break;
            };
            out.extend_from_slice(&s[p..m.start()]);
            if m.start() == m.end() && last_end == Some(m.start()) {
                let n = char_len(&s[p..]);
                if p < s.len() {
                    out.extend_from_slice(&s[p..p + n]);
                }
                p += n;
                continue;
            }
            // A malformed rewrite keeps what it wrote up to the fault, as RE2 does.
            apply(&mut out, rewrite, &locs, s);
            p = m.end();
            last_end = Some(p);
            count += 1;
        }
        if count == 0 {
            return None;
        }
        if p < s.len() {
            out.extend_from_slice(&s[p..]);
        }
        Some(out)
    }
}

/// The length of the UTF-8 character `s` starts with; 1 for an invalid byte (or at the end).
fn char_len(s: &[u8]) -> usize {
    let n = match s.first() {
        Some(0xc2..=0xdf) => 2,
        Some(0xe0..=0xef) => 3,
        Some(0xf0..=0xf4) => 4,
        _ => 1,
    };
    if n > 1 && s.len() >= n && std::str::from_utf8(&s[..n]).is_ok() {
        n
    } else {
        1
    }
}

/// RE2's `MaxSubmatch`: the highest `\N` the rewrite names.
fn max_submatch(rewrite: &[u8]) -> usize {
    let mut max = 0;
    let mut i = 0;
    while i < rewrite.len() {
        if rewrite[i] == b'\\' {
            i += 1;
            if let Some(c) = rewrite.get(i).filter(|c| c.is_ascii_digit()) {
                max = max.max(usize::from(c - b'0'));
            }
        }
        i += 1;
    }
    max
}

/// RE2's `Rewrite`: appends `rewrite` with `\N` replaced by group N; false at a malformed
/// escape (what came before it stays appended).
fn apply(out: &mut Vec<u8>, rewrite: &[u8], locs: &CaptureLocations, s: &[u8]) -> bool {
    let mut i = 0;
    while i < rewrite.len() {
        let c = rewrite[i];
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        match rewrite.get(i) {
            Some(d) if d.is_ascii_digit() => {
                if let Some((a, b)) = locs.get(usize::from(d - b'0')) {
                    out.extend_from_slice(&s[a..b]);
                }
            }
            Some(b'\\') => out.push(b'\\'),
            _ => return false,
        }
        i += 1;
    }
    true
}

/// Rewrites an RE2 pattern into the `regex` crate's syntax (see the module doc).
fn translate(pattern: &str) -> String {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut in_class = false;
    // Where the current class's items start (after `[` or `[^`): a `]` there is a literal.
    let mut class_start = 0;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\\' if i + 1 < chars.len() => {
                let e = chars[i + 1];
                i += 2;
                if e == 'Q' {
                    let rest: String = chars[i..].iter().collect();
                    let (literal, after) = match rest.find("\\E") {
                        Some(k) => (&rest[..k], rest[k + 2..].chars().count()),
                        None => (rest.as_str(), 0),
                    };
                    out.push_str(&regex::escape(literal));
                    i = chars.len() - after;
                    continue;
                }
                out.push_str(&match (in_class, e) {
                    (false, 'd') => "[0-9]".to_string(),
                    (false, 'D') => "[^0-9]".to_string(),
                    (false, 's') => "[\\t\\n\\f\\r ]".to_string(),
                    (false, 'S') => "[^\\t\\n\\f\\r ]".to_string(),
                    (false, 'w') => "[0-9A-Za-z_]".to_string(),
                    (false, 'W') => "[^0-9A-Za-z_]".to_string(),
                    (false, 'b') => "(?-u:\\b)".to_string(),
                    (false, 'B') => "(?-u:\\B)".to_string(),
                    (false, 'C') => "(?s-u:.)".to_string(),
                    (true, 'd') => "0-9".to_string(),
                    (true, 's') => "\\t\\n\\f\\r ".to_string(),
                    (true, 'w') => "0-9A-Za-z_".to_string(),
                    (_, '<') => "<".to_string(),
                    (_, '>') => ">".to_string(),
                    (_, e) => format!("\\{e}"),
                });
                continue;
            }
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                i += 1;
                if chars.get(i) == Some(&'^') {
                    out.push('^');
                    i += 1;
                }
                class_start = i;
                continue;
            }
            '[' if chars.get(i + 1) == Some(&':') => {
                // A POSIX class, `[:alpha:]`: copied whole.
                let rest: String = chars[i..].iter().collect();
                match rest.find(":]") {
                    Some(k) => {
                        out.push_str(&rest[..k + 2]);
                        i += rest[..k + 2].chars().count();
                    }
                    None => {
                        out.push_str("\\[");
                        i += 1;
                    }
                }
                continue;
            }
            '[' => out.push_str("\\["),
            ']' if in_class && i == class_start => out.push_str("\\]"),
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            '&' | '~' if in_class => {
                out.push('\\');
                out.push(c);
            }
            '-' if in_class && chars.get(i + 1) == Some(&'-') => out.push_str("\\-"),
            '{' if !in_class && !is_repetition(&chars[i..]) => out.push_str("\\{"),
            _ => out.push(c),
        }
        i += 1;
    }
    out
}

/// Whether `s` (starting at a `{`) is a counted repetition: `{n}`, `{n,}` or `{n,m}`.
fn is_repetition(s: &[char]) -> bool {
    let Some(close) = s.iter().position(|&c| c == '}') else {
        return false;
    };
    let inner: String = s[1..close].iter().collect();
    let mut parts = inner.splitn(2, ',');
    let first = parts.next().unwrap_or_default();
    let digits = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit());
    digits(first) && parts.next().is_none_or(|m| m.is_empty() || digits(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn global(p: &str, s: &str, r: &str) -> String {
        let re = Re2::new(p).unwrap();
        let out = re.global_replace(s.as_bytes(), r.as_bytes());
        String::from_utf8(out.unwrap_or_else(|| s.as_bytes().to_vec())).unwrap()
    }

    #[test]
    fn global_replace_follows_re2() {
        assert_eq!(global("a*", "baaa", "-"), "-b-");
        assert_eq!(global("", "abc", "-"), "-a-b-c-");
        assert_eq!(global("", "é", "-"), "-é-");
        assert_eq!(
            global(r"(\w+)\s(\w+)", "héllo wörld 12", r"\2 \1 \\ \0 $1"),
            r"héw llo \ llo w $1ö12 rld \ rld 12 $1"
        );
        assert_eq!(global(r"\d", "x١٢3", "#"), "x١٢#");
        assert_eq!(global(r"a", "aaa", r"\1"), "aaa");
        assert_eq!(global(r"(a)", "aaa", "\\"), "");
        assert_eq!(global(r"\<", "ab", "-"), "ab");
        assert_eq!(global(r"[\d\s]", "a1 ١b", "."), "a..١b");
        assert_eq!(global(r"\b", "héllo", "|"), "|h|é|llo|");
        assert_eq!(global(r"a{", "a{", "-"), "-");
        assert_eq!(global(r"\Qa.b\E+", "a.bb a.b", "-"), "- -");
        let re = Re2::new("a").unwrap();
        assert_eq!(re.replace(b"aaa", b"b").unwrap(), b"baa");
        assert!(Re2::new("a(")
            .err()
            .unwrap()
            .starts_with("Invalid pattern: a(, error: "));
    }
}
