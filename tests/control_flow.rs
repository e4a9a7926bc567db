//! Functional control flow: `If` and `StatelessIf` running branches from the graph's function
//! library, laid out as TensorFlow 2 writes them (`tf.cond` in a graph): function arguments by
//! name, node outputs as `node:output_arg:index`, `ret` naming what the function returns.

use tessera::client::Session;
use tessera::graph::attr::value;
use tessera::proto::op_def::ArgDef;
use tessera::proto::{
    attr_value, AttrValue, FunctionDef, FunctionDefLibrary, GraphDef, NameAttrList, NodeDef, OpDef,
};
use tessera::tensor::{DType, Tensor};
use tessera::Code;

mod kernels_support;

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

#[test]
fn if_runs_the_branch_its_condition_picks() {
    for op in ["If", "StatelessIf"] {
        let session = Session::local();
        session.extend(&graph(op, DType::Bool)).unwrap();
        assert_eq!(run(&session, Tensor::scalar(true)), vec![2.0, 4.0], "{op}");
        assert_eq!(run(&session, Tensor::scalar(false)), vec![1.0, 2.0], "{op}");
    }
}

#[test]
fn conditions_are_true_as_tensorflow_counts_them() {
    // A scalar is true when non-zero; any other tensor when it has elements.
    let session = Session::local();
    session.extend(&graph("If", DType::Int32)).unwrap();
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
    let session = Session::local();
    session.extend(&graph).unwrap();
    let step = |s: &Session| {
        let out = s.run(&[], &["global_step/cond:0"], &[]).unwrap();
        out[0].scalar_value::<i64>().unwrap()
    };
    // Not initialized: the else branch gives the initializer's value without a read.
    assert_eq!(step(&session), 0);
    let read = session.run(&[], &["global_step/Read/ReadVariableOp:0"], &[]);
    assert_eq!(read.unwrap_err().code(), Code::FailedPrecondition);

    session.run(&[], &[], &["init"]).unwrap();
    let x = Tensor::from_vec([4, 64], vec![0.5f32; 256]).unwrap();
    let y = Tensor::from_vec([4], vec![1i64, 2, 3, 4]).unwrap();
    for _ in 0..3 {
        let feeds = [("x:0", x.clone()), ("y:0", y.clone())];
        session.run(&feeds, &[], &["Adagrad"]).unwrap();
    }
    assert_eq!(step(&session), 3);
}
