//! Functional control flow: `If`/`StatelessIf`, `While` and `StatefulPartitionedCall` running
//! functions from the graph's function library, laid out as TensorFlow 2 writes them (`tf.cond`
//! in a graph): function arguments by name, node outputs as `node:output_arg:index`, `ret`
//! naming what the function returns. Each graph runs as it is (the functional kernels) and
//! after `lower_functional_ops` (v1 control flow in the executor), with the same answers.

use tessera::client::Session;
use tessera::graph::attr::value;
use tessera::graph::lower::lower_functional_ops;
use tessera::proto::op_def::ArgDef;
use tessera::proto::{
    attr_value, AttrValue, FunctionDef, FunctionDefLibrary, GraphDef, NameAttrList, NodeDef, OpDef,
};
use tessera::tensor::{DType, Tensor};
use tessera::Code;

use crate::kernels_support;

fn node(name: &str, op: &str, inputs: &[&str], attrs: &[(&str, AttrValue)]) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        attr: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        ..Default::default()
    }
}

fn func(name: &str) -> AttrValue {
    AttrValue {
        value: Some(attr_value::Value::Func(NameAttrList {
            name: name.into(),
            ..Default::default()
        })),
    }
}

fn float_arg(name: &str) -> ArgDef {
    ArgDef {
        name: name.into(),
        r#type: DType::Float.to_proto() as i32,
        ..Default::default()
    }
}

/// A function of one float argument `x` returning `y` = what `ret` names, with `nodes`.
fn function(name: &str, nodes: Vec<NodeDef>, ret: &str) -> FunctionDef {
    FunctionDef {
        signature: Some(OpDef {
            name: name.into(),
            input_arg: vec![float_arg("x")],
            output_arg: vec![float_arg("y")],
            ..Default::default()
        }),
        node_def: nodes,
        ret: [("y".to_string(), ret.to_string())].into(),
        ..Default::default()
    }
}

fn float_t() -> (&'static str, AttrValue) {
    ("T", value::dtype(DType::Float))
}

/// `out = If(cond, x)` with x = [1, 2]: then 2·x (a Const and a Mul inside the function, the
/// Mul's control input on the Const), else the argument itself (no nodes).
fn graph(op: &str, cond_dtype: DType) -> GraphDef {
    let two = Tensor::scalar(2.0f32).to_proto();
    let double = function(
        "double",
        vec![
            node(
                "two",
                "Const",
                &[],
                &[
                    ("dtype", value::dtype(DType::Float)),
                    ("value", value::tensor(two)),
                ],
            ),
            node("mul", "Mul", &["x", "two:output:0", "^two"], &[float_t()]),
        ],
        "mul:z:0",
    );
    let same = function("same", vec![], "x");
    let x = Tensor::from_vec([2], vec![1.0f32, 2.0]).unwrap().to_proto();
    GraphDef {
        node: vec![
            node(
                "cond",
                "Placeholder",
                &[],
                &[("dtype", value::dtype(cond_dtype))],
            ),
            node(
                "x",
                "Const",
                &[],
                &[
                    ("dtype", value::dtype(DType::Float)),
                    ("value", value::tensor(x)),
                ],
            ),
            node(
                "out",
                op,
                &["cond", "x"],
                &[
                    ("Tcond", value::dtype(cond_dtype)),
                    ("Tin", value::dtype_list(&[DType::Float])),
                    ("Tout", value::dtype_list(&[DType::Float])),
                    ("then_branch", func("double")),
                    ("else_branch", func("same")),
                ],
            ),
        ],
        library: Some(FunctionDefLibrary {
            function: vec![double, same],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn run(session: &Session, cond: Tensor) -> Vec<f32> {
    let out = session.run(&[("cond:0", cond)], &["out:0"], &[]).unwrap();
    out[0].values::<f32>().unwrap().into_owned()
}

/// Two sessions holding `graph`: as it is, and lowered to v1 control flow.
fn sessions(graph: &GraphDef) -> [(&'static str, Session); 2] {
    let functional = Session::local();
    functional.extend(graph).unwrap();
    let lowered = Session::local();
    lowered
        .extend(&lower_functional_ops(graph).unwrap())
        .unwrap();
    [("functional", functional), ("lowered", lowered)]
}

#[test]
fn if_runs_the_branch_its_condition_picks() {
    for op in ["If", "StatelessIf"] {
        for (mode, session) in sessions(&graph(op, DType::Bool)) {
            assert_eq!(
                run(&session, Tensor::scalar(true)),
                vec![2.0, 4.0],
                "{op} {mode}"
            );
            assert_eq!(
                run(&session, Tensor::scalar(false)),
                vec![1.0, 2.0],
                "{op} {mode}"
            );
        }
    }
}

#[test]
fn conditions_are_true_as_tensorflow_counts_them() {
    // A scalar is true when non-zero; any other tensor when it has elements. v1 `Switch`
    // takes a bool only, so lowering leaves this If to its kernel.
    let g = graph("If", DType::Int32);
    let lowered = lower_functional_ops(&g).unwrap();
    assert!(lowered.node.iter().any(|n| n.name == "out" && n.op == "If"));
    let session = Session::local();
    session.extend(&lowered).unwrap();
    assert_eq!(run(&session, Tensor::scalar(3i32)), vec![2.0, 4.0]);
    assert_eq!(run(&session, Tensor::scalar(0i32)), vec![1.0, 2.0]);
    assert_eq!(
        run(&session, Tensor::from_vec([1], vec![0i32]).unwrap()),
        vec![2.0, 4.0]
    );
    let empty = Tensor::from_vec([0], Vec::<i32>::new()).unwrap();
    assert_eq!(run(&session, empty), vec![1.0, 2.0]);
}

#[test]
fn a_branch_missing_from_the_library_is_named() {
    let mut g = graph("If", DType::Bool);
    g.library.as_mut().unwrap().function.remove(0);
    let session = Session::local();
    session.extend(&g).unwrap();
    let err = session
        .run(&[("cond:0", Tensor::scalar(true))], &["out:0"], &[])
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    for part in ["`out`", "then_branch `double`", "function library"] {
        assert!(err.message().contains(part), "{part}: {err}");
    }
}

#[test]
fn a_function_naming_an_unknown_output_is_refused_naming_it() {
    let mut g = graph("If", DType::Bool);
    let double = &mut g.library.as_mut().unwrap().function[0];
    double.ret.insert("y".into(), "mul:product:0".into());
    let session = Session::local();
    session.extend(&g).unwrap();
    let err = session
        .run(&[("cond:0", Tensor::scalar(false))], &["out:0"], &[])
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("function `double`"), "{err}");
    assert!(err.message().contains("no output `product`"), "{err}");
}

/// TensorFlow's own `global_step/cond` (golden `graph_monitored.pb`, written by TensorFlow
/// 2.21 for a MonitoredTrainingSession): the initial value while the global step is not
/// initialized, the variable once it is, through training steps.
#[test]
fn tensorflows_global_step_cond_reads_the_step_once_it_is_initialized() {
    let graph: GraphDef = kernels_support::golden("graph_monitored.pb");
    for (mode, session) in sessions(&graph) {
        global_step_cond_reads_the_step(session, mode);
    }
}

fn global_step_cond_reads_the_step(session: Session, mode: &str) {
    let step = |s: &Session| {
        let out = s.run(&[], &["global_step/cond:0"], &[]).unwrap();
        out[0].scalar_value::<i64>().unwrap()
    };
    // Not initialized: the else branch gives the initializer's value without a read.
    assert_eq!(step(&session), 0, "{mode}");
    let read = session.run(&[], &["global_step/Read/ReadVariableOp:0"], &[]);
    assert_eq!(read.unwrap_err().code(), Code::FailedPrecondition, "{mode}");

    session.run(&[], &[], &["init"]).unwrap();
    let x = Tensor::from_vec([4, 64], vec![0.5f32; 256]).unwrap();
    let y = Tensor::from_vec([4], vec![1i64, 2, 3, 4]).unwrap();
    for _ in 0..3 {
        let feeds = [("x:0", x.clone()), ("y:0", y.clone())];
        session.run(&feeds, &[], &["Adagrad"]).unwrap();
    }
    assert_eq!(step(&session), 3, "{mode}");
}

fn arg(name: &str, dtype: DType) -> ArgDef {
    ArgDef {
        name: name.into(),
        r#type: dtype.to_proto() as i32,
        ..Default::default()
    }
}

/// A function with typed arguments and results, `ret` and `control_ret` given as pairs.
fn typed_function(
    name: &str,
    args: &[(&str, DType)],
    results: &[(&str, DType)],
    nodes: Vec<NodeDef>,
    ret: &[(&str, &str)],
    control_ret: &[(&str, &str)],
) -> FunctionDef {
    let pairs = |p: &[(&str, &str)]| {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    FunctionDef {
        signature: Some(OpDef {
            name: name.into(),
            input_arg: args.iter().map(|(n, t)| arg(n, *t)).collect(),
            output_arg: results.iter().map(|(n, t)| arg(n, *t)).collect(),
            ..Default::default()
        }),
        node_def: nodes,
        ret: pairs(ret),
        control_ret: pairs(control_ret),
        ..Default::default()
    }
}

fn constant(name: &str, t: Tensor) -> NodeDef {
    node(
        name,
        "Const",
        &[],
        &[
            ("dtype", value::dtype(t.dtype())),
            ("value", value::tensor(t.to_proto())),
        ],
    )
}

fn int_t() -> (&'static str, AttrValue) {
    ("T", value::dtype(DType::Int32))
}

/// `loop = While(0, 0, n)` over (k, acc, n): `k += 1; acc += k` while `k < n`, so
/// `loop:1` = 1 + 2 + ... + n; and `countdown = While(n, 0)` over (k, acc): `acc += k;
/// k -= 1` while `k` (an int32 condition, true while non-zero): the same sum.
fn sum_graph() -> GraphDef {
    let i32s = |names: &[&'static str]| -> Vec<(&'static str, DType)> {
        names.iter().map(|n| (*n, DType::Int32)).collect()
    };
    let less = typed_function(
        "k_less_than_n",
        &i32s(&["k", "acc", "n"]),
        &[("c", DType::Bool)],
        vec![node("less", "Less", &["k", "n"], &[int_t()])],
        &[("c", "less:z:0")],
        &[],
    );
    let step = typed_function(
        "add_next",
        &i32s(&["k", "acc", "n"]),
        &i32s(&["k1", "acc1", "n1"]),
        vec![
            constant("one", Tensor::scalar(1i32)),
            node("next", "AddV2", &["k", "one:output:0"], &[int_t()]),
            node("sum", "AddV2", &["acc", "next:z:0"], &[int_t()]),
        ],
        &[("k1", "next:z:0"), ("acc1", "sum:z:0"), ("n1", "n")],
        &[],
    );
    let nonzero = typed_function(
        "k_itself",
        &i32s(&["k", "acc"]),
        &[("c", DType::Int32)],
        vec![],
        &[("c", "k")],
        &[],
    );
    let down = typed_function(
        "add_and_count_down",
        &i32s(&["k", "acc"]),
        &i32s(&["k1", "acc1"]),
        vec![
            constant("one", Tensor::scalar(1i32)),
            node("sum", "AddV2", &["acc", "k"], &[int_t()]),
            node("less", "Sub", &["k", "one:output:0"], &[int_t()]),
        ],
        &[("k1", "less:z:0"), ("acc1", "sum:z:0")],
        &[],
    );
    let t = |n: usize| ("T", value::dtype_list(&vec![DType::Int32; n]));
    GraphDef {
        node: vec![
            node(
                "n",
                "Placeholder",
                &[],
                &[("dtype", value::dtype(DType::Int32))],
            ),
            constant("zero", Tensor::scalar(0i32)),
            node(
                "loop",
                "While",
                &["zero", "zero", "n"],
                &[
                    t(3),
                    ("cond", func("k_less_than_n")),
                    ("body", func("add_next")),
                    ("parallel_iterations", value::int(4)),
                ],
            ),
            node(
                "countdown",
                "StatelessWhile",
                &["n", "zero"],
                &[
                    t(2),
                    ("cond", func("k_itself")),
                    ("body", func("add_and_count_down")),
                ],
            ),
        ],
        library: Some(FunctionDefLibrary {
            function: vec![less, step, nonzero, down],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn a_while_sums_one_to_n_and_an_int_condition_counts_down_by_tensorflows_truth_rule() {
    let g = sum_graph();
    let lowered = lower_functional_ops(&g).unwrap();
    // The bool loop becomes the frame `loop` with its parallel_iterations; the int-condition
    // loop stays functional (v1 `LoopCond` takes a bool).
    let enters: Vec<&NodeDef> = lowered.node.iter().filter(|n| n.op == "Enter").collect();
    assert_eq!(enters.len(), 3);
    for enter in enters {
        assert_eq!(
            enter.attr["frame_name"],
            value::string("loop"),
            "{}",
            enter.name
        );
        assert_eq!(enter.attr["parallel_iterations"], value::int(4));
    }
    assert!(lowered
        .node
        .iter()
        .any(|n| n.name == "countdown" && n.op == "StatelessWhile"));
    for (mode, session) in sessions(&g) {
        for n in [0i32, 1, 2, 100] {
            let out = session
                .run(
                    &[("n:0", Tensor::scalar(n))],
                    &["loop:0", "loop:1", "loop:2", "countdown:1"],
                    &[],
                )
                .unwrap();
            let v: Vec<i32> = out.iter().map(|t| t.scalar_value().unwrap()).collect();
            let sum = n * (n + 1) / 2;
            assert_eq!(v, [n, sum, n, sum], "n = {n}, {mode}");
        }
    }
}

/// A variable `v` set to 5 by `init`; `call` = StatefulPartitionedCall(2, v) after `init`,
/// whose function adds its argument to the variable (a `control_ret`, no output depends on
/// it) and returns 3 times it; `after` reads `v` after `call`.
fn call_graph() -> GraphDef {
    let float = DType::Float;
    let add_then_triple = typed_function(
        "add_then_triple",
        &[("x", float), ("h", DType::Resource)],
        &[("y", float)],
        vec![
            node(
                "add",
                "AssignAddVariableOp",
                &["h", "x"],
                &[("dtype", value::dtype(float))],
            ),
            constant("three", Tensor::scalar(3f32)),
            node("mul", "Mul", &["x", "three:output:0"], &[float_t()]),
        ],
        &[("y", "mul:z:0")],
        &[("add", "add")],
    );
    let var_attrs = [
        ("dtype", value::dtype(float)),
        (
            "shape",
            value::shape(&tessera::tensor::PartialShape::new(vec![])),
        ),
        ("shared_name", value::string("v")),
    ];
    GraphDef {
        node: vec![
            node("v", "VarHandleOp", &[], &var_attrs),
            constant("five", Tensor::scalar(5f32)),
            node(
                "init",
                "AssignVariableOp",
                &["v", "five"],
                &[("dtype", value::dtype(float))],
            ),
            constant("two", Tensor::scalar(2f32)),
            node(
                "call",
                "StatefulPartitionedCall",
                &["two", "v", "^init"],
                &[
                    ("Tin", value::dtype_list(&[float, DType::Resource])),
                    ("Tout", value::dtype_list(&[float])),
                    ("f", func("add_then_triple")),
                ],
            ),
            node(
                "after",
                "ReadVariableOp",
                &["v", "^call"],
                &[("dtype", value::dtype(float))],
            ),
        ],
        library: Some(FunctionDefLibrary {
            function: vec![add_then_triple],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn a_call_runs_after_its_control_inputs_and_before_its_control_successors() {
    let g = call_graph();
    let lowered = lower_functional_ops(&g).unwrap();
    assert!(!lowered
        .node
        .iter()
        .any(|n| n.op == "StatefulPartitionedCall"));
    for (mode, session) in sessions(&g) {
        // Fetching `after` alone runs init (5), then the call's side effect (+2), then reads.
        for _ in 0..2 {
            let out = session.run(&[], &["after:0"], &[]).unwrap();
            assert_eq!(out[0].scalar_value::<f32>().unwrap(), 7.0, "{mode}");
        }
        let out = session.run(&[], &["call:0", "after:0"], &[]).unwrap();
        assert_eq!(out[0].scalar_value::<f32>().unwrap(), 6.0, "{mode}");
        assert_eq!(out[1].scalar_value::<f32>().unwrap(), 7.0, "{mode}");
    }
}

#[test]
fn lowered_nodes_take_the_device_of_the_op_and_inlined_ones_keep_their_own() {
    let worker = "/job:worker/replica:0/task:1/device:CPU:0";
    let mut g = graph("If", DType::Bool);
    g.node[2].device = worker.into();
    let double = &mut g.library.as_mut().unwrap().function[0];
    double.node_def[0].device = "/job:ps/task:0".into();
    let lowered = lower_functional_ops(&g).unwrap();
    let device = |name: &str| {
        lowered
            .node
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node `{name}`"))
            .device
            .clone()
    };
    for name in [
        "out",
        "out/switch_pred",
        "out/pivot_t",
        "out/switch_0",
        "out/then/input/_0",
        "out/then/mul",
        "out/output_0",
        "out/branch_executed",
    ] {
        assert_eq!(device(name), worker, "{name}");
    }
    // The function's `two` asked for the ps: it keeps the ps, the rest comes from the If.
    assert_eq!(
        device("out/then/two"),
        "/job:ps/replica:0/task:0/device:CPU:0"
    );
    // The body's constant is gated on the branch's pivot, its control input kept.
    let two = lowered
        .node
        .iter()
        .find(|n| n.name == "out/then/two")
        .unwrap();
    assert_eq!(two.input, ["^out/then/input_control_node"]);
    let mul = lowered
        .node
        .iter()
        .find(|n| n.name == "out/then/mul")
        .unwrap();
    assert_eq!(
        mul.input,
        ["out/then/input/_0", "out/then/two", "^out/then/two"]
    );
}

#[test]
fn a_function_that_calls_itself_is_refused_naming_it() {
    let f = typed_function(
        "forever_calls",
        &[("x", DType::Float)],
        &[("y", DType::Float)],
        vec![node(
            "again",
            "PartitionedCall",
            &["x"],
            &[
                ("Tin", value::dtype_list(&[DType::Float])),
                ("Tout", value::dtype_list(&[DType::Float])),
                ("f", func("forever_calls")),
            ],
        )],
        &[("y", "again:output:0")],
        &[],
    );
    let g = GraphDef {
        node: vec![
            constant("x", Tensor::scalar(1f32)),
            node(
                "call",
                "PartitionedCall",
                &["x"],
                &[
                    ("Tin", value::dtype_list(&[DType::Float])),
                    ("Tout", value::dtype_list(&[DType::Float])),
                    ("f", func("forever_calls")),
                ],
            ),
        ],
        library: Some(FunctionDefLibrary {
            function: vec![f],
            ..Default::default()
        }),
        ..Default::default()
    };
    let err = lower_functional_ops(&g).unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
    assert!(
        err.message().contains("`forever_calls` calls itself"),
        "{err}"
    );
    let session = Session::local();
    session.extend(&g).unwrap();
    let err = session.run(&[], &["call:0"], &[]).unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
    assert!(err.message().contains("`call`"), "{err}");
}

#[test]
fn a_function_body_passes_a_reference_variable_to_ref_inputs_and_values_elsewhere() {
    // f(x): var = VariableV2; Assign(var, x); AssignAdd(that ref, x); y = Identity(that ref):
    // the assignments take the reference, the Identity its value, 2x.
    let float = DType::Float;
    let scalar = tessera::tensor::PartialShape::new(vec![]);
    let f = typed_function(
        "set_and_double",
        &[("x", float)],
        &[("y", float)],
        vec![
            node(
                "var",
                "VariableV2",
                &[],
                &[
                    ("dtype", value::dtype(float)),
                    ("shape", value::shape(&scalar)),
                    ("shared_name", value::string("in_function")),
                ],
            ),
            node("set", "Assign", &["var:ref:0", "x"], &[float_t()]),
            node(
                "bump",
                "AssignAdd",
                &["set:output_ref:0", "x"],
                &[float_t()],
            ),
            node("y", "Identity", &["bump:output_ref:0"], &[float_t()]),
        ],
        &[("y", "y:output:0")],
        &[],
    );
    let g = GraphDef {
        node: vec![
            node("x", "Placeholder", &[], &[("dtype", value::dtype(float))]),
            node(
                "call",
                "StatefulPartitionedCall",
                &["x"],
                &[
                    ("Tin", value::dtype_list(&[float])),
                    ("Tout", value::dtype_list(&[float])),
                    ("f", func("set_and_double")),
                ],
            ),
        ],
        library: Some(FunctionDefLibrary {
            function: vec![f],
            ..Default::default()
        }),
        ..Default::default()
    };
    for (mode, session) in sessions(&g) {
        for x in [3f32, -1.5] {
            let out = session
                .run(&[("x:0", Tensor::scalar(x))], &["call:0"], &[])
                .unwrap_or_else(|e| panic!("{mode}: {e}"));
            assert_eq!(out[0].scalar_value::<f32>().unwrap(), 2.0 * x, "{mode}");
        }
    }
}
