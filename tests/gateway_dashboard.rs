//! The gateway's dashboard (`/admin/`) in a real headless Chromium, as the
//! contract says: opened at `/admin/#token=<token>`, the rendered page
//! shows the limiter names and the subject ids of the top throttled
//! subjects. The gateway binary itself on a real Redis.

#[allow(dead_code)]
#[path = "../examples/gateway/app.rs"]
mod app;
#[path = "../crates/tollgate-axum/tests/browser/mod.rs"]
mod browser;
mod common;

use std::time::Duration;

use http::{Method, StatusCode};
use tollgate_testkit::{unique, RedisServer};

use common::{launch, send};

const TOKEN: &str = "s3cret-admin-token";
const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_dashboard_shows_limiters_and_throttled_subjects() {
    let Some(bins) =
        browser::binaries_or_skip("the_gateways_dashboard_shows_limiters_and_throttled_subjects")
    else {
        return;
    };
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let gateway = launch(
        "gateway",
        &[("REDIS_URL", url.as_str()), ("TOLLGATE_ADMIN_TOKEN", TOKEN)],
    )
    .await;
    let key = unique("cust");
    for _ in 0..10 {
        let r = send(
            gateway.addr,
            Method::GET,
            "/v1/quota",
            &[("x-api-key", &key)],
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
    }
    let r = send(
        gateway.addr,
        Method::GET,
        "/v1/quota",
        &[("x-api-key", &key)],
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    let id = app::subject_of(&key).unwrap().as_encoded().to_owned();
    let page = format!("http://{}/admin/#token={TOKEN}", gateway.addr);

    browser::with_browser(&bins, |client| async move {
        client.goto(&page).await.unwrap();
        for name in ["chat", "login", "quota-free", "quota-pro"] {
            let cell =
                format!(r#"#limiters-table tr[data-limiter="{name}"] td[data-field="name"]"#);
            browser::wait_for_text(&client, &cell, WAIT, |t| t == name).await;
        }
        let subject = r#"#throttled-table td[data-field="subject"]"#;
        browser::wait_for_text(&client, subject, WAIT, |t| t == id).await;
    })
    .await;
}
