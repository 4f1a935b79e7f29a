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

/// Whether a connection's answer says its server is a replica now.
pub(crate) fn demoted_reply(reply: &redis::RedisResult<Value>) -> bool {
    answer_error(reply).is_some_and(|e| demoted(&e))
}

/// [`demoted_reply`] for a pipeline's answers.
pub(crate) fn demoted_replies(replies: &redis::RedisResult<Vec<Value>>) -> bool {
    match replies {
        Err(e) => demoted(e),
        Ok(values) => values
            .iter()
            .any(|v| value_error(v).is_some_and(|e| demoted(&e))),
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
        assert!(demoted_reply(&Ok(readonly.clone())));
        let other = parse("-ERR unknown command\r\n");
        assert!(!demoted_reply(&Ok(other.clone())));
        assert!(!demoted_reply(&Ok(Value::Okay)));
        assert!(demoted_replies(&Ok(vec![Value::Okay, readonly])));
        assert!(!demoted_replies(&Ok(vec![Value::Okay, other])));
    }
}
