//! `[checkpoints] allowed_dirs`: a task that sets it saves, restores and merges checkpoints,
//! and creates summary writers, only under those directories. A client asking for a path
//! outside (plainly, through `..`, or through a symlink that leaves an allowed directory) gets
//! PERMISSION_DENIED naming the path and the key, nothing outside is created, read, renamed or
//! deleted, and the task goes on serving. `tessera train` sets the key to its
//! `--checkpoint_dir` (tests/train.rs runs that job).
//!
//! Each test starts a one-task server on 127.0.0.1:0 and drives it with the Rust client over
//! gRPC, feeding the paths as strings.

use std::path::{Path, PathBuf};

use tessera::client::Session;
use tessera::cluster::{CheckpointsConfig, TaskConfig};
use tessera::format::checkpoint::bundle::{data_filename, index_filename, write_bundle};
use tessera::graph::attr::value;
use tessera::graph::builder::NodeSpec;
use tessera::graph::Graph;
use tessera::server::Server;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::Code;

/// A scratch directory with `allowed/` (the task's only allowed directory) and `outside/`.
struct Dirs {
    _root: tempfile::TempDir,
    allowed: PathBuf,
    outside: PathBuf,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let allowed = root.path().join("allowed");
    let outside = root.path().join("outside");
    std::fs::create_dir(&allowed).unwrap();
    std::fs::create_dir(&outside).unwrap();
    Dirs {
        _root: root,
        allowed,
        outside,
    }
}

fn start(allowed: Option<&Path>) -> (Server, Session) {
    let server = Server::start(TaskConfig {
        checkpoints: CheckpointsConfig {
            allowed_dirs: allowed.map(|d| vec![d.to_path_buf()]),
            ..Default::default()
        },
        ..TaskConfig::local()
    })
    .unwrap();
    let session = Session::connect(&format!("grpc://{}", server.local_addr())).unwrap();
    session.extend(&graph().to_graph_def()).unwrap();
    (server, session)
}

/// `save`: SaveV2 of `x = [1, 2, 3]` at the fed `prefix`; `restore`: RestoreV2 of it;
/// `merge`: MergeV2Checkpoints of the fed `sources` into `destination`; `writer_init`:
/// CreateSummaryFileWriter at the fed `logdir`.
fn graph() -> Graph {
    let mut g = Graph::new();
    let scalar = PartialShape::new(vec![]);
    let prefix = g
        .placeholder("prefix", DType::String, scalar.clone())
        .unwrap();
    let sources = g
        .placeholder("sources", DType::String, PartialShape::unknown())
        .unwrap();
    let destination = g
        .placeholder("destination", DType::String, scalar.clone())
        .unwrap();
    let logdir = g.placeholder("logdir", DType::String, scalar).unwrap();
    let names = g
        .constant(&Tensor::from_strings([1], vec!["x".into()]).unwrap())
        .unwrap();
    let slices = g
        .constant(&Tensor::from_strings([1], vec!["".into()]).unwrap())
        .unwrap();
    let x = g
        .constant(&Tensor::from_vec([3], vec![1f32, 2., 3.]).unwrap())
        .unwrap();
    let floats = value::dtype_list(&[DType::Float]);
    g.add_op(
        NodeSpec::new("SaveV2")
            .name("save")
            .input(&prefix)
            .input(&names)
            .input(&slices)
            .input_list(&[x])
            .attr("dtypes", floats.clone()),
    )
    .unwrap();
    g.add_node(
        NodeSpec::new("RestoreV2")
            .name("restore")
            .input(&prefix)
            .input(&names)
            .input(&slices)
            .attr("dtypes", floats),
    )
    .unwrap();
    g.add_op(
        NodeSpec::new("MergeV2Checkpoints")
            .name("merge")
            .input(&sources)
            .input(&destination),
    )
    .unwrap();
    let writer = g
        .add1(
            NodeSpec::new("SummaryWriter")
                .name("writer")
                .attr("shared_name", value::string("w")),
        )
        .unwrap();
    let max_queue = g.constant(&Tensor::scalar(10i32)).unwrap();
    let flush = g.constant(&Tensor::scalar(100i32)).unwrap();
    let suffix = g.constant(&Tensor::string("")).unwrap();
    g.add_op(
        NodeSpec::new("CreateSummaryFileWriter")
            .name("writer_init")
            .input(&writer)
            .input(&logdir)
            .input(&max_queue)
            .input(&flush)
            .input(&suffix),
    )
    .unwrap();
    g
}

fn path_tensor(path: &Path) -> Tensor {
    Tensor::string(path.to_string_lossy().into_owned())
}

fn save(session: &Session, prefix: &Path) -> tessera::Result<()> {
    session
        .run(&[("prefix", path_tensor(prefix))], &[], &["save"])
        .map(drop)
}

fn restore(session: &Session, prefix: &Path) -> tessera::Result<Vec<f32>> {
    let out = session.run(&[("prefix", path_tensor(prefix))], &["restore:0"], &[])?;
    Ok(out[0].values::<f32>().unwrap().to_vec())
}

fn merge(session: &Session, sources: &[&Path], destination: &Path) -> tessera::Result<()> {
    let sources = Tensor::from_strings(
        [sources.len()],
        sources
            .iter()
            .map(|p| p.to_string_lossy().into_owned().into())
            .collect(),
    )
    .unwrap();
    session
        .run(
            &[
                ("sources", sources),
                ("destination", path_tensor(destination)),
            ],
            &[],
            &["merge"],
        )
        .map(drop)
}

/// Asserts PERMISSION_DENIED naming `path`'s last component and the key.
#[track_caller]
fn assert_denied(result: tessera::Result<impl std::fmt::Debug>, path: &Path) {
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    let name = path.file_name().unwrap().to_string_lossy();
    assert!(err.message().contains(&*name), "{err}");
    assert!(err.message().contains("checkpoints.allowed_dirs"), "{err}");
}

/// Every file under `dir`, recursively, with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap_or_default();
                out.push((path, bytes));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn saves_restores_and_merges_inside_the_allowed_directory_work() {
    let d = dirs();
    let (server, session) = start(Some(&d.allowed));
    let prefix = d.allowed.join("run/model.ckpt-1");
    save(&session, &prefix).unwrap();
    assert!(index_filename(&prefix.to_string_lossy()).exists());
    assert_eq!(restore(&session, &prefix).unwrap(), [1., 2., 3.]);
    // Merging a shard into another name, still inside.
    let merged = d.allowed.join("merged/model");
    merge(&session, &[&prefix], &merged).unwrap();
    assert_eq!(restore(&session, &merged).unwrap(), [1., 2., 3.]);
    // A relative `..` that stays inside is fine.
    let roundabout = d.allowed.join("run/../run/again");
    save(&session, &roundabout).unwrap();
    assert_eq!(restore(&session, &roundabout).unwrap(), [1., 2., 3.]);
    session
        .run(
            &[("logdir", path_tensor(&d.allowed.join("events")))],
            &[],
            &["writer_init"],
        )
        .unwrap();
    assert_eq!(
        std::fs::read_dir(d.allowed.join("events")).unwrap().count(),
        1
    );
    server.stop();
}

#[test]
fn saving_outside_plainly_through_dotdot_or_a_symlink_is_refused_and_creates_nothing() {
    let d = dirs();
    let (server, session) = start(Some(&d.allowed));
    std::os::unix::fs::symlink(&d.outside, d.allowed.join("escape")).unwrap();
    let attempts = [
        d.outside.join("new/model"),
        d.allowed.join("../outside/new/model"),
        d.allowed.join("deeper/../../outside/new/model"),
        d.allowed.join("escape/new/model"),
    ];
    for prefix in &attempts {
        assert_denied(save(&session, prefix), prefix);
    }
    assert!(
        snapshot(&d.outside).is_empty(),
        "{:?}",
        snapshot(&d.outside)
    );
    assert!(std::fs::read_dir(&d.outside).unwrap().next().is_none());
    // The summary writer too.
    let logdir = d.allowed.join("escape/events");
    let result = session.run(&[("logdir", path_tensor(&logdir))], &[], &["writer_init"]);
    assert_denied(result, &logdir);
    assert!(!d.outside.join("events").exists());
    // The task goes on serving.
    save(&session, &d.allowed.join("ok")).unwrap();
    server.stop();
}

#[test]
fn restoring_and_merging_outside_are_refused_and_touch_nothing() {
    let d = dirs();
    // A checkpoint outside, written by someone else.
    let theirs = d.outside.join("theirs");
    let theirs_str = theirs.to_string_lossy().into_owned();
    write_bundle(&theirs_str, &[("x".into(), Tensor::scalar(7f32))]).unwrap();
    let before = snapshot(&d.outside);
    let (server, session) = start(Some(&d.allowed));
    std::os::unix::fs::symlink(&d.outside, d.allowed.join("escape")).unwrap();
    std::os::unix::fs::symlink(index_filename(&theirs_str), d.allowed.join("linked.index"))
        .unwrap();
    for prefix in [
        theirs.clone(),
        d.allowed.join("../outside/theirs"),
        d.allowed.join("escape/theirs"),
    ] {
        assert_denied(restore(&session, &prefix), &prefix);
    }
    // A symlinked index file leads outside too.
    let linked = d.allowed.join("linked");
    assert_denied(restore(&session, &linked), &linked);
    // Merging their shard into ours would rename their data file and delete their index.
    let ours = d.allowed.join("ours");
    assert_denied(merge(&session, &[&theirs], &ours), &theirs);
    let through = d.allowed.join("escape/theirs");
    assert_denied(merge(&session, &[&through], &ours), &through);
    // Merging ours into a destination outside.
    save(&session, &ours).unwrap();
    let away = d.outside.join("away");
    assert_denied(merge(&session, &[&ours], &away), &away);
    assert!(index_filename(&ours.to_string_lossy()).exists());
    assert!(data_filename(&ours.to_string_lossy(), 0, 1).exists());
    assert_eq!(snapshot(&d.outside), before);
    server.stop();
}

#[test]
fn without_allowed_dirs_any_path_is_allowed_as_tensorflow_allows_it() {
    let d = dirs();
    let (server, session) = start(None);
    let prefix = d.outside.join("anywhere/model");
    save(&session, &prefix).unwrap();
    assert_eq!(restore(&session, &prefix).unwrap(), [1., 2., 3.]);
    server.stop();
}
