//! Property tests of key encoding ([`Subject`], [`Keyspace`]) through the
//! public APIs that make keys: [`Keyspace::key`], [`RateLimiter::keys_for`],
//! [`Locker::keys_for`], [`Semaphore::keys_for`] (fair: queue and tickets
//! too, and release markers) and [`IdempotencyStore::keys_for`].
//!
//! - any bytes (or parts) → an encoding of printable ASCII without braces,
//!   never empty, at most [`MAX_SUBJECT_LEN`] bytes, that decodes back to
//!   the input (or is a digest), so distinct subjects never share a key;
//! - near misses (a `:` moved between parts, a part replaced by its own
//!   encoding, one byte changed) never collide, digested or not;
//! - every key one operation touches has the subject's encoding as its
//!   Redis Cluster hash tag, so all of them hash to one slot (CRC16, as
//!   `redis::cluster_routing::Slot` computes it): no CROSSSLOT is possible;
//! - two keyspaces give one key only when `prefix:policy` reads the same
//!   (the documented rule), and limiters with different policy names never
//!   share a key;
//! - `Keyspace::new` never panics and refuses exactly what the docs say.
//!
//! Case count: proptest's default (256), or `PROPTEST_CASES`.

use proptest::prelude::*;
use redis::cluster_routing::Slot;
use tollgate_core::idempotency::IdempotencyStore;
use tollgate_core::keyspace::MAX_SUBJECT_LEN;
use tollgate_core::Subject;
use tollgate_core::{Algorithm, Keyspace, Locker, MemoryBackend, Quota, RateLimiter, Semaphore};

// ---------------------------------------------------------------- model --

/// Bytes kept as they are by the encoding; every other byte is `%XX`.
fn plain(b: u8) -> bool {
    b.is_ascii_graphic() && !matches!(b, b'{' | b'}' | b':' | b'%')
}

fn escaped_len(part: &[u8]) -> usize {
    part.iter().map(|&b| if plain(b) { 1 } else { 3 }).sum()
}

/// The inverse of the escaping of one part; `None` if `s` is not an
/// escaping's output.
fn decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'A'..=b'F' => Some(c - b'A' + 10),
                _ => None,
            };
            let (hi, lo) = (hex(*b.get(i + 1)?)?, hex(*b.get(i + 2)?)?);
            let byte = hi << 4 | lo;
            if plain(byte) {
                return None; // never escaped: not canonical
            }
            out.push(byte);
            i += 3;
        } else if plain(b[i]) {
            out.push(b[i]);
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

/// The hash tag Redis Cluster hashes: between the first `{` and the first
/// `}` after it, when not empty.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

fn is_digest(enc: &str) -> bool {
    enc.len() == 34
        && enc.starts_with("%h")
        && enc[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks the shape of an encoding, and returns its parts decoded (`None`
/// for a digest).
fn check_encoding(enc: &str) -> Result<Option<Vec<Vec<u8>>>, TestCaseError> {
    prop_assert!(!enc.is_empty());
    prop_assert!(enc.len() <= MAX_SUBJECT_LEN, "{enc}");
    prop_assert!(enc.bytes().all(|b| b.is_ascii_graphic()), "{enc}");
    prop_assert!(!enc.contains(['{', '}']), "{enc}");
    if is_digest(enc) {
        return Ok(None);
    }
    if enc == "%e" {
        return Ok(Some(vec![Vec::new()]));
    }
    let parts: Option<Vec<Vec<u8>>> = enc.split(':').map(decode).collect();
    prop_assert!(parts.is_some(), "{enc} is neither an escaping nor a digest");
    Ok(parts)
}

// ----------------------------------------------------------- strategies --

/// Bytes rich in what the encoding treats specially, sometimes past the
/// digest threshold.
fn bytes() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        3 => prop::sample::select(b"{}:%ehH3A7B7D ".to_vec()),
        2 => any::<u8>(),
        2 => prop::sample::select(b"abcxyz019".to_vec()),
    ];
    prop_oneof![
        3 => prop::collection::vec(byte.clone(), 0..24),
        1 => prop::collection::vec(byte, 24..140),
    ]
}

fn parts() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(bytes(), 1..5)
}

/// A valid prefix or policy name: printable, no braces, no whitespace;
/// `:` and `%` included so that splits can collide.
fn component() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            prop::sample::select(vec!['a', 'b', ':', '%', 'é']),
            (0x21u8..0x7f).prop_map(|b| if b == b'{' || b == b'}' {
                '_'
            } else {
                char::from(b)
            }),
        ],
        1..8,
    )
    .prop_map(|v| v.into_iter().collect())
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(vec![
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ])
}

/// A near miss of `p`: a `:` moved across a part boundary, parts merged
/// with a `:`, a part replaced by its own encoding, a byte changed, an
/// empty part added.
fn near_miss(p: &[Vec<u8>], how: u8, at: usize, byte: u8) -> Vec<Vec<u8>> {
    let mut q = p.to_vec();
    let i = at % q.len();
    match how % 5 {
        0 if q.len() > 1 => {
            let next = q.remove((i + 1) % q.len());
            let j = i % q.len();
            let part = &mut q[j];
            part.push(b':');
            part.extend(next);
        }
        1 => {
            let enc = Subject::new(&q[i]).as_encoded().as_bytes().to_vec();
            q[i] = enc;
        }
        2 if !q[i].is_empty() => {
            let j = at % q[i].len();
            q[i][j] ^= byte | 1;
        }
        3 => q.insert(i, Vec::new()),
        _ => q[i].push(byte),
    }
    q
}

// ----------------------------------------------------------- properties --

proptest! {
    /// Any bytes: a tag-safe encoding that decodes back to them, or a
    /// digest exactly when the escaping is longer than the limit.
    #[test]
    fn subjects_encode_reversibly(b in bytes()) {
        let enc = Subject::new(&b);
        let decoded = check_encoding(enc.as_encoded())?;
        let long = escaped_len(&b) > MAX_SUBJECT_LEN;
        prop_assert_eq!(decoded.is_none(), long, "{}", enc.as_encoded());
        if let Some(parts) = decoded {
            prop_assert_eq!(parts, vec![b.clone()]);
        }
        // From the same bytes through `&str` when they are UTF-8.
        if let Ok(s) = std::str::from_utf8(&b) {
            prop_assert_eq!(Subject::from(s), enc);
        }
    }

    /// Any parts: the compound encoding decodes back to the same parts
    /// (the split is part of the identity), or is a digest.
    #[test]
    fn compounds_encode_reversibly(p in parts()) {
        let enc = Subject::compound(&p);
        let decoded = check_encoding(enc.as_encoded())?;
        let len: usize = p.iter().map(|x| escaped_len(x)).sum::<usize>() + p.len() - 1;
        prop_assert_eq!(decoded.is_none(), len > MAX_SUBJECT_LEN);
        if let Some(parts) = decoded {
            prop_assert_eq!(parts, p);
        }
    }

    /// Near misses never collide, digested or not.
    #[test]
    fn distinct_subjects_never_collide(
        p in parts(), how in any::<u8>(), at in any::<usize>(), byte in any::<u8>()
    ) {
        let q = near_miss(&p, how, at, byte);
        if p != q {
            prop_assert_ne!(Subject::compound(&p), Subject::compound(&q));
        }
        if p.len() == 1 && q.len() == 1 && p != q {
            prop_assert_ne!(Subject::new(&p[0]), Subject::new(&q[0]));
        }
        // A compound of two or more parts is never a one-part subject.
        if p.len() > 1 {
            let joined = p.join(&b':');
            prop_assert_ne!(Subject::compound(&p), Subject::new(&joined));
        }
    }

    /// Every key one operation touches carries the subject's encoding as
    /// its hash tag, so all of them are in one slot.
    #[test]
    fn an_operations_keys_share_one_slot(
        prefix in component(),
        policy in component(),
        subject in bytes(),
        algorithm in algorithm(),
        quotas in 1usize..4,
        permits in 1u32..5,
        token in "[0-9a-f]{32}",
    ) {
        let s = Subject::new(&subject);
        let enc = s.as_encoded();
        let slot = Slot::for_key(enc);
        let mut groups: Vec<Vec<String>> = Vec::new();

        let mut b = RateLimiter::builder(MemoryBackend::new(), algorithm)
            .prefix(&prefix)
            .name(&policy);
        for i in 0..quotas {
            b = b.quota(Quota::new(10 + i as u64, std::time::Duration::from_secs(1 + i as u64)).unwrap());
        }
        let limiter = b.build().unwrap();
        groups.push(limiter.keys_for(&s));

        let locker = Locker::builder(MemoryBackend::new()).prefix(&prefix).build().unwrap();
        let k = locker.keys_for(s.clone());
        groups.push(vec![k.lock.clone(), k.fence.clone(), k.release_marker(&token)]);

        let sem = Semaphore::builder(MemoryBackend::new(), permits)
            .prefix(&prefix)
            .fair()
            .build()
            .unwrap();
        let k = sem.keys_for(s.clone());
        groups.push(vec![k.lock.clone(), k.fence.clone(), k.queue(), k.tickets(), k.release_marker(&token)]);

        let store = IdempotencyStore::builder(MemoryBackend::new()).prefix(&prefix).build().unwrap();
        let k = store.keys_for(&s);
        groups.push(vec![k.record.clone(), k.lease.lock.clone(), k.lease.fence.clone()]);

        let ks = Keyspace::new(&prefix, &policy).unwrap();
        groups.push(vec![ks.key(&s, None), ks.key(&s, Some("fence")), ks.key(&s, Some("q0"))]);

        for keys in groups {
            prop_assert!(!keys.is_empty());
            for key in &keys {
                prop_assert_eq!(hash_tag(key), Some(enc), "{}", key);
                prop_assert_eq!(Slot::for_key(key), slot, "{}", key);
            }
        }
    }

    /// Two keys are equal only when `prefix:policy`, the subject and the
    /// suffix are; limiters with other policy names never share a key.
    #[test]
    fn keys_collide_only_as_documented(
        a in (component(), component(), bytes(), prop::option::of("[a-z0-9:]{1,6}")),
        b in (component(), component(), bytes(), prop::option::of("[a-z0-9:]{1,6}")),
        algorithm in algorithm(),
    ) {
        let key = |(p, q, s, x): &(String, String, Vec<u8>, Option<String>)| {
            Keyspace::new(p, q).unwrap().key(&Subject::new(s), x.as_deref())
        };
        let same = format!("{}:{}", a.0, a.1) == format!("{}:{}", b.0, b.1)
            && Subject::new(&a.2) == Subject::new(&b.2)
            && a.3 == b.3;
        prop_assert_eq!(key(&a) == key(&b), same, "{} / {}", key(&a), key(&b));

        // The same prefix, other policy names: no key in common.
        if a.1 != b.1 {
            let limiter = |policy: &str| {
                RateLimiter::builder(MemoryBackend::new(), algorithm)
                    .prefix(&a.0)
                    .name(policy)
                    .quota(Quota::per_second(5))
                    .quota(Quota::per_hour(50))
                    .build()
                    .unwrap()
            };
            let s = Subject::new(&a.2);
            let (ka, kb) = (limiter(&a.1).keys_for(&s), limiter(&b.1).keys_for(&s));
            prop_assert!(ka.iter().all(|k| !kb.contains(k)), "{:?} / {:?}", ka, kb);
        }
    }

    /// `Keyspace::new` never panics; it refuses exactly empty components
    /// and those with braces, whitespace or control characters.
    #[test]
    fn keyspace_validation(prefix in "\\PC{0,6}|.{0,6}", policy in "\\PC{0,6}|.{0,6}") {
        let valid = |s: &str| {
            !s.is_empty()
                && !s.chars().any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
        };
        prop_assert_eq!(
            Keyspace::new(&prefix, &policy).is_ok(),
            valid(&prefix) && valid(&policy)
        );
    }
}
