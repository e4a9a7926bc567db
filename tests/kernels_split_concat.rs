//! The array ops the gradients of TensorFlow 1 loops use: `ShapeN`, `ConcatOffset` (the
//! gradient of a concat), `Split` and `SplitV`. Values marked "TensorFlow 2.21" were computed
//! by stock TensorFlow (`tf.raw_ops` in a `tf.compat.v1.Session`) and pasted here.

use crate::kernels_support::*;
use tessera::error::Code;
use tessera::graph::builder::{Graph, NodeSpec};
use tessera::tensor::{DType, PartialShape, Tensor};

#[test]
fn shape_n_gives_each_input_its_shape() {
    let b = node("ShapeN").t(DType::Float).attr("N", value::int(2));
    let out = b
        .run(vec![f32s(&[2, 3], &[0.; 6]), f32s(&[], &[1.])])
        .unwrap();
    assert_exact::<i32>(&out[0], &[2], &[2, 3]);
    assert_exact::<i32>(&out[1], &[0], &[]);
    let b = node("ShapeN")
        .t(DType::Int32)
        .attr("N", value::int(1))
        .attr("out_type", value::dtype(DType::Int64));
    assert_exact::<i64>(&run1(b, vec![i32s(&[4], &[1, 2, 3, 4])]), &[1], &[4]);
}

fn concat_offset(n: i64) -> NodeBuilder {
    node("ConcatOffset").attr("N", value::int(n))
}

#[test]
fn concat_offset_says_where_each_input_starts() {
    // TensorFlow 2.21: ConcatOffset(1, [[2,3],[2,5],[2,1]]) = [0 0] [0 3] [0 8].
    let out = concat_offset(3)
        .run(vec![
            Tensor::scalar(1),
            ivec(&[2, 3]),
            ivec(&[2, 5]),
            ivec(&[2, 1]),
        ])
        .unwrap();
    assert_exact::<i32>(&out[0], &[2], &[0, 0]);
    assert_exact::<i32>(&out[1], &[2], &[0, 3]);
    assert_exact::<i32>(&out[2], &[2], &[0, 8]);
    // TensorFlow 2.21: a negative dimension counts from the end, [0 0] [0 3].
    let out = concat_offset(2)
        .run(vec![Tensor::scalar(-1), ivec(&[2, 3]), ivec(&[2, 5])])
        .unwrap();
    assert_exact::<i32>(&out[1], &[2], &[0, 3]);
    // TensorFlow 2.21: int64 shapes, ConcatOffset(0, [[2,3],[4,3]]) = [0 0] [2 0].
    let out = concat_offset(2)
        .attr("shape_type", value::dtype(DType::Int64))
        .run(vec![
            Tensor::scalar(0),
            i64s(&[2], &[2, 3]),
            i64s(&[2], &[4, 3]),
        ])
        .unwrap();
    assert_exact::<i64>(&out[1], &[2], &[2, 0]);
}

#[test]
fn concat_offset_rejects_shapes_that_cannot_concatenate() {
    // TensorFlow 2.21 for both messages.
    expect_err(
        concat_offset(2),
        vec![Tensor::scalar(1), ivec(&[2, 3]), ivec(&[3, 5])],
        Code::InvalidArgument,
        "All dimensions except 1 must match. Input 1 has shape [3 5] and doesn't match input 0 \
         with shape [2 3].",
    );
    expect_err(
        concat_offset(2),
        vec![Tensor::scalar(2), ivec(&[2, 3]), ivec(&[2, 5])],
        Code::InvalidArgument,
        "Concat dim is out of range: 2 vs. 2",
    );
    expect_err(
        concat_offset(2),
        vec![ivec(&[1]), ivec(&[2, 3]), ivec(&[2, 5])],
        Code::InvalidArgument,
        "Concat dim tensor should be a scalar integer, but got shape [1]",
    );
}

fn split(n: i64) -> NodeBuilder {
    node("Split")
        .t(DType::Int32)
        .attr("num_split", value::int(n))
}

#[test]
fn split_cuts_equal_pieces() {
    let x = i32s(&[2, 4], &[1, 2, 3, 4, 5, 6, 7, 8]);
    let out = split(2).run(vec![Tensor::scalar(1), x.clone()]).unwrap();
    assert_exact::<i32>(&out[0], &[2, 2], &[1, 2, 5, 6]);
    assert_exact::<i32>(&out[1], &[2, 2], &[3, 4, 7, 8]);
    let out = split(2).run(vec![Tensor::scalar(-2), x]).unwrap();
    assert_exact::<i32>(&out[1], &[1, 4], &[5, 6, 7, 8]);
    // TensorFlow 2.21 for both messages.
    let row = i32s(&[1, 5], &[1, 2, 3, 4, 5]);
    expect_err(
        split(2),
        vec![Tensor::scalar(1), row.clone()],
        Code::InvalidArgument,
        "Number of ways to split should evenly divide the split dimension, but got split_dim 1 \
         (size = 5) and num_split 2",
    );
    expect_err(
        split(1),
        vec![Tensor::scalar(2), row],
        Code::InvalidArgument,
        "-input rank(-2) <= split_dim < input rank (2), but got 2",
    );
}

fn split_v(n: i64) -> NodeBuilder {
    node("SplitV")
        .t(DType::Int32)
        .attr("num_split", value::int(n))
        .attr("Tlen", value::dtype(DType::Int32))
}

#[test]
fn split_v_cuts_the_sizes_given_one_of_them_inferred() {
    // TensorFlow 2.21: SplitV([[1,2,3,4,5]], [2,-1,1], axis 1) = [[1 2]] [[3 4]] [[5]].
    let row = i32s(&[1, 5], &[1, 2, 3, 4, 5]);
    let out = split_v(3)
        .run(vec![row.clone(), ivec(&[2, -1, 1]), Tensor::scalar(1)])
        .unwrap();
    assert_exact::<i32>(&out[0], &[1, 2], &[1, 2]);
    assert_exact::<i32>(&out[1], &[1, 2], &[3, 4]);
    assert_exact::<i32>(&out[2], &[1, 1], &[5]);
    let strings = Tensor::from_strings([3], vec!["a".into(), "b".into(), "c".into()]).unwrap();
    let b = node("SplitV")
        .t(DType::String)
        .attr("num_split", value::int(2))
        .attr("Tlen", value::dtype(DType::Int64));
    let out = b
        .run(vec![strings, i64s(&[2], &[0, 3]), Tensor::scalar(0)])
        .unwrap();
    assert_eq!(out[0].dims(), &[0]);
    assert_eq!(out[1].strings().unwrap().len(), 3);
    // TensorFlow 2.21.
    expect_err(
        split_v(2),
        vec![i32s(&[3], &[1, 2, 3]), ivec(&[-1, -1]), Tensor::scalar(0)],
        Code::InvalidArgument,
        "There can only be one -1 in the input.",
    );
    expect_err(
        split_v(2),
        vec![row.clone(), ivec(&[2, 2]), Tensor::scalar(1)],
        Code::InvalidArgument,
        "Determined shape must either match input shape along split_dim exactly if fully \
         specified",
    );
    expect_err(
        split_v(2),
        vec![row, ivec(&[6, -1]), Tensor::scalar(1)],
        Code::InvalidArgument,
        "Got: 6",
    );
}

#[test]
fn split_shapes_and_gradients_are_known_when_the_graph_is_built() {
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::new(vec![None, Some(6)]))
        .unwrap();
    let axis = g.const_i32("axis", &[], &[1]).unwrap();
    let pieces = g
        .add_node(
            NodeSpec::new("Split")
                .input(&axis)
                .input(&x)
                .attr("num_split", value::int(3)),
        )
        .unwrap();
    assert_eq!(pieces.len(), 3);
    assert_eq!(pieces[2].shape.to_string(), "[?,2]");
    let sizes = g.const_vec_i32("sizes", &[1, -1]).unwrap();
    let parts = g
        .add_node(
            NodeSpec::new("SplitV")
                .input(&x)
                .input(&sizes)
                .input(&axis)
                .attr("num_split", value::int(2)),
        )
        .unwrap();
    assert_eq!(parts[1].shape.to_string(), "[?,5]");
    let err = g
        .add_node(
            NodeSpec::new("Split")
                .input(&axis)
                .input(&x)
                .attr("num_split", value::int(4)),
        )
        .unwrap_err();
    assert!(err.message().contains("evenly divide"), "{err}");
}

#[test]
fn the_gradient_of_split_joins_the_pieces_gradients_with_zeros_for_unused_pieces() {
    use tessera::client::Session;
    use tessera::graph::gradients;
    // loss = sum(2 * piece0) + sum(3 * piece1), piece2 unused: d loss / d x = [2 2 3 3 0 0]
    // (each piece's gradient is its factor; ZerosLike for the unused one).
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::new(vec![Some(6)]))
        .unwrap();
    let axis = g.const_i32("axis", &[], &[0]).unwrap();
    let pieces = g
        .add_node(
            NodeSpec::new("Split")
                .input(&axis)
                .input(&x)
                .attr("num_split", value::int(3)),
        )
        .unwrap();
    let two = g.scalar("two", DType::Float, 2.0).unwrap();
    let three = g.scalar("three", DType::Float, 3.0).unwrap();
    let a = g.binary("Mul", &pieces[0], &two).unwrap();
    let b = g.binary("Mul", &pieces[1], &three).unwrap();
    let both = g.concat(&[a, b], 0).unwrap();
    let zero = g.const_vec_i32("reduce_axes", &[0]).unwrap();
    let loss = g.binary("Sum", &both, &zero).unwrap();
    let grads = gradients(&mut g, &[loss], std::slice::from_ref(&x), None).unwrap();
    let dx = grads[0].clone().expect("x reaches the loss");
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let feed = f32s(&[6], &[1., 2., 3., 4., 5., 6.]);
    let out = session.run(&[("x:0", feed)], &[&dx.name()], &[]).unwrap();
    assert_f32(&out[0], &[6], &[2., 2., 3., 3., 0., 0.], 0.);
}
