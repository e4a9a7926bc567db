//! TensorFlow compatibility against checkpoints TensorFlow 2.21 wrote
//! (`tests/data/checkpoints/make_tf_fixtures.py` made them with `tf.raw_ops.SaveV2`,
//! `MergeV2Checkpoints` and `update_checkpoint_state`): tessera reads them with the values the
//! script gave, and writes the same tensors as byte-identical files.
//!
//! The other direction (TensorFlow reading tessera's files) was checked by running
//! `tests/data/checkpoints/verify_with_tf.py` on `tessera_written/`, which the ignored test
//! below regenerates; the byte-identical files here make it hold for every run. A checkpoint
//! of TensorFlow's own saver graph run on tessera (`write_saver_checkpoint_for_tensorflow` in
//! `checkpoint_saver.rs`) was read the same way, with `tf.train.latest_checkpoint` parsing
//! tessera's state file.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use tessera::format::checkpoint::bundle::{
    data_filename, index_filename, write_bundle, BundleReader,
};
use tessera::tensor::Tensor;
use tessera::train::checkpoint::{latest_checkpoint, read_state};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/checkpoints")
}

/// The tensors of `make_tf_fixtures.py`, in the order it saved them.
fn tensors() -> Vec<(String, Tensor)> {
    vec![
        (
            "a/f32".into(),
            Tensor::from_vec(vec![2, 3], vec![0.5f32, -1.25, 3.0, 1e-30, -0.0, 65504.0]).unwrap(),
        ),
        (
            "b/f64".into(),
            Tensor::from_vec(vec![2], vec![std::f64::consts::PI, -2.5]).unwrap(),
        ),
        (
            "c/i32".into(),
            Tensor::from_vec(vec![3], vec![-7i32, 0, 2147483647]).unwrap(),
        ),
        ("d/i64".into(), Tensor::scalar(1234567890123i64)),
        (
            "e/bool".into(),
            Tensor::from_vec(vec![4], vec![true, false, false, true]).unwrap(),
        ),
        (
            "f/str".into(),
            Tensor::from_strings(
                vec![3],
                vec![
                    Bytes::from("hello"),
                    Bytes::new(),
                    Bytes::from(&b"\xff\x00bytes"[..]),
                ],
            )
            .unwrap(),
        ),
        ("global_step".into(), Tensor::scalar(7i64)),
    ]
}

fn assert_reads_back(reader: &BundleReader) {
    for (name, want) in tensors() {
        let got = reader.read(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.dtype(), want.dtype(), "{name}");
        assert_eq!(got.dims(), want.dims(), "{name}");
        match want.bytes() {
            Some(b) => assert_eq!(got.bytes().unwrap(), b, "{name}"),
            None => assert_eq!(got.strings().unwrap(), want.strings().unwrap(), "{name}"),
        }
    }
}

#[test]
fn a_checkpoint_tensorflow_wrote_reads_in_tessera() {
    let prefix = fixtures().join("tf_written/model.ckpt-7");
    let reader = BundleReader::open(&prefix.to_string_lossy()).unwrap();
    assert_eq!(reader.num_shards(), 1);
    assert_eq!(reader.entries().len(), 7);
    assert_reads_back(&reader);
}

#[test]
fn a_sharded_checkpoint_tensorflow_merged_reads_in_tessera() {
    let prefix = fixtures().join("tf_sharded/model.ckpt-3");
    let reader = BundleReader::open(&prefix.to_string_lossy()).unwrap();
    assert_eq!(reader.num_shards(), 2);
    assert_eq!(reader.entries()["a/f32"].shard_id, 0);
    assert_eq!(reader.entries()["global_step"].shard_id, 1);
    assert_reads_back(&reader);
}

#[test]
fn tensorflows_state_file_names_the_latest_checkpoint() {
    let dir = fixtures().join("tf_written");
    let state = read_state(&dir).unwrap().unwrap();
    assert_eq!(
        state.all_model_checkpoint_paths,
        vec![dir.join("model.ckpt-7").to_string_lossy().into_owned()]
    );
    assert_eq!(
        latest_checkpoint(&dir).unwrap(),
        Some(dir.join("model.ckpt-7"))
    );
}

#[test]
fn tessera_writes_the_same_bytes_as_tensorflow() {
    let dir = tempfile::tempdir().unwrap();
    let ours = dir
        .path()
        .join("model.ckpt-7")
        .to_string_lossy()
        .into_owned();
    write_bundle(&ours, &tensors()).unwrap();
    let theirs = fixtures()
        .join("tf_written/model.ckpt-7")
        .to_string_lossy()
        .into_owned();
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

/// Regenerates `tests/data/checkpoints/tessera_written/` (a two-shard checkpoint made by the
/// saver ops) for `verify_with_tf.py`: `cargo test --test integration checkpoint_tf_compat:: -- --ignored`.
#[test]
#[ignore]
fn write_fixture_for_tensorflow() {
    let out = fixtures().join("tessera_written");
    let _ = std::fs::remove_dir_all(&out);
    let dest = out.join("model.ckpt-3").to_string_lossy().into_owned();
    let parts = [
        format!("{dest}_temp/part-00000-of-00002"),
        format!("{dest}_temp/part-00001-of-00002"),
    ];
    let all = tensors();
    write_bundle(&parts[0], &all[..3]).unwrap();
    write_bundle(&parts[1], &all[3..]).unwrap();
    tessera::train::checkpoint::merge_bundles(&parts, &dest, true).unwrap();
    assert_reads_back(&BundleReader::open(&dest).unwrap());
}

#[test]
fn tesseras_sharded_fixture_matches_tensorflows_byte_for_byte() {
    // Both were merged from the same two shards, so every file is identical.
    for name in [
        "model.ckpt-3.index",
        "model.ckpt-3.data-00000-of-00002",
        "model.ckpt-3.data-00001-of-00002",
    ] {
        let ours = fixtures().join("tessera_written").join(name);
        let theirs = fixtures().join("tf_sharded").join(name);
        assert_eq!(
            std::fs::read(&ours).unwrap(),
            std::fs::read(&theirs).unwrap(),
            "{name}"
        );
    }
}
