//! Step traces: what each node of a step did and when, recorded by the executor only when a
//! step asks for it (TensorFlow's `StepStatsCollector`, `RunOptions.trace_level`).
//!
//! The caller of a step puts a [`StepStatsCollector`] in [`StepOptions::stats`]; every
//! executor of the step (one per device; the frames engine and the plain one alike) saves one
//! [`NodeExecStats`] per node it runs, under its device's full name, and the caller takes the
//! [`StepStats`] when the step is over ([`StepStatsCollector::finish`]). A step without a
//! collector pays one branch per node and nothing else.
//!
//! Times are TensorFlow's: `all_start_micros` is wall-clock time (microseconds since the Unix
//! epoch, so that traces of tasks on one host line up), the rest relative to it. A node's
//! time runs from when its thread took it up (inputs gathered, references read) to when its
//! outputs were described; the kernel's own time (`op_*`) sits inside, and for a `_Recv` it
//! includes the wait for the tensor. `scheduled_micros` is when the node became ready.
//!
//! [`StepOptions::stats`]: super::StepOptions::stats

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::graph::attr;
use crate::proto::{
    AllocationDescription, DeviceStepStats, NodeDef, NodeExecStats, NodeOutput, StepStats,
    TensorDescription,
};
use crate::tensor::Tensor;

/// The allocator name traces give host memory, where every tessera tensor lives (TensorFlow's
/// CPU allocator is named `cpu` too).
const HOST_ALLOCATOR: &str = "cpu";

/// Collects the per-node statistics of one step, from every executor that runs a part of it;
/// `Send + Sync`, shared through an `Arc`.
pub struct StepStatsCollector {
    /// The collector's clock: an instant and the wall-clock time (nanoseconds since the Unix
    /// epoch) it corresponds to. Node times are measured on the monotonic clock and placed on
    /// the wall clock through it.
    origin: Instant,
    origin_epoch_nanos: i64,
    devices: Mutex<HashMap<String, DeviceStepStats>>,
}

impl Default for StepStatsCollector {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for StepStatsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices = self.lock();
        f.debug_struct("StepStatsCollector")
            .field("devices", &devices.len())
            .field(
                "nodes",
                &devices.values().map(|d| d.node_stats.len()).sum::<usize>(),
            )
            .finish()
    }
}

impl StepStatsCollector {
    /// An empty collector whose clock starts now.
    pub fn new() -> Self {
        let origin_epoch_nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        Self {
            origin: Instant::now(),
            origin_epoch_nanos,
            devices: Mutex::new(HashMap::new()),
        }
    }

    /// Returns the statistics saved so far, one [`DeviceStepStats`] per device in device-name
    /// order, each device's nodes in the order they started, and empties the collector.
    pub fn finish(&self) -> StepStats {
        let mut devices: Vec<DeviceStepStats> = self.lock().drain().map(|(_, d)| d).collect();
        devices.sort_by(|a, b| a.device.cmp(&b.device));
        for device in &mut devices {
            device.node_stats.sort_by(|a, b| {
                (a.all_start_nanos, &a.node_name).cmp(&(b.all_start_nanos, &b.node_name))
            });
        }
        StepStats { dev_stats: devices }
    }

    /// Nanoseconds from the collector's origin to `at`.
    pub(crate) fn nanos_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// Nanoseconds from the collector's origin to now.
    pub(crate) fn now(&self) -> u64 {
        self.nanos_at(Instant::now())
    }

    /// Saves one node's run on `device`, from its times (nanoseconds since the origin) and
    /// outputs, recording the calling thread as the one that ran it.
    pub(crate) fn save(
        &self,
        device: &str,
        node: &NodeDef,
        times: NodeTimes,
        outputs: &[Option<Tensor>],
    ) {
        let (thread_id, thread_name) = current_thread();
        let stats = node_exec_stats(node, self.origin_epoch_nanos, times, thread_id, outputs);
        let mut devices = self.lock();
        let entry = devices
            .entry(device.to_string())
            .or_insert_with(|| DeviceStepStats {
                device: device.to_string(),
                ..Default::default()
            });
        entry
            .thread_names
            .entry(thread_id)
            .or_insert_with(|| thread_name);
        entry.node_stats.push(stats);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, DeviceStepStats>> {
        self.devices.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// When a node was scheduled, taken up, ran its kernel and was done: nanoseconds since the
/// collector's origin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeTimes {
    pub(crate) scheduled: u64,
    pub(crate) all_start: u64,
    pub(crate) op_start: u64,
    pub(crate) op_end: u64,
    pub(crate) all_end: u64,
}

/// TensorFlow's entry for one node: the times on the wall clock (start) and relative to the
/// start, the label `timeline.py` parses, and each output's dtype, shape and bytes.
fn node_exec_stats(
    node: &NodeDef,
    epoch_origin: i64,
    times: NodeTimes,
    thread_id: u32,
    outputs: &[Option<Tensor>],
) -> NodeExecStats {
    let all_start = epoch_origin + times.all_start as i64;
    let scheduled = epoch_origin + times.scheduled.min(times.all_start) as i64;
    let rel = |t: u64| t.saturating_sub(times.all_start) as i64;
    NodeExecStats {
        node_name: node.name.clone(),
        all_start_micros: all_start / 1000,
        op_start_rel_micros: rel(times.op_start) / 1000,
        op_end_rel_micros: rel(times.op_end) / 1000,
        all_end_rel_micros: rel(times.all_end) / 1000,
        scheduled_micros: scheduled / 1000,
        all_start_nanos: all_start,
        op_start_rel_nanos: rel(times.op_start),
        op_end_rel_nanos: rel(times.op_end),
        all_end_rel_nanos: rel(times.all_end),
        scheduled_nanos: scheduled,
        thread_id,
        timeline_label: timeline_label(node),
        output: outputs
            .iter()
            .enumerate()
            .filter_map(|(slot, t)| t.as_ref().map(|t| node_output(slot, t)))
            .collect(),
    }
}

/// TensorFlow's timeline label, `name = Op(input, input)` (the form `timeline.py` parses into
/// the op and its inputs); a `_Send` names its tensor and where it goes, a `_Recv` its tensor
/// and where it comes from: `name = _Recv(tensor @/job:ps/...)`.
fn timeline_label(node: &NodeDef) -> String {
    let peer = match node.op.as_str() {
        "_Send" | "_HostSend" => Some("recv_device"),
        "_Recv" | "_HostRecv" => Some("send_device"),
        _ => None,
    };
    let inputs = match peer {
        Some(peer) => {
            let tensor = attr::string_or(node, "tensor_name", "").unwrap_or_default();
            let device = attr::string_or(node, peer, "").unwrap_or_default();
            format!("{tensor} @{device}")
        }
        None => node.input.join(", "),
    };
    format!("{} = {}({inputs})", node.name, node.op)
}

/// Output `slot`'s dtype, shape and bytes. A reference (a `VariableV2`'s output) owns no
/// memory of its own: zero bytes.
fn node_output(slot: usize, tensor: &Tensor) -> NodeOutput {
    let bytes = tensor.byte_size() as i64;
    NodeOutput {
        slot: slot as i32,
        tensor_description: Some(TensorDescription {
            dtype: tensor.dtype().to_proto() as i32,
            shape: Some(tensor.shape().to_proto()),
            allocation_description: Some(AllocationDescription {
                requested_bytes: bytes,
                allocated_bytes: bytes,
                allocator_name: HOST_ALLOCATOR.to_string(),
            }),
        }),
    }
}

/// A small id for the calling thread (the first thread to save a node is 1), and its name.
fn current_thread() -> (u32, String) {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    thread_local! {
        static THREAD: (u32, String) = {
            let id = NEXT.fetch_add(1, Ordering::Relaxed);
            let name = std::thread::current()
                .name()
                .map_or_else(|| format!("thread {id}"), str::to_string);
            (id, name)
        };
    }
    THREAD.with(|(id, name)| (*id, name.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::test_node as node;
    use crate::proto::{attr_value, AttrValue};
    use crate::tensor::DType;

    fn with_string(mut node: NodeDef, key: &str, value: &str) -> NodeDef {
        node.attr.insert(
            key.into(),
            AttrValue {
                value: Some(attr_value::Value::S(value.as_bytes().to_vec().into())),
            },
        );
        node
    }

    #[test]
    fn labels_are_the_form_timeline_py_parses() {
        assert_eq!(
            timeline_label(&node("add", "AddV2", &["x", "y:1", "^init"])),
            "add = AddV2(x, y:1, ^init)"
        );
        assert_eq!(timeline_label(&node("c", "Const", &[])), "c = Const()");
        let recv = with_string(
            with_string(node("w/_1", "_Recv", &[]), "tensor_name", "edge_3_w"),
            "send_device",
            "/job:ps/replica:0/task:0/device:CPU:0",
        );
        assert_eq!(
            timeline_label(&recv),
            "w/_1 = _Recv(edge_3_w @/job:ps/replica:0/task:0/device:CPU:0)"
        );
    }

    #[test]
    fn a_saved_node_has_wall_clock_start_relative_times_and_its_outputs() {
        let collector = StepStatsCollector::new();
        let times = NodeTimes {
            scheduled: 1_000,
            all_start: 5_000,
            op_start: 6_000,
            op_end: 9_500,
            all_end: 12_000,
        };
        let out = Tensor::from_vec([2, 3], vec![0f32; 6]).unwrap();
        collector.save(
            "/job:worker/replica:0/task:0/device:CPU:0",
            &node("mm", "MatMul", &["a", "b"]),
            times,
            &[None, Some(out)],
        );
        let stats = collector.finish();
        assert_eq!(stats.dev_stats.len(), 1);
        let device = &stats.dev_stats[0];
        assert_eq!(device.device, "/job:worker/replica:0/task:0/device:CPU:0");
        let n = &device.node_stats[0];
        assert_eq!(n.node_name, "mm");
        assert_eq!(n.timeline_label, "mm = MatMul(a, b)");
        assert_eq!(n.all_start_nanos, collector.origin_epoch_nanos + 5_000);
        assert_eq!(n.all_start_micros, n.all_start_nanos / 1000);
        assert_eq!(n.scheduled_nanos, collector.origin_epoch_nanos + 1_000);
        assert_eq!(
            (
                n.op_start_rel_nanos,
                n.op_end_rel_nanos,
                n.all_end_rel_nanos
            ),
            (1_000, 4_500, 7_000)
        );
        assert!(device.thread_names.contains_key(&n.thread_id));
        assert_eq!(n.output.len(), 1);
        assert_eq!(n.output[0].slot, 1);
        let description = n.output[0].tensor_description.as_ref().unwrap();
        assert_eq!(description.dtype, DType::Float.to_proto() as i32);
        let dims: Vec<i64> = description
            .shape
            .as_ref()
            .unwrap()
            .dim
            .iter()
            .map(|d| d.size)
            .collect();
        assert_eq!(dims, [2, 3]);
        let allocation = description.allocation_description.as_ref().unwrap();
        assert_eq!(allocation.requested_bytes, 24);
        assert_eq!(allocation.allocator_name, "cpu");
        // Taken: the collector is empty again.
        assert!(collector.finish().dev_stats.is_empty());
    }

    #[test]
    fn devices_come_out_in_name_order_and_nodes_in_start_order() {
        let collector = StepStatsCollector::new();
        let at = |start: u64| NodeTimes {
            all_start: start,
            op_start: start,
            op_end: start,
            all_end: start,
            ..Default::default()
        };
        collector.save(
            "/job:worker/task:0/device:CPU:0",
            &node("b", "NoOp", &[]),
            at(20),
            &[],
        );
        collector.save(
            "/job:ps/task:0/device:CPU:0",
            &node("p", "NoOp", &[]),
            at(5),
            &[],
        );
        collector.save(
            "/job:worker/task:0/device:CPU:0",
            &node("a", "NoOp", &[]),
            at(10),
            &[],
        );
        let stats = collector.finish();
        let devices: Vec<&str> = stats.dev_stats.iter().map(|d| d.device.as_str()).collect();
        assert_eq!(
            devices,
            [
                "/job:ps/task:0/device:CPU:0",
                "/job:worker/task:0/device:CPU:0"
            ]
        );
        let names: Vec<&str> = stats.dev_stats[1]
            .node_stats
            .iter()
            .map(|n| n.node_name.as_str())
            .collect();
        assert_eq!(names, ["a", "b"]);
    }
}
