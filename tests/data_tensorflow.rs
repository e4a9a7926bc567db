//! The data files users bring, as their own tools write and read them
//! (`tests/data_tensorflow.py`): a TFRecord file of `tf.train.Example`s written by TensorFlow's
//! `TFRecordWriter`, and a CSV file with a header and the label first written by pandas. tessera
//! must read the same examples that `tf.io.parse_example` and `pandas.read_csv` read, and
//! train on them.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::cluster::BIN;
use crate::support::tensorflow::{python_with, Client, Trained};
use tessera::data::csv::{read_csv, CsvOptions, LabelColumn};
use tessera::data::tfrecord::{read_tfrecord, TfRecordOptions};
use tessera::data::Dataset;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data_tensorflow.py");

/// Runs the script's `kind` in `dir`; `None` (said) without the Python it needs.
fn written_by_python(test: &str, modules: &[&str], kind: &str, dir: &Path) -> Option<Trained> {
    let python = python_with(test, modules)?;
    let mut command = Command::new(python);
    command.arg(SCRIPT).arg(kind).arg(dir);
    Some(Client::spawn(command).finish())
}

/// `data` holds exactly the examples Python read.
fn assert_same_examples(data: &Dataset, python: &Trained) {
    let labels: Vec<i64> = python.json["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(data.labels(), labels.as_slice());
    let rows = python.json["features"].as_array().unwrap();
    assert_eq!(rows.len(), data.len());
    for (i, row) in rows.iter().enumerate() {
        let want: Vec<f32> = row
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(data.features(i), want.as_slice(), "example {i}");
    }
}

/// `tessera local` trains on `data_args` and reaches `accuracy` held out.
fn trains(data_args: &[&str], accuracy: f64) {
    let runs = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["local", "--steps", "600", "--timeout", "150s", "--logdir"])
        .arg(runs.path())
        .args(data_args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.contains("held-out accuracy"))
        .unwrap_or_else(|| panic!("no accuracy line:\n{stdout}"));
    let got: f64 = line
        .split("held-out accuracy ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(got / 100.0 >= accuracy, "{line}");
}

#[test]
fn a_tfrecord_file_written_by_tensorflow_reads_as_parse_example_reads_it_and_trains() {
    let dir = tempfile::tempdir().unwrap();
    let modules = ["tensorflow", "sklearn"];
    let Some(python) = written_by_python("tfrecord", &modules, "tfrecord", dir.path()) else {
        return;
    };
    let path = python.json["path"].as_str().unwrap().to_string();
    let options = TfRecordOptions {
        feature_keys: vec!["pixels".into(), "rows".into()],
        label_key: "label".into(),
    };
    let data = read_tfrecord(&path, &options).unwrap();
    assert_eq!((data.len(), data.num_features()), (1797, 72));
    assert_same_examples(&data, &python);
    // Every key but the label's, in name order, is the same here: pixels, rows.
    assert_eq!(
        read_tfrecord(&path, &TfRecordOptions::default()).unwrap(),
        data
    );
    trains(
        &[
            "--data",
            &format!("tfrecord:{path}"),
            "--feature_keys",
            "pixels,rows",
        ],
        0.9,
    );
}

#[test]
fn a_csv_file_with_a_header_and_the_label_first_reads_as_pandas_reads_it_and_trains() {
    let dir = tempfile::tempdir().unwrap();
    let Some(python) = written_by_python("csv", &["pandas", "sklearn"], "csv", dir.path()) else {
        return;
    };
    let path = python.json["path"].as_str().unwrap().to_string();
    let options = CsvOptions {
        label_column: Some(LabelColumn::Name("species".into())),
        header: None,
        id_columns: Vec::new(),
    };
    let data = read_csv(&path, &options).unwrap();
    assert_eq!((data.len(), data.num_features()), (150, 4));
    assert_same_examples(&data, &python);
    trains(
        &[
            "--data",
            &format!("csv:{path}"),
            "--label_column",
            "species",
        ],
        0.8,
    );
}
