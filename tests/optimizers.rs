//! Optimizers built into the graph and run through `Session::local()`: each update rule
//! against the same steps worked out in f64 with TensorFlow's formulas (loss = sum(w * c), so
//! the gradient is `c` every step), the names and colocation of slots, the global step, and
//! a small regression that GradientDescent and Adam fit.

use tessera::client::Session;
use tessera::graph::{attr, replica_device_setter, Graph, Output, Variable};
use tessera::tensor::{DType, Shape, Tensor};
use tessera::train::optimizer::{get_or_create_global_step, Algorithm, Optimizer, GLOBAL_STEP};
use tessera::Code;

const W0: [f32; 3] = [1.0, -2.0, 0.5];
const C: [f32; 3] = [0.5, -1.5, 2.0];

fn vec_const(g: &mut Graph, v: &[f32]) -> Output {
    g.constant(&Tensor::from_vec(Shape::new(vec![v.len()]), v.to_vec()).unwrap())
        .unwrap()
}

/// A graph with `w = W0` and `loss = sum(w * C)`, trained by `opt` with a global step.
struct Fixture {
    sess: Session,
    train: String,
}

impl Fixture {
    fn new(opt: &Optimizer) -> Self {
        let mut g = Graph::new();
        let init = vec_const(&mut g, &W0);
        let w = g.variable("w", &init).unwrap();
        let c = vec_const(&mut g, &C);
        let prod = g.mul(&w.value, &c).unwrap();
        let loss = g.sum(&prod, &[0], false).unwrap();
        let step = get_or_create_global_step(&mut g).unwrap();
        let train = opt.minimize(&mut g, &loss, Some(&step)).unwrap();
        let init = g.global_variables_initializer().unwrap();
        let sess = Session::local();
        sess.extend(&g.to_graph_def()).unwrap();
        sess.run(&[], &[], &[&init]).unwrap();
        Fixture { sess, train }
    }

    fn step(&self) {
        self.sess.run(&[], &[], &[&self.train]).unwrap();
    }

    fn read(&self, tensor: &str) -> Vec<f64> {
        let t = &self.sess.run(&[], &[tensor], &[]).unwrap()[0];
        match t.dtype() {
            DType::Int64 => t
                .values::<i64>()
                .unwrap()
                .iter()
                .map(|&v| v as f64)
                .collect(),
            _ => t
                .values::<f32>()
                .unwrap()
                .iter()
                .map(|&v| v as f64)
                .collect(),
        }
    }

    fn w(&self) -> Vec<f64> {
        self.read("w/Read/ReadVariableOp:0")
    }
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{what}: got {got:?}, want {want:?}"
        );
    }
}

fn w0() -> Vec<f64> {
    W0.iter().map(|&v| v as f64).collect()
}

fn c() -> Vec<f64> {
    C.iter().map(|&v| v as f64).collect()
}

#[test]
fn gradient_descent_subtracts_lr_times_grad() {
    let f = Fixture::new(&Optimizer::gradient_descent(0.1));
    assert_eq!(f.train, "GradientDescent");
    f.step();
    let want: Vec<f64> = w0().iter().zip(c()).map(|(w, c)| w - 0.1 * c).collect();
    assert_close(&f.w(), &want, "w after one step");
}

#[test]
fn momentum_accumulates_over_steps_plain_and_nesterov() {
    for nesterov in [false, true] {
        let (lr, mu) = (0.1, 0.9);
        let f = Fixture::new(&Optimizer::momentum(lr, mu, nesterov));
        let (mut w, mut accum) = (w0(), vec![0.0; 3]);
        for step in 1..=3 {
            f.step();
            for i in 0..3 {
                let g = c()[i];
                accum[i] = accum[i] * mu + g;
                w[i] -= if nesterov {
                    lr * g + lr * mu * accum[i]
                } else {
                    lr * accum[i]
                };
            }
            assert_close(&f.w(), &w, &format!("w, step {step}, nesterov {nesterov}"));
            assert_close(&f.read("w/Momentum/Read/ReadVariableOp:0"), &accum, "accum");
        }
    }
}

#[test]
fn adagrad_divides_by_root_of_accumulated_squares() {
    let lr = 0.5;
    let f = Fixture::new(&Optimizer::adagrad(lr));
    let (mut w, mut accum) = (w0(), vec![0.1; 3]);
    for step in 1..=2 {
        f.step();
        for i in 0..3 {
            let g = c()[i];
            accum[i] += g * g;
            w[i] -= lr * g / accum[i].sqrt();
        }
        assert_close(&f.w(), &w, &format!("w, step {step}"));
        assert_close(&f.read("w/Adagrad/Read/ReadVariableOp:0"), &accum, "accum");
    }
}

#[test]
fn adam_moments_and_powers_evolve_as_in_tensorflow() {
    let (lr, b1, b2, eps): (f64, f64, f64, f64) = (0.01, 0.9, 0.999, 1e-8);
    let f = Fixture::new(&Optimizer::adam(lr));
    let (mut w, mut m, mut v) = (w0(), vec![0.0; 3], vec![0.0; 3]);
    let (mut b1p, mut b2p) = (b1, b2);
    for step in 1..=3 {
        f.step();
        let lr_t = lr * (1.0 - b2p).sqrt() / (1.0 - b1p);
        for i in 0..3 {
            let g = c()[i];
            m[i] += (g - m[i]) * (1.0 - b1);
            v[i] += (g * g - v[i]) * (1.0 - b2);
            w[i] -= lr_t * m[i] / (v[i].sqrt() + eps);
        }
        b1p *= b1;
        b2p *= b2;
        assert_close(&f.w(), &w, &format!("w, step {step}"));
        assert_close(&f.read("w/Adam/Read/ReadVariableOp:0"), &m, "m");
        assert_close(&f.read("w/Adam_1/Read/ReadVariableOp:0"), &v, "v");
        assert_close(
            &f.read("beta1_power/Read/ReadVariableOp:0"),
            &[b1p],
            "beta1_power",
        );
        assert_close(
            &f.read("beta2_power/Read/ReadVariableOp:0"),
            &[b2p],
            "beta2_power",
        );
    }
}

#[test]
fn rmsprop_plain_and_centered() {
    for centered in [false, true] {
        let (lr, rho, mu, eps) = (0.01, 0.9, 0.5, 1e-10);
        let opt = Optimizer::new(
            Algorithm::RmsProp {
                decay: rho,
                momentum: mu,
                epsilon: eps,
                centered,
            },
            lr,
        );
        let f = Fixture::new(&opt);
        let (mut w, mut ms, mut mg, mut mom) = (w0(), vec![1.0; 3], vec![0.0; 3], vec![0.0; 3]);
        for step in 1..=3 {
            f.step();
            for i in 0..3 {
                let g = c()[i];
                ms[i] += (g * g - ms[i]) * (1.0 - rho);
                let denom = if centered {
                    mg[i] += (g - mg[i]) * (1.0 - rho);
                    ms[i] - mg[i] * mg[i] + eps
                } else {
                    ms[i] + eps
                };
                mom[i] = mom[i] * mu + lr * g / denom.sqrt();
                w[i] -= mom[i];
            }
            assert_close(&f.w(), &w, &format!("w, step {step}, centered {centered}"));
            // rms is the first slot; momentum the last (RMSProp_1, or RMSProp_2 centered).
            assert_close(&f.read("w/RMSProp/Read/ReadVariableOp:0"), &ms, "ms");
            let mom_slot = if centered {
                "w/RMSProp_2"
            } else {
                "w/RMSProp_1"
            };
            assert_close(
                &f.read(&format!("{mom_slot}/Read/ReadVariableOp:0")),
                &mom,
                "mom",
            );
            if centered {
                assert_close(&f.read("w/RMSProp_1/Read/ReadVariableOp:0"), &mg, "mg");
            }
        }
    }
}

#[test]
fn global_step_counts_steps_once_each() {
    let f = Fixture::new(&Optimizer::adagrad(0.1));
    assert_eq!(f.read("global_step/Read/ReadVariableOp:0"), [0.0]);
    for _ in 0..3 {
        f.step();
    }
    assert_eq!(f.read("global_step/Read/ReadVariableOp:0"), [3.0]);
}

/// Builds w1 [4, 2] and b1 [2] under replica_device_setter(2 ps), a loss over both, and
/// minimizes it with `opt`.
fn placed_graph(opt: &Optimizer) -> (Graph, String) {
    let mut g = Graph::new();
    let setter = replica_device_setter(2, "/job:worker/task:0").unwrap();
    let train = g.with_device_fn(setter, |g| {
        let step = get_or_create_global_step(g).unwrap();
        let x = g
            .placeholder("x", DType::Float, Shape::new(vec![3, 4]).into())
            .unwrap();
        let w_init = g
            .constant(&Tensor::from_vec(Shape::new(vec![4, 2]), vec![0.1f32; 8]).unwrap())
            .unwrap();
        let w1 = g.variable("w1", &w_init).unwrap();
        let b_init = vec_const(g, &[0.0, 0.0]);
        let b1 = g.variable("b1", &b_init).unwrap();
        let h = g.matmul(&x, &w1.value).unwrap();
        let h = g.add(&h, &b1.value).unwrap();
        let loss = g.sum(&h, &[0, 1], false).unwrap();
        let train = opt.minimize(g, &loss, Some(&step)).unwrap();
        g.global_variables_initializer().unwrap();
        train
    });
    (g, train)
}

fn class_of(g: &Graph, name: &str) -> Vec<String> {
    let node = g.node(name).unwrap_or_else(|| panic!("no node `{name}`"));
    attr::string_list(node, "_class").unwrap_or_default()
}

fn device_of(g: &Graph, name: &str) -> String {
    g.node(name)
        .unwrap_or_else(|| panic!("no node `{name}`"))
        .device
        .clone()
}

#[test]
fn slots_are_named_as_tensorflow_names_them_and_live_with_their_variable() {
    let cases: [(Optimizer, &[&str], &str); 5] = [
        (
            Optimizer::gradient_descent(0.1),
            &[],
            "ResourceApplyGradientDescent",
        ),
        (
            Optimizer::momentum(0.1, 0.9, false),
            &["Momentum"],
            "ResourceApplyMomentum",
        ),
        (
            Optimizer::adagrad(0.1),
            &["Adagrad"],
            "ResourceApplyAdagrad",
        ),
        (
            Optimizer::adam(0.1),
            &["Adam", "Adam_1"],
            "ResourceApplyAdam",
        ),
        (
            Optimizer::rms_prop(0.1),
            &["RMSProp", "RMSProp_1"],
            "ResourceApplyRMSProp",
        ),
    ];
    for (opt, slots, apply) in cases {
        let (g, train) = placed_graph(&opt);
        let name = opt.name();
        assert_eq!(train, name);
        // global_step went to ps0, w1 to ps1, b1 to ps0 (round robin in creation order).
        assert_eq!(device_of(&g, GLOBAL_STEP), "/job:ps/task:0");
        assert_eq!(device_of(&g, "w1"), "/job:ps/task:1");
        assert_eq!(device_of(&g, "b1"), "/job:ps/task:0");
        for var in ["w1", "b1"] {
            for slot in slots {
                let slot = format!("{var}/{slot}");
                assert_eq!(g.node(&slot).unwrap().op, "VarHandleOp", "{slot}");
                assert_eq!(class_of(&g, &slot), [format!("loc:@{var}")], "{slot}");
                assert_eq!(device_of(&g, &slot), device_of(&g, var), "{slot}");
                assert!(g.node(&format!("{slot}/Assign")).is_some(), "{slot}");
                // The global initializer runs the slot's initializer.
                let init = g.node("init").unwrap();
                assert!(init.input.contains(&format!("^{slot}/Assign")), "{slot}");
            }
            let update = format!("{name}/update_{var}/{apply}");
            let node = g.node(&update).unwrap_or_else(|| panic!("no `{update}`"));
            assert_eq!(node.input[0], var);
            for (i, slot) in slots.iter().enumerate() {
                assert_eq!(node.input[1 + i], format!("{var}/{slot}"));
            }
            assert_eq!(class_of(&g, &update), [format!("loc:@{var}")]);
            assert_eq!(device_of(&g, &update), device_of(&g, var));
        }
        // The train op adds 1 to the global step after the per-device groups of updates.
        let train_node = g.node(name).unwrap();
        assert_eq!(train_node.op, "AssignAddVariableOp");
        assert_eq!(train_node.input[0], GLOBAL_STEP);
        assert_eq!(class_of(&g, name), ["loc:@global_step"]);
        let one = g.node(&train_node.input[1]).unwrap();
        assert_eq!(one.input, [format!("^{name}/update")]);
        let update = g.node(&format!("{name}/update")).unwrap();
        assert_eq!(
            update.input,
            [
                format!("^{name}/update/NoOp"),
                format!("^{name}/update/NoOp_1")
            ]
        );
        assert_eq!(
            device_of(&g, &format!("{name}/update/NoOp")),
            "/job:ps/task:0"
        );
        assert_eq!(
            device_of(&g, &format!("{name}/update/NoOp_1")),
            "/job:ps/task:1"
        );
        if name != "GradientDescent" {
            assert_eq!(
                g.node(&format!("{name}/learning_rate")).unwrap().op,
                "Const"
            );
        }
    }
}

#[test]
fn adam_power_accumulators_live_with_the_first_variable_by_name() {
    let (g, _) = placed_graph(&Optimizer::adam(0.1));
    // "b1" < "w1": the accumulators go with b1, on ps0.
    for p in ["beta1_power", "beta2_power"] {
        assert_eq!(class_of(&g, p), ["loc:@b1"]);
        assert_eq!(device_of(&g, p), "/job:ps/task:0");
    }
}

#[test]
fn without_a_global_step_the_train_op_is_a_group_named_after_the_optimizer() {
    let mut g = Graph::new();
    let init = vec_const(&mut g, &W0);
    let w = g.variable("w", &init).unwrap();
    let loss = g.sum(&w.value, &[0], false).unwrap();
    let train = Optimizer::gradient_descent(0.5)
        .minimize(&mut g, &loss, None)
        .unwrap();
    assert_eq!(train, "GradientDescent");
    let node = g.node(&train).unwrap();
    assert_eq!(node.op, "NoOp");
    assert_eq!(
        node.input,
        ["^GradientDescent/update_w/ResourceApplyGradientDescent"]
    );
    // A second optimizer gets its own scope.
    let again = Optimizer::gradient_descent(0.5)
        .minimize(&mut g, &loss, None)
        .unwrap();
    assert_eq!(again, "GradientDescent_1");
}

#[test]
fn learning_rate_can_be_a_tensor_of_the_graph() {
    let mut g = Graph::new();
    let init = vec_const(&mut g, &W0);
    let w = g.variable("w", &init).unwrap();
    let coef = vec_const(&mut g, &C);
    let prod = g.mul(&w.value, &coef).unwrap();
    let loss = g.sum(&prod, &[0], false).unwrap();
    let lr = g
        .placeholder("lr", DType::Float, Shape::new(vec![]).into())
        .unwrap();
    let train = Optimizer::gradient_descent(&lr)
        .minimize(&mut g, &loss, None)
        .unwrap();
    let init = g.global_variables_initializer().unwrap();
    let sess = Session::local();
    sess.extend(&g.to_graph_def()).unwrap();
    sess.run(&[], &[], &[&init]).unwrap();
    sess.run(&[("lr", Tensor::scalar(0.25f32))], &[], &[&train])
        .unwrap();
    let got = sess.run(&[], &["w/Read/ReadVariableOp:0"], &[]).unwrap();
    let got: Vec<f64> = got[0]
        .values::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    let want: Vec<f64> = w0().iter().zip(c()).map(|(w, c)| w - 0.25 * c).collect();
    assert_close(&got, &want, "w after a step at lr 0.25");
}

/// y = 2 x0 - 3 x1 + 1 on 8 points; a linear model fits it.
fn regression(opt: &Optimizer, steps: usize) -> (f32, f32) {
    let xs: Vec<f32> = (0..16).map(|i| ((i * 7 % 11) as f32 - 5.0) / 5.0).collect();
    let ys: Vec<f32> = xs
        .chunks(2)
        .map(|p| 2.0 * p[0] - 3.0 * p[1] + 1.0)
        .collect();
    let mut g = Graph::new();
    let x = g
        .constant(&Tensor::from_vec(Shape::new(vec![8, 2]), xs).unwrap())
        .unwrap();
    let y = g
        .constant(&Tensor::from_vec(Shape::new(vec![8, 1]), ys).unwrap())
        .unwrap();
    let w_init = g
        .constant(&Tensor::from_vec(Shape::new(vec![2, 1]), vec![0.0f32; 2]).unwrap())
        .unwrap();
    let w: Variable = g.variable("w", &w_init).unwrap();
    let b_init = vec_const(&mut g, &[0.0]);
    let b = g.variable("b", &b_init).unwrap();
    let pred = g.matmul(&x, &w.value).unwrap();
    let pred = g.add(&pred, &b.value).unwrap();
    let err = g.sub(&pred, &y).unwrap();
    let sq = g.mul(&err, &err).unwrap();
    let loss = g.mean(&sq, &[0, 1], false).unwrap();
    let step = get_or_create_global_step(&mut g).unwrap();
    let train = opt.minimize(&mut g, &loss, Some(&step)).unwrap();
    let init = g.global_variables_initializer().unwrap();
    let sess = Session::local();
    sess.extend(&g.to_graph_def()).unwrap();
    sess.run(&[], &[], &[&init]).unwrap();
    let loss_of = |s: &Session| {
        s.run(&[], &[&loss.name()], &[]).unwrap()[0]
            .scalar_value::<f32>()
            .unwrap()
    };
    let first = loss_of(&sess);
    for _ in 0..steps {
        sess.run(&[], &[], &[&train]).unwrap();
    }
    (first, loss_of(&sess))
}

#[test]
fn minimize_fits_a_small_regression() {
    for (opt, steps) in [
        (Optimizer::gradient_descent(0.1), 200),
        (Optimizer::adam(0.1), 300),
        (Optimizer::momentum(0.05, 0.9, true), 200),
    ] {
        let (first, last) = regression(&opt, steps);
        assert!(
            last < first * 1e-3,
            "{}: loss went from {first} to {last}",
            opt.name()
        );
    }
}

#[test]
fn a_loss_that_ignores_the_variables_is_an_error() {
    let mut g = Graph::new();
    let init = vec_const(&mut g, &W0);
    g.variable("w", &init).unwrap();
    let other = vec_const(&mut g, &C);
    let loss = g.sum(&other, &[0], false).unwrap();
    let err = Optimizer::adam(0.1)
        .minimize(&mut g, &loss, None)
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("No gradients") && err.message().contains('w'),
        "{err}"
    );
}

#[test]
fn unknown_optimizer_names_list_the_known_ones() {
    let err = Optimizer::from_name("adamw", 0.1).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("`adamw`") && err.message().contains("rmsprop"),
        "{err}"
    );
    assert_eq!(Optimizer::from_name("Adam", 0.1).unwrap().name(), "Adam");
}

#[test]
fn an_uninitialized_slot_is_failed_precondition_naming_it() {
    let mut g = Graph::new();
    let init = vec_const(&mut g, &W0);
    let w = g.variable("w", &init).unwrap();
    let loss = g.sum(&w.value, &[0], false).unwrap();
    let train = Optimizer::momentum(0.1, 0.9, false)
        .minimize(&mut g, &loss, None)
        .unwrap();
    let sess = Session::local();
    sess.extend(&g.to_graph_def()).unwrap();
    // Only the variable is initialized, not its slot.
    sess.run(&[], &[], &[&w.initializer]).unwrap();
    let err = sess.run(&[], &[], &[&train]).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("w/Momentum"), "{err}");
}

/// An embedding table read through row gathers trains sparsely under `minimize`: the update
/// ops are the sparse ones (`ResourceScatterAdd` for gradient descent, `ResourceSparseApply*`
/// for the others), the rows the batch read move exactly as a dense update moves them, and
/// every other row is left as it was, and so are its Adagrad accumulators.
#[test]
fn an_embedding_table_trains_only_the_rows_a_step_read() {
    use tessera::graph::VariableKind;

    const ROWS: usize = 50;
    type Make = fn() -> Optimizer;
    let optimizers: [(&str, Make); 4] = [
        ("ResourceScatterAdd", || Optimizer::gradient_descent(0.1)),
        ("ResourceSparseApplyAdagrad", || Optimizer::adagrad(0.1)),
        ("ResourceSparseApplyMomentum", || {
            Optimizer::momentum(0.1, 0.9, false)
        }),
        ("ResourceSparseApplyRMSProp", || Optimizer::rms_prop(0.1)),
    ];
    for (op, make) in optimizers {
        // Two copies of one table: `sparse` trains through `minimize`, `dense` through the
        // dense gradient of the same loss.
        let mut g = Graph::new();
        g.set_variable_kind(VariableKind::Resource);
        let values: Vec<f32> = (0..ROWS * 2).map(|v| (v % 7) as f32 * 0.25 - 0.5).collect();
        let init = g
            .constant(&Tensor::from_vec([ROWS, 2], values).unwrap())
            .unwrap();
        let sparse = g.variable("sparse", &init).unwrap();
        let dense = g.variable("dense", &init).unwrap();
        // Rows 3, 7 and 3 again: a repeated row's gradients add up.
        let ids = g
            .constant(&Tensor::from_vec([3], vec![3i32, 7, 3]).unwrap())
            .unwrap();
        let target = g
            .constant(&Tensor::from_vec([3, 2], vec![1f32, -1., 0.5, 2., -1., 0.]).unwrap())
            .unwrap();
        let loss_of = |g: &mut Graph, table: &tessera::graph::Variable| {
            let rows = g
                .resource_gather(&table.handle, &ids, DType::Float, 0)
                .unwrap();
            let diff = g.sub(&rows, &target).unwrap();
            let sq = g.unary("Square", &diff).unwrap();
            g.sum(&sq, &[0, 1], false).unwrap()
        };
        let sparse_loss = loss_of(&mut g, &sparse);
        let dense_loss = loss_of(&mut g, &dense);
        let opt = make();
        let train_sparse = opt
            .minimize_vars(&mut g, &sparse_loss, std::slice::from_ref(&sparse), None)
            .unwrap();
        let grads = opt
            .compute_gradients(&mut g, &dense_loss, std::slice::from_ref(&dense))
            .unwrap();
        let train_dense = opt
            .named("dense_opt")
            .apply_gradients(&mut g, &grads, None)
            .unwrap();
        let sparse_ops: Vec<&str> = g
            .nodes()
            .iter()
            .filter(|n| n.name.contains("update_sparse"))
            .map(|n| n.op.as_str())
            .collect();
        assert!(sparse_ops.contains(&op), "{op} not among {sparse_ops:?}");
        // Adagrad's accumulator of the sparse table, which starts at 0.1 everywhere.
        let accumulator = match op {
            "ResourceSparseApplyAdagrad" => {
                let slot = g.tensor("sparse/Adagrad").unwrap();
                Some(g.read_variable(&slot).unwrap().name())
            }
            _ => None,
        };
        let init_op = g.global_variables_initializer().unwrap();
        let session = Session::local();
        session.extend(&g.to_graph_def()).unwrap();
        session.run(&[], &[], &[&init_op]).unwrap();
        let read = |name: &str| -> Vec<f32> {
            session.run(&[], &[name], &[]).unwrap()[0]
                .values::<f32>()
                .unwrap()
                .to_vec()
        };
        let start = read(&sparse.value.name());
        for _ in 0..2 {
            session
                .run(&[], &[], &[&train_sparse, &train_dense])
                .unwrap();
        }
        let (s, d) = (read(&sparse.value.name()), read(&dense.value.name()));
        if let Some(accumulator) = &accumulator {
            let acc = read(accumulator);
            for row in (0..ROWS).filter(|r| ![3, 7].contains(r)) {
                assert_eq!(
                    acc[row * 2..row * 2 + 2],
                    [0.1, 0.1],
                    "accumulator row {row}"
                );
            }
            assert!(
                acc[6] > 0.1 && acc[14] > 0.1,
                "touched accumulators: {acc:?}"
            );
        }
        for row in 0..ROWS {
            let (sr, dr, r0) = (
                &s[row * 2..row * 2 + 2],
                &d[row * 2..row * 2 + 2],
                &start[row * 2..row * 2 + 2],
            );
            if row == 3 || row == 7 {
                for (a, b) in sr.iter().zip(dr) {
                    assert!(
                        (a - b).abs() <= 1e-6,
                        "{op}: row {row}: sparse {sr:?}, dense {dr:?}"
                    );
                }
                assert_ne!(sr, r0, "{op}: row {row} did not move");
            } else {
                assert_eq!(sr, r0, "{op}: row {row} moved though no step read it");
            }
        }
    }
}
