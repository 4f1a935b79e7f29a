//! Quota leases on one process: what a hot subject is served from, what a
//! cold one never does, the give-back, revocation by an operator's reset or
//! block on every instance, and the algorithms that cannot lease.

use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use tollgate_core::store::{
    LeaseReply, LeaseSize, RateReply, RateRequest, SettleReply, SettleRequest,
};
use tollgate_core::{
    Algorithm, DecisionSource, Error, ManualClock, MemoryBackend, Quota, QuotaLeases, RateBackend,
    RateLimiter, RateLimiterBuilder, RedisBackend, Result, Subject,
};
use tollgate_testkit::RedisServer;

/// Polls `f` until it holds, for at most 10 s.
async fn wait_for(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Leases that stay for the whole test: hot after 5 checks, a slice of up
/// to a minute of the subject's rate, living a minute.
fn long_leases() -> QuotaLeases {
    QuotaLeases::default()
        .hot_checks(5)
        .target(Duration::from_secs(60))
        .max_age(Duration::from_secs(60))
}

/// A limiter of `quota` named `name` on the first backend with `leases`,
/// and its peer without them on the second (both on one store).
fn with_peer(
    (leased, plain): (impl RateBackend, impl RateBackend),
    alg: Algorithm,
    quota: Quota,
    name: &str,
    leases: QuotaLeases,
) -> (RateLimiter, RateLimiter) {
    let build = |b: RateLimiterBuilder| b.quota(quota).name(name);
    let limiter = build(RateLimiter::builder(leased, alg))
        .quota_leases(leases)
        .build()
        .unwrap();
    let peer = build(RateLimiter::builder(plain, alg)).build().unwrap();
    (limiter, peer)
}

/// The units a limiter without leases sees left (a check of cost 0).
async fn remaining(peer: &RateLimiter, subject: &str) -> u64 {
    peer.check_n(subject, 0).await.unwrap().remaining
}

#[test]
fn the_sliding_windows_and_a_zero_age_cannot_lease() {
    for alg in [Algorithm::SlidingWindowLog, Algorithm::SlidingWindowCounter] {
        let built = RateLimiter::builder(MemoryBackend::new(), alg)
            .quota(Quota::per_second(100))
            .quota_leases(QuotaLeases::default())
            .build();
        assert!(
            matches!(&built, Err(Error::InvalidConfig(m)) if m.contains("sliding window")),
            "{alg:?}: {built:?}"
        );
    }
    let built = RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
        .quota(Quota::per_second(100))
        .quota_leases(QuotaLeases::default().max_age(Duration::ZERO))
        .build();
    assert!(matches!(built, Err(Error::InvalidConfig(_))), "{built:?}");
}

/// On the memory store: a hot subject is served from its slice (no more
/// than the quota holds), reports the units left in it, and once the quota
/// is spent is refused with a retry-after.
#[tokio::test]
async fn a_hot_subject_is_served_from_its_slice_in_memory() {
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ] {
        let limiter = RateLimiter::builder(MemoryBackend::new(), alg)
            .quota(Quota::per_hour(800))
            .quota_leases(long_leases())
            .build()
            .unwrap();
        let (mut admitted, mut leased, mut denied) = (0u64, 0u64, None);
        for _ in 0..1000 {
            let d = limiter.check("hot").await.unwrap();
            if d.allowed {
                admitted += 1;
                if d.source == DecisionSource::Lease {
                    leased += 1;
                    assert_eq!(d.charge.map(|c| c.cost()), Some(1), "a served charge");
                }
            } else if denied.is_none() {
                denied = Some(d);
            }
        }
        // A slice is at most 1/8 of 800 = 100 units; fewer than a quarter
        // of a slice (25) are left to nobody.
        assert!(admitted <= 800, "{alg:?}: {admitted} admitted");
        assert!(admitted > 800 - 25, "{alg:?}: {admitted} admitted");
        assert!(leased > 700, "{alg:?}: only {leased} served from slices");
        let denied = denied.expect("the quota ran out");
        assert!(denied.retry_after.unwrap() > Duration::ZERO, "{denied:?}");
    }
}

/// A fixed window's slice is never served past the end of the window its
/// units were counted in: the next window admits no more than its limit.
#[tokio::test]
async fn a_fixed_windows_slice_ends_with_its_window() {
    // 900 ms into a one-second window.
    let clock = ManualClock::new(1_700_000_000_900_000);
    let limiter = RateLimiter::builder(
        MemoryBackend::with_clock(clock.clone()),
        Algorithm::FixedWindow,
    )
    .quota(Quota::per_second(100))
    .clock(clock.clone())
    .quota_leases(long_leases())
    .build()
    .unwrap();
    let mut leased = false;
    for _ in 0..10 {
        leased |= limiter.check("hot").await.unwrap().source == DecisionSource::Lease;
    }
    assert!(leased, "a slice serves before the window ends");
    clock.advance(Duration::from_millis(101));
    let mut admitted = 0;
    for _ in 0..300 {
        admitted += u64::from(limiter.check("hot").await.unwrap().allowed);
    }
    assert!(admitted <= 100, "{admitted} admitted in the next window");
}

/// An instance tracks the rates of a bounded number of subjects: beyond
/// it a subject is checked as a cold one, until trackers idle for a window
/// make room.
#[tokio::test]
async fn rate_tracking_is_bounded() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let limiter = RateLimiter::builder(MemoryBackend::with_clock(clock.clone()), Algorithm::Gcra)
        .quota(Quota::per_hour(100_000))
        .clock(clock.clone())
        .quota_leases(long_leases().tracked_subjects(2))
        .build()
        .unwrap();
    let leased = async |subject: &str| {
        let mut leased = 0;
        for _ in 0..50 {
            let d = limiter.check(subject).await.unwrap();
            leased += usize::from(d.source == DecisionSource::Lease);
        }
        leased
    };
    assert!(leased("a").await > 0);
    assert!(leased("b").await > 0);
    assert_eq!(leased("c").await, 0, "no room to track c");
    // Given back, a's and b's trackers hold no slice; idle past a window,
    // they make room.
    limiter.return_leases().await;
    clock.advance(Duration::from_millis(300));
    assert!(leased("c").await > 0, "room once a and b idled");
}

/// A served decision's `remaining` counts down the slice.
#[tokio::test]
async fn a_served_decision_reports_the_units_left_in_its_slice() {
    let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::FixedWindow)
        .quota(Quota::per_hour(800))
        .quota_leases(long_leases())
        .build()
        .unwrap();
    let mut last = None;
    for _ in 0..30 {
        let d = limiter.check("hot").await.unwrap();
        if d.source == DecisionSource::Lease {
            if let Some(prev) = last {
                assert_eq!(d.remaining + 1, prev, "one unit of the slice per check");
            }
            last = Some(d.remaining);
        } else {
            last = Some(d.remaining);
        }
    }
    assert!(last.is_some_and(|r| r < 100), "{last:?}");
}

/// A subject checked less often than `hot_checks` per 100 ms never leases:
/// one script call per check, and the store took exactly what was admitted.
#[tokio::test]
async fn a_cold_subject_never_leases() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let (limiter, peer) = with_peer(
        (backend.clone(), backend),
        Algorithm::FixedWindow,
        Quota::per_hour(10_000),
        "cold",
        QuotaLeases::default().hot_checks(20),
    );
    limiter.check("warm-up").await.unwrap();
    let before = server.command_calls("evalsha");
    for _ in 0..15 {
        let d = limiter.check("cold").await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.source, DecisionSource::Backend);
    }
    assert_eq!(
        server.command_calls("evalsha") - before,
        15,
        "a call per check"
    );
    assert_eq!(
        remaining(&peer, "cold").await,
        10_000 - 15,
        "nothing leased"
    );
}

/// A hot subject on Redis: a few script calls serve many checks, and
/// `return_leases` gives back what the slice did not serve.
#[tokio::test]
async fn return_leases_gives_back_what_was_not_served() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let (limiter, peer) = with_peer(
        (backend.clone(), backend),
        Algorithm::FixedWindow,
        Quota::per_hour(100_000),
        "back",
        long_leases(),
    );
    limiter.check("warm-up").await.unwrap();
    let before = server.command_calls("evalsha");
    for _ in 0..400 {
        assert!(limiter.check("hot").await.unwrap().allowed);
    }
    let calls = server.command_calls("evalsha") - before;
    assert!(calls < 40, "{calls} script calls for 400 checks");
    assert!(
        remaining(&peer, "hot").await < 100_000 - 400,
        "the slice holds units not yet served"
    );
    limiter.return_leases().await;
    assert_eq!(remaining(&peer, "hot").await, 100_000 - 400);
}

/// Dropping the last clone of a limiter gives back what its slices held
/// (in the background).
#[tokio::test]
async fn a_dropped_limiter_gives_its_slices_back() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let (limiter, peer) = with_peer(
        (backend.clone(), backend),
        Algorithm::Gcra,
        Quota::per_hour(100_000),
        "dropped",
        long_leases(),
    );
    for _ in 0..400 {
        assert!(limiter.check("hot").await.unwrap().allowed);
    }
    assert!(
        remaining(&peer, "hot").await < 100_000 - 400,
        "a slice holds units"
    );
    drop(limiter);
    // The GCRA refills meanwhile: at least what was not served comes back.
    wait_for("the slice given back", async || {
        remaining(&peer, "hot").await >= 100_000 - 400
    })
    .await;
}

/// Two limiters of one policy on two connections (two instances), both
/// holding a slice of one subject: an operator's block on one stops both
/// at once (no slice serves past it), and a reset drops the slices of
/// every instance.
#[tokio::test]
async fn reset_and_block_revoke_leases_on_every_instance() {
    let server = RedisServer::start().unwrap();
    let instance = || async {
        let backend = RedisBackend::connect(&server.url()).await.unwrap();
        RateLimiter::builder(backend, Algorithm::Gcra)
            .quota(Quota::per_hour(1_000_000))
            .name("revoked")
            .quota_leases(long_leases())
            .build()
            .unwrap()
    };
    let (a, b) = (instance().await, instance().await);
    let subject = Subject::new("hot");
    // Both hold a slice.
    for limiter in [&a, &b] {
        wait_for("a slice", async || {
            limiter.check(subject.clone()).await.unwrap().source == DecisionSource::Lease
        })
        .await;
    }
    a.reset(&subject).await.unwrap();
    for limiter in [&a, &b] {
        wait_for("the reset dropped the slice", async || {
            limiter.check(subject.clone()).await.unwrap().source != DecisionSource::Lease
        })
        .await;
    }
    // Both lease again, then a block stops both.
    for limiter in [&a, &b] {
        wait_for("a slice again", async || {
            limiter.check(subject.clone()).await.unwrap().source == DecisionSource::Lease
        })
        .await;
    }
    a.block(&subject, Duration::from_secs(60)).await.unwrap();
    assert!(
        a.check(subject.clone()).await.unwrap().is_denied(),
        "at once here"
    );
    wait_for("the other instance refuses", async || {
        b.check(subject.clone()).await.unwrap().is_denied()
    })
    .await;
    for limiter in [&a, &b] {
        for _ in 0..50 {
            let d = limiter.check(subject.clone()).await.unwrap();
            assert!(d.is_denied(), "{d:?}");
        }
    }
}

/// Decisions served from a slice are admissions like any other on the
/// operator plane: its traffic counts every one of them.
#[tokio::test]
async fn served_admissions_are_counted_by_the_operator_plane() {
    use tollgate_core::admin::Admin;

    let backend = MemoryBackend::new();
    let limiter = RateLimiter::builder(backend.clone(), Algorithm::Gcra)
        .quota(Quota::per_hour(800))
        .prefix("served")
        .name("served")
        .quota_leases(long_leases())
        .build()
        .unwrap();
    let (mut admitted, mut leased) = (0u64, 0u64);
    for _ in 0..300 {
        let d = limiter.check("hot").await.unwrap();
        admitted += u64::from(d.allowed);
        leased += u64::from(d.source == DecisionSource::Lease);
    }
    assert!(leased > 200, "{leased} served from slices");
    // Counts go out once a second; the figure averages whole seconds.
    let admin = Admin::new(backend).with_prefix("served");
    wait_for("every admission is counted", async || {
        let Ok(limiters) = admin.limiters().await else {
            return false;
        };
        limiters.iter().any(|l| {
            l.traffic
                .as_ref()
                .is_some_and(|t| (t.allowed_per_second * 5.0).round() as u64 == admitted)
        })
    })
    .await;
}

/// A memory store whose first lease call takes its units, then waits at a
/// gate before it answers: a take in flight, for an admin action to land
/// in. Everything else goes straight through.
#[derive(Debug, Clone)]
struct GatedLease {
    inner: MemoryBackend,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    entered: std::sync::Arc<tokio::sync::Notify>,
    gate: std::sync::Arc<tokio::sync::Semaphore>,
}

impl RateBackend for GatedLease {
    fn check_rate<'a>(&'a self, request: &'a RateRequest) -> BoxFuture<'a, Result<RateReply>> {
        self.inner.check_rate(request)
    }

    fn check_rate_now(&self, request: &RateRequest) -> Option<Result<RateReply>> {
        self.inner.check_rate_now(request)
    }

    fn settle_rate<'a>(&'a self, request: &'a SettleRequest) -> BoxFuture<'a, Result<SettleReply>> {
        self.inner.settle_rate(request)
    }

    fn settle_rate_now(&self, request: &SettleRequest) -> Option<Result<SettleReply>> {
        self.inner.settle_rate_now(request)
    }

    fn supports_leases(&self) -> bool {
        true
    }

    fn lease_rate<'a>(
        &'a self,
        request: &'a RateRequest,
        size: LeaseSize,
    ) -> BoxFuture<'a, Result<LeaseReply>> {
        Box::pin(async move {
            let taken = self.inner.lease_rate(request, size).await;
            if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                self.entered.notify_one();
                drop(self.gate.acquire().await);
            }
            taken
        })
    }

    fn lease_rate_now(&self, _: &RateRequest, _: LeaseSize) -> Option<Result<LeaseReply>> {
        None
    }

    fn local_rate(&self) -> std::sync::Arc<dyn RateBackend> {
        self.inner.local_rate()
    }

    fn kind(&self) -> &'static str {
        "gated"
    }

    fn decision_clock(&self) -> Option<std::sync::Arc<dyn tollgate_core::Clock>> {
        self.inner.decision_clock()
    }

    fn admin(&self) -> Option<std::sync::Arc<dyn tollgate_core::store::AdminBackend>> {
        self.inner.admin()
    }
}

/// A take whose call is in flight when a block lands installs no slice,
/// and gives back what it took beyond its check: the fleet's quota keeps
/// every unit no check used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_in_flight_during_a_block_gives_its_units_back() {
    let memory = MemoryBackend::new();
    let gated = GatedLease {
        inner: memory.clone(),
        armed: Default::default(),
        entered: Default::default(),
        gate: std::sync::Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let (leasing, peer) = with_peer(
        (gated.clone(), memory),
        Algorithm::FixedWindow,
        Quota::per_hour(100_000),
        "gated",
        long_leases(),
    );
    let subject = Subject::new("hot");
    gated.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    // Checks until the first take is held at the gate (and one more, at
    // most, once it has answered).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checks = tokio::spawn({
        let (leasing, subject, stop) = (leasing.clone(), subject.clone(), stop.clone());
        async move {
            let mut admitted = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let d = leasing.check(subject.clone()).await.unwrap();
                admitted += u64::from(d.allowed);
            }
            admitted
        }
    });
    tokio::time::timeout(Duration::from_secs(10), gated.entered.notified())
        .await
        .expect("a take");
    let held = 100_000 - remaining(&peer, "hot").await;
    leasing
        .block(&subject, Duration::from_secs(60))
        .await
        .unwrap();
    gated.gate.add_permits(1);
    // The checks end once the take has answered (every check after it is
    // refused by the block, and takes nothing).
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let admitted = checks.await.unwrap();
    assert!(
        held > admitted + 10,
        "the take took a slice ({held} for {admitted} checks)"
    );
    leasing.unblock(&subject).await.unwrap();
    wait_for("the take's units given back", async || {
        remaining(&peer, "hot").await == 100_000 - admitted
    })
    .await;
}

/// A block whose write times out (the server froze as it was sent) may
/// land all the same: this instance's slices of the subject go at once,
/// so once the server answers again nothing serves the blocked subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_that_times_out_still_revokes_the_leases() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let limiter = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(Quota::per_hour(1_000_000))
        .name("frozen-block")
        .quota_leases(long_leases())
        .build()
        .unwrap();
    let subject = Subject::new("hot");
    wait_for("a slice", async || {
        limiter.check(subject.clone()).await.unwrap().source == DecisionSource::Lease
    })
    .await;
    // Its scripts loaded (a first call after NOSCRIPT would not land).
    let other = Subject::new("warm-up");
    limiter.block(&other, Duration::from_secs(1)).await.unwrap();
    server.pause();
    let blocked = limiter.block(&subject, Duration::from_secs(60)).await;
    server.resume();
    assert!(matches!(blocked, Err(Error::Timeout(_))), "{blocked:?}");
    // The block's write ran once the server woke: every check is refused,
    // none served from the slice.
    for _ in 0..20 {
        let d = limiter.check(subject.clone()).await.unwrap();
        assert!(d.is_denied() && d.source != DecisionSource::Lease, "{d:?}");
    }
}

/// `return_leases` waits for the give-backs already on their way: a block
/// ends the subject's slice and sends its unused units back from a task,
/// and a process that stops right after `return_leases` loses none of them
/// (on this current-thread runtime the task runs only once the test waits).
#[tokio::test]
async fn return_leases_waits_for_give_backs_on_their_way() {
    let memory = MemoryBackend::new();
    let (limiter, peer) = with_peer(
        (memory.clone(), memory),
        Algorithm::FixedWindow,
        Quota::per_hour(100_000),
        "on-their-way",
        long_leases(),
    );
    let subject = Subject::new("hot");
    let mut admitted = 0;
    loop {
        let d = limiter.check(subject.clone()).await.unwrap();
        admitted += 1;
        if d.source == DecisionSource::Lease {
            break;
        }
    }
    assert!(
        remaining(&peer, "hot").await < 100_000 - admitted,
        "a slice is held"
    );
    limiter
        .block(&subject, Duration::from_secs(60))
        .await
        .unwrap();
    limiter.return_leases().await;
    limiter.unblock(&subject).await.unwrap();
    assert_eq!(remaining(&peer, "hot").await, 100_000 - admitted);
}
