//! Rendezvous keys: the string that names one tensor crossing one edge in one frame iteration,
//! in TensorFlow's wire format, and the RecvTensor incarnation check that guards them.
//!
//! A key reads `<src_device>;<src_incarnation>;<dst_device>;<tensor_name>;<frame_id>:<iter_id>`,
//! for example
//! `/job:ps/replica:0/task:0/device:CPU:0;e4b96570c8394f81;/job:worker/replica:0/task:0/device:CPU:0;edge_15_MatMul/ReadVariableOp;0:0`.
//! The incarnation is the sending device's random per-process id as 16 lowercase hex digits;
//! frame and iteration are `0:0` outside while-loops. Keys travel in `RunGraphRequest.send`,
//! `RunGraphRequest.recv_key` and `RecvTensorRequest.rendezvous_key`, so they must match
//! TensorFlow's byte for byte.
//!
//! Invariant: a [`ParsedKey`] always holds the canonical text of its parts (the hex incarnation
//! zero-padded and lowercase), so two keys naming the same tensor compare and hash equal.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::{Result, Status};
use crate::graph::attr;
use crate::proto::NodeDef;
use crate::tensor::DType;

/// A rendezvous key split into its parts. Cheap to clone (the text is shared).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ParsedKey {
    /// The canonical key text, shared with the rendezvous table that files values under it.
    full: Arc<str>,
    src_device: (usize, usize),
    /// Where the src device's task prefix (`/job:J/replica:R/task:T`) ends inside `full`.
    src_task_end: usize,
    src_incarnation: u64,
    dst_device: (usize, usize),
    edge_name: (usize, usize),
    frame_id: u64,
    iter_id: i64,
}

impl ParsedKey {
    /// Builds the key for `edge_name` sent from `src_device` (of `src_incarnation`) to
    /// `dst_device` in frame iteration `(frame_id, iter_id)`, as TensorFlow's `_Send` does.
    ///
    /// Fails with INVALID_ARGUMENT when a device is not a full device name or the edge name is
    /// empty or holds a `;`.
    pub fn new(
        src_device: &str,
        src_incarnation: u64,
        dst_device: &str,
        edge_name: &str,
        (frame_id, iter_id): (u64, i64),
    ) -> Result<Self> {
        Self::parse(&format!(
            "{src_device};{src_incarnation:016x};{dst_device};{edge_name};{frame_id}:{iter_id}"
        ))
    }

    /// Parses a key as TensorFlow writes it.
    ///
    /// Fails with INVALID_ARGUMENT naming the key and the bad part: not five `;`-separated parts,
    /// a device without `/job:`/`/task:`, an incarnation that is not at most 16 hex digits, an
    /// empty edge name, or a frame/iteration that is not `<u64>:<i64>`.
    pub fn parse(key: &str) -> Result<Self> {
        let bad = |what: String| {
            Status::invalid_argument(format!(
                "invalid rendezvous key `{key}`: {what}; expected \
                 `<src_device>;<src_incarnation hex>;<dst_device>;<tensor_name>;<frame_id>:<iter_id>`"
            ))
        };
        let parts: Vec<&str> = key.split(';').collect();
        let [src, incarnation, dst, edge, frame_iter] = parts[..] else {
            return Err(bad(format!(
                "{} parts separated by `;`, not 5",
                parts.len()
            )));
        };
        let src_task_len = task_prefix_len(src).map_err(|e| bad(format!("src device: {e}")))?;
        task_prefix_len(dst).map_err(|e| bad(format!("dst device: {e}")))?;
        let src_incarnation = parse_incarnation(incarnation).ok_or_else(|| {
            bad(format!(
                "src incarnation `{incarnation}` is not 1 to 16 hex digits"
            ))
        })?;
        if edge.is_empty() {
            return Err(bad("empty tensor name".to_string()));
        }
        let (frame_id, iter_id) = frame_iter
            .split_once(':')
            .and_then(|(f, i)| Some((parse_decimal::<u64>(f)?, parse_decimal::<i64>(i)?)))
            .ok_or_else(|| {
                bad(format!(
                    "frame and iteration `{frame_iter}` are not `<frame_id>:<iter_id>`"
                ))
            })?;

        // Rebuild the text so that every key naming this tensor is spelled the same way.
        let mut full = String::with_capacity(key.len() + 16);
        let src_device = push_part(&mut full, src);
        full.push(';');
        full.push_str(&format!("{src_incarnation:016x};"));
        let dst_device = push_part(&mut full, dst);
        full.push(';');
        let edge_name = push_part(&mut full, edge);
        full.push_str(&format!(";{frame_id}:{iter_id}"));
        Ok(Self {
            full: full.into(),
            src_device,
            src_task_end: src_task_len,
            src_incarnation,
            dst_device,
            edge_name,
            frame_id,
            iter_id,
        })
    }

    /// Returns the key text, as it travels on the wire.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// Returns the key text as a shared string, for tables keyed by it.
    pub(crate) fn shared(&self) -> Arc<str> {
        Arc::clone(&self.full)
    }

    /// Returns the full name of the device that sends the tensor.
    pub fn src_device(&self) -> &str {
        &self.full[self.src_device.0..self.src_device.1]
    }

    /// Returns the task prefix of the sending device, `/job:J/replica:R/task:T`.
    pub fn src_task(&self) -> &str {
        &self.full[..self.src_task_end]
    }

    /// Returns the incarnation of the sending device when the graph was registered.
    pub fn src_incarnation(&self) -> u64 {
        self.src_incarnation
    }

    /// Returns the full name of the device that receives the tensor.
    pub fn dst_device(&self) -> &str {
        &self.full[self.dst_device.0..self.dst_device.1]
    }

    /// Returns the tensor's name on the edge (`edge_<id>_<src node>`, or `x:0` for a feed).
    pub fn edge_name(&self) -> &str {
        &self.full[self.edge_name.0..self.edge_name.1]
    }

    /// Returns the while-loop frame and iteration, `(0, 0)` outside loops.
    pub fn frame_iter(&self) -> (u64, i64) {
        (self.frame_id, self.iter_id)
    }

    /// The same key in another frame and iteration (a transfer inside a while loop has one key
    /// per iteration).
    pub fn in_frame(&self, frame_iter: (u64, i64)) -> Result<ParsedKey> {
        if frame_iter == self.frame_iter() {
            return Ok(self.clone());
        }
        ParsedKey::new(
            self.src_device(),
            self.src_incarnation,
            self.dst_device(),
            self.edge_name(),
            frame_iter,
        )
    }
}

impl FromStr for ParsedKey {
    type Err = Status;

    fn from_str(key: &str) -> Result<Self> {
        Self::parse(key)
    }
}

impl fmt::Display for ParsedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl fmt::Debug for ParsedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ParsedKey({:?})", self.full)
    }
}

/// Checks a RecvTensor's key against the devices of this task, given as (full name,
/// incarnation) pairs, before the worker looks the tensor up.
///
/// A key whose incarnation differs from the live device's was made for an earlier run of this
/// process: ABORTED, with TensorFlow's message, so the master recreates its session. A key
/// whose source device is not on this task was sent to the wrong task: INVALID_ARGUMENT.
pub fn check_incarnation<'a>(
    key: &ParsedKey,
    local_devices: impl IntoIterator<Item = (&'a str, u64)>,
) -> Result<()> {
    let mut names = Vec::new();
    for (name, incarnation) in local_devices {
        if name != key.src_device() {
            names.push(name);
            continue;
        }
        if incarnation == key.src_incarnation() {
            return Ok(());
        }
        return Err(Status::aborted(format!(
            "RecvTensor expects a different device incarnation: {} vs. {}. Your worker job \
             (\"{}\") was probably restarted. Check your worker job for the reason why it was \
             restarted.",
            key.src_incarnation(),
            incarnation,
            key.src_task(),
        )));
    }
    Err(Status::invalid_argument(format!(
        "RecvTensor for key `{key}`: src device {} is not a device of this task (local devices: \
         {}); the peer sent the request to the wrong task, check its cluster spec",
        key.src_device(),
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        },
    )))
}

/// Appends `part` to `full` and returns its byte range there.
fn push_part(full: &mut String, part: &str) -> (usize, usize) {
    let start = full.len();
    full.push_str(part);
    (start, full.len())
}

/// Returns the length of the `/job:J/replica:R/task:T` prefix of a full device name
/// (`/job:J/replica:R/task:T/device:TYPE:N`, or the legacy `/job:J/replica:R/task:T/cpu:0`).
fn task_prefix_len(device: &str) -> std::result::Result<usize, String> {
    let not_full = || {
        format!(
            "`{device}` is not a full device name like /job:worker/replica:0/task:0/device:CPU:0"
        )
    };
    let rest = device.strip_prefix("/job:").ok_or_else(not_full)?;
    let mut end = None;
    let mut has_device = false;
    // Components after the job: replica, task, then the device itself.
    let mut offset = "/job:".len();
    let mut components = rest.split('/');
    let job = components.next().unwrap_or_default();
    offset += job.len();
    if job.is_empty() {
        return Err(not_full());
    }
    for component in components {
        offset += 1 + component.len();
        if let Some(task) = component.strip_prefix("task:") {
            if parse_decimal::<u32>(task).is_none() {
                return Err(format!("`{device}` has task `{task}`, not a task index"));
            }
            end = Some(offset);
        } else if end.is_some() && component.contains(':') {
            has_device = true;
        }
    }
    match end {
        Some(end) if has_device => Ok(end),
        _ => Err(not_full()),
    }
}

/// Parses TensorFlow's hex incarnation: 1 to 16 hex digits, either case.
fn parse_incarnation(hex: &str) -> Option<u64> {
    if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Parses a plain decimal integer (`i64::from_str` alone would also take a leading `+`).
fn parse_decimal<T: FromStr>(text: &str) -> Option<T> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Builds the rendezvous key under which a `_Send` node deposits, or a `_Recv` node collects,
/// its tensor outside any while-loop frame (`<send_device>;<incarnation as 16 hex>;
/// <recv_device>;<tensor_name>;0:0`): what the master puts in RunGraph's `send` and
/// `recv_key` for client-terminated nodes. INVALID_ARGUMENT naming the node when its attrs
/// are missing or do not form a key.
pub fn rendezvous_key_of(node: &NodeDef) -> Result<ParsedKey> {
    let context = |e: Status| e.context(format!("rendezvous key of node `{}`", node.name));
    ParsedKey::new(
        &attr::string_or(node, "send_device", "")?,
        attr::int(node, "send_device_incarnation")? as u64,
        &attr::string_or(node, "recv_device", "")?,
        &attr::string_or(node, "tensor_name", "")?,
        (0, 0),
    )
    .map_err(context)
}

/// The attrs shared by both ends of a `_Send`/`_Recv` pair: what [`rendezvous_key_of`] reads
/// back as the pair's key.
pub(crate) struct PairAttrs<'a> {
    pub tensor_name: &'a str,
    pub send_device: &'a str,
    pub incarnation: u64,
    pub recv_device: &'a str,
    pub client_terminated: bool,
}

impl PairAttrs<'_> {
    /// Writes the pair's attrs into `node`.
    pub(crate) fn apply(&self, node: &mut NodeDef) {
        let a = &mut node.attr;
        a.insert("tensor_name".into(), attr::value::string(self.tensor_name));
        a.insert("send_device".into(), attr::value::string(self.send_device));
        // The u64 travels bit for bit in an int64 attr, as TensorFlow writes it.
        a.insert(
            "send_device_incarnation".into(),
            attr::value::int(self.incarnation as i64),
        );
        a.insert("recv_device".into(), attr::value::string(self.recv_device));
        a.insert(
            "client_terminated".into(),
            attr::value::bool(self.client_terminated),
        );
    }

    /// A `_Send` of `input` (a tensor of `dtype`) on `device`.
    pub fn send(&self, name: String, input: String, device: &str, dtype: DType) -> NodeDef {
        let mut node = NodeDef {
            name,
            op: "_Send".into(),
            device: device.into(),
            input: vec![input],
            ..Default::default()
        };
        node.attr.insert("T".into(), attr::value::dtype(dtype));
        self.apply(&mut node);
        node
    }

    /// A `_Recv` of a tensor of `dtype` on `device`.
    pub fn recv(&self, name: String, device: &str, dtype: DType) -> NodeDef {
        let mut node = NodeDef {
            name,
            op: "_Recv".into(),
            device: device.into(),
            ..Default::default()
        };
        node.attr
            .insert("tensor_type".into(), attr::value::dtype(dtype));
        self.apply(&mut node);
        node
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    const PS_CPU: &str = "/job:ps/replica:0/task:0/device:CPU:0";
    const WORKER_CPU: &str = "/job:worker/replica:0/task:0/device:CPU:0";

    #[test]
    fn builds_the_text_tensorflow_writes() {
        let key = ParsedKey::new(PS_CPU, 0x1a2b, WORKER_CPU, "edge_12_w/read", (0, 0)).unwrap();
        // The incarnation is zero-padded to 16 digits.
        assert_eq!(
            key.as_str(),
            "/job:ps/replica:0/task:0/device:CPU:0;0000000000001a2b;\
             /job:worker/replica:0/task:0/device:CPU:0;edge_12_w/read;0:0"
        );
        assert_eq!(key.src_task(), "/job:ps/replica:0/task:0");
        assert_eq!(key.edge_name(), "edge_12_w/read");
    }

    #[test]
    fn canonicalizes_short_and_uppercase_incarnations() {
        let short = format!("{PS_CPU};ABC;{WORKER_CPU};x:0;0:0");
        let key = ParsedKey::parse(&short).unwrap();
        assert_eq!(key.src_incarnation(), 0xabc);
        assert_eq!(
            key.as_str(),
            format!("{PS_CPU};0000000000000abc;{WORKER_CPU};x:0;0:0")
        );
    }

    #[test]
    fn keeps_frame_and_iteration() {
        let key = ParsedKey::parse(&format!("{PS_CPU};1;{WORKER_CPU};edge_3_loop/x;7:-2")).unwrap();
        assert_eq!(key.frame_iter(), (7, -2));
        assert!(key.as_str().ends_with(";edge_3_loop/x;7:-2"));
    }

    #[test]
    fn legacy_device_names_have_a_task_prefix() {
        let key = ParsedKey::parse(
            "/job:local/replica:0/task:3/cpu:0;1;/job:local/replica:0/task:3/cpu:0;x:0;0:0",
        )
        .unwrap();
        assert_eq!(key.src_task(), "/job:local/replica:0/task:3");
    }

    #[test]
    fn rejects_malformed_devices() {
        for device in [
            "",
            "CPU:0",
            "/job:/replica:0/task:0/device:CPU:0",
            "/job:ps/replica:0/task:0",
            "/job:ps/replica:0/task:x/device:CPU:0",
            "/job:ps/replica:0/device:CPU:0",
        ] {
            let err = ParsedKey::new(device, 1, WORKER_CPU, "x:0", (0, 0)).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{device}");
            assert!(err.message().contains("src device"), "{err}");
        }
    }

    #[test]
    fn decimal_parts_take_no_sign_or_spaces() {
        assert_eq!(parse_decimal::<u64>("+1"), None);
        assert_eq!(parse_decimal::<u64>(" 1"), None);
        assert_eq!(parse_decimal::<u64>("-1"), None);
        assert_eq!(parse_decimal::<i64>("-1"), Some(-1));
        assert_eq!(parse_decimal::<i64>("-"), None);
    }

    #[test]
    fn incarnation_accepts_at_most_16_hex_digits() {
        assert_eq!(parse_incarnation("ffffffffffffffff"), Some(u64::MAX));
        assert_eq!(parse_incarnation("1ffffffffffffffff"), None);
        assert_eq!(parse_incarnation("+1"), None);
        assert_eq!(parse_incarnation("0x1"), None);
        assert_eq!(parse_incarnation(""), None);
    }
}
