//! The kernels convolutional models bring besides `Conv2D` and pooling: `DepthwiseConv2dNative`
//! and its two backprops, `FusedBatchNorm{,V2,V3}` and their gradient ops, `LRN`/`LRNGrad`,
//! `Relu6`, `Softplus`, `Selu` (with their grad ops), `Erf` and `Log1p`:
//!
//! - against stock TensorFlow 2.21's own numbers on seeded inputs (`tests/kernels_cnn_tf.py`
//!   computes them live: skipped without TensorFlow, a failure under CI);
//! - TensorFlow's errors for bad shapes (no TensorFlow needed);
//! - the builder's gradient of each op against central differences through a local session:
//!   in float64 where the op takes it, in float32 (with a wider step and tolerance) for batch
//!   normalization and LRN, whose op definitions take float32 only, as TensorFlow's do; and
//!   the gradients TensorFlow registers for the gradient ops (`Relu6Grad`, `SoftplusGrad`,
//!   `SeluGrad`, the depthwise backprops), for second derivatives.

use crate::kernels_support::*;
use crate::support::tensorflow::script_json;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tessera::client::Session;
use tessera::error::Code;
use tessera::graph::{gradients, Graph, Output};
use tessera::proto::AttrValue;
use tessera::tensor::{DType, PartialShape, Tensor};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels_cnn_tf.py");

fn floats(v: &Value) -> Vec<f64> {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    a.iter().map(|x| x.as_f64().unwrap()).collect()
}

fn f32s_of(v: &Value) -> Vec<f32> {
    floats(v).into_iter().map(|x| x as f32).collect()
}

fn ints(v: &Value) -> Vec<i64> {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    a.iter().map(|x| x.as_i64().unwrap()).collect()
}

fn dims(v: &Value) -> Vec<usize> {
    ints(v).into_iter().map(|d| d as usize).collect()
}

fn tensor(shape: &[usize], values: &Value) -> Tensor {
    Tensor::from_vec(shape.to_vec(), f32s_of(values)).unwrap()
}

fn int_list(v: &Value) -> AttrValue {
    value::int_list(ints(v))
}

fn sizes(t: &Tensor) -> Tensor {
    let d: Vec<i32> = t.dims().iter().map(|&d| d as i32).collect();
    ivec(&d)
}

/// Asserts `got` (float32) is `want` to `tol` of `want`'s largest magnitude (at least 1).
fn assert_close(what: &str, got: &Tensor, shape: &[usize], want: &[f64], tol: f64) {
    assert_eq!(got.dims(), shape, "{what}: shape");
    let got = got.values::<f32>().unwrap();
    assert_eq!(got.len(), want.len(), "{what}: element count");
    let scale = want.iter().fold(1f64, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= tol * scale,
            "{what}: element {i}: tessera {g}, TensorFlow {w} (scale {scale})"
        );
    }
}

/// A depthwise node with the case's attrs.
fn depthwise_node(op: &str, case: &Value) -> NodeBuilder {
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

fn check_depthwise(case: &Value) {
    let what = format!(
        "{} {} strides {} dilations {} explicit {} filter {} (TensorFlow {}, {})",
        case["data_format"],
        case["padding"],
        case["strides"],
        case["dilations"],
        case["explicit_paddings"],
        case["f_shape"],
        case["via"],
        case["via_backprops"]
    );
    let x = tensor(&dims(&case["x_shape"]), &case["x"]);
    let f = tensor(&dims(&case["f_shape"]), &case["f"]);
    let y_shape = dims(&case["y_shape"]);
    let dy = tensor(&y_shape, &case["dy"]);
    let y = run1(
        depthwise_node("DepthwiseConv2dNative", case),
        vec![x.clone(), f.clone()],
    );
    assert_close(&what, &y, &y_shape, &floats(&case["y"]), 1e-5);
    let dx = run1(
        depthwise_node("DepthwiseConv2dNativeBackpropInput", case),
        vec![sizes(&x), f.clone(), dy.clone()],
    );
    assert_close(
        &format!("BackpropInput {what}"),
        &dx,
        x.dims(),
        &floats(&case["dx"]),
        1e-5,
    );
    let df = run1(
        depthwise_node("DepthwiseConv2dNativeBackpropFilter", case),
        vec![x.clone(), sizes(&f), dy],
    );
    assert_close(
        &format!("BackpropFilter {what}"),
        &df,
        f.dims(),
        &floats(&case["df"]),
        1e-5,
    );
}

fn check_batch_norm(case: &Value) {
    let op = case["op"].as_str().unwrap();
    let training = case["is_training"].as_bool().unwrap();
    let what = format!(
        "{op} {} is_training {training} exponential_avg_factor {}",
        case["data_format"], case["exponential_avg_factor"]
    );
    let bn = |name: &str| {
        let b = node(name)
            .t(DType::Float)
            .attr(
                "epsilon",
                value::float(case["epsilon"].as_f64().unwrap() as f32),
            )
            .attr(
                "data_format",
                value::string(case["data_format"].as_str().unwrap()),
            )
            .attr("is_training", value::bool(training));
        if name.starts_with("FusedBatchNormGrad") {
            b
        } else {
            b.attr(
                "exponential_avg_factor",
                value::float(case["exponential_avg_factor"].as_f64().unwrap() as f32),
            )
        }
    };
    let x = tensor(&dims(&case["x_shape"]), &case["x"]);
    let c = case["scale"].as_array().unwrap().len();
    let vector = |key: &str| tensor(&[c], &case[key]);
    let inputs = vec![
        x.clone(),
        vector("scale"),
        vector("offset"),
        vector("mean"),
        vector("variance"),
    ];
    let outs = bn(op).run(inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
    let shapes = case["out_shapes"].as_array().unwrap();
    assert_eq!(outs.len(), shapes.len(), "{what}: outputs");
    let names = [
        "y",
        "batch_mean",
        "batch_variance",
        "reserve_space_1",
        "reserve_space_2",
        "reserve_space_3",
    ];
    let uninitialized = ints(&case["uninitialized"]);
    for (i, out) in outs.iter().enumerate() {
        if names[i] == "reserve_space_3" {
            // Opaque to the gradient on CPU: TensorFlow's plain kernel returns a scalar, its
            // oneDNN kernel an empty vector; tessera returns the latter.
            let n = out.num_elements();
            assert!(n <= 1, "{what}: reserve_space_3 holds {:?}", out.dims());
            continue;
        }
        if uninitialized.contains(&(i as i64)) {
            assert_eq!(out.dims(), dims(&shapes[i]), "{what}: {} shape", names[i]);
            continue;
        }
        assert_close(
            &format!("{what}: {}", names[i]),
            out,
            &dims(&shapes[i]),
            &floats(&case["outs"][i]),
            2e-5,
        );
    }
    let grad_op = op.replace("FusedBatchNorm", "FusedBatchNormGrad");
    let dy = tensor(x.dims(), &case["dy"]);
    let (m, v) = if training {
        (outs[3].clone(), outs[4].clone())
    } else {
        (vector("mean"), vector("variance"))
    };
    let mut inputs = vec![dy, x.clone(), vector("scale"), m, v];
    if op.ends_with("V3") {
        inputs.push(outs[5].clone());
    }
    let grads = bn(&grad_op)
        .run(inputs)
        .unwrap_or_else(|e| panic!("{grad_op}: {e}"));
    assert_eq!(grads.len(), 5);
    for (i, name) in ["x_backprop", "scale_backprop", "offset_backprop"]
        .iter()
        .enumerate()
    {
        let shape = if i == 0 { x.dims().to_vec() } else { vec![c] };
        assert_close(
            &format!("{grad_op} {what}: {name}"),
            &grads[i],
            &shape,
            &floats(&case["grads"][i]),
            2e-5,
        );
    }
}

fn lrn_node(op: &str, case: &Value) -> NodeBuilder {
    let f = |k: &str| value::float(case[k].as_f64().unwrap() as f32);
    node(op)
        .t(DType::Float)
        .attr(
            "depth_radius",
            value::int(case["depth_radius"].as_i64().unwrap()),
        )
        .attr("bias", f("bias"))
        .attr("alpha", f("alpha"))
        .attr("beta", f("beta"))
}

fn check_lrn(case: &Value) {
    let what = format!(
        "LRN depth_radius {} bias {} alpha {} beta {}",
        case["depth_radius"], case["bias"], case["alpha"], case["beta"]
    );
    let shape = dims(&case["x_shape"]);
    let x = tensor(&shape, &case["x"]);
    let y = run1(lrn_node("LRN", case), vec![x.clone()]);
    assert_close(&what, &y, &shape, &floats(&case["y"]), 1e-5);
    let dy = tensor(&shape, &case["dy"]);
    let dx = run1(lrn_node("LRNGrad", case), vec![dy, x, y]);
    assert_close(
        &format!("LRNGrad {what}"),
        &dx,
        &shape,
        &floats(&case["dx"]),
        1e-5,
    );
}

fn check_elementwise(case: &Value) {
    let op = case["op"].as_str().unwrap();
    let double = case["dtype"] == "float64";
    let inputs: Vec<Tensor> = case["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let values = floats(v);
            if double {
                Tensor::from_vec([values.len()], values).unwrap()
            } else {
                Tensor::from_vec(
                    [values.len()],
                    values.iter().map(|&v| v as f32).collect::<Vec<_>>(),
                )
                .unwrap()
            }
        })
        .collect();
    let dtype = if double { DType::Double } else { DType::Float };
    let y = run1(node(op).t(dtype), inputs);
    let got: Vec<f64> = if double {
        y.values::<f64>().unwrap().to_vec()
    } else {
        y.values::<f32>()
            .unwrap()
            .iter()
            .map(|&v| f64::from(v))
            .collect()
    };
    let want = floats(&case["y"]);
    let tol = if double { 1e-12 } else { 2e-6 };
    assert_eq!(got.len(), want.len(), "{op}");
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{op} {dtype}: element {i}: tessera {g}, TensorFlow {w}"
        );
    }
}

#[test]
fn cnn_kernels_match_tensorflow() {
    let test = "cnn_kernels_match_tensorflow";
    let Some(json) = script_json(test, SCRIPT, &["tensorflow", "numpy"]) else {
        return;
    };
    let group = |k: &str| json[k].as_array().unwrap().clone();
    let (depthwise, batch_norm, lrn, elementwise) = (
        group("depthwise"),
        group("batch_norm"),
        group("lrn"),
        group("elementwise"),
    );
    assert!(depthwise.len() >= 28 && batch_norm.len() >= 13 && lrn.len() >= 5);
    assert!(elementwise.len() >= 16);
    depthwise.iter().for_each(check_depthwise);
    batch_norm.iter().for_each(check_batch_norm);
    lrn.iter().for_each(check_lrn);
    elementwise.iter().for_each(check_elementwise);
    eprintln!(
        "{} depthwise cases (3 ops each), {} batch normalization cases (forward and grad), {} \
         LRN cases (forward and grad) and {} element-wise cases match TensorFlow",
        depthwise.len(),
        batch_norm.len(),
        lrn.len(),
        elementwise.len()
    );
}

fn zeros(dims: &[usize]) -> Tensor {
    Tensor::from_vec(dims.to_vec(), vec![0f32; dims.iter().product()]).unwrap()
}

fn depthwise(op: &str, strides: &[i64]) -> NodeBuilder {
    node(op)
        .t(DType::Float)
        .attr("strides", value::int_list(strides.to_vec()))
        .attr("padding", value::string("VALID"))
}

fn batch_norm(op: &str, training: bool) -> NodeBuilder {
    node(op)
        .t(DType::Float)
        .attr("is_training", value::bool(training))
}

#[test]
fn bad_shapes_fail_as_in_tensorflow() {
    let x = zeros(&[1, 5, 5, 3]);
    let f = zeros(&[2, 2, 3, 2]);
    let dy = zeros(&[1, 4, 4, 6]);
    let v = |n: usize| zeros(&[n]);
    let cases: Vec<(NodeBuilder, Vec<Tensor>, Code, &str)> = vec![
        (
            depthwise("DepthwiseConv2dNative", &[1, 1, 1, 1]),
            vec![x.clone(), zeros(&[2, 2, 4, 2])],
            Code::InvalidArgument,
            "input and filter must have the same depth: 3 vs 4",
        ),
        (
            depthwise("DepthwiseConv2dNative", &[1, 1, 1, 1]),
            vec![zeros(&[5, 5, 3]), f.clone()],
            Code::InvalidArgument,
            "input must be 4-dimensional",
        ),
        (
            depthwise("DepthwiseConv2dNative", &[2, 1, 1, 1]),
            vec![x.clone(), f.clone()],
            Code::Unimplemented,
            "does not yet support strides in the batch and depth dimensions",
        ),
        (
            depthwise("DepthwiseConv2dNative", &[1, 1, 1, 1]),
            vec![x.clone(), zeros(&[7, 2, 3, 2])],
            Code::InvalidArgument,
            "Computed output size would be negative: -1 [input_size: 5, effective_filter_size: 7, stride: 1]",
        ),
        (
            depthwise("DepthwiseConv2dNativeBackpropInput", &[1, 1, 1, 1]),
            vec![i32s(&[1, 4], &[1, 5, 5, 3]), f.clone(), dy.clone()],
            Code::InvalidArgument,
            "input_sizes input must be 1-dim, not 2",
        ),
        (
            depthwise("DepthwiseConv2dNativeBackpropInput", &[1, 1, 1, 1]),
            vec![ivec(&[1, 5, 5, 3]), f.clone(), zeros(&[1, 3, 4, 6])],
            Code::InvalidArgument,
            "DepthwiseConv2DBackpropInput: Number of rows of out_backprop doesn't match computed: actual = 3, computed = 4",
        ),
        (
            depthwise("DepthwiseConv2dNativeBackpropInput", &[1, 1, 1, 1]),
            vec![ivec(&[2, 5, 5, 3]), f.clone(), dy.clone()],
            Code::InvalidArgument,
            "DepthwiseConv2DBackpropInput: input and out_backprop must have the same batch size",
        ),
        (
            depthwise("DepthwiseConv2dNativeBackpropInput", &[1, 1, 1, 1]),
            vec![ivec(&[1, 5, 5, 3]), f.clone(), zeros(&[1, 4, 4, 5])],
            Code::InvalidArgument,
            "DepthwiseConv2DBackpropInput: depth_multiplier * in_depth not equal to out_depth",
        ),
        (
            depthwise("DepthwiseConv2dNativeBackpropInput", &[1, 1, 1, 1]),
            vec![ivec(&[1, 5, 5, 4]), f.clone(), dy.clone()],
            Code::InvalidArgument,
            "DepthwiseConv2DBackpropInput: input and filter must have the same in_depth",
        ),
        (
            depthwise("DepthwiseConv2dNativeBackpropFilter", &[1, 1, 1, 1]),
            vec![x.clone(), ivec(&[2, 2, 3]), dy.clone()],
            Code::InvalidArgument,
            "DepthwiseConv2DBackpropFilter: filter must be 4-dimensional",
        ),
        (
            depthwise("DepthwiseConv2dNativeBackpropFilter", &[1, 1, 1, 1]),
            vec![x.clone(), ivec(&[2, 2, 3, 2]), zeros(&[1, 4, 3, 6])],
            Code::InvalidArgument,
            "DepthwiseConv2DBackpropFilter: Number of cols of out_backprop doesn't match computed: actual = 3, computed = 4",
        ),
        (
            batch_norm("FusedBatchNormV3", true),
            vec![zeros(&[3, 4, 5]), v(5), v(5), v(5), v(5)],
            Code::InvalidArgument,
            "input must be 4-dimensional[3,4,5]",
        ),
        (
            batch_norm("FusedBatchNormV3", true),
            vec![zeros(&[2, 3, 4, 5]), v(3), v(5), v(5), v(5)],
            Code::InvalidArgument,
            "scale must have the same number of elements as the channels of x, got 3 and 5",
        ),
        (
            batch_norm("FusedBatchNormV3", true),
            vec![zeros(&[2, 3, 4, 5]), v(5), v(2), v(5), v(5)],
            Code::InvalidArgument,
            "offset must have the same number of elements as the channels of x, got 2 and 5",
        ),
        (
            batch_norm("FusedBatchNormV3", false),
            vec![zeros(&[2, 3, 4, 5]), v(5), v(5), v(3), v(5)],
            Code::InvalidArgument,
            "When is_training=false, mean must have the same number of elements as the channels of x, got 3 and 5",
        ),
        (
            batch_norm("FusedBatchNormV3", true)
                .attr("exponential_avg_factor", value::float(0.3)),
            vec![zeros(&[2, 3, 4, 5]), v(5), v(5), v(2), v(5)],
            Code::InvalidArgument,
            "When exponential_avg_factor != 1, mean must have the same number of elements as the channels of x, got 2 and 5",
        ),
        (
            batch_norm("FusedBatchNormGradV3", true),
            vec![
                zeros(&[1, 3, 4, 5]),
                zeros(&[2, 3, 4, 5]),
                v(5),
                v(5),
                v(5),
                v(0),
            ],
            Code::InvalidArgument,
            "x and y_backprop must have same shape, but x has shape [2,3,4,5] and y_backprop has shape [1,3,4,5]",
        ),
        (
            batch_norm("FusedBatchNormGradV3", true),
            vec![
                zeros(&[2, 3, 4, 5]),
                zeros(&[2, 3, 4, 5]),
                v(5),
                v(2),
                v(5),
                v(0),
            ],
            Code::InvalidArgument,
            "reserve_space_1 must have the same number of elements as the channels of x, got 2 and 5",
        ),
        (
            node("LRN").t(DType::Float),
            vec![zeros(&[5, 5, 3])],
            Code::InvalidArgument,
            "in must be 4-dimensional",
        ),
        (
            node("LRNGrad").t(DType::Float),
            vec![x.clone(), x.clone(), zeros(&[1, 4, 5, 3])],
            Code::InvalidArgument,
            "input_grads, input_image, and out_image should have the same shape",
        ),
        (
            node("LRNGrad").t(DType::Float),
            vec![zeros(&[5, 5, 3]), x.clone(), x.clone()],
            Code::InvalidArgument,
            "inputs must be 4-dimensional",
        ),
        (
            node("Relu6Grad").t(DType::Float),
            vec![zeros(&[3]), zeros(&[4])],
            Code::InvalidArgument,
            "inputs must have the same size and shape",
        ),
    ];
    for (b, inputs, code, needle) in cases {
        let message = expect_err(b, inputs, code, needle);
        assert!(message.starts_with("node `x` (op "), "{message}");
    }
    // A multiplier of 0 gives no output channels, and zero gradients, without failing.
    let y = run1(
        depthwise("DepthwiseConv2dNative", &[1, 1, 1, 1]),
        vec![x.clone(), zeros(&[2, 2, 3, 0])],
    );
    assert_eq!(y.dims(), [1, 4, 4, 0]);
    let dx = run1(
        depthwise("DepthwiseConv2dNativeBackpropInput", &[1, 1, 1, 1]),
        vec![
            ivec(&[1, 5, 5, 3]),
            zeros(&[2, 2, 3, 0]),
            zeros(&[1, 4, 4, 0]),
        ],
    );
    assert_f32(&dx, &[1, 5, 5, 3], &[0.0; 75], 0.0);
    // depth_radius is checked when the kernel is made.
    let err = node("LRN")
        .t(DType::Float)
        .attr("depth_radius", value::int(-1))
        .run(vec![x])
        .unwrap_err();
    assert!(
        err.message()
            .contains("depth_radius = -1 larger than int max"),
        "{err}"
    );
}

/// One differentiable input of a gradient check: its name, dims and values.
struct Param {
    name: &'static str,
    dims: Vec<usize>,
    values: Vec<f64>,
}

fn param(
    rng: &mut rand::rngs::StdRng,
    name: &'static str,
    dims: &[usize],
    lo: f64,
    hi: f64,
) -> Param {
    let n = dims.iter().product();
    Param {
        name,
        dims: dims.to_vec(),
        values: (0..n).map(|_| rng.random_range(lo..hi)).collect(),
    }
}

fn to_tensor(dtype: DType, dims: &[usize], v: &[f64]) -> Tensor {
    match dtype {
        DType::Double => Tensor::from_vec(dims.to_vec(), v.to_vec()).unwrap(),
        _ => Tensor::from_vec(
            dims.to_vec(),
            v.iter().map(|&x| x as f32).collect::<Vec<_>>(),
        )
        .unwrap(),
    }
}

fn to_f64s(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::Double => t.values::<f64>().unwrap().to_vec(),
        _ => t
            .values::<f32>()
            .unwrap()
            .iter()
            .map(|&v| f64::from(v))
            .collect(),
    }
}

/// Builds `loss = sum(build(params) * weights)` (fixed random weights, so every output
/// element's gradient differs) with the builder's gradients, and checks each gradient element
/// against the central difference `(loss(p + eps) - loss(p - eps)) / 2 eps`, to `tol`
/// absolute plus `tol` relative.
fn check_gradients(
    what: &str,
    dtype: DType,
    mut params: Vec<Param>,
    eps: f64,
    tol: f64,
    build: impl Fn(&mut Graph, &[Output]) -> Output,
) {
    let mut g = Graph::new();
    let known = |d: &[usize]| PartialShape::new(d.iter().map(|&d| Some(d)).collect::<Vec<_>>());
    let inputs: Vec<Output> = params
        .iter()
        .map(|p| g.placeholder(p.name, dtype, known(&p.dims)).unwrap())
        .collect();
    let y = build(&mut g, &inputs);
    let y_dims: Vec<usize> = y
        .shape
        .dims()
        .expect("the output's shape is known")
        .iter()
        .map(|d| d.expect("the output's dims are known"))
        .collect();
    let n: usize = y_dims.iter().product();
    let weights: Vec<f64> = (0..n).map(|i| ((i * 7 % 11) as f64 - 5.0) / 5.0).collect();
    let w = g.constant(&to_tensor(dtype, &y_dims, &weights)).unwrap();
    let product = g.mul(&y, &w).unwrap();
    let axes: Vec<i64> = (0..y_dims.len() as i64).collect();
    let loss = g.sum(&product, &axes, false).unwrap();
    let grads: Vec<Output> = gradients(&mut g, std::slice::from_ref(&loss), &inputs, None)
        .unwrap()
        .into_iter()
        .map(|g| g.expect("every input reaches the loss"))
        .collect();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let names: Vec<String> = params.iter().map(|p| format!("{}:0", p.name)).collect();
    let run = |params: &[Param], with_grads: bool| -> Vec<Vec<f64>> {
        let feeds: Vec<(&str, Tensor)> = params
            .iter()
            .zip(&names)
            .map(|(p, name)| (name.as_str(), to_tensor(dtype, &p.dims, &p.values)))
            .collect();
        let mut fetches = vec![loss.name()];
        if with_grads {
            fetches.extend(grads.iter().map(Output::name));
        }
        let fetches: Vec<&str> = fetches.iter().map(String::as_str).collect();
        session
            .run(&feeds, &fetches, &[])
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .iter()
            .map(to_f64s)
            .collect()
    };
    let analytic = run(&params, true).split_off(1);
    let mut checked = 0;
    for k in 0..params.len() {
        for (i, &got) in analytic[k].iter().enumerate() {
            let saved = params[k].values[i];
            params[k].values[i] = saved + eps;
            let up = run(&params, false)[0][0];
            params[k].values[i] = saved - eps;
            let down = run(&params, false)[0][0];
            params[k].values[i] = saved;
            let numeric = (up - down) / (2.0 * eps);
            assert!(
                (got - numeric).abs() <= tol + tol * numeric.abs(),
                "{what}: d/d{}[{i}]: gradient {got}, central difference {numeric}",
                params[k].name
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "{what}");
    eprintln!("{what}: {checked} gradient elements match central differences");
}

#[test]
fn depthwise_gradients_match_central_differences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(16);
    for (format, strides, dilations, padding, multiplier) in [
        ("NHWC", [1, 1, 1, 1], [1, 1, 1, 1], "SAME", 1),
        ("NHWC", [1, 2, 2, 1], [1, 1, 1, 1], "VALID", 2),
        ("NHWC", [1, 1, 1, 1], [1, 2, 1, 1], "SAME", 2),
        ("NCHW", [1, 1, 2, 2], [1, 1, 1, 1], "SAME", 2),
        ("NCHW", [1, 1, 1, 1], [1, 1, 2, 2], "VALID", 1),
    ] {
        let x_dims = if format == "NHWC" {
            [2, 5, 6, 3]
        } else {
            [2, 3, 5, 6]
        };
        let params = vec![
            param(&mut rng, "x", &x_dims, -1.0, 1.0),
            param(&mut rng, "f", &[3, 2, 3, multiplier], -1.0, 1.0),
        ];
        let what = format!("depthwise {format} strides {strides:?} dilations {dilations:?}");
        check_gradients(&what, DType::Double, params, 1e-6, 1e-7, |g, p| {
            g.add1(
                tessera::graph::NodeSpec::new("DepthwiseConv2dNative")
                    .input(&p[0])
                    .input(&p[1])
                    .attr("strides", value::int_list(strides.to_vec()))
                    .attr("dilations", value::int_list(dilations.to_vec()))
                    .attr("padding", value::string(padding))
                    .attr("data_format", value::string(format)),
            )
            .unwrap()
        });
    }
    // The builder method: NHWC, SAME.
    let params = vec![
        param(&mut rng, "x", &[1, 4, 4, 2], -1.0, 1.0),
        param(&mut rng, "f", &[2, 2, 2, 3], -1.0, 1.0),
    ];
    check_gradients(
        "depthwise_conv2d",
        DType::Double,
        params,
        1e-6,
        1e-7,
        |g, p| {
            g.depthwise_conv2d(&p[0], &p[1], &[1, 1, 1, 1], "SAME")
                .unwrap()
        },
    );
}

#[test]
fn elementwise_gradients_match_central_differences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    // Values away from the kinks of Relu6 (0 and 6) and Selu (0), so differences are smooth.
    let mut x = param(&mut rng, "x", &[4, 5], -3.0, 8.0);
    for v in &mut x.values {
        if v.abs() < 0.05 || (*v - 6.0).abs() < 0.05 {
            *v += 0.2;
        }
    }
    type Build = fn(&mut Graph, &Output) -> Output;
    let ops: [(&str, Build); 5] = [
        ("relu6", |g, x| g.relu6(x).unwrap()),
        ("softplus", |g, x| g.softplus(x).unwrap()),
        ("selu", |g, x| g.selu(x).unwrap()),
        ("erf", |g, x| g.erf(x).unwrap()),
        ("log1p", |g, x| g.log1p(x).unwrap()),
    ];
    for (name, build) in ops {
        let mut p = Param {
            name: "x",
            dims: x.dims.clone(),
            values: x.values.clone(),
        };
        if name == "log1p" {
            // Log1p is defined above -1.
            p.values.iter_mut().for_each(|v| *v = v.abs() - 0.5);
        }
        check_gradients(name, DType::Double, vec![p], 1e-6, 1e-7, |g, i| {
            build(g, &i[0])
        });
    }
}

#[test]
fn batch_norm_gradients_match_central_differences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(18);
    for (format, training) in [
        ("NHWC", true),
        ("NCHW", true),
        ("NHWC", false),
        ("NCDHW", true),
        ("NDHWC", false),
    ] {
        let x_dims: &[usize] = match format {
            "NHWC" => &[2, 3, 2, 3],
            "NCHW" => &[2, 3, 3, 2],
            "NCDHW" => &[2, 3, 2, 2, 2],
            _ => &[2, 2, 2, 2, 3],
        };
        let params = vec![
            param(&mut rng, "x", x_dims, -2.0, 2.0),
            param(&mut rng, "scale", &[3], 0.5, 1.5),
            param(&mut rng, "offset", &[3], -1.0, 1.0),
        ];
        let mean = param(&mut rng, "mean", &[3], -0.5, 0.5);
        let var = param(&mut rng, "variance", &[3], 0.5, 1.5);
        let what = format!("FusedBatchNormV3 {format} is_training {training}");
        check_gradients(&what, DType::Float, params, 1e-2, 3e-3, |g, p| {
            let m = g
                .constant(&to_tensor(DType::Float, &[3], &mean.values))
                .unwrap();
            let v = g
                .constant(&to_tensor(DType::Float, &[3], &var.values))
                .unwrap();
            let outs = g
                .add_node(
                    tessera::graph::NodeSpec::new("FusedBatchNormV3")
                        .input(&p[0])
                        .input(&p[1])
                        .input(&p[2])
                        .input(&m)
                        .input(&v)
                        .attr("epsilon", value::float(0.001))
                        .attr("data_format", value::string(format))
                        .attr("is_training", value::bool(training)),
                )
                .unwrap();
            assert_eq!(outs.len(), 6);
            outs[0].clone()
        });
    }
    // The builder method, and FusedBatchNorm (version 1) in training.
    let params = vec![
        param(&mut rng, "x", &[3, 2, 2, 2], -2.0, 2.0),
        param(&mut rng, "scale", &[2], 0.5, 1.5),
        param(&mut rng, "offset", &[2], -1.0, 1.0),
    ];
    check_gradients(
        "fused_batch_norm",
        DType::Float,
        params,
        1e-2,
        3e-3,
        |g, p| {
            let empty = g
                .constant(&Tensor::from_vec([0], Vec::<f32>::new()).unwrap())
                .unwrap();
            g.fused_batch_norm(&p[0], &p[1], &p[2], &empty, &empty, 1e-3, true)
                .unwrap()
                .remove(0)
        },
    );
    let params = vec![
        param(&mut rng, "x", &[3, 2, 2, 2], -2.0, 2.0),
        param(&mut rng, "scale", &[2], 0.5, 1.5),
        param(&mut rng, "offset", &[2], -1.0, 1.0),
    ];
    check_gradients(
        "FusedBatchNorm",
        DType::Float,
        params,
        1e-2,
        3e-3,
        |g, p| {
            let empty = g
                .constant(&Tensor::from_vec([0], Vec::<f32>::new()).unwrap())
                .unwrap();
            g.add_node(
                tessera::graph::NodeSpec::new("FusedBatchNorm")
                    .input(&p[0])
                    .input(&p[1])
                    .input(&p[2])
                    .input(&empty)
                    .input(&empty),
            )
            .unwrap()
            .remove(0)
        },
    );
}

#[test]
fn lrn_gradient_matches_central_differences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(19);
    for (radius, bias, alpha, beta) in [(2, 1.0, 0.5, 0.75), (1, 2.0, 1.0, 0.5)] {
        let params = vec![param(&mut rng, "x", &[2, 2, 2, 6], -1.5, 1.5)];
        let what = format!("LRN depth_radius {radius}");
        check_gradients(&what, DType::Float, params, 1e-2, 2e-3, |g, p| {
            g.lrn(&p[0], radius, bias, alpha, beta).unwrap()
        });
    }
}

/// The gradients of the gradient ops (for second derivatives, as TensorFlow registers them):
/// `Relu6Grad`, `SoftplusGrad`, `SeluGrad` and the two depthwise backprops.
#[test]
fn gradients_of_the_gradient_ops_match_central_differences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(20);
    let mut away_from_kinks = |name: &'static str| {
        let mut p = param(&mut rng, name, &[3, 4], -3.0, 8.0);
        for v in &mut p.values {
            if v.abs() < 0.05 || (*v - 6.0).abs() < 0.05 {
                *v += 0.2;
            }
        }
        p
    };
    for op in ["Relu6Grad", "SoftplusGrad", "SeluGrad"] {
        let params = vec![away_from_kinks("dy"), away_from_kinks("x")];
        check_gradients(op, DType::Double, params, 1e-6, 1e-7, |g, p| {
            g.binary(op, &p[0], &p[1]).unwrap()
        });
    }
    let attrs = |spec: tessera::graph::NodeSpec| {
        spec.attr("strides", value::int_list(vec![1, 2, 1, 1]))
            .attr("dilations", value::int_list(vec![1, 1, 2, 1]))
            .attr("padding", value::string("SAME"))
    };
    // x [2, 5, 4, 3], filter [2, 3, 3, 2]: out_backprop [2, 3, 4, 6].
    let params = vec![
        param(&mut rng, "f", &[2, 3, 3, 2], -1.0, 1.0),
        param(&mut rng, "dy", &[2, 3, 4, 6], -1.0, 1.0),
    ];
    check_gradients(
        "DepthwiseConv2dNativeBackpropInput",
        DType::Double,
        params,
        1e-6,
        1e-7,
        |g, p| {
            let sizes = g.const_vec_i32("sizes", &[2, 5, 4, 3]).unwrap();
            g.add1(attrs(
                tessera::graph::NodeSpec::new("DepthwiseConv2dNativeBackpropInput")
                    .input(&sizes)
                    .input(&p[0])
                    .input(&p[1]),
            ))
            .unwrap()
        },
    );
    let params = vec![
        param(&mut rng, "x", &[2, 5, 4, 3], -1.0, 1.0),
        param(&mut rng, "dy", &[2, 3, 4, 6], -1.0, 1.0),
    ];
    check_gradients(
        "DepthwiseConv2dNativeBackpropFilter",
        DType::Double,
        params,
        1e-6,
        1e-7,
        |g, p| {
            let sizes = g.const_vec_i32("sizes", &[2, 3, 3, 2]).unwrap();
            g.add1(attrs(
                tessera::graph::NodeSpec::new("DepthwiseConv2dNativeBackpropFilter")
                    .input(&p[0])
                    .input(&sizes)
                    .input(&p[1]),
            ))
            .unwrap()
        },
    );
}
