//! Key encoding: `<prefix>:<policy>[:<kind>]:{<subject>}[:<suffix>]`.
//!
//! A kind says what state lives under the key: rate limiters put their
//! algorithm's short name there (`tollgate:api:gcra:{alice}`), so two
//! algorithms under one name never read each other's state; locks,
//! semaphores and idempotency records have none (`tollgate:lock:{orders}`)
//! and their policy names (`lock`, `sem`, `idem`) are not algorithm names.
//! Prefixes, policies and kinds hold no braces, so two keys can be equal
//! only if everything before `{` is; its last `:`-separated part is an
//! algorithm in a rate key and `lock`, `sem` or `idem` in any other, so no
//! rate key is ever a lock's, a semaphore's or an idempotency record's.
//!
//! The subject (user id, IP, route, …) is escaped so that
//! - no two different subjects, and no two splits of a compound subject, map to
//!   the same key (`"a:b" + "c"` ≠ `"a" + "b:c"`): `:` inside a part is escaped;
//! - braces in user input never change the Redis Cluster hash tag: `{` and `}`
//!   are escaped, and prefixes and policy names may not contain them;
//! - an empty subject never yields an empty tag (`{}` would hash the whole key);
//! - subjects longer than [`MAX_SUBJECT_LEN`] bytes are replaced by a digest.
//!
//! Every key of one check shares the subject's hash tag, so multi-key scripts
//! never fail with `CROSSSLOT` on a cluster.

mod subject;

pub(crate) use self::subject::hex;
pub use self::subject::{Subject, MAX_SUBJECT_LEN};
use crate::error::{Error, Result};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tollgate";

/// Checks a prefix or policy name: non-empty, printable, no braces (they would
/// move the hash tag), no whitespace.
pub(crate) fn validate_component(what: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::InvalidConfig(format!("{what} must not be empty")));
    }
    if let Some(c) = value
        .chars()
        .find(|c| matches!(c, '{' | '}') || c.is_whitespace() || c.is_control())
    {
        return Err(Error::InvalidConfig(format!(
            "{what} {value:?} contains {c:?}; braces, whitespace and control characters are not allowed in keys"
        )));
    }
    Ok(())
}

/// Policy names the operator plane writes keys under (`<prefix>:throttled:{…}`,
/// `<prefix>:traffic:{…}`): no capability may take them.
const RESERVED_POLICIES: [&str; 2] = ["throttled", "traffic"];

/// Where a family of keys lives: a prefix and a policy name.
///
/// ```
/// use tollgate::{Keyspace, Subject};
///
/// let ks = Keyspace::new("app", "login").unwrap();
/// assert_eq!(ks.key(&Subject::new("alice"), None), "app:login:{alice}");
/// assert_eq!(ks.key(&Subject::new("alice"), Some("fence")), "app:login:{alice}:fence");
/// assert!(Keyspace::new("a{b", "p").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyspace {
    prefix: String,
    policy: String,
}

impl Keyspace {
    /// A keyspace under `prefix` for `policy`; both are validated.
    pub fn new(prefix: impl Into<String>, policy: impl Into<String>) -> Result<Self> {
        let (prefix, policy) = (prefix.into(), policy.into());
        validate_component("prefix", &prefix)?;
        validate_component("policy name", &policy)?;
        if RESERVED_POLICIES.contains(&policy.as_str()) {
            return Err(Error::InvalidConfig(format!(
                "{policy:?} names the operator plane's own keys; choose another name"
            )));
        }
        Ok(Self { prefix, policy })
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The policy name.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The key for `subject`, with an optional suffix after the hash tag.
    pub fn key(&self, subject: &Subject, suffix: Option<&str>) -> String {
        self.build(None, subject, suffix)
    }

    /// The key for `subject` of state of one `kind` (a rate limiter's
    /// algorithm): `<prefix>:<policy>:<kind>:{<subject>}[:<suffix>]`. `kind`
    /// is one of the crate's own names (no braces, no colon).
    pub(crate) fn key_of(&self, kind: &str, subject: &Subject, suffix: Option<&str>) -> String {
        debug_assert!(!kind.contains([':', '{', '}']), "{kind}");
        self.build(Some(kind), subject, suffix)
    }

    fn build(&self, kind: Option<&str>, subject: &Subject, suffix: Option<&str>) -> String {
        let mut key = String::with_capacity(
            self.prefix.len()
                + self.policy.len()
                + kind.map_or(0, |k| k.len() + 1)
                + subject.as_encoded().len()
                + 8
                + suffix.map_or(0, str::len),
        );
        self.write(kind, subject, suffix, &mut key);
        key
    }

    /// What every key of `kind` starts with, up to its subject:
    /// `<prefix>:<policy>:<kind>:{`. Made once, it writes a key per check
    /// in one copy ([`write_key_after`](Self::write_key_after)).
    pub(crate) fn head_of(&self, kind: &str) -> String {
        let mut head = String::new();
        self.write_head(Some(kind), &mut head);
        head
    }

    /// The key of `subject` after `head` (from [`head_of`](Self::head_of)),
    /// appended to `key`: [`key_of`](Self::key_of) without a suffix, written
    /// into a buffer the caller keeps (no allocation per check).
    pub(crate) fn write_key_after(head: &str, subject: &Subject, key: &mut String) {
        key.reserve(head.len() + subject.as_encoded().len() + 1);
        key.push_str(head);
        key.push_str(subject.as_encoded());
        key.push('}');
    }

    fn write_head(&self, kind: Option<&str>, key: &mut String) {
        key.push_str(&self.prefix);
        key.push(':');
        key.push_str(&self.policy);
        if let Some(k) = kind {
            key.push(':');
            key.push_str(k);
        }
        key.push_str(":{");
    }

    fn write(&self, kind: Option<&str>, subject: &Subject, suffix: Option<&str>, key: &mut String) {
        // One allocation, not one per push that outgrows the buffer.
        let parts = [
            Some(self.prefix.as_str()),
            Some(self.policy.as_str()),
            kind,
            suffix,
        ];
        key.reserve(
            parts.iter().flatten().map(|p| p.len() + 2).sum::<usize>()
                + subject.as_encoded().len()
                + 2,
        );
        self.write_head(kind, key);
        key.push_str(subject.as_encoded());
        key.push('}');
        if let Some(s) = suffix {
            key.push(':');
            key.push_str(s);
        }
    }
}

/// The part of `key` Redis Cluster hashes: between the first `{` and the
/// next `}` when that is not empty, else the whole key. Every key tollgate
/// writes has one (`{<subject>}`), so the keys of one operation share a slot.
/// A quick 64-bit hash of `bytes` (multiply-xor over whole words): for
/// choosing a shard or telling keys apart, never against crafted input.
pub(crate) fn quick_hash(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = seed;
    let mut mix = |word: u64| {
        h = (h ^ word).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 29;
    };
    // Whole words read directly (a copy of unknown length is a memcpy
    // call); the tail zero-padded, with its length so that "a" and "a\0"
    // differ.
    let words = bytes.chunks_exact(8);
    let tail = words.remainder();
    for word in words {
        mix(u64::from_le_bytes(word.try_into().expect("8 bytes")));
    }
    let mut word = [0u8; 8];
    word[..tail.len()].copy_from_slice(tail);
    mix(u64::from_le_bytes(word) ^ ((bytes.len() as u64) << 56));
    h
}

pub(crate) fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(key: &str) -> &str {
        let t = hash_tag(key);
        assert_ne!(t, key, "{key} has a hash tag");
        t
    }

    /// A key written after its head is the key `key_of` builds, appended
    /// to what the buffer held.
    #[test]
    fn a_key_after_its_head_is_the_key() {
        let ks = Keyspace::new("p", "q").unwrap();
        for raw in ["u1", "{evil}", "a:{b}", ""] {
            let subject = Subject::new(raw);
            for kind in ["gcra", "block"] {
                let mut key = String::from("held ");
                Keyspace::write_key_after(&ks.head_of(kind), &subject, &mut key);
                assert_eq!(key, ["held ", &ks.key_of(kind, &subject, None)].concat());
            }
        }
    }

    #[test]
    fn braces_never_change_the_hash_tag() {
        let ks = Keyspace::new("p", "q").unwrap();
        for raw in ["{evil}", "}{", "a{b}c", "{", "}", "{}"] {
            let s = Subject::new(raw);
            let key = ks.key(&s, Some("fence"));
            assert_eq!(tag(&key), s.as_encoded(), "{raw}");
            assert!(!tag(&key).contains('{') && !tag(&key).contains('}'));
        }
        assert!(Keyspace::new("p{", "q").is_err());
        assert!(Keyspace::new("p", "}q").is_err());
        assert!(Keyspace::new("", "q").is_err());
        assert!(Keyspace::new("p", "a b").is_err());
    }

    #[test]
    fn empty_subject_has_a_non_empty_tag() {
        let ks = Keyspace::new("p", "q").unwrap();
        let key = ks.key(&Subject::new(""), None);
        assert!(!tag(&key).is_empty());
        assert_ne!(Subject::new(""), Subject::new("e"));
        assert_ne!(Subject::new(""), Subject::new("%e"));
    }

    #[test]
    fn kinds_keep_keys_apart_in_one_hash_tag() {
        let ks = Keyspace::new("t", "api").unwrap();
        let s = Subject::new("alice");
        assert_eq!(ks.key_of("gcra", &s, None), "t:api:gcra:{alice}");
        assert_eq!(ks.key_of("fw", &s, Some("q1")), "t:api:fw:{alice}:q1");
        assert_ne!(ks.key_of("gcra", &s, None), ks.key_of("tb", &s, None));
        assert_ne!(ks.key_of("gcra", &s, None), ks.key(&s, None));
        assert_eq!(tag(&ks.key_of("swl", &s, Some("r:00"))), "alice");
    }

    #[test]
    fn policies_keep_keys_apart() {
        let s = Subject::new("alice");
        let a = Keyspace::new("t", "tb-1").unwrap().key(&s, None);
        let b = Keyspace::new("t", "tb-2").unwrap().key(&s, None);
        assert_ne!(a, b);
    }
}
