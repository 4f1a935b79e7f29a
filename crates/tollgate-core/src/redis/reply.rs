//! Reading the lock, permit and record scripts' replies, strictly: a reply
//! no script gives is [`Error::Protocol`], never a guess.

use std::time::Duration;

use redis::Value;

use crate::error::{Error, Result};
use crate::store::{AcquireReply, FencingToken};

pub(super) fn int(value: &Value) -> Result<i64> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(Error::Protocol(format!(
            "expected an integer, got {other:?}"
        ))),
    }
}

pub(super) fn parse_acquire(value: Value) -> Result<AcquireReply> {
    let Value::Array(items) = &value else {
        return Err(Error::Protocol(format!("expected an array, got {value:?}")));
    };
    let [flag, n] = items.as_slice() else {
        return Err(Error::Protocol(format!(
            "expected two integers, got {value:?}"
        )));
    };
    let (flag, n) = (int(flag)?, int(n)?);
    match flag {
        1 if n > 0 => Ok(AcquireReply::Acquired {
            fence: FencingToken(n as u64),
        }),
        0 => Ok(AcquireReply::Held { pttl: pttl(n) }),
        _ => Err(Error::Protocol(format!(
            "unexpected acquire reply {value:?}"
        ))),
    }
}

pub(super) fn parse_flag(value: Value) -> Result<bool> {
    match int(&value)? {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(Error::Protocol(format!("expected 0 or 1, got {n}"))),
    }
}

/// A holder's remaining time from a `PTTL`: -2 (gone) means free now; -1
/// (no TTL) cannot happen for tollgate's keys and reads as unknown.
pub(super) fn pttl(ms: i64) -> Option<Duration> {
    match ms {
        -2 => Some(Duration::ZERO),
        n if n >= 0 => Some(Duration::from_millis(n as u64)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_parsed_strictly() {
        let ok = Value::Array(vec![Value::Int(1), Value::Int(42)]);
        assert_eq!(
            parse_acquire(ok).unwrap(),
            AcquireReply::Acquired {
                fence: FencingToken(42)
            }
        );
        let held = Value::Array(vec![Value::Int(0), Value::Int(1500)]);
        assert_eq!(
            parse_acquire(held).unwrap(),
            AcquireReply::Held {
                pttl: Some(Duration::from_millis(1500))
            }
        );
        assert!(parse_acquire(Value::Int(1)).is_err());
        assert!(parse_acquire(Value::Array(vec![Value::Int(1), Value::Int(0)])).is_err());
        assert!(parse_flag(Value::Int(2)).is_err());
        assert!(parse_flag(Value::Int(1)).unwrap());
    }
}
