//! TensorFlow 1's control flow in the executor, with tessera's real kernels: conditionals
//! (`Switch`/`Merge`, dead tensors through ordinary nodes and control edges), while loops
//! (`Enter`/`Merge`/`Switch`/`Exit`/`NextIteration` frames and iterations, loop invariants,
//! `parallel_iterations`, nested loops, a loop on an untaken branch) and a loop that never
//! ends, cut at the step's deadline. The graphs are laid out as `tf.compat.v1.cond` and
//! `tf.compat.v1.while_loop` write them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::v1_graph::{counting_loop, step, G};
use tessera::graph::attr::value;
use tessera::runtime::StepOptions;
use tessera::tensor::{DType, Tensor};
use tessera::Code;

fn f32_of(t: &Tensor) -> f32 {
    t.scalar_value::<f32>().unwrap()
}

/// `cond(pred, lambda: x + 10, lambda: reshape(x * 2, [7]))`: the false branch fails if run.
fn cond_graph() -> G {
    let mut g = G::default();
    g.placeholder("pred", DType::Bool);
    g.placeholder("x", DType::Float);
    g.f("cond/Switch", "Switch", &["x", "pred"]);
    g.f("cond/switch_t", "Identity", &["cond/Switch:1"]);
    g.f("cond/switch_f", "Identity", &["cond/Switch"]);
    g.constant("cond/ten", Tensor::scalar(10f32), &["cond/switch_t"]);
    g.f("cond/add", "Add", &["cond/switch_t", "cond/ten"]);
    g.constant("cond/two", Tensor::scalar(2f32), &["cond/switch_f"]);
    g.f("cond/mul", "Mul", &["cond/switch_f", "cond/two"]);
    g.constant(
        "cond/seven",
        Tensor::from_vec([1], vec![7i32]).unwrap(),
        &["cond/switch_f"],
    );
    g.op(
        "cond/bad_reshape",
        "Reshape",
        &["cond/mul", "cond/seven"],
        &[
            ("T", value::dtype(DType::Float)),
            ("Tshape", value::dtype(DType::Int32)),
        ],
    );
    g.merge("cond/Merge", &["cond/mul", "cond/add"]);
    // Runs after the false branch only: dead when the true branch is taken.
    g.f("after_false", "Identity", &["cond/mul"]);
    g
}

#[test]
fn a_cond_runs_only_the_taken_branch_and_merges_it() {
    let g = cond_graph();
    let out = g
        .run(
            &[("pred", Tensor::scalar(true)), ("x", Tensor::scalar(3f32))],
            &["cond/Merge:0", "cond/Merge:1"],
        )
        .unwrap();
    assert_eq!(f32_of(&out[0]), 13.0);
    assert_eq!(out[1].scalar_value::<i32>().unwrap(), 1);

    let out = g
        .run(
            &[("pred", Tensor::scalar(false)), ("x", Tensor::scalar(3f32))],
            &["cond/Merge:0", "cond/Merge:1"],
        )
        .unwrap();
    assert_eq!(f32_of(&out[0]), 6.0);
    assert_eq!(out[1].scalar_value::<i32>().unwrap(), 0);
}

#[test]
fn the_untaken_branch_never_runs_and_a_taken_failing_one_names_its_node() {
    let g = cond_graph();
    // The reshape would fail: with pred true it is dead and never runs.
    let feeds_true = [("pred", Tensor::scalar(true)), ("x", Tensor::scalar(3f32))];
    let out = g
        .run(&feeds_true, &["cond/Merge:0", "cond/bad_reshape:0"])
        .unwrap_err();
    // Its output was fetched, and it is dead: the fetch says so.
    assert_eq!(out.code(), Code::InvalidArgument);
    assert!(out.message().contains("cond/bad_reshape"), "{out}");
    assert!(out.message().contains("dead"), "{out}");

    let feeds_false = [("pred", Tensor::scalar(false)), ("x", Tensor::scalar(3f32))];
    let err = g.run(&feeds_false, &["cond/bad_reshape:0"]).unwrap_err();
    assert!(err.message().contains("`cond/bad_reshape`"), "{err}");
}

#[test]
fn deadness_flows_through_ordinary_nodes_and_control_edges() {
    let mut g = cond_graph();
    // A node whose only link to the false branch is a control edge is dead with it.
    g.constant("after_ctrl", Tensor::scalar(1f32), &["cond/mul"]);
    let feeds = [("pred", Tensor::scalar(true)), ("x", Tensor::scalar(3f32))];
    for fetch in ["after_false:0", "after_ctrl:0"] {
        let err = g.run(&feeds, &[fetch]).unwrap_err();
        assert!(err.message().contains("dead"), "{fetch}: {err}");
    }
    let feeds = [("pred", Tensor::scalar(false)), ("x", Tensor::scalar(3f32))];
    let out = g.run(&feeds, &["after_false:0", "after_ctrl:0"]).unwrap();
    assert_eq!(f32_of(&out[0]), 6.0);
    assert_eq!(f32_of(&out[1]), 1.0);
}

#[test]
fn a_merge_of_two_dead_inputs_is_dead_and_the_outer_merge_takes_the_live_branch() {
    let mut g = G::default();
    g.placeholder("p", DType::Bool);
    g.placeholder("q", DType::Bool);
    g.placeholder("x", DType::Float);
    g.f("outer/Switch", "Switch", &["x", "p"]);
    // Inside the true branch, a second cond on q.
    g.f("inner/Switch", "Switch", &["outer/Switch:1", "q"]);
    g.f("inner/neg", "Neg", &["inner/Switch"]);
    g.f("inner/square", "Square", &["inner/Switch:1"]);
    g.merge("inner/Merge", &["inner/neg", "inner/square"]);
    g.f("outer/false", "Identity", &["outer/Switch"]);
    g.merge("outer/Merge", &["outer/false", "inner/Merge"]);

    let run = |p: bool, q: bool, fetch: &str| {
        g.run(
            &[
                ("p", Tensor::scalar(p)),
                ("q", Tensor::scalar(q)),
                ("x", Tensor::scalar(3f32)),
            ],
            &[fetch],
        )
    };
    assert_eq!(f32_of(&run(true, true, "outer/Merge:0").unwrap()[0]), 9.0);
    assert_eq!(f32_of(&run(true, false, "outer/Merge:0").unwrap()[0]), -3.0);
    assert_eq!(f32_of(&run(false, true, "outer/Merge:0").unwrap()[0]), 3.0);
    // With p false both inputs of the inner Merge are dead, and so is the Merge.
    let err = run(false, true, "inner/Merge:0").unwrap_err();
    assert!(err.message().contains("dead"), "{err}");
}

fn loop_graph(parallel: i64) -> G {
    let mut g = G::default();
    g.placeholder("n", DType::Float);
    g.constant("zero", Tensor::scalar(0f32), &[]);
    g.constant("two", Tensor::scalar(2f32), &[]);
    counting_loop(&mut g, "while", "zero", "zero", "n", "two", parallel);
    g
}

#[test]
fn a_while_loop_iterates_with_its_invariants_until_its_condition_fails() {
    for parallel in [1, 10] {
        let g = loop_graph(parallel);
        let out = g
            .run(
                &[("n", Tensor::scalar(5f32))],
                &["while/Exit_i:0", "while/Exit_acc:0"],
            )
            .unwrap();
        assert_eq!(f32_of(&out[0]), 5.0, "parallel_iterations {parallel}");
        // 2 * (1 + 2 + 3 + 4 + 5)
        assert_eq!(f32_of(&out[1]), 30.0, "parallel_iterations {parallel}");
        // No iteration at all.
        let out = g
            .run(&[("n", Tensor::scalar(0f32))], &["while/Exit_acc:0"])
            .unwrap();
        assert_eq!(f32_of(&out[0]), 0.0);
    }
}

#[test]
fn many_iterations_under_parallel_iterations_give_the_same_answer_each_step() {
    let executor = loop_graph(4)
        .executor(&["n"], &["while/Exit_acc:0"])
        .unwrap();
    // The same executor, step after step (each step its own frames), and steps at once.
    let executor = Arc::new(executor);
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let executor = executor.clone();
            std::thread::spawn(move || {
                for _ in 0..5 {
                    let out = executor.run(vec![Tensor::scalar(300f32)], &step()).unwrap();
                    assert_eq!(f32_of(&out[0]), 300.0 * 301.0);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn nested_loops_run_an_inner_frame_per_outer_iteration() {
    // for i in 0..n: total += sum(2 * j for j in 1..=i)
    let mut g = G::default();
    g.placeholder("n", DType::Float);
    g.constant("zero", Tensor::scalar(0f32), &[]);
    g.constant("two", Tensor::scalar(2f32), &[]);
    let outer = "outer";
    let p = |s: &str| format!("{outer}/{s}");
    g.enter(&p("Enter_i"), "zero", outer, false, 10);
    g.enter(&p("Enter_total"), "zero", outer, false, 10);
    g.enter(&p("Enter_n"), "n", outer, true, 10);
    g.enter(&p("Enter_two"), "two", outer, true, 10);
    g.merge(&p("Merge_i"), &[&p("Enter_i"), &p("NextIteration_i")]);
    g.merge(
        &p("Merge_total"),
        &[&p("Enter_total"), &p("NextIteration_total")],
    );
    g.f(&p("Less"), "Less", &[&p("Merge_i"), &p("Enter_n")]);
    g.op(&p("LoopCond"), "LoopCond", &[&p("Less")], &[]);
    g.f(&p("Switch_i"), "Switch", &[&p("Merge_i"), &p("LoopCond")]);
    g.f(
        &p("Switch_total"),
        "Switch",
        &[&p("Merge_total"), &p("LoopCond")],
    );
    g.f(
        &p("Identity_i"),
        "Identity",
        &[&format!("{}:1", p("Switch_i"))],
    );
    g.f(
        &p("Identity_total"),
        "Identity",
        &[&format!("{}:1", p("Switch_total"))],
    );
    g.constant(&p("zero_in"), Tensor::scalar(0f32), &[&p("Identity_i")]);
    // The inner loop counts j up to i (a value of the outer iteration).
    counting_loop(
        &mut g,
        "outer/inner",
        &p("zero_in"),
        &p("zero_in"),
        &p("Identity_i"),
        &p("Enter_two"),
        10,
    );
    g.f(
        &p("add_total"),
        "Add",
        &[&p("Identity_total"), "outer/inner/Exit_acc"],
    );
    g.constant(&p("one"), Tensor::scalar(1f32), &[&p("Identity_i")]);
    g.f(&p("add_i"), "Add", &[&p("Identity_i"), &p("one")]);
    g.f(&p("NextIteration_i"), "NextIteration", &[&p("add_i")]);
    g.f(
        &p("NextIteration_total"),
        "NextIteration",
        &[&p("add_total")],
    );
    g.f(&p("Exit_total"), "Exit", &[&p("Switch_total")]);

    let out = g
        .run(&[("n", Tensor::scalar(4f32))], &["outer/Exit_total:0"])
        .unwrap();
    // i = 0..3: inner sums 0, 2, 6, 12
    assert_eq!(f32_of(&out[0]), 20.0);
}

#[test]
fn a_loop_on_an_untaken_branch_is_dead_and_does_not_hold_the_step() {
    let mut g = G::default();
    g.placeholder("pred", DType::Bool);
    g.placeholder("n", DType::Float);
    g.f("cond/Switch", "Switch", &["n", "pred"]);
    g.f("cond/t", "Identity", &["cond/Switch:1"]);
    g.f("cond/f", "Identity", &["cond/Switch"]);
    g.constant("cond/zero", Tensor::scalar(0f32), &["cond/t"]);
    g.constant("cond/two", Tensor::scalar(2f32), &["cond/t"]);
    counting_loop(
        &mut g,
        "cond/while",
        "cond/zero",
        "cond/zero",
        "cond/t",
        "cond/two",
        10,
    );
    g.merge("cond/Merge", &["cond/f", "cond/while/Exit_acc"]);

    let taken = g
        .run(
            &[("pred", Tensor::scalar(true)), ("n", Tensor::scalar(3f32))],
            &["cond/Merge:0"],
        )
        .unwrap();
    assert_eq!(f32_of(&taken[0]), 12.0);
    let untaken = g
        .run(
            &[("pred", Tensor::scalar(false)), ("n", Tensor::scalar(3f32))],
            &["cond/Merge:0"],
        )
        .unwrap();
    assert_eq!(f32_of(&untaken[0]), 3.0);
}

#[test]
fn a_loop_that_never_ends_is_cut_at_the_deadline_naming_its_frame() {
    let mut g = G::default();
    g.constant("zero", Tensor::scalar(0f32), &[]);
    g.constant("one", Tensor::scalar(1f32), &[]);
    g.enter("endless/Enter", "zero", "endless", false, 10);
    g.enter("endless/Enter_one", "one", "endless", true, 10);
    g.merge("endless/Merge", &["endless/Enter", "endless/NextIteration"]);
    // i < i + 1 holds forever.
    g.f(
        "endless/plus",
        "Add",
        &["endless/Merge", "endless/Enter_one"],
    );
    g.f("endless/Less", "Less", &["endless/Merge", "endless/plus"]);
    g.op("endless/LoopCond", "LoopCond", &["endless/Less"], &[]);
    g.f(
        "endless/Switch",
        "Switch",
        &["endless/Merge", "endless/LoopCond"],
    );
    g.f("endless/body", "Identity", &["endless/Switch:1"]);
    g.f("endless/NextIteration", "NextIteration", &["endless/body"]);
    g.f("endless/Exit", "Exit", &["endless/Switch"]);

    let executor = g.executor(&[], &["endless/Exit:0"]).unwrap();
    let options = StepOptions {
        step_id: 7,
        deadline: Some(Instant::now() + Duration::from_millis(300)),
        ..Default::default()
    };
    let started = Instant::now();
    let err = executor.run(vec![], &options).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(err.message().contains("`endless`"), "{err}");
}

#[test]
fn a_value_inside_a_loop_cannot_be_fetched_and_a_loop_value_must_enter_it() {
    let g = loop_graph(10);
    let err = g.executor(&["n"], &["while/add_i:0"]).err().unwrap();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("`while`"), "{err}");

    // A body node reading a root-frame tensor without an Enter.
    let mut g = loop_graph(10);
    g.f("while/stray", "Add", &["while/Identity_i", "two"]);
    let err = g
        .executor_with_targets(&["n"], &["while/Exit_i:0"], &["while/stray"])
        .err()
        .unwrap();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("while/stray"), "{err}");
}

/// A reader of a reference variable runs after an update it depends on and sees its value
/// (SyncReplicasOptimizer's tokens read the global step this way after the increment).
#[test]
fn a_ref_reader_after_an_update_sees_the_updated_value() {
    let mut g = G {
        on: Some(std::sync::Arc::new(tessera::runtime::Device::local_cpu())),
        ..G::default()
    };
    g.op(
        "v",
        "VariableV2",
        &[],
        &[
            ("dtype", value::dtype(DType::Float)),
            (
                "shape",
                value::shape(&tessera::tensor::PartialShape::new(vec![])),
            ),
        ],
    );
    g.constant("zero", Tensor::scalar(0f32), &[]);
    g.constant("one", Tensor::scalar(1f32), &[]);
    g.f("init", "Assign", &["v", "zero"]);
    g.f("inc", "AssignAdd", &["v", "one"]);
    g.constant("dims", Tensor::from_vec([1], vec![2i32]).unwrap(), &[]);
    // Read through the variable's `read` Identity, which runs before the increment.
    g.f("v/read", "Identity", &["v"]);
    g.op(
        "tokens",
        "Fill",
        &["dims", "v/read", "^inc"],
        &[("T", value::dtype(DType::Float))],
    );
    g.run(&[], &["init:0"]).unwrap();
    for want in [1f32, 2.0, 3.0] {
        let out = g.run(&[], &["tokens:0"]).unwrap();
        assert_eq!(out[0].values::<f32>().unwrap().as_ref(), &[want, want]);
    }
}
