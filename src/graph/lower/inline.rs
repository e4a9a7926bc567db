//! Inlining a function body into the graph being lowered, as TensorFlow's
//! `InlineFunctionBody` does for multi-device functions (see the parent module's doc).

use std::rc::Rc;

use super::{Chain, Lowering};
use crate::cluster::DeviceName;
use crate::error::Result;
use crate::graph::attr::{self, value};
use crate::graph::function::{Body, BodySource};
use crate::proto::attr_value;
use crate::tensor::DType;

/// A function call to inline.
pub(super) struct Inline<'a> {
    /// The call's name: the prefix of the inlined nodes.
    pub name: &'a str,
    /// The call's device.
    pub device: &'a str,
    /// The function's body.
    pub body: Body,
    /// The arguments (tensor names).
    pub inputs: Vec<String>,
    /// Nodes the call has control inputs on.
    pub controls: Vec<String>,
}

/// What a function inlined as.
pub(super) struct Inlined {
    /// Per result: the `Identity` node holding it.
    pub outputs: Vec<String>,
    /// The node standing for the call as a control input.
    pub output_control: String,
}

impl Lowering<'_> {
    /// Inlines `call` (see the module doc): adds its nodes, queues the functional ones.
    pub(super) fn inline(&mut self, call: Inline<'_>, chain: &Chain) -> Result<Inlined> {
        let Inline {
            name,
            device,
            body,
            inputs,
            controls,
        } = call;
        let t = |d: DType| ("T", value::dtype(d));
        let gate = if controls.is_empty() {
            None
        } else {
            Some(self.push(
                &format!("{name}/input_control_node"),
                "NoOp",
                controls.iter().map(|c| format!("^{c}")).collect(),
                vec![],
                device,
            )?)
        };
        let gated = |mut inputs: Vec<String>| {
            inputs.extend(gate.iter().map(|g| format!("^{g}")));
            inputs
        };
        let mut args = Vec::with_capacity(body.args.len());
        for (i, (input, (_, dtype))) in inputs.iter().zip(&body.args).enumerate() {
            args.push(self.push(
                &format!("{name}/input/_{i}"),
                "Identity",
                gated(vec![input.clone()]),
                vec![t(*dtype)],
                device,
            )?);
        }
        let names: Vec<String> = body
            .nodes
            .iter()
            .map(|n| self.unique(&format!("{name}/{}", n.name)))
            .collect();
        let tensor = |s: &BodySource| match *s {
            BodySource::Arg(i) => args[i].clone(),
            BodySource::Node { node, slot: 0 } => names[node].clone(),
            BodySource::Node { node, slot } => format!("{}:{slot}", names[node]),
        };
        let chain: Chain = Rc::new(chain.iter().cloned().chain([body.name.clone()]).collect());
        for (i, def) in body.nodes.iter().enumerate() {
            let mut node = def.clone();
            node.name = names[i].clone();
            node.input = body.inputs[i].iter().map(&tensor).collect();
            node.input
                .extend(body.controls[i].iter().map(|&c| format!("^{}", names[c])));
            // Body constants, and calls that will inline them, run in the caller's frame.
            let no_inputs = node.input.is_empty();
            let call_without_controls = body.controls[i].is_empty()
                && matches!(
                    node.op.as_str(),
                    "PartitionedCall" | "StatefulPartitionedCall"
                );
            if no_inputs || call_without_controls {
                node.input = gated(node.input);
            }
            node.device = inlined_device(&def.device, device);
            if matches!(node.op.as_str(), "Enter" | "RefEnter") {
                let frame = attr::string_or(def, "frame_name", "")?;
                node.attr.insert(
                    "frame_name".into(),
                    value::string(format!("{name}/{frame}")),
                );
            }
            if let Some(attr_value::Value::List(l)) =
                node.attr.get_mut("_class").and_then(|a| a.value.as_mut())
            {
                for entry in &mut l.s {
                    let Some(target) = entry.strip_prefix(b"loc:@") else {
                        continue;
                    };
                    let target = String::from_utf8_lossy(target).into_owned();
                    let renamed = match body.nodes.iter().position(|n| n.name == target) {
                        Some(k) => Some(names[k].clone()),
                        None => body
                            .args
                            .iter()
                            .position(|(a, _)| *a == target)
                            .map(|k| args[k].clone()),
                    };
                    if let Some(renamed) = renamed {
                        *entry = format!("loc:@{renamed}").into_bytes().into();
                    }
                }
            }
            self.add(node, &chain);
        }
        let mut outputs = Vec::with_capacity(body.outputs.len());
        for (i, (source, dtype)) in body.outputs.iter().zip(&body.output_types).enumerate() {
            outputs.push(self.push(
                &format!("{name}/output/_{i}"),
                "Identity",
                vec![tensor(source)],
                vec![t(*dtype)],
                device,
            )?);
        }
        let mut waits: Vec<String> = body
            .control_outputs
            .iter()
            .map(|&c| format!("^{}", names[c]))
            .collect();
        if waits.is_empty() {
            // Without side effects to wait for, it still carries the caller's frame.
            waits.extend(gate.iter().map(|g| format!("^{g}")));
        }
        let output_control = self.push(
            &format!("{name}/output_control_node"),
            "NoOp",
            waits,
            vec![],
            device,
        )?;
        Ok(Inlined {
            outputs,
            output_control,
        })
    }
}

/// The device of an inlined body node: its own, with the fields it leaves unset taken from
/// the caller's device (TensorFlow's `MergeUnsetDevNames`); the caller's when it has none.
fn inlined_device(own: &str, caller: &str) -> String {
    if own.is_empty() {
        return caller.to_string();
    }
    if caller.is_empty() {
        return own.to_string();
    }
    let (Ok(mut mine), Ok(theirs)) = (DeviceName::parse(own), DeviceName::parse(caller)) else {
        return own.to_string();
    };
    if mine.job.is_none() {
        mine.job = theirs.job.clone();
    }
    if mine.replica.is_none() {
        mine.replica = theirs.replica;
    }
    if mine.task.is_none() {
        mine.task = theirs.task;
    }
    if mine.device_type.is_none() {
        mine.device_type = theirs.device_type.clone();
    }
    if mine.id.is_none() {
        mine.id = theirs.id;
    }
    mine.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inlined_nodes_keep_their_device_and_fill_its_gaps_from_the_caller() {
        let caller = "/job:worker/replica:0/task:1/device:CPU:0";
        assert_eq!(inlined_device("", caller), caller);
        assert_eq!(
            inlined_device("/device:GPU:0", caller),
            "/job:worker/replica:0/task:1/device:GPU:0"
        );
        assert_eq!(
            inlined_device("/job:ps/task:0", caller),
            "/job:ps/replica:0/task:0/device:CPU:0"
        );
        assert_eq!(inlined_device("/job:ps/task:0", ""), "/job:ps/task:0");
    }
}
