//! Who holds what: the description every lock and permit holder leaves
//! beside its owner token (`host:pid` and since when), and what a store
//! reports of it ([`LockHolder`], [`LockBackend::lock_holders`](super::LockBackend::lock_holders)).

use std::sync::OnceLock;
use std::time::Duration;

use super::fence::FencingToken;

/// One holder of a lock, or of a semaphore name's permits, as the store
/// keeps it: what an operator's listing shows.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockHolder {
    /// The keyspace policy of the locker or semaphore (`lock`, `sem`, …).
    pub name: String,
    /// The subject (the lock's name) as it appears in keys
    /// ([`Subject::as_encoded`](crate::Subject::as_encoded)).
    pub subject: String,
    /// Stored as permits (a semaphore, or a fair lock), not as a lock.
    pub permits: bool,
    /// The fence the holder was given.
    pub fence: FencingToken,
    /// Who holds it: `host:pid` of the process that acquired it.
    pub holder: String,
    /// How many permits it holds (1 for a lock).
    pub weight: u32,
    /// How long it has held, by the store's clock.
    pub held: Duration,
    /// How long its lease still runs unless renewed.
    pub ttl: Duration,
}

impl LockHolder {
    pub(crate) fn new(name: &str, subject: &str, permits: bool, fence: u64) -> Self {
        LockHolder {
            name: name.to_owned(),
            subject: subject.to_owned(),
            permits,
            fence: FencingToken(fence),
            holder: String::new(),
            weight: 1,
            held: Duration::ZERO,
            ttl: Duration::ZERO,
        }
    }
}

/// This process, as a holder describes itself: `host:pid`. The host name is
/// the kernel's (`/proc/sys/kernel/hostname`), else `HOSTNAME` or
/// `COMPUTERNAME`, else `unknown`; read once.
pub(crate) fn this_process() -> &'static str {
    static DESCRIPTION: OnceLock<String> = OnceLock::new();
    DESCRIPTION.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::env::var("COMPUTERNAME").ok())
            .map(|h| {
                // The description's fields are `|`-separated: keep the host
                // name to one printable field.
                h.trim()
                    .chars()
                    .map(|c| if c == '|' || c.is_control() { '_' } else { c })
                    .collect::<String>()
            })
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "unknown".to_owned());
        format!("{host}:{}", std::process::id())
    })
}

/// `(name, subject)` of a lock or semaphore key under `prefix`:
/// `<prefix>:<name>:{<subject>}` with a name holding no `:` (a rate
/// limiter's keys carry their algorithm there, and the keys of a longer
/// prefix such as `<prefix>:x` are not this prefix's) and a non-empty
/// subject. `None` for any other key.
pub(crate) fn parse_lock_key<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, &'k str)> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(':')?;
    let (name, tagged) = rest.split_once(":{")?;
    let subject = tagged.strip_suffix('}')?;
    let valid = !name.is_empty()
        && !name.contains([':', '{', '}'])
        && !subject.is_empty()
        && !subject.contains(['{', '}']);
    valid.then_some((name, subject))
}

/// The parts of a holder's description: `(fence, since_ms, weight,
/// holder)`. A lock's value carries `fence|since_ms|holder` after its token
/// (weight 1); a permit holder's key `fence|since_ms|weight|holder`. `None`
/// for anything else.
pub(crate) fn parse_description(text: &str, permits: bool) -> Option<(u64, u64, u32, &str)> {
    let mut parts = text.splitn(if permits { 4 } else { 3 }, '|');
    let fence = parts.next()?.parse().ok()?;
    let since = parts.next()?.parse().ok()?;
    let weight = if permits {
        parts.next()?.parse().ok()?
    } else {
        1
    };
    Some((fence, since, weight, parts.next()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_ends_in_the_pid() {
        let me = this_process();
        let (host, pid) = me.rsplit_once(':').unwrap();
        assert!(!host.is_empty() && !host.contains('|'));
        assert_eq!(pid, std::process::id().to_string());
    }

    #[test]
    fn lock_keys_are_told_from_the_others() {
        assert_eq!(parse_lock_key("app", "app:sem:{gpu}"), Some(("sem", "gpu")));
        assert_eq!(parse_lock_key("app", "app:sem:{gpu}:fence"), None);
        assert_eq!(parse_lock_key("app", "app:api:gcra:{alice}"), None);
        assert_eq!(
            parse_lock_key("p", "p:lock:{a%3Ab}"),
            Some(("lock", "a%3Ab"))
        );
        assert_eq!(parse_lock_key("a:b", "a:b:sem:{x}"), Some(("sem", "x")));
        assert_eq!(parse_lock_key("a", "a:b:sem:{x}"), None);
        assert_eq!(parse_lock_key("p", "p:lock:{}"), None);
        assert_eq!(parse_lock_key("p", "p:registry"), None);
        assert_eq!(parse_lock_key("p", "p:lock:{x}:released:ab"), None);
        assert_eq!(parse_lock_key("p", "p:lock:{x}:holder:ab"), None);
        assert_eq!(parse_lock_key("p", "pp:lock:{x}"), None);
        assert_eq!(parse_lock_key("p", "p::{x}"), None);
    }

    #[test]
    fn descriptions_round_trip() {
        assert_eq!(
            parse_description("7|1700000000000|host-1:42", false),
            Some((7, 1_700_000_000_000, 1, "host-1:42"))
        );
        assert_eq!(parse_description("8|5|3|h:1", true), Some((8, 5, 3, "h:1")));
        assert_eq!(parse_description("x|1|h", false), None);
        assert_eq!(parse_description("1|2", false), None);
        // A host name with a colon (IPv6) stays whole.
        assert_eq!(
            parse_description("1|2|::1:9", false),
            Some((1, 2, 1, "::1:9"))
        );
    }
}
