//! Symbolic gradients: the backward graph's structure (node names as TensorFlow gives them,
//! checked against the graph TensorFlow 2.21 built for the same model), unreachable and
//! stopped paths, and numeric checks against central finite differences.

use crate::support;

use std::collections::BTreeSet;
use std::path::PathBuf;

use prost::Message;
use tessera::graph::{gradients, gradients_with, GradientOptions, Graph, NodeSpec, Output};
use tessera::proto::GraphDef;
use tessera::tensor::{DType, PartialShape, Tensor};

fn golden(name: &str) -> GraphDef {
    let dir = std::env::var("TESSERA_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            let beside = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/golden");
            if beside.is_dir() {
                beside
            } else {
                PathBuf::from("/work/shared/golden")
            }
        });
    let bytes = std::fs::read(dir.join(format!("{name}.pb"))).expect("golden graph");
    GraphDef::decode(bytes.as_slice()).expect("decodes")
}

fn ph(g: &mut Graph, name: &str, dtype: DType, dims: Vec<Option<usize>>) -> Output {
    g.placeholder(name, dtype, PartialShape::new(dims)).unwrap()
}

fn zeros(g: &mut Graph, dims: &[usize]) -> Output {
    g.constant(&Tensor::zeros(DType::Float, dims.to_vec()).unwrap())
        .unwrap()
}

/// Builds the golden MLP (x [?,64] -> relu(x w1 + b1) -> w2 + b2 -> sparse xent -> mean) and
/// its gradients with respect to the four variables.
fn mlp(gate_gradients: bool) -> (Graph, Vec<Option<Output>>) {
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Float, vec![None, Some(64)]);
    let y = ph(&mut g, "y", DType::Int64, vec![None]);
    let mut vars = Vec::new();
    for (name, dims) in [
        ("w1", vec![64, 32]),
        ("b1", vec![32]),
        ("w2", vec![32, 10]),
        ("b2", vec![10]),
    ] {
        let init = g.with_name_scope(&format!("{name}/Initializer"), |g| zeros(g, &dims));
        vars.push(g.variable(name, &init).unwrap());
    }
    let read = |g: &mut Graph, scope: &str, v: &tessera::graph::Variable| {
        g.with_name_scope(&format!("{scope}/"), |g| g.read_variable(&v.handle))
            .unwrap()
    };
    let r = read(&mut g, "MatMul", &vars[0]);
    let mm = g.matmul(&x, &r).unwrap();
    let r = read(&mut g, "add", &vars[1]);
    let add = g.add(&mm, &r).unwrap();
    let hidden = g
        .add1(NodeSpec::new("Relu").name("hidden").input(&add))
        .unwrap();
    let r = read(&mut g, "MatMul_1", &vars[2]);
    let mm1 = g.matmul(&hidden, &r).unwrap();
    let r = read(&mut g, "logits", &vars[3]);
    let logits = g
        .add1(NodeSpec::new("AddV2").name("logits").input(&mm1).input(&r))
        .unwrap();
    let xent = g
        .with_name_scope("SparseSoftmaxCrossEntropyWithLogits", |g| {
            g.sparse_softmax_cross_entropy(&logits, &y)
        })
        .unwrap()
        .0;
    let axes = g.const_vec_i32("Const", &[0]).unwrap();
    let loss = g
        .add1(NodeSpec::new("Mean").name("loss").input(&xent).input(&axes))
        .unwrap();
    let handles: Vec<Output> = vars.iter().map(|v| v.handle.clone()).collect();
    let options = GradientOptions { gate_gradients };
    let grads = gradients_with(&mut g, &[loss], &handles, None, &options).unwrap();
    (g, grads)
}

fn names_under(
    nodes: impl Iterator<Item = (String, String)>,
    prefix: &str,
) -> BTreeSet<(String, String)> {
    nodes
        .filter(|(n, _)| n.starts_with(prefix) && !n.contains("/tuple/"))
        .collect()
}

#[test]
fn mlp_backward_graph_matches_tensorflow_names() {
    let (g, grads) = mlp(false);
    let ours = names_under(
        g.nodes().iter().map(|n| (n.name.clone(), n.op.clone())),
        "gradients/",
    );
    // TensorFlow's optimizer adds tuple/group_deps + control_dependency gates; tf.gradients
    // itself does not, so those are left out of the comparison.
    let theirs = names_under(
        golden("graph")
            .node
            .iter()
            .map(|n| (n.name.clone(), n.op.clone())),
        "gradients/",
    );
    let missing: Vec<_> = theirs.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&theirs).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}\nextra {extra:?}"
    );
    let names: Vec<String> = grads.iter().map(|o| o.as_ref().unwrap().name()).collect();
    assert_eq!(
        names,
        [
            "gradients/MatMul_grad/MatMul_1:0",
            "gradients/add_grad/Reshape:0",
            "gradients/MatMul_1_grad/MatMul_1:0",
            "gradients/logits_grad/Reshape:0"
        ]
    );
    let shapes: Vec<String> = grads
        .iter()
        .map(|o| o.as_ref().unwrap().shape.to_string())
        .collect();
    assert_eq!(shapes, ["[64,32]", "[32]", "[32,10]", "[10]"]);
}

#[test]
fn backward_nodes_read_the_forward_values_tensorflow_reads() {
    let (g, _) = mlp(false);
    let inputs = |n: &str| g.node(n).unwrap().input.clone();
    assert_eq!(
        inputs("gradients/hidden_grad/ReluGrad"),
        ["gradients/MatMul_1_grad/MatMul", "hidden"]
    );
    assert_eq!(
        inputs("gradients/MatMul_grad/MatMul_1"),
        ["x", "gradients/hidden_grad/ReluGrad"]
    );
    assert_eq!(
        inputs("gradients/grad_ys_0"),
        ["gradients/Shape", "gradients/grad_ys_0/Const"]
    );
    assert_eq!(
        inputs("gradients/zeros_like"),
        ["SparseSoftmaxCrossEntropyWithLogits/SparseSoftmaxCrossEntropyWithLogits:1"]
    );
    let mm = g.node("gradients/MatMul_grad/MatMul").unwrap();
    assert!(tessera::graph::attr::bool_or(mm, "transpose_b", false).unwrap());
}

/// With `gate_gradients` (what TensorFlow's optimizers pass), the backward graph is node for
/// node the one in the golden graph: same names, ops and inputs, `tuple/` gates included.
#[test]
fn gated_mlp_backward_graph_equals_tensorflows() {
    let (g, grads) = mlp(true);
    let key = |n: &tessera::proto::NodeDef| (n.name.clone(), n.op.clone(), n.input.clone());
    let ours: BTreeSet<_> = g
        .nodes()
        .iter()
        .filter(|n| n.name.starts_with("gradients/"))
        .map(key)
        .collect();
    let golden = golden("graph");
    let theirs: BTreeSet<_> = golden
        .node
        .iter()
        .filter(|n| n.name.starts_with("gradients/"))
        .map(key)
        .collect();
    let missing: Vec<_> = theirs.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&theirs).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}\nextra {extra:?}"
    );
    // The gradients handed back are the gated ones the Adagrad updates read.
    assert_eq!(
        grads[0].as_ref().unwrap().node,
        "gradients/MatMul_grad/tuple/control_dependency_1"
    );
    let co = g
        .node("gradients/add_grad/tuple/control_dependency")
        .unwrap();
    let class = tessera::graph::attr::string_list(co, "_class").unwrap();
    assert_eq!(class, ["loc:@gradients/hidden_grad/ReluGrad"]);
}

#[test]
fn fan_out_is_summed_with_addn() {
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Float, vec![Some(3)]);
    let a = g.unary("Exp", &x).unwrap();
    let b = g.unary("Tanh", &x).unwrap();
    let s = g.add(&a, &b).unwrap();
    let gx = gradients(&mut g, &[s], &[x], None)
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(gx.node, "gradients/AddN");
    assert_eq!(g.node("gradients/AddN").unwrap().input.len(), 2);
}

#[test]
fn unreachable_and_stopped_paths_give_none() {
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Float, vec![Some(2)]);
    let z = ph(&mut g, "z", DType::Float, vec![Some(2)]);
    let stopped = g.stop_gradient(&x).unwrap();
    let y = g.mul(&stopped, &x).unwrap();
    let unrelated = g.unary("Exp", &z).unwrap();
    let out = gradients(&mut g, &[y], &[x.clone(), z.clone()], None).unwrap();
    // Only the path through `mul`'s second input remains: d/dx = stop(x) * 1.
    let gx = out[0].as_ref().unwrap();
    assert_eq!(gx.node, "gradients/mul_grad/Mul_1");
    assert_eq!(
        g.node(&gx.node).unwrap().input,
        ["StopGradient", "gradients/grad_ys_0"]
    );
    assert!(out[1].is_none(), "z does not reach y");
    let _ = unrelated;
    // Nothing in the gradient graph comes from the StopGradient side.
    assert!(g
        .nodes()
        .iter()
        .all(|n| !n.name.starts_with("gradients/StopGradient_grad")));
    // Integer-valued ops do not propagate.
    let shape = g.shape(&x).unwrap();
    let f = g.cast(&shape, DType::Float).unwrap();
    let total = g.sum(&f, &[0], false).unwrap();
    let out = gradients(&mut g, &[total], &[x], None).unwrap();
    assert!(out[0].is_none());
}

#[test]
fn missing_gradient_and_bad_ys_are_errors() {
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Float, vec![Some(2)]);
    let r = g.reshape_to(&x, &[1, 2]).unwrap();
    let bg = g.add1(NodeSpec::new("BiasAddGrad").input(&r)).unwrap();
    let err = gradients(&mut g, &[bg], std::slice::from_ref(&x), None).unwrap_err();
    assert!(err.message().contains("BiasAddGrad"), "{err}");
    let i = ph(&mut g, "i", DType::Int32, vec![Some(2)]);
    assert!(gradients(&mut g, &[i], &[x], None).is_err());
}

#[test]
fn second_gradients_call_gets_its_own_scope() {
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Float, vec![Some(2)]);
    let y = g.unary("Square", &x).unwrap();
    let g1 = gradients(
        &mut g,
        std::slice::from_ref(&y),
        std::slice::from_ref(&x),
        None,
    )
    .unwrap()
    .remove(0)
    .unwrap();
    let g2 = gradients(&mut g, &[y], &[x], None)
        .unwrap()
        .remove(0)
        .unwrap();
    assert!(g1.node.starts_with("gradients/Square_grad/"), "{}", g1.node);
    assert!(
        g2.node.starts_with("gradients_1/Square_grad/"),
        "{}",
        g2.node
    );
}

/// One gradient-descent step on `mean((x w + b - y)^2)` from w = 0, b = 0, worked by hand:
/// dL/dw = (2/N) xᵀ(pred - y) = -(2/4) [50, 60] and dL/db = -(2/4) * 10, so with lr 0.1 the
/// step leaves w = [2.5, 3.0] and b = 0.5. Later steps (lr 0.01) keep lowering the loss.
#[test]
fn training_step_applies_the_symbolic_gradient() {
    use tessera::client::Session;
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Float, vec![None, Some(2)]);
    let y = ph(&mut g, "y", DType::Float, vec![None, Some(1)]);
    let w0 = zeros(&mut g, &[2, 1]);
    let w = g.variable("w", &w0).unwrap();
    let b0 = zeros(&mut g, &[1]);
    let b = g.variable("b", &b0).unwrap();
    let wr = g.read_variable(&w.handle).unwrap();
    let br = g.read_variable(&b.handle).unwrap();
    let xw = g.matmul(&x, &wr).unwrap();
    let pred = g.add(&xw, &br).unwrap();
    let err = g.sub(&pred, &y).unwrap();
    let sq = g.unary("Square", &err).unwrap();
    let loss = g.mean(&sq, &[0, 1], false).unwrap();
    let handles = [w.handle.clone(), b.handle.clone()];
    let grads = gradients(&mut g, std::slice::from_ref(&loss), &handles, None).unwrap();
    let lr = ph(&mut g, "lr", DType::Float, vec![]);
    let mut updates = Vec::new();
    for (h, gr) in handles.iter().zip(&grads) {
        updates.push(
            g.apply_gradient_descent(h, &lr, gr.as_ref().unwrap())
                .unwrap(),
        );
    }
    let refs: Vec<&str> = updates.iter().map(String::as_str).collect();
    let train = g.group("train", &refs).unwrap();
    let init = g.global_variables_initializer().unwrap();

    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    session.run(&[], &[], &[&init]).unwrap();
    let xv = Tensor::from_vec([4, 2], vec![1.0f32, 2., 3., 4., 5., 6., 7., 8.]).unwrap();
    let yv = Tensor::from_vec([4, 1], vec![1.0f32, 2., 3., 4.]).unwrap();
    let feeds = |rate: f32| {
        vec![
            ("x:0", xv.clone()),
            ("y:0", yv.clone()),
            ("lr:0", Tensor::scalar(rate)),
        ]
    };
    session.run(&feeds(0.1), &[], &[&train]).unwrap();
    let out = session
        .run(&[], &[&w.value.name(), &b.value.name()], &[])
        .unwrap();
    let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5);
    assert!(
        close(&out[0].values::<f32>().unwrap(), &[2.5, 3.0]),
        "{:?}",
        out[0]
    );
    assert!(
        close(&out[1].values::<f32>().unwrap(), &[0.5]),
        "{:?}",
        out[1]
    );
    let loss_at = |session: &Session| {
        session.run(&feeds(0.0), &[&loss.name()], &[]).unwrap()[0]
            .scalar_value::<f32>()
            .unwrap()
    };
    let before = loss_at(&session);
    for _ in 0..20 {
        session.run(&feeds(0.01), &[], &[&train]).unwrap();
    }
    let after = loss_at(&session);
    assert!(after < before / 10.0, "loss went from {before} to {after}");
}

/// Numeric checks of every gradient function: the symbolic gradient of
/// `L = sum(op(x...) * W)` (`W` fixed weights, so every output element counts differently)
/// run through `Session::local()` against central differences
/// `(L(x + h e_j) - L(x - h e_j)) / 2h` computed by running the forward graph, in float64.
mod finite_differences {
    use super::support::finite_differences::{
        check, check_tol, inp, positive, unknown_batch, Build,
    };
    use tessera::client::Session;
    use tessera::graph::{gradients, Graph, NodeSpec, Output};
    use tessera::tensor::{DType, Tensor};

    fn c(g: &mut Graph, v: &[i64]) -> Output {
        g.const_vec_i32("Const", v).unwrap()
    }

    #[test]
    fn element_wise_binary_ops() {
        for op in [
            "AddV2", "Add", "Sub", "Mul", "RealDiv", "Maximum", "Minimum",
        ] {
            check(op, vec![positive(&[2, 3]), positive(&[3])], &|g, x| {
                g.binary(op, &x[0], &x[1])
            });
            check(
                &format!("{op} [2,1] vs [3]"),
                vec![positive(&[2, 1]), positive(&[3])],
                &|g, x| g.binary(op, &x[0], &x[1]),
            );
            check(
                &format!("{op} run-time shapes"),
                vec![unknown_batch(&[2, 3]), unknown_batch(&[1, 3])],
                &|g, x| g.binary(op, &x[0], &x[1]),
            );
        }
        check("Pow", vec![positive(&[2, 3]), inp(&[2, 3])], &|g, x| {
            g.binary("Pow", &x[0], &x[1])
        });
    }

    #[test]
    fn element_wise_unary_ops() {
        for op in [
            "Identity",
            "Neg",
            "Square",
            "Sqrt",
            "Rsqrt",
            "Exp",
            "Log",
            "Reciprocal",
            "Sigmoid",
            "Tanh",
            "Relu",
            "Abs",
        ] {
            let input = if matches!(op, "Sqrt" | "Rsqrt" | "Log" | "Reciprocal") {
                positive(&[2, 3])
            } else {
                inp(&[2, 3])
            };
            check(op, vec![input], &|g, x| g.unary(op, &x[0]));
        }
        check("L2Loss", vec![inp(&[2, 3])], &|g, x| {
            g.unary("L2Loss", &x[0])
        });
        check(
            "AddN",
            vec![inp(&[2, 2]), inp(&[2, 2]), inp(&[2, 2])],
            &|g, x| g.add_n(x),
        );
        // Through float32: steps below its resolution would measure rounding, not slope.
        let through_f32: &Build<'_> = &|g, x| {
            let f = g.cast(&x[0], DType::Float)?;
            g.cast(&f, DType::Double)
        };
        check_tol("Cast", vec![inp(&[3])], through_f32, 1e-3, 1e-3);
    }

    #[test]
    fn matrix_products() {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let a = if ta { [3, 2] } else { [2, 3] };
            let b = if tb { [4, 3] } else { [3, 4] };
            check(
                &format!("MatMul {ta} {tb}"),
                vec![inp(&a), inp(&b)],
                &|g, x| g.matmul_t(&x[0], &x[1], ta, tb),
            );
        }
        for (ax, ay) in [(false, false), (true, false), (false, true), (true, true)] {
            let a = if ax { [2, 3, 2] } else { [2, 2, 3] };
            let b = if ay { [4, 3] } else { [3, 4] };
            check(
                &format!("BatchMatMulV2 {ax} {ay}"),
                vec![inp(&a), inp(&b)],
                &|g, x| g.batch_matmul(&x[0], &x[1], ax, ay),
            );
        }
    }

    #[test]
    fn nn_ops() {
        check("BiasAdd", vec![inp(&[2, 3]), inp(&[3])], &|g, x| {
            g.bias_add(&x[0], &x[1])
        });
        check("Softmax", vec![inp(&[2, 3])], &|g, x| g.softmax(&x[0]));
        check("LogSoftmax", vec![inp(&[2, 3])], &|g, x| {
            g.unary("LogSoftmax", &x[0])
        });
        // Labels must be distributions (rows summing to 1) for the op's backprop to be the gradient.
        check(
            "SoftmaxCrossEntropyWithLogits",
            vec![inp(&[2, 3]), inp(&[2, 3])],
            &|g, x| {
                let labels = g.softmax(&x[1])?;
                Ok(g.softmax_cross_entropy(&x[0], &labels)?.0)
            },
        );
        check(
            "SparseSoftmaxCrossEntropyWithLogits",
            vec![unknown_batch(&[3, 4])],
            &|g, x| {
                let labels = g.constant(&Tensor::from_vec([3], vec![1i64, 0, 3]).unwrap())?;
                Ok(g.sparse_softmax_cross_entropy(&x[0], &labels)?.0)
            },
        );
    }

    #[test]
    fn reductions() {
        for op in ["Sum", "Mean", "Max", "Min", "Prod"] {
            check(&format!("{op} axis 1"), vec![positive(&[2, 3])], &|g, x| {
                g.reduce_axes(op, &x[0], &[1], false)
            });
            check(&format!("{op} keep"), vec![positive(&[2, 3])], &|g, x| {
                g.reduce_axes(op, &x[0], &[0], true)
            });
            check(
                &format!("{op} all, run-time shape"),
                vec![unknown_batch(&[2, 3])],
                &|g, x| g.reduce_axes(op, &x[0], &[0, 1], false),
            );
            check(
                &format!("{op} axis 0, run-time shape"),
                vec![unknown_batch(&[2, 3])],
                &|g, x| g.reduce_axes(op, &x[0], &[0], false),
            );
        }
    }

    #[test]
    fn shape_and_layout_ops() {
        check("Reshape", vec![inp(&[2, 3])], &|g, x| {
            g.reshape_to(&x[0], &[3, 2])
        });
        check("ExpandDims", vec![inp(&[2, 3])], &|g, x| {
            g.expand_dims(&x[0], 1)
        });
        check("Squeeze", vec![inp(&[2, 1, 3])], &|g, x| {
            g.squeeze(&x[0], &[1])
        });
        check("Transpose", vec![inp(&[2, 3, 4])], &|g, x| {
            g.transpose(&x[0], &[2, 0, 1])
        });
        check("ConcatV2", vec![inp(&[2, 3]), inp(&[2, 1])], &|g, x| {
            g.concat(x, 1)
        });
        check(
            "ConcatV2 run-time shapes",
            vec![unknown_batch(&[2, 3]), unknown_batch(&[1, 3])],
            &|g, x| g.concat(x, 0),
        );
        check("Pack", vec![inp(&[2, 3]), inp(&[2, 3])], &|g, x| {
            g.pack(x, 1)
        });
        check("Unpack", vec![inp(&[3, 2])], &|g, x| {
            let parts = g.unpack(&x[0], 3, 0)?;
            let two = g.scalar("Const", DType::Double, 2.0)?;
            let p2 = g.mul(&parts[2], &two)?;
            g.add(&parts[0], &p2)
        });
        check("Tile", vec![inp(&[2, 3])], &|g, x| {
            let m = c(g, &[2, 1]);
            g.tile(&x[0], &m)
        });
        check("BroadcastTo", vec![inp(&[1, 3])], &|g, x| {
            let s = c(g, &[2, 3]);
            g.broadcast_to(&x[0], &s)
        });
    }

    #[test]
    fn slicing_and_gathering() {
        check("Slice", vec![inp(&[3, 4])], &|g, x| {
            let (b, s) = (c(g, &[1, 1]), c(g, &[2, -1]));
            g.slice(&x[0], &b, &s)
        });
        check("StridedSlice", vec![inp(&[3, 4])], &|g, x| {
            let (b, e, s) = (c(g, &[1, 0]), c(g, &[3, 2]), c(g, &[1, 1]));
            g.add1(
                NodeSpec::new("StridedSlice")
                    .input(&x[0])
                    .input(&b)
                    .input(&e)
                    .input(&s)
                    .attr("shrink_axis_mask", tessera::graph::attr::value::int(0)),
            )
        });
        check("StridedSlice shrink", vec![inp(&[3, 4])], &|g, x| {
            let (b, e, s) = (c(g, &[1, 0]), c(g, &[2, 0]), c(g, &[1, 1]));
            g.add1(
                NodeSpec::new("StridedSlice")
                    .input(&x[0])
                    .input(&b)
                    .input(&e)
                    .input(&s)
                    .attr("shrink_axis_mask", tessera::graph::attr::value::int(1))
                    .attr("end_mask", tessera::graph::attr::value::int(2)),
            )
        });
        check("GatherV2", vec![inp(&[4, 3])], &|g, x| {
            let idx = g.constant(&Tensor::from_vec([3], vec![2i32, 0, 2]).unwrap())?;
            g.gather(&x[0], &idx, 0)
        });
    }

    #[test]
    fn selection_ops() {
        check("Select", vec![inp(&[2, 3]), inp(&[2, 3])], &|g, x| {
            let cond = g.binary("Greater", &x[0], &x[1])?;
            g.select(&cond, &x[0], &x[1], false)
        });
        check("SelectV2", vec![inp(&[2, 3]), inp(&[3])], &|g, x| {
            let cond = g.constant(&Tensor::from_vec([2, 1], vec![true, false]).unwrap())?;
            g.select(&cond, &x[0], &x[1], true)
        });
    }

    #[test]
    fn variables_get_the_gradient_of_their_reads() {
        // d/dw sum((w r1) + w * w) through two reads of one variable, at w = 0.5..: checked by
        // hand: d/dw = 1 + 2w per element, summed over both reads.
        let mut g = Graph::new();
        let init = g
            .constant(&Tensor::from_vec([2], vec![0.5f64, -1.5]).unwrap())
            .unwrap();
        let v = g.variable("w", &init).unwrap();
        let r1 = g.read_variable(&v.handle).unwrap();
        let r2 = g.read_variable(&v.handle).unwrap();
        let sq = g.mul(&r1, &r2).unwrap();
        let s = g.add(&r1, &sq).unwrap();
        let loss = g.sum(&s, &[0], false).unwrap();
        let gw = gradients(&mut g, &[loss], std::slice::from_ref(&v.handle), None)
            .unwrap()
            .remove(0)
            .unwrap();
        let init_op = g.global_variables_initializer().unwrap();
        let session = Session::local();
        session.extend(&g.to_graph_def()).unwrap();
        session.run(&[], &[], &[&init_op]).unwrap();
        let out = session.run(&[], &[&gw.name()], &[]).unwrap();
        assert_eq!(out[0].values::<f64>().unwrap().as_ref(), &[2.0, -2.0]);
    }
}
