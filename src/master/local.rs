//! Masters that clients in the same process reach without gRPC, as TensorFlow's `LocalMaster`.
//!
//! A task registers its master under the addresses a client may name it by (`localhost:PORT`
//! and `127.0.0.1:PORT` when it listens there, its own address in the cluster file), and a
//! session whose target names one of them sends its calls straight to the master's mailbox.
//! The training client of `tessera train` steps through its own task's master this way: no
//! protobuf encoding, no HTTP/2 framing, no wake of the gRPC runtime's threads on either side.
//!
//! ```text
//! Session::connect("grpc://localhost:PORT") ──lookup──► LocalMaster ──mailbox──► Master
//!                    (not registered, or refused) ──gRPC──► MasterGrpc ──mailbox──► Master
//! ```
//!
//! The calls are the same MasterService requests and answers, so the master sees what it would
//! see over gRPC; what is skipped is the transport, and with it the transport's checks. So a
//! client goes in process only when it surely passes them: it asks for TLS exactly when the
//! task serves TLS, then holding the task's own CA, certificate and key (the task's own
//! client, as `tessera train`'s), and it holds the task's cluster token when the task checks
//! one. Any other client goes over gRPC and meets the real checks and their errors. A session
//! config with `rpc_options.use_rpc_for_inprocess_master` goes over gRPC whatever it holds.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::mailboxes::MasterMailboxes;
use crate::security::{ClusterToken, Security, TlsConfig};

/// A master a client of this process may call directly.
#[derive(Clone)]
pub struct LocalMaster {
    mailboxes: MasterMailboxes,
    front: Front,
}

/// What the task's gRPC front checks of a client.
#[derive(Clone)]
struct Front {
    /// The port's TLS, if it speaks TLS.
    tls: Option<TlsConfig>,
    /// The cluster token, if the front checks one.
    token: Option<ClusterToken>,
}

impl Front {
    fn of(security: &Security) -> Self {
        Self {
            tls: security.tls.clone(),
            token: security.token.clone(),
        }
    }

    /// Whether a client with `tls` (or plain text) and holding `token` surely gets through.
    fn admits(&self, tls: Option<&TlsConfig>, token: Option<&ClusterToken>) -> bool {
        let tls_passes = match (&self.tls, tls) {
            (None, None) => true,
            (Some(served), Some(held)) => served.same_material(held),
            _ => false,
        };
        let token_passes = match (&self.token, token) {
            (None, _) => true,
            (Some(checked), Some(held)) => checked.matches(held.secret()),
            (Some(_), None) => false,
        };
        tls_passes && token_passes
    }
}

impl LocalMaster {
    /// The master behind `mailboxes`, behind the port that `security` protects.
    pub fn new(mailboxes: MasterMailboxes, security: &Security) -> Self {
        Self {
            mailboxes,
            front: Front::of(security),
        }
    }

    /// The master's calls.
    pub fn mailboxes(&self) -> &MasterMailboxes {
        &self.mailboxes
    }

    /// Whether a client with `tls` (or plain text) and holding `token` surely gets through the
    /// task's gRPC front: then it may skip it.
    pub fn admits(&self, tls: Option<&TlsConfig>, token: Option<&ClusterToken>) -> bool {
        self.front.admits(tls, token)
    }
}

struct Entry {
    /// The registration it belongs to, so that a stale one never removes a newer entry.
    id: u64,
    master: LocalMaster,
}

fn registry() -> MutexGuard<'static, HashMap<String, Entry>> {
    static MASTERS: OnceLock<Mutex<HashMap<String, Entry>>> = OnceLock::new();
    MASTERS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// A master's place in the registry; dropping it takes the master out (a stopping task drops
/// it first, so that new sessions go over gRPC and meet the stopping server's answer).
pub struct Registration {
    id: u64,
    addresses: Vec<String>,
}

impl Registration {
    /// The addresses (`host:port`) the master is reachable by in process.
    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut masters = registry();
        for address in &self.addresses {
            if masters.get(address).is_some_and(|e| e.id == self.id) {
                masters.remove(address);
            }
        }
    }
}

/// Registers `master` under `addresses` (`host:port`; host names compare without case).
pub fn register(master: LocalMaster, addresses: Vec<String>) -> Registration {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let addresses: Vec<String> = addresses.iter().map(|a| a.to_ascii_lowercase()).collect();
    let mut masters = registry();
    for address in &addresses {
        let master = master.clone();
        masters.insert(address.clone(), Entry { id, master });
    }
    Registration { id, addresses }
}

/// The master registered under `address` (`host:port`), if it is in this process.
pub fn lookup(address: &str) -> Option<LocalMaster> {
    registry()
        .get(&address.to_ascii_lowercase())
        .map(|e| e.master.clone())
}

/// The addresses a task bound to `bound` is reached by from this host: the bound address
/// itself unless it is a wildcard, `localhost` and the loopback address of its family when it
/// listens on loopback or on every interface, and `advertised` (its address in the cluster
/// file) when that names the bound port.
pub fn addresses(bound: SocketAddr, advertised: Option<&str>) -> Vec<String> {
    let port = bound.port();
    let ip = bound.ip();
    let mut names = Vec::new();
    if !ip.is_unspecified() {
        names.push(bound.to_string());
    }
    if ip.is_unspecified() || ip.is_loopback() {
        let loopback = match bound {
            SocketAddr::V4(_) => format!("127.0.0.1:{port}"),
            SocketAddr::V6(_) => format!("[::1]:{port}"),
        };
        names.push(loopback);
        names.push(format!("localhost:{port}"));
    }
    if let Some(advertised) = advertised {
        let names_port = advertised
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            == Some(port);
        if names_port {
            names.push(advertised.to_string());
        }
    }
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_is_named_by_the_addresses_that_reach_its_port() {
        let loopback: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        assert_eq!(
            addresses(loopback, Some("localhost:4000")),
            ["127.0.0.1:4000", "localhost:4000"]
        );
        let every: SocketAddr = "0.0.0.0:2222".parse().unwrap();
        assert_eq!(
            addresses(every, Some("ps0.example:2222")),
            ["127.0.0.1:2222", "localhost:2222", "ps0.example:2222"]
        );
        // An address in the cluster file for another port is not this socket.
        let one: SocketAddr = "10.1.2.3:2222".parse().unwrap();
        assert_eq!(addresses(one, Some("ps0.example:9999")), ["10.1.2.3:2222"]);
        let v6: SocketAddr = "[::1]:7000".parse().unwrap();
        assert_eq!(addresses(v6, None), ["[::1]:7000", "localhost:7000"]);
    }

    #[test]
    fn only_clients_the_front_would_let_through_skip_it() {
        let token = ClusterToken::new("0123456789abcdef0123").unwrap();
        let other = ClusterToken::new("fedcba9876543210fedc").unwrap();
        let open = Front::of(&Security::default());
        assert!(open.admits(None, None));
        assert!(open.admits(None, Some(&token)));
        let guarded = Front::of(&Security {
            token: Some(token.clone()),
            ..Security::default()
        });
        assert!(guarded.admits(None, Some(&token)));
        assert!(!guarded.admits(None, Some(&other)));
        assert!(!guarded.admits(None, None));
    }
}
