//! A device's variable shard owns its variables while steps run: a training step updates a
//! variable and its optimizer slot on the shard's store (`ApplyMomentum` on TensorFlow 1's
//! reference variables, `ResourceApplyMomentum` on resource variables, `use_locking = false` as
//! TensorFlow's optimizers default), while, on another thread, the shard takes snapshots, a
//! `SaveV2` step writes checkpoints (reading resource variables through a `ReadVariableOp`
//! each, as TensorFlow's savers do), and the shard restores values. Every snapshot and every
//! checkpoint must hold the variable and its slot from the same update.
//!
//! The update makes that checkable: with momentum 1, learning rate 1 and a gradient of ones,
//! the n-th update leaves `accum = n` and `w = -n(n+1)/2` in every element (whole numbers, exact
//! in float32), so a pair from different updates breaks `w = -accum(accum+1)/2`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use crate::support::v1_graph::{step, G};
use tessera::device::DeviceType;
use tessera::format::checkpoint::BundleReader;
use tessera::graph::attr::value;
use tessera::runtime::Device;
use tessera::shard::ShardState;
use tessera::tensor::{DType, PartialShape, Shape, Tensor};

const CPU0: &str = "/job:ps/replica:0/task:0/device:CPU:0";
const N: usize = 4096;
const STEPS: usize = 3000;

/// The update's invariant: every element from one update, the variable and slot from the same.
fn check(w: &Tensor, accum: &Tensor, what: &str) -> f32 {
    let w = w.values::<f32>().unwrap();
    let accum = accum.values::<f32>().unwrap();
    let n = accum[0];
    assert!(
        accum.iter().all(|&a| a == n),
        "{what}: the slot holds parts of two updates"
    );
    let expected = -n * (n + 1.0) / 2.0;
    assert!(
        w.iter().all(|&v| v == expected),
        "{what}: accum is {n} (update {n}) but w is {} (expected {expected}): the variable and \
         its slot come from different updates",
        w[0]
    );
    n
}

/// The kinds of variable TensorFlow programs save.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// `VariableV2`, read by `SaveV2` through its reference.
    Reference,
    /// `VarHandleOp`, read for `SaveV2` by a `ReadVariableOp` of each.
    Resource,
}

/// Variables `w` and `accum` of `kind` on the shard's device, their initializer, the update and
/// a save.
fn graph(device: Arc<Device>, kind: Kind) -> G {
    let mut g = G {
        device: CPU0.into(),
        on: Some(device),
        ..Default::default()
    };
    let shape = value::shape(&PartialShape::from(Shape::from([N])));
    let dtype = || ("dtype", value::dtype(DType::Float));
    for name in ["w", "accum"] {
        match kind {
            Kind::Reference => g.op(
                name,
                "VariableV2",
                &[],
                &[dtype(), ("shape", shape.clone())],
            ),
            Kind::Resource => g.op(
                name,
                "VarHandleOp",
                &[],
                &[
                    dtype(),
                    ("shape", shape.clone()),
                    ("shared_name", value::string(name)),
                ],
            ),
        };
    }
    let zeros = g.constant(
        "zeros",
        Tensor::from_vec([N], vec![0.0f32; N]).unwrap(),
        &[],
    );
    let one = g.constant("one", Tensor::scalar(1.0f32), &[]);
    let ones = g.constant("ones", Tensor::from_vec([N], vec![1.0f32; N]).unwrap(), &[]);
    let (update, saved) = match kind {
        Kind::Reference => {
            g.f("init_w", "Assign", &["w", &zeros]);
            g.f("init_accum", "Assign", &["accum", &zeros]);
            ("ApplyMomentum", ["accum".to_string(), "w".to_string()])
        }
        Kind::Resource => {
            g.op("init_w", "AssignVariableOp", &["w", &zeros], &[dtype()]);
            g.op(
                "init_accum",
                "AssignVariableOp",
                &["accum", &zeros],
                &[dtype()],
            );
            let accum = g.op("accum/read", "ReadVariableOp", &["accum"], &[dtype()]);
            let w = g.op("w/read", "ReadVariableOp", &["w"], &[dtype()]);
            ("ResourceApplyMomentum", [accum, w])
        }
    };
    g.op(
        "update",
        update,
        &["w", "accum", &one, &ones, &one],
        &[
            ("T", value::dtype(DType::Float)),
            ("use_locking", value::bool(false)),
        ],
    );
    let prefix = g.placeholder("prefix", DType::String);
    let names = g.constant(
        "names",
        Tensor::from_strings([2], vec!["accum".into(), "w".into()]).unwrap(),
        &[],
    );
    let slices = g.constant(
        "slices",
        Tensor::from_strings([2], vec!["".into(), "".into()]).unwrap(),
        &[],
    );
    g.op(
        "save",
        "SaveV2",
        &[&prefix, &names, &slices, &saved[0], &saved[1]],
        &[("dtypes", value::dtype_list(&[DType::Float, DType::Float]))],
    );
    g
}

#[test]
fn snapshots_checkpoints_and_restores_never_hold_a_half_applied_update() {
    train_beside_snapshots(Kind::Reference);
}

#[test]
fn checkpoints_of_resource_variables_never_hold_a_half_applied_update() {
    train_beside_snapshots(Kind::Resource);
}

/// Trains `w` and `accum` of `kind` on one thread while this one takes snapshots, writes
/// checkpoints and restores, checking every pair.
fn train_beside_snapshots(kind: Kind) {
    let shard = Arc::new(ShardState::new(CPU0));
    let device = Arc::new(Device::with_resources(
        CPU0,
        DeviceType::Cpu,
        shard.resources(),
    ));
    let g = graph(device, kind);
    g.executor_with_targets(&[], &[], &["init_w", "init_accum"])
        .unwrap()
        .run(Vec::new(), &step())
        .unwrap();
    let update = g.executor_with_targets(&[], &[], &["update"]).unwrap();
    let save = g
        .executor_with_targets(&["prefix"], &[], &["save"])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let trainer = {
        let done = Arc::clone(&done);
        thread::spawn(move || {
            for _ in 0..STEPS {
                update.run(Vec::new(), &step()).unwrap();
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let names = [("", "w"), ("", "accum")];
    let (mut snapshots, mut checkpoints, mut restores) = (0, 0, 0);
    let mut last = 0.0;
    while !done.load(Ordering::SeqCst) {
        let values = shard.snapshot(&names).unwrap();
        let n = check(&values[0], &values[1], "a snapshot");
        assert!(n >= last, "snapshots went back from update {last} to {n}");
        last = n;
        snapshots += 1;
        if snapshots % 8 == 0 {
            let prefix = dir.path().join(format!("ckpt-{checkpoints}"));
            let prefix = prefix.to_str().unwrap().to_string();
            save.run(vec![Tensor::string(prefix.clone())], &step())
                .unwrap();
            let reader = BundleReader::open(&prefix).unwrap();
            let (w, accum) = (reader.read("w").unwrap(), reader.read("accum").unwrap());
            last = last.max(check(&w, &accum, "a checkpoint"));
            checkpoints += 1;
        }
        if snapshots % 64 == 0 {
            // Put back the pair just read: the trainer's next update goes on from it.
            shard
                .restore(vec![
                    (names[0], values[0].clone()),
                    (names[1], values[1].clone()),
                ])
                .unwrap();
            last = 0.0;
            restores += 1;
        }
    }
    trainer.join().unwrap();
    let values = shard.snapshot(&names).unwrap();
    check(&values[0], &values[1], "the end");
    assert!(
        snapshots > 10 && checkpoints > 0,
        "the reads did not overlap the training: {snapshots} snapshots, {checkpoints} checkpoints"
    );
    eprintln!("{snapshots} snapshots, {checkpoints} checkpoints, {restores} restores");
}
