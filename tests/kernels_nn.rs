//! Activations, softmax, cross-entropy losses, bias ops, L2Loss and reductions, against closed
//! forms computed in f64 in the tests.

use crate::kernels_support::*;
use tessera::error::Code;
use tessera::tensor::DType;

fn softmax_f64(row: &[f64]) -> Vec<f64> {
    let sum: f64 = row.iter().map(|v| v.exp()).sum();
    row.iter().map(|v| v.exp() / sum).collect()
}

#[test]
fn relu_and_its_gradient() {
    let out = run1(node("Relu"), vec![f32s(&[4], &[-1., 0., 2., -0.5])]);
    assert_f32(&out, &[4], &[0., 0., 2., 0.], 0.0);
    let out = run1(node("Relu"), vec![i32s(&[2], &[-3, 3])]);
    assert_exact(&out, &[2], &[0, 3]);
    // gradient passes where the feature is > 0
    let out = run1(
        node("ReluGrad"),
        vec![f32s(&[3], &[10., 20., 30.]), f32s(&[3], &[-1., 0., 1.])],
    );
    assert_f32(&out, &[3], &[0., 0., 30.], 0.0);
    expect_err(
        node("ReluGrad"),
        vec![f32s(&[3], &[0.; 3]), f32s(&[2], &[0.; 2])],
        Code::InvalidArgument,
        "same size and shape",
    );
}

#[test]
fn sigmoid_tanh_and_gradients() {
    let xs = [-2.0f64, 0.0, 3.0];
    let t = f64s(&[3], &xs);
    let sig: Vec<f64> = xs.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect();
    assert_f64(&run1(node("Sigmoid"), vec![t.clone()]), &[3], &sig, 1e-12);
    let th: Vec<f64> = xs.iter().map(|x| x.tanh()).collect();
    assert_f64(&run1(node("Tanh"), vec![t.clone()]), &[3], &th, 1e-12);
    // SigmoidGrad(y, dy) = dy*y*(1-y); TanhGrad(y, dy) = dy*(1-y^2); y = [0.5, 0.2], dy = [2, 3]
    let y = f32s(&[2], &[0.5, 0.2]);
    let dy = f32s(&[2], &[2., 3.]);
    assert_f32(
        &run1(node("SigmoidGrad"), vec![y.clone(), dy.clone()]),
        &[2],
        &[0.5, 3.0 * 0.2 * 0.8],
        1e-6,
    );
    assert_f32(
        &run1(node("TanhGrad"), vec![y, dy]),
        &[2],
        &[2.0 * 0.75, 3.0 * 0.96],
        1e-6,
    );
}

#[test]
fn softmax_and_log_softmax_of_rows() {
    let rows = [[1.0, 2.0, 3.0], [1000.0, 1000.0, 1000.0]];
    let t = f32s(&[2, 3], &[1., 2., 3., 1000., 1000., 1000.]);
    let expected: Vec<f64> = rows
        .iter()
        .flat_map(|r| softmax_f64(&r.map(|v| v - r[0])))
        .collect();
    assert_f32(
        &run1(node("Softmax"), vec![t.clone()]),
        &[2, 3],
        &expected,
        1e-6,
    );
    let log_expected: Vec<f64> = expected.iter().map(|p| p.ln()).collect();
    assert_f32(
        &run1(node("LogSoftmax"), vec![t]),
        &[2, 3],
        &log_expected,
        1e-5,
    );
    expect_err(
        node("Softmax"),
        vec![f32s(&[], &[1.])],
        Code::InvalidArgument,
        ">= 1 dimension",
    );
}

#[test]
fn softmax_cross_entropy_with_dense_labels() {
    let logits = [[1.0, 2.0, 3.0], [0.5, 0.5, 2.0]];
    let labels = [[0.0, 0.0, 1.0], [0.25, 0.25, 0.5]];
    let outs = node("SoftmaxCrossEntropyWithLogits")
        .run(vec![
            f64s(&[2, 3], &logits.concat()),
            f64s(&[2, 3], &labels.concat()),
        ])
        .unwrap();
    let mut loss = Vec::new();
    let mut backprop = Vec::new();
    for (x, y) in logits.iter().zip(&labels) {
        let p = softmax_f64(x);
        loss.push(-(0..3).map(|j| y[j] * p[j].ln()).sum::<f64>());
        backprop.extend((0..3).map(|j| p[j] - y[j]));
    }
    assert_f64(&outs[0], &[2], &loss, 1e-12);
    assert_f64(&outs[1], &[2, 3], &backprop, 1e-12);
    // A [1,3] labels row broadcasts over the batch.
    let outs = node("SoftmaxCrossEntropyWithLogits")
        .run(vec![
            f64s(&[2, 3], &logits.concat()),
            f64s(&[1, 3], &labels[0]),
        ])
        .unwrap();
    assert_eq!(outs[1].dims(), &[2, 3]);
    expect_err(
        node("SoftmaxCrossEntropyWithLogits"),
        vec![f32s(&[3], &[0.; 3]), f32s(&[3], &[0.; 3])],
        Code::InvalidArgument,
        "2-dimensional",
    );
}

#[test]
fn sparse_softmax_cross_entropy() {
    let logits = [[1.0f64, 2.0, 3.0], [2.0, 0.0, -1.0]];
    let labels = [2i64, 0];
    let mut loss = Vec::new();
    let mut backprop = Vec::new();
    for (x, &l) in logits.iter().zip(&labels) {
        let p = softmax_f64(x);
        loss.push(-p[l as usize].ln());
        backprop.extend((0..3).map(|j| p[j] - if j == l as usize { 1.0 } else { 0.0 }));
    }
    let flat: Vec<f32> = logits.concat().iter().map(|&v| v as f32).collect();
    for label_tensor in [i64s(&[2], &labels), i32s(&[2], &[2, 0])] {
        let outs = node("SparseSoftmaxCrossEntropyWithLogits")
            .run(vec![f32s(&[2, 3], &flat), label_tensor])
            .unwrap();
        assert_f32(&outs[0], &[2], &loss, 1e-6);
        assert_f32(&outs[1], &[2, 3], &backprop, 1e-6);
    }
    expect_err(
        node("SparseSoftmaxCrossEntropyWithLogits"),
        vec![f32s(&[2, 3], &flat), i64s(&[2], &[1, 3])],
        Code::InvalidArgument,
        "Received a label value of 3 which is outside the valid range of [0, 3)",
    );
    expect_err(
        node("SparseSoftmaxCrossEntropyWithLogits"),
        vec![f32s(&[2, 3], &flat), i32s(&[2], &[-1, 0])],
        Code::InvalidArgument,
        "label value of -1",
    );
    expect_err(
        node("SparseSoftmaxCrossEntropyWithLogits"),
        vec![f32s(&[2, 3], &flat), i32s(&[3], &[0, 0, 0])],
        Code::InvalidArgument,
        "same first dimension",
    );
    expect_err(
        node("SparseSoftmaxCrossEntropyWithLogits"),
        vec![f32s(&[2, 3], &flat), f32s(&[2], &[0., 0.])],
        Code::InvalidArgument,
        "labels must be int32 or int64",
    );
}

#[test]
fn bias_add_and_its_gradient() {
    // value [2,2,3] NHWC, bias [3]
    let value: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let out = run1(
        node("BiasAdd"),
        vec![f32s(&[2, 2, 3], &value), f32s(&[3], &[100., 200., 300.])],
    );
    let expected: Vec<f64> = (0..12)
        .map(|v| v as f64 + 100.0 * (1 + v % 3) as f64)
        .collect();
    assert_f32(&out, &[2, 2, 3], &expected, 0.0);
    // NCHW: value [1,2,2] (channels at dim 1), bias [2]
    let out = run1(
        node("BiasAdd").attr("data_format", value::string("NCHW")),
        vec![f32s(&[1, 2, 2], &[0., 1., 2., 3.]), f32s(&[2], &[10., 20.])],
    );
    assert_f32(&out, &[1, 2, 2], &[10., 11., 22., 23.], 0.0);
    expect_err(
        node("BiasAdd"),
        vec![f32s(&[2, 3], &[0.; 6]), f32s(&[2], &[0.; 2])],
        Code::InvalidArgument,
        "as many biases",
    );
    expect_err(
        node("BiasAdd"),
        vec![f32s(&[3], &[0.; 3]), f32s(&[3], &[0.; 3])],
        Code::InvalidArgument,
        "at least 2D",
    );
    let bad_format = node("BiasAdd").attr("data_format", value::string("NWHC"));
    assert_eq!(
        tessera::kernels::create_kernel(&bad_format.build(), tessera::device::DeviceType::Cpu)
            .err()
            .unwrap()
            .code(),
        Code::InvalidArgument
    );
    // BiasAddGrad sums everything but the channel dimension: column sums of [[0,1,2],[3,4,5],[6,7,8],[9,10,11]]
    let out = run1(node("BiasAddGrad"), vec![f32s(&[2, 2, 3], &value)]);
    assert_f32(&out, &[3], &[18., 22., 26.], 0.0);
}

#[test]
fn bias_add_grad_sums_every_row_however_the_rows_are_grouped_and_split() {
    // Whole numbers, so every order of summation gives the same float: 4199 rows of 32
    // channels (channels last: whole groups of four rows and three left over, enough to split
    // over the pool), and the same values as channels first.
    let (outer, channels) = (13 * 17 * 19, 32);
    let value: Vec<f32> = (0..outer * channels)
        .map(|i| ((i * 7919) % 17) as f32 - 8.0)
        .collect();
    let mut want = vec![0f64; channels];
    for (i, v) in value.iter().enumerate() {
        want[i % channels] += f64::from(*v);
    }
    let nhwc = f32s(&[13, 17, 19, channels], &value);
    let out = run1(node("BiasAddGrad"), vec![nhwc]);
    assert_f32(&out, &[channels], &want, 0.0);

    // Channels first: [1, 32, 221, 19] holds channel c's 4199 values in its plane c.
    let mut rows = vec![0f32; outer * channels];
    for (i, v) in value.iter().enumerate() {
        rows[(i % channels) * outer + i / channels] = *v;
    }
    let nchw = f32s(&[1, channels, 13 * 17, 19], &rows);
    let out = run1(
        node("BiasAddGrad").attr("data_format", value::string("NCHW")),
        vec![nchw],
    );
    assert_f32(&out, &[channels], &want, 0.0);
}

#[test]
fn l2_loss_is_half_the_sum_of_squares() {
    let out = run1(node("L2Loss"), vec![f32s(&[3], &[1., 2., 3.])]);
    assert_f32(&out, &[], &[7.0], 0.0);
}

#[test]
fn reductions_with_axes_keep_dims_and_negative_axes() {
    // x = [[1,2,3],[4,5,6]]
    let x = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let out = run1(node("Sum"), vec![x.clone(), ivec(&[0])]);
    assert_f32(&out, &[3], &[5., 7., 9.], 0.0);
    let out = run1(
        node("Sum").attr("keep_dims", value::bool(true)),
        vec![x.clone(), i64s(&[], &[-1])],
    );
    assert_f32(&out, &[2, 1], &[6., 15.], 0.0);
    let out = run1(node("Mean"), vec![x.clone(), ivec(&[0, 1])]);
    assert_f32(&out, &[], &[3.5], 0.0);
    let out = run1(node("Max"), vec![x.clone(), ivec(&[1])]);
    assert_f32(&out, &[2], &[3., 6.], 0.0);
    let out = run1(node("Min"), vec![x.clone(), i32s(&[], &[0])]);
    assert_f32(&out, &[3], &[1., 2., 3.], 0.0);
    let out = run1(node("Prod"), vec![x.clone(), ivec(&[1])]);
    assert_f32(&out, &[2], &[6., 120.], 0.0);
    // An empty axis list reduces nothing.
    let out = run1(node("Sum"), vec![x.clone(), ivec(&[])]);
    assert_f32(&out, &[2, 3], &[1., 2., 3., 4., 5., 6.], 0.0);
    // Integer mean truncates; int64 works.
    let out = run1(node("Mean"), vec![i64s(&[3], &[1, 2, 4]), ivec(&[0])]);
    assert_exact(&out, &[], &[2i64]);
    let out = run1(node("Prod"), vec![i32s(&[1, 3], &[2, 3, 4]), ivec(&[0, 1])]);
    assert_exact(&out, &[], &[24]);
    // Max of an empty reduction is -inf, as in TensorFlow.
    let out = run1(node("Max"), vec![f32s(&[0], &[]), ivec(&[0])]);
    assert_eq!(out.values::<f32>().unwrap()[0], f32::NEG_INFINITY);
    expect_err(
        node("Sum"),
        vec![x.clone(), ivec(&[2])],
        Code::InvalidArgument,
        "Invalid reduction dimension 2 for input with 2 dimensions",
    );
    expect_err(
        node("Sum"),
        vec![x.clone(), ivec(&[1, -1])],
        Code::InvalidArgument,
        "duplicate dimension: 1",
    );
    expect_err(
        node("Sum"),
        vec![x.clone(), f32s(&[1], &[0.])],
        Code::InvalidArgument,
        "int32 or int64",
    );
    expect_err(
        node("Sum"),
        vec![bools(&[1], &[true]), ivec(&[0])],
        Code::InvalidArgument,
        "bool",
    );
}

#[test]
fn argmax_and_argmin() {
    // x = [[1,9,3],[7,2,7]]; ties keep the first index
    let x = f32s(&[2, 3], &[1., 9., 3., 7., 2., 7.]);
    let out = run1(node("ArgMax"), vec![x.clone(), i32s(&[], &[1])]);
    assert_exact(&out, &[2], &[1i64, 0]);
    let out = run1(
        node("ArgMax").attr("output_type", value::dtype(DType::Int32)),
        vec![x.clone(), i64s(&[], &[0])],
    );
    assert_exact(&out, &[3], &[1, 0, 1]);
    let out = run1(node("ArgMin"), vec![x.clone(), i32s(&[], &[-1])]);
    assert_exact(&out, &[2], &[0i64, 1]);
    expect_err(
        node("ArgMax"),
        vec![x.clone(), i32s(&[], &[2])],
        Code::InvalidArgument,
        "out of range",
    );
    expect_err(
        node("ArgMax"),
        vec![f32s(&[0, 2], &[]), i32s(&[], &[0])],
        Code::InvalidArgument,
        "is empty",
    );
}
