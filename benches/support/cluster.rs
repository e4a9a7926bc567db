//! In-process tessera tasks on loopback for the benches: `ps` and `worker` tasks as `Server`s
//! on listeners bound to 127.0.0.1:0, and how a worker's client reaches its own task's master
//! (in process, as `tessera train`'s client does, or over gRPC on loopback).

use std::net::TcpListener;
use std::time::Duration;

use tessera::client::{ConnectOptions, Session};
use tessera::cluster::TaskConfig;
use tessera::proto::{ConfigProto, RpcOptions};
use tessera::server::Server;

/// In-process servers for `ps` × `ps` and `workers` workers on loopback, stopped on drop.
pub struct LoopbackCluster {
    servers: Vec<Server>,
}

impl LoopbackCluster {
    pub fn start(ps: usize, workers: usize) -> Self {
        let jobs = [("ps", ps), ("worker", workers)];
        let mut listeners = Vec::new();
        let mut text = String::from("[cluster]\n");
        for (job, count) in jobs {
            let mut addrs = Vec::new();
            for index in 0..count {
                let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
                addrs.push(format!("\"{}\"", listener.local_addr().expect("address")));
                listeners.push((job, index, listener));
            }
            text.push_str(&format!("{job} = [{}]\n", addrs.join(", ")));
        }
        text.push_str("[devices]\ngpu = 0\n");
        let servers = listeners
            .into_iter()
            .map(|(job, index, listener)| {
                let env = [
                    ("TESSERA__TASK__JOB".to_string(), job.to_string()),
                    ("TESSERA__TASK__INDEX".to_string(), index.to_string()),
                ];
                let config = TaskConfig::from_toml_with_env(&text, "bench cluster", env)
                    .expect("cluster config");
                Server::start_with_listener(config, listener).expect("start a task")
            })
            .collect();
        Self { servers }
    }

    pub fn target(&self, job: &str, index: usize) -> String {
        let server = self
            .servers
            .iter()
            .find(|s| s.task().job == job && s.task().index as usize == index)
            .expect("task");
        format!("grpc://{}", server.local_addr())
    }
}

impl Drop for LoopbackCluster {
    fn drop(&mut self) {
        for server in self.servers.drain(..) {
            server.stop();
        }
    }
}

/// How a client reaches a master of its own process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reach {
    /// Through the master's mailbox, as `tessera train`'s client does.
    InProcess,
    /// Over gRPC on loopback (`rpc_options.use_rpc_for_inprocess_master`), as a client in
    /// another process on the host would.
    Grpc,
}

/// A session on the master at `target`, reached as `reach` says.
pub fn connect(target: &str, reach: Reach) -> Session {
    let options = ConnectOptions {
        connect_timeout: Duration::from_secs(10),
        config: ConfigProto {
            rpc_options: Some(RpcOptions {
                use_rpc_for_inprocess_master: reach == Reach::Grpc,
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let session = Session::connect_with(target, options).expect("connect");
    let in_process = session.as_remote().is_some_and(|r| r.is_in_process());
    assert_eq!(in_process, reach == Reach::InProcess, "{target}: {reach:?}");
    session
}
