//! [`Subject`]: who or what a limit or a lock applies to, escaped once for
//! every key it goes into.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use smol_str::SmolStr;

use crate::error::{Error, Result};

/// Encoded subjects longer than this many bytes are replaced by a digest.
pub const MAX_SUBJECT_LEN: usize = 128;

/// Who or what a limit or a lock applies to, already escaped for use in a key.
///
/// ```
/// use tollgate::Subject;
///
/// // Component splits never collide.
/// assert_ne!(
///     Subject::compound(["a:b", "c"]),
///     Subject::compound(["a", "b:c"]),
/// );
/// // Braces never leak into the hash tag.
/// assert_eq!(Subject::new("{x}").as_encoded(), "%7Bx%7D");
/// // Empty is not an empty tag.
/// assert!(!Subject::new("").as_encoded().is_empty());
/// ```
#[derive(Clone)]
pub struct Subject {
    /// Inline up to 23 bytes, else shared: making one allocates nothing
    /// for a short id, and a clone never copies a long one.
    encoded: SmolStr,
    /// A non-secret label the application gives (the throttled list shows
    /// it); not part of the identity.
    label: Option<Arc<str>>,
}

impl PartialEq for Subject {
    fn eq(&self, other: &Self) -> bool {
        self.encoded == other.encoded
    }
}

impl Eq for Subject {}

impl std::hash::Hash for Subject {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.encoded.hash(state);
    }
}

impl Subject {
    /// A subject made of one part.
    pub fn new(part: impl AsRef<[u8]>) -> Self {
        escaped(|out| escape_into(part.as_ref(), out))
    }

    /// A subject made of several parts (user id and route, say); each part is
    /// escaped on its own, so the split between parts is part of the identity.
    pub fn compound<I, P>(parts: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: AsRef<[u8]>,
    {
        escaped(|out| {
            for (i, part) in parts.into_iter().enumerate() {
                if i > 0 {
                    out.push(':');
                }
                escape_into(part.as_ref(), out);
            }
        })
    }

    fn plain(encoded: &str) -> Self {
        Subject {
            encoded: SmolStr::new(encoded),
            label: None,
        }
    }

    /// The subject whose id (its escaped form, [`as_encoded`](Self::as_encoded))
    /// is `id`, as the operator plane prints it. Errors with
    /// [`Error::InvalidConfig`] for a string
    /// no subject encodes to.
    ///
    /// ```
    /// use tollgate::Subject;
    ///
    /// let s = Subject::compound(["user 1", "a:b"]);
    /// assert_eq!(Subject::from_encoded(s.as_encoded()).unwrap(), s);
    /// assert!(Subject::from_encoded("a{b}").is_err());
    /// ```
    pub fn from_encoded(id: &str) -> Result<Self> {
        let bytes = id.as_bytes();
        let digest = id.strip_prefix("%h").is_some_and(|h| {
            h.len() == 32 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        });
        let mut i = 0;
        let mut valid = !bytes.is_empty() && id.len() <= MAX_SUBJECT_LEN;
        // An escape of a byte that escaping keeps as it is (`%40` for `@`):
        // no subject encodes to it, so it would name a key nobody checks.
        let mut needless = false;
        while valid && i < bytes.len() {
            let b = bytes[i];
            if b == b'%' {
                match bytes.get(i + 1..i + 3).and_then(hex_byte) {
                    Some(escaped) if is_plain(escaped) => needless = true,
                    Some(_) => {}
                    None => valid = false,
                }
                i += 3;
            } else {
                valid = b.is_ascii_graphic() && !matches!(b, b'{' | b'}');
                i += 1;
            }
        }
        if (valid && !needless) || id == "%e" || digest {
            Ok(Subject::plain(id))
        } else if valid {
            Err(Error::InvalidConfig(format!(
                "{id:?} is not a subject id: it escapes characters that subject ids keep as \
                 they are; did you mean {:?}?",
                unescape_plain(id)
            )))
        } else {
            Err(Error::InvalidConfig(format!(
                "{id:?} is not a subject id (the escaped form keys and the throttled list show)"
            )))
        }
    }

    /// The same subject with a label the operator plane shows beside its id
    /// (in the throttled list): something that tells an operator who it is
    /// without being a secret — never an API key or a token.
    pub fn with_label(mut self, label: impl Into<Arc<str>>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The label, if any.
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    fn finish(encoded: &str) -> Self {
        if encoded.is_empty() {
            // `%e` cannot come out of escaping (escapes are `%` + two upper-case hex digits).
            Subject::plain("%e")
        } else if encoded.len() > MAX_SUBJECT_LEN {
            let digest = Sha256::digest(encoded.as_bytes());
            Subject::plain(&format!("%h{}", hex(&digest[..16])))
        } else {
            Subject::plain(encoded)
        }
    }

    /// The escaped form used inside keys.
    pub fn as_encoded(&self) -> &str {
        &self.encoded
    }

    /// A short digest of the subject, for logs and traces that must not carry
    /// the raw value (an IP address, an API key).
    pub fn digest(&self) -> String {
        let digest = Sha256::digest(self.encoded.as_bytes());
        hex(&digest[..6])
    }
}

impl fmt::Debug for Subject {
    // Subjects may be personal data; debug output shows the digest only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Subject({})", self.digest())
    }
}

impl From<&str> for Subject {
    fn from(s: &str) -> Self {
        Subject::new(s)
    }
}

impl From<String> for Subject {
    fn from(s: String) -> Self {
        Subject::new(s)
    }
}

impl From<&String> for Subject {
    fn from(s: &String) -> Self {
        Subject::new(s)
    }
}

impl From<&Subject> for Subject {
    fn from(s: &Subject) -> Self {
        s.clone()
    }
}

impl From<IpAddr> for Subject {
    /// The address's usual text (`Display`), escaped like any other part,
    /// written without an intermediate `String` (this runs per request).
    fn from(ip: IpAddr) -> Self {
        match ip {
            // Digits and dots need no escaping, and at most 15 of them are
            // never empty nor long: the id is written in place.
            IpAddr::V4(v4) => {
                let mut text = [0u8; 15];
                let mut len = 0;
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text[len] = b'.';
                        len += 1;
                    }
                    len += write_decimal(&mut text[len..], octet);
                }
                let id = std::str::from_utf8(&text[..len]).expect("digits and dots");
                Subject {
                    encoded: SmolStr::new_inline(id),
                    label: None,
                }
            }
            IpAddr::V6(v6) => {
                use std::io::Write;
                // At most 45 bytes of text ("ffff:…:255.255.255.255").
                let mut buf = [0u8; 64];
                let mut cursor = std::io::Cursor::new(&mut buf[..]);
                let _ = write!(cursor, "{v6}");
                let len = cursor.position() as usize;
                Subject::new(&buf[..len])
            }
        }
    }
}

/// Writes `n` in decimal at the start of `out`; returns its length.
fn write_decimal(out: &mut [u8], n: u8) -> usize {
    let digits = [n / 100, n / 10 % 10, n % 10];
    let skip = if n >= 100 {
        0
    } else if n >= 10 {
        1
    } else {
        2
    };
    for (slot, d) in out.iter_mut().zip(&digits[skip..]) {
        *slot = b'0' + d;
    }
    3 - skip
}

/// The subject `write` escapes into this thread's buffer (one allocation:
/// the subject's own).
fn escaped(write: impl FnOnce(&mut String)) -> Subject {
    thread_local! {
        static BUF: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    let mut write = Some(write);
    let made = BUF.try_with(|cell| {
        let mut buf = cell.try_borrow_mut().ok()?;
        buf.clear();
        (write.take()?)(&mut buf);
        Some(Subject::finish(&buf))
    });
    match (made, write) {
        (Ok(Some(subject)), _) => subject,
        // The thread is exiting, or a subject is being made while one is.
        (_, Some(write)) => {
            let mut out = String::new();
            write(&mut out);
            Subject::finish(&out)
        }
        (_, None) => unreachable!("the buffer was borrowed, so the subject was made"),
    }
}

impl From<u64> for Subject {
    fn from(n: u64) -> Self {
        // Digits need no escaping (and 20 of them no digest).
        escaped(|out| {
            use std::fmt::Write;
            let _ = write!(out, "{n}");
        })
    }
}

/// Whether escaping keeps `b` as it is.
fn is_plain(b: u8) -> bool {
    b.is_ascii_graphic() && !matches!(b, b'{' | b'}' | b':' | b'%')
}

/// The byte an escape's two upper-case hex digits stand for.
fn hex_byte(digits: &[u8]) -> Option<u8> {
    let value = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'A'..=b'F' => Some(d - b'A' + 10),
        _ => None,
    };
    Some(value(digits[0])? << 4 | value(digits[1])?)
}

/// `id` with its needless escapes (of bytes kept as they are) undone: the
/// subject id an operator who escaped by hand most likely meant.
fn unescape_plain(id: &str) -> String {
    let bytes = id.as_bytes();
    let mut out = String::with_capacity(id.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes.get(i + 1..i + 3).and_then(hex_byte) {
            Some(b) if bytes[i] == b'%' && is_plain(b) => {
                out.push(char::from(b));
                i += 3;
            }
            _ => {
                out.push(char::from(bytes[i]));
                i += 1;
            }
        }
    }
    out
}

fn escape_into(bytes: &[u8], out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        let plain = is_plain(b);
        if plain {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 0xF) as usize] as char);
        }
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 0xF) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every id a subject encodes to parses back to that subject, and an
    /// escape no subject encodes to (`%40` for `@`, which subjects keep as
    /// it is) is refused, with the id the operator most likely meant.
    #[test]
    fn only_ids_a_subject_encodes_to_parse() {
        for b in 0..=255u8 {
            let s = Subject::new([b]);
            assert_eq!(
                Subject::from_encoded(s.as_encoded()).unwrap(),
                s,
                "byte {b}"
            );
        }
        let s = Subject::compound(["alice@example.com", "a:b%{c}"]);
        assert_eq!(Subject::from_encoded(s.as_encoded()).unwrap(), s);
        for needless in ["%41", "alice%40example.com", "a%2Eb"] {
            let e = Subject::from_encoded(needless).unwrap_err().to_string();
            assert!(e.contains("did you mean"), "{needless}: {e}");
        }
        let e = Subject::from_encoded("alice%40example.com%3A1").unwrap_err();
        assert!(e.to_string().contains(r#""alice@example.com%3A1""#), "{e}");
        for bad in ["%4", "%4g", "%zz", "a{b}", ""] {
            assert!(Subject::from_encoded(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn component_splits_never_collide() {
        let a = Subject::compound(["a:b", "c"]);
        let b = Subject::compound(["a", "b:c"]);
        let c = Subject::new("a:b:c");
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b, c);
        assert_ne!(Subject::compound(["", "x"]), Subject::compound(["x", ""]));
        assert_ne!(Subject::new("%3A"), Subject::new(":"));
    }

    #[test]
    fn long_subjects_are_digested_and_distinct() {
        let long_a = "a".repeat(200);
        let long_b = format!("{}b", "a".repeat(199));
        let (a, b) = (Subject::new(&long_a), Subject::new(&long_b));
        assert!(a.as_encoded().len() <= MAX_SUBJECT_LEN);
        assert!(a.as_encoded().starts_with("%h"));
        assert_ne!(a, b);
        assert_eq!(a, Subject::new(&long_a));
        // Exactly at the limit stays readable.
        let edge = "z".repeat(MAX_SUBJECT_LEN);
        assert_eq!(Subject::new(&edge).as_encoded(), edge);
        // A subject cannot impersonate a digest.
        assert_ne!(Subject::new(a.as_encoded()), a);
    }

    #[test]
    fn non_ascii_and_whitespace_are_escaped() {
        assert_eq!(Subject::new("a b").as_encoded(), "a%20b");
        assert_eq!(Subject::new("é").as_encoded(), "%C3%A9");
        assert_eq!(Subject::new("50%").as_encoded(), "50%25");
    }

    #[test]
    fn ip_subjects_match_the_escaped_display_form() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.255.9",
            "255.255.255.255",
            "::",
            "::1",
            "2001:db8::8a2e:370:7334",
            "::ffff:192.0.2.128",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ] {
            let addr: IpAddr = ip.parse().unwrap();
            assert_eq!(Subject::from(addr), Subject::new(addr.to_string()), "{ip}");
        }
        // Every octet value in every position.
        for n in 0..=255u8 {
            for octets in [[n, 0, 0, 0], [1, n, 2, 3], [9, 99, n, 199], [255, 10, 0, n]] {
                let addr = IpAddr::from(octets);
                assert_eq!(
                    Subject::from(addr),
                    Subject::new(addr.to_string()),
                    "{addr}"
                );
            }
        }
    }

    #[test]
    fn debug_does_not_leak_the_subject() {
        let s = Subject::new("secret-api-key");
        assert!(!format!("{s:?}").contains("secret"));
    }
}
