//! Data sources and iteration: seeded blobs, CSV and IDX files (good and bad), shards,
//! batches and shuffles.

use std::collections::BTreeSet;

use tessera::data::csv::{read_csv, CsvOptions, LabelColumn};
use tessera::data::idx::{read_idx, read_mnist, write_idx, IdxArray};
use tessera::data::{blobs, BatchOptions, BlobOptions, Dataset};
use tessera::tensor::DType;
use tessera::Code;

fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn blobs_are_reproducible_by_seed_and_separable() {
    let opts = BlobOptions::new(300, 3, 4).seed(7);
    let a = blobs(&opts).unwrap();
    assert_eq!(a, blobs(&opts).unwrap());
    assert_ne!(a, blobs(&opts.clone().seed(8)).unwrap());
    assert_eq!((a.len(), a.num_features(), a.num_classes()), (300, 4, 3));
    // Nearest class mean classifies nearly everything: the classes are separable.
    let mut means = vec![vec![0.0f64; 4]; 3];
    for i in 0..a.len() {
        let k = a.labels()[i] as usize;
        for (m, &x) in means[k].iter_mut().zip(a.features(i)) {
            *m += x as f64 / 100.0;
        }
    }
    let correct = (0..a.len())
        .filter(|&i| {
            let dist = |k: usize| -> f64 {
                means[k]
                    .iter()
                    .zip(a.features(i))
                    .map(|(m, &x)| (m - x as f64).powi(2))
                    .sum()
            };
            let best = (0..3).min_by(|&p, &q| dist(p).total_cmp(&dist(q))).unwrap();
            best as i64 == a.labels()[i]
        })
        .count();
    assert!(correct >= 290, "{correct}/300");
}

#[test]
fn split_is_seeded_and_partitions_the_examples() {
    let d = blobs(&BlobOptions::new(100, 2, 3).seed(1)).unwrap();
    let (train, held) = d.split(0.2, 5).unwrap();
    assert_eq!((train.len(), held.len()), (80, 20));
    let (train2, held2) = d.split(0.2, 5).unwrap();
    assert_eq!((&train, &held), (&train2, &held2));
    assert_ne!(held, d.split(0.2, 6).unwrap().1);
    // Every example lands in exactly one side (features identify examples here).
    let key = |ds: &Dataset, i: usize| {
        ds.features(i)
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    let mut all: Vec<_> = (0..train.len()).map(|i| key(&train, i)).collect();
    all.extend((0..held.len()).map(|i| key(&held, i)));
    all.sort();
    let mut want: Vec<_> = (0..d.len()).map(|i| key(&d, i)).collect();
    want.sort();
    assert_eq!(all, want);
    assert_eq!(d.split(1.5, 0).unwrap_err().code(), Code::InvalidArgument);
}

#[test]
fn csv_reads_features_and_label_columns() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(&dir, "d.csv", b"f1,f2,label\n1.5, -2,0\n\n3,4e-1,2\n");
    let d = read_csv(
        &p,
        &CsvOptions {
            label_column: None,
            header: Some(true),
            id_columns: Vec::new(),
        },
    )
    .unwrap();
    assert_eq!(d.len(), 2);
    assert_eq!(d.features(0), [1.5, -2.0]);
    assert_eq!(d.features(1), [3.0, 0.4]);
    assert_eq!(d.labels(), [0, 2]);
    let p = write(&dir, "first.csv", b"1,0.5,0.25\n0,1,2\n");
    let d = read_csv(
        &p,
        &CsvOptions {
            label_column: Some(LabelColumn::Index(0)),
            header: Some(false),
            id_columns: Vec::new(),
        },
    )
    .unwrap();
    assert_eq!(d.labels(), [1, 0]);
    assert_eq!(d.features(1), [1.0, 2.0]);
}

/// Every example of `d`: its features' bits and its label, in file order.
fn examples(d: &tessera::data::Dataset) -> Vec<(Vec<u32>, i64)> {
    (0..d.len())
        .map(|i| {
            let f = d.features(i).iter().map(|v| v.to_bits()).collect();
            (f, d.labels()[i])
        })
        .collect()
}

#[test]
fn csv_with_a_header_and_the_label_first_reads_as_without_header_and_label_last() {
    let dir = tempfile::tempdir().unwrap();
    // As spreadsheets and pandas' `to_csv(index=False)` write it: a header (quoted names, a
    // byte-order mark, CRLF line ends) and the label in the first column.
    let first = write(
        &dir,
        "first.csv",
        "\u{feff}species,\"sepal length\",sepal_width,petal\r\n2,5.1,3.5,1.4\r\n0,4.9,3,-0.2\r\n\
         1,6.25,2.5e-1,7\r\n"
            .as_bytes(),
    );
    let last = write(
        &dir,
        "last.csv",
        b"5.1,3.5,1.4,2\n4.9,3,-0.2,0\n6.25,0.25,7,1\n",
    );
    let want = read_csv(&last, &CsvOptions::default()).unwrap();
    assert_eq!(want.labels(), [2, 0, 1]);
    assert_eq!(want.features(2), [6.25, 0.25, 7.0]);
    for label in [LabelColumn::Name("species".into()), LabelColumn::Index(0)] {
        // The header is detected: its first row is not all numbers.
        let got = read_csv(
            &first,
            &CsvOptions {
                label_column: Some(label.clone()),
                header: None,
                id_columns: Vec::new(),
            },
        )
        .unwrap_or_else(|e| panic!("label {label}: {e}"));
        assert_eq!(examples(&got), examples(&want), "label {label}");
    }
    // A quoted name with a space is a name too; it picks the second column as the label.
    let p = write(&dir, "mid.csv", b"a,\"b c\",d\n1.5,3,2\n");
    let d = read_csv(
        &p,
        &CsvOptions {
            label_column: Some(LabelColumn::parse("b c").unwrap()),
            header: None,
            id_columns: Vec::new(),
        },
    )
    .unwrap();
    assert_eq!(d.labels(), [3]);
    assert_eq!(d.features(0), [1.5, 2.0]);

    // A header of numbers is data unless forced.
    let p = write(&dir, "numbers.csv", b"0,1,2\n0.5,1.5,1\n");
    assert_eq!(read_csv(&p, &CsvOptions::default()).unwrap().len(), 2);
    let forced = CsvOptions {
        label_column: Some(LabelColumn::parse("2").unwrap()),
        header: Some(true),
        id_columns: Vec::new(),
    };
    let d = read_csv(&p, &forced).unwrap();
    assert_eq!(
        examples(&d),
        vec![(vec![0.5f32.to_bits(), 1.5f32.to_bits()], 1)]
    );
}

#[test]
fn bad_label_columns_say_what_to_change() {
    let dir = tempfile::tempdir().unwrap();
    let named = write(&dir, "named.csv", b"x,y,label\n1,2,0\n");
    let plain = write(&dir, "plain.csv", b"1,2,0\n3,4,1\n");
    let label = |l: &str| CsvOptions {
        label_column: Some(LabelColumn::parse(l).unwrap()),
        header: None,
        id_columns: Vec::new(),
    };
    let cases = [
        (
            &named,
            label("class"),
            ":1: label column `class` is not in the header (columns: x, y, label); set \
             --label_column to one of them or to a 0-based index",
        ),
        (
            &named,
            label("3"),
            ":2: label column 3 does not exist; rows have 3 columns, set --label_column to an \
             index from 0 to 2 or to a name (x, y, label)",
        ),
        (
            &plain,
            label("label"),
            ":1: label column `label` is a name, but the file has no header line (its first \
             row is all numbers); set --label_column to a 0-based index",
        ),
        (
            &plain,
            label("7"),
            ":1: label column 7 does not exist; rows have 3 columns, set --label_column to an \
             index from 0 to 2",
        ),
    ];
    for (path, options, want) in cases {
        let err = read_csv(path, &options).map(|_| ()).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        let expect = format!("{}{want}", path.display());
        assert!(err.message().contains(&expect), "{err}\nwant {expect}");
    }
    // The header row is no data row: with `y` the label, the one example is labelled 2.
    let d = read_csv(&named, &label("y")).unwrap();
    assert_eq!(d.labels(), [2]);
    assert_eq!(d.features(0), [1.0, 0.0]);
    assert!(LabelColumn::parse(" ").is_err());
    // A header and nothing else has no data rows.
    let p = write(&dir, "header_only.csv", b"a,b\n\n");
    let err = read_csv(&p, &CsvOptions::default()).unwrap_err();
    assert!(err.message().contains("no data rows"), "{err}");
}

#[test]
fn bad_csv_rows_name_the_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let opts = CsvOptions::default();
    let cases: [(&str, &[u8], &str); 4] = [
        (
            "num.csv",
            b"1,2,0\n3,x7,1\n",
            ":2: column 2: `x7` is not a finite number",
        ),
        (
            "label.csv",
            b"1,2,0\n3,4,1.5\n",
            ":2: column 3: label `1.5` is not a non-negative integer",
        ),
        ("neg.csv", b"1,2,-1\n", ":1: column 3: label `-1`"),
        (
            "ragged.csv",
            b"1,2,0\n\n3,1\n",
            ":3: the row has 2 columns, the rows before it 3",
        ),
    ];
    for (name, text, want) in cases {
        let p = write(&dir, name, text);
        let err = read_csv(&p, &opts).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        let expect = format!("{}{want}", p.display());
        assert!(
            err.message().contains(&expect),
            "{name}: {err}\nwant {expect}"
        );
    }
    let err = read_csv(dir.path().join("missing.csv"), &opts).unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("missing.csv"), "{err}");
    let p = write(&dir, "empty.csv", b"\n\n");
    assert!(read_csv(&p, &opts)
        .unwrap_err()
        .message()
        .contains("no data rows"));
}

#[test]
fn idx_round_trips_and_reads_as_mnist() {
    let dir = tempfile::tempdir().unwrap();
    let images = IdxArray {
        dims: vec![3, 2, 2],
        data: vec![0, 255, 51, 102, 1, 2, 3, 4, 255, 255, 0, 0],
    };
    let labels = IdxArray {
        dims: vec![3],
        data: vec![7, 0, 9],
    };
    let (pi, pl) = (dir.path().join("img.idx"), dir.path().join("lab.idx"));
    write_idx(&pi, &images).unwrap();
    write_idx(&pl, &labels).unwrap();
    // The header as MNIST's files have it: 0x00000803 then big-endian dims.
    let raw = std::fs::read(&pi).unwrap();
    assert_eq!(
        &raw[..16],
        &[0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2]
    );
    assert_eq!(read_idx(&pi).unwrap(), images);
    let d = read_mnist(&pi, &pl).unwrap();
    assert_eq!((d.len(), d.num_features()), (3, 4));
    assert_eq!(d.features(0), [0.0, 1.0, 0.2, 0.4]);
    assert_eq!(d.labels(), [7, 0, 9]);
}

#[test]
fn truncated_idx_files_are_data_loss_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let whole = [0u8, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6];
    for cut in [2, 10, 17] {
        let p = write(&dir, &format!("cut{cut}.idx"), &whole[..cut]);
        let err = read_idx(&p).unwrap_err();
        assert_eq!(err.code(), Code::DataLoss, "cut at {cut}: {err}");
        assert!(err.message().contains(&p.display().to_string()), "{err}");
        assert!(err.message().contains("truncated"), "{err}");
    }
    let p = write(&dir, "bad.idx", &[1, 2, 8, 1, 0, 0, 0, 0]);
    assert_eq!(read_idx(&p).unwrap_err().code(), Code::InvalidArgument);
    // Labels that do not match the images' count.
    let pi = write(&dir, "i.idx", &whole);
    let pl = write(&dir, "l.idx", &[0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3]);
    let err = read_mnist(&pi, &pl).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("l.idx"), "{err}");
}

fn ids(d: &Dataset) -> Vec<usize> {
    (0..d.len()).map(|i| d.features(i)[0] as usize).collect()
}

/// Example `i` has feature `i` and label `i % 3`.
fn numbered(n: usize) -> Dataset {
    Dataset::new(
        (0..n).map(|i| i as f32).collect(),
        (0..n).map(|i| (i % 3) as i64).collect(),
        1,
    )
    .unwrap()
}

#[test]
fn shards_are_disjoint_and_cover_everything() {
    let d = numbered(10);
    let shards: Vec<Vec<usize>> = (0..3).map(|k| ids(&d.shard(3, k).unwrap())).collect();
    assert_eq!(shards[0], [0, 3, 6, 9]);
    assert_eq!(shards[1], [1, 4, 7]);
    assert_eq!(shards[2], [2, 5, 8]);
    let all: BTreeSet<usize> = shards.iter().flatten().copied().collect();
    assert_eq!(all.len(), 10);
    assert_eq!(d.shard(3, 3).unwrap_err().code(), Code::InvalidArgument);
    assert_eq!(d.shard(0, 0).unwrap_err().code(), Code::InvalidArgument);
}

#[test]
fn batches_have_the_right_shapes_and_remainders() {
    let d = numbered(10);
    let opts = BatchOptions::new(4).shuffle(false);
    let batches: Vec<_> = d.batches(&opts, 0).unwrap().collect();
    assert_eq!(batches.len(), 3);
    assert_eq!(batches[0].x.shape().dims(), [4, 1]);
    assert_eq!(batches[0].x.dtype(), DType::Float);
    assert_eq!(batches[0].y.shape().dims(), [4]);
    assert_eq!(batches[0].y.dtype(), DType::Int64);
    assert_eq!(batches[2].len(), 2);
    assert_eq!(batches[0].y.values::<i64>().unwrap().as_ref(), [0, 1, 2, 0]);
    let dropped: Vec<_> = d
        .batches(&opts.clone().drop_remainder(true), 0)
        .unwrap()
        .collect();
    assert_eq!(dropped.len(), 2);
    assert!(d.batches(&BatchOptions::new(0), 0).is_err());
}

#[test]
fn shuffles_are_reproducible_per_seed_and_epoch() {
    let d = numbered(50);
    let order = |seed: u64, epoch: u64| -> Vec<usize> {
        d.batches(&BatchOptions::new(7).seed(seed), epoch)
            .unwrap()
            .flat_map(|b| {
                b.x.values::<f32>()
                    .unwrap()
                    .iter()
                    .map(|&v| v as usize)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let a = order(3, 0);
    assert_eq!(a, order(3, 0));
    assert_ne!(a, order(3, 1), "each epoch has its own order");
    assert_ne!(a, order(4, 0));
    assert_ne!(a, (0..50).collect::<Vec<_>>());
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        (0..50).collect::<Vec<_>>(),
        "a shuffle is a permutation"
    );
}

#[test]
fn csv_id_columns_are_read_as_integers_apart_from_the_features() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        &dir,
        "clicks.csv",
        b"user,price,clicked,item\n9007199254740993,0.5,1,-7\n12,1.25,0,40\n",
    );
    let options = CsvOptions {
        label_column: Some(LabelColumn::Name("clicked".into())),
        header: None,
        id_columns: vec![LabelColumn::Name("user".into()), LabelColumn::Index(3)],
    };
    let d = read_csv(&p, &options).unwrap();
    assert_eq!((d.len(), d.num_features(), d.num_ids()), (2, 1, 2));
    // Past 2^53: an id is exact, as no float feature could hold it.
    assert_eq!(d.ids(0), [9_007_199_254_740_993, -7]);
    assert_eq!(d.ids(1), [12, 40]);
    assert_eq!(d.features(1), [1.25]);
    assert_eq!(d.labels(), [1, 0]);
    // Batches carry them: [b, 2] int64 beside x [b, 1].
    let batch = d
        .batches(&BatchOptions::new(2).shuffle(false), 0)
        .unwrap()
        .next()
        .unwrap();
    let ids = batch.ids.expect("ids");
    assert_eq!(ids.shape().dims(), [2, 2]);
    assert_eq!(ids.values::<i64>().unwrap()[3], 40);
    // Hashed ids stay with their examples through a selection.
    let hashed = d.map_ids(|column, id| id * 10 + column as i64);
    assert_eq!(hashed.select(&[1]).ids(0), [120, 401]);

    let refused = |text: &[u8], ids: Vec<LabelColumn>, needles: &[&str]| {
        let p = write(&dir, "bad.csv", text);
        let options = CsvOptions {
            id_columns: ids,
            ..CsvOptions::default()
        };
        let err = read_csv(&p, &options).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        for needle in needles {
            assert!(err.message().contains(needle), "{needle}: {err}");
        }
    };
    refused(
        b"a,b,label\n1,2.5,0\n",
        vec![LabelColumn::Index(1)],
        &[
            "bad.csv:2: column 2",
            "id `2.5` is not an integer",
            "--id_columns",
        ],
    );
    refused(
        b"a,b,label\n1,2,0\n",
        vec![LabelColumn::Name("label".into())],
        &["id column label is the label's column"],
    );
    refused(
        b"a,b,label\n1,2,0\n",
        vec![LabelColumn::Index(0), LabelColumn::Name("a".into())],
        &["names column a twice"],
    );
    refused(
        b"a,b,label\n1,2,0\n",
        vec![LabelColumn::Name("user".into())],
        &[
            "id column `user` is not in the header (columns: a, b, label)",
            "--id_columns",
        ],
    );
}

#[test]
fn clicks_are_reproducible_by_seed_and_skewed_toward_few_ids() {
    use tessera::data::{clicks, ClickOptions};
    let options = ClickOptions::new().seed(4);
    let a = clicks(&options).unwrap();
    assert_eq!(a, clicks(&options).unwrap());
    assert_ne!(a, clicks(&options.clone().seed(5)).unwrap());
    assert_eq!(
        (a.len(), a.num_ids(), a.num_features(), a.num_classes()),
        (20_000, 4, 4, 2)
    );
    // Ids are u³-skewed: a tenth of the examples' ids fall below vocabulary / 1000.
    let small = (0..a.len()).filter(|&i| a.ids(i)[0] < 100).count() as f64 / a.len() as f64;
    assert!((0.07..0.13).contains(&small), "{small}");
    let positive = a.labels().iter().filter(|&&l| l == 1).count() as f64 / a.len() as f64;
    assert!((0.15..0.6).contains(&positive), "{positive}");
}

#[test]
fn the_teachers_data_is_seeded_sized_and_of_unit_variance() {
    use tessera::data::{teacher, TeacherOptions};
    let options = TeacherOptions {
        num_examples: 200,
        inputs: 16,
        outputs: 8,
        rank: 2,
        noise: 0.01,
        seed: 3,
    };
    let data = teacher(&options).unwrap();
    assert_eq!(data, teacher(&options).unwrap());
    assert_ne!(data, teacher(&options.clone().seed(4)).unwrap());
    assert_eq!(
        (data.len(), data.num_features(), data.num_targets()),
        (200, 16, 8)
    );
    let batch = data.select(&[0, 1, 2]).to_batch().unwrap();
    assert_eq!(batch.y.dims(), [3, 8]);
    assert_eq!(batch.y.dtype(), DType::Float);
    assert_eq!(batch.len(), 3);
    let squares: f32 = (0..200)
        .flat_map(|i| data.targets(i).to_vec())
        .map(|t| t * t)
        .sum();
    let variance = squares / (200.0 * 8.0);
    assert!((0.5..2.0).contains(&variance), "target variance {variance}");
    // That the targets follow the features is what tests/train.rs's regression job learns.
    assert!(teacher(&TeacherOptions { rank: 0, ..options }).is_err());
}
