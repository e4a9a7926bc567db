//! The `checkpoint` state file of a checkpoint directory: a text-format `CheckpointState`
//! naming the latest checkpoint and every one still kept (oldest first), as TensorFlow's
//! `tf.train.update_checkpoint_state` writes it and `tf.train.latest_checkpoint` reads it.
//!
//! ```text
//! model_checkpoint_path: "model.ckpt-200"
//! all_model_checkpoint_paths: "model.ckpt-100"
//! all_model_checkpoint_paths: "model.ckpt-200"
//! all_model_checkpoint_timestamps: 1763764800.5
//! all_model_checkpoint_timestamps: 1763764860.25
//! last_preserved_timestamp: 1763764700.0
//! ```
//!
//! Paths inside the directory are stored relative to it, so a directory can be moved whole.
//! The file is written atomically (temp file, fsync, rename).

use std::path::{Path, PathBuf};

use crate::error::{Result, Status};
use crate::format::checkpoint::bundle::{index_filename, write_atomic};
use crate::proto::CheckpointState;

/// The state file's name inside a checkpoint directory.
pub const STATE_FILENAME: &str = "checkpoint";

/// Returns `path` relative to `dir` when it lies directly in it, else unchanged.
fn relative_to(dir: &Path, path: &str) -> String {
    match Path::new(path).strip_prefix(dir) {
        Ok(rel) if rel.components().count() == 1 => rel.to_string_lossy().into_owned(),
        _ => path.to_string(),
    }
}

/// Returns `path` joined onto `dir` when relative.
fn absolute_in(dir: &Path, path: &str) -> String {
    if Path::new(path).is_absolute() {
        path.to_string()
    } else {
        dir.join(path).to_string_lossy().into_owned()
    }
}

/// Quotes `s` as a text-format string (C escapes for quotes, backslashes, controls).
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\{b:03o}")),
        }
    }
    out.push('"');
    out
}

/// Parses a text-format quoted string (the inverse of [`quote`], plus `'` quotes and hex).
fn unquote(s: &str) -> Option<String> {
    let s = s.trim();
    let q = s.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let body = s.strip_prefix(q)?.strip_suffix(q)?;
    let bytes = body.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        let c = *bytes.get(i + 1)?;
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                for _ in 0..2 {
                    match bytes.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(u8::try_from(v).ok()?);
            }
            b'x' => {
                let hex = std::str::from_utf8(bytes.get(i..i + 2)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            other => out.push(other),
        }
    }
    String::from_utf8(out).ok()
}

/// Renders `state` in text format.
pub fn to_text(state: &CheckpointState) -> String {
    let mut out = format!(
        "model_checkpoint_path: {}\n",
        quote(&state.model_checkpoint_path)
    );
    for p in &state.all_model_checkpoint_paths {
        out.push_str(&format!("all_model_checkpoint_paths: {}\n", quote(p)));
    }
    for t in &state.all_model_checkpoint_timestamps {
        out.push_str(&format!("all_model_checkpoint_timestamps: {t:?}\n"));
    }
    if state.last_preserved_timestamp != 0.0 {
        out.push_str(&format!(
            "last_preserved_timestamp: {:?}\n",
            state.last_preserved_timestamp
        ));
    }
    out
}

/// Parses the text format of a `CheckpointState` (read from `path`, named in errors).
pub fn from_text(text: &str, path: &Path) -> Result<CheckpointState> {
    let mut state = CheckpointState::default();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || {
            Status::data_loss(format!(
                "checkpoint state file {} line {}: cannot parse {line:?}; delete or fix the file",
                path.display(),
                n + 1
            ))
        };
        let (key, value) = line.split_once(':').ok_or_else(bad)?;
        match key.trim() {
            "model_checkpoint_path" => {
                state.model_checkpoint_path = unquote(value).ok_or_else(bad)?
            }
            "all_model_checkpoint_paths" => state
                .all_model_checkpoint_paths
                .push(unquote(value).ok_or_else(bad)?),
            "all_model_checkpoint_timestamps" => state
                .all_model_checkpoint_timestamps
                .push(value.trim().parse().map_err(|_| bad())?),
            "last_preserved_timestamp" => {
                state.last_preserved_timestamp = value.trim().parse().map_err(|_| bad())?
            }
            // Fields of later TensorFlow releases are skipped, as proto parsers do.
            _ => {}
        }
    }
    Ok(state)
}

/// Writes the state file of `dir` atomically; paths in `dir` are stored relative to it.
pub fn write_state(dir: &Path, state: &CheckpointState) -> Result<()> {
    let mut relative = state.clone();
    relative.model_checkpoint_path = relative_to(dir, &state.model_checkpoint_path);
    relative.all_model_checkpoint_paths = state
        .all_model_checkpoint_paths
        .iter()
        .map(|p| relative_to(dir, p))
        .collect();
    write_atomic(&dir.join(STATE_FILENAME), to_text(&relative).as_bytes())
}

/// Reads the state file of `dir` with paths made absolute (joined onto `dir`); `None` when
/// the directory has no state file.
pub fn read_state(dir: &Path) -> Result<Option<CheckpointState>> {
    let path = dir.join(STATE_FILENAME);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Status::data_loss(format!(
                "cannot read checkpoint state file {}: {e}",
                path.display()
            )))
        }
    };
    let mut state = from_text(&text, &path)?;
    state.model_checkpoint_path = absolute_in(dir, &state.model_checkpoint_path);
    state.all_model_checkpoint_paths = state
        .all_model_checkpoint_paths
        .iter()
        .map(|p| absolute_in(dir, p))
        .collect();
    Ok(Some(state))
}

/// Returns the prefix of the latest checkpoint in `dir` (`dir/model.ckpt-200`), or `None`
/// when there is no state file or its checkpoint's index is gone (as TensorFlow's
/// `latest_checkpoint`, which then starts from scratch).
pub fn latest_checkpoint(dir: &Path) -> Result<Option<PathBuf>> {
    let Some(state) = read_state(dir)? else {
        return Ok(None);
    };
    if state.model_checkpoint_path.is_empty() {
        return Ok(None);
    }
    let prefix = state.model_checkpoint_path;
    if !index_filename(&prefix).exists() {
        tracing::warn!(
            "checkpoint state in {} names {prefix}, but {} is missing; ignoring it",
            dir.display(),
            index_filename(&prefix).display()
        );
        return Ok(None);
    }
    Ok(Some(PathBuf::from(prefix)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_round_trips() {
        for s in ["model.ckpt-1", "a\"b\\c", "tab\there", "é"] {
            assert_eq!(unquote(&quote(s)).as_deref(), Some(s));
        }
        assert_eq!(unquote("'x\\x41'").as_deref(), Some("xA"));
    }
}
