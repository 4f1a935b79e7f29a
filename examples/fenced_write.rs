//! A lock-protected update that a stale fencing token cannot overwrite.
//!
//! Two workers update the same record. Each takes the lock, reads, and
//! writes with its lease's fencing token; the store remembers the highest
//! token it has accepted and refuses lower ones (in SQL: `UPDATE … SET …,
//! fence = $fence WHERE id = $id AND fence <= $fence`).
//!
//! Worker A takes the lock and then stalls (a GC pause, a stopped VM): its
//! lease expires, `lost()` tells it so, and worker B takes the lock with a
//! higher token and writes. When A wakes up and writes anyway, the store
//! refuses it: the lock alone could not have prevented that write, the fence
//! does.
//!
//! ```text
//! cargo run --example fenced_write                                   # in memory
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example fenced_write  # on Redis
//! ```

use std::error::Error;
use std::sync::Mutex;
use std::time::Duration;

use tollgate::{FencingToken, LockBackend, LockOptions, Locker, MemoryBackend, RedisBackend};

/// The protected resource: a record and the highest fence it has accepted.
#[derive(Debug, Default)]
struct Store {
    inner: Mutex<Record>,
}

#[derive(Debug, Default)]
struct Record {
    value: String,
    fence: Option<FencingToken>,
}

impl Store {
    /// Writes `value` if `fence` is at least the highest fence seen so far.
    fn write(&self, fence: FencingToken, value: &str) -> Result<(), String> {
        let mut record = self.inner.lock().expect("not poisoned");
        if let Some(highest) = record.fence {
            if fence < highest {
                return Err(format!(
                    "refused: fencing token {fence} is older than {highest}"
                ));
            }
        }
        record.fence = Some(fence);
        record.value = value.to_owned();
        Ok(())
    }

    fn read(&self) -> String {
        self.inner.lock().expect("not poisoned").value.clone()
    }
}

async fn run(locker: Locker) -> Result<(), Box<dyn Error>> {
    let store = Store::default();
    // A short TTL and no renewal, so that A's stall outlives its lease
    // (with renewal on, the watchdog would keep the lease alive while the
    // process runs; a real stall stops the watchdog too).
    let opts = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .renew(false);

    // Worker A takes the lock.
    let a = locker.try_acquire("record-1", &opts).await?;
    let fence_a = a.fence();
    println!("A holds the lock with fence {fence_a}");

    // ... and stalls for longer than its lease.
    tokio::time::sleep(Duration::from_millis(400)).await;
    a.lost().await;
    println!("A's lease is lost (is_held = {})", a.is_held());

    // Worker B takes the lock (waiting for it if need be) and writes.
    let b = locker
        .acquire("record-1", &opts.clone().wait(Duration::from_secs(2)))
        .await?;
    println!("B holds the lock with fence {}", b.fence());
    store.write(b.fence(), "written by B")?;
    println!("B wrote: {:?}", store.read());
    b.release().await?;

    // A wakes up, unaware, and writes with its old token: refused.
    match store.write(fence_a, "written by A (stale)") {
        Ok(()) => return Err("the stale write was accepted".into()),
        Err(e) => println!("A's write: {e}"),
    }
    println!("the record still says {:?}", store.read());
    assert_eq!(store.read(), "written by B");
    // Releasing a lost lease reports that the lock was no longer ours.
    println!("A's release: still ours = {}", a.release().await?);
    Ok(())
}

fn locker(backend: impl LockBackend) -> Locker {
    Locker::new(backend)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => {
            println!("backend: redis");
            run(locker(RedisBackend::connect(&url).await?)).await
        }
        _ => {
            println!("backend: memory");
            run(locker(MemoryBackend::new())).await
        }
    }
}
