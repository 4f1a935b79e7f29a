//! What a cluster call sends again, and what it does not. A node's
//! connection drops after the node ran a script but before its reply
//! arrived: nothing is sent again (a replayed check would be charged twice,
//! a replayed claim would find itself "in flight"); the caller's failure
//! policy sees the one error, as on a standalone server. The node is reached
//! through a relay (it announces the relay's port to the cluster), which
//! drops that one reply with its connection. A slot on the move answers
//! `ASK` for a key it no longer holds: the command, which did not run, is
//! asked of the node the slot moves to.

use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Quota, RateLimiter, RedisBackend, Subject};
use tollgate_testkit::{eventually, unique, RedisCluster, ReplyDelay};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_not_sent_again() {
    let cluster = RedisCluster::start().unwrap();
    let node = &cluster.nodes()[0];
    let relay = ReplyDelay::start(&node.addr()).await.unwrap();
    let url = relay.url();
    let port = url.rsplit(':').next().unwrap().to_owned();
    assert_eq!(
        node.cli(&["CONFIG", "SET", "cluster-announce-port", &port]),
        "OK"
    );
    eventually(
        Duration::from_secs(20),
        "every node names the relay",
        || {
            let port = &port;
            let nodes = cluster.nodes();
            async move {
                nodes
                    .iter()
                    .all(|n| n.cli(&["CLUSTER", "SLOTS"]).contains(port.as_str()))
                    .then_some(())
            }
        },
    )
    .await;

    let backend = RedisBackend::connect_cluster([url.as_str()]).await.unwrap();
    let limiter = RateLimiter::builder(backend, Algorithm::FixedWindow)
        .quota(Quota::per_minute(100))
        .name(unique("replay"))
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_secs(2))
        .deny_cache(0)
        .build()
        .unwrap();
    // A subject served by the relayed node.
    let (subject, key) = (0..)
        .map(|i| {
            let s = Subject::new(format!("s{i}"));
            let key = limiter.keys_for(&s).remove(0);
            (s, key)
        })
        .find(|(_, key)| cluster.master_for_key(key) == 0)
        .unwrap();
    // The script is loaded and the node's connection is open.
    assert!(limiter.check(subject.clone()).await.unwrap().allowed);

    let ran = node.command_calls("evalsha");
    relay.cut_next_reply();
    let lost = limiter.check(subject.clone()).await;
    assert_eq!(relay.cuts_left(), 0, "the reply was not cut");
    assert_eq!(
        node.command_calls("evalsha") - ran,
        1,
        "the script ran again"
    );
    // The window's count (`<window>:<count>`): the first check and this one.
    let stored = node.cli(&["GET", &key]);
    assert!(stored.ends_with(":2"), "{key} = {stored}");
    let e = lost.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    // The next check finds the node again, through a new connection.
    eventually(Duration::from_secs(10), "a check after the cut", || async {
        limiter.check(subject.clone()).await.ok()
    })
    .await;
}

/// A subject whose slot is moving to another master (MIGRATING on its
/// node, IMPORTING on the other), its block key moved already: its node
/// answers ASK for it, and the read is asked of the node it moved to. (A
/// check, whose script also names keys that do not exist yet, gets
/// TRYAGAIN there until the slot has moved: the failure policy answers it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_on_the_move_is_asked_of_its_new_node() {
    let cluster = RedisCluster::start().unwrap();
    let backend = RedisBackend::connect_cluster(cluster.seeds())
        .await
        .unwrap();
    let limiter = RateLimiter::builder(backend, Algorithm::FixedWindow)
        .quota(Quota::per_minute(100))
        .name(unique("ask"))
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_secs(2))
        .deny_cache(0)
        .build()
        .unwrap();
    let subject = Subject::new("moving");
    limiter
        .block(&subject, Duration::from_secs(60))
        .await
        .unwrap();
    let key = limiter.keys_for(&subject).remove(0);
    let block = key.replace(":fw:", ":block:");
    let from = cluster.master_for_key(&key);
    let to = cluster.masters().into_iter().find(|&m| m != from).unwrap();
    let (a, b) = (&cluster.nodes()[from], &cluster.nodes()[to]);
    assert_eq!(a.cli(&["EXISTS", &block]), "1", "{block}");
    let slot = a.cli(&["CLUSTER", "KEYSLOT", &key]);
    let (a_id, b_id) = (a.cli(&["CLUSTER", "MYID"]), b.cli(&["CLUSTER", "MYID"]));
    assert_eq!(
        b.cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &a_id]),
        "OK"
    );
    assert_eq!(
        a.cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &b_id]),
        "OK"
    );
    let port = b.port().to_string();
    let moved = a.cli(&["MIGRATE", "127.0.0.1", &port, &block, "0", "5000"]);
    assert_eq!(moved, "OK");

    let left = limiter.blocked_for(&subject).await.unwrap();
    assert!(
        left.is_some_and(|l| l > Duration::from_secs(50)),
        "{left:?}"
    );
}
