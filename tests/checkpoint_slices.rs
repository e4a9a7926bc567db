//! Partitioned variables in checkpoints, as TensorFlow stores them: `SaveV2` with
//! `shape_and_slices` specs writes the variable's entry listing its slices and one entry per
//! slice; `RestoreV2` reads any slice (or the whole variable) from whichever stored slices
//! cover it, so a restore may use another partitioning than the save; `MergeV2Checkpoints`
//! joins the slice lists of the shards a sharded save writes on each ps.
//!
//! Against TensorFlow 2.21: the fixtures `tests/data/checkpoints/tf_partitioned*` (written by
//! `tests/checkpoint_slices_tf.py fixtures`) read in tessera and are written byte for byte by
//! tessera; and live (the same script), TensorFlow's `Saver` restores tessera's sliced
//! checkpoints with another number of partitions and `tf.train.load_checkpoint` reads them,
//! tessera restores what TensorFlow's `Saver` saves, each merges the other's shards, and a
//! TensorFlow client's `Saver(sharded=True)` saves a variable partitioned over two tessera ps
//! tasks (each ps writes its parts' slices, one merges) and restores it in another
//! partitioning. Under CI a missing TensorFlow fails the live tests; elsewhere they skip,
//! saying so.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use bytes::Bytes;
use tessera::client::Session;
use tessera::error::Code;
use tessera::format::checkpoint::bundle::{
    data_filename, index_filename, merge_bundles, write_specs, BundleReader, SaveSpec,
};
use tessera::format::checkpoint::slice::{decode_slice_key, slice_key};
use tessera::format::checkpoint::table::Table;
use tessera::graph::attr::value;
use tessera::graph::builder::{Graph, NodeSpec, Output};
use tessera::graph::fixed_size_partitioner;
use tessera::tensor::{DType, Shape, Tensor};
use tessera::train::checkpoint::{build_saver_ops_for, SavedVariable, Saver};
use tessera::train::checkpoint::{ShapeAndSlice, TensorSlice};

use crate::support::tensorflow::{tensorflow_python, Client, Trained};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/checkpoint_slices_tf.py");

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/checkpoints")
}

/// The script's `emb`: [10, 4] float32, `0.5 * i - 3`.
fn emb() -> Vec<f32> {
    (0..40).map(|i| i as f32 * 0.5 - 3.0).collect()
}

/// The script's `ids`: [7, 3] int64, `1000003 * i - 7`.
fn ids() -> Vec<i64> {
    (0..21).map(|i| i * 1_000_003 - 7).collect()
}

/// The script's `bias`.
fn bias() -> Vec<f32> {
    vec![0.25, -1.5, 1e-30, 65504.0]
}

/// Rows `rows` of a row-major `[_, cols]` matrix.
fn rows<T: Clone>(values: &[T], cols: usize, rows: std::ops::Range<usize>) -> Vec<T> {
    values[rows.start * cols..rows.end * cols].to_vec()
}

/// `fixed_size_partitioner(parts)`'s row ranges of `dim` rows (the first ones one longer).
fn partition(dim: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let (base, extra) = (dim / parts, dim % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            start += len;
            start - len..start
        })
        .collect()
}

/// TensorFlow's spec of `rows` of a `[dim, cols]` variable.
fn spec(dim: usize, cols: usize, rows: &std::ops::Range<usize>) -> ShapeAndSlice {
    ShapeAndSlice::parse(&format!(
        "{dim} {cols} {},{}:0,{cols}",
        rows.start,
        rows.len()
    ))
    .unwrap()
}

/// What TensorFlow's `Saver` gives `SaveV2` for the script's variables in `parts` parts:
/// sorted by name, each part with its spec.
fn saver_specs(parts: usize) -> Vec<SaveSpec> {
    let mut specs = vec![SaveSpec::whole(
        "bias",
        Tensor::from_vec(vec![4], bias()).unwrap(),
    )];
    for r in partition(10, parts) {
        let t = Tensor::from_vec(vec![r.len(), 4], rows(&emb(), 4, r.clone())).unwrap();
        specs.push(SaveSpec::slice("emb", spec(10, 4, &r), t));
    }
    for r in partition(7, parts) {
        let t = Tensor::from_vec(vec![r.len(), 3], rows(&ids(), 3, r.clone())).unwrap();
        specs.push(SaveSpec::slice("ids", spec(7, 3, &r), t));
    }
    specs
}

fn write(prefix: &str, specs: &[SaveSpec]) {
    write_specs(prefix, specs).unwrap();
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn assert_reads_the_scripts_values(reader: &BundleReader) {
    assert_eq!(reader.read("emb").unwrap().values::<f32>().unwrap(), emb());
    assert_eq!(reader.read("ids").unwrap().values::<i64>().unwrap(), ids());
    assert_eq!(
        reader.read("bias").unwrap().values::<f32>().unwrap(),
        bias()
    );
}

#[test]
fn slice_specs_parse_as_tensorflow_spells_them() {
    let s = ShapeAndSlice::parse("10 4 0,5:-").unwrap();
    assert_eq!(s.full_shape, Shape::new(vec![10, 4]));
    assert_eq!(s.slice_shape(), Shape::new(vec![5, 4]));
    assert_eq!(s.to_string(), "10 4 0,5:-");
    assert!(!s.is_whole());
    assert!(ShapeAndSlice::parse("10 4 0,10:-").unwrap().is_whole());
    assert!(ShapeAndSlice::parse("10 4 -:-").unwrap().is_whole());
    for (bad, says) in [
        ("10", "Need least two elements"),
        ("10 4 0,11:-", "out of bounds"),
        ("10 4 0,5", "axes"),
        ("10 x 0,5:-", "Non numerical dimension"),
        ("10 4 -1,5:-", "non-negative start"),
        ("10 4 0,0:-", "positive length"),
        ("10 4 0;5:-", "pair of numbers"),
    ] {
        let err = ShapeAndSlice::parse(bad).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad}");
        assert!(err.message().contains(says), "{bad}: {err}");
    }
}

#[test]
fn a_tensorflow_saver_checkpoint_of_partitioned_variables_reads_whole_and_in_other_slices() {
    let prefix = path(&fixtures().join("tf_partitioned/model.ckpt-4"));
    let reader = BundleReader::open(&prefix).unwrap();
    // The slice entries are not tensors of their own.
    let names: Vec<&String> = reader.entries().keys().collect();
    assert_eq!(names, ["bias", "emb", "ids"]);
    let slices: Vec<String> = reader
        .slices("emb")
        .unwrap()
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(slices, ["0,4:0,4", "4,3:0,4", "7,3:0,4"]);
    assert_reads_the_scripts_values(&reader);
    // Another partitioning: 2 parts, then a box crossing every stored slice.
    for r in partition(10, 2) {
        let t = reader.read_slice("emb", &spec(10, 4, &r).slice).unwrap();
        assert_eq!(t.dims(), [r.len(), 4]);
        assert_eq!(t.values::<f32>().unwrap(), rows(&emb(), 4, r));
    }
    let t = reader
        .read_slice("emb", &TensorSlice::parse("2,7:1,2").unwrap())
        .unwrap();
    let want: Vec<f32> = (2..9)
        .flat_map(|r| [emb()[r * 4 + 1], emb()[r * 4 + 2]])
        .collect();
    assert_eq!(t.values::<f32>().unwrap(), want);
    // A whole tensor read as a slice.
    let t = reader
        .read_slice("bias", &TensorSlice::parse("1,2").unwrap())
        .unwrap();
    assert_eq!(t.values::<f32>().unwrap(), bias()[1..3].to_vec());
}

#[test]
fn tessera_writes_tensorflows_sliced_bundle_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let ours = path(&dir.path().join("model.ckpt-4"));
    write(&ours, &saver_specs(3));
    let theirs = path(&fixtures().join("tf_partitioned/model.ckpt-4"));
    assert_eq!(
        std::fs::read(data_filename(&ours, 0, 1)).unwrap(),
        std::fs::read(data_filename(&theirs, 0, 1)).unwrap(),
        "data file"
    );
    assert_eq!(
        std::fs::read(index_filename(&ours)).unwrap(),
        std::fs::read(index_filename(&theirs)).unwrap(),
        "index file"
    );
}

#[test]
fn slice_keys_are_tensorflows_and_decode_back() {
    let reader =
        BundleReader::open(&path(&fixtures().join("tf_partitioned/model.ckpt-4"))).unwrap();
    let index = index_filename(reader.prefix());
    let bytes = std::fs::read(&index).unwrap();
    let table = Table::parse(&bytes, &index).unwrap();
    let keys: Vec<&[u8]> = table.entries().iter().map(|(k, _)| k.as_slice()).collect();
    for s in reader.slices("ids").unwrap() {
        let key = slice_key("ids", &s);
        // The key is in TensorFlow's index as written.
        assert!(keys.contains(&key.as_slice()), "{s}");
        let (name, back) = decode_slice_key(&key).unwrap();
        assert_eq!((name.as_slice(), &back), (&b"ids"[..], &s));
    }
}

#[test]
fn tessera_merges_sliced_shards_as_tensorflow_does() {
    // The two shards of `checkpoint_slices_tf.py shards`, written and merged by tessera, give
    // TensorFlow's merged files byte for byte.
    let dir = tempfile::tempdir().unwrap();
    let dest = path(&dir.path().join("model.ckpt-5"));
    let parts = [
        format!("{dest}_temp/part-00000-of-00002"),
        format!("{dest}_temp/part-00001-of-00002"),
    ];
    let e =
        |r: std::ops::Range<usize>| Tensor::from_vec(vec![r.len(), 4], rows(&emb(), 4, r)).unwrap();
    write(
        &parts[0],
        &[
            SaveSpec::whole("bias", Tensor::from_vec(vec![4], bias()).unwrap()),
            SaveSpec::slice("emb", spec(10, 4, &(0..4)), e(0..4)),
            SaveSpec::slice("emb", spec(10, 4, &(7..10)), e(7..10)),
        ],
    );
    write(
        &parts[1],
        &[
            SaveSpec::slice("emb", spec(10, 4, &(4..7)), e(4..7)),
            SaveSpec::whole("ids", Tensor::from_vec(vec![7, 3], ids()).unwrap()),
        ],
    );
    merge_bundles(&parts, &dest, true).unwrap();
    let reader = BundleReader::open(&dest).unwrap();
    assert_reads_the_scripts_values(&reader);
    let theirs = fixtures().join("tf_partitioned_sharded");
    for name in [
        "model.ckpt-5.index",
        "model.ckpt-5.data-00000-of-00002",
        "model.ckpt-5.data-00001-of-00002",
    ] {
        assert_eq!(
            std::fs::read(dir.path().join(name)).unwrap(),
            std::fs::read(theirs.join(name)).unwrap(),
            "{name}"
        );
    }
    assert_reads_the_scripts_values(
        &BundleReader::open(&path(&theirs.join("model.ckpt-5"))).unwrap(),
    );
}

#[test]
fn slices_of_strings_and_of_every_axis_assemble() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = path(&dir.path().join("s"));
    let words: Vec<Bytes> = (0..6)
        .map(|i| Bytes::from(format!("w{i}\u{0}\u{ff}")))
        .collect();
    let cube: Vec<i32> = (0..24).collect();
    let cut = |spec: &str| -> (ShapeAndSlice, Vec<i32>) {
        let s = ShapeAndSlice::parse(spec).unwrap();
        let r = s.ranges();
        let mut out = Vec::new();
        for a in r[0].clone() {
            for b in r[1].clone() {
                for c in r[2].clone() {
                    out.push(cube[a * 12 + b * 4 + c]);
                }
            }
        }
        (s, out)
    };
    let mut specs = vec![
        SaveSpec::slice(
            "words",
            ShapeAndSlice::parse("6 0,2").unwrap(),
            Tensor::from_strings(vec![2], words[0..2].to_vec()).unwrap(),
        ),
        SaveSpec::slice(
            "words",
            ShapeAndSlice::parse("6 2,4").unwrap(),
            Tensor::from_strings(vec![4], words[2..6].to_vec()).unwrap(),
        ),
    ];
    // A [2, 3, 4] tensor cut along its last axis in two, with `-` on the others.
    for s in ["2 3 4 -:-:0,1", "2 3 4 -:-:1,3"] {
        let (spec, values) = cut(s);
        let shape = spec.slice_shape();
        specs.push(SaveSpec::slice(
            "cube",
            spec,
            Tensor::from_vec(shape, values).unwrap(),
        ));
    }
    write(&prefix, &specs);
    let reader = BundleReader::open(&prefix).unwrap();
    assert_eq!(reader.read("words").unwrap().strings().unwrap(), words);
    let t = reader
        .read_slice("words", &TensorSlice::parse("1,3").unwrap())
        .unwrap();
    assert_eq!(t.strings().unwrap(), &words[1..4]);
    assert_eq!(reader.read("cube").unwrap().values::<i32>().unwrap(), cube);
    let (want_spec, want) = cut("2 3 4 1,1:1,2:-");
    let t = reader.read_slice("cube", &want_spec.slice).unwrap();
    assert_eq!(t.dims(), [1, 2, 4]);
    assert_eq!(t.values::<i32>().unwrap(), want);
}

#[test]
fn a_slice_the_checkpoint_does_not_cover_is_refused_naming_what_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = path(&dir.path().join("part"));
    // Only rows 0..4 of emb are saved (one ps's shard, unmerged).
    write(&prefix, &saver_specs(3)[..2]);
    let reader = BundleReader::open(&prefix).unwrap();
    let ok = reader.read_slice("emb", &TensorSlice::parse("1,2:-").unwrap());
    assert_eq!(ok.unwrap().values::<f32>().unwrap(), rows(&emb(), 4, 1..3));
    for slice in ["3,2:-", "-:-"] {
        let err = reader
            .read_slice("emb", &TensorSlice::parse(slice).unwrap())
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(
            err.message().contains("Does not have sufficient slices")
                && err.message().contains("0,4:0,4"),
            "{err}"
        );
    }
    assert_eq!(
        reader.read("emb").unwrap_err().code(),
        Code::InvalidArgument
    );
    let err = reader
        .read_slice("emb", &TensorSlice::parse("0,11:-").unwrap())
        .unwrap_err();
    assert!(err.message().contains("out of bounds"), "{err}");
}

#[test]
fn overlapping_duplicate_or_disagreeing_slices_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = path(&dir.path().join("bad"));
    let t = |n: usize| Tensor::from_vec(vec![n, 4], vec![0f32; n * 4]).unwrap();
    let cases: Vec<(Vec<SaveSpec>, &str)> = vec![
        (
            vec![
                SaveSpec::slice("emb", spec(10, 4, &(0..5)), t(5)),
                SaveSpec::slice("emb", spec(10, 4, &(4..6)), t(2)),
            ],
            "overlaps",
        ),
        (
            vec![
                SaveSpec::whole("emb", t(10)),
                SaveSpec::slice("emb", spec(10, 4, &(0..5)), t(5)),
            ],
            "both whole and as slices",
        ),
        (
            vec![
                SaveSpec::slice("emb", spec(10, 4, &(0..5)), t(5)),
                SaveSpec::slice("emb", spec(12, 4, &(5..7)), t(2)),
            ],
            "full shape",
        ),
        (
            vec![SaveSpec::slice("emb", spec(10, 4, &(0..5)), t(4))],
            "does not match the shape of the tensor to save",
        ),
    ];
    for (specs, says) in cases {
        let err = write_specs(&prefix, &specs).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{says}: {err}");
        assert!(err.message().contains(says), "{says}: {err}");
        assert!(!index_filename(&prefix).exists(), "{says}");
    }
}

/// A `[n]` string constant.
fn strings(g: &mut Graph, values: &[&str]) -> Output {
    let t = Tensor::from_strings(
        vec![values.len()],
        values.iter().map(|v| Bytes::from(v.to_string())).collect(),
    )
    .unwrap();
    g.constant(&t).unwrap()
}

/// Runs `SaveV2(prefix, names, specs, tensors)` in a session.
fn save_v2(
    prefix: &str,
    names: &[&str],
    specs: &[&str],
    tensors: &[Tensor],
) -> tessera::error::Result<()> {
    let mut g = Graph::new();
    let p = g.constant(&Tensor::string(prefix.to_string())).unwrap();
    let n = strings(&mut g, names);
    let s = strings(&mut g, specs);
    let values: Vec<Output> = tensors.iter().map(|t| g.constant(t).unwrap()).collect();
    let dtypes: Vec<DType> = tensors.iter().map(Tensor::dtype).collect();
    let save = g
        .add_op(
            NodeSpec::new("SaveV2")
                .input(&p)
                .input(&n)
                .input(&s)
                .input_list(&values)
                .attr("dtypes", value::dtype_list(&dtypes)),
        )
        .unwrap();
    let sess = Session::local();
    sess.extend(&g.to_graph_def()).unwrap();
    sess.run(&[], &[], &[&save]).map(|_| ())
}

/// Runs `RestoreV2(prefix, names, specs)` in a session.
fn restore_v2(
    prefix: &str,
    names: &[&str],
    specs: &[&str],
    dtypes: &[DType],
) -> tessera::error::Result<Vec<Tensor>> {
    let mut g = Graph::new();
    let p = g.constant(&Tensor::string(prefix.to_string())).unwrap();
    let n = strings(&mut g, names);
    let s = strings(&mut g, specs);
    let outs = g
        .add_node(
            NodeSpec::new("RestoreV2")
                .input(&p)
                .input(&n)
                .input(&s)
                .attr("dtypes", value::dtype_list(dtypes)),
        )
        .unwrap();
    let sess = Session::local();
    sess.extend(&g.to_graph_def()).unwrap();
    let fetches: Vec<String> = outs.iter().map(Output::name).collect();
    let refs: Vec<&str> = fetches.iter().map(String::as_str).collect();
    sess.run(&[], &refs, &[])
}

/// Runs `MergeV2Checkpoints(prefixes, dest)` in a session.
fn merge_v2(prefixes: &[&str], dest: &str) -> tessera::error::Result<()> {
    let mut g = Graph::new();
    let p = strings(&mut g, prefixes);
    let d = g.constant(&Tensor::string(dest.to_string())).unwrap();
    let merge = g
        .add_op(NodeSpec::new("MergeV2Checkpoints").input(&p).input(&d))
        .unwrap();
    let sess = Session::local();
    sess.extend(&g.to_graph_def()).unwrap();
    sess.run(&[], &[], &[&merge]).map(|_| ())
}

#[test]
fn the_kernels_save_slices_merge_shards_and_restore_another_partitioning() {
    let dir = tempfile::tempdir().unwrap();
    let dest = path(&dir.path().join("model.ckpt-9"));
    let part = |i: usize| format!("{dest}_temp/part-0000{i}-of-00002");
    let e =
        |r: std::ops::Range<usize>| Tensor::from_vec(vec![r.len(), 4], rows(&emb(), 4, r)).unwrap();
    // Two ps tasks, each saving its parts of emb (3 parts) with SaveV2.
    save_v2(
        &part(0),
        &["emb", "emb", "bias"],
        &["10 4 0,4:0,4", "10 4 7,3:0,4", ""],
        &[
            e(0..4),
            e(7..10),
            Tensor::from_vec(vec![4], bias()).unwrap(),
        ],
    )
    .unwrap();
    save_v2(&part(1), &["emb"], &["10 4 4,3:0,4"], &[e(4..7)]).unwrap();
    merge_v2(&[&part(0), &part(1)], &dest).unwrap();
    // Restored whole, as 2 parts, as 4 parts, and one crossing box.
    let f = DType::Float;
    let whole = restore_v2(&dest, &["emb", "bias"], &["", ""], &[f, f]).unwrap();
    assert_eq!(whole[0].values::<f32>().unwrap(), emb());
    assert_eq!(whole[1].values::<f32>().unwrap(), bias());
    for parts in [2, 4] {
        let specs: Vec<String> = partition(10, parts)
            .iter()
            .map(|r| spec(10, 4, r).to_string())
            .collect();
        let refs: Vec<&str> = specs.iter().map(String::as_str).collect();
        let got = restore_v2(&dest, &vec!["emb"; parts], &refs, &vec![f; parts]).unwrap();
        for (t, r) in got.iter().zip(partition(10, parts)) {
            assert_eq!(
                t.values::<f32>().unwrap(),
                rows(&emb(), 4, r),
                "{parts} parts"
            );
        }
    }
    // A spec whose full shape is not the stored one, and a wrong dtype.
    let err = restore_v2(&dest, &["emb"], &["12 4 0,4:-"], &[f]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("does not match the shape stored"),
        "{err}"
    );
    let err = restore_v2(&dest, &["emb"], &["10 4 0,4:-"], &[DType::Double]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    // A malformed spec names the tensor.
    let err = save_v2(&part(0), &["emb"], &["10 4 0,4"], &[e(0..4)]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("`emb`"), "{err}");
}

/// A graph with `emb` (the script's values) partitioned `parts` ways, its saver ops, and an
/// op that zeroes every part.
struct Partitioned {
    graph: Graph,
    value: String,
    saver: Saver,
    zero: String,
}

fn partitioned(parts: usize) -> Partitioned {
    let mut g = Graph::new();
    let init = g
        .constant(&Tensor::from_vec(vec![10, 4], emb()).unwrap())
        .unwrap();
    let pv = g
        .partitioned_variable("emb", &init, &fixed_size_partitioner(parts, 0))
        .unwrap();
    let b0 = g
        .constant(&Tensor::from_vec(vec![4], bias()).unwrap())
        .unwrap();
    let b = g.variable("bias", &b0).unwrap();
    let mut zeros = Vec::new();
    for (p, s) in pv.parts.iter().zip(&pv.slices) {
        let z = g
            .constant(&Tensor::zeros(DType::Float, s.var_shape.clone()).unwrap())
            .unwrap();
        zeros.push(g.assign_variable(&p.handle, &z).unwrap());
    }
    let refs: Vec<&str> = zeros.iter().map(String::as_str).collect();
    let zero = g.group("zero", &refs).unwrap();
    let mut saved = vec![SavedVariable::whole("bias", b)];
    saved.extend(SavedVariable::parts(&pv));
    let def = build_saver_ops_for(&mut g, &saved).unwrap();
    g.global_variables_initializer().unwrap();
    Partitioned {
        graph: g,
        value: pv.value.name(),
        saver: Saver::new(def, 5),
        zero,
    }
}

fn session(m: &Partitioned) -> Session {
    let s = Session::local();
    s.extend(&m.graph.to_graph_def()).unwrap();
    s
}

#[test]
fn the_saver_saves_a_partitioned_variable_as_slices_and_restores_it_in_another_partitioning() {
    let dir = tempfile::tempdir().unwrap();
    let three = partitioned(3);
    let s3 = session(&three);
    s3.run(&[], &[], &["init"]).unwrap();
    let prefix = three.saver.save(&s3, dir.path(), Some(1)).unwrap();
    let reader = BundleReader::open(&path(&prefix)).unwrap();
    let names: Vec<&String> = reader.entries().keys().collect();
    assert_eq!(names, ["bias", "emb"]);
    assert_eq!(reader.slices("emb").unwrap().len(), 3);
    // The same bytes TensorFlow's saver writes for these values (bias, then emb's parts).
    let mut specs = saver_specs(3);
    specs.truncate(4);
    let ours = path(&dir.path().join("expected"));
    write(&ours, &specs);
    assert_eq!(
        std::fs::read(index_filename(&path(&prefix))).unwrap(),
        std::fs::read(index_filename(&ours)).unwrap()
    );
    for parts in [2, 3, 4] {
        let other = partitioned(parts);
        let s = session(&other);
        s.run(&[], &[], &["init"]).unwrap();
        s.run(&[], &[], &[&other.zero]).unwrap();
        other.saver.restore(&s, &prefix).unwrap();
        let got = s.run(&[], &[&other.value], &[]).unwrap();
        assert_eq!(got[0].values::<f32>().unwrap(), emb(), "{parts} parts");
    }
}

// Live with TensorFlow.

/// Runs `checkpoint_slices_tf.py ARGS`; returns its JSON line.
fn script(python: &str, args: &[&str]) -> Trained {
    let mut command = Command::new(python);
    command
        .arg(SCRIPT)
        .args(args)
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .stdin(Stdio::null());
    Client::spawn(command).finish_quietly()
}

fn floats(t: &Trained, key: &str) -> Vec<f32> {
    let values = t.json[key].as_array();
    let values = values.unwrap_or_else(|| panic!("no {key} in {}", t.json));
    values.iter().map(|v| v.as_f64().unwrap() as f32).collect()
}

fn ints(t: &Trained, key: &str) -> Vec<i64> {
    let values = t.json[key].as_array();
    let values = values.unwrap_or_else(|| panic!("no {key} in {}", t.json));
    values.iter().map(|v| v.as_i64().unwrap()).collect()
}

fn assert_tensorflow_restored(t: &Trained, parts: i64) {
    assert_eq!(t.json["parts"].as_i64(), Some(parts), "{}", t.json);
    assert_eq!(floats(t, "emb"), emb(), "Saver.restore, {parts} parts");
    assert_eq!(ints(t, "ids"), ids(), "Saver.restore, {parts} parts");
    assert_eq!(floats(t, "bias"), bias());
    assert_eq!(floats(t, "loaded_emb"), emb(), "load_checkpoint");
    assert_eq!(ints(t, "loaded_ids"), ids(), "load_checkpoint");
    assert_eq!(
        t.json["shapes"]["emb"],
        serde_json::json!([10, 4]),
        "{}",
        t.json
    );
}

#[test]
fn tensorflow_restores_tesseras_sliced_checkpoints_in_any_partitioning() {
    let Some(python) = tensorflow_python("TensorFlow restores tessera's sliced checkpoint") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Written by the kernels: emb and ids in 3 parts.
    let prefix = path(&dir.path().join("model.ckpt-3"));
    let specs = saver_specs(3);
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let spec_strings: Vec<String> = specs
        .iter()
        .map(|s| {
            s.slice
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default()
        })
        .collect();
    let spec_refs: Vec<&str> = spec_strings.iter().map(String::as_str).collect();
    let tensors: Vec<Tensor> = specs.iter().map(|s| s.tensor.clone()).collect();
    save_v2(&prefix, &names, &spec_refs, &tensors).unwrap();
    for parts in [2, 3, 5] {
        let restored = script(&python, &["restore", &prefix, &parts.to_string()]);
        assert_tensorflow_restored(&restored, parts);
    }
}

#[test]
fn tessera_restores_tensorflows_saver_checkpoint_whole_and_in_another_partitioning() {
    let Some(python) = tensorflow_python("tessera restores TensorFlow's partitioned checkpoint")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let prefix = path(&dir.path().join("model.ckpt-4"));
    let saved = script(&python, &["save", &prefix, "3"]);
    assert_eq!(
        saved.strings("emb_specs"),
        ["10 4 0,4:0,4", "10 4 4,3:0,4", "10 4 7,3:0,4"]
    );
    let f = DType::Float;
    let whole = restore_v2(
        &prefix,
        &["emb", "ids", "bias"],
        &["", "", ""],
        &[f, DType::Int64, f],
    )
    .unwrap();
    assert_eq!(whole[0].values::<f32>().unwrap(), emb());
    assert_eq!(whole[1].values::<i64>().unwrap(), ids());
    assert_eq!(whole[2].values::<f32>().unwrap(), bias());
    let halves = restore_v2(
        &prefix,
        &["ids", "ids"],
        &["7 3 0,4:-", "7 3 4,3:-"],
        &[DType::Int64; 2],
    )
    .unwrap();
    assert_eq!(halves[0].values::<i64>().unwrap(), rows(&ids(), 3, 0..4));
    assert_eq!(halves[1].values::<i64>().unwrap(), rows(&ids(), 3, 4..7));
    // The Rust saver of a 2-part emb restores it.
    let two = partitioned(2);
    let s = session(&two);
    s.run(&[], &[], &["init"]).unwrap();
    s.run(&[], &[], &[&two.zero]).unwrap();
    two.saver.restore(&s, Path::new(&prefix)).unwrap();
    let got = s.run(&[], &[&two.value], &[]).unwrap();
    assert_eq!(got[0].values::<f32>().unwrap(), emb());
}

#[test]
fn each_runtime_merges_the_others_sliced_shards() {
    let Some(python) = tensorflow_python("merging sliced shards across runtimes") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // TensorFlow's shards, merged by tessera's kernel; TensorFlow restores in 4 parts.
    let dest = path(&dir.path().join("tf_shards/model.ckpt-5"));
    let shards = script(&python, &["shards", &dest]);
    let parts = shards.strings("parts");
    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
    merge_v2(&refs, &dest).unwrap();
    assert_reads_the_scripts_values(&BundleReader::open(&dest).unwrap());
    assert_tensorflow_restored(&script(&python, &["restore", &dest, "4"]), 4);
    // tessera's shards (its saver's SaveV2 on two ps), merged by TensorFlow; tessera reads.
    let dest = path(&dir.path().join("tessera_shards/model.ckpt-6"));
    let part = |i: usize| format!("{dest}_temp/part-0000{i}-of-00002");
    let specs = saver_specs(3);
    // bias and emb's parts 0 and 2 on one ps; emb's part 1 and ids' parts on the other.
    let (a, b): (Vec<_>, Vec<_>) = specs
        .into_iter()
        .enumerate()
        .partition(|(i, _)| matches!(i, 0 | 1 | 3));
    let a: Vec<SaveSpec> = a.into_iter().map(|(_, s)| s).collect();
    let b: Vec<SaveSpec> = b.into_iter().map(|(_, s)| s).collect();
    write(&part(0), &a);
    write(&part(1), &b);
    script(&python, &["merge", &dest, &part(0), &part(1)]);
    let reader = BundleReader::open(&dest).unwrap();
    assert_eq!(reader.num_shards(), 2);
    assert_reads_the_scripts_values(&reader);
    assert_tensorflow_restored(&script(&python, &["restore", &dest, "2"]), 2);
}

#[test]
fn a_hostile_index_claiming_huge_slices_is_data_loss_without_allocating_them() {
    use prost::Message;
    use tessera::format::checkpoint::table::{build_table, DEFAULT_BLOCK_SIZE};
    use tessera::proto::BundleEntryProto;
    let dir = tempfile::tempdir().unwrap();
    let prefix = path(&dir.path().join("evil"));
    write(&prefix, &saver_specs(3));
    let index = index_filename(&prefix);
    let bytes = std::fs::read(&index).unwrap();
    let table = Table::parse(&bytes, &index).unwrap();
    // emb claims [2^40, 4] in two slices, each entry 2^41 floats long.
    let rows = 1usize << 40;
    let halves = [0..rows / 2, rows / 2..rows];
    let mut full = BundleEntryProto::decode(
        table
            .entries()
            .iter()
            .find(|(k, _)| k.as_slice() == b"emb")
            .unwrap()
            .1
            .as_slice(),
    )
    .unwrap();
    full.shape = Some(Shape::new(vec![rows, 4]).to_proto());
    full.slices = halves
        .iter()
        .map(|r| spec(rows, 4, r).slice.to_proto())
        .collect();
    let mut rows_out: Vec<(Vec<u8>, Vec<u8>)> = table
        .entries()
        .iter()
        .filter(|(k, _)| k.first() != Some(&0) && k.as_slice() != b"emb")
        .cloned()
        .collect();
    rows_out.push((b"emb".to_vec(), full.encode_to_vec()));
    for r in &halves {
        let part = BundleEntryProto {
            dtype: full.dtype,
            shape: Some(Shape::new(vec![r.len(), 4]).to_proto()),
            size: (r.len() * 16) as i64,
            ..Default::default()
        };
        rows_out.push((
            slice_key("emb", &spec(rows, 4, r).slice),
            part.encode_to_vec(),
        ));
    }
    rows_out.sort();
    std::fs::write(&index, build_table(&rows_out, DEFAULT_BLOCK_SIZE).unwrap()).unwrap();
    let reader = BundleReader::open(&prefix).unwrap();
    for result in [
        reader.read("emb"),
        reader.read_slice("emb", &TensorSlice::parse("0,1024:-").unwrap()),
    ] {
        let err = result.unwrap_err();
        assert_eq!(err.code(), Code::DataLoss, "{err}");
        assert!(err.message().contains("file ends before"), "{err}");
    }
    assert_eq!(reader.verify().unwrap_err().code(), Code::DataLoss);
}

#[test]
fn tensorflows_sharded_saver_on_tessera_ps_tasks_saves_and_restores_partitioned_variables() {
    use crate::support::cluster::Cluster;
    let Some(python) = tensorflow_python("TensorFlow's sharded saver on tessera ps tasks") else {
        return;
    };
    let cluster = Cluster::start(&[("ps", 2), ("worker", 1)]);
    let master = format!("grpc://{}", cluster.addr("worker", 0));
    let ps = format!("{},{}", cluster.addr("ps", 0), cluster.addr("ps", 1));
    let worker = cluster.addr("worker", 0).to_string();
    let dir = tempfile::tempdir().unwrap();
    let prefix = path(&dir.path().join("model.ckpt-7"));
    // Each tessera ps runs SaveV2 with the slices of the parts it holds; one merges.
    let saved = script(
        &python,
        &["cluster_save", &prefix, "3", &master, &ps, &worker],
    );
    let devices = saved.strings("devices");
    assert!(devices[0].contains("/job:ps/task:0"), "{devices:?}");
    assert!(devices[1].contains("/job:ps/task:1"), "{devices:?}");
    let reader = BundleReader::open(&prefix).unwrap();
    assert_eq!(reader.num_shards(), 2);
    assert_eq!(reader.slices("emb").unwrap().len(), 3);
    assert_reads_the_scripts_values(&reader);
    // TensorFlow alone restores it in 2 parts; the tessera cluster restores it in 4.
    assert_tensorflow_restored(&script(&python, &["restore", &prefix, "2"]), 2);
    let restored = script(
        &python,
        &["cluster_restore", &prefix, "4", &master, &ps, &worker],
    );
    assert_eq!(restored.json["parts"].as_i64(), Some(4));
    assert_eq!(floats(&restored, "emb"), emb());
    assert_eq!(ints(&restored, "ids"), ids());
    assert_eq!(floats(&restored, "bias"), bias());
}

#[test]
fn a_whole_slice_is_saved_as_a_tensor_and_merges_of_clashing_shards_are_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let t = |n: usize| Tensor::from_vec(vec![n, 4], vec![1f32; n * 4]).unwrap();
    // "-:-" and "0,10:0,4" are the whole variable: TensorFlow saves a plain entry.
    let whole = path(&dir.path().join("whole"));
    write(
        &whole,
        &[
            SaveSpec::slice("a", ShapeAndSlice::parse("10 4 -:-").unwrap(), t(10)),
            SaveSpec::slice("b", ShapeAndSlice::parse("10 4 0,10:0,4").unwrap(), t(10)),
        ],
    );
    let reader = BundleReader::open(&whole).unwrap();
    assert!(reader.slices("a").unwrap().is_empty());
    assert!(reader.slices("b").unwrap().is_empty());
    assert_eq!(reader.entries().len(), 2);
    // Shards that save one element twice, or one tensor whole and as slices, do not merge,
    // and nothing is renamed or deleted.
    let shard = |name: &str, specs: &[SaveSpec]| {
        let p = path(&dir.path().join(name));
        write(&p, specs);
        p
    };
    let cases = [
        (
            [
                shard("o1", &[SaveSpec::slice("emb", spec(10, 4, &(0..6)), t(6))]),
                shard("o2", &[SaveSpec::slice("emb", spec(10, 4, &(5..10)), t(5))]),
            ],
            "overlaps",
        ),
        (
            [
                shard("w1", &[SaveSpec::whole("emb", t(10))]),
                shard("w2", &[SaveSpec::slice("emb", spec(10, 4, &(5..10)), t(5))]),
            ],
            "Duplicate tensor keyed by emb",
        ),
        (
            [
                shard("s1", &[SaveSpec::slice("emb", spec(10, 4, &(0..5)), t(5))]),
                shard("s2", &[SaveSpec::slice("emb", spec(12, 4, &(5..10)), t(5))]),
            ],
            "full shape",
        ),
    ];
    for (i, (parts, says)) in cases.into_iter().enumerate() {
        let dest = path(&dir.path().join(format!("merged-{i}")));
        let err = merge_bundles(&parts, &dest, true).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{says}: {err}");
        assert!(err.message().contains(says), "{says}: {err}");
        for p in &parts {
            assert!(index_filename(p).exists(), "{says}");
            assert!(data_filename(p, 0, 1).exists(), "{says}");
        }
        assert!(!index_filename(&dest).exists());
    }
}

#[test]
fn a_table_in_a_thousand_parts_restores_in_another_thousand() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = path(&dir.path().join("big"));
    let table: Vec<f32> = (0..2000).map(|i| i as f32).collect();
    let specs: Vec<SaveSpec> = partition(1000, 1000)
        .into_iter()
        .map(|r| {
            let t = Tensor::from_vec(vec![r.len(), 2], rows(&table, 2, r.clone())).unwrap();
            SaveSpec::slice("table", spec(1000, 2, &r), t)
        })
        .collect();
    write(&prefix, &specs);
    let reader = BundleReader::open(&prefix).unwrap();
    let mut restored = Vec::new();
    for r in partition(1000, 999) {
        let t = reader
            .read_slice("table", &spec(1000, 2, &r).slice)
            .unwrap();
        restored.extend_from_slice(&t.values::<f32>().unwrap());
    }
    assert_eq!(restored, table);
}

/// A 10 x 3 table in `parts` parts read by `embedding_lookup` and trained by Adagrad, with a
/// saver of every variable, the table and its accumulator as slices (`SavedVariable::all`).
struct AdagradTable {
    graph: Graph,
    table: tessera::graph::PartitionedVariable,
    train: String,
    init: String,
    saver: tessera::train::checkpoint::SaverDef,
}

fn adagrad_table(parts: usize) -> AdagradTable {
    use std::collections::BTreeMap;
    use tessera::graph::PartitionStrategy;
    use tessera::train::checkpoint::{build_saver_ops_for, SavedVariable};
    use tessera::train::optimizer::{variable_from_handle, Optimizer};
    let mut g = Graph::new();
    let values: Vec<f32> = (0..30).map(|i| (i as f32 - 15.0) / 10.0).collect();
    let init = g
        .constant(&Tensor::from_vec([10, 3], values).unwrap())
        .unwrap();
    let table = g
        .partitioned_variable("table", &init, &fixed_size_partitioner(parts, 0))
        .unwrap();
    let ids = g
        .constant(&Tensor::from_vec([5], vec![1i64, 4, 4, 9, 6]).unwrap())
        .unwrap();
    let rows = g
        .embedding_lookup(&table, &ids, PartitionStrategy::Div)
        .unwrap();
    let squares = g.mul(&rows, &rows).unwrap();
    let loss = g.sum(&squares, &[0, 1], false).unwrap();
    let train = Optimizer::from_name("adagrad", 0.5)
        .unwrap()
        .minimize_vars(&mut g, &loss, &table.parts, None)
        .unwrap();
    let variables: BTreeMap<String, _> = g
        .nodes()
        .iter()
        .filter(|n| n.op == "VarHandleOp")
        .map(|n| n.name.clone())
        .collect::<Vec<_>>()
        .into_iter()
        .map(|name| {
            let var = variable_from_handle(&g, &name).unwrap();
            (name, var)
        })
        .collect();
    let saver = build_saver_ops_for(
        &mut g,
        &SavedVariable::all(&variables, std::slice::from_ref(&table)),
    )
    .unwrap();
    let init = g.global_variables_initializer().unwrap();
    AdagradTable {
        graph: g,
        table,
        train,
        init,
        saver,
    }
}

/// The table's value and its Adagrad accumulator's, each as one [10, 3] matrix.
fn table_and_accumulator(session: &Session, t: &AdagradTable) -> (Vec<f32>, Vec<f32>) {
    let table = session.run(&[], &[&t.table.value.name()], &[]).unwrap();
    let mut accumulator = Vec::new();
    for part in &t.table.parts {
        let slot = format!("{}/Adagrad/Read/ReadVariableOp:0", part.handle.node);
        let value = session.run(&[], &[&slot], &[]).unwrap();
        accumulator.extend_from_slice(&value[0].values::<f32>().unwrap());
    }
    (table[0].values::<f32>().unwrap().to_vec(), accumulator)
}

#[test]
fn a_partitioned_tables_optimizer_slots_restore_under_another_partitioning() {
    use tessera::train::checkpoint::Saver;
    let dir = tempfile::tempdir().unwrap();
    let two = adagrad_table(2);
    let session = Session::local();
    session.extend(&two.graph.to_graph_def()).unwrap();
    session.run(&[], &[], &[&two.init]).unwrap();
    for _ in 0..3 {
        session.run(&[], &[], &[&two.train]).unwrap();
    }
    let trained = table_and_accumulator(&session, &two);
    let prefix = Saver::new(two.saver.clone(), 5)
        .save(&session, dir.path(), Some(3))
        .unwrap();
    // The checkpoint names the whole table and the whole accumulator, as TensorFlow does.
    let reader = BundleReader::open(&path(&prefix)).unwrap();
    for name in ["table", "table/Adagrad"] {
        let slices = reader.slices(name).unwrap();
        assert_eq!(slices.len(), 2, "{name}: {slices:?}");
    }

    for parts in [3, 1] {
        let other = adagrad_table(parts);
        let session = Session::local();
        session.extend(&other.graph.to_graph_def()).unwrap();
        Saver::new(other.saver.clone(), 5)
            .restore(&session, &prefix)
            .unwrap();
        assert_eq!(
            table_and_accumulator(&session, &other),
            trained,
            "{parts} parts"
        );
        // And it trains on: the accumulator has each part's shape.
        session.run(&[], &[], &[&other.train]).unwrap();
    }
}
