//! The fused ops TensorFlow's graph optimizer writes into the graphs its master partitions
//! (`tensorflow/core/ops/nn_ops.cc` and `math_ops.cc`, TensorFlow 2.21): `_FusedConv2D`,
//! `_FusedMatMul` and `_FusedBatchNormEx`. Grappler's remapper turns `Conv2D`/`MatMul` +
//! `BiasAdd` (+ an activation), an inference `Conv2D` + `FusedBatchNormV3` (+ an activation)
//! and `FusedBatchNormV3` + `Relu` into them, so a tessera worker registered by a TensorFlow
//! master receives them. They are declared here as TensorFlow declares them (the master strips
//! attrs at their defaults, which the registry fills back in); tessera's own builder never
//! creates them, so they have no gradient and no builder method. Their kernels are
//! `kernels::cpu`'s chains of the unfused kernels.
//!
//! Beside them, tessera's own `_FusedElementwise`: a tree of float32 element-wise ops its
//! worker fuses at registration (`exec::remap`), never sent by a client; and
//! `_FusedElementwiseAssign`, such a tree fused with the variable update that read it.

use crate::error::Result;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::ShapeCtx;
use crate::tensor::PartialShape;

pub(super) fn register(r: &mut Registry) {
    OpDef::build("_FusedConv2D")
        .input("input: T")
        .input("filter: T")
        .input("args: TArgs")
        .input("host_args: num_host_args * float")
        .output("output: T")
        .attr("T: {half, float, double, int8, qint8}")
        .attr("TArgs: list(type) >= 1")
        .attr("num_args: int >= 0")
        .attr("num_host_args: int >= 0 = 0")
        .attr("strides: list(int)")
        .attr("padding: {'SAME', 'VALID', 'EXPLICIT'}")
        .attr("explicit_paddings: list(int) = []")
        .attr("data_format: {'NHWC', 'NCHW', 'NCHW_VECT_C'} = 'NHWC'")
        .attr("filter_format: {'HWIO', 'OIHW', 'OIHW_VECT_I'} = 'HWIO'")
        .attr("dilations: list(int) = [1, 1, 1, 1]")
        .attr("use_cudnn_on_gpu: bool = true")
        .attr("fused_ops: list(string) = []")
        .attr("epsilon: float = 0.0001")
        .attr("leakyrelu_alpha: float = 0.2")
        .shape(super::conv::conv2d_shape)
        .register(r);
    OpDef::build("_FusedMatMul")
        .input("a: T")
        .input("b: T")
        .input("args: num_args * T")
        .output("product: T")
        .attr("transpose_a: bool = false")
        .attr("transpose_b: bool = false")
        .attr("T: {bfloat16, half, float}")
        .attr("num_args: int >= 0")
        .attr("fused_ops: list(string) = []")
        .attr("epsilon: float = 0.0001")
        .attr("leakyrelu_alpha: float = 0.2")
        .shape(super::math::matmul_shape)
        .register(r);
    // tessera's own: a tree of float32 element-wise ops its worker fused
    // (`exec::remap::fuse_element_wise`); `ops` names each step, `operands` gives two per
    // step (an input index, `N` + an earlier step's index, or -1 for a unary op's second).
    OpDef::build("_FusedElementwise")
        .input("inputs: N * T")
        .output("y: T")
        .attr("T: {float}")
        .attr("N: int >= 1")
        .attr("ops: list(string)")
        .attr("operands: list(int)")
        .shape(broadcast_all)
        .register(r);
    // The same tree fused with the `AssignAddVariableOp` or `AssignSubVariableOp` that was its
    // only reader (`update`: `add` or `sub`): the tree's result goes into the variable.
    OpDef::build("_FusedElementwiseAssign")
        .input("resource: resource")
        .input("inputs: N * T")
        .attr("T: {float}")
        .attr("N: int >= 1")
        .attr("ops: list(string)")
        .attr("operands: list(int)")
        .attr("update: {'add', 'sub'}")
        .stateful()
        .shape(|_| Ok(vec![]))
        .register(r);
    OpDef::build("_FusedBatchNormEx")
        .input("x: T")
        .input("scale: U")
        .input("offset: U")
        .input("mean: U")
        .input("variance: U")
        .input("side_input: num_side_inputs * T")
        .output("y: T")
        .output("batch_mean: U")
        .output("batch_variance: U")
        .output("reserve_space_1: U")
        .output("reserve_space_2: U")
        .output("reserve_space_3: U")
        .attr("T: {half, float, bfloat16}")
        .attr("U: {float}")
        .attr("epsilon: float = 0.0001")
        .attr("exponential_avg_factor: float = 1.0")
        .attr("num_side_inputs: int >= 0 = 0")
        .attr("activation_mode: string = 'Identity'")
        .attr("data_format: {'NHWC', 'NCHW'} = 'NHWC'")
        .attr("is_training: bool = true")
        .shape(batch_norm_ex_shape)
        .register(r);
}

/// Every input broadcast together.
fn broadcast_all(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let mut shape = PartialShape::new(vec![]);
    for i in 0..ctx.inputs.len() {
        shape = crate::graph::shape_fn::broadcast(ctx, &shape, &ctx.input(i))?;
    }
    Ok(vec![shape])
}

/// `FusedBatchNormV3`'s shapes: `y` as `x`, the statistics per channel, the last reserve space
/// unknown.
fn batch_norm_ex_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let mut shapes = super::normalization::batch_norm_shape(ctx)?;
    shapes.resize(6, PartialShape::unknown());
    Ok(shapes)
}

#[cfg(test)]
mod tests {
    use crate::graph::attr::value;
    use crate::graph::registry::global;
    use crate::proto::NodeDef;
    use crate::tensor::DType;

    /// What a TensorFlow 2.21 master sent for a `Dense(relu)` layer, default attrs stripped.
    #[test]
    fn stripped_defaults_come_back() {
        let def = global().get("_FusedMatMul").unwrap();
        let mut node = NodeDef {
            name: "Relu_1".into(),
            op: "_FusedMatMul".into(),
            ..Default::default()
        };
        node.attr.insert("T".into(), value::dtype(DType::Float));
        node.attr.insert("num_args".into(), value::int(1));
        node.attr
            .insert("fused_ops".into(), value::string_list(["BiasAdd", "Relu"]));
        node.attr.insert("epsilon".into(), value::float(0.0));
        def.fill_and_check_attrs(&mut node).unwrap();
        let alpha = crate::graph::attr::float_or(&node, "leakyrelu_alpha", 0.0).unwrap();
        assert_eq!(alpha, 0.2);
        assert_eq!(def.input_types(&node).unwrap(), vec![DType::Float; 3]);

        let def = global().get("_FusedBatchNormEx").unwrap();
        let mut node = NodeDef {
            name: "bn".into(),
            op: "_FusedBatchNormEx".into(),
            ..Default::default()
        };
        node.attr.insert("T".into(), value::dtype(DType::Float));
        node.attr.insert("U".into(), value::dtype(DType::Float));
        node.attr
            .insert("activation_mode".into(), value::string("Relu"));
        def.fill_and_check_attrs(&mut node).unwrap();
        assert_eq!(def.input_types(&node).unwrap().len(), 5);
        assert_eq!(def.output_types(&node).unwrap().len(), 6);
    }
}
