//! Raw TCP on loopback, the benches' yardstick for moving bytes: a server answering each
//! 8-byte length with that many bytes of its buffer, and a pull that reads them into place.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

/// Starts a server on 127.0.0.1:0 answering each 8-byte length (little-endian) with that many
/// bytes of `buffer`, one thread per connection; returns its address.
pub fn raw_server(buffer: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let buffer = buffer.clone();
            thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(600)));
                let mut len = [0u8; 8];
                while stream.read_exact(&mut len).is_ok() {
                    let n = u64::from_le_bytes(len) as usize;
                    if stream.write_all(&buffer[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Pulls `into.len()` bytes from a [`raw_server`] straight into `into`.
pub fn raw_pull(stream: &mut TcpStream, into: &mut [u8]) {
    stream
        .write_all(&(into.len() as u64).to_le_bytes())
        .expect("request");
    stream.read_exact(into).expect("response");
}

/// The median time raw TCP takes to move `bytes` over loopback, of `pulls` pulls after one
/// to warm the connection.
pub fn raw_tcp_time(bytes: usize, pulls: usize) -> Duration {
    let addr = raw_server(vec![7u8; bytes]);
    let mut stream = TcpStream::connect(addr).expect("connect to the raw server");
    stream.set_nodelay(true).expect("nodelay");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    let mut into = vec![0u8; bytes];
    raw_pull(&mut stream, &mut into);
    let mut times: Vec<Duration> = (0..pulls)
        .map(|_| {
            let started = Instant::now();
            raw_pull(&mut stream, &mut into);
            started.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}
