//! The rejection table and default responses.

use serde_json::Value;

use super::*;

/// The response's problem document, after checking its content type and
/// that its `status` is the response's.
fn problem_of(res: &Response<Bytes>) -> Value {
    assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
    let v: Value = serde_json::from_slice(res.body())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", res.body()));
    assert_eq!(v["status"], res.status().as_u16(), "{v}");
    v
}

/// A busy lock's wait is whole seconds, rounded up, never 0, and 1 when
/// unknown — the same answer from every constructor.
#[test]
fn busy_rounds_up_and_is_never_zero() {
    let ms = Duration::from_millis;
    for (wait, secs) in [
        (None, "1"),
        (Some(Duration::ZERO), "1"),
        (Some(ms(1)), "1"),
        (Some(ms(1000)), "1"),
        (Some(ms(1001)), "2"),
    ] {
        let error = Error::Busy {
            name: "job".into(),
            retry_after: wait,
        };
        for r in [
            Rejection::busy(wait),
            Rejection::from_error(Middleware::Lock, error),
        ] {
            let res = r.default_response();
            assert_eq!(res.status(), StatusCode::CONFLICT);
            assert_eq!(res.headers()[RETRY_AFTER], secs, "{wait:?}");
            let body = format!(
                r#"{{"type":"about:blank","title":"Conflict","status":409,"detail":"resource is busy; retry in {secs} s"}}"#
            );
            assert_eq!(std::str::from_utf8(res.body()).unwrap(), body);
            problem_of(&res);

            // gRPC: ABORTED, the same wait in metadata and RetryInfo.
            let res = r
                .for_protocol(Protocol::Grpc, &HeaderMap::new())
                .default_response();
            assert_eq!(res.status(), StatusCode::OK);
            assert_eq!(res.headers()["grpc-status"], "10", "{wait:?}");
            assert_eq!(res.headers()[RETRY_AFTER], secs, "{wait:?}");
            assert!(res.headers().contains_key("grpc-status-details-bin"));
            assert_eq!(
                res.headers()["grpc-message"],
                format!("resource is busy; retry in {secs} s").as_str()
            );
        }
    }
}

#[test]
fn a_cost_beyond_capacity_is_413_without_retry_after() {
    let res = Rejection::from_error(
        Middleware::RateLimit,
        Error::CostExceedsCapacity {
            cost: 5,
            capacity: 2,
        },
    )
    .default_response();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(!res.headers().contains_key(RETRY_AFTER));
    let v = problem_of(&res);
    assert_eq!(v["type"], "about:blank");
    assert_eq!(v["title"], "Payload Too Large");
    assert_eq!(
        v["detail"],
        "request cost 5 exceeds the rate limit's capacity 2; it can never be admitted"
    );
}

/// The table: every reason's HTTP status and gRPC code.
#[test]
fn one_table_for_every_reason() {
    use RejectionReason as R;
    let cases = [
        (R::RateLimited, 429, 8),
        (
            R::CostExceedsCapacity {
                cost: 2,
                capacity: 1,
            },
            413,
            8,
        ),
        (R::Unavailable, 503, 14),
        (R::Busy, 409, 10),
        (R::TooManyInFlight, 429, 8),
        (R::LeaseLost, 503, 10),
        (
            R::Key {
                status: StatusCode::UNAUTHORIZED,
            },
            401,
            16,
        ),
        (R::Internal, 500, 13),
        (R::IdempotencyConflict, 409, 10),
        (R::IdempotencyMismatch, 422, 9),
        (R::InvalidIdempotencyKey, 400, 3),
        (R::PayloadTooLarge, 413, 8),
    ];
    for (reason, status, code) in cases {
        assert_eq!(reason.status(), status, "{reason:?}");
        assert_eq!(reason.grpc_code().code(), code, "{reason:?}");
    }
}

/// The idempotency layer's answers are `about:blank` problems, as every
/// other layer's; gRPC requests still get trailers-only.
#[test]
fn idempotency_rejections_are_problem_documents() {
    let cases = [
        (
            Rejection::idempotency_in_flight(Some(Duration::from_millis(1500))),
            409,
            Some("2"),
        ),
        (Rejection::idempotency_not_replayable(201), 409, None),
        (Rejection::idempotency_mismatch(), 422, None),
        (
            Rejection::invalid_idempotency_key("bad \"key\"\n"),
            400,
            None,
        ),
        (Rejection::payload_too_large(10), 413, None),
        (
            Rejection::unavailable(Middleware::Idempotency, None),
            503,
            Some("1"),
        ),
        (Rejection::idempotency_claim_lost(), 503, None),
    ];
    for (r, status, wait) in cases {
        let res = r.default_response();
        assert_eq!(res.status(), status);
        assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(
            res.headers().get(RETRY_AFTER).map(|v| v.to_str().unwrap()),
            wait
        );
        let body = std::str::from_utf8(res.body()).unwrap();
        let start = format!(
            r#"{{"type":"about:blank","title":"{}","status":{status},"detail":""#,
            StatusCode::from_u16(status)
                .unwrap()
                .canonical_reason()
                .unwrap()
        );
        assert!(body.starts_with(&start), "{body}");
        assert!(body.ends_with("\"}"), "{body}");
    }
    let res = Rejection::invalid_idempotency_key("bad \"key\"\n").default_response();
    assert!(res.body().ends_with(br#""detail":"bad \"key\"\u000a"}"#));
    let grpc = Rejection::idempotency_mismatch()
        .for_protocol(Protocol::Grpc, &HeaderMap::new())
        .default_response();
    assert_eq!(grpc.headers()["grpc-status"], "9");
    // Another layer's 503 is the same kind of document.
    let res = Rejection::unavailable(Middleware::Lock, None).default_response();
    assert_eq!(
        std::str::from_utf8(res.body()).unwrap(),
        r#"{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"lock service unavailable"}"#
    );
}

/// A rate limit's 429 is draft-10's quota-exceeded problem naming only the
/// quotas that denied; Retry-After and the headers stay; gRPC still gets
/// trailers-only with the text message.
#[tokio::test]
async fn a_rate_limit_denial_is_a_quota_exceeded_problem() {
    use tollgate_core::{Algorithm, ManualClock, MemoryBackend, Quota};

    // 1 per second and 100 per hour: the second request trips the first
    // quota only.
    let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::FixedWindow)
        .quota(Quota::per_second(1))
        .quota(Quota::per_hour(100))
        .name("a\"pi")
        .clock(ManualClock::new(1_800_000_000_000_000))
        .build()
        .unwrap();
    limiter.check("k").await.unwrap();
    let r = Rejection::rate_limited(&limiter, limiter.check("k").await.unwrap());
    assert_eq!(r.violated_policies(), ["a\"pi-q0"]);
    let res = r.default_response();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
    assert_eq!(res.headers()[RETRY_AFTER], "1");
    assert!(res.headers().contains_key("ratelimit-policy"));
    assert_eq!(
        std::str::from_utf8(res.body()).unwrap(),
        concat!(
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#,
            r#""title":"Request cannot be satisfied as assigned quota has been exceeded","#,
            r#""status":429,"detail":"rate limit exceeded; retry in 1 s","#,
            r#""violated-policies":["a\"pi-q0"]}"#
        )
    );

    let grpc = r
        .for_protocol(Protocol::Grpc, &HeaderMap::new())
        .default_response();
    assert_eq!(grpc.status(), StatusCode::OK);
    assert_eq!(grpc.headers()["grpc-status"], "8");
    assert_eq!(
        grpc.headers()["grpc-message"],
        "rate limit exceeded; retry in 1 s"
    );
    assert!(grpc.body().is_empty());
    assert_eq!(grpc.headers()[CONTENT_TYPE], "application/grpc");
}

/// A gRPC-Web request is refused in its own content type (its client
/// checks it); a gRPC one in `application/grpc`, with or without a codec.
#[test]
fn grpc_web_rejections_keep_the_request_content_type() {
    for (request, answered) in [
        ("application/grpc-web", "application/grpc-web"),
        ("application/grpc-web+proto", "application/grpc-web+proto"),
        ("application/grpc-web-text", "application/grpc-web-text"),
        (
            "application/grpc-web-text+proto",
            "application/grpc-web-text+proto",
        ),
        ("application/grpc", "application/grpc"),
        ("application/grpc+proto", "application/grpc"),
    ] {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(request));
        let res = Rejection::busy(Some(Duration::from_secs(1)))
            .for_protocol(Protocol::Auto, &headers)
            .default_response();
        assert_eq!(res.status(), StatusCode::OK, "{request}");
        assert_eq!(res.headers()[CONTENT_TYPE], answered, "{request}");
        assert!(res.headers().contains_key("grpc-status"), "{request}");
    }
}

/// Other rejections keep no violated policies.
#[test]
fn only_rate_limit_denials_name_policies() {
    assert!(Rejection::busy(None).violated_policies().is_empty());
    assert!(Rejection::too_many_in_flight(None, None)
        .violated_policies()
        .is_empty());
}

/// Where each reason is counted in [`every_reason_answers_a_problem_document`];
/// no wildcard arm, so a new reason does not compile until it is covered.
fn slot(reason: RejectionReason) -> usize {
    use RejectionReason as R;
    match reason {
        R::RateLimited => 0,
        R::CostExceedsCapacity { .. } => 1,
        R::Unavailable => 2,
        R::Busy => 3,
        R::TooManyInFlight => 4,
        R::LeaseLost => 5,
        R::Key { .. } => 6,
        R::Internal => 7,
        R::IdempotencyConflict => 8,
        R::IdempotencyMismatch => 9,
        R::InvalidIdempotencyKey => 10,
        R::PayloadTooLarge => 11,
    }
}

/// Every reason, from every constructor, answers HTTP with a problem
/// document: its content type, its `status` the response's, its `detail`
/// the message (escaped: client input can reach it), `about:blank` but for
/// the rate limit's quota-exceeded; headers and gRPC answers as before.
#[tokio::test]
async fn every_reason_answers_a_problem_document() {
    use tollgate_core::{Algorithm, MemoryBackend, Quota};

    let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::FixedWindow)
        .quota(Quota::per_minute(1))
        .name("api")
        .build()
        .unwrap();
    limiter.check("k").await.unwrap();
    let denied = limiter.check("k").await.unwrap();
    let secs = Duration::from_secs;
    let policy = HeaderValue::from_static(r#""p";q=2;qu="concurrent-requests""#);
    let cost = || Error::CostExceedsCapacity {
        cost: 5,
        capacity: 2,
    };
    let rejections = [
        Rejection::rate_limited(&limiter, denied),
        Rejection::cost_exceeds_capacity(5, 2),
        Rejection::limiter_error(&limiter, cost()),
        Rejection::from_error(Middleware::RateLimit, cost()),
        Rejection::unavailable(Middleware::RateLimit, Some(Error::CircuitOpen)),
        Rejection::unavailable(Middleware::Lock, None),
        Rejection::unavailable(Middleware::ConcurrencyLimit, None),
        Rejection::unavailable(Middleware::Idempotency, None),
        Rejection::busy(Some(secs(3))),
        Rejection::too_many_in_flight(None, Some(policy)),
        Rejection::lease_lost(),
        Rejection::permit_lost(),
        Rejection::key(KeyError::unauthorized("missing \"x-api-key\"\\\n\t\u{1}é")),
        Rejection::bad_request("missing x-user header"),
        Rejection::key(KeyError::internal("no peer address")),
        Rejection::unreadable_body(),
        Rejection::misconfigured("add the layer"),
        Rejection::from_error(Middleware::Lock, Error::InvalidConfig("ttl is 0".into())),
        Rejection::idempotency_in_flight(Some(secs(2))),
        Rejection::idempotency_not_replayable(201),
        Rejection::idempotency_mismatch(),
        Rejection::invalid_idempotency_key("bad key"),
        Rejection::payload_too_large(10),
    ];
    let mut seen = [false; 12];
    for r in rejections {
        let reason = r.reason();
        seen[slot(reason)] = true;
        let res = r.default_response();
        assert_eq!(res.status(), r.status(), "{r:?}");
        let v = problem_of(&res);
        assert_eq!(v["detail"], r.message(), "{v}");
        let members = v.as_object().unwrap().len();
        if reason == RejectionReason::RateLimited {
            assert_eq!(v["type"], QUOTA_EXCEEDED, "{v}");
            assert_eq!(v["violated-policies"], serde_json::json!(["api"]), "{v}");
            assert_eq!(members, 5, "{v}");
        } else {
            assert_eq!(v["type"], "about:blank", "{v}");
            let phrase = res.status().canonical_reason().unwrap();
            assert_eq!(v["title"], phrase, "{v}");
            assert_eq!(members, 4, "{v}");
        }
        // The headers are the rejection's own and the content type, no more.
        let wait = r.retry_after().map(|w| w.as_secs().to_string());
        let sent = res.headers().get(RETRY_AFTER).map(|v| v.to_str().unwrap());
        assert_eq!(sent, wait.as_deref(), "{r:?}");
        for (name, value) in r.headers() {
            assert_eq!(res.headers().get(name), Some(value), "{r:?}");
        }
        let own = usize::from(wait.is_some()) + 1;
        assert_eq!(res.headers().len(), r.headers().len() + own, "{r:?}");

        let grpc = r
            .for_protocol(Protocol::Grpc, &HeaderMap::new())
            .default_response();
        assert_eq!(grpc.status(), StatusCode::OK);
        assert_eq!(grpc.headers()[CONTENT_TYPE], "application/grpc");
        let code = reason.grpc_code().code().to_string();
        assert_eq!(grpc.headers()["grpc-status"], code.as_str(), "{reason:?}");
        assert!(grpc.body().is_empty());
    }
    assert_eq!(seen, [true; 12], "a reason without a rejection above");
}
