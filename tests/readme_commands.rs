//! The README's commands stay true: every `tessera` subcommand and flag it shows exists (its
//! `--help` lists it), the cluster files it shows pass `tessera validate`, and every op its
//! table of what does not run yet lists is refused by a running task and reported by `tessera
//! validate --graph`, so the table and the registry cannot drift apart.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use prost::Message;
use tessera::client::Session;
use tessera::graph::attr::value;
use tessera::proto::{attr_value, DataType, GraphDef, NodeDef};
use tessera::tensor::DType;

use crate::support::certs::Pki;
use crate::support::cluster::{InProcessCluster, BIN};

pub(crate) fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    std::fs::read_to_string(&path).expect("README.md")
}

/// The fenced blocks of `lang`, in order.
pub(crate) fn blocks(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim_start().strip_prefix("```")) {
            (None, Some(tag)) if tag.trim() == lang => current = Some(String::new()),
            (Some(_), Some(_)) => out.push(current.take().expect("open block")),
            (Some(block), None) => {
                block.push_str(line);
                block.push('\n');
            }
            _ => {}
        }
    }
    out
}

fn tessera(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tessera")
}

/// Whether `help` lists `flag` (followed by a space, `=`, or the end of its line).
fn lists(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(at, _)| {
        let next = help[at + flag.len()..].chars().next();
        !next.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-')
    })
}

fn help(subcommand: &str) -> String {
    let out = tessera(&[subcommand, "--help"]);
    assert!(
        out.status.success(),
        "`tessera {subcommand} --help` failed: the README shows a subcommand that does not \
         exist\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Each `tessera SUB ...` (or `cargo run --release -- SUB ...`) command of the README's shell
/// blocks, as (subcommand, its `--flags`).
fn commands(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for block in blocks(text, "sh") {
        for line in block.lines() {
            let line = line.split(" #").next().unwrap_or_default();
            let words: Vec<&str> = line.split_whitespace().collect();
            let Some(at) = words.iter().position(|w| *w == "tessera" || *w == "--") else {
                continue;
            };
            // `cargo run --release` alone is `tessera local`.
            let rest = &words[at + 1..];
            let sub = rest.first().copied().unwrap_or("local");
            if sub.starts_with('-') {
                continue;
            }
            let flags = rest
                .iter()
                .filter(|w| w.starts_with("--"))
                .map(|w| w.split('=').next().expect("split").to_string())
                .collect();
            out.push((sub.to_string(), flags));
        }
    }
    out
}

#[test]
fn every_command_and_flag_the_readme_shows_exists() {
    let text = readme();
    let commands = commands(&text);
    let subcommands: BTreeSet<&str> = commands.iter().map(|(s, _)| s.as_str()).collect();
    for expected in ["local", "train", "serve", "status", "validate"] {
        assert!(
            subcommands.contains(expected),
            "the README's commands lost `{expected}`"
        );
    }
    for (sub, flags) in &commands {
        let help = help(sub);
        for flag in flags {
            assert!(
                lists(&help, flag),
                "the README runs `tessera {sub} {flag}`, which `tessera {sub} --help` does not \
                 list:\n{help}"
            );
        }
    }
    // The training flags' table: every flag of it is a `tessera train` flag.
    let train_help = help("train");
    let table_flags: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .flat_map(|l| l.split('|').nth(1).expect("first cell").split('`'))
        .filter(|w| w.starts_with("--"))
        .collect();
    assert!(table_flags.len() > 20, "the flags table: {table_flags:?}");
    for flag in table_flags {
        assert!(
            lists(&train_help, flag),
            "the README's flags table shows `{flag}`, which `tessera train --help` does not list"
        );
    }
    let local_help = help("local");
    for flag in ["--ps", "--workers", "--timeout"] {
        assert!(lists(&local_help, flag), "`tessera local {flag}`");
    }
}

#[test]
fn the_readme_cluster_files_validate() {
    let text = readme();
    let tomls = blocks(&text, "toml");
    assert_eq!(
        tomls.len(),
        3,
        "the cluster file, its TLS sections and a ps standby's cluster"
    );
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.toml");
    std::fs::write(&cluster, &tomls[0]).unwrap();
    let out = tessera(&["validate", cluster.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "the README's cluster file fails `tessera validate`: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok (job worker task 0 of 3 tasks)"));

    // The TLS and token sections, with real files in place of /etc/tessera's.
    let pki = Pki::new("readme");
    let leaf = pki.leaf("w0");
    let token = dir.path().join("token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
    let secured = tomls[1]
        .replace("/etc/tessera/tls/w0.pem", leaf.cert.to_str().unwrap())
        .replace("/etc/tessera/tls/w0.key", leaf.key.to_str().unwrap())
        .replace("/etc/tessera/tls/ca.pem", pki.ca.to_str().unwrap())
        .replace("/etc/tessera/token", token.to_str().unwrap());
    let with_tls = dir.path().join("tls.toml");
    std::fs::write(&with_tls, format!("{}\n{secured}", tomls[0])).unwrap();
    let out = tessera(&["validate", with_tls.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "the README's TLS sections fail `tessera validate`: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The standby's cluster, as the standby reads it: ps task 0 at its own address.
    let standby = dir.path().join("standby.toml");
    std::fs::write(
        &standby,
        format!("{}\n[task]\njob = \"ps_standby\"\nindex = 0\n", tomls[2]),
    )
    .unwrap();
    let out = tessera(&["validate", standby.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("ok (the standby of job ps task 0 of 3 tasks, 1 ps standby)"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The ops of the README's table of what does not run yet (the rows of ops).
fn listed_ops(text: &str) -> Vec<String> {
    let section = text
        .split("### What does not run yet")
        .nth(1)
        .expect("the README's section `What does not run yet`");
    let section = section.split("\n## ").next().expect("section");
    let mut ops = Vec::new();
    for row in section.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = row.split('|').collect();
        let area = cells[1].trim();
        if matches!(area, "area" | "dtypes" | "services" | "GPUs") || area.starts_with("---") {
            continue;
        }
        ops.extend(cells[2].split('`').skip(1).step_by(2).map(str::to_string));
    }
    ops
}

/// The dtypes the README's table says are refused, as TensorFlow's enum.
fn listed_dtypes(text: &str) -> Vec<DataType> {
    let row = text
        .lines()
        .find(|l| l.starts_with("| dtypes |"))
        .expect("the dtypes row");
    let refused = row
        .split("tensors:")
        .nth(1)
        .and_then(|r| r.split("are refused").next())
        .expect("the refused ones");
    refused
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|name| match name {
            "float16" => DataType::DtHalf,
            "bfloat16" => DataType::DtBfloat16,
            other => DataType::from_str_name(&format!("DT_{}", other.to_uppercase()))
                .unwrap_or_else(|| panic!("dtype `{other}`")),
        })
        .collect()
}

fn node(op: &str) -> NodeDef {
    NodeDef {
        name: format!("probe_{op}"),
        op: op.to_string(),
        ..Default::default()
    }
}

#[test]
fn the_ops_the_readme_says_do_not_run_are_refused_and_reported() {
    let text = readme();
    let ops = listed_ops(&text);
    // The table shrinks as ops land; a handful listed shows the parser still reads it.
    assert!(ops.len() >= 5, "ops listed: {ops:?}");
    let dtypes = listed_dtypes(&text);
    assert!(dtypes.len() >= 5, "dtypes listed: {dtypes:?}");

    // The probe: one node per listed op, and a Cast to each listed dtype.
    let mut graph = GraphDef {
        node: ops.iter().map(|op| node(op)).collect(),
        ..Default::default()
    };
    for dtype in &dtypes {
        let mut cast = node("Cast");
        cast.name = format!("cast_to_{}", dtype.as_str_name());
        let mut attr = value::dtype(DType::Float);
        attr.value = Some(attr_value::Value::Type(*dtype as i32));
        cast.attr.insert("DstT".into(), attr);
        graph.node.push(cast);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("graph.pb");
    std::fs::write(&file, graph.encode_to_vec()).unwrap();
    let out = tessera(&["validate", "--graph", file.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the probe found nothing:\n{stdout}");
    let reported: BTreeSet<&str> = stdout
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .collect();
    let listed: BTreeSet<&str> = ops.iter().map(String::as_str).chain(["Cast"]).collect();
    assert_eq!(
        reported, listed,
        "the README's table and `tessera validate --graph` disagree"
    );
    for dtype in &dtypes {
        assert!(
            stdout.contains(dtype.as_str_name()),
            "{} not reported:\n{stdout}",
            dtype.as_str_name()
        );
    }

    // A running task refuses each listed op, naming it.
    let cluster = InProcessCluster::start(&[("worker", 1)]);
    for op in &ops {
        let session = Session::connect(&cluster.target("worker", 0)).unwrap();
        let one = GraphDef {
            node: vec![node(op)],
            ..Default::default()
        };
        let refused = session
            .extend(&one)
            .and_then(|()| session.run(&[], &[], &[&format!("probe_{op}")]));
        let err = match refused {
            Ok(_) => panic!("the README says `{op}` does not run, but a task ran it"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains(op.as_str()),
            "`{op}` refused without naming it: {err}"
        );
    }
}
