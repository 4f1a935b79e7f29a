//! Path keys inside a router mounted with `Router::nest`: axum's matched
//! template there is the whole route (`/api/jobs/{id}`) while the URI the
//! inner router sees has lost the prefix (`/jobs/7`). The keys still name
//! the resource the URL names — per job, per tenant — not one for all.

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use http::request::Parts;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tollgate::tower::key::{KeyExtractor, PathParam, RouteParams};
use tollgate::Subject;
use tower::ServiceExt;

/// What the handler's keys were: `PathParam("id")`, `PathParam("tenant")`
/// (an error where the route has none) and `RouteParams`, one per line.
async fn keys(parts: Parts) -> String {
    let show = |k: Result<Option<Subject>, _>| match k {
        Ok(Some(s)) => s.as_encoded().to_owned(),
        Ok(None) => "none".to_owned(),
        Err(e) => format!("error: {e}"),
    };
    [
        show(PathParam::new("id").extract(&parts)),
        show(PathParam::new("tenant").extract(&parts)),
        show(RouteParams.extract(&parts)),
    ]
    .join("\n")
}

async fn call(app: &Router, path: &str) -> (StatusCode, Vec<String>) {
    let req = Request::post(path).body(Body::empty()).unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    (status, text.lines().map(str::to_owned).collect())
}

#[tokio::test]
async fn keys_in_a_nested_router_name_each_resource() {
    let app = Router::new().nest("/api", Router::new().route("/jobs/{id}", post(keys)));
    let (status, one) = call(&app, "/api/jobs/1").await;
    assert_eq!(status, StatusCode::OK);
    let (_, two) = call(&app, "/api/jobs/2").await;
    assert_eq!(one[0], Subject::new("1").as_encoded());
    assert_eq!(two[0], Subject::new("2").as_encoded());
    assert!(one[1].starts_with("error"), "{one:?}");
    assert_eq!(
        one[2],
        Subject::compound(["/api/jobs/{id}", "1"]).as_encoded()
    );
    assert_ne!(one[2], two[2], "one key for every job");
}

#[tokio::test]
async fn a_parameter_in_the_mount_prefix_is_read_too() {
    let app = Router::new().nest("/{tenant}", Router::new().route("/jobs/{id}", post(keys)));
    let (status, acme) = call(&app, "/acme/jobs/7").await;
    assert_eq!(status, StatusCode::OK);
    let (_, globex) = call(&app, "/globex/jobs/7").await;
    assert_eq!(acme[0], Subject::new("7").as_encoded());
    assert_eq!(acme[1], Subject::new("acme").as_encoded());
    assert_eq!(globex[1], Subject::new("globex").as_encoded());
    assert_ne!(acme[2], globex[2], "one key for every tenant");
}

/// A parameter with fixed text around it in its segment (axum takes
/// `/users/user_{id}`): the key is the parameter, not a 500.
#[tokio::test]
async fn a_parameter_inside_a_segment_is_read() {
    let app = Router::new().route("/users/user_{id}", post(keys));
    let (status, keys) = call(&app, "/users/user_7").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(keys[0], Subject::new("7").as_encoded());
    assert_eq!(
        keys[2],
        Subject::compound(["/users/user_{id}", "7"]).as_encoded()
    );
}
