//! `[data] allowed_dirs`: a task reads its clients' input files (`TextLineDataset`,
//! `TFRecordDataset`, a lookup table's vocabulary through `InitializeTableFromTextFileV2`,
//! `ReadFile`) only under its data and checkpoint directories. A path outside (plainly,
//! through `..`, or through a symlink that leaves an allowed directory) is PERMISSION_DENIED
//! naming the path and `data.allowed_dirs`, and the task goes on serving. With only
//! `[checkpoints] allowed_dirs` set, reads stay under the checkpoint directories; with
//! neither, any path is read, as TensorFlow reads it. Writes (`WriteFile`) keep going through
//! `[checkpoints]`.
//!
//! Each test starts a one-task server on 127.0.0.1:0 and drives it with the Rust client over
//! gRPC, feeding the paths as strings.

use std::path::{Path, PathBuf};

use tessera::client::Session;
use tessera::cluster::{CheckpointsConfig, DataConfig, TaskConfig};
use tessera::format::tfrecord::RecordWriter;
use tessera::graph::attr::value;
use tessera::graph::builder::NodeSpec;
use tessera::graph::Graph;
use tessera::proto::{attr_value, AttrValue};
use tessera::server::Server;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::Code;

/// A scratch directory with `data/`, `ckpt/` and `outside/`, each holding `lines.txt` (two
/// lines), `records.tfrecord` (two records) and `vocab.txt` (two words) whose contents name
/// the directory, and `data/escape`, a symlink to `outside/`.
struct Dirs {
    _root: tempfile::TempDir,
    data: PathBuf,
    ckpt: PathBuf,
    outside: PathBuf,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let [data, ckpt, outside] = ["data", "ckpt", "outside"].map(|d| root.path().join(d));
    for (dir, name) in [(&data, "data"), (&ckpt, "ckpt"), (&outside, "outside")] {
        std::fs::create_dir(dir).unwrap();
        std::fs::write(dir.join("lines.txt"), format!("{name} 1\n{name} 2\n")).unwrap();
        let mut records = RecordWriter::new(Vec::new());
        records.write(format!("{name} r1").as_bytes()).unwrap();
        records.write(format!("{name} r2").as_bytes()).unwrap();
        std::fs::write(dir.join("records.tfrecord"), records.into_inner()).unwrap();
        std::fs::write(
            dir.join("vocab.txt"),
            format!("{name}-apple\n{name}-banana\n"),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink(&outside, data.join("escape")).unwrap();
    Dirs {
        _root: root,
        data,
        ckpt,
        outside,
    }
}

fn start(data: Option<&Path>, checkpoints: Option<&Path>) -> (Server, Session) {
    let server = Server::start(TaskConfig {
        checkpoints: CheckpointsConfig {
            allowed_dirs: checkpoints.map(|d| vec![d.to_path_buf()]),
            ..Default::default()
        },
        data: DataConfig {
            allowed_dirs: data.map(|d| vec![d.to_path_buf()]),
            ..Default::default()
        },
        ..TaskConfig::local()
    })
    .unwrap();
    let session = Session::connect(&format!("grpc://{}", server.local_addr())).unwrap();
    session.extend(&graph().to_graph_def()).unwrap();
    (server, session)
}

/// A `list(shape)` attr of one scalar.
fn scalar_shapes() -> AttrValue {
    AttrValue {
        value: Some(attr_value::Value::List(attr_value::ListValue {
            shape: vec![PartialShape::new(vec![]).to_proto()],
            ..Default::default()
        })),
    }
}

/// `{lines,records}_init`: a TextLineDataset / TFRecordDataset of the fed `path` made the
/// walk of the iterator `{lines,records}_it`, whose next element `{lines,records}_next`
/// fetches; `table_init`: InitializeTableFromTextFileV2 of the fed `path` (the whole line
/// is the key, its number the value) into `table`, whose size `table_size` fetches;
/// `read`: ReadFile of the fed `path`; `write`: WriteFile of `contents` at the fed `path`.
fn graph() -> Graph {
    let mut g = Graph::new();
    let scalar = PartialShape::new(vec![]);
    let path = g
        .placeholder("path", DType::String, scalar.clone())
        .unwrap();
    let contents = g.placeholder("contents", DType::String, scalar).unwrap();
    let compression = g.constant(&Tensor::string("")).unwrap();
    let buffer = g.constant(&Tensor::scalar(0i64)).unwrap();
    for (op, name) in [("TextLineDataset", "lines"), ("TFRecordDataset", "records")] {
        let dataset = g
            .add1(
                NodeSpec::new(op)
                    .name(name)
                    .input(&path)
                    .input(&compression)
                    .input(&buffer),
            )
            .unwrap();
        let types = value::dtype_list(&[DType::String]);
        let iterator = g
            .add1(
                NodeSpec::new("IteratorV2")
                    .name(&format!("{name}_it"))
                    .attr("shared_name", value::string(format!("{name}_it")))
                    .attr("container", value::string(""))
                    .attr("output_types", types.clone())
                    .attr("output_shapes", scalar_shapes()),
            )
            .unwrap();
        g.add_op(
            NodeSpec::new("MakeIterator")
                .name(&format!("{name}_init"))
                .input(&dataset)
                .input(&iterator),
        )
        .unwrap();
        g.add_node(
            NodeSpec::new("IteratorGetNext")
                .name(&format!("{name}_next"))
                .input(&iterator)
                .attr("output_types", types)
                .attr("output_shapes", scalar_shapes()),
        )
        .unwrap();
    }
    let table = g
        .add1(
            NodeSpec::new("HashTableV2")
                .name("table")
                .attr("key_dtype", value::dtype(DType::String))
                .attr("value_dtype", value::dtype(DType::Int64))
                .attr("shared_name", value::string("vocab")),
        )
        .unwrap();
    g.add_op(
        NodeSpec::new("InitializeTableFromTextFileV2")
            .name("table_init")
            .input(&table)
            .input(&path)
            .attr("key_index", value::int(-2))
            .attr("value_index", value::int(-1)),
    )
    .unwrap();
    g.add1(
        NodeSpec::new("LookupTableSizeV2")
            .name("table_size")
            .input(&table),
    )
    .unwrap();
    g.add1(NodeSpec::new("ReadFile").name("read").input(&path))
        .unwrap();
    g.add_node(
        NodeSpec::new("WriteFile")
            .name("write")
            .input(&path)
            .input(&contents),
    )
    .unwrap();
    g
}

fn path_tensor(path: &Path) -> Tensor {
    Tensor::string(path.to_string_lossy().into_owned())
}

/// Every element of the `kind` (`lines` or `records`) dataset of `path`, as text.
fn walk(session: &Session, kind: &str, path: &Path) -> tessera::Result<Vec<String>> {
    session.run(
        &[("path", path_tensor(path))],
        &[],
        &[&format!("{kind}_init")],
    )?;
    let mut elements = Vec::new();
    loop {
        match session.run(&[], &[&format!("{kind}_next:0")], &[]) {
            Ok(out) => {
                let element = &out[0].strings().unwrap()[0];
                elements.push(String::from_utf8_lossy(element).into_owned());
            }
            Err(e) if e.code() == Code::OutOfRange => return Ok(elements),
            Err(e) => return Err(e),
        }
    }
}

/// The vocabulary at `path` loaded into the table; its size.
fn load_vocabulary(session: &Session, path: &Path) -> tessera::Result<i64> {
    session.run(&[("path", path_tensor(path))], &[], &["table_init"])?;
    let out = session.run(&[], &["table_size:0"], &[])?;
    Ok(out[0].values::<i64>().unwrap()[0])
}

fn read(session: &Session, path: &Path) -> tessera::Result<String> {
    let out = session.run(&[("path", path_tensor(path))], &["read:0"], &[])?;
    Ok(String::from_utf8_lossy(&out[0].strings().unwrap()[0]).into_owned())
}

fn write(session: &Session, path: &Path, contents: &str) -> tessera::Result<()> {
    let feeds = [
        ("path", path_tensor(path)),
        ("contents", Tensor::string(contents.to_string())),
    ];
    session.run(&feeds, &[], &["write"]).map(drop)
}

/// Asserts PERMISSION_DENIED naming `path`'s last component and `key`.
#[track_caller]
fn assert_denied(result: tessera::Result<impl std::fmt::Debug>, path: &Path, key: &str) {
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    let name = path.file_name().unwrap().to_string_lossy();
    assert!(err.message().contains(&*name), "{err}");
    assert!(err.message().contains(key), "{err}");
}

/// Paths that lead outside `d.data`: plainly, through `..`, through a symlink, and a file
/// of the system's.
fn escapes(d: &Dirs, file: &str) -> Vec<PathBuf> {
    vec![
        d.outside.join(file),
        d.data.join("..").join("outside").join(file),
        d.data.join("escape").join(file),
        PathBuf::from("/etc/passwd"),
    ]
}

#[test]
fn datasets_read_inside_the_data_dir_and_are_refused_outside_while_the_task_serves_on() {
    let d = dirs();
    let (server, session) = start(Some(&d.data), None);
    let lines = d.data.join("lines.txt");
    assert_eq!(
        walk(&session, "lines", &lines).unwrap(),
        ["data 1", "data 2"]
    );
    let records = d.data.join("records.tfrecord");
    assert_eq!(
        walk(&session, "records", &records).unwrap(),
        ["data r1", "data r2"]
    );
    for path in escapes(&d, "lines.txt") {
        assert_denied(walk(&session, "lines", &path), &path, "data.allowed_dirs");
    }
    for path in escapes(&d, "records.tfrecord") {
        assert_denied(walk(&session, "records", &path), &path, "data.allowed_dirs");
    }
    // The task goes on serving: a later walk inside works.
    assert_eq!(
        walk(&session, "lines", &lines).unwrap(),
        ["data 1", "data 2"]
    );
    server.stop();
}

#[test]
fn a_tables_vocabulary_file_is_read_inside_the_data_dir_only() {
    let d = dirs();
    let (server, session) = start(Some(&d.data), None);
    for path in escapes(&d, "vocab.txt") {
        let result = load_vocabulary(&session, &path);
        assert_denied(result, &path, "data.allowed_dirs");
    }
    // Nothing was loaded from outside; the good file loads and the task serves on.
    assert_eq!(
        load_vocabulary(&session, &d.data.join("vocab.txt")).unwrap(),
        2
    );
    server.stop();
}

#[test]
fn read_file_reads_under_data_and_checkpoint_dirs_while_write_file_writes_under_checkpoints() {
    let d = dirs();
    let (server, session) = start(Some(&d.data), Some(&d.ckpt));
    assert_eq!(
        read(&session, &d.data.join("lines.txt")).unwrap(),
        "data 1\ndata 2\n"
    );
    // Reads are allowed under the checkpoint directories too.
    assert_eq!(
        read(&session, &d.ckpt.join("lines.txt")).unwrap(),
        "ckpt 1\nckpt 2\n"
    );
    for path in escapes(&d, "lines.txt") {
        assert_denied(read(&session, &path), &path, "data.allowed_dirs");
    }
    // The data directory is for reading: a write there is refused naming the checkpoint key
    // (WriteFile checks the file's directory first, so the message names the directory).
    let new = d.data.join("new.txt");
    assert_denied(
        write(&session, &new, "x"),
        &d.data,
        "checkpoints.allowed_dirs",
    );
    assert!(!new.exists());
    write(&session, &d.ckpt.join("new.txt"), "written").unwrap();
    assert_eq!(read(&session, &d.ckpt.join("new.txt")).unwrap(), "written");
    server.stop();
}

#[test]
fn with_only_checkpoint_dirs_reads_stay_under_them_and_the_refusal_names_the_data_key() {
    let d = dirs();
    let (server, session) = start(None, Some(&d.ckpt));
    let lines = d.ckpt.join("lines.txt");
    assert_eq!(
        walk(&session, "lines", &lines).unwrap(),
        ["ckpt 1", "ckpt 2"]
    );
    let elsewhere = d.data.join("lines.txt");
    let err = walk(&session, "lines", &elsewhere).unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert!(err.message().contains("lines.txt"), "{err}");
    assert!(
        err.message()
            .contains("add this one to [data] allowed_dirs in the task's cluster file"),
        "{err}"
    );
    assert!(err.message().contains("checkpoints.allowed_dirs"), "{err}");
    assert_denied(
        read(&session, Path::new("/etc/passwd")),
        Path::new("/etc/passwd"),
        "data.allowed_dirs",
    );
    let vocab = d.data.join("vocab.txt");
    assert_denied(
        load_vocabulary(&session, &vocab),
        &vocab,
        "data.allowed_dirs",
    );
    assert_eq!(
        load_vocabulary(&session, &d.ckpt.join("vocab.txt")).unwrap(),
        2
    );
    server.stop();
}

#[test]
fn with_neither_section_any_path_is_read_as_tensorflow_reads_it() {
    let d = dirs();
    let (server, session) = start(None, None);
    let outside = d.outside.join("lines.txt");
    assert_eq!(
        walk(&session, "lines", &outside).unwrap(),
        ["outside 1", "outside 2"]
    );
    assert_eq!(read(&session, &outside).unwrap(), "outside 1\noutside 2\n");
    assert_eq!(
        load_vocabulary(&session, &d.outside.join("vocab.txt")).unwrap(),
        2
    );
    server.stop();
}

#[test]
fn a_data_dir_that_does_not_exist_stops_the_task_at_start_naming_the_key() {
    let d = dirs();
    let missing = d.data.join("missing");
    let err = Server::start(TaskConfig {
        data: DataConfig {
            allowed_dirs: Some(vec![missing]),
            ..Default::default()
        },
        ..TaskConfig::local()
    })
    .err()
    .expect("a missing data directory");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("data.allowed_dirs"), "{err}");
    assert!(err.message().contains("missing"), "{err}");
}
