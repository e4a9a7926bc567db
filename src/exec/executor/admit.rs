//! Admission of a kernel's outputs before it runs: for the ops whose output can be far larger
//! than their inputs (a shape read from an input, a product, a concatenation, a padding, a gather), the
//! op's shape function runs on the step's real input shapes and small integer values, and
//! outputs that would not fit the device's memory budget are refused with RESOURCE_EXHAUSTED
//! naming the node, the shape and the bytes, before anything is allocated. A kernel that
//! allocated tens of gigabytes past the host's memory would abort the whole task, and with it
//! every session on it; TensorFlow's allocator answers such a request with an OOM error, and
//! so does tessera, on every path that reaches these kernels (a stock client's graph included).
//!
//! Only these ops pay for the check (a shape function call, a few microseconds): the
//! element-wise and reduction kernels allocate at most what their inputs hold, which the budget
//! already charged.

use crate::device::memory::MemoryBudget;
use crate::error::{Result, Status};
use crate::graph::const_value::tensor_int_values;
use crate::graph::registry::OpDef;
use crate::graph::shape_fn::ShapeCtx;
use crate::proto::NodeDef;
use crate::tensor::{DType, PartialShape, Shape, Tensor};

/// Ops whose outputs are sized by their inputs' values or by products of their shapes.
const EXPANDING: &[&str] = &[
    "MatMul",
    "_FusedMatMul",
    "BatchMatMul",
    "BatchMatMulV2",
    "BatchMatMulV3",
    "Conv2D",
    "_FusedConv2D",
    "Conv2DBackpropInput",
    "Conv2DBackpropFilter",
    "Tile",
    "Concat",
    "ConcatV2",
    "Pad",
    "PadV2",
    "MirrorPad",
    "Fill",
    "Range",
    "BroadcastTo",
    "OneHot",
    "GatherV2",
    "Gather",
    "GatherNd",
    "ScatterNd",
    "SparseToDense",
    "RandomUniform",
    "RandomUniformInt",
    "RandomStandardNormal",
    "TruncatedNormal",
    "StatelessRandomUniform",
    "StatelessRandomNormal",
    "StatelessTruncatedNormal",
    "StatelessRandomUniformV2",
    "StatelessRandomNormalV2",
    "StatelessTruncatedNormalV2",
    "Zeros",
    "Empty",
];

/// Integer inputs of at most this many elements are shown to the shape function by value (a
/// shape, multiples, paddings, an axis).
const MAX_VALUE_ELEMENTS: usize = 64;

/// What a node's outputs are checked with before it runs: its op's definition and output
/// dtypes. `None` for ops that need no check.
pub(super) struct Admission {
    def: &'static OpDef,
    out_types: Vec<DType>,
}

impl Admission {
    /// The check for `node`, when its op is one of the expanding ones.
    pub(super) fn of(node: &NodeDef) -> Option<Admission> {
        if !EXPANDING.contains(&node.op.as_str()) {
            return None;
        }
        let def = crate::graph::registry::global().get(&node.op)?;
        def.shape_fn?;
        let out_types = def.output_types(node).ok()?;
        Some(Admission { def, out_types })
    }

    /// Refuses the node's run when the outputs its inputs imply do not fit `budget`; a shape
    /// the function cannot tell (or an error in it, which the kernel reports in its own words)
    /// passes.
    pub(super) fn check(
        &self,
        node: &NodeDef,
        inputs: &[Tensor],
        budget: &MemoryBudget,
    ) -> Result<()> {
        let Some((bytes, shape)) = self.output_bytes(node, inputs) else {
            return Ok(());
        };
        budget.check_fits(&node.name, &node.op, bytes).map_err(|e| {
            Status::resource_exhausted(format!("{} (output shape {shape})", e.message()))
        })
    }

    /// The bytes of the outputs whose shapes are fully known from `inputs`, and the largest
    /// of those shapes.
    fn output_bytes(&self, node: &NodeDef, inputs: &[Tensor]) -> Option<(u64, Shape)> {
        let shapes: Vec<PartialShape> = inputs
            .iter()
            .map(|t| PartialShape::new(t.dims().iter().map(|&d| Some(d)).collect::<Vec<_>>()))
            .collect();
        let values: Vec<Option<Vec<i64>>> = inputs.iter().map(small_ints).collect();
        let shape_values: Vec<Option<PartialShape>> = values
            .iter()
            .zip(inputs)
            .map(|(v, t)| {
                let v = v.as_ref().filter(|_| t.rank() == 1)?;
                Some(PartialShape::new(
                    v.iter()
                        .map(|&d| usize::try_from(d).ok())
                        .collect::<Vec<_>>(),
                ))
            })
            .collect();
        let handle_shapes = vec![None; inputs.len()];
        let ctx = ShapeCtx {
            node,
            inputs: &shapes,
            values: &values,
            shape_values: &shape_values,
            handle_shapes: &handle_shapes,
            num_outputs: self.out_types.len(),
        };
        let outputs = (self.def.shape_fn?)(&ctx).ok()?;
        let mut total = 0u64;
        let mut largest: Option<(u64, Shape)> = None;
        for (shape, dtype) in outputs.iter().zip(&self.out_types) {
            let Some(dims) = shape.dims() else { continue };
            let Some(dims) = dims.iter().copied().collect::<Option<Vec<usize>>>() else {
                continue;
            };
            let bytes = dims
                .iter()
                .try_fold(dtype.size().unwrap_or(8) as u64, |n, &d| {
                    n.checked_mul(d as u64)
                })
                .unwrap_or(u64::MAX);
            total = total.saturating_add(bytes);
            if largest.as_ref().is_none_or(|(b, _)| bytes > *b) {
                largest = Some((bytes, Shape::new(dims)));
            }
        }
        largest.map(|(_, shape)| (total, shape))
    }
}

/// The values of a small int32/int64 tensor.
fn small_ints(t: &Tensor) -> Option<Vec<i64>> {
    if t.num_elements() > MAX_VALUE_ELEMENTS {
        return None;
    }
    tensor_int_values(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::attr::value;

    fn node(op: &str, attrs: &[(&str, crate::proto::AttrValue)]) -> NodeDef {
        let mut node = NodeDef {
            name: format!("n_{op}"),
            op: op.into(),
            ..Default::default()
        };
        for (k, v) in attrs {
            node.attr.insert(k.to_string(), v.clone());
        }
        crate::graph::registry::lookup(&node)
            .unwrap()
            .fill_and_check_attrs(&mut node)
            .unwrap();
        node
    }

    #[test]
    fn an_output_past_the_budget_is_refused_naming_node_shape_and_bytes() {
        let budget = MemoryBudget::new("/device:CPU:0", 1 << 20);
        // ConcatV2 of 100 [1000, 1000] float tensors would be 400 MB.
        let concat = node(
            "ConcatV2",
            &[
                ("N", value::int(3)),
                ("T", value::dtype(DType::Float)),
                ("Tidx", value::dtype(DType::Int32)),
            ],
        );
        let admission = Admission::of(&concat).expect("ConcatV2 is checked");
        let part = Tensor::from_vec([100, 1000], vec![0f32; 100_000]).unwrap();
        let axis = Tensor::scalar(0i32);
        let inputs = vec![part.clone(), part.clone(), part, axis];
        let err = admission.check(&concat, &inputs, &budget).unwrap_err();
        assert_eq!(err.code(), crate::error::Code::ResourceExhausted);
        let msg = err.message();
        assert!(
            msg.contains("n_ConcatV2") && msg.contains("1200000 bytes"),
            "{msg}"
        );
        assert!(msg.contains("[300,1000]"), "{msg}");

        // Fill of a fed shape: refused from the shape's values.
        let fill = node("Fill", &[("T", value::dtype(DType::Float))]);
        let admission = Admission::of(&fill).unwrap();
        let dims = Tensor::from_vec([2], vec![100_000i64, 100_000]).unwrap();
        let err = admission
            .check(&fill, &[dims, Tensor::scalar(1f32)], &budget)
            .unwrap_err();
        assert!(
            err.message().contains("[100000,100000]"),
            "{}",
            err.message()
        );

        // What fits passes; ops that cannot expand are not checked at all.
        let small = Tensor::from_vec([2], vec![10i64, 10]).unwrap();
        admission
            .check(&fill, &[small, Tensor::scalar(1f32)], &budget)
            .unwrap();
        assert!(Admission::of(&node("Relu", &[("T", value::dtype(DType::Float))])).is_none());
    }

    #[test]
    fn padded_outputs_are_checked_from_the_paddings_values() {
        let budget = MemoryBudget::new("/device:CPU:0", 1 << 20);
        let x = Tensor::from_vec([10, 10], vec![0f32; 100]).unwrap();
        let paddings = |p: i64| Tensor::from_vec([2, 2], vec![p, p, 0, 0]).unwrap();
        for op in ["Pad", "PadV2", "MirrorPad"] {
            let mut attrs = vec![
                ("T", value::dtype(DType::Float)),
                ("Tpaddings", value::dtype(DType::Int64)),
            ];
            if op == "MirrorPad" {
                attrs.push(("mode", value::string("SYMMETRIC")));
            }
            let n = node(op, &attrs);
            let admission = Admission::of(&n).unwrap_or_else(|| panic!("{op} is checked"));
            let mut inputs = vec![x.clone(), paddings(100_000)];
            if op == "PadV2" {
                inputs.push(Tensor::scalar(0f32));
            }
            // 200010 x 10 floats: 8 MB, past the 1 MB budget.
            let err = admission.check(&n, &inputs, &budget).unwrap_err();
            assert_eq!(err.code(), crate::error::Code::ResourceExhausted, "{op}");
            assert!(
                err.message().contains(&format!("n_{op}")) && err.message().contains("[200010,10]"),
                "{}",
                err.message()
            );
            inputs[1] = paddings(5);
            admission.check(&n, &inputs, &budget).unwrap();
        }
    }
}
