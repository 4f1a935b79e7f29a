//! The crate's error type and the check for the redis binaries.

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};

/// How to get the binaries on Debian/Ubuntu; used as the hint of
/// [`TestkitError::MissingBinary`].
pub(crate) const INSTALL_HINT: &str = "install with: apt-get install redis-server redis-tools";

/// Error when a server or cluster cannot be started.
#[derive(Debug)]
pub enum TestkitError {
    /// A required executable (`redis-server` or `redis-cli`) is not on `PATH`.
    MissingBinary {
        /// Name of the missing executable.
        binary: &'static str,
        /// How to install it.
        hint: String,
    },
    /// The server or cluster did not come up; the message carries the details
    /// (including the server's log when the process exited).
    Startup(String),
    /// An I/O error (creating the temporary directory, spawning, ...).
    Io(std::io::Error),
}

impl fmt::Display for TestkitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TestkitError::MissingBinary { binary, hint } => write!(
                f,
                "tollgate-testkit needs the `{binary}` executable, but it was not found on PATH ({hint})"
            ),
            TestkitError::Startup(msg) => write!(f, "tollgate-testkit: redis startup failed: {msg}"),
            TestkitError::Io(err) => write!(f, "tollgate-testkit: I/O error: {err}"),
        }
    }
}

impl std::error::Error for TestkitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TestkitError::Io(err) => Some(err),
            _ => None,
        }
    }
}

impl From<std::io::Error> for TestkitError {
    fn from(err: std::io::Error) -> Self {
        TestkitError::Io(err)
    }
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, TestkitError>;

/// Checks that `redis-server` and `redis-cli` are executables on `PATH`.
///
/// Returns [`TestkitError::MissingBinary`] naming the first missing one, with
/// the hint `install with: apt-get install redis-server redis-tools`.
pub fn require_binaries() -> Result<()> {
    let path = std::env::var_os("PATH");
    for binary in ["redis-server", "redis-cli"] {
        find_binary(binary, path.as_deref())?;
    }
    Ok(())
}

/// Looks `binary` up in the given `PATH` value (not the process environment,
/// so tests can use a fake one).
pub(crate) fn find_binary(binary: &'static str, path: Option<&OsStr>) -> Result<PathBuf> {
    path.into_iter()
        .flat_map(std::env::split_paths)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(binary))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| missing(binary))
}

/// The [`TestkitError::MissingBinary`] error for `binary`.
pub(crate) fn missing(binary: &'static str) -> TestkitError {
    TestkitError::MissingBinary {
        binary,
        hint: INSTALL_HINT.to_owned(),
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_when_path_is_empty() {
        let err = find_binary("redis-server", Some(OsStr::new(""))).unwrap_err();
        match &err {
            TestkitError::MissingBinary { binary, hint } => {
                assert_eq!(*binary, "redis-server");
                assert_eq!(hint, INSTALL_HINT);
            }
            other => panic!("expected MissingBinary, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("`redis-server`"), "{msg}");
        assert!(msg.contains("not found on PATH"), "{msg}");
        assert!(
            msg.contains("install with: apt-get install redis-server redis-tools"),
            "{msg}"
        );
    }

    #[test]
    fn missing_binary_when_path_has_no_redis() {
        let err = find_binary("redis-cli", Some(OsStr::new("/nonexistent-dir:/proc"))).unwrap_err();
        assert!(
            matches!(
                err,
                TestkitError::MissingBinary {
                    binary: "redis-cli",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(find_binary("redis-cli", None).is_err());
    }

    #[test]
    fn finds_installed_binaries() {
        require_binaries().expect("redis-server and redis-cli must be installed for these tests");
        let dir = find_binary("redis-server", Some(OsStr::new("/nonexistent:/usr/bin")))
            .expect("redis-server in /usr/bin");
        assert_eq!(dir, Path::new("/usr/bin/redis-server"));
    }

    #[test]
    fn other_variants_display() {
        let startup = TestkitError::Startup("boom".into()).to_string();
        assert!(startup.contains("boom"), "{startup}");
        let io = TestkitError::from(std::io::Error::other("disk")).to_string();
        assert!(io.contains("disk"), "{io}");
        assert!(
            std::error::Error::source(&TestkitError::from(std::io::Error::other("x"))).is_some()
        );
    }
}
