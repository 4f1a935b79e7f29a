//! Headless Chromium driven through chromedriver (WebDriver), for the
//! dashboard's tests.
//!
//! Chromium and chromedriver come from the system (Debian's `chromium` and
//! `chromium-driver`; `scripts/test.sh` installs them). Without them the
//! tests skip with a message — unless `TOLLGATE_REQUIRE_BROWSER` is set (CI
//! sets it), then they fail.
#![allow(dead_code)]

use std::future::Future;
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use futures::FutureExt;
use hyper_util::client::legacy::connect::HttpConnector;

/// Where the browser and its driver are.
pub(crate) struct Binaries {
    chromium: PathBuf,
    driver: PathBuf,
}

/// The first of `names` found in `PATH`, or the path in env var `var`.
fn find(var: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// Chromium and chromedriver, or `None` (after saying why) when they are
/// not installed and the browser is not required. Panics when
/// `TOLLGATE_REQUIRE_BROWSER` is set and either is missing.
pub(crate) fn binaries_or_skip(test: &str) -> Option<Binaries> {
    let chromium = find(
        "TOLLGATE_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
    );
    let driver = find("TOLLGATE_CHROMEDRIVER", &["chromedriver"]);
    match (chromium, driver) {
        (Some(chromium), Some(driver)) => Some(Binaries { chromium, driver }),
        (chromium, driver) => {
            let missing = [
                ("chromium", chromium.is_none()),
                ("chromedriver", driver.is_none()),
            ]
            .iter()
            .filter(|(_, m)| *m)
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(" and ");
            let required =
                std::env::var_os("TOLLGATE_REQUIRE_BROWSER").is_some_and(|v| !v.is_empty());
            assert!(
                !required,
                "{test}: TOLLGATE_REQUIRE_BROWSER is set but {missing} is not installed \
                 (apt-get install chromium chromium-driver, as scripts/test.sh does)"
            );
            // Straight to stderr: the harness would hide an `eprintln!` of
            // a passing test.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: {missing} not installed (apt-get install chromium chromium-driver, \
                 or run scripts/test.sh); set TOLLGATE_REQUIRE_BROWSER=1 to fail instead"
            );
            None
        }
    }
}

/// A running chromedriver, killed on drop, and the browser profile it
/// uses, removed on drop.
struct Driver {
    child: Child,
    port: u16,
    profile: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Starts chromedriver on a free loopback port and waits until it listens.
fn start_driver(driver: &Path) -> Driver {
    let profile = std::env::temp_dir().join(tollgate_testkit::unique("tollgate-chromium"));
    std::fs::create_dir_all(&profile).expect("a browser profile directory");
    for _ in 0..3 {
        let port = free_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", driver.display()));
        let mut d = Driver {
            child,
            port,
            profile: profile.clone(),
        };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(15) {
            if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return d;
            }
            if d.child.try_wait().ok().flatten().is_some() {
                break; // exited: the port was taken; try another
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Dropping kills it and removes the profile: make it again.
        drop(d);
        std::fs::create_dir_all(&profile).expect("a browser profile directory");
    }
    panic!("chromedriver did not start listening");
}

/// A headless Chromium session: `run(client)` drives it; the session and
/// chromedriver end afterwards even when `run` panics (then the panic goes
/// on).
pub(crate) async fn with_browser<F, Fut>(bins: &Binaries, run: F)
where
    F: FnOnce(Client) -> Fut,
    Fut: Future<Output = ()>,
{
    let driver = start_driver(&bins.driver);
    // No network here: nothing that phones home, no GPU, no sandbox (tests
    // may run as root), a profile of its own.
    let args = [
        "--headless".to_owned(),
        "--no-sandbox".to_owned(),
        "--disable-gpu".to_owned(),
        "--disable-quic".to_owned(),
        "--no-first-run".to_owned(),
        "--disable-background-networking".to_owned(),
        "--disable-component-update".to_owned(),
        "--disable-sync".to_owned(),
        "--disable-dev-shm-usage".to_owned(),
        "--window-size=1360,1000".to_owned(),
        format!("--user-data-dir={}", driver.profile.display()),
    ];
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({ "binary": bins.chromium, "args": args }),
    );
    let client = ClientBuilder::new(HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .unwrap_or_else(|e| panic!("cannot open a Chromium session: {e}"));
    let outcome = AssertUnwindSafe(run(client.clone())).catch_unwind().await;
    let _ = client.close().await;
    drop(driver);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// The text of the element `css` finds, once `ready` accepts it, within
/// `within`; panics with the page's text otherwise.
pub(crate) async fn wait_for_text(
    client: &Client,
    css: &str,
    within: Duration,
    ready: impl Fn(&str) -> bool,
) -> String {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        if let Ok(el) = client.find(Locator::Css(css)).await {
            if let Ok(text) = el.text().await {
                if ready(&text) {
                    return text;
                }
                last = text;
            }
        }
        if start.elapsed() > within {
            let page = match client.find(Locator::Css("body")).await {
                Ok(body) => body.text().await.unwrap_or_default(),
                Err(e) => format!("(no body: {e})"),
            };
            panic!("{css}: not as expected within {within:?} (last text {last:?}); page:\n{page}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
