//! Checkpoints through the graph: the saver ops run by an in-process session (values back bit
//! for bit), sharding per device then merging, the state file and pruning, bad directories,
//! corrupt shards, TensorFlow's own saver graph (golden `graph_monitored.pb`), and the
//! safetensors export.

use std::collections::BTreeMap;
use std::path::Path;

use crate::kernels_support::golden;
use bytes::Bytes;
use tessera::client::Session;
use tessera::error::Code;
use tessera::format::checkpoint::bundle::{data_filename, write_bundle, BundleReader};
use tessera::graph::builder::{Graph, Variable};
use tessera::proto::GraphDef;
use tessera::tensor::{DType, Tensor};
use tessera::train::checkpoint::{build_saver_ops, latest_checkpoint, Saver, SaverDef};

/// The model's variables with values chosen by hand (one per dtype), and new values.
struct Model {
    graph: Graph,
    vars: BTreeMap<String, Variable>,
    def: SaverDef,
}

fn initial() -> Vec<(&'static str, Tensor, Tensor)> {
    vec![
        (
            "layer/w",
            Tensor::from_vec(vec![2, 3], vec![0.1f32, -0.2, 0.3, 1e-30, f32::MAX, -0.0]).unwrap(),
            Tensor::from_vec(vec![2, 3], vec![9.0f32; 6]).unwrap(),
        ),
        (
            "layer/b",
            Tensor::from_vec(vec![2], vec![std::f64::consts::E, -1e-300]).unwrap(),
            Tensor::from_vec(vec![2], vec![0.0f64, 0.0]).unwrap(),
        ),
        (
            "global_step",
            Tensor::scalar(123_456_789_012_i64),
            Tensor::scalar(0_i64),
        ),
        (
            "counts",
            Tensor::from_vec(vec![3], vec![1i32, -2, i32::MAX]).unwrap(),
            Tensor::from_vec(vec![3], vec![0i32; 3]).unwrap(),
        ),
        (
            "mask",
            Tensor::from_vec(vec![2], vec![true, false]).unwrap(),
            Tensor::from_vec(vec![2], vec![false, true]).unwrap(),
        ),
    ]
}

/// Builds the variables (on `devices[i % len]`), an `init` op, a `reset` op assigning the new
/// values, and the saver ops.
fn model(devices: &[&str]) -> Model {
    let mut g = Graph::new();
    let mut vars = BTreeMap::new();
    let mut resets = Vec::new();
    for (i, (name, init, other)) in initial().into_iter().enumerate() {
        let device = devices[i % devices.len()];
        let (var, reset) = g
            .with_device(device, |g| {
                let c = g.constant(&init)?;
                let var = g.variable(name, &c)?;
                let o = g.constant(&other)?;
                let reset = g.assign_variable(&var.handle, &o)?;
                Ok((var, reset))
            })
            .unwrap();
        vars.insert(name.to_string(), var);
        resets.push(reset);
    }
    g.global_variables_initializer().unwrap();
    let refs: Vec<&str> = resets.iter().map(String::as_str).collect();
    g.group("reset", &refs).unwrap();
    let def = build_saver_ops(&mut g, &vars).unwrap();
    Model {
        graph: g,
        vars,
        def,
    }
}

fn session(m: &Model) -> Session {
    let s = Session::local();
    s.extend(&m.graph.to_graph_def()).unwrap();
    s
}

fn values(s: &Session, m: &Model) -> Vec<Tensor> {
    let names: Vec<String> = initial()
        .iter()
        .map(|(n, _, _)| m.vars[*n].value.name())
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    s.run(&[], &refs, &[]).unwrap()
}

fn assert_same(a: &[Tensor], b: &[Tensor]) {
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.dtype(), y.dtype());
        assert_eq!(x.dims(), y.dims());
        assert_eq!(x.bytes(), y.bytes(), "bit-for-bit");
    }
}

#[test]
fn save_assign_restore_gives_the_values_back_bit_for_bit() {
    let m = model(&[""]);
    let s = session(&m);
    s.run(&[], &[], &["init"]).unwrap();
    let before = values(&s, &m);
    assert_same(
        &before,
        &initial().into_iter().map(|(_, t, _)| t).collect::<Vec<_>>(),
    );

    let dir = tempfile::tempdir().unwrap();
    let saver = Saver::new(m.def.clone(), 5);
    let prefix = saver.save(&s, dir.path(), Some(10)).unwrap();
    assert_eq!(prefix, dir.path().join("model.ckpt-10"));

    s.run(&[], &[], &["reset"]).unwrap();
    let reset = values(&s, &m);
    assert_same(
        &reset,
        &initial().into_iter().map(|(_, _, o)| o).collect::<Vec<_>>(),
    );

    saver.restore(&s, &prefix).unwrap();
    assert_same(&values(&s, &m), &before);
    // One device: one shard.
    assert_eq!(
        BundleReader::open(&prefix.to_string_lossy())
            .unwrap()
            .num_shards(),
        1
    );
}

#[test]
fn sharded_save_writes_one_shard_per_device_and_merges_on_the_last() {
    let m = model(&["/job:ps/task:0", "/job:ps/task:1"]);
    // TensorFlow's node names, as a SaverDef of an imported TensorFlow graph names them.
    assert_eq!(m.def, SaverDef::default());
    let device_of = |name: &str| m.graph.node(name).unwrap().device.clone();
    assert_eq!(device_of("save/SaveV2"), "/job:ps/task:0/device:CPU:0");
    assert_eq!(device_of("save/SaveV2_1"), "/job:ps/task:1/device:CPU:0");
    assert_eq!(device_of("save/RestoreV2_1"), "/job:ps/task:1/device:CPU:0");
    assert_eq!(
        device_of("save/MergeV2Checkpoints"),
        "/job:ps/task:1/device:CPU:0"
    );

    let s = session(&m); // soft placement: both "devices" run here
    s.run(&[], &[], &["init"]).unwrap();
    let before = values(&s, &m);
    let dir = tempfile::tempdir().unwrap();
    let saver = Saver::new(m.def.clone(), 5);
    let prefix = saver.save(&s, dir.path(), Some(1)).unwrap();
    let p = prefix.to_string_lossy().into_owned();
    assert!(data_filename(&p, 0, 2).exists() && data_filename(&p, 1, 2).exists());
    assert!(
        !dir.path().join("model.ckpt-1_temp").exists(),
        "shard temp dir removed"
    );
    let reader = BundleReader::open(&p).unwrap();
    assert_eq!(reader.num_shards(), 2);
    // Variables 0, 2, 4 of `initial()` are on task 0 (shard 0); 1 and 3 on task 1.
    for (name, shard) in [
        ("layer/w", 0),
        ("global_step", 0),
        ("mask", 0),
        ("layer/b", 1),
        ("counts", 1),
    ] {
        assert_eq!(reader.entries()[name].shard_id, shard, "{name}");
    }
    s.run(&[], &[], &["reset"]).unwrap();
    saver.restore(&s, &prefix).unwrap();
    assert_same(&values(&s, &m), &before);
}

#[test]
fn state_file_names_the_kept_checkpoints_and_old_ones_are_pruned() {
    let m = model(&[""]);
    let s = session(&m);
    s.run(&[], &[], &["init"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let saver = Saver::new(m.def.clone(), 2);
    for step in [1, 2, 3] {
        saver.save(&s, dir.path(), Some(step)).unwrap();
    }
    let state = std::fs::read_to_string(dir.path().join("checkpoint")).unwrap();
    let paths: Vec<&str> = state.lines().filter(|l| !l.contains("timestamp")).collect();
    assert_eq!(
        paths,
        vec![
            "model_checkpoint_path: \"model.ckpt-3\"",
            "all_model_checkpoint_paths: \"model.ckpt-2\"",
            "all_model_checkpoint_paths: \"model.ckpt-3\"",
        ]
    );
    assert_eq!(
        state
            .lines()
            .filter(|l| l.starts_with("all_model_checkpoint_timestamps: "))
            .count(),
        2
    );
    assert!(!dir.path().join("model.ckpt-1.index").exists());
    assert!(!dir.path().join("model.ckpt-1.data-00000-of-00001").exists());
    assert!(dir.path().join("model.ckpt-2.index").exists());
    assert_eq!(
        latest_checkpoint(dir.path()).unwrap(),
        Some(dir.path().join("model.ckpt-3"))
    );

    // A new saver (a restarted chief) goes on pruning what the state file lists.
    let again = Saver::new(m.def.clone(), 2);
    again.save(&s, dir.path(), Some(4)).unwrap();
    assert!(!dir.path().join("model.ckpt-2.index").exists());
    assert!(dir.path().join("model.ckpt-3.index").exists());
    assert_eq!(
        latest_checkpoint(dir.path()).unwrap(),
        Some(dir.path().join("model.ckpt-4"))
    );
    // No temp files anywhere.
    let stray: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tempstate") || n.contains("_temp"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn an_unwritable_checkpoint_dir_is_an_error_naming_it() {
    let m = model(&[""]);
    let s = session(&m);
    s.run(&[], &[], &["init"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let bad = file.join("ckpt");
    let err = Saver::new(m.def.clone(), 5)
        .save(&s, &bad, Some(1))
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert!(err.message().contains(&*bad.to_string_lossy()), "{err}");
    // The SaveV2 kernel itself also names the directory it cannot create.
    let err = s
        .run(
            &[(
                m.def.filename_tensor.as_str(),
                Tensor::string(bad.join("m").to_string_lossy().into_owned()),
            )],
            &[&m.def.save_tensor],
            &[],
        )
        .unwrap_err();
    assert!(err.message().contains("a-file"), "{err}");
}

#[test]
fn a_corrupt_shard_fails_the_restore_before_any_variable_changes() {
    let m = model(&["/job:ps/task:0", "/job:ps/task:1"]);
    let s = session(&m);
    s.run(&[], &[], &["init"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let saver = Saver::new(m.def.clone(), 5);
    let prefix = saver.save(&s, dir.path(), Some(1)).unwrap();
    let p = prefix.to_string_lossy().into_owned();
    let shard1 = data_filename(&p, 1, 2);
    let mut bytes = std::fs::read(&shard1).unwrap();
    bytes[0] ^= 0x80;
    std::fs::write(&shard1, &bytes).unwrap();

    s.run(&[], &[], &["reset"]).unwrap();
    let reset = values(&s, &m);
    let err = saver.restore(&s, &prefix).unwrap_err();
    assert_eq!(err.code(), Code::DataLoss, "{err}");
    assert!(
        err.message().contains("model.ckpt-1.data-00001-of-00002"),
        "{err}"
    );
    assert_same(&values(&s, &m), &reset);

    std::fs::remove_file(&shard1).unwrap();
    let err = saver.restore(&s, &prefix).unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert!(err.message().contains("data-00001-of-00002"), "{err}");

    let err = saver
        .restore(&s, &dir.path().join("model.ckpt-99"))
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("model.ckpt-99.index"), "{err}");
}

#[test]
fn restore_v2_refuses_a_dtype_other_than_the_stored_one() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m").to_string_lossy().into_owned();
    write_bundle(&p, &[("x".into(), Tensor::scalar(1.0f32))]).unwrap();
    let mut g = Graph::new();
    let prefix = g.constant(&Tensor::string(p.clone())).unwrap();
    let names = g
        .constant(&Tensor::from_strings(vec![1], vec![Bytes::from("x")]).unwrap())
        .unwrap();
    let specs = g
        .constant(&Tensor::from_strings(vec![1], vec![Bytes::new()]).unwrap())
        .unwrap();
    let sliced = g
        .constant(&Tensor::from_strings(vec![1], vec![Bytes::from("4 0,2")]).unwrap())
        .unwrap();
    use tessera::graph::attr::value;
    use tessera::graph::builder::NodeSpec;
    let restore = |g: &mut Graph, specs: &tessera::graph::builder::Output, dtype: DType| {
        g.add_node(
            NodeSpec::new("RestoreV2")
                .input(&prefix)
                .input(&names)
                .input(specs)
                .attr("dtypes", value::dtype_list(&[dtype])),
        )
        .unwrap()
        .remove(0)
    };
    let as_double = restore(&mut g, &specs, DType::Double);
    let as_float = restore(&mut g, &specs, DType::Float);
    let slice = restore(&mut g, &sliced, DType::Float);
    let s = Session::local();
    s.extend(&g.to_graph_def()).unwrap();
    assert_eq!(
        s.run(&[], &[&as_float.name()], &[]).unwrap()[0]
            .scalar_value::<f32>()
            .unwrap(),
        1.0
    );
    let err = s.run(&[], &[&as_double.name()], &[]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("is float32") && err.message().contains("as float64"),
        "{err}"
    );
    // A slice of a variable of another shape than the stored one.
    let err = s.run(&[], &[&slice.name()], &[]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(
        err.message().contains("does not match the shape stored"),
        "{err}"
    );
}

/// The variables of TensorFlow's golden MLP graph and their `Read` tensors.
const GOLDEN_VARS: [&str; 9] = [
    "b1",
    "b1/Adagrad",
    "b2",
    "b2/Adagrad",
    "global_step",
    "w1",
    "w1/Adagrad",
    "w2",
    "w2/Adagrad",
];

#[test]
fn tensorflows_own_saver_graph_saves_and_restores_on_tessera() {
    let graph: GraphDef = golden("graph_monitored.pb");
    let reads: Vec<String> = GOLDEN_VARS
        .iter()
        .map(|v| format!("{v}/Read/ReadVariableOp:0"))
        .collect();
    let reads: Vec<&str> = reads.iter().map(String::as_str).collect();

    let first = Session::local();
    first.extend(&graph).unwrap();
    first.run(&[], &[], &["init"]).unwrap();
    let saved = first.run(&[], &reads, &[]).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let prefix = dir
        .path()
        .join("model.ckpt-5")
        .to_string_lossy()
        .into_owned();
    // TensorFlow's SaverDef: feed save/Const:0, fetch save/Identity:0, run save/restore_all.
    let out = first
        .run(
            &[("save/Const:0", Tensor::string(prefix.clone()))],
            &["save/Identity:0"],
            &[],
        )
        .unwrap();
    assert_eq!(out[0].strings().unwrap()[0], Bytes::from(prefix.clone()));
    let reader = BundleReader::open(&prefix).unwrap();
    assert_eq!(reader.num_shards(), 2);
    let names: Vec<&String> = reader.entries().keys().collect();
    assert_eq!(names, GOLDEN_VARS.to_vec());
    assert!(!dir.path().join("model.ckpt-5_temp").exists());

    // A fresh session restores without initializing and reads the same values.
    let second = Session::local();
    second.extend(&graph).unwrap();
    second
        .run(
            &[("save/Const:0", Tensor::string(prefix))],
            &[],
            &["save/restore_all"],
        )
        .unwrap();
    assert_same(&second.run(&[], &reads, &[]).unwrap(), &saved);
}

#[test]
fn export_writes_a_safetensors_file_readable_by_the_safetensors_crate() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpts");
    let p = ckpt.join("model.ckpt-3").to_string_lossy().into_owned();
    write_bundle(
        &p,
        &[
            (
                "w".into(),
                Tensor::from_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap(),
            ),
            ("d".into(), Tensor::from_vec(vec![1], vec![0.5f64]).unwrap()),
            (
                "i".into(),
                Tensor::from_vec(vec![2], vec![-1i32, 1]).unwrap(),
            ),
            ("step".into(), Tensor::scalar(3i64)),
            (
                "m".into(),
                Tensor::from_vec(vec![2], vec![true, false]).unwrap(),
            ),
            (
                "names".into(),
                Tensor::from_strings(vec![1], vec![Bytes::from("w")]).unwrap(),
            ),
        ],
    )
    .unwrap();
    // The directory form needs a state file naming the checkpoint.
    std::fs::write(
        ckpt.join("checkpoint"),
        "model_checkpoint_path: \"model.ckpt-3\"\n",
    )
    .unwrap();
    let out = dir.path().join("model.safetensors");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["export", "--safetensors"])
        .arg(&out)
        .arg(&ckpt)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("skipped `names`"), "{stderr}");

    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = st.names();
    names.sort();
    assert_eq!(names, vec!["d", "i", "m", "step", "w"]);
    let w = st.tensor("w").unwrap();
    assert_eq!(w.dtype(), safetensors::Dtype::F32);
    assert_eq!(w.shape(), &[2, 2]);
    // 1.0, 2.0, 3.0, 4.0 as little-endian f32.
    let want: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(w.data(), want.as_slice());
    let step = st.tensor("step").unwrap();
    assert_eq!(
        (step.dtype(), step.shape()),
        (safetensors::Dtype::I64, &[][..])
    );
    assert_eq!(step.data(), 3i64.to_le_bytes().as_slice());
    assert_eq!(st.tensor("m").unwrap().data(), &[1, 0]);
    assert_eq!(st.tensor("d").unwrap().dtype(), safetensors::Dtype::F64);

    // A prefix that does not exist is an error naming it.
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["export", "--safetensors"])
        .arg(&out)
        .arg(Path::new(&p).with_file_name("model.ckpt-9"))
        .output()
        .unwrap();
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("model.ckpt-9.index"));
}

/// Saves the golden graph's variables with the saver ops into `$TESSERA_CKPT_OUT` (for
/// `tests/data/checkpoints/verify_with_tf.py PREFIX --list`):
/// `TESSERA_CKPT_OUT=/tmp/x cargo test --test integration checkpoint_saver:: -- --ignored`.
#[test]
#[ignore]
fn write_saver_checkpoint_for_tensorflow() {
    let Ok(out) = std::env::var("TESSERA_CKPT_OUT") else {
        return;
    };
    let graph: GraphDef = golden("graph_monitored.pb");
    let s = Session::local();
    s.extend(&graph).unwrap();
    s.run(&[], &[], &["init"]).unwrap();
    let saver = Saver::new(SaverDef::default(), 5);
    let prefix = saver.save(&s, Path::new(&out), Some(5)).unwrap();
    println!("{}", prefix.display());
}
