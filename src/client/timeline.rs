//! A step trace as a Chrome trace: what TensorFlow's `timeline.Timeline(step_stats)
//! .generate_chrome_trace_format()` writes, for `chrome://tracing` or <https://ui.perfetto.dev>.
//!
//! The input is the `StepStats` of a traced step
//! ([`Session::run_with_options`](super::Session::run_with_options) with
//! `RunOptions.trace_level = FULL_TRACE`, or a TensorFlow client's `RunMetadata.step_stats`).
//! The output is the Trace Event Format's JSON object: one process per device (named
//! `"<device> Compute"`, as TensorFlow names it), one thread per `thread_id` the device's
//! nodes ran on (named from `DeviceStepStats.thread_names` where known), and one complete
//! event (`"ph": "X"`) per node, from its start to its end, named by its op, with the node's
//! name, op and inputs (`input0`, `input1`, ...) in `args`, read from its timeline label
//! (`name = Op(input, input)`). Where a node has nanosecond times they are used
//! (`ts` and `dur` in microseconds with a fraction), so nodes shorter than a microsecond
//! still show; otherwise its microseconds.
//!
//! TensorFlow's timeline also draws tensors, allocators and data-flow arrows; this one draws
//! the compute lanes, which is what a step trace is read for.

use serde_json::{json, Map, Value};

use crate::proto::{NodeExecStats, StepStats};

/// Returns the Chrome trace (Trace Event Format, a JSON object with `traceEvents`) of a
/// step's stats: a process per device, a thread per thread id, a complete event per node.
pub fn chrome_trace(stats: &StepStats) -> String {
    let mut events = Vec::new();
    for (pid, device) in stats.dev_stats.iter().enumerate() {
        events.push(json!({
            "name": "process_name",
            "ph": "M",
            "pid": pid,
            "args": {"name": format!("{} Compute", device.device)},
        }));
        let mut threads: Vec<u32> = device.node_stats.iter().map(|n| n.thread_id).collect();
        threads.sort_unstable();
        threads.dedup();
        for tid in threads {
            let name = device
                .thread_names
                .get(&tid)
                .cloned()
                .unwrap_or_else(|| format!("thread {tid}"));
            events.push(json!({
                "name": "thread_name",
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "args": {"name": name},
            }));
        }
        for node in &device.node_stats {
            events.push(node_event(node, pid));
        }
    }
    let trace = json!({ "traceEvents": events, "displayTimeUnit": "ns" });
    serde_json::to_string_pretty(&trace).expect("a JSON value always serializes")
}

/// One node's complete event on process `pid`.
fn node_event(node: &NodeExecStats, pid: usize) -> Value {
    let (_, op, inputs) = parse_label(&node.timeline_label);
    let op = op.unwrap_or("unknown");
    let mut args = Map::new();
    args.insert("name".into(), node.node_name.clone().into());
    args.insert("op".into(), op.into());
    for (i, input) in inputs.iter().enumerate() {
        args.insert(format!("input{i}"), (*input).into());
    }
    let (ts, dur) = if node.all_start_nanos != 0 {
        (
            node.all_start_nanos as f64 / 1000.0,
            node.all_end_rel_nanos as f64 / 1000.0,
        )
    } else {
        (node.all_start_micros as f64, node.all_end_rel_micros as f64)
    };
    json!({
        "ph": "X",
        "cat": "Op",
        "name": op,
        "pid": pid,
        "tid": node.thread_id,
        "ts": ts,
        "dur": dur,
        "args": Value::Object(args),
    })
}

/// Splits a timeline label `name = Op(a, b)` into its name, op and inputs, as TensorFlow's
/// `timeline.py` does; a label of another form has no op and no inputs.
fn parse_label(label: &str) -> (Option<&str>, Option<&str>, Vec<&str>) {
    let parsed = label.split_once(" = ").and_then(|(name, rest)| {
        let rest = rest.strip_suffix(')')?;
        let (op, inputs) = rest.split_once('(')?;
        Some((name, op, inputs))
    });
    match parsed {
        Some((name, op, inputs)) => {
            let inputs = if inputs.is_empty() {
                Vec::new()
            } else {
                inputs.split(", ").collect()
            };
            (Some(name), Some(op), inputs)
        }
        None => (None, None, Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::DeviceStepStats;

    fn node(name: &str, label: &str, start_us: i64, dur_us: i64, thread: u32) -> NodeExecStats {
        NodeExecStats {
            node_name: name.into(),
            timeline_label: label.into(),
            all_start_micros: start_us,
            all_end_rel_micros: dur_us,
            thread_id: thread,
            ..Default::default()
        }
    }

    fn stats() -> StepStats {
        let mut worker = DeviceStepStats {
            device: "/job:worker/replica:0/task:0/device:CPU:0".into(),
            node_stats: vec![
                node(
                    "x",
                    "x = _Recv(x:0 @/job:ps/replica:0/task:0/device:CPU:0)",
                    100,
                    30,
                    1,
                ),
                node("y", "y = AddV2(x, one)", 140, 5, 2),
            ],
            ..Default::default()
        };
        worker.thread_names.insert(1, "tessera-exec".into());
        let ps = DeviceStepStats {
            device: "/job:ps/replica:0/task:0/device:CPU:0".into(),
            node_stats: vec![node("w", "w = VarHandleOp()", 90, 2, 7)],
            ..Default::default()
        };
        StepStats {
            dev_stats: vec![ps, worker],
        }
    }

    fn events(trace: &str) -> Vec<Value> {
        let value: Value = serde_json::from_str(trace).unwrap();
        value["traceEvents"].as_array().unwrap().clone()
    }

    #[test]
    fn labels_parse_as_timeline_py_parses_them() {
        assert_eq!(
            parse_label("mm = MatMul(a, b:1)"),
            (Some("mm"), Some("MatMul"), vec!["a", "b:1"])
        );
        assert_eq!(
            parse_label("c = Const()"),
            (Some("c"), Some("Const"), vec![])
        );
        assert_eq!(parse_label("RecvTensor"), (None, None, vec![]));
    }

    #[test]
    fn each_device_is_a_process_and_each_node_a_complete_event() {
        let events = events(&chrome_trace(&stats()));
        let processes: Vec<(u64, &str)> = events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| {
                (
                    e["pid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            processes,
            [
                (0, "/job:ps/replica:0/task:0/device:CPU:0 Compute"),
                (1, "/job:worker/replica:0/task:0/device:CPU:0 Compute")
            ]
        );
        let ops: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(ops.len(), 3);
        let add = ops.iter().find(|e| e["args"]["name"] == "y").unwrap();
        assert_eq!(add["name"], "AddV2");
        assert_eq!(add["cat"], "Op");
        assert_eq!(
            (add["pid"].as_u64(), add["tid"].as_u64()),
            (Some(1), Some(2))
        );
        assert_eq!(
            (add["ts"].as_f64(), add["dur"].as_f64()),
            (Some(140.0), Some(5.0))
        );
        assert_eq!(add["args"]["op"], "AddV2");
        assert_eq!(add["args"]["input0"], "x");
        assert_eq!(add["args"]["input1"], "one");
        let recv = ops.iter().find(|e| e["args"]["name"] == "x").unwrap();
        assert_eq!(recv["name"], "_Recv");
        assert_eq!(
            recv["args"]["input0"],
            "x:0 @/job:ps/replica:0/task:0/device:CPU:0"
        );
    }

    #[test]
    fn threads_are_named_from_the_device_stats_or_by_id() {
        let events = events(&chrome_trace(&stats()));
        let threads: Vec<(u64, u64, &str)> = events
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| {
                (
                    e["pid"].as_u64().unwrap(),
                    e["tid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            threads,
            [
                (0, 7, "thread 7"),
                (1, 1, "tessera-exec"),
                (1, 2, "thread 2")
            ]
        );
    }

    #[test]
    fn nanosecond_times_are_used_where_a_node_has_them() {
        let mut short = node("n", "n = NoOp()", 10, 0, 1);
        short.all_start_nanos = 10_250;
        short.all_end_rel_nanos = 400;
        let stats = StepStats {
            dev_stats: vec![DeviceStepStats {
                device: "/job:localhost/replica:0/task:0/device:CPU:0".into(),
                node_stats: vec![short],
                ..Default::default()
            }],
        };
        let events = events(&chrome_trace(&stats));
        let op = events.iter().find(|e| e["ph"] == "X").unwrap();
        assert_eq!(
            (op["ts"].as_f64(), op["dur"].as_f64()),
            (Some(10.25), Some(0.4))
        );
    }

    #[test]
    fn an_empty_trace_is_an_empty_event_list() {
        assert!(events(&chrome_trace(&StepStats::default())).is_empty());
    }
}
