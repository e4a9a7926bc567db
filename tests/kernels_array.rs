//! Shape ops, element-moving ops, comparisons and selection, against values worked out by hand.

use crate::kernels_support::*;
use tessera::error::Code;
use tessera::tensor::{DType, PartialShape, Tensor};

fn x23() -> Tensor {
    // [[1,2,3],[4,5,6]]
    i32s(&[2, 3], &[1, 2, 3, 4, 5, 6])
}

#[test]
fn identity_family_passes_tensors_through() {
    let t = f32s(&[2], &[1., 2.]);
    for op in ["Identity", "StopGradient", "PlaceholderWithDefault"] {
        assert_eq!(run1(node(op), vec![t.clone()]), t);
    }
    let s = Tensor::string("hello");
    assert_eq!(run1(node("Identity"), vec![s.clone()]), s);
    let outs = node("IdentityN").run(vec![t.clone(), x23()]).unwrap();
    assert_eq!(outs, vec![t, x23()]);
    assert!(node("NoOp").run(vec![]).unwrap().is_empty());
}

#[test]
fn unfed_placeholder_fails_like_tensorflow() {
    let p = node("Placeholder")
        .name("x")
        .attr("dtype", value::dtype(DType::Float))
        .attr(
            "shape",
            value::shape(&PartialShape::new(vec![None, Some(64)])),
        );
    expect_err(
        p,
        vec![],
        Code::InvalidArgument,
        "You must feed a value for placeholder tensor 'x' with dtype float and shape [?,64]",
    );
    let p = node("Placeholder")
        .name("y")
        .attr("dtype", value::dtype(DType::Int64));
    let msg = expect_err(
        p,
        vec![],
        Code::InvalidArgument,
        "placeholder tensor 'y' with dtype int64",
    );
    assert!(!msg.contains("shape"), "{msg}");
}

#[test]
fn reshape_infers_one_dimension() {
    let out = run1(node("Reshape"), vec![x23(), ivec(&[3, -1])]);
    assert_exact(&out, &[3, 2], &[1, 2, 3, 4, 5, 6]);
    let out = run1(node("Reshape"), vec![x23(), i64s(&[1], &[-1])]);
    assert_eq!(out.dims(), &[6]);
    let out = run1(node("Reshape"), vec![i32s(&[1], &[7]), ivec(&[])]);
    assert_eq!(out.dims(), &[] as &[usize]);
    expect_err(
        node("Reshape"),
        vec![x23(), ivec(&[4])],
        Code::InvalidArgument,
        "tensor with 6 values, but the requested shape has 4",
    );
    expect_err(
        node("Reshape"),
        vec![x23(), ivec(&[-1, -1])],
        Code::InvalidArgument,
        "Only one input size may be -1",
    );
    expect_err(
        node("Reshape"),
        vec![x23(), ivec(&[4, -1])],
        Code::InvalidArgument,
        "multiple of 4",
    );
}

#[test]
fn shape_size_rank() {
    let t = f32s(&[2, 3, 1], &[0.; 6]);
    assert_exact(&run1(node("Shape"), vec![t.clone()]), &[3], &[2, 3, 1]);
    let shape64 = node("Shape").attr("out_type", value::dtype(DType::Int64));
    assert_exact(&run1(shape64, vec![t.clone()]), &[3], &[2i64, 3, 1]);
    assert_exact(&run1(node("Size"), vec![t.clone()]), &[], &[6]);
    let size64 = node("Size").attr("out_type", value::dtype(DType::Int64));
    assert_exact(&run1(size64, vec![t.clone()]), &[], &[6i64]);
    assert_exact(&run1(node("Rank"), vec![t]), &[], &[3]);
}

#[test]
fn expand_dims_and_squeeze() {
    assert_eq!(
        run1(node("ExpandDims"), vec![x23(), i32s(&[], &[0])]).dims(),
        &[1, 2, 3]
    );
    assert_eq!(
        run1(node("ExpandDims"), vec![x23(), i64s(&[], &[-1])]).dims(),
        &[2, 3, 1]
    );
    assert_eq!(
        run1(node("ExpandDims"), vec![x23(), i32s(&[1], &[1])]).dims(),
        &[2, 1, 3]
    );
    expect_err(
        node("ExpandDims"),
        vec![x23(), i32s(&[], &[3])],
        Code::InvalidArgument,
        "expand dim index 3",
    );
    let t = f32s(&[1, 2, 1, 1], &[1., 2.]);
    assert_eq!(run1(node("Squeeze"), vec![t.clone()]).dims(), &[2]);
    let some = node("Squeeze").attr("squeeze_dims", value::int_list(vec![0, -1]));
    assert_eq!(run1(some, vec![t.clone()]).dims(), &[2, 1]);
    let bad = node("Squeeze").attr("squeeze_dims", value::int_list(vec![1]));
    expect_err(
        bad,
        vec![t],
        Code::InvalidArgument,
        "Can not squeeze dim[1], expected a dimension of 1, got 2",
    );
}

#[test]
fn fill_zeros_ones_broadcast_to() {
    assert_exact(
        &run1(node("Fill"), vec![ivec(&[2, 2]), i64s(&[], &[7])]),
        &[2, 2],
        &[7i64; 4],
    );
    expect_err(
        node("Fill"),
        vec![ivec(&[2]), f32s(&[2], &[1., 2.])],
        Code::InvalidArgument,
        "scalar",
    );
    expect_err(
        node("Fill"),
        vec![ivec(&[-2]), f32s(&[], &[1.])],
        Code::InvalidArgument,
        "negative",
    );
    assert_f32(
        &run1(node("ZerosLike"), vec![f32s(&[2], &[3., 4.])]),
        &[2],
        &[0., 0.],
        0.0,
    );
    assert_exact(
        &run1(node("ZerosLike"), vec![bools(&[1], &[true])]),
        &[1],
        &[false],
    );
    assert_exact(
        &run1(node("OnesLike"), vec![i32s(&[3], &[5, 6, 7])]),
        &[3],
        &[1, 1, 1],
    );
    let out = run1(
        node("BroadcastTo"),
        vec![i32s(&[3], &[1, 2, 3]), ivec(&[2, 3])],
    );
    assert_exact(&out, &[2, 3], &[1, 2, 3, 1, 2, 3]);
    let out = run1(
        node("BroadcastTo"),
        vec![i32s(&[2, 1], &[1, 2]), i64s(&[2], &[2, 2])],
    );
    assert_exact(&out, &[2, 2], &[1, 1, 2, 2]);
    expect_err(
        node("BroadcastTo"),
        vec![i32s(&[3], &[1, 2, 3]), ivec(&[2, 4])],
        Code::InvalidArgument,
        "Unable to broadcast tensor of shape [3] to tensor of shape [2,4]",
    );
}

#[test]
fn broadcast_gradient_args_lists_reduced_dimensions() {
    // [2,3,4] vs [3,1]: padded [1,3,1]; r0 = [], r1 = [0, 2]
    let outs = node("BroadcastGradientArgs")
        .run(vec![ivec(&[2, 3, 4]), ivec(&[3, 1])])
        .unwrap();
    assert_exact(&outs[0], &[0], &[] as &[i32]);
    assert_exact(&outs[1], &[2], &[0, 2]);
    // [1] vs [5]: r0 = [0]
    let outs = node("BroadcastGradientArgs")
        .run(vec![i64s(&[1], &[1]), i64s(&[1], &[5])])
        .unwrap();
    assert_exact(&outs[0], &[1], &[0i64]);
    assert_exact(&outs[1], &[0], &[] as &[i64]);
    // equal shapes need no reduction
    let outs = node("BroadcastGradientArgs")
        .run(vec![ivec(&[2, 1]), ivec(&[2, 1])])
        .unwrap();
    assert_eq!(outs[0].num_elements() + outs[1].num_elements(), 0);
    expect_err(
        node("BroadcastGradientArgs"),
        vec![ivec(&[2, 3]), ivec(&[4])],
        Code::InvalidArgument,
        "Incompatible shapes: [2,3] vs. [4]",
    );
}

#[test]
fn range_counts_like_python() {
    assert_exact(
        &run1(
            node("Range"),
            vec![i32s(&[], &[0]), i32s(&[], &[5]), i32s(&[], &[2])],
        ),
        &[3],
        &[0, 2, 4],
    );
    assert_exact(
        &run1(
            node("Range"),
            vec![i64s(&[], &[5]), i64s(&[], &[0]), i64s(&[], &[-2])],
        ),
        &[3],
        &[5i64, 3, 1],
    );
    assert_f32(
        &run1(
            node("Range"),
            vec![f32s(&[], &[0.]), f32s(&[], &[1.]), f32s(&[], &[0.25])],
        ),
        &[4],
        &[0., 0.25, 0.5, 0.75],
        0.0,
    );
    expect_err(
        node("Range"),
        vec![i32s(&[], &[0]), i32s(&[], &[5]), i32s(&[], &[0])],
        Code::InvalidArgument,
        "Requires delta != 0",
    );
    expect_err(
        node("Range"),
        vec![i32s(&[], &[5]), i32s(&[], &[1]), i32s(&[], &[1])],
        Code::InvalidArgument,
        "Requires start <= limit when delta > 0: 5/1",
    );
}

#[test]
fn one_hot_on_any_axis() {
    let on_off = || vec![f32s(&[], &[1.]), f32s(&[], &[0.])];
    let mut inputs = vec![i64s(&[3], &[0, 2, -1]), i32s(&[], &[3])];
    inputs.extend(on_off());
    let out = run1(node("OneHot"), inputs);
    assert_f32(&out, &[3, 3], &[1., 0., 0., 0., 0., 1., 0., 0., 0.], 0.0);
    let mut inputs = vec![i32s(&[2], &[1, 0]), i32s(&[], &[2])];
    inputs.extend(on_off());
    let out = run1(node("OneHot").attr("axis", value::int(0)), inputs);
    // axis 0: out[d][i] = indices[i] == d
    assert_f32(&out, &[2, 2], &[0., 1., 1., 0.], 0.0);
    let mut inputs = vec![i32s(&[1], &[0]), i32s(&[], &[-1])];
    inputs.extend(on_off());
    expect_err(
        node("OneHot"),
        inputs,
        Code::InvalidArgument,
        "depth must be non-negative",
    );
}

#[test]
fn transpose_concat_pack_unpack() {
    let out = run1(node("Transpose"), vec![x23(), ivec(&[1, 0])]);
    assert_exact(&out, &[3, 2], &[1, 4, 2, 5, 3, 6]);
    expect_err(
        node("Transpose"),
        vec![x23(), ivec(&[0, 0])],
        Code::InvalidArgument,
        "repeated",
    );
    expect_err(
        node("Transpose"),
        vec![x23(), ivec(&[0])],
        Code::InvalidArgument,
        "vector of size 2",
    );

    let out = run1(
        node("ConcatV2"),
        vec![x23(), i32s(&[2, 1], &[7, 8]), i32s(&[], &[1])],
    );
    assert_exact(&out, &[2, 4], &[1, 2, 3, 7, 4, 5, 6, 8]);
    let out = run1(
        node("ConcatV2"),
        vec![x23(), i32s(&[1, 3], &[7, 8, 9]), i64s(&[], &[-2])],
    );
    assert_exact(&out, &[3, 3], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    expect_err(
        node("ConcatV2"),
        vec![x23(), i32s(&[2, 2], &[0; 4]), i32s(&[], &[0])],
        Code::InvalidArgument,
        "Dimension 1 in both shapes must be equal",
    );
    expect_err(
        node("ConcatV2"),
        vec![x23(), x23(), i32s(&[], &[2])],
        Code::InvalidArgument,
        "out of range",
    );

    let a = f32s(&[2], &[1., 2.]);
    let b = f32s(&[2], &[3., 4.]);
    assert_f32(
        &run1(node("Pack"), vec![a.clone(), b.clone()]),
        &[2, 2],
        &[1., 2., 3., 4.],
        0.0,
    );
    let pack1 = node("Pack").attr("axis", value::int(1));
    assert_f32(
        &run1(pack1, vec![a.clone(), b.clone()]),
        &[2, 2],
        &[1., 3., 2., 4.],
        0.0,
    );
    expect_err(
        node("Pack"),
        vec![a, f32s(&[3], &[0.; 3])],
        Code::InvalidArgument,
        "Shapes of all inputs must match",
    );

    let unpack = node("Unpack")
        .attr("num", value::int(3))
        .attr("axis", value::int(1));
    let outs = unpack.run(vec![x23()]).unwrap();
    assert_eq!(outs.len(), 3);
    assert_exact(&outs[0], &[2], &[1, 4]);
    assert_exact(&outs[2], &[2], &[3, 6]);
    let bad = node("Unpack")
        .attr("num", value::int(2))
        .attr("axis", value::int(1));
    expect_err(bad, vec![x23()], Code::InvalidArgument, "must equal 2");
}

#[test]
fn slice_and_tile() {
    let out = run1(node("Slice"), vec![x23(), ivec(&[0, 1]), ivec(&[2, -1])]);
    assert_exact(&out, &[2, 2], &[2, 3, 5, 6]);
    let out = run1(
        node("Slice"),
        vec![x23(), i64s(&[2], &[1, 0]), i64s(&[2], &[1, 2])],
    );
    assert_exact(&out, &[1, 2], &[4, 5]);
    expect_err(
        node("Slice"),
        vec![x23(), ivec(&[0, 2]), ivec(&[1, 2])],
        Code::InvalidArgument,
        "Expected size[1] in [0, 1], but got 2",
    );
    expect_err(
        node("Slice"),
        vec![x23(), ivec(&[0]), ivec(&[1])],
        Code::InvalidArgument,
        "1-D tensors of size 2",
    );

    let out = run1(node("Tile"), vec![i32s(&[2], &[1, 2]), ivec(&[3])]);
    assert_exact(&out, &[6], &[1, 2, 1, 2, 1, 2]);
    let out = run1(node("Tile"), vec![i32s(&[1, 2], &[1, 2]), ivec(&[2, 2])]);
    assert_exact(&out, &[2, 4], &[1, 2, 1, 2, 1, 2, 1, 2]);
    expect_err(
        node("Tile"),
        vec![x23(), ivec(&[2])],
        Code::InvalidArgument,
        "vector of length 2 but got length 1",
    );
}

fn strided(masks: &[(&str, i64)]) -> NodeBuilder {
    masks
        .iter()
        .fold(node("StridedSlice"), |b, &(k, v)| b.attr(k, value::int(v)))
}

#[test]
fn strided_slice_with_masks() {
    // m = [[0,1,2,3],[4,5,6,7],[8,9,10,11]]
    let m = i32s(&[3, 4], &(0..12).collect::<Vec<_>>());
    // m[1:3, ::2]
    let out = run1(
        strided(&[("end_mask", 2)]),
        vec![m.clone(), ivec(&[1, 0]), ivec(&[3, 0]), ivec(&[1, 2])],
    );
    assert_exact(&out, &[2, 2], &[4, 6, 8, 10]);
    // m[-1] (shrink): [8,9,10,11]
    let out = run1(
        strided(&[("shrink_axis_mask", 1)]),
        vec![m.clone(), ivec(&[-1]), ivec(&[0]), ivec(&[1])],
    );
    assert_exact(&out, &[4], &[8, 9, 10, 11]);
    // m[:, 1] (begin/end masked dim 0, shrink dim 1): [1,5,9]
    let out = run1(
        strided(&[("begin_mask", 1), ("end_mask", 1), ("shrink_axis_mask", 2)]),
        vec![m.clone(), ivec(&[0, 1]), ivec(&[0, 2]), ivec(&[1, 1])],
    );
    assert_exact(&out, &[3], &[1, 5, 9]);
    // m[::-1, -1]: reversed rows, last column: [11,7,3]
    let out = run1(
        strided(&[("begin_mask", 1), ("end_mask", 1), ("shrink_axis_mask", 2)]),
        vec![m.clone(), ivec(&[0, -1]), ivec(&[0, 0]), ivec(&[-1, 1])],
    );
    assert_exact(&out, &[3], &[11, 7, 3]);
    // m[..., 1:3] (ellipsis): columns 1..3 of every row
    let out = run1(
        strided(&[("ellipsis_mask", 1)]),
        vec![m.clone(), ivec(&[0, 1]), ivec(&[0, 3]), ivec(&[1, 1])],
    );
    assert_exact(&out, &[3, 2], &[1, 2, 5, 6, 9, 10]);
    // m[newaxis, 0:1]: shape [1,1,4]
    let out = run1(
        strided(&[("new_axis_mask", 1)]),
        vec![m.clone(), ivec(&[0, 0]), ivec(&[0, 1]), ivec(&[1, 1])],
    );
    assert_exact(&out, &[1, 1, 4], &[0, 1, 2, 3]);
    // out-of-range ends clamp: m[1:100] = rows 1 and 2
    let out = run1(
        strided(&[]),
        vec![m.clone(), ivec(&[1]), ivec(&[100]), ivec(&[1])],
    );
    assert_eq!(out.dims(), &[2, 4]);
    // an empty interval gives an empty dimension
    let out = run1(
        strided(&[]),
        vec![m.clone(), ivec(&[2]), ivec(&[1]), ivec(&[1])],
    );
    assert_eq!(out.dims(), &[0, 4]);
    expect_err(
        strided(&[("shrink_axis_mask", 1)]),
        vec![m.clone(), ivec(&[3]), ivec(&[4]), ivec(&[1])],
        Code::InvalidArgument,
        "slice index 3 of dimension 0 out of bounds",
    );
    expect_err(
        strided(&[("shrink_axis_mask", 1)]),
        vec![m.clone(), ivec(&[0]), ivec(&[1]), ivec(&[-1])],
        Code::InvalidArgument,
        "only stride 1 allowed",
    );
    expect_err(
        strided(&[]),
        vec![m.clone(), ivec(&[0]), ivec(&[1]), ivec(&[0])],
        Code::InvalidArgument,
        "must be non-zero",
    );
}

#[test]
fn gather_along_an_axis() {
    let out = run1(
        node("GatherV2"),
        vec![x23(), ivec(&[1, 0, 1]), i32s(&[], &[0])],
    );
    assert_exact(&out, &[3, 3], &[4, 5, 6, 1, 2, 3, 4, 5, 6]);
    let out = run1(
        node("GatherV2"),
        vec![x23(), i64s(&[2, 1], &[2, 0]), i64s(&[], &[1])],
    );
    assert_exact(&out, &[2, 2, 1], &[3, 1, 6, 4]);
    expect_err(
        node("GatherV2"),
        vec![x23(), ivec(&[0, 5]), i32s(&[], &[1])],
        Code::InvalidArgument,
        "indices[1] = 5 is not in [0, 3)",
    );
    // batch_dims 1: row i of x23 picks its own columns (more in tests/kernels_sparse.rs).
    let batched = node("GatherV2").attr("batch_dims", value::int(1));
    let out = run1(batched, vec![x23(), ivec(&[2, 0]), i32s(&[], &[1])]);
    assert_exact(&out, &[2], &[3, 4]);
}

#[test]
fn comparisons_broadcast_to_bools() {
    let a = i32s(&[3], &[1, 2, 3]);
    let two = i32s(&[], &[2]);
    let cases = [
        ("Equal", [false, true, false]),
        ("NotEqual", [true, false, true]),
        ("Greater", [false, false, true]),
        ("GreaterEqual", [false, true, true]),
        ("Less", [true, false, false]),
        ("LessEqual", [true, true, false]),
    ];
    for (op, expected) in cases {
        assert_exact(
            &run1(node(op), vec![a.clone(), two.clone()]),
            &[3],
            &expected,
        );
    }
    assert_exact(
        &run1(
            node("Equal"),
            vec![bools(&[2], &[true, false]), bools(&[], &[true])],
        ),
        &[2],
        &[true, false],
    );
    expect_err(
        node("Less"),
        vec![a.clone(), i32s(&[2], &[1, 2])],
        Code::InvalidArgument,
        "Incompatible shapes: [3] vs. [2]",
    );
    let lenient = node("Equal").attr("incompatible_shape_error", value::bool(false));
    assert_exact(&run1(lenient, vec![a, i32s(&[2], &[1, 2])]), &[], &[false]);
}

#[test]
fn logical_ops() {
    let a = bools(&[4], &[true, true, false, false]);
    let b = bools(&[4], &[true, false, true, false]);
    assert_exact(
        &run1(node("LogicalAnd"), vec![a.clone(), b.clone()]),
        &[4],
        &[true, false, false, false],
    );
    assert_exact(
        &run1(node("LogicalOr"), vec![a.clone(), b.clone()]),
        &[4],
        &[true, true, true, false],
    );
    assert_exact(
        &run1(node("LogicalNot"), vec![a.clone()]),
        &[4],
        &[false, false, true, true],
    );
    expect_err(
        node("LogicalAnd"),
        vec![a, i32s(&[4], &[1; 4])],
        Code::InvalidArgument,
        "must be bool",
    );
}

#[test]
fn select_and_select_v2() {
    let t = x23();
    let e = i32s(&[2, 3], &[-1, -2, -3, -4, -5, -6]);
    let cond = bools(&[2, 3], &[true, false, true, false, true, false]);
    assert_exact(
        &run1(node("Select"), vec![cond, t.clone(), e.clone()]),
        &[2, 3],
        &[1, -2, 3, -4, 5, -6],
    );
    // a vector condition picks whole rows
    let rows = bools(&[2], &[false, true]);
    assert_exact(
        &run1(node("Select"), vec![rows.clone(), t.clone(), e.clone()]),
        &[2, 3],
        &[-1, -2, -3, 4, 5, 6],
    );
    expect_err(
        node("Select"),
        vec![bools(&[3], &[true; 3]), t.clone(), e.clone()],
        Code::InvalidArgument,
        "'condition' must be",
    );
    expect_err(
        node("Select"),
        vec![rows, t.clone(), i32s(&[3], &[0; 3])],
        Code::InvalidArgument,
        "'then' and 'else' must have the same size",
    );
    // SelectV2 broadcasts: a column condition against a scalar else
    let col = bools(&[2, 1], &[true, false]);
    assert_exact(
        &run1(node("SelectV2"), vec![col, t.clone(), i32s(&[], &[0])]),
        &[2, 3],
        &[1, 2, 3, 0, 0, 0],
    );
    expect_err(
        node("SelectV2"),
        vec![bools(&[4], &[true; 4]), t, e],
        Code::InvalidArgument,
        "not broadcastable",
    );
}

#[test]
fn where_lists_coordinates_of_true_elements() {
    let out = run1(
        node("Where"),
        vec![bools(&[2, 2], &[true, false, false, true])],
    );
    assert_exact(&out, &[2, 2], &[0i64, 0, 1, 1]);
    let out = run1(node("Where"), vec![f32s(&[3], &[0., 2., -1.])]);
    assert_exact(&out, &[2, 1], &[1i64, 2]);
    let out = run1(node("Where"), vec![i32s(&[2], &[0, 0])]);
    assert_eq!(out.dims(), &[0, 1]);
}

fn strings(values: &[&str]) -> Tensor {
    Tensor::from_strings(
        [values.len()],
        values
            .iter()
            .map(|s| bytes::Bytes::from(s.to_string()))
            .collect(),
    )
    .unwrap()
}

#[test]
fn string_tensors_move_like_report_uninitialized_variables() {
    // boolean_mask(names, mask) = GatherV2(names, Squeeze(Where(mask), [1]), 0)
    let names = strings(&["w1", "b1", "w2"]);
    let mask = bools(&[3], &[true, false, true]);
    let coords = run1(node("Where"), vec![mask]);
    let squeeze = node("Squeeze").attr("squeeze_dims", value::int_list(vec![1]));
    let idx = run1(squeeze, vec![coords]);
    let picked = run1(node("GatherV2"), vec![names, idx, i32s(&[], &[0])]);
    assert_eq!(picked, strings(&["w1", "w2"]));
    // concat([uninitialized variables, uninitialized resources], 0)
    let all = run1(
        node("ConcatV2"),
        vec![picked, strings(&[]), strings(&["r"]), i32s(&[], &[0])],
    );
    assert_eq!(all, strings(&["w1", "w2", "r"]));
    let packed = run1(node("Pack"), vec![strings(&["a"]), strings(&["b"])]);
    assert_eq!(packed.dims(), &[2, 1]);
    let chosen = run1(
        node("Select"),
        vec![
            bools(&[2], &[false, true]),
            strings(&["t0", "t1"]),
            strings(&["e0", "e1"]),
        ],
    );
    assert_eq!(chosen, strings(&["e0", "t1"]));
    let same = run1(
        node("Equal"),
        vec![strings(&["a", "b"]), Tensor::string("b")],
    );
    assert_exact(&same, &[2], &[false, true]);
    let filled = run1(node("Fill"), vec![ivec(&[2]), Tensor::string("s")]);
    assert_eq!(filled, strings(&["s", "s"]));
    let sliced = run1(
        node("StridedSlice"),
        vec![
            strings(&["a", "b", "c"]),
            ivec(&[1]),
            ivec(&[3]),
            ivec(&[1]),
        ],
    );
    assert_eq!(sliced, strings(&["b", "c"]));
}

#[test]
fn const_outputs_its_decoded_value() {
    let value = f32s(&[2, 3], &[1., 1.5, 2., 2.5, 3., 3.5]);
    let c = node("Const")
        .attr("dtype", value::dtype(DType::Float))
        .attr("value", value::tensor(value.to_proto()));
    assert_eq!(run1(c, vec![]), value);
    // TensorFlow's broadcast form: one float_val fills the shape (golden tensor_float32_4_broadcast).
    let proto: tessera::proto::TensorProto = golden("tensor_float32_4_broadcast.pb");
    let out = run1(node("Const").attr("value", value::tensor(proto)), vec![]);
    assert_f32(&out, &[4], &[2.5; 4], 0.0);
    let mismatched = node("Const")
        .attr("dtype", value::dtype(DType::Int32))
        .attr("value", value::tensor(value.to_proto()));
    let err =
        tessera::kernels::create_kernel(&mismatched.build(), tessera::device::DeviceType::Cpu)
            .err()
            .unwrap();
    assert_eq!(err.code(), Code::InvalidArgument);
    let missing = node("Const").build();
    assert!(tessera::kernels::create_kernel(&missing, tessera::device::DeviceType::Cpu).is_err());
}

#[test]
fn huge_outputs_fail_with_resource_exhausted_instead_of_aborting() {
    let huge = i64s(&[2], &[1 << 40, 1 << 40]);
    expect_err(
        node("Fill"),
        vec![huge.clone(), f32s(&[], &[0.])],
        Code::ResourceExhausted,
        "OOM when allocating",
    );
    expect_err(
        node("BroadcastTo"),
        vec![f32s(&[], &[0.]), huge],
        Code::ResourceExhausted,
        "OOM",
    );
    expect_err(
        node("Tile"),
        vec![f32s(&[1], &[0.]), i64s(&[1], &[1 << 62])],
        Code::ResourceExhausted,
        "OOM",
    );
    expect_err(
        node("Range"),
        vec![i64s(&[], &[0]), i64s(&[], &[i64::MAX]), i64s(&[], &[1])],
        Code::ResourceExhausted,
        "OOM",
    );
}
