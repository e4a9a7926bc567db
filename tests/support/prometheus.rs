//! Reading a task's Prometheus endpoint in tests: a plain HTTP GET under a deadline, and the
//! text format's samples.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Deadline of one scrape (connect, send, read to the end).
const SCRAPE_DEADLINE: Duration = Duration::from_secs(5);

/// `GET /metrics` with a deadline on every step; returns the body.
pub fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect_timeout(&addr, SCRAPE_DEADLINE).unwrap();
    stream.set_read_timeout(Some(SCRAPE_DEADLINE)).unwrap();
    stream.set_write_timeout(Some(SCRAPE_DEADLINE)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: tessera\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "{head}"
    );
    body.to_owned()
}

/// One sample: its name and labels.
pub type Series = (String, BTreeMap<String, String>);

/// Parses Prometheus' text format: `name{k="v",...} value` lines; comments skipped.
pub fn parse(text: &str) -> Vec<(Series, f64)> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("`series value`");
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let labels = labels
            .split("\",")
            .filter(|l| !l.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').expect("k=\"v\"");
                (k.to_owned(), v.trim_matches('"').to_owned())
            })
            .collect();
        samples.push(((name.to_owned(), labels), value.parse().expect("a number")));
    }
    samples
}

/// The sum of the samples named `name` whose labels include every pair of `labels` (0 when
/// none: a series not yet created has not moved).
pub fn value(samples: &[(Series, f64)], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|((n, l), _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, v)| v)
        .sum()
}

pub fn has(samples: &[(Series, f64)], name: &str) -> bool {
    samples.iter().any(|((n, _), _)| n == name)
}
