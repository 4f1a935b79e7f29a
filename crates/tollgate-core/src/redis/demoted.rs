//! What a connection's answer says of its server: the error it carries
//! (as `Err` or as a value), and whether that says the server is a replica
//! now (its master was demoted), the sign a connection that follows
//! failovers acts on.

use std::borrow::Cow;

use redis::{ErrorKind, ServerErrorKind, Value};

/// Whether `e` says the server is a replica now: `READONLY`, or, before
/// Redis 7, a script's "ERR Error running script …: -READONLY …".
pub(crate) fn demoted(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || (e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains("-READONLY ")))
}

/// The server's error a connection's answer carries, if any: as `Err`, or
/// as a value (`Value::ServerError`), which is how a connection hands it
/// back; only the command's caller turns it into `Err`.
pub(crate) fn answer_error(
    reply: &redis::RedisResult<Value>,
) -> Option<Cow<'_, redis::RedisError>> {
    match reply {
        Err(e) => Some(Cow::Borrowed(e)),
        Ok(v) => value_error(v).map(Cow::Owned),
    }
}

fn value_error(v: &Value) -> Option<redis::RedisError> {
    match v {
        Value::ServerError(e) => Some(redis::RedisError::from(e.clone())),
        _ => None,
    }
}

/// Whether `e` says the server does not act as a writable master now:
/// [`demoted`], or it refuses writes for want of replicas (`NOREPLICAS`,
/// a master cut off from them), has lost its own master (`MASTERDOWN`) or
/// is still loading (`LOADING`), in either form. A connection that follows
/// Sentinel asks it again on these: another server may be the master now.
#[cfg(feature = "sentinel")]
pub(crate) fn not_a_master(e: &redis::RedisError) -> bool {
    const CODES: [&str; 3] = ["NOREPLICAS", "MASTERDOWN", "LOADING"];
    demoted(e)
        || e.code().is_some_and(|c| CODES.contains(&c))
        || (e.code() == Some("ERR")
            && e.detail()
                .is_some_and(|d| CODES.iter().any(|c| d.contains(&format!("-{c} ")))))
}

/// Whether a connection's answer carries an error that `says` (such as
/// [`demoted`] or [`not_a_master`]) of its server.
pub(crate) fn reply_says(
    reply: &redis::RedisResult<Value>,
    says: fn(&redis::RedisError) -> bool,
) -> bool {
    answer_error(reply).is_some_and(|e| says(&e))
}

/// [`reply_says`] for a pipeline's answers: any of them.
pub(crate) fn replies_say(
    replies: &redis::RedisResult<Vec<Value>>,
    says: fn(&redis::RedisError) -> bool,
) -> bool {
    match replies {
        Err(e) => says(e),
        Ok(values) => values
            .iter()
            .any(|v| value_error(v).is_some_and(|e| says(&e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A demoted master says so as `READONLY`, or, before Redis 7, inside a
    /// script's error; other errors say nothing of it.
    #[test]
    fn a_demoted_master_is_seen_in_both_forms() {
        let plain = redis::RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert!(demoted(&plain));
        let wrapped = redis::RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "Error running script (call to f_0): @user_script:1: @user_script: 1: \
             -READONLY You can't write against a read only replica."
                .to_owned(),
        ));
        assert!(demoted(&wrapped));
        let other = redis::RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "user_script:1: attempt to perform arithmetic on a nil value",
        ));
        assert!(!demoted(&other));
    }

    /// A connection hands a server's error back as a value: that is where
    /// a demotion shows, alone or among a pipeline's answers.
    #[test]
    fn a_demotion_is_seen_in_a_reply_value() {
        let parse = |s: &str| redis::parse_redis_value(s.as_bytes()).unwrap();
        let readonly = parse("-READONLY You can't write against a read only replica.\r\n");
        assert!(matches!(readonly, Value::ServerError(_)));
        assert!(reply_says(&Ok(readonly.clone()), demoted));
        let other = parse("-ERR unknown command\r\n");
        assert!(!reply_says(&Ok(other.clone()), demoted));
        assert!(!reply_says(&Ok(Value::Okay), demoted));
        assert!(replies_say(&Ok(vec![Value::Okay, readonly]), demoted));
        assert!(!replies_say(&Ok(vec![Value::Okay, other]), demoted));
    }

    /// Sentinel is asked again on any reply saying the server is no
    /// writable master now, plain or inside a script's error; not on a
    /// reply about one request.
    #[cfg(feature = "sentinel")]
    #[test]
    fn a_server_that_is_no_master_is_seen() {
        let parse = |s: &str| redis::parse_redis_value(s.as_bytes()).unwrap();
        for line in [
            "-READONLY You can't write against a read only replica.\r\n",
            "-NOREPLICAS Not enough good replicas to write.\r\n",
            "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
            "-LOADING Redis is loading the dataset in memory\r\n",
            "-ERR Error running script (call to f_1): @user_script:1: -NOREPLICAS Not enough good replicas to write.\r\n",
        ] {
            let reply = parse(line);
            assert!(reply_says(&Ok(reply.clone()), not_a_master), "{line}");
            assert!(replies_say(&Ok(vec![Value::Okay, reply]), not_a_master), "{line}");
        }
        for line in [
            "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
            "-ERR unknown command\r\n",
            "-OOM command not allowed when used memory > 'maxmemory'.\r\n",
        ] {
            assert!(!reply_says(&Ok(parse(line)), not_a_master), "{line}");
        }
    }
}
