//! The crate's layers run one way: every `crate::` path in `src/` points at its own top-level
//! module, one in its row, or one in a row below, and no two top-level modules import each
//! other, directly or around a cycle.
//!
//! [`LAYERS`] is the order, written once, lowest row first. A change that needs something from
//! a row above takes a trait defined low and implemented high instead (the way the worker's
//! remote receive is `runtime::RemoteRecv`, implemented by `peer::RemoteFetcher` and handed in
//! by the daemon), or moves the thing down to where both sides can see it.
//!
//! Read: code paths, `use` lines and inline ones alike, with `use crate::{a, b::c}` groups
//! opened. Not read: comments (doc links may point anywhere), string literals, and test
//! modules (`#[cfg(test)] mod tests { ... }` and test files pulled in by `#[path]`), which may
//! reach up to build what they test.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules of `src/`, lowest row first. Modules of one row may import each other
/// (but not in a cycle); a module imports nothing from a later row.
const LAYERS: &[&[&str]] = &[
    // The generated TensorFlow messages, their codec, and the status every layer returns.
    &["codec", "proto", "error"],
    &["tensor"],
    // File formats: checkpoints, TFRecord, event files, the paths kernels may touch.
    &["format"],
    &["data"],
    &["security"],
    // Who is in the cluster, and the task's configuration.
    &["cluster"],
    // Metric names and recorders, the RPC layer, systemd.
    &["ops"],
    &["graph"],
    // Device types, discovery, memory budgets.
    &["device"],
    // What kernels run against: devices, resources, the rendezvous, per-step state.
    &["runtime"],
    &["kernels"],
    // tf.data: datasets and iterators, whose functions are kernels.
    &["dataset"],
    // Placement, partitioning and the executor.
    &["exec"],
    // The actors of a daemon and the worker's service.
    &["tower", "shard", "worker"],
    // The transport, then the peers that reach other tasks over it.
    &["wire"],
    &["peer"],
    &["master"],
    &["client", "train"],
    // The daemon.
    &["server"],
];

/// Returns the row of `module` in [`LAYERS`].
fn row_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|row| row.contains(&module))
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to: `src/graph/ops/math.rs` is `graph`,
/// `src/server.rs` is `server`; `None` for the crate root and the command (`src/bin`).
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" | "bin" => None,
        name => Some(name.trim_end_matches(".rs").to_string()),
    }
}

/// `text` with comments and string and character literals blanked out (kept as spaces, so that
/// positions and line numbers stay).
fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, slice: &str| {
        out.extend(slice.chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
    };
    while i < bytes.len() {
        let rest = &text[i..];
        let end = if rest.starts_with("//") {
            rest.find('\n').unwrap_or(rest.len())
        } else if rest.starts_with("/*") {
            // Block comments nest in Rust.
            let mut depth = 0;
            let mut j = 0;
            loop {
                if rest[j..].starts_with("/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with("*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break j;
                    }
                } else if j >= rest.len() {
                    break rest.len();
                } else {
                    j += rest[j..].chars().next().unwrap().len_utf8();
                }
            }
        } else if let Some(hashes) = raw_string_start(rest) {
            let close = format!("\"{}", "#".repeat(hashes));
            let open = 2 + hashes + (rest.starts_with('b') as usize);
            rest[open..]
                .find(&close)
                .map_or(rest.len(), |k| open + k + close.len())
        } else if rest.starts_with('"') || rest.starts_with("b\"") {
            let mut j = if rest.starts_with('"') { 1 } else { 2 };
            while j < rest.len() {
                match rest.as_bytes()[j] {
                    b'\\' => j += 2,
                    b'"' => {
                        j += 1;
                        break;
                    }
                    _ => j += 1,
                }
            }
            j.min(rest.len())
        } else if rest.starts_with("'\"'") {
            3
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
            continue;
        };
        blank(&mut out, &rest[..end]);
        i += end;
    }
    out
}

/// The number of `#`s when `text` opens a raw string (`r"`, `r#"`, `br##"`, ...).
fn raw_string_start(text: &str) -> Option<usize> {
    let text = text.strip_prefix('b').unwrap_or(text);
    let text = text.strip_prefix('r')?;
    let hashes = text.bytes().take_while(|&b| b == b'#').count();
    text[hashes..].starts_with('"').then_some(hashes)
}

/// `code` without its test modules: each `#[cfg(test)]` item is blanked up to its closing
/// brace (or `;`). Returns the files that test modules pull in by `#[path = "..."]` too.
fn without_tests(code: &str, original: &str) -> (String, Vec<String>) {
    let mut out = code.to_string();
    let mut pulled_in = Vec::new();
    let mut from = 0;
    while let Some(found) = out[from..].find("#[cfg(test)]") {
        let start = from + found;
        let bytes = out.as_bytes();
        let mut j = start;
        let mut depth = 0usize;
        while j < bytes.len() {
            match bytes[j] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        j += 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    j += 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        // `#[path = "..."]` is a string literal, blanked in `code`: read it from the original.
        if let Some(k) = original[start..j].find("#[path = \"") {
            let name = &original[start + k + 10..];
            pulled_in.push(name[..name.find('"').unwrap()].to_string());
        }
        let blanked: String = out[start..j]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(start..j, &blanked);
        from = j;
    }
    (out, pulled_in)
}

/// The top-level modules named by the `crate::` paths of `code`, with the line of each.
fn crate_paths(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        // `foo_crate::x` is not a crate path.
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let line = code[..at].matches('\n').count() + 1;
        let rest = code[at + "crate::".len()..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // The top-level items of `{a, b::{c, d}, e as f}`.
            let mut depth = 0;
            let mut start_of_item = true;
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start_of_item = true,
                    c if start_of_item && !c.is_whitespace() => {
                        start_of_item = false;
                        let name = ident(&group[k..]);
                        if !name.is_empty() && name != "self" {
                            found.push((name, line));
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.push((name, line));
            }
        }
    }
    found
}

/// Every import between top-level modules: (from, to) with the places it is made.
fn imports() -> BTreeMap<(String, String), Vec<String>> {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut code_of = BTreeMap::new();
    let mut test_files = BTreeSet::new();
    for file in &files {
        let original = fs::read_to_string(file).unwrap();
        let (code, pulled_in) = without_tests(&code_only(&original), &original);
        for name in pulled_in {
            test_files.insert(file.parent().unwrap().join(name));
        }
        code_of.insert(file.clone(), code);
    }
    let mut edges: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (file, code) in &code_of {
        if test_files.contains(file) {
            continue;
        }
        let Some(from) = top_module(&src, file) else {
            continue;
        };
        for (to, line) in crate_paths(code) {
            if to != from {
                let place = format!("src/{}:{line}", file.strip_prefix(&src).unwrap().display());
                edges.entry((from.clone(), to)).or_default().push(place);
            }
        }
    }
    edges
}

#[test]
fn every_top_level_module_has_a_row() {
    let src = src_dir();
    let mut missing = Vec::new();
    for entry in fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if let Some(module) = top_module(&src, &path) {
            if row_of(&module).is_none() {
                missing.push(module);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "top-level modules without a row in LAYERS (tests/layers.rs): {missing:?}; add each \
         to the row it belongs in"
    );
    let rows: Vec<&str> = LAYERS.iter().flat_map(|row| row.iter().copied()).collect();
    let unique: BTreeSet<&str> = rows.iter().copied().collect();
    assert_eq!(unique.len(), rows.len(), "a module is in LAYERS twice");
}

#[test]
fn no_module_imports_from_a_layer_above() {
    let mut upward = Vec::new();
    for ((from, to), places) in imports() {
        let (Some(low), Some(high)) = (row_of(&from), row_of(&to)) else {
            // A path to a name of the crate root (`crate::Status`) or an unlisted module,
            // which the test above reports.
            continue;
        };
        if high > low {
            upward.push(format!("{from} -> {to} at {}", places.join(", ")));
        }
    }
    assert!(
        upward.is_empty(),
        "imports pointing up the layers (tests/layers.rs):\n  {}",
        upward.join("\n  ")
    );
}

#[test]
fn no_two_modules_import_each_other_even_around_a_cycle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in imports().into_keys() {
        if row_of(&to).is_some() {
            graph.entry(from).or_default().insert(to);
        }
    }
    // Depth-first search; a back edge closes a cycle, reported with its path.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(k) = path.iter().position(|p| p == node) {
            let mut cycle = path[k..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        let cycle = visit(node, &graph, &mut done, &mut Vec::new());
        assert!(
            cycle.is_none(),
            "modules import each other: {}",
            cycle.unwrap().join(" -> ")
        );
    }
}

#[test]
fn the_reader_finds_paths_and_skips_what_is_not_code() {
    let text = r##"
use crate::{graph::attr, tensor::{Shape, Tensor}, self};
use crate::kernels as k;
// use crate::server;
/// [`crate::master`]
fn f() -> crate::error::Result<()> { let s = "crate::peer"; let r = r#"crate::wire"#; Ok(()) }
let c = '"'; let d = crate::data::x;
#[cfg(test)]
mod tests {
    use crate::client;
}
fn after() { let _ = my_crate::ops; }
"##;
    let (code, _) = without_tests(&code_only(text), text);
    let names: Vec<String> = crate_paths(&code).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["graph", "tensor", "kernels", "error", "data"]);
}
