//! TFRecord files of `tf.train.Example`, the format TensorFlow users keep training data in:
//! each record an `Example` whose `features` map names to lists of floats, integers or bytes.
//!
//! An example's features are the values of its feature keys, in the order given
//! (`--feature_keys`), each a `float_list` or an `int64_list` (read as float32), concatenated;
//! without keys, every key but the label's, in name order. The label is an `int64_list` of one
//! value >= 0 under the label key (`--label_key`, default `label`). Every example must give the
//! same number of values, as `tf.io.parse_example` with a `FixedLenFeature` requires. A bad
//! record is INVALID_ARGUMENT naming the file, the record's 0-based index and the key; a
//! corrupt one is DATA_LOSS naming its byte offset ([`crate::format::tfrecord`]).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use prost::Message;

use super::Dataset;
use crate::error::{Result, Status};
use crate::format::tfrecord::RecordReader;
use crate::proto::{feature, Example};

/// How [`read_tfrecord`] reads examples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TfRecordOptions {
    /// The keys whose values make the features, in order; empty: every key but the label's,
    /// in name order (taken from the first record).
    pub feature_keys: Vec<String>,
    /// The key of the integer label.
    pub label_key: String,
}

impl Default for TfRecordOptions {
    fn default() -> Self {
        Self {
            feature_keys: Vec::new(),
            label_key: "label".into(),
        }
    }
}

/// Reads every `tf.train.Example` of the TFRecord file at `path`.
pub fn read_tfrecord(path: impl AsRef<Path>, options: &TfRecordOptions) -> Result<Dataset> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let file = File::open(path).map_err(|e| {
        let status = match e.kind() {
            std::io::ErrorKind::NotFound => Status::not_found,
            std::io::ErrorKind::PermissionDenied => Status::permission_denied,
            _ => Status::unavailable,
        };
        status(format!("cannot read TFRecord file {name}: {e}"))
    })?;
    let records = RecordReader::new(BufReader::new(file), name.clone());
    parse_examples(records, &name, options)
}

/// Parses serialized `Example`s; `file` names them in errors.
pub fn parse_examples(
    records: impl IntoIterator<Item = Result<Vec<u8>>>,
    file: &str,
    options: &TfRecordOptions,
) -> Result<Dataset> {
    let mut keys = options.feature_keys.clone();
    let mut width: Option<usize> = None;
    let mut features = Vec::new();
    let mut labels = Vec::new();
    for (index, record) in records.into_iter().enumerate() {
        let at = |what: String| Status::invalid_argument(format!("{file}: record {index}: {what}"));
        let example = Example::decode(record?.as_slice())
            .map_err(|e| at(format!("not a tf.train.Example ({e})")))?;
        let map = example.features.map(|f| f.feature).unwrap_or_default();
        if keys.is_empty() {
            keys = map
                .keys()
                .filter(|k| **k != options.label_key)
                .cloned()
                .collect();
            keys.sort();
            if keys.is_empty() {
                return Err(at(format!(
                    "no feature keys besides the label `{}`; name them with --feature_keys",
                    options.label_key
                )));
            }
            tracing::info!(file, keys = ?keys, "features from every key but the label's");
        }
        let label = match map.get(&options.label_key).and_then(|f| f.kind.as_ref()) {
            Some(feature::Kind::Int64List(list)) if list.value.len() == 1 => list.value[0],
            Some(_) => {
                return Err(at(format!(
                    "the label `{}` must be an int64_list of one value",
                    options.label_key
                )))
            }
            None => {
                let mut present: Vec<&String> = map.keys().collect();
                present.sort();
                return Err(at(format!(
                    "no label key `{}`; this record has {present:?} (--label_key)",
                    options.label_key
                )));
            }
        };
        if label < 0 {
            return Err(at(format!(
                "label {label} is negative; labels are classes 0, 1, ..."
            )));
        }
        let before = features.len();
        for key in &keys {
            match map.get(key).and_then(|f| f.kind.as_ref()) {
                Some(feature::Kind::FloatList(list)) => features.extend_from_slice(&list.value),
                Some(feature::Kind::Int64List(list)) => {
                    features.extend(list.value.iter().map(|&v| v as f32))
                }
                Some(feature::Kind::BytesList(_)) => {
                    return Err(at(format!(
                        "feature `{key}` is a bytes_list; tessera trains on float_list and \
                         int64_list features (--feature_keys)"
                    )))
                }
                None => return Err(at(format!("no feature `{key}` (--feature_keys)"))),
            }
        }
        let n = features.len() - before;
        match width {
            None if n == 0 => return Err(at(format!("the features {keys:?} hold no values"))),
            None => width = Some(n),
            Some(w) if w != n => {
                return Err(at(format!(
                    "{n} feature values where the first record has {w}; every example needs \
                     the same number"
                )))
            }
            Some(_) => {}
        }
        labels.push(label);
    }
    let width = width.ok_or_else(|| Status::invalid_argument(format!("{file}: no records")))?;
    Dataset::new(features, labels, width)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::error::Code;
    use crate::format::tfrecord::RecordWriter;
    use crate::proto::{Feature, Features, FloatList, Int64List};

    fn floats(v: &[f32]) -> Feature {
        Feature {
            kind: Some(feature::Kind::FloatList(FloatList { value: v.to_vec() })),
        }
    }

    fn ints(v: &[i64]) -> Feature {
        Feature {
            kind: Some(feature::Kind::Int64List(Int64List { value: v.to_vec() })),
        }
    }

    fn example(entries: Vec<(&str, Feature)>) -> Vec<u8> {
        let feature: HashMap<String, Feature> = entries
            .into_iter()
            .map(|(k, f)| (k.to_string(), f))
            .collect();
        Example {
            features: Some(Features { feature }),
        }
        .encode_to_vec()
    }

    fn parse(records: Vec<Vec<u8>>, options: &TfRecordOptions) -> Result<Dataset> {
        parse_examples(records.into_iter().map(Ok), "train.tfrecord", options)
    }

    #[test]
    fn keys_in_order_make_the_features_and_the_label_is_an_integer() {
        let records = vec![
            example(vec![
                ("b", ints(&[3])),
                ("a", floats(&[1.0, 2.0])),
                ("label", ints(&[1])),
            ]),
            example(vec![
                ("b", ints(&[6])),
                ("a", floats(&[4.0, 5.0])),
                ("label", ints(&[0])),
            ]),
        ];
        let d = parse(records.clone(), &TfRecordOptions::default()).unwrap();
        assert_eq!(d.num_features(), 3);
        assert_eq!(d.features(0), [1.0, 2.0, 3.0]);
        assert_eq!(d.features(1), [4.0, 5.0, 6.0]);
        assert_eq!(d.labels(), [1, 0]);
        let options = TfRecordOptions {
            feature_keys: vec!["b".into(), "a".into()],
            ..Default::default()
        };
        assert_eq!(
            parse(records, &options).unwrap().features(0),
            [3.0, 1.0, 2.0]
        );
    }

    #[test]
    fn bad_records_are_refused_naming_the_record_and_key() {
        let good = example(vec![("x", floats(&[1.0, 2.0])), ("label", ints(&[1]))]);
        let cases = [
            (example(vec![("x", floats(&[1.0]))]), "no label key `label`"),
            (
                example(vec![("x", floats(&[1.0, 2.0])), ("label", floats(&[1.0]))]),
                "int64_list of one",
            ),
            (
                example(vec![("x", floats(&[1.0])), ("label", ints(&[1]))]),
                "1 feature values where the first record has 2",
            ),
            (
                example(vec![("y", floats(&[1.0, 2.0])), ("label", ints(&[1]))]),
                "no feature `x`",
            ),
            (
                example(vec![("x", floats(&[1.0, 2.0])), ("label", ints(&[-1]))]),
                "negative",
            ),
            (b"\x0a\xff".to_vec(), "not a tf.train.Example"),
        ];
        for (bad, needle) in cases {
            let err = parse(vec![good.clone(), bad], &TfRecordOptions::default()).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{err}");
            assert!(
                err.message().contains("train.tfrecord: record 1: "),
                "{err}"
            );
            assert!(err.message().contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn a_file_round_trips_through_the_record_framing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.tfrecord");
        let mut writer = RecordWriter::new(File::create(&path).unwrap());
        for i in 0..5 {
            let e = example(vec![
                ("x", floats(&[i as f32, 0.5])),
                ("label", ints(&[i % 2])),
            ]);
            writer.write(&e).unwrap();
        }
        writer.flush().unwrap();
        let d = read_tfrecord(&path, &TfRecordOptions::default()).unwrap();
        assert_eq!(d.len(), 5);
        assert_eq!(d.features(3), [3.0, 0.5]);
        let err = read_tfrecord(dir.path().join("missing"), &TfRecordOptions::default());
        assert_eq!(err.unwrap_err().code(), Code::NotFound);
    }
}
