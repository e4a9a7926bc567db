//! Op definitions and constructors, one file per op family (as TensorFlow splits
//! `core/ops/*.cc`): each file registers its ops (signature, shape function, gradient) and adds
//! the builder methods (`g.matmul(..)`) that create them.

mod array;
mod control_flow;
mod conv;

pub use control_flow::{is_loop_back_edge, ControlFlowOp};
mod data_flow;
mod dataset;
mod feature_columns;
mod functional;
mod fused;
mod gather_nd;
mod io;
mod linalg;
mod list;
mod lookup;
mod math;
mod nn;
mod normalization;
mod padding;
mod parsing;
mod slicing;
mod sparse;
mod sparse_columns;
mod sparse_serialization;
mod sparse_training;
mod state;
mod stateless_random;
mod strings;
mod summary;
mod tensor_array;
mod training;

use crate::error::Result;
use crate::graph::attr::value;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::const_value;
use crate::graph::registry::Registry;
use crate::proto::TensorProto;
use crate::tensor::{DType, PartialShape, Tensor};

/// Registers every op tessera knows.
pub(crate) fn register_all(r: &mut Registry) {
    array::register(r);
    control_flow::register(r);
    math::register(r);
    nn::register(r);
    conv::register(r);
    normalization::register(r);
    slicing::register(r);
    padding::register(r);
    sparse::register(r);
    gather_nd::register(r);
    feature_columns::register(r);
    strings::register(r);
    parsing::register(r);
    sparse_columns::register(r);
    sparse_serialization::register(r);
    lookup::register(r);
    state::register(r);
    stateless_random::register(r);
    summary::register(r);
    io::register(r);
    data_flow::register(r);
    dataset::register(r);
    functional::register(r);
    fused::register(r);
    tensor_array::register(r);
    list::register(r);
    training::register(r);
    sparse_training::register(r);
    linalg::register(r);
}

/// Constructors shared by every family: constants and the one- and two-input op shapes.
impl Graph {
    /// Adds a `Const` holding `tensor`.
    pub fn constant(&mut self, tensor: &Tensor) -> Result<Output> {
        self.constant_proto("Const", tensor.to_proto())
    }

    /// Adds a `Const` named `name` (made unique) holding `proto`.
    pub fn constant_proto(&mut self, name: &str, proto: TensorProto) -> Result<Output> {
        let dtype = DType::from_i32(proto.dtype)?;
        self.add1(
            NodeSpec::new("Const")
                .name(name)
                .attr("dtype", value::dtype(dtype))
                .attr("value", value::tensor(proto)),
        )
    }

    /// Adds an `int32` `Const` named `name` with these dims and values.
    pub fn const_i32(&mut self, name: &str, dims: &[usize], values: &[i32]) -> Result<Output> {
        self.constant_proto(name, const_value::int32(dims, values))
    }

    /// Adds a 1-D `int32` `Const` named `name`.
    pub fn const_vec_i32(&mut self, name: &str, values: &[i64]) -> Result<Output> {
        let v: Vec<i32> = values.iter().map(|&v| v as i32).collect();
        self.const_i32(name, &[v.len()], &v)
    }

    /// Adds a scalar `Const` of `dtype` holding `v`, named `name`.
    pub fn scalar(&mut self, name: &str, dtype: DType, v: f64) -> Result<Output> {
        self.constant_proto(name, const_value::scalar(dtype, v)?)
    }

    /// Adds a `Placeholder` named `name`.
    pub fn placeholder(&mut self, name: &str, dtype: DType, shape: PartialShape) -> Result<Output> {
        self.add1(
            NodeSpec::new("Placeholder")
                .name(name)
                .attr("dtype", value::dtype(dtype))
                .attr("shape", value::shape(&shape)),
        )
    }

    /// Adds a one-input op of type `op`.
    pub fn unary(&mut self, op: &str, x: &Output) -> Result<Output> {
        self.add1(NodeSpec::new(op).input(x))
    }

    /// Adds a two-input op of type `op`.
    pub fn binary(&mut self, op: &str, x: &Output, y: &Output) -> Result<Output> {
        self.add1(NodeSpec::new(op).input(x).input(y))
    }

    /// Creates a node named `base` (made unique) whose helper constants are named
    /// `base/<aux>` as TensorFlow names them (`Sum/reduction_indices`), and returns the name.
    pub(crate) fn reserve_name(&mut self, base: &str) -> String {
        self.unique_name(base)
    }

    /// Adds the shape of `x`: a `Const` named `Shape` when it is fully known (as TensorFlow's
    /// `array_ops.shape` folds it), a `Shape` op otherwise.
    pub fn shape_of(&mut self, x: &Output) -> Result<Output> {
        match x.shape.to_shape() {
            Some(s) => {
                let dims: Vec<i64> = s.dims().iter().map(|&d| d as i64).collect();
                self.const_vec_i32("Shape", &dims)
            }
            None => self.unary("Shape", x),
        }
    }
}

/// Adds a node named `name` (exact) built by `f`, and a 1-D `int32` aux constant
/// `name/aux` (exact) holding `values` as its input.
pub(crate) fn with_aux_i32(
    g: &mut Graph,
    base: &str,
    aux: &str,
    values: &[i64],
    scalar: bool,
    f: impl FnOnce(&mut Graph, &str, Output) -> Result<Output>,
) -> Result<Output> {
    let name = g.reserve_name(base);
    let v: Vec<i32> = values.iter().map(|&v| v as i32).collect();
    let dims: Vec<usize> = if scalar { vec![] } else { vec![v.len()] };
    let c = g.const_i32(&format!("{name}/{aux}/"), &dims, &v)?;
    f(g, &format!("{name}/"), c)
}
