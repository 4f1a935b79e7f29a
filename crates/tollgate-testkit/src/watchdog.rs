//! Best-effort cleanup of servers that outlive the test process.
//!
//! `Drop` kills servers in the normal case, but servers kept in statics (e.g.
//! a cluster shared through a `OnceLock`) are never dropped, and a test
//! process killed by a timeout never runs destructors. Without `unsafe`
//! there is no `PR_SET_PDEATHSIG`, so instead one `sh` watchdog per test
//! process blocks reading a pipe from us; the kernel closes the pipe when this
//! process exits for any reason, and the watchdog then SIGKILLs the servers
//! still listed in a registry file and removes their temporary directories.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

const SCRIPT: &str = r#"cat >/dev/null
while read -r pid dir; do
  kill -9 "$pid" 2>/dev/null
  case "$dir" in
    */tollgate-testkit-*) rm -rf -- "$dir" ;;
  esac
done < "$0"
rm -f -- "$0" "$0.tmp""#;

#[derive(Debug)]
struct Watchdog {
    /// Never written to; closing it (at process exit) triggers the cleanup.
    _stdin: ChildStdin,
    _child: Child,
    registry: PathBuf,
    live: BTreeMap<u32, PathBuf>,
}

static WATCHDOG: OnceLock<Option<Mutex<Watchdog>>> = OnceLock::new();

fn watchdog() -> Option<&'static Mutex<Watchdog>> {
    WATCHDOG
        .get_or_init(|| {
            let registry = std::env::temp_dir().join(format!(
                "tollgate-testkit-watchdog-{}-{}.txt",
                std::process::id(),
                crate::server::unique_suffix()
            ));
            std::fs::write(&registry, b"").ok()?;
            let mut child = Command::new("sh")
                .arg("-c")
                .arg(SCRIPT)
                .arg(&registry)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .ok()?;
            let stdin = child.stdin.take()?;
            Some(Mutex::new(Watchdog {
                _stdin: stdin,
                _child: child,
                registry,
                live: BTreeMap::new(),
            }))
        })
        .as_ref()
}

impl Watchdog {
    fn save(&self) {
        let tmp = self.registry.with_extension("txt.tmp");
        let mut text = String::new();
        for (pid, dir) in &self.live {
            text.push_str(&format!("{pid} {}\n", dir.display()));
        }
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .and_then(|()| std::fs::rename(&tmp, &self.registry));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// Records a live server so it is killed if this process dies first.
pub(crate) fn register(pid: u32, dir: &Path) {
    if let Some(lock) = watchdog() {
        let mut dog = lock.lock().unwrap_or_else(|e| e.into_inner());
        dog.live.insert(pid, dir.to_owned());
        dog.save();
    }
}

/// Forgets a server that has been killed and reaped.
pub(crate) fn unregister(pid: u32) {
    if let Some(lock) = WATCHDOG.get().and_then(Option::as_ref) {
        let mut dog = lock.lock().unwrap_or_else(|e| e.into_inner());
        if dog.live.remove(&pid).is_some() {
            dog.save();
        }
    }
}
