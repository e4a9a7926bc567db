//! TensorFlow 1 graphs written node by node, as `tf.compat.v1` lays out `cond` and
//! `while_loop`, for the executor and distributed control-flow tests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera::exec::Executor;
use tessera::graph::attr::value;
use tessera::graph::registry;
use tessera::kernels::create_kernel;
use tessera::proto::{AttrValue, GraphDef, NodeDef};
use tessera::runtime::{Device, StepOptions};
use tessera::tensor::{DType, Tensor};
use tessera::Result;

/// A graph under construction; node attrs get the registry's defaults.
#[derive(Default)]
pub struct G {
    pub nodes: Vec<NodeDef>,
    /// The device of the nodes added next (empty: unplaced).
    pub device: String,
    /// The device executors run on; a new CPU device per executor when unset (set it for
    /// steps that share variables).
    pub on: Option<Arc<Device>>,
}

impl G {
    pub fn op(
        &mut self,
        name: &str,
        op: &str,
        inputs: &[&str],
        attrs: &[(&str, AttrValue)],
    ) -> String {
        let mut node = NodeDef {
            name: name.into(),
            op: op.into(),
            device: self.device.clone(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        for (k, v) in attrs {
            node.attr.insert(k.to_string(), v.clone());
        }
        registry::lookup(&node)
            .unwrap()
            .fill_and_check_attrs(&mut node)
            .unwrap_or_else(|e| panic!("node {name}: {e}"));
        self.nodes.push(node);
        name.to_string()
    }

    /// A float op with `T = float`.
    pub fn f(&mut self, name: &str, op: &str, inputs: &[&str]) -> String {
        self.op(name, op, inputs, &[("T", value::dtype(DType::Float))])
    }

    pub fn constant(&mut self, name: &str, t: Tensor, controls: &[&str]) -> String {
        let inputs: Vec<String> = controls.iter().map(|c| format!("^{c}")).collect();
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        self.op(
            name,
            "Const",
            &inputs,
            &[
                ("dtype", value::dtype(t.dtype())),
                ("value", value::tensor(t.to_proto())),
            ],
        )
    }

    pub fn placeholder(&mut self, name: &str, dtype: DType) -> String {
        self.op(name, "Placeholder", &[], &[("dtype", value::dtype(dtype))])
    }

    pub fn enter(&mut self, name: &str, input: &str, frame: &str, constant: bool, parallel: i64) {
        self.op(
            name,
            "Enter",
            &[input],
            &[
                ("T", value::dtype(DType::Float)),
                ("frame_name", value::string(frame)),
                ("is_constant", value::bool(constant)),
                ("parallel_iterations", value::int(parallel)),
            ],
        );
    }

    pub fn merge(&mut self, name: &str, inputs: &[&str]) {
        self.op(
            name,
            "Merge",
            inputs,
            &[
                ("T", value::dtype(DType::Float)),
                ("N", value::int(inputs.len() as i64)),
            ],
        );
    }

    pub fn executor(&self, feeds: &[&str], fetches: &[&str]) -> Result<Executor> {
        self.executor_with_targets(feeds, fetches, &[])
    }

    pub fn executor_with_targets(
        &self,
        feeds: &[&str],
        fetches: &[&str],
        targets: &[&str],
    ) -> Result<Executor> {
        let graph = GraphDef {
            node: self.nodes.clone(),
            ..Default::default()
        };
        let device = self
            .on
            .clone()
            .unwrap_or_else(|| Arc::new(Device::local_cpu()));
        Executor::new(&graph, feeds, fetches, targets, device, &create_kernel)
    }

    pub fn run(&self, feeds: &[(&str, Tensor)], fetches: &[&str]) -> Result<Vec<Tensor>> {
        let names: Vec<&str> = feeds.iter().map(|(n, _)| *n).collect();
        let values = feeds.iter().map(|(_, t)| t.clone()).collect();
        self.executor(&names, fetches)?.run(values, &step())
    }
}

/// A step with a generous deadline.
pub fn step() -> StepOptions {
    StepOptions {
        step_id: 1,
        deadline: Some(Instant::now() + Duration::from_secs(20)),
        ..Default::default()
    }
}

/// `while_loop(lambda i, acc: i < n, lambda i, acc: (i + 1, acc + (i + 1) * scale), (0, 0))`,
/// with `n` and `scale` loop invariants, in frame `frame`, as TensorFlow 1 lays it out.
pub fn counting_loop(
    g: &mut G,
    frame: &str,
    i0: &str,
    acc0: &str,
    n: &str,
    scale: &str,
    parallel: i64,
) {
    let p = |s: &str| format!("{frame}/{s}");
    g.enter(&p("Enter_i"), i0, frame, false, parallel);
    g.enter(&p("Enter_acc"), acc0, frame, false, parallel);
    g.enter(&p("Enter_n"), n, frame, true, parallel);
    g.enter(&p("Enter_scale"), scale, frame, true, parallel);
    g.merge(&p("Merge_i"), &[&p("Enter_i"), &p("NextIteration_i")]);
    g.merge(&p("Merge_acc"), &[&p("Enter_acc"), &p("NextIteration_acc")]);
    g.f(&p("Less"), "Less", &[&p("Merge_i"), &p("Enter_n")]);
    g.op(&p("LoopCond"), "LoopCond", &[&p("Less")], &[]);
    g.f(&p("Switch_i"), "Switch", &[&p("Merge_i"), &p("LoopCond")]);
    g.f(
        &p("Switch_acc"),
        "Switch",
        &[&p("Merge_acc"), &p("LoopCond")],
    );
    g.f(
        &p("Identity_i"),
        "Identity",
        &[&format!("{}:1", p("Switch_i"))],
    );
    g.f(
        &p("Identity_acc"),
        "Identity",
        &[&format!("{}:1", p("Switch_acc"))],
    );
    g.constant(&p("one"), Tensor::scalar(1f32), &[&p("Identity_i")]);
    g.f(&p("add_i"), "Add", &[&p("Identity_i"), &p("one")]);
    g.f(&p("scaled"), "Mul", &[&p("add_i"), &p("Enter_scale")]);
    g.f(&p("add_acc"), "Add", &[&p("Identity_acc"), &p("scaled")]);
    g.f(&p("NextIteration_i"), "NextIteration", &[&p("add_i")]);
    g.f(&p("NextIteration_acc"), "NextIteration", &[&p("add_acc")]);
    g.f(&p("Exit_i"), "Exit", &[&p("Switch_i")]);
    g.f(&p("Exit_acc"), "Exit", &[&p("Switch_acc")]);
}
