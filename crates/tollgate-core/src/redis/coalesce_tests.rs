//! Unit tests of `coalesce.rs`, with a fake sender.

use super::*;

#[test]
fn a_tag_is_what_redis_cluster_hashes() {
    let tag = hash_tag;
    assert_eq!(tag("tg:api:gcra:{alice}"), "alice");
    assert_eq!(tag("tg:api:gcra:{alice}:x{y}"), "alice");
    assert_eq!(tag("a{}b"), "a{}b");
    assert_eq!(tag("plain"), "plain");
    assert_eq!(tag("{open"), "{open");
}

#[test]
fn limits_stay_sane() {
    let c = Coalescing::default().max_batch(0);
    assert_eq!(c.batch_limit(), 1);
    // Off, then on again: the order of the calls does not matter.
    let c = Coalescing::off().max_batch(32);
    assert_eq!((c.batch_limit(), c.calls_limit()), (32, DEFAULT_CALLS));
    let c = Coalescing::default().max_calls_in_flight(0);
    assert_eq!(c.calls_limit(), 1);
    assert_eq!(Coalescing::default().max_batch(4).script_threshold(), 4);
    assert_eq!(Coalescing::default().script_threshold(), 8);
}

/// A sender that records its calls; single calls wait for the gate.
#[derive(Clone, Default)]
struct Fake {
    calls: Arc<Mutex<Vec<Vec<u64>>>>,
    gate: Arc<tokio::sync::Notify>,
    /// When set, a batch waits for it before its answers come back.
    batch_gate: Option<Arc<tokio::sync::Notify>>,
    cross_slot: bool,
    /// When set, checks are grouped for lean batches as the connection
    /// groups them.
    lean: bool,
}

/// Each check's answer carries its nonce, so a check can tell its own.
fn answer(r: &RateRequest) -> Result<RateReply> {
    Ok(RateReply::new(true, smallvec::smallvec![]).at(r.nonce))
}

impl Sender for Fake {
    fn lean_group(&self, r: &RateRequest) -> Option<LeanGroup> {
        self.lean.then(|| LeanGroup::of(r)).flatten()
    }

    fn one<'a>(&'a self, r: &'a RateRequest) -> BoxFuture<'a, Result<RateReply>> {
        Box::pin(async move {
            self.calls.lock().unwrap().push(vec![r.nonce]);
            if r.nonce == 0 {
                self.gate.notified().await;
            }
            answer(r)
        })
    }

    fn batch<'a>(
        &'a self,
        rs: &'a [RateRequest],
        group: Option<LeanGroup>,
    ) -> BoxFuture<'a, redis::RedisResult<Vec<Result<RateReply>>>> {
        Box::pin(async move {
            assert!(
                rs.iter().all(|r| self.lean_group(r) == group),
                "a batch's group is every check's"
            );
            if self.cross_slot && !one_tag(rs) {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Server(redis::ServerErrorKind::CrossSlot),
                    "CROSSSLOT",
                )));
            }
            self.calls
                .lock()
                .unwrap()
                .push(rs.iter().map(|r| r.nonce).collect());
            if let Some(gate) = &self.batch_gate {
                gate.notified().await;
            }
            Ok(rs.iter().map(answer).collect())
        })
    }
}

fn request(subject: &str, nonce: u64) -> RateRequest {
    RateRequest {
        algorithm: crate::store::Algorithm::Gcra,
        keys: vec![format!("tg:api:gcra:{{{subject}}}")],
        quotas: vec![crate::quota::Quota::per_second(1)].into(),
        cost: 1,
        now_micros: None,
        store_clock: false,
        nonce,
        max_wait_micros: 0,
        deadline: None,
        unclaimed: None,
    }
}

/// A queued check's copy made in a spare key list (longer, shorter or
/// empty) is the request, field for field.
#[test]
fn a_copy_in_a_spare_key_list_is_the_request() {
    let mut lane = Lane::default();
    lane.spare_keys
        .push(vec!["a key longer than any here".into(); 3]);
    lane.spare_keys.push(Vec::new());
    let mut r = request("bob", 7);
    r.keys.push("tg:api:block:{bob}".into());
    (r.cost, r.now_micros, r.max_wait_micros) = (3, Some(5), 9);
    r.deadline = Some(std::time::Instant::now());
    for _ in 0..3 {
        let copy = lane.copy(&r);
        assert_eq!(format!("{copy:?}"), format!("{r:?}"));
    }
}

/// A request whose admission, if nobody receives it, is reported on `tx`.
fn watched(subject: &str, nonce: u64, tx: &tokio::sync::mpsc::UnboundedSender<u64>) -> RateRequest {
    let tx = tx.clone();
    let mut r = request(subject, nonce);
    r.unclaimed = Some(Unclaimed::new(move |r, _| {
        let _ = tx.send(r.nonce);
        Box::pin(async {})
    }));
    r
}

/// The nonces given back, `n` of them, sorted: a bounded wait.
async fn given_back(rx: &mut tokio::sync::mpsc::UnboundedReceiver<u64>, n: usize) -> Vec<u64> {
    let mut got = Vec::new();
    while got.len() < n {
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv()).await;
        got.push(next.expect("given back in time").expect("open"));
    }
    got.sort_unstable();
    got
}

#[tokio::test]
async fn an_admission_whose_caller_left_during_its_call_is_given_back() {
    let fake = Fake::default();
    let c = Coalescer::new(fake.clone(), Coalescing::default(), false, None);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let caller = tokio::spawn({
        let (c, r) = (c.clone(), watched("a", 0, &tx));
        async move { c.check(&r).await }
    });
    // Sent (it waits at the gate), then its caller gives up.
    while fake.calls.lock().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());
    assert!(rx.try_recv().is_err(), "nothing decided yet");
    fake.gate.notify_one();
    assert_eq!(given_back(&mut rx, 1).await, [0]);
}

/// A queued check whose reply reached its channel, but whose caller left
/// before reading it: the admission nobody received is given back.
#[tokio::test]
async fn an_admission_whose_reply_was_never_read_is_given_back() {
    let fake = Fake::default();
    let c = Coalescer::new(
        fake.clone(),
        Coalescing::default().max_calls_in_flight(1),
        false,
        None,
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let first = tokio::spawn({
        let c = c.clone();
        async move { c.check(&request("a", 0)).await }
    });
    while fake.calls.lock().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    // Polled once: queued behind the first call, then left unpolled.
    let r = watched("a", 1, &tx);
    let mut caller = Box::pin(c.check(&r));
    assert!(futures_util::poll!(caller.as_mut()).is_pending());
    queued(&c, 1).await;
    fake.gate.notify_one();
    first.await.unwrap().unwrap();
    // Its batch was answered into its channel, and the turn given back.
    for _ in 0..100_000 {
        if fake.calls.lock().unwrap().len() == 2 && c.lock().main.in_flight == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(c.lock().main.in_flight, 0, "the batch was answered");
    assert!(
        rx.try_recv().is_err(),
        "received by nobody yet, given back by nobody"
    );
    drop(caller);
    assert_eq!(given_back(&mut rx, 1).await, [1]);
}

#[tokio::test]
async fn admissions_of_a_batch_nobody_waits_for_are_given_back() {
    for keep in [false, true] {
        let batch_gate = Arc::new(tokio::sync::Notify::new());
        let fake = Fake {
            batch_gate: Some(batch_gate.clone()),
            ..Fake::default()
        };
        let c = Coalescer::new(
            fake.clone(),
            Coalescing::default().max_calls_in_flight(1),
            false,
            None,
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let first = tokio::spawn({
            let c = c.clone();
            async move { c.check(&request("a", 0)).await }
        });
        let mut waiting = Vec::new();
        for i in 1..=10 {
            let (c, r) = (c.clone(), watched("a", i, &tx));
            waiting.push(tokio::spawn(async move { c.check(&r).await }));
        }
        queued(&c, 10).await;
        fake.gate.notify_one();
        first.await.unwrap().unwrap();
        // The ten went out as one batch, which hangs until the gate opens.
        while fake.calls.lock().unwrap().len() < 2 {
            tokio::task::yield_now().await;
        }
        // Every caller gives up, or (keep) the odd ones stay.
        let mut live = Vec::new();
        for (i, task) in waiting.into_iter().enumerate() {
            let nonce = i as u64 + 1;
            if keep && nonce % 2 == 1 {
                live.push((nonce, task));
            } else {
                task.abort();
                assert!(task.await.unwrap_err().is_cancelled());
            }
        }
        batch_gate.notify_one();
        let gone: Vec<u64> = (1..=10).filter(|n| !keep || n % 2 == 0).collect();
        assert_eq!(given_back(&mut rx, gone.len()).await, gone, "keep {keep}");
        for (nonce, task) in live {
            assert_eq!(task.await.unwrap().unwrap().now_micros, nonce);
        }
        assert!(rx.try_recv().is_err(), "only admissions nobody received");
    }
}

/// Checks arriving while the one turn is taken wait, then go out as one
/// batch in arrival order, each with its own answer.
async fn queued_checks_share_one_call(fake: Fake, subjects: &[&str]) -> Vec<Vec<u64>> {
    let c = Coalescer::new(
        fake.clone(),
        Coalescing::default().max_calls_in_flight(1),
        false,
        None,
    );
    let first = tokio::spawn({
        let c = c.clone();
        async move { c.check(&request("a", 0)).await }
    });
    let mut rest = Vec::new();
    for (i, s) in subjects.iter().enumerate() {
        let (c, r) = (c.clone(), request(s, i as u64 + 1));
        rest.push(tokio::spawn(async move { c.check(&r).await }));
    }
    // Wait until every later check is queued behind the first.
    queued(&c, subjects.len()).await;
    fake.gate.notify_one();
    assert_eq!(first.await.unwrap().unwrap().now_micros, 0);
    for (i, r) in rest.into_iter().enumerate() {
        assert_eq!(r.await.unwrap().unwrap().now_micros, i as u64 + 1);
    }
    let calls = fake.calls.lock().unwrap().clone();
    calls
}

/// Checks `rest` queued behind a first check, as [`queued_checks_share_one_call`].
async fn queued_behind_one(fake: Fake, rest: Vec<RateRequest>) -> Vec<Vec<u64>> {
    let c = Coalescer::new(fake.clone(), Coalescing::default(), false, None);
    let first = tokio::spawn({
        let c = c.clone();
        async move { c.check(&request("a", 0)).await }
    });
    let n = rest.len();
    let tasks: Vec<_> = rest
        .into_iter()
        .map(|r| {
            let c = c.clone();
            tokio::spawn(async move { c.check(&r).await })
        })
        .collect();
    queued(&c, n).await;
    fake.gate.notify_one();
    first.await.unwrap().unwrap();
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap().unwrap().now_micros, i as u64 + 1);
    }
    let calls = fake.calls.lock().unwrap().clone();
    calls
}

/// A request that may wait for a slot: no lean batch takes it.
fn waiting(subject: &str, nonce: u64) -> RateRequest {
    let mut r = request(subject, nonce);
    r.max_wait_micros = 1_000;
    r
}

/// A limiter's checks go as one lean call from two up, whatever else waits
/// with them; the others (too few for the batch script) go alone, each
/// check with its own answer.
#[tokio::test]
async fn a_limiters_waiting_checks_go_in_one_lean_call() {
    let fake = Fake {
        lean: true,
        ..Fake::default()
    };
    let rest = vec![
        request("a", 1),
        waiting("b", 2),
        request("c", 3),
        request("d", 4),
        waiting("e", 5),
    ];
    let calls = queued_behind_one(fake, rest).await;
    assert_eq!(calls, [vec![0], vec![1, 3, 4], vec![2], vec![5]]);
}

/// A key in two parts of a batch keeps its arrival order: the batch goes
/// the way it would without lean calls.
#[tokio::test]
async fn a_key_in_two_parts_keeps_the_batch_in_order() {
    let fake = Fake {
        lean: true,
        ..Fake::default()
    };
    let rest = vec![request("a", 1), waiting("a", 2), request("b", 3)];
    let calls = queued_behind_one(fake, rest).await;
    assert_eq!(calls, [vec![0], vec![1], vec![2], vec![3]]);
}

/// A key in two parts keeps its order whichever of a check's state keys it
/// is: a two-quota check (no lean batch takes it) whose second key is a
/// lean check's key keeps the batch in order too.
#[tokio::test]
async fn a_check_sharing_a_later_key_keeps_the_batch_in_order() {
    let fake = Fake {
        lean: true,
        ..Fake::default()
    };
    let mut two = request("x", 2);
    two.keys.push(request("a", 0).keys[0].clone());
    two.quotas = vec![
        crate::quota::Quota::per_second(1),
        crate::quota::Quota::per_minute(10),
    ]
    .into();
    let rest = vec![request("a", 1), two, request("b", 3)];
    let calls = queued_behind_one(fake, rest).await;
    assert_eq!(calls, [vec![0], vec![1], vec![2], vec![3]]);
}

#[tokio::test]
async fn waiting_checks_go_out_together_in_order() {
    let subjects = ["a"; 10];
    let calls = queued_checks_share_one_call(Fake::default(), &subjects).await;
    assert_eq!(calls, [vec![0], (1..=10).collect::<Vec<_>>()]);
}

#[tokio::test]
async fn checks_whose_callers_gave_up_are_never_sent() {
    let fake = Fake::default();
    let c = Coalescer::new(
        fake.clone(),
        Coalescing::default().max_calls_in_flight(1),
        false,
        None,
    );
    let first = tokio::spawn({
        let c = c.clone();
        async move { c.check(&request("a", 0)).await }
    });
    let mut waiting = Vec::new();
    for i in 1..=10 {
        let (c, r) = (c.clone(), request("a", i));
        waiting.push(tokio::spawn(async move { c.check(&r).await }));
    }
    queued(&c, 10).await;
    // Half of them give up while queued (their futures are dropped).
    let (gone, live): (Vec<_>, Vec<_>) = waiting
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    for (_, task) in gone {
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }
    fake.gate.notify_one();
    let mut kept = Vec::new();
    for (i, task) in live {
        kept.push((i as u64 + 1, task.await.unwrap().unwrap().now_micros));
    }
    first.await.unwrap().unwrap();
    let calls = fake.calls.lock().unwrap().clone();
    // Only the five still waiting went out (as single calls: under the
    // batch threshold), each with its own answer.
    let mut sent: Vec<u64> = calls[1..].iter().flatten().copied().collect();
    sent.sort_unstable();
    assert_eq!(sent, [2, 4, 6, 8, 10]);
    assert!(
        kept.iter().all(|(nonce, answer)| nonce == answer),
        "{kept:?}"
    );
}

#[tokio::test]
async fn a_refused_call_of_several_tags_is_split_by_tag() {
    let fake = Fake {
        cross_slot: true,
        ..Fake::default()
    };
    let subjects: Vec<&str> = (0..16).map(|i| ["a", "b"][i % 2]).collect();
    let calls = queued_checks_share_one_call(fake, &subjects).await;
    // Refused whole, then one call per tag, each in arrival order.
    let mut rest = calls[1..].to_vec();
    rest.sort();
    assert_eq!(calls[0], [0]);
    let odd: Vec<u64> = (1..=16).step_by(2).collect();
    let even: Vec<u64> = (2..=16).step_by(2).collect();
    assert_eq!(rest, [odd, even]);
}

/// Waits until `n` checks are queued: a bounded wait, so a regression
/// fails instead of hanging.
async fn queued<S: Sender>(c: &Coalescer<S>, n: usize) {
    for _ in 0..100_000 {
        if c.lock().main.queue.len() >= n {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{n} checks never queued: {}", c.lock().main.queue.len());
}
