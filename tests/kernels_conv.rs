//! The convolution and pooling kernels: against stock TensorFlow 2.21's own numbers over a grid
//! of formats, strides, dilations, paddings and windows (`tests/kernels_conv_tf.py kernels`
//! computes them on seeded inputs, live: skipped without TensorFlow, a failure under CI), and
//! TensorFlow's errors for bad shapes and attrs (no TensorFlow needed).
//!
//! Values agree to 1e-5 of the largest magnitude in each output tensor (float32 sums in
//! another order differ in the last bits; oneDNN, which TensorFlow's CPU build uses, orders
//! them its own way).

use std::process::Command;

use crate::kernels_support::*;
use crate::support::tensorflow::{python_with, Client};
use serde_json::Value;
use tessera::error::Code;
use tessera::proto::AttrValue;
use tessera::tensor::{DType, Tensor};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels_conv_tf.py");

fn floats(v: &Value) -> Vec<f32> {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    a.iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn ints(v: &Value) -> Vec<i64> {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    a.iter().map(|x| x.as_i64().unwrap()).collect()
}

fn dims(v: &Value) -> Vec<usize> {
    ints(v).into_iter().map(|d| d as usize).collect()
}

fn tensor(shape: &Value, values: &Value) -> Tensor {
    Tensor::from_vec(dims(shape), floats(values)).unwrap()
}

fn int_list(v: &Value) -> AttrValue {
    value::int_list(ints(v))
}

/// Asserts `got` is `want` (float32, same shape) to 1e-5 of `want`'s largest magnitude.
fn assert_close(what: &str, got: &Tensor, shape: &[usize], want: &[f32]) {
    assert_eq!(got.dims(), shape, "{what}: shape");
    let got = got.values::<f32>().unwrap();
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * scale,
            "{what}: element {i}: tessera {g}, TensorFlow {w} (scale {scale})"
        );
    }
}

/// A convolution node with the case's attrs.
fn conv_node(op: &str, case: &Value) -> NodeBuilder {
    node(op)
        .t(DType::Float)
        .attr("strides", int_list(&case["strides"]))
        .attr("dilations", int_list(&case["dilations"]))
        .attr("explicit_paddings", int_list(&case["explicit_paddings"]))
        .attr("padding", value::string(case["padding"].as_str().unwrap()))
        .attr(
            "data_format",
            value::string(case["data_format"].as_str().unwrap()),
        )
}

fn check_conv(case: &Value) {
    let what = format!(
        "{} {} strides {} dilations {} explicit {} (TensorFlow {}, {})",
        case["data_format"],
        case["padding"],
        case["strides"],
        case["dilations"],
        case["explicit_paddings"],
        case["via"],
        case["via_backprops"]
    );
    let x = tensor(&case["x_shape"], &case["x"]);
    let f = tensor(&case["f_shape"], &case["f"]);
    let y_shape = dims(&case["y_shape"]);
    let dy = Tensor::from_vec(y_shape.clone(), floats(&case["dy"])).unwrap();
    let y = run1(conv_node("Conv2D", case), vec![x.clone(), f.clone()]);
    assert_close(&format!("Conv2D {what}"), &y, &y_shape, &floats(&case["y"]));
    let sizes = |t: &Tensor| {
        i32s(
            &[4],
            &t.dims().iter().map(|&d| d as i32).collect::<Vec<_>>(),
        )
    };
    let dx = run1(
        conv_node("Conv2DBackpropInput", case),
        vec![sizes(&x), f.clone(), dy.clone()],
    );
    assert_close(
        &format!("Conv2DBackpropInput {what}"),
        &dx,
        x.dims(),
        &floats(&case["dx"]),
    );
    let df = run1(
        conv_node("Conv2DBackpropFilter", case),
        vec![x.clone(), sizes(&f), dy],
    );
    assert_close(
        &format!("Conv2DBackpropFilter {what}"),
        &df,
        f.dims(),
        &floats(&case["df"]),
    );
}

fn check_pool(case: &Value) {
    let op = case["op"].as_str().unwrap();
    let what = format!(
        "{op} {} {} ksize {} strides {} explicit {} (TensorFlow {})",
        case["data_format"],
        case["padding"],
        case["ksize"],
        case["strides"],
        case["explicit_paddings"],
        case["via"]
    );
    let v2 = op == "MaxPoolV2";
    let pool_node = |name: &str| {
        let mut b = node(name)
            .t(DType::Float)
            .attr("padding", value::string(case["padding"].as_str().unwrap()))
            .attr(
                "data_format",
                value::string(case["data_format"].as_str().unwrap()),
            );
        if !v2 {
            b = b
                .attr("ksize", int_list(&case["ksize"]))
                .attr("strides", int_list(&case["strides"]));
        }
        if op == "MaxPool" {
            b = b.attr("explicit_paddings", int_list(&case["explicit_paddings"]));
        }
        b
    };
    let window: Vec<Tensor> = if v2 {
        let k: Vec<i32> = ints(&case["ksize"]).iter().map(|&v| v as i32).collect();
        let s: Vec<i32> = ints(&case["strides"]).iter().map(|&v| v as i32).collect();
        vec![ivec(&k), ivec(&s)]
    } else {
        vec![]
    };
    let x = tensor(&case["x_shape"], &case["x"]);
    let y_shape = dims(&case["y_shape"]);
    let dy = Tensor::from_vec(y_shape.clone(), floats(&case["dy"])).unwrap();
    let mut inputs = vec![x.clone()];
    inputs.extend(window.iter().cloned());
    let y = run1(pool_node(op), inputs);
    assert_close(&format!("{op} {what}"), &y, &y_shape, &floats(&case["y"]));
    let (grad_op, mut inputs) = match op {
        "AvgPool" => {
            let shape: Vec<i32> = x.dims().iter().map(|&d| d as i32).collect();
            ("AvgPoolGrad", vec![ivec(&shape), dy])
        }
        "MaxPool" => ("MaxPoolGrad", vec![x.clone(), y, dy]),
        _ => ("MaxPoolGradV2", vec![x.clone(), y, dy]),
    };
    inputs.extend(window);
    let dx = run1(pool_node(grad_op), inputs);
    assert_close(
        &format!("{grad_op} {what}"),
        &dx,
        x.dims(),
        &floats(&case["dx"]),
    );
}

#[test]
fn convolutions_and_pooling_match_tensorflow() {
    let test = "convolutions_and_pooling_match_tensorflow";
    let Some(python) = python_with(test, &["tensorflow", "numpy"]) else {
        return;
    };
    let mut command = Command::new(python);
    command.arg(SCRIPT).arg("kernels");
    let json = Client::spawn(command).finish_quietly().json;
    let conv = json["conv"].as_array().unwrap();
    let pool = json["pool"].as_array().unwrap();
    assert!(conv.len() >= 30 && pool.len() >= 30, "too few cases");
    for case in conv {
        check_conv(case);
    }
    for case in pool {
        check_pool(case);
    }
    eprintln!(
        "{} convolution cases (3 ops each) and {} pooling cases (2 ops each) match TensorFlow",
        conv.len(),
        pool.len()
    );
}

fn conv(strides: &[i64], padding: &str) -> NodeBuilder {
    node("Conv2D")
        .t(DType::Float)
        .attr("strides", value::int_list(strides.to_vec()))
        .attr("padding", value::string(padding))
}

fn zeros(dims: &[usize]) -> Tensor {
    Tensor::from_vec(dims.to_vec(), vec![0f32; dims.iter().product()]).unwrap()
}

#[test]
fn a_hand_worked_convolution_and_pooling() {
    // 1x3x3x1 input 1..9, 2x2 filter of ones: VALID sums of each 2x2 block.
    let x = f32s(&[1, 3, 3, 1], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let f = f32s(&[2, 2, 1, 1], &[1.; 4]);
    let y = run1(conv(&[1, 1, 1, 1], "VALID"), vec![x.clone(), f.clone()]);
    assert_f32(&y, &[1, 2, 2, 1], &[12., 16., 24., 28.], 0.0);
    // SAME pads the odd row and column after: the last row and column sum fewer values.
    let y = run1(conv(&[1, 1, 1, 1], "SAME"), vec![x.clone(), f]);
    assert_f32(
        &y,
        &[1, 3, 3, 1],
        &[12., 16., 9., 24., 28., 15., 15., 17., 9.],
        0.0,
    );
    // Max pooling's gradient goes to the first of tied maxima, in row-major window order.
    let ties = f32s(&[1, 2, 2, 1], &[1., 3., 3., 3.]);
    let pool = |op: &str| {
        node(op)
            .t(DType::Float)
            .attr("ksize", value::int_list(vec![1, 2, 2, 1]))
            .attr("strides", value::int_list(vec![1, 2, 2, 1]))
            .attr("padding", value::string("VALID"))
    };
    let y = run1(pool("MaxPool"), vec![ties.clone()]);
    assert_f32(&y, &[1, 1, 1, 1], &[3.], 0.0);
    let dx = run1(
        pool("MaxPoolGrad"),
        vec![ties, y, f32s(&[1, 1, 1, 1], &[5.])],
    );
    assert_f32(&dx, &[1, 2, 2, 1], &[0., 5., 0., 0.], 0.0);
    // SAME average pooling divides by the positions inside the input.
    let x = f32s(&[1, 1, 3, 1], &[2., 4., 9.]);
    let avg = node("AvgPool")
        .t(DType::Float)
        .attr("ksize", value::int_list(vec![1, 1, 2, 1]))
        .attr("strides", value::int_list(vec![1, 1, 2, 1]))
        .attr("padding", value::string("SAME"));
    assert_f32(&run1(avg, vec![x]), &[1, 1, 2, 1], &[3., 9.], 0.0);
}

#[test]
fn bad_shapes_and_attrs_fail_as_in_tensorflow() {
    let x = zeros(&[1, 5, 5, 4]);
    let f = |d: &[usize]| zeros(d);
    let cases: Vec<(NodeBuilder, Vec<Tensor>, Code, &str)> = vec![
        (
            conv(&[1, 1, 1, 1], "VALID"),
            vec![x.clone(), f(&[2, 2, 3, 1])],
            Code::InvalidArgument,
            "input depth must be evenly divisible by filter depth: 4 vs 3",
        ),
        (
            conv(&[1, 1, 1, 1], "VALID"),
            vec![x.clone(), f(&[7, 2, 4, 1])],
            Code::InvalidArgument,
            "Computed output size would be negative: -1 [input_size: 5, effective_filter_size: 7, stride: 1]",
        ),
        (
            conv(&[1, 1, 1], "VALID"),
            vec![x.clone(), f(&[2, 2, 4, 1])],
            Code::InvalidArgument,
            "Sliding window strides field must specify 4 dimensions",
        ),
        (
            conv(&[2, 1, 1, 1], "VALID"),
            vec![x.clone(), f(&[2, 2, 4, 1])],
            Code::Unimplemented,
            "does not yet support strides in the batch and depth dimensions",
        ),
        (
            conv(&[1, 0, 1, 1], "VALID"),
            vec![x.clone(), f(&[2, 2, 4, 1])],
            Code::InvalidArgument,
            "Row and column strides should be larger than 0",
        ),
        (
            conv(&[1, 1, 1, 1], "VALID"),
            vec![zeros(&[5, 5, 4]), f(&[2, 2, 4, 1])],
            Code::InvalidArgument,
            "input must be 4-dimensional",
        ),
        (
            conv(&[1, 1, 1, 1], "EXPLICIT")
                .attr("explicit_paddings", value::int_list(vec![0, 0, 1, 1])),
            vec![x.clone(), f(&[2, 2, 4, 1])],
            Code::InvalidArgument,
            "explicit_paddings attribute must contain 8 values, but got: 4",
        ),
        (
            conv(&[1, 1, 1, 1], "VALID")
                .attr("explicit_paddings", value::int_list(vec![0, 0, 1, 1, 1, 1, 0, 0])),
            vec![x.clone(), f(&[2, 2, 4, 1])],
            Code::InvalidArgument,
            "explicit_paddings attribute must be empty if the padding attribute is not EXPLICIT",
        ),
        (
            conv(&[1, 1, 1, 1], "EXPLICIT")
                .attr("explicit_paddings", value::int_list(vec![1, 0, 1, 1, 1, 1, 0, 0])),
            vec![x.clone(), f(&[2, 2, 4, 1])],
            Code::InvalidArgument,
            "Nonzero explicit padding in the batch or depth dimensions is not supported",
        ),
        (
            conv(&[1, 1, 1, 1], "EXPLICIT")
                .attr("explicit_paddings", value::int_list(vec![0, 0, -1, 1, 1, 1, 0, 0])),
            vec![x.clone(), f(&[2, 2, 4, 1])],
            Code::InvalidArgument,
            "All elements of explicit_paddings must be nonnegative",
        ),
        (
            conv(&[1, 1, 1, 1], "FULL"),
            vec![x.clone(), f(&[2, 2, 4, 1])],
            Code::InvalidArgument,
            "unknown padding `FULL`; use SAME, VALID or EXPLICIT",
        ),
        (
            node("Conv2DBackpropInput")
                .t(DType::Float)
                .attr("strides", value::int_list(vec![1, 1, 1, 1]))
                .attr("padding", value::string("VALID")),
            vec![ivec(&[1, 5, 5, 4]), f(&[2, 2, 4, 4]), zeros(&[1, 3, 4, 4])],
            Code::InvalidArgument,
            "Size of out_backprop doesn't match computed: actual = 3, computed = 4 spatial_dim: 1 input: 5 filter: 2 output: 3 stride: 1 dilation: 1",
        ),
        (
            node("Conv2DBackpropInput")
                .t(DType::Float)
                .attr("strides", value::int_list(vec![1, 1, 1, 1]))
                .attr("padding", value::string("VALID")),
            vec![ivec(&[2, 5, 5, 4]), f(&[2, 2, 4, 4]), zeros(&[1, 4, 4, 4])],
            Code::InvalidArgument,
            "input and out_backprop must have the same batch size. Input batch: 2, outbackprop batch: 1",
        ),
        (
            node("Conv2DBackpropFilter")
                .t(DType::Float)
                .attr("strides", value::int_list(vec![1, 1, 1, 1]))
                .attr("padding", value::string("VALID")),
            vec![x.clone(), ivec(&[2, 2, 4, 4]), zeros(&[1, 4, 4, 3])],
            Code::InvalidArgument,
            "filter and out_backprop must have the same out_depth",
        ),
        (
            node("MaxPool")
                .t(DType::Float)
                .attr("ksize", value::int_list(vec![2, 2, 2, 1]))
                .attr("strides", value::int_list(vec![1, 2, 2, 1]))
                .attr("padding", value::string("VALID")),
            vec![x.clone()],
            Code::Unimplemented,
            "Pooling is not yet supported on the batch dimension",
        ),
        (
            node("AvgPool")
                .t(DType::Float)
                .attr("ksize", value::int_list(vec![1, 0, 2, 1]))
                .attr("strides", value::int_list(vec![1, 2, 2, 1]))
                .attr("padding", value::string("VALID")),
            vec![x.clone()],
            Code::InvalidArgument,
            "Sliding window ksize must be positive. The specified or inferred ksize is: 1,0,2,1",
        ),
        (
            node("MaxPoolGrad")
                .t(DType::Float)
                .attr("ksize", value::int_list(vec![1, 2, 2, 1]))
                .attr("strides", value::int_list(vec![1, 2, 2, 1]))
                .attr("padding", value::string("VALID")),
            vec![x.clone(), zeros(&[1, 2, 2, 4]), zeros(&[1, 3, 2, 4])],
            Code::InvalidArgument,
            "Expected grad shape to be [1,2,2,4], but got [1,3,2,4]",
        ),
    ];
    for (b, inputs, code, needle) in cases {
        let message = expect_err(b, inputs, code, needle);
        assert!(message.starts_with("node `x` (op "), "{message}");
    }
}
