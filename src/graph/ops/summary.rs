//! Summary ops (TensorFlow's `core/ops/logging_ops.cc` and `summary_ops.cc`): TensorFlow 1's
//! ops that return a serialized `Summary`, and TensorFlow 2's summary writer and the ops that
//! write through it. None has a gradient; the kernels are in `kernels/cpu/summary.rs`.

use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn as sf;

pub(super) fn register(r: &mut Registry) {
    OpDef::build("ScalarSummary")
        .input("tags: string")
        .input("values: T")
        .output("summary: string")
        .attr("T: {realnumbertype}")
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("HistogramSummary")
        .input("tag: string")
        .input("values: T")
        .output("summary: string")
        .attr("T: {realnumbertype} = float")
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("MergeSummary")
        .input("inputs: N * string")
        .output("summary: string")
        .attr("N: int >= 1")
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("SummaryWriter")
        .output("writer: resource")
        .attr("shared_name: string = ''")
        .attr("container: string = ''")
        .stateful()
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("CreateSummaryFileWriter")
        .input("writer: resource")
        .input("logdir: string")
        .input("max_queue: int32")
        .input("flush_millis: int32")
        .input("filename_suffix: string")
        .stateful()
        .shape(sf::no_outputs)
        .no_grad()
        .register(r);
    OpDef::build("WriteSummary")
        .input("writer: resource")
        .input("step: int64")
        .input("tensor: T")
        .input("tag: string")
        .input("summary_metadata: string")
        .attr("T: type")
        .stateful()
        .shape(sf::no_outputs)
        .no_grad()
        .register(r);
    OpDef::build("WriteScalarSummary")
        .input("writer: resource")
        .input("step: int64")
        .input("tag: string")
        .input("value: T")
        .attr("T: {realnumbertype}")
        .stateful()
        .shape(sf::no_outputs)
        .no_grad()
        .register(r);
    OpDef::build("WriteHistogramSummary")
        .input("writer: resource")
        .input("step: int64")
        .input("tag: string")
        .input("values: T")
        .attr("T: {realnumbertype} = float")
        .stateful()
        .shape(sf::no_outputs)
        .no_grad()
        .register(r);
    OpDef::build("FlushSummaryWriter")
        .input("writer: resource")
        .stateful()
        .shape(sf::no_outputs)
        .no_grad()
        .register(r);
    OpDef::build("CloseSummaryWriter")
        .input("writer: resource")
        .stateful()
        .shape(sf::no_outputs)
        .no_grad()
        .register(r);
}
