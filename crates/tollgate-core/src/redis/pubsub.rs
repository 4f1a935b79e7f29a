//! Where lock waiters subscribe for release notifications: one server, or
//! any node of a cluster — a cluster-wide `PUBLISH` reaches every node, so
//! any live one will do, and a subscription lost with its node moves on to
//! another instead of retrying a dead seed forever.

use std::sync::atomic::{AtomicUsize, Ordering};

use redis::aio::ConnectionLike;
use redis::{Client, ConnectionAddr};

/// The nodes a subscription may use, tried in turn.
#[derive(Debug)]
pub(crate) struct PubSubNodes {
    /// The configured clients: one URL, or a cluster's seeds.
    seeds: Vec<Client>,
    /// Which node the next subscription tries.
    next: AtomicUsize,
    /// Whether a cluster's current topology may be followed (the cluster's
    /// seeds); `false` for a client given explicitly, whose address (a
    /// proxy, a NAT address) is kept.
    follow: bool,
}

impl PubSubNodes {
    /// `seeds`, tried in turn; with `follow`, a cluster's live nodes first.
    pub(crate) fn new(seeds: Vec<Client>, follow: bool) -> Self {
        debug_assert!(!seeds.is_empty());
        PubSubNodes {
            seeds,
            next: AtomicUsize::new(0),
            follow,
        }
    }

    /// Whether subscriptions may follow a cluster's topology.
    pub(crate) fn follows_topology(&self) -> bool {
        self.follow
    }

    fn turn(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// The next seed, in turn.
    pub(crate) fn next_seed(&self) -> Client {
        self.seeds[self.turn() % self.seeds.len()].clone()
    }

    /// A client for a live node of the cluster's current topology (asked of
    /// `conn`, so nodes added or promoted since the start count, and failed
    /// ones are skipped), in turn; the next seed when the cluster cannot
    /// say. Connection settings (credentials) are the first seed's.
    pub(crate) async fn next_cluster_node<C: ConnectionLike>(&self, conn: &mut C) -> Client {
        let nodes: Option<String> = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(conn)
            .await
            .ok();
        let live = nodes.as_deref().map(live_nodes).unwrap_or_default();
        if live.is_empty() {
            return self.next_seed();
        }
        let (host, port) = &live[self.turn() % live.len()];
        let template = self.seeds[0].get_connection_info().clone();
        // TLS seeds keep to the seeds: their settings are not all public.
        let ConnectionAddr::Tcp(..) = template.addr() else {
            return self.next_seed();
        };
        let addr = ConnectionAddr::Tcp(host.clone(), *port);
        Client::open(template.set_addr(addr)).unwrap_or_else(|_| self.next_seed())
    }
}

/// `host:port` of every node `CLUSTER NODES` lists without a failure,
/// handshake or missing-address flag.
fn live_nodes(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let addr = fields.nth(1)?;
            let flags = fields.next()?;
            if flags
                .split(',')
                .any(|f| f.starts_with("fail") || f == "handshake" || f == "noaddr")
            {
                return None;
            }
            // ip:port@cport[,hostname]
            let endpoint = addr.split('@').next()?;
            let (host, port) = endpoint.rsplit_once(':')?;
            if host.is_empty() {
                return None;
            }
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

/// Escapes Redis glob metacharacters so a prefix matches only itself.
pub(super) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_nodes_skip_failed_ones() {
        let nodes = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1 4 connected
67ed 127.0.0.1:30002@40002 master,fail - 0 1 2 disconnected 5461-10922
292f 127.0.0.1:30003@40003 master - 0 1 3 connected 10923-16383
6ec2 127.0.0.1:30005@40005,node-5 myself,master - 0 1 5 connected 5461-10922
e7d1 :0@0 master,fail?,noaddr - 0 1 1 disconnected
";
        assert_eq!(
            live_nodes(nodes),
            [
                ("127.0.0.1".to_owned(), 30004),
                ("127.0.0.1".to_owned(), 30003),
                ("127.0.0.1".to_owned(), 30005)
            ]
        );
        assert!(live_nodes("").is_empty());
        assert!(live_nodes("garbage").is_empty());
    }

    #[test]
    fn glob_metacharacters_are_escaped() {
        assert_eq!(glob_escape("app:lock:"), "app:lock:");
        assert_eq!(glob_escape("a*b?[c]\\^"), "a\\*b\\?\\[c\\]\\\\\\^");
    }
}
