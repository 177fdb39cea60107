//! Escaping ids into store keys, shared by the providers whose keys are strings
//! (Redis, etcd): `%`, control characters and the characters a provider's key
//! layout reserves become `%XX` (one per UTF-8 byte), so no id can reach into
//! another's keys and [`unescape`] gets the id back. Other characters, ASCII or
//! not, stay as they are (keys written so far keep their names).

/// Escapes `%`, control characters and every character of `reserved` in `s` as
/// `%XX` (uppercase hex, one per UTF-8 byte).
pub fn escape(s: &str, reserved: &[char]) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '%' || reserved.contains(&c) || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Reverses [`escape`]: `None` for a malformed escape (a `%` not followed by two
/// hex digits) or bytes that are not UTF-8.
pub fn unescape(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(s.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_percent_and_controls_are_escaped_and_come_back() {
        for s in ["plain", "a/b:c{d}", "100%", "tab\there", "é/ü", "\u{85}"] {
            let e = escape(s, &['/', ':', '{', '}']);
            assert!(!e.contains(['/', ':', '{', '}']), "{e}");
            assert_eq!(unescape(&e).as_deref(), Some(s));
        }
        assert_eq!(escape("é:x", &['/']), "é:x", "only what is reserved");
        assert_eq!(escape("a/b", &['/']), "a%2Fb");
    }

    #[test]
    fn malformed_escapes_are_none() {
        for bad in ["%", "%2", "%zz", "%C3"] {
            assert_eq!(unescape(bad), None, "{bad}");
        }
    }
}
