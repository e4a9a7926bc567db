//! TensorArray and stack kernels: the per-step resources TensorFlow 1 while loops and their
//! gradients use. Every op runs against one device's `ResourceMgr` in a given step, the way
//! the executor runs them; values marked "TensorFlow 2.21" were computed by stock TensorFlow
//! (`tf.raw_ops` in a `tf.compat.v1.Session`, graph optimizations off) and pasted here.

use crate::kernels_support::*;
use tessera::device::DeviceType;
use tessera::error::{Code, Result};
use tessera::graph::registry;
use tessera::kernels::{create_kernel, OpContext};
use tessera::proto::NodeDef;
use tessera::runtime::resource::{step_container, ResourceMgr};
use tessera::tensor::{DType, PartialShape, Tensor};

const STEP: i64 = 7;

/// Runs `node` once in step `step` on `res`; returns its outputs.
fn run_in(
    node: &NodeDef,
    inputs: Vec<Tensor>,
    res: &ResourceMgr,
    step: i64,
) -> Result<Vec<Tensor>> {
    let kernel = create_kernel(node, DeviceType::Cpu)?;
    let mut ctx = OpContext::new(node, inputs, res, DEVICE, step);
    kernel.compute(&mut ctx)?;
    Ok(ctx.take_outputs().into_iter().flatten().collect())
}

/// One device's resources and the step the ops run in.
struct Step {
    res: ResourceMgr,
    id: i64,
}

impl Step {
    fn new() -> Self {
        Step {
            res: ResourceMgr::new(),
            id: STEP,
        }
    }

    fn run(&self, b: NodeBuilder, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        run_in(&b.build(), inputs, &self.res, self.id)
    }

    fn ok(&self, b: NodeBuilder, inputs: Vec<Tensor>) -> Vec<Tensor> {
        let node = b.build();
        run_in(&node, inputs, &self.res, self.id)
            .unwrap_or_else(|e| panic!("{} failed: {e}", node.op))
    }

    fn err(&self, b: NodeBuilder, inputs: Vec<Tensor>, code: Code, needle: &str) -> String {
        let err = self.run(b, inputs).expect_err("the op should fail");
        assert_eq!(err.code(), code, "unexpected code for: {err}");
        assert!(
            err.message().contains(needle),
            "`{}` lacks `{needle}`",
            err.message()
        );
        err.message().to_string()
    }

    /// A float TensorArray of `size` named `foo`; returns (handle, flow).
    fn array(&self, size: i32, attrs: &[(&str, tessera::proto::AttrValue)]) -> (Tensor, Tensor) {
        let mut b = node("TensorArrayV3")
            .name("ta")
            .attr("dtype", value::dtype(DType::Float))
            .attr("tensor_array_name", value::string("foo"));
        for (k, v) in attrs {
            b = b.attr(k, v.clone());
        }
        let mut out = self.ok(b, vec![Tensor::scalar(size)]);
        let flow = out.pop().unwrap();
        (out.pop().unwrap(), flow)
    }

    fn write(&self, h: &Tensor, i: i32, v: Tensor) -> Result<Tensor> {
        let b = node("TensorArrayWriteV3").name("write").t(v.dtype());
        Ok(self
            .run(
                b,
                vec![h.clone(), Tensor::scalar(i), v, Tensor::scalar(0f32)],
            )?
            .remove(0))
    }

    fn read(&self, h: &Tensor, i: i32) -> Result<Tensor> {
        let b = node("TensorArrayReadV3")
            .name("read")
            .attr("dtype", value::dtype(DType::Float));
        Ok(self
            .run(b, vec![h.clone(), Tensor::scalar(i), Tensor::scalar(0f32)])?
            .remove(0))
    }

    fn grad(&self, h: &Tensor, source: &str) -> (Tensor, Tensor) {
        let b = node("TensorArrayGradV3").attr("source", value::string(source));
        let mut out = self.ok(b, vec![h.clone(), Tensor::scalar(0f32)]);
        let flow = out.pop().unwrap();
        (out.pop().unwrap(), flow)
    }

    fn gather(&self, h: &Tensor, indices: &[i32], element_shape: PartialShape) -> Result<Tensor> {
        let b = node("TensorArrayGatherV3")
            .name("gather")
            .attr("dtype", value::dtype(DType::Float))
            .attr("element_shape", value::shape(&element_shape));
        Ok(self
            .run(b, vec![h.clone(), ivec(indices), Tensor::scalar(0f32)])?
            .remove(0))
    }

    fn size(&self, h: &Tensor) -> Result<i32> {
        let out = self.run(
            node("TensorArraySizeV3"),
            vec![h.clone(), Tensor::scalar(0f32)],
        )?;
        Ok(out[0].scalar_value::<i32>().unwrap())
    }
}

fn unknown() -> PartialShape {
    PartialShape::unknown()
}

fn shape(dims: &[usize]) -> PartialShape {
    PartialShape::new(dims.iter().map(|&d| Some(d)).collect::<Vec<_>>())
}

#[test]
fn writes_reads_and_gathers_elements() {
    let s = Step::new();
    let (h, flow) = s.array(3, &[("clear_after_read", value::bool(false))]);
    assert_eq!(h.dtype(), DType::Resource);
    assert_eq!(flow, Tensor::scalar(0f32));
    let handle = h.resource_handle().unwrap();
    assert_eq!(handle.container, step_container(STEP));
    assert!(handle.name.starts_with("_tensor_arraysfoo_"), "{handle:?}");
    for i in 0..3 {
        let flow = s
            .write(&h, i, f32s(&[2], &[i as f32, 10. * i as f32]))
            .unwrap();
        assert_eq!(flow, Tensor::scalar(0f32), "flow_in passes on as flow_out");
    }
    assert_f32(&s.read(&h, 1).unwrap(), &[2], &[1., 10.], 0.);
    let g = s.gather(&h, &[2, 0], unknown()).unwrap();
    assert_f32(&g, &[2, 2], &[2., 20., 0., 0.], 0.);
    assert_eq!(s.size(&h).unwrap(), 3);
}

#[test]
fn each_creation_is_its_own_array_and_a_step_end_drops_them() {
    let s = Step::new();
    let (a, _) = s.array(1, &[]);
    let (b, _) = s.array(1, &[]);
    assert_ne!(a, b, "two runs of one node make two arrays");
    s.write(&a, 0, f32s(&[1], &[1.])).unwrap();
    s.write(&b, 0, f32s(&[1], &[2.])).unwrap();
    assert_f32(&s.read(&b, 0).unwrap(), &[1], &[2.], 0.);

    let other = Step {
        res: ResourceMgr::new(),
        id: STEP + 1,
    };
    let (c, _) = run_in(
        &node("TensorArrayV3")
            .attr("dtype", value::dtype(DType::Float))
            .build(),
        vec![Tensor::scalar(1)],
        &s.res,
        other.id,
    )
    .map(|mut v| (v.remove(0), v.remove(0)))
    .unwrap();
    assert_eq!(
        c.resource_handle().unwrap().container,
        step_container(STEP + 1)
    );

    s.res.cleanup_step(STEP);
    let err = s.read(&a, 0).unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert!(
        err.message().contains("lives for the step that created it"),
        "{err}"
    );
    // The other step's array is untouched.
    run_in(
        &node("TensorArraySizeV3").build(),
        vec![c, Tensor::scalar(0f32)],
        &s.res,
        other.id,
    )
    .unwrap();
}

#[test]
fn an_index_is_written_once_and_not_after_a_read() {
    let s = Step::new();
    let (h, _) = s.array(2, &[("clear_after_read", value::bool(false))]);
    s.write(&h, 0, f32s(&[1], &[1.])).unwrap();
    // TensorFlow 2.21: "TensorArray foo_0: Could not write to TensorArray index 0 because it
    // has already been written to."
    let err = s.write(&h, 0, f32s(&[1], &[2.])).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .starts_with("node `write` (op TensorArrayWriteV3): TensorArray foo_"),
        "{err}"
    );
    assert!(
        err.message().ends_with(
            ": Could not write to TensorArray index 0 because it has already been written to."
        ),
        "{err}"
    );
    s.read(&h, 1).unwrap_err();
    s.write(&h, 1, f32s(&[1], &[1.])).unwrap();
    s.read(&h, 1).unwrap();
    let err = s.write(&h, 1, f32s(&[1], &[1.])).unwrap_err();
    assert!(
        err.message()
            .ends_with("Could not write to TensorArray index 1 because it has already been read."),
        "{err}"
    );
}

#[test]
fn clear_after_read_reads_an_element_once() {
    let s = Step::new();
    let (h, _) = s.array(1, &[]);
    s.write(&h, 0, f32s(&[1], &[3.])).unwrap();
    assert_f32(&s.read(&h, 0).unwrap(), &[1], &[3.], 0.);
    let err = s.read(&h, 0).unwrap_err();
    assert!(err.message().ends_with(
        "Could not read index 0 twice because it was cleared after a previous read (perhaps try \
         setting clear_after_read = false?)."
    ), "{err}");
}

#[test]
fn an_unwritten_element_reads_as_zeros_only_when_its_shape_is_known() {
    let s = Step::new();
    let (h, _) = s.array(2, &[]);
    let err = s.read(&h, 1).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains(
        ": Could not read from TensorArray index 1.  Furthermore, the element shape is not fully \
         defined: <unknown>.  It is possible you are working with a resizeable TensorArray"
    ), "{err}");
    // TensorFlow 2.21: element_shape [3], nothing written, read(1) = [0. 0. 0.].
    let (h, _) = s.array(2, &[("element_shape", value::shape(&shape(&[3])))]);
    assert_f32(&s.read(&h, 1).unwrap(), &[3], &[0., 0., 0.], 0.);
    // identical_element_shapes: the first write fixes the shape the others read as.
    let (h, _) = s.array(2, &[("identical_element_shapes", value::bool(true))]);
    s.write(&h, 0, f32s(&[2], &[1., 5.])).unwrap();
    assert_f32(&s.read(&h, 1).unwrap(), &[2], &[0., 0.], 0.);
}

#[test]
fn indices_past_the_size_fail_unless_the_array_grows() {
    let s = Step::new();
    let (h, _) = s.array(2, &[]);
    let err = s.write(&h, 2, f32s(&[1], &[1.])).unwrap_err();
    assert!(
        err.message()
            .ends_with(": Tried to write to index 2 but array is not resizeable and size is: 2"),
        "{err}"
    );
    let err = s.write(&h, -1, f32s(&[1], &[1.])).unwrap_err();
    assert!(
        err.message().contains("Tried to write to index -1"),
        "{err}"
    );
    let err = s.read(&h, 5).unwrap_err();
    assert!(
        err.message()
            .ends_with("Tried to read from index 5 but array size is: 2"),
        "{err}"
    );
    // TensorFlow 2.21: dynamic_size, write(4) on a size-2 array, then size = 5.
    let (h, _) = s.array(2, &[("dynamic_size", value::bool(true))]);
    s.write(&h, 4, f32s(&[1], &[1.])).unwrap();
    assert_eq!(s.size(&h).unwrap(), 5);
}

#[test]
fn values_must_fit_the_dtype_and_element_shape() {
    let s = Step::new();
    let (h, _) = s.array(2, &[("element_shape", value::shape(&shape(&[2])))]);
    let err = s.write(&h, 0, i32s(&[2], &[1, 2])).unwrap_err();
    assert!(
        err.message()
            .ends_with("TensorArray dtype is float but Op is trying to write dtype int32."),
        "{err}"
    );
    let err = s.write(&h, 0, f32s(&[3], &[1., 2., 3.])).unwrap_err();
    assert!(
        err.message().ends_with(
            ": Could not write to TensorArray index 0 because the value shape is [3] which is \
         incompatible with the TensorArray's inferred element shape: [2] (consider setting \
         infer_shape=False)."
        ),
        "{err}"
    );
    let read_int = node("TensorArrayReadV3").attr("dtype", value::dtype(DType::Int32));
    s.err(
        read_int,
        vec![h.clone(), Tensor::scalar(0), Tensor::scalar(0f32)],
        Code::InvalidArgument,
        "TensorArray dtype is float but Op requested dtype int32.",
    );
    let bad_index = node("TensorArrayWriteV3").t(DType::Float);
    s.err(
        bad_index,
        vec![
            h,
            ivec(&[0, 1]),
            f32s(&[2], &[1., 2.]),
            Tensor::scalar(0f32),
        ],
        Code::InvalidArgument,
        "TensorArray index must be scalar, but had shape: [2]",
    );
    let size = node("TensorArrayV3").attr("dtype", value::dtype(DType::Float));
    s.err(
        size,
        vec![Tensor::scalar(-1)],
        Code::InvalidArgument,
        "Size should be >= 0.",
    );
}

#[test]
fn gathers_need_consistent_shapes_and_a_known_shape_when_empty() {
    let s = Step::new();
    let (h, _) = s.array(2, &[]);
    s.write(&h, 0, f32s(&[1], &[1.])).unwrap();
    s.write(&h, 1, f32s(&[2], &[1., 2.])).unwrap();
    let err = s.gather(&h, &[0, 1], unknown()).unwrap_err();
    assert!(err.message().ends_with(
        "TensorArray has inconsistent shapes.  Index 0 has shape: [1] but index 1 has shape: [2]"
    ), "{err}");
    let (h, _) = s.array(0, &[]);
    let err = s.gather(&h, &[], unknown()).unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    assert!(err.message().ends_with(
        "TensorArray has size zero, but element shape <unknown> is not fully defined. Currently \
         only static shapes are supported when packing zero-size TensorArrays."
    ), "{err}");
    let empty = s.gather(&h, &[], shape(&[2])).unwrap();
    assert_eq!(empty.dims(), &[0, 2]);
}

#[test]
fn scatter_writes_rows_and_split_then_concat_round_trips() {
    let s = Step::new();
    let (h, _) = s.array(3, &[("clear_after_read", value::bool(false))]);
    let scatter = || node("TensorArrayScatterV3").t(DType::Float);
    let rows = f32s(&[2, 1], &[1., 2.]);
    s.err(
        scatter(),
        vec![h.clone(), ivec(&[5, 0]), rows.clone(), Tensor::scalar(0f32)],
        Code::InvalidArgument,
        "Max scatter index must be < array size (5 vs. 3)",
    );
    s.err(
        scatter(),
        vec![h.clone(), ivec(&[0]), rows.clone(), Tensor::scalar(0f32)],
        Code::InvalidArgument,
        "Expected len(indices) == values.shape[0], but saw: 1 vs. 2",
    );
    s.ok(
        scatter(),
        vec![h.clone(), ivec(&[2, 0]), rows, Tensor::scalar(0f32)],
    );
    assert_f32(&s.read(&h, 2).unwrap(), &[1], &[1.], 0.);
    assert_f32(&s.read(&h, 0).unwrap(), &[1], &[2.], 0.);

    // TensorFlow 2.21: split [[1],[2],[3],[4]] by lengths [1,2,1] into a size-3 array, then
    // concat: value [[1],[2],[3],[4]], lengths [1 2 1].
    let (h, _) = s.array(3, &[]);
    let split = || node("TensorArraySplitV3").t(DType::Float);
    let value4 = f32s(&[4, 1], &[1., 2., 3., 4.]);
    s.ok(
        split(),
        vec![
            h.clone(),
            value4.clone(),
            i64s(&[3], &[1, 2, 1]),
            Tensor::scalar(0f32),
        ],
    );
    let concat = node("TensorArrayConcatV3").attr("dtype", value::dtype(DType::Float));
    let out = s.ok(concat, vec![h, Tensor::scalar(0f32)]);
    assert_f32(&out[0], &[4, 1], &[1., 2., 3., 4.], 0.);
    assert_exact::<i64>(&out[1], &[3], &[1, 2, 1]);

    // TensorFlow 2.21: splitting 2 pieces into a fixed array of 3 fails.
    let (h, _) = s.array(3, &[]);
    s.err(
        split(),
        vec![
            h.clone(),
            f32s(&[2, 1], &[1., 2.]),
            i64s(&[2], &[1, 1]),
            Tensor::scalar(0f32),
        ],
        Code::InvalidArgument,
        "TensorArray's size is not equal to the size of lengths (3 vs. 2), and the TensorArray \
         is not marked as dynamically resizeable",
    );
    s.err(
        split(),
        vec![h, value4, i64s(&[3], &[1, 1, 1]), Tensor::scalar(0f32)],
        Code::InvalidArgument,
        "Expected sum of lengths to be equal to values.shape[0], but sum of lengths is 3 and \
         value's shape is: [4,1]",
    );
}

#[test]
fn gradient_writes_to_one_index_add_up() {
    // TensorFlow 2.21: forward array (size 2, element_shape [2]) holding [1,2] and [3,4]; two
    // TensorArrayGradV3 with source "gradients" name one gradient array; writing [1,2] and
    // [10,20] at index 0 reads back [11. 22.], and the unwritten index 1 reads [0. 0.]; the
    // gradient's flow_out is 0.
    let s = Step::new();
    let (h, _) = s.array(2, &[("element_shape", value::shape(&shape(&[2])))]);
    s.write(&h, 0, f32s(&[2], &[1., 2.])).unwrap();
    s.write(&h, 1, f32s(&[2], &[3., 4.])).unwrap();
    let (g, gflow) = s.grad(&h, "gradients");
    let (g2, _) = s.grad(&h, "gradients");
    assert_eq!(g, g2, "one gradient array per source");
    assert_eq!(gflow, Tensor::scalar(0f32));
    assert!(g
        .resource_handle()
        .unwrap()
        .name
        .starts_with("_tensor_array_gradsfoo_"));
    assert!(g.resource_handle().unwrap().name.ends_with("@gradients"));
    s.write(&g, 0, f32s(&[2], &[1., 2.])).unwrap();
    s.write(&g2, 0, f32s(&[2], &[10., 20.])).unwrap();
    assert_f32(&s.read(&g, 0).unwrap(), &[2], &[11., 22.], 0.);
    assert_f32(&s.read(&g, 1).unwrap(), &[2], &[0., 0.], 0.);
    // Another source has its own array.
    let (other, _) = s.grad(&h, "gradients_1");
    assert_ne!(other, g);
    // Aggregation needs the same shape (an array whose element shape is not fixed).
    let (h, _) = s.array(2, &[]);
    s.write(&h, 1, f32s(&[2], &[3., 4.])).unwrap();
    let (g3, _) = s.grad(&h, "gradients");
    s.write(&g3, 1, f32s(&[2], &[1., 1.])).unwrap();
    let err = s.write(&g3, 1, f32s(&[3], &[1., 1., 1.])).unwrap_err();
    assert!(err.message().ends_with(
        ": Could not aggregate to TensorArray index 1 because the existing shape is [2] but the \
         new input shape is [3]."
    ), "{err}");
}

#[test]
fn gradient_arrays_gather_what_was_scattered_into_them() {
    // TensorFlow 2.21: forward array of 3 rows of [2]; its gradient array gets scatter
    // [2,0] <- [[1,1],[2,2]] and write(2, [0.5,0.5]); gather [0,1,2] = [[2,2],[0,0],[1.5,1.5]].
    let s = Step::new();
    let (h, _) = s.array(3, &[("element_shape", value::shape(&shape(&[2])))]);
    let scatter = || node("TensorArrayScatterV3").t(DType::Float);
    let x = f32s(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
    s.ok(
        scatter(),
        vec![h.clone(), ivec(&[0, 1, 2]), x, Tensor::scalar(0f32)],
    );
    let (g, _) = s.grad(&h, "g");
    let rows = f32s(&[2, 2], &[1., 1., 2., 2.]);
    s.ok(
        scatter(),
        vec![g.clone(), ivec(&[2, 0]), rows, Tensor::scalar(0f32)],
    );
    s.write(&g, 2, f32s(&[2], &[0.5, 0.5])).unwrap();
    let out = s.gather(&g, &[0, 1, 2], shape(&[2])).unwrap();
    assert_f32(&out, &[3, 2], &[2., 2., 0., 0., 1.5, 1.5], 0.);
}

#[test]
fn a_gradient_with_shape_prepends_dimensions_to_every_element() {
    // TensorFlow 2.21: forward array of 2 elements of [2], index 0 written;
    // TensorArrayGradWithShape(shape_to_prepend=[3]) reads zeros of shape (3, 2) at both
    // the written and the unwritten index.
    let s = Step::new();
    let (h, _) = s.array(2, &[("element_shape", value::shape(&shape(&[2])))]);
    s.write(&h, 0, f32s(&[2], &[1., 2.])).unwrap();
    let b = node("TensorArrayGradWithShape").attr("source", value::string("g"));
    let g = s.ok(b, vec![h, Tensor::scalar(0f32), ivec(&[3])]).remove(0);
    assert_f32(&s.read(&g, 0).unwrap(), &[3, 2], &[0.; 6], 0.);
    assert_f32(&s.read(&g, 1).unwrap(), &[3, 2], &[0.; 6], 0.);
}

#[test]
fn a_gradient_request_stops_the_forward_array_growing() {
    let s = Step::new();
    let (h, _) = s.array(1, &[("dynamic_size", value::bool(true))]);
    s.write(&h, 0, f32s(&[1], &[1.])).unwrap();
    s.grad(&h, "gradients");
    let err = s.write(&h, 1, f32s(&[1], &[1.])).unwrap_err();
    assert!(
        err.message()
            .contains("array is not resizeable and size is: 1"),
        "{err}"
    );
    // A gradient array has no gradient of its own.
    let (g, _) = s.grad(&h, "gradients");
    let b = node("TensorArrayGradV3").attr("source", value::string("x"));
    s.err(
        b,
        vec![g, Tensor::scalar(0f32)],
        Code::InvalidArgument,
        "Wrong input container.",
    );
}

#[test]
fn a_closed_array_fails_every_later_use() {
    let s = Step::new();
    let (h, _) = s.array(2, &[]);
    s.ok(node("TensorArrayCloseV3"), vec![h.clone()]);
    let err = s.size(&h).unwrap_err();
    assert!(
        err.message()
            .starts_with("node `x` (op TensorArraySizeV3): TensorArray foo_"),
        "{err}"
    );
    assert!(
        err.message().ends_with(" has already been closed."),
        "{err}"
    );
}

fn stack(s: &Step, max: i32) -> Tensor {
    let b = node("StackV2")
        .attr("elem_type", value::dtype(DType::Float))
        .attr("stack_name", value::string("st"));
    s.ok(b, vec![Tensor::scalar(max)]).remove(0)
}

fn push(s: &Step, h: &Tensor, v: Tensor) -> Result<Tensor> {
    let b = node("StackPushV2").name("push").t(v.dtype());
    Ok(s.run(b, vec![h.clone(), v])?.remove(0))
}

fn pop(s: &Step, h: &Tensor) -> Result<Tensor> {
    let b = node("StackPopV2")
        .name("pop")
        .attr("elem_type", value::dtype(DType::Float));
    Ok(s.run(b, vec![h.clone()])?.remove(0))
}

#[test]
fn a_stack_pops_what_was_pushed_last_first() {
    // TensorFlow 2.21: push 1 then 2, pop twice: 2.0 then 1.0.
    let s = Step::new();
    let h = stack(&s, -1);
    assert_eq!(h.resource_handle().unwrap().container, step_container(STEP));
    assert_eq!(
        push(&s, &h, Tensor::scalar(1f32)).unwrap(),
        Tensor::scalar(1f32)
    );
    push(&s, &h, Tensor::scalar(2f32)).unwrap();
    assert_eq!(pop(&s, &h).unwrap(), Tensor::scalar(2f32));
    assert_eq!(pop(&s, &h).unwrap(), Tensor::scalar(1f32));
    // TensorFlow 2.21: "Stack[st_0] is empty when calling Pop()."
    let err = pop(&s, &h).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .starts_with("node `pop` (op StackPopV2): Stack[st_"),
        "{err}"
    );
    assert!(
        err.message().ends_with("] is empty when calling Pop()."),
        "{err}"
    );
}

#[test]
fn a_stack_keeps_its_max_size_dtype_and_closing() {
    let s = Step::new();
    let h = stack(&s, 1);
    push(&s, &h, Tensor::scalar(1f32)).unwrap();
    // TensorFlow 2.21: "Stack[st_1] overflowed its max_size (1)".
    let err = push(&s, &h, Tensor::scalar(2f32)).unwrap_err();
    assert!(
        err.message().ends_with("] overflowed its max_size (1)"),
        "{err}"
    );
    let err = push(&s, &h, Tensor::scalar(2i32)).unwrap_err();
    assert!(
        err.message()
            .ends_with("Must have type float but got int32"),
        "{err}"
    );
    s.ok(node("StackCloseV2"), vec![h.clone()]);
    let err = pop(&s, &h).unwrap_err();
    assert!(
        err.message().ends_with("] has already been closed."),
        "{err}"
    );
    s.res.cleanup_step(STEP);
    let err = pop(&s, &h).unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
}

#[test]
fn the_old_ref_handle_stack_works_like_the_resource_one() {
    let s = Step::new();
    let b = node("Stack").attr("elem_type", value::dtype(DType::Float));
    let h = s.ok(b, vec![]).remove(0);
    assert!(h.is_ref(), "Stack outputs a Ref(string) handle");
    let push = node("StackPush").t(DType::Float);
    s.ok(push, vec![h.clone(), f32s(&[2], &[1., 2.])]);
    let pop = node("StackPop").attr("elem_type", value::dtype(DType::Float));
    assert_f32(&s.ok(pop, vec![h.clone()])[0], &[2], &[1., 2.], 0.);
    s.ok(node("StackClose"), vec![h]);
}

#[test]
fn the_registry_declares_the_ops_as_tensorflow_does() {
    let mut n = node("TensorArrayV3")
        .attr("dtype", value::dtype(DType::Float))
        .build();
    let def = registry::lookup(&n).unwrap();
    def.fill_and_check_attrs(&mut n).unwrap();
    assert_eq!(
        tessera::graph::attr::shape(&n, "element_shape").unwrap(),
        PartialShape::unknown()
    );
    assert!(tessera::graph::attr::bool_or(&n, "clear_after_read", false).unwrap());
    assert_eq!(
        def.output_types(&n).unwrap(),
        vec![DType::Resource, DType::Float]
    );
    for op in [
        "TensorArrayV3",
        "TensorArrayWriteV3",
        "TensorArrayReadV3",
        "StackV2",
        "StackPopV2",
    ] {
        assert!(registry::global().get(op).unwrap().stateful, "{op}");
    }
    let push = registry::global().get("StackPush").unwrap();
    assert!(
        push.inputs[0].is_ref,
        "StackPush takes a Ref(string) handle"
    );
}

#[test]
fn a_session_runs_an_array_graph_step_after_step() {
    use tessera::client::Session;
    use tessera::graph::builder::{Graph, NodeSpec};
    // unstack x into an array, read row 1, gather rows [2, 0]: each run is a new step with
    // its own array, so the writes of one run never meet those of the next.
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::new(vec![Some(3), Some(2)]))
        .unwrap();
    let size = g.const_i32("size", &[], &[3]).unwrap();
    let ta = g
        .add_node(
            NodeSpec::new("TensorArrayV3")
                .name("ta")
                .input(&size)
                .attr("dtype", value::dtype(DType::Float))
                .attr("clear_after_read", value::bool(false)),
        )
        .unwrap();
    let indices = g.const_vec_i32("indices", &[0, 1, 2]).unwrap();
    let flow = g
        .add1(
            NodeSpec::new("TensorArrayScatterV3")
                .input(&ta[0])
                .input(&indices)
                .input(&x)
                .input(&ta[1]),
        )
        .unwrap();
    let one = g.const_i32("one", &[], &[1]).unwrap();
    let row = g
        .add1(
            NodeSpec::new("TensorArrayReadV3")
                .input(&ta[0])
                .input(&one)
                .input(&flow)
                .attr("dtype", value::dtype(DType::Float)),
        )
        .unwrap();
    let which = g.const_vec_i32("which", &[2, 0]).unwrap();
    let picked = g
        .add1(
            NodeSpec::new("TensorArrayGatherV3")
                .input(&ta[0])
                .input(&which)
                .input(&flow)
                .attr("dtype", value::dtype(DType::Float))
                .attr("element_shape", value::shape(&shape(&[2]))),
        )
        .unwrap();
    assert_eq!(picked.shape.to_string(), "[2,2]");
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    for k in 0..2 {
        let base = 10. * k as f32;
        let xv = f32s(
            &[3, 2],
            &[base, base + 1., base + 2., base + 3., base + 4., base + 5.],
        );
        let out = session
            .run(&[("x:0", xv)], &[&row.name(), &picked.name()], &[])
            .unwrap();
        let base = base as f64;
        assert_f32(&out[0], &[2], &[base + 2., base + 3.], 0.);
        assert_f32(
            &out[1],
            &[2, 2],
            &[base + 4., base + 5., base, base + 1.],
            0.,
        );
    }
}
