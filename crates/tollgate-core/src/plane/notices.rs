//! The admin channel's messages: what changed, for which limiter and
//! subject, so that every instance forgets what it cached about it.

/// What an operator did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Reset,
    Block,
    Unblock,
}

/// One admin message: `<action> <limiter> <subject id>`, and for a block
/// its length in ms (neither a limiter's name nor a subject id holds a
/// space).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Notice {
    pub(crate) action: Action,
    pub(crate) limiter: String,
    pub(crate) subject: String,
    /// A block's length (ms).
    pub(crate) millis: Option<u64>,
}

impl Action {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Action::Reset => "reset",
            Action::Block => "block",
            Action::Unblock => "unblock",
        }
    }
}

impl Notice {
    pub(crate) fn to_message(&self) -> String {
        let mut m = format!("{} {} {}", self.action.name(), self.limiter, self.subject);
        if let Some(ms) = self.millis {
            m.push_str(&format!(" {ms}"));
        }
        m
    }

    pub(crate) fn parse(message: &str) -> Option<Notice> {
        let mut parts = message.split(' ');
        let action = match parts.next()? {
            "reset" => Action::Reset,
            "block" => Action::Block,
            "unblock" => Action::Unblock,
            _ => return None,
        };
        let (limiter, subject) = (parts.next()?, parts.next()?);
        let millis = match (action, parts.next()) {
            (Action::Block, Some(ms)) => Some(ms.parse().ok()?),
            (_, None) => None,
            _ => return None,
        };
        parts.next().is_none().then(|| Notice {
            action,
            limiter: limiter.to_owned(),
            subject: subject.to_owned(),
            millis,
        })
    }
}

/// Where the notices of a prefix go: the channel and its version stamp.
#[derive(Debug, Clone)]
pub(crate) struct Notices {
    pub(crate) channel: String,
    pub(crate) version_key: String,
}

impl Notices {
    pub(crate) fn of(prefix: &str) -> Notices {
        Notices {
            channel: format!("{prefix}:admin"),
            version_key: format!("{prefix}:admin:version"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_reads_back() {
        let n = Notice {
            action: Action::Block,
            limiter: "login".into(),
            subject: "a%20b:c".into(),
            millis: Some(30_000),
        };
        assert_eq!(Notice::parse(&n.to_message()), Some(n));
        let reset = Notice::parse("reset login a").unwrap();
        assert_eq!((reset.action, reset.millis), (Action::Reset, None));
        assert_eq!(Notice::parse("reset login a 5"), None);
        assert_eq!(Notice::parse("block login a x"), None);
        assert_eq!(Notice::parse("block login"), None);
        assert_eq!(Notice::parse("drop login x"), None);
        assert_eq!(Notice::parse("reset a b c"), None);
    }
}
