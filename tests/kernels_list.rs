//! TensorList kernels: the list values TensorFlow 2's functional loops carry, the ops that
//! change them one element at a time, the ops that convert them to and from tensors, and the
//! `ZerosLike`/`AddN` of lists their gradients take. Values marked "TensorFlow 2.21" were
//! computed by stock TensorFlow (`tf.raw_ops` in a `tf.compat.v1.Session`, graph
//! optimizations off) and pasted here.

use crate::kernels_support::*;
use tessera::error::Code;
use tessera::graph::registry;
use tessera::kernels::cpu::TensorList;
use tessera::tensor::{DType, PartialShape, Tensor};

/// The scalar -1: an unknown element shape.
fn any_shape() -> Tensor {
    Tensor::scalar(-1i32)
}

fn float_op(op: &str) -> NodeBuilder {
    node(op).attr("element_dtype", value::dtype(DType::Float))
}

fn reserve(shape: Tensor, n: i32) -> Tensor {
    run1(
        float_op("TensorListReserve"),
        vec![shape, Tensor::scalar(n)],
    )
}

fn empty(shape: Tensor, max: i32) -> Tensor {
    run1(
        float_op("EmptyTensorList"),
        vec![shape, Tensor::scalar(max)],
    )
}

fn set(list: &Tensor, i: i32, item: Tensor) -> Tensor {
    run1(
        float_op("TensorListSetItem"),
        vec![list.clone(), Tensor::scalar(i), item],
    )
}

fn get(list: &Tensor, i: i32) -> tessera::error::Result<Tensor> {
    float_op("TensorListGetItem")
        .run(vec![list.clone(), Tensor::scalar(i), any_shape()])
        .map(|mut v| v.remove(0))
}

fn stack(list: &Tensor, shape: Tensor) -> tessera::error::Result<Tensor> {
    float_op("TensorListStack")
        .run(vec![list.clone(), shape])
        .map(|mut v| v.remove(0))
}

fn push(list: &Tensor, t: Tensor) -> tessera::error::Result<Tensor> {
    float_op("TensorListPushBack")
        .run(vec![list.clone(), t])
        .map(|mut v| v.remove(0))
}

fn length(list: &Tensor) -> i32 {
    run1(node("TensorListLength"), vec![list.clone()])
        .scalar_value::<i32>()
        .unwrap()
}

fn scalar_shape() -> Tensor {
    ivec(&[])
}

#[test]
fn a_list_is_a_scalar_variant_holding_its_elements() {
    let l = reserve(ivec(&[2]), 3);
    assert_eq!(l.dtype(), DType::Variant);
    assert_eq!(l.rank(), 0);
    let list = TensorList::from_tensor(&l).unwrap();
    assert_eq!(list.element_dtype, DType::Float);
    assert_eq!(list.element_shape, PartialShape::new(vec![Some(2)]));
    assert_eq!(list.tensors.len(), 3);
    assert!(list.tensors.iter().all(Option::is_none));
    assert_eq!(length(&l), 3);
}

#[test]
fn stacking_fills_unset_elements_with_zeros_of_the_shape_the_set_ones_have() {
    // TensorFlow 2.21: TensorListReserve(element_shape=-1, 3), SetItem(1, [1,2]),
    // TensorListStack(element_shape=-1) = [[0 0] [1 2] [0 0]].
    let l = set(&reserve(any_shape(), 3), 1, f32s(&[2], &[1., 2.]));
    let out = stack(&l, any_shape()).unwrap();
    assert_f32(&out, &[3, 2], &[0., 0., 1., 2., 0., 0.], 0.);
    // TensorFlow 2.21: nothing set and no shape to go by.
    let err = stack(&reserve(any_shape(), 2), any_shape()).unwrap_err();
    assert!(
        err.message().ends_with(
            "Tried to stack list which only contains uninitialized tensors and has a \
         non-fully-defined element_shape: <unknown>"
        ),
        "{err}"
    );
    let err = stack(&empty(any_shape(), -1), ivec(&[-1, 2])).unwrap_err();
    assert!(
        err.message().ends_with(
            "Tried to stack elements of an empty list with non-fully-defined element_shape: [?,2]"
        ),
        "{err}"
    );
    assert_eq!(
        stack(&empty(any_shape(), -1), ivec(&[0, 2]))
            .unwrap()
            .dims(),
        &[0, 0, 2]
    );
    // TensorFlow 2.21: num_elements=3 on a list of 2.
    let two = run1(
        float_op("TensorListFromTensor"),
        vec![f32s(&[2], &[1., 2.]), scalar_shape()],
    );
    let b = float_op("TensorListStack").attr("num_elements", value::int(3));
    expect_err(
        b,
        vec![two, scalar_shape()],
        Code::InvalidArgument,
        "Operation expected a list with 3 elements but got a list with 2 elements.",
    );
}

#[test]
fn set_item_makes_a_new_list_and_leaves_the_old_one_alone() {
    let before = reserve(ivec(&[2]), 2);
    let after = set(&before, 0, f32s(&[2], &[5., 6.]));
    assert_f32(&get(&after, 0).unwrap(), &[2], &[5., 6.], 0.);
    // The input list still reads its element 0 as unset (zeros of its shape).
    assert_f32(&get(&before, 0).unwrap(), &[2], &[0., 0.], 0.);
    // TensorFlow 2.21: SetItem past the end of an empty list.
    expect_err(
        float_op("TensorListSetItem"),
        vec![
            empty(any_shape(), 3),
            Tensor::scalar(0),
            Tensor::scalar(1f32),
        ],
        Code::InvalidArgument,
        "Trying to modify element 0 in a list with 0 elements.",
    );
    // TensorFlow 2.21: with resize_if_index_out_of_bounds, SetItem(2, 5.) on an empty list of
    // scalars stacks to [0. 0. 5.].
    let b = float_op("TensorListSetItem").attr("resize_if_index_out_of_bounds", value::bool(true));
    let l = run1(
        b,
        vec![
            empty(scalar_shape(), -1),
            Tensor::scalar(2),
            Tensor::scalar(5f32),
        ],
    );
    assert_f32(&stack(&l, scalar_shape()).unwrap(), &[3], &[0., 0., 5.], 0.);
    expect_err(
        float_op("TensorListSetItem"),
        vec![
            reserve(ivec(&[2]), 1),
            Tensor::scalar(0),
            f32s(&[3], &[1., 2., 3.]),
        ],
        Code::InvalidArgument,
        "Tried to set a tensor with incompatible shape at a list index. Item element shape: [3] \
         list shape: [2]",
    );
}

#[test]
fn get_item_checks_the_index_and_needs_a_shape_for_unset_elements() {
    let l = reserve(any_shape(), 2);
    // TensorFlow 2.21 for both messages.
    let err = get(&l, 3).unwrap_err();
    assert!(
        err.message()
            .ends_with("Trying to access element 3 in a list with 2 elements."),
        "{err}"
    );
    let err = get(&l, 1).unwrap_err();
    assert!(
        err.message().ends_with(
            "Trying to read an uninitialized tensor but element_shape is not fully defined: \
         <unknown> and no list element is set."
        ),
        "{err}"
    );
    // Another element's shape tells what an unset one reads as.
    let l = set(&l, 0, f32s(&[1, 2], &[1., 2.]));
    assert_f32(&get(&l, 1).unwrap(), &[1, 2], &[0., 0.], 0.);
    // The op's element_shape input does too.
    let out = run1(
        float_op("TensorListGetItem"),
        vec![reserve(any_shape(), 1), Tensor::scalar(0), ivec(&[3])],
    );
    assert_f32(&out, &[3], &[0., 0., 0.], 0.);
    // TensorFlow 2.21 names the two dtypes.
    let ints = node("TensorListGetItem").attr("element_dtype", value::dtype(DType::Int32));
    expect_err(
        ints,
        vec![l, Tensor::scalar(0), any_shape()],
        Code::InvalidArgument,
        "Invalid data types; op elements int32 but list elements float",
    );
}

#[test]
fn push_back_and_pop_back_are_last_in_first_out() {
    let mut l = empty(scalar_shape(), -1);
    for v in [1f32, 2., 3.] {
        l = push(&l, Tensor::scalar(v)).unwrap();
    }
    assert_eq!(length(&l), 3);
    let pop = || float_op("TensorListPopBack");
    let out = pop().run(vec![l, any_shape()]).unwrap();
    assert_eq!(out[1], Tensor::scalar(3f32));
    assert_eq!(length(&out[0]), 2);
    // TensorFlow 2.21 for the three messages.
    expect_err(
        pop(),
        vec![empty(any_shape(), -1), any_shape()],
        Code::InvalidArgument,
        "Trying to pop from an empty list.",
    );
    let full = push(&empty(scalar_shape(), 1), Tensor::scalar(1f32)).unwrap();
    let err = push(&full, Tensor::scalar(2f32)).unwrap_err();
    assert!(
        err.message()
            .ends_with("Tried to push item into a full list list size: 1 max_num_elements: 1"),
        "{err}"
    );
    let err = push(&empty(ivec(&[2]), -1), f32s(&[3], &[1., 2., 3.])).unwrap_err();
    assert!(err.message().ends_with(
        "Tried to append a tensor with incompatible shape to a list. Op element shape: [3] list \
         shape: [2]"
    ), "{err}");
    // An unset last element pops as zeros of the shape the list knows.
    let out = pop()
        .run(vec![reserve(ivec(&[2]), 1), any_shape()])
        .unwrap();
    assert_f32(&out[1], &[2], &[0., 0.], 0.);
}

#[test]
fn element_shape_length_and_resize() {
    // TensorFlow 2.21: element shapes [-1 3] (int32) and -1 (int64, unknown rank).
    let l = empty(ivec(&[-1, 3]), -1);
    assert_exact::<i32>(
        &run1(node("TensorListElementShape"), vec![l]),
        &[2],
        &[-1, 3],
    );
    let b = node("TensorListElementShape").attr("shape_type", value::dtype(DType::Int64));
    assert_exact::<i64>(&run1(b, vec![empty(any_shape(), -1)]), &[], &[-1]);
    // TensorFlow 2.21: [1 2 3] resized to 2 has length 2; resized again to 4 it stacks as
    // [1. 2. 0. 0.].
    let l = run1(
        float_op("TensorListFromTensor"),
        vec![f32s(&[3], &[1., 2., 3.]), scalar_shape()],
    );
    let short = run1(node("TensorListResize"), vec![l, Tensor::scalar(2)]);
    assert_eq!(length(&short), 2);
    let long = run1(node("TensorListResize"), vec![short, Tensor::scalar(4)]);
    assert_f32(
        &stack(&long, scalar_shape()).unwrap(),
        &[4],
        &[1., 2., 0., 0.],
        0.,
    );
    expect_err(
        node("TensorListResize"),
        vec![long, Tensor::scalar(-1)],
        Code::InvalidArgument,
        "TensorListSlice expects size to be non-negative. Got: -1",
    );
    expect_err(
        float_op("TensorListReserve"),
        vec![any_shape(), Tensor::scalar(-1)],
        Code::InvalidArgument,
        "The num_elements to reserve must be a non negative number, but got -1",
    );
    expect_err(
        float_op("TensorListReserve"),
        vec![any_shape(), Tensor::scalar(1 << 30)],
        Code::ResourceExhausted,
        "would hold 1073741824 elements",
    );
}

#[test]
fn from_tensor_gather_and_scatter_move_rows() {
    // TensorFlow 2.21: FromTensor([[1,2],[3,4],[5,6]]), Gather([2,0]) = [[5 6] [1 2]].
    let rows = f32s(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
    let l = run1(
        float_op("TensorListFromTensor"),
        vec![rows.clone(), ivec(&[2])],
    );
    let out = run1(
        float_op("TensorListGather"),
        vec![l.clone(), ivec(&[2, 0]), any_shape()],
    );
    assert_f32(&out, &[2, 2], &[5., 6., 1., 2.], 0.);
    assert_f32(
        &stack(&l, any_shape()).unwrap(),
        &[3, 2],
        &[1., 2., 3., 4., 5., 6.],
        0.,
    );
    expect_err(
        float_op("TensorListGather"),
        vec![l, ivec(&[3]), any_shape()],
        Code::InvalidArgument,
        "Index 3 out of range; list only has 3 elements.",
    );
    // TensorFlow 2.21: a gather of a set and an unset element, [[7 8] [0 0]].
    let l = set(&reserve(ivec(&[2]), 3), 1, f32s(&[2], &[7., 8.]));
    let out = run1(
        float_op("TensorListGather"),
        vec![l, ivec(&[1, 0]), any_shape()],
    );
    assert_f32(&out, &[2, 2], &[7., 8., 0., 0.], 0.);
    // TensorFlow 2.21: the shape must fit.
    expect_err(
        float_op("TensorListFromTensor"),
        vec![f32s(&[1, 2], &[1., 2.]), ivec(&[3])],
        Code::InvalidArgument,
        "Specified a list with shape [3] from a tensor with shape [2]",
    );
    // TensorFlow 2.21: ScatterV2([[1],[2]] at [3,1], num_elements 5) stacks to
    // [[0] [2] [0] [1] [0]].
    let l = run1(
        float_op("TensorListScatterV2"),
        vec![
            f32s(&[2, 1], &[1., 2.]),
            ivec(&[3, 1]),
            ivec(&[1]),
            Tensor::scalar(5),
        ],
    );
    assert_f32(
        &stack(&l, ivec(&[1])).unwrap(),
        &[5, 1],
        &[0., 2., 0., 1., 0.],
        0.,
    );
    expect_err(
        float_op("TensorListScatterV2"),
        vec![
            f32s(&[1, 1], &[1.]),
            ivec(&[5]),
            ivec(&[1]),
            Tensor::scalar(2),
        ],
        Code::InvalidArgument,
        "TensorListScatter: Trying to scatter at index 5 in list with size 2",
    );
    expect_err(
        float_op("TensorListScatter"),
        vec![f32s(&[1, 1], &[1.]), ivec(&[-1]), ivec(&[1])],
        Code::InvalidArgument,
        "Indices in TensorListScatter must all be non-negative.",
    );
    // Into an existing list, growing it to the largest index.
    let l = run1(
        float_op("TensorListScatterIntoExistingList"),
        vec![
            reserve(ivec(&[1]), 2),
            f32s(&[2, 1], &[1., 2.]),
            ivec(&[3, 0]),
        ],
    );
    assert_f32(
        &stack(&l, ivec(&[1])).unwrap(),
        &[4, 1],
        &[2., 0., 0., 1.],
        0.,
    );
}

#[test]
fn concat_and_split_cut_along_the_first_dimension() {
    // TensorFlow 2.21: elements [[1,2]], unset, [[3,4],[5,6]] with leading_dims [0,3,0]
    // concatenate to [[1 2] [0 0] [0 0] [0 0] [3 4] [5 6]], lengths [1 3 2].
    let l = reserve(ivec(&[-1, 2]), 3);
    let l = set(&l, 0, f32s(&[1, 2], &[1., 2.]));
    let l = set(&l, 2, f32s(&[2, 2], &[3., 4., 5., 6.]));
    let concat = || float_op("TensorListConcatV2");
    let out = concat()
        .run(vec![l.clone(), ivec(&[-1, 2]), i64s(&[3], &[0, 3, 0])])
        .unwrap();
    assert_f32(
        &out[0],
        &[6, 2],
        &[1., 2., 0., 0., 0., 0., 0., 0., 3., 4., 5., 6.],
        0.,
    );
    assert_exact::<i64>(&out[1], &[3], &[1, 3, 2]);
    // TensorFlow 2.21: without leading_dims, unset elements need a length all set ones share.
    expect_err(
        concat(),
        vec![l, ivec(&[-1, 2]), i64s(&[0], &[])],
        Code::InvalidArgument,
        "List contains uninitialized tensor at index 1 but leading_dims has only 0 elements.",
    );
    // TensorFlow 2.21: [[1,2]] and an unset element with no leading_dims: [[1 2] [0 0]],
    // lengths [1 1].
    let l = set(&reserve(ivec(&[-1, 2]), 2), 0, f32s(&[1, 2], &[1., 2.]));
    let out = concat()
        .run(vec![l, ivec(&[-1, 2]), i64s(&[0], &[])])
        .unwrap();
    assert_f32(&out[0], &[2, 2], &[1., 2., 0., 0.], 0.);
    assert_exact::<i64>(&out[1], &[2], &[1, 1]);

    // TensorFlow 2.21: Split([[1],[2],[3]], lengths [1,0,2]) has 3 elements, the last
    // [[2] [3]].
    let split = || node("TensorListSplit").attr("element_dtype", value::dtype(DType::Float));
    let rows = f32s(&[3, 1], &[1., 2., 3.]);
    let l = run1(
        split(),
        vec![rows.clone(), ivec(&[-1, 1]), i64s(&[3], &[1, 0, 2])],
    );
    assert_eq!(length(&l), 3);
    assert_f32(&get(&l, 2).unwrap(), &[2, 1], &[2., 3.], 0.);
    assert_eq!(get(&l, 1).unwrap().dims(), &[0, 1]);
    // Concatenating the split gives the tensor back.
    let out = float_op("TensorListConcat").run(vec![l]).unwrap();
    assert_eq!(out[0], rows);
    expect_err(
        split(),
        vec![rows, ivec(&[-1, 1]), i64s(&[2], &[1, 1])],
        Code::InvalidArgument,
        "Unused values in tensor. Length of tensor: 3 Values used: 2",
    );
}

#[test]
fn lists_concatenate_list_by_list() {
    // TensorFlow 2.21: [1,2] ++ [3] stacks to [1. 2. 3.].
    let from = |v: &[f32]| {
        run1(
            float_op("TensorListFromTensor"),
            vec![f32s(&[v.len()], v), scalar_shape()],
        )
    };
    let out = run1(
        float_op("TensorListConcatLists"),
        vec![from(&[1., 2.]), from(&[3.])],
    );
    assert_f32(
        &stack(&out, scalar_shape()).unwrap(),
        &[3],
        &[1., 2., 3.],
        0.,
    );
}

#[test]
fn zeros_like_and_add_n_of_lists_are_the_gradient_sums() {
    // TensorFlow 2.21: a = [[1,2], unset], b = [[10,20],[3,4]] (element shape [2]);
    // AddN(a, b) stacks to [[11 22] [3 4]], ZerosLike(b) to [[0 0] [0 0]].
    let a = set(&reserve(ivec(&[2]), 2), 0, f32s(&[2], &[1., 2.]));
    let b = set(&reserve(ivec(&[2]), 2), 0, f32s(&[2], &[10., 20.]));
    let b = set(&b, 1, f32s(&[2], &[3., 4.]));
    let sum = run1(
        node("AddN").t(DType::Variant).attr("N", value::int(2)),
        vec![a.clone(), b.clone()],
    );
    assert_f32(
        &stack(&sum, ivec(&[2])).unwrap(),
        &[2, 2],
        &[11., 22., 3., 4.],
        0.,
    );
    let zeros = run1(node("ZerosLike").t(DType::Variant), vec![b]);
    assert_f32(
        &stack(&zeros, ivec(&[2])).unwrap(),
        &[2, 2],
        &[0., 0., 0., 0.],
        0.,
    );
    // ZerosLike keeps unset elements unset.
    let z = TensorList::from_tensor(&run1(node("ZerosLike").t(DType::Variant), vec![a.clone()]))
        .unwrap();
    assert!(z.tensors[1].is_none());
    // TensorFlow 2.21: lists of different lengths do not add.
    let c = reserve(ivec(&[2]), 3);
    expect_err(
        node("AddN").t(DType::Variant).attr("N", value::int(2)),
        vec![a, c],
        Code::InvalidArgument,
        "Trying to add two lists of tensors with different lengths. One is 2 and the other is 3",
    );
}

#[test]
fn inputs_that_are_not_lists_are_refused() {
    expect_err(
        node("TensorListLength"),
        vec![f32s(&[], &[1.])],
        Code::InvalidArgument,
        "Input handle is not a list. Saw: 'float tensor'",
    );
    let two = Tensor::from_variants(
        [2],
        vec![
            std::sync::Arc::new(TensorList::new(DType::Float, PartialShape::unknown())) as _,
            std::sync::Arc::new(TensorList::new(DType::Float, PartialShape::unknown())) as _,
        ],
    )
    .unwrap();
    expect_err(
        node("TensorListLength"),
        vec![two],
        Code::InvalidArgument,
        "Input list must be a scalar saw: [2]",
    );
    expect_err(
        float_op("TensorListReserve"),
        vec![Tensor::scalar(3i32), Tensor::scalar(1)],
        Code::InvalidArgument,
        "The only valid scalar shape tensor is the fully unknown shape specified as -1.",
    );
    expect_err(
        float_op("TensorListReserve"),
        vec![f32s(&[1], &[2.]), Tensor::scalar(1)],
        Code::InvalidArgument,
        "Expected an int32 or int64 shape tensor; found float",
    );
}

#[test]
fn the_registry_declares_list_ops_as_tensorflow_2_21_does() {
    let r = registry::global();
    let mut set = float_op("TensorListSetItem").build();
    r.get("TensorListSetItem")
        .unwrap()
        .fill_and_check_attrs(&mut set)
        .unwrap();
    assert!(!tessera::graph::attr::bool_or(&set, "resize_if_index_out_of_bounds", true).unwrap());
    assert_eq!(
        r.get("TensorListSetItem")
            .unwrap()
            .input_types(&set)
            .unwrap(),
        vec![DType::Variant, DType::Int32, DType::Float]
    );
    let mut get = float_op("TensorListGetItem").build();
    r.get("TensorListGetItem")
        .unwrap()
        .fill_and_check_attrs(&mut get)
        .unwrap();
    assert_eq!(
        tessera::graph::attr::dtype(&get, "Tshape").unwrap(),
        DType::Int32
    );
    let mut add = node("AddN")
        .t(DType::Variant)
        .attr("N", value::int(2))
        .build();
    r.get("AddN")
        .unwrap()
        .fill_and_check_attrs(&mut add)
        .unwrap();
    for op in [
        "TensorListPushBack",
        "TensorListStack",
        "TensorListFromTensor",
    ] {
        assert!(!r.get(op).unwrap().stateful, "{op} is a value op");
    }
}
