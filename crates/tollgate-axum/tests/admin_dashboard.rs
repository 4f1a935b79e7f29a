//! The dashboard in a real browser: headless Chromium (through
//! chromedriver) opens the page of an app on a real redis-server, shows
//! the limiters, the throttled subject and an idempotency key in flight,
//! and its reset button gives the subject its quota back.
//!
//! Skips when Chromium or chromedriver is missing, unless
//! `TOLLGATE_REQUIRE_BROWSER` is set (`scripts/test.sh` sets it and
//! installs both). With `TOLLGATE_SCREENSHOT=<path>` it also saves a
//! screenshot of the dashboard there (the one in `docs/`).

mod admin_common;
mod browser;

use std::time::Duration;

use admin_common::{backend, serve, App, Store, TOKEN, WAIT};
use fantoccini::{Client, Locator};
use http::Method;
use tollgate_core::idempotency::{Claim, Fingerprint, IdempotencyStore};
use tollgate_core::{Algorithm, LockOptions, Locker, Quota, RateLimiter, Semaphore, Subject};
use tollgate_testkit::eventually;
use tollgate_testkit::http::loopback;

/// The CSS selector of the throttled row of `subject` on `limiter`.
fn throttled_row(limiter: &str, subject: &str) -> String {
    format!(r#"#throttled-table tr[data-limiter="{limiter}"][data-subject="{subject}"]"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_who_is_throttled_and_resets_them() {
    let Some(bins) =
        browser::binaries_or_skip("the_dashboard_shows_who_is_throttled_and_resets_them")
    else {
        return;
    };
    let app = serve(backend(Store::Redis).await).await;
    let alice = Subject::new("alice@example.com").with_label("alice (support ticket 4411)");
    for _ in 0..5 {
        app.login.check(&alice).await.unwrap();
    }
    assert!(!app.login.check(&alice).await.unwrap().allowed);
    let screenshot = std::env::var_os("TOLLGATE_SCREENSHOT");
    // Labels and ids come from clients: the page shows them as text. (Not
    // in the screenshot, which shows what an operator usually sees.)
    let markup = "<img src=x onerror=alert(1)><b>bold</b>";
    let mallory = Subject::new("<script>alert(1)</script>").with_label(markup);
    let mallory_id = mallory.as_encoded().to_owned();
    if screenshot.is_some() {
        more_traffic(&app).await;
    } else {
        for _ in 0..4 {
            app.login.check(&mallory).await.unwrap();
        }
    }
    let id = alice.as_encoded().to_owned();
    // An idempotency key whose handler runs while the page is open.
    let records = IdempotencyStore::builder(app.backend.clone())
        .prefix(app.admin.prefix())
        .build()
        .unwrap();
    let order = Subject::compound(["tenant-7", "POST /orders", "order-4411"]);
    let order_id = order.as_encoded().to_owned();
    let Claim::Claimed(claim) = records
        .claim(order, Fingerprint::of(b"{\"qty\":2}"))
        .await
        .unwrap()
    else {
        panic!("claimed");
    };
    // A lock and a permit held while the page is open.
    let held = LockOptions::new().ttl(Duration::from_secs(30));
    let locker = Locker::builder(app.backend.clone())
        .prefix(app.admin.prefix())
        .build()
        .unwrap();
    let lease = locker.acquire("nightly-billing", &held).await.unwrap();
    let exports = Semaphore::builder(app.backend.clone(), 2)
        .prefix(app.admin.prefix())
        .name("exports")
        .build()
        .unwrap();
    let permit = exports.acquire("tenant-7", &held).await.unwrap();
    let url = format!("http://{}/admin/#token={TOKEN}", app.addr);

    browser::with_browser(&bins, |client| async move {
        client.goto(&url).await.unwrap();
        // The token left the address bar once read.
        let current = client.current_url().await.unwrap();
        assert!(!current.as_str().contains(TOKEN), "{current}");

        let name = r#"#limiters-table tr[data-limiter="login"] td[data-field="name"]"#;
        browser::wait_for_text(&client, name, WAIT, |t| t == "login").await;
        let quotas = r#"#limiters-table tr[data-limiter="login"] td[data-field="quotas"]"#;
        browser::wait_for_text(&client, quotas, WAIT, |t| t == "3 / minute").await;
        // The limiter's recent traffic, as a rate.
        let allowed = r#"#limiters-table tr[data-limiter="login"] td[data-field="allowed"]"#;
        browser::wait_for_text(&client, allowed, WAIT, |t| t.parse::<f64>().is_ok()).await;
        let row = throttled_row("login", &id);
        browser::wait_for_text(
            &client,
            &format!(r#"{row} td[data-field="subject"]"#),
            WAIT,
            |t| t == id,
        )
        .await;
        browser::wait_for_text(
            &client,
            &format!(r#"{row} td[data-field="label"]"#),
            WAIT,
            |t| t == "alice (support ticket 4411)",
        )
        .await;
        let lock = r#"#holders-table tr[data-kind="lock"] td[data-field="subject"]"#;
        browser::wait_for_text(&client, lock, WAIT, |t| t == "nightly-billing").await;
        let permit = r#"#holders-table tr[data-kind="permit"] td[data-field="name"]"#;
        browser::wait_for_text(&client, permit, WAIT, |t| t == "exports").await;
        let in_flight = r#"#idempotency-table td[data-field="key"]"#;
        browser::wait_for_text(&client, in_flight, WAIT, |t| t == order_id).await;
        browser::wait_for_text(&client, "#status", WAIT, |t| t.starts_with("live")).await;
        if let Some(path) = screenshot {
            take_screenshot(&client, &path).await;
        } else {
            let row = throttled_row("login", &mallory_id);
            let label = format!(r#"{row} td[data-field="label"]"#);
            browser::wait_for_text(&client, &label, WAIT, |t| t == markup).await;
            let subject = format!(r#"{row} td[data-field="subject"]"#);
            browser::wait_for_text(&client, &subject, WAIT, |t| t == mallory_id).await;
            let injected = client.find_all(Locator::Css("main img, main b, main script"));
            assert!(
                injected.await.unwrap().is_empty(),
                "client input became markup"
            );
        }

        client
            .find(Locator::Css(&format!(
                r#"{row} button[data-action="reset"]"#
            )))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        browser::wait_for_text(&client, "#notice", WAIT, |t| t.starts_with("Reset: login")).await;
    })
    .await;
    assert!(claim.abandon().await.unwrap());
    lease.release().await.unwrap();
    permit.release().await.unwrap();

    // The reset reached the store: the whole quota is back, and admitted.
    let state = app.admin.inspect("login", &alice).await.unwrap();
    assert_eq!((state.remaining, state.limit), (3, 3), "{state:?}");
    assert!(app.login.check(&alice).await.unwrap().allowed);
}

/// The search box finds a customer by the raw API key, and blocks them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_box_finds_a_customer_by_raw_key_and_blocks_them() {
    let Some(bins) = browser::binaries_or_skip("the_search_box_finds_a_customer_by_raw_key") else {
        return;
    };
    let app = serve(backend(Store::Redis).await).await;
    let key = "sk_live_9f8e7d6c5b4a";
    let r = loopback::send(app.addr, Method::GET, "/v1/ping", &[("x-api-key", key)]).await;
    assert_eq!(r.status, 200);
    let url = format!("http://{}/admin/", app.addr);

    browser::with_browser(&bins, |client| async move {
        // No token in the address: the page asks for it.
        client.goto(&url).await.unwrap();
        let input = client
            .wait()
            .for_element(Locator::Id("token-input"))
            .await
            .unwrap();
        input.send_keys(TOKEN).await.unwrap();
        client
            .find(Locator::Css("#token-form button[type=submit]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let none = r#"[data-empty-for="idempotency-table"]"#;
        browser::wait_for_text(&client, none, WAIT, |t| {
            t == "No idempotency key is in flight."
        })
        .await;
        let option = r#"#search-limiter option[value="api"]"#;
        browser::wait_for_text(&client, option, WAIT, |t| t == "api").await;
        client
            .find(Locator::Css(option))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let value = client.find(Locator::Id("search-value")).await.unwrap();
        value.send_keys(key).await.unwrap();
        client
            .find(Locator::Css("#search-form button[type=submit]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let remaining = r#"#search-result [data-field="remaining"]"#;
        browser::wait_for_text(&client, remaining, WAIT, |t| t == "1 of 2").await;
        let subject = client
            .find(Locator::Css(r#"#search-result [data-field="subject"]"#))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            subject.starts_with("h%3A") && !subject.contains("9f8e"),
            "{subject}"
        );
        client
            .find(Locator::Css(
                r#"#search-result button[data-action="block"]"#,
            ))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let blocked = r#"#search-result [data-field="blocked"]"#;
        browser::wait_for_text(&client, blocked, WAIT, |t| t.contains("(in 4 min")).await;
    })
    .await;

    // The route refuses the key for the block (5 minutes by default).
    let r = eventually(WAIT, "the blocked key is refused", || async {
        let r = loopback::send(app.addr, Method::GET, "/v1/ping", &[("x-api-key", key)]).await;
        (r.status == 429).then_some(r)
    })
    .await;
    let retry = r.retry_after();
    assert!(retry > 240 && retry <= 300, "{r:?}");
}

/// A name run under two algorithms (a plan change) keeps one row per
/// algorithm refresh after refresh, and a subject both refuse is throttled
/// once: no row is left behind when a key is listed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_under_two_algorithms_keeps_a_row_each() {
    let Some(bins) = browser::binaries_or_skip("a_name_under_two_algorithms_keeps_a_row_each")
    else {
        return;
    };
    let app = serve(backend(Store::Redis).await).await;
    let gcra = RateLimiter::builder(app.backend.clone(), Algorithm::Gcra)
        .quota(Quota::per_minute(3))
        .prefix(app.admin.prefix())
        .name("login")
        .build()
        .unwrap();
    eventually(WAIT, "the second algorithm registers", || async {
        app.admin.limiters().await.ok().filter(|l| l.len() == 3)
    })
    .await;
    let alice = Subject::new("alice");
    for _ in 0..4 {
        gcra.check(&alice).await.unwrap();
        app.login.check(&alice).await.unwrap();
    }
    let url = format!("http://{}/admin/#token={TOKEN}", app.addr);

    browser::with_browser(&bins, |client| async move {
        client.goto(&url).await.unwrap();
        let row = throttled_row("login", "alice");
        let subject = format!(r#"{row} td[data-field="subject"]"#);
        browser::wait_for_text(&client, &subject, WAIT, |t| t == "alice").await;
        // Three refreshes after both show: each one says when it was.
        let mut seen =
            browser::wait_for_text(&client, "#status", WAIT, |t| t.starts_with("live")).await;
        for _ in 0..3 {
            let prev = seen.clone();
            seen = browser::wait_for_text(&client, "#status", WAIT, move |t| {
                t.starts_with("live") && t != prev
            })
            .await;
        }
        let count = |css: String| {
            let client = client.clone();
            async move { client.find_all(Locator::Css(&css)).await.unwrap().len() }
        };
        let login = r#"#limiters-table tbody tr[data-limiter="login"]"#;
        assert_eq!(count(login.to_owned()).await, 2, "one row per algorithm");
        assert_eq!(count(row.clone()).await, 1, "alice once");
        let choices = r#"#search-limiter option[value="login"]"#;
        assert_eq!(count(choices.to_owned()).await, 1, "the name once");
    })
    .await;
}

/// More limiters and more subjects, so the screenshot shows a dashboard
/// as an operator sees one.
async fn more_traffic(app: &App) {
    for (key, n) in [
        ("sk_live_7Hq2mZ", 9),
        ("sk_live_Pc41xa", 6),
        ("sk_test_0b9ZTe", 4),
    ] {
        for _ in 0..n {
            loopback::send(app.addr, Method::GET, "/v1/ping", &[("x-api-key", key)]).await;
        }
    }
    for (who, n) in [("bob@example.com", 3), ("203.0.113.7", 8)] {
        let s = Subject::new(who);
        for _ in 0..n + 3 {
            app.login.check(&s).await.unwrap();
        }
    }
}

/// Saves a PNG of the page once every throttled subject has rendered.
async fn take_screenshot(client: &Client, path: &std::ffi::OsStr) {
    browser::wait_for_text(client, "#throttled-table tbody", WAIT, |t| {
        t.matches("Reset").count() >= 5
    })
    .await;
    // The page's own height, not the window's.
    let body = client.find(Locator::Css("body")).await.unwrap();
    let png = body.screenshot().await.unwrap();
    std::fs::write(path, png).unwrap();
    eprintln!("dashboard screenshot saved to {}", path.to_string_lossy());
}
