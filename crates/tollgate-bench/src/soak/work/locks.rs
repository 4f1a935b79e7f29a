//! The lock and permit workload: critical sections under fenced locks
//! and semaphore permits, entered into a shared [`Table`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_core::{Error, FailurePolicy, LockOptions, Locker, Semaphore};

use super::{backend, Holder, Table, Tally, Tasks, TIMEOUT};
use crate::common::BenchResult;
use crate::soak::faults::Endpoint;
use crate::soak::{Rng, Shared};

const LOCK_TTL: Duration = Duration::from_secs(1);
const LOCK_WAIT: Duration = Duration::from_secs(3);
pub(crate) const PERMITS: u32 = 3;
const LOCK_NAMES: [&str; 2] = ["soak-lock-0", "soak-lock-1"];
const PERMIT_NAMES: [&str; 2] = ["soak-sem-0", "soak-sem-1"];

/// Starts 6 lock workers over three `Locker`s and 10 permit holders over
/// two `Semaphore`s; they enter `locks` and `permits`.
pub(super) async fn start(
    endpoint: &Endpoint,
    shared: &Arc<Shared>,
    seed: u64,
    (locks, permits): (&Arc<Mutex<Table>>, &Arc<Mutex<Table>>),
    tasks: &mut Tasks,
) -> BenchResult<()> {
    let ids = Arc::new(AtomicU64::new(0));
    for l in 0..3 {
        let locker = Locker::builder(backend(endpoint).await?)
            .prefix("soak")
            .timeout(TIMEOUT)
            .build()?;
        for w in 0..2 {
            let ctx = Ctx {
                shared: shared.clone(),
                table: locks.clone(),
                ids: ids.clone(),
                rng: Rng::new(seed.wrapping_mul(37).wrapping_add(l * 2 + w)),
            };
            tasks.push(tokio::spawn(holder(Take::Lock(locker.clone()), ctx)));
        }
    }
    for s in 0..2 {
        let sem = Semaphore::builder(backend(endpoint).await?, PERMITS)
            .prefix("soak")
            .timeout(TIMEOUT)
            .on_failure(FailurePolicy::Deny)
            .build()?;
        for w in 0..5 {
            let ctx = Ctx {
                shared: shared.clone(),
                table: permits.clone(),
                ids: ids.clone(),
                rng: Rng::new(seed.wrapping_mul(41).wrapping_add(s * 5 + w)),
            };
            tasks.push(tokio::spawn(holder(Take::Permit(sem.clone()), ctx)));
        }
    }
    Ok(())
}

/// A lock or a semaphore: one loop serves both.
enum Take {
    Lock(Locker),
    Permit(Semaphore),
}

struct Ctx {
    shared: Arc<Shared>,
    table: Arc<Mutex<Table>>,
    ids: Arc<AtomicU64>,
    rng: Rng,
}

/// How long a critical section works: mostly a few ms, sometimes long
/// enough for renewals, and for a pause to strike inside it.
fn work_time(rng: &mut Rng) -> Duration {
    let ms = match rng.range(0, 100) {
        0..70 => rng.range(2, 10),
        70..95 => rng.range(50, 300),
        _ => rng.range(500, 2_500),
    };
    Duration::from_millis(ms)
}

async fn holder(take: Take, mut ctx: Ctx) -> Tally {
    let mut tally = Tally::default();
    let (component, release, names, limit): (_, _, &[&'static str], usize) = match &take {
        Take::Lock(_) => ("lock", "lock release", &LOCK_NAMES, 1),
        Take::Permit(_) => ("permit", "permit release", &PERMIT_NAMES, PERMITS as usize),
    };
    let options = LockOptions::new().ttl(LOCK_TTL).wait(LOCK_WAIT);
    while !ctx.shared.stopped() {
        let name = names[ctx.rng.below(names.len())];
        let sent = Instant::now();
        let result = match &take {
            Take::Lock(l) => l.acquire(name, &options).await,
            Take::Permit(s) => s.acquire(name, &options).await,
        };
        let lease = match result {
            Ok(lease) => Arc::new(lease),
            Err(Error::Busy { .. }) => {
                tally.decision(format!("{component}: busy after the {LOCK_WAIT:?} wait"));
                continue;
            }
            Err(e) => {
                tally.error(component, &e);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let id = ctx.ids.fetch_add(1, Ordering::Relaxed);
        let entered = {
            let mut table = ctx.table.lock().expect("table");
            // Checked under the table's lock, so that the validity of every
            // holder is judged at one instant.
            let valid = lease.is_held();
            if valid {
                let me = Holder {
                    id,
                    lease: lease.clone(),
                    sent,
                    fence: lease.fence().get(),
                };
                table.enter(name, limit, me, Instant::now());
            }
            valid
        };
        if entered {
            tally.decision(format!("{component}: critical section"));
            tally.success(component, ctx.shared.start);
            let lost = lease.lost();
            tokio::select! {
                () = lost => tally.decision(format!("{component}: lease lost inside the section")),
                () = tokio::time::sleep(work_time(&mut ctx.rng)) => {}
            }
            ctx.table.lock().expect("table").leave(name, id);
        } else {
            tally.decision(format!(
                "{component}: acquired but no longer valid on arrival (not entered)"
            ));
        }
        let lease = Arc::into_inner(lease).expect("the table let go of the lease");
        match lease.release().await {
            Ok(true) => tally.decision(format!("{component}: released")),
            Ok(false) => tally.decision(format!("{component}: release found it lost/expired")),
            Err(e) => tally.error(release, &e),
        }
    }
    tally
}
