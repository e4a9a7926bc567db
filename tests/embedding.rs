//! `tessera local --model embedding` end to end: the wide-and-deep model on ids hashed into
//! tables partitioned over every ps task, trained by real processes of the binary on loopback.
//!
//! The data is the built-in click log (`--data clicks`: 20,000 examples of 4 id columns over
//! 100,000 ids each and 4 dense features, a 0/1 label drawn from a logistic model of the ids'
//! effects and the dense features) or a CSV file written here. What the model must beat is the
//! held-out log loss of predicting the training labels' mean for every example, which the
//! chief prints beside the model's.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::support::cluster::BIN;

/// Runs `tessera local` with `args` (its own `--timeout` bounds the job: past it every task
/// is killed and the launcher exits); returns its output, asserting it exited 0.
fn local(args: &[&str], logdir: &Path) -> String {
    let output: Output = Command::new(BIN)
        .arg("local")
        .args(args)
        .args(["--timeout", "240s", "--logdir"])
        .arg(logdir)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("tessera local runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "tessera local {args:?} ended with {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The chief's held-out scores: `(log loss, the label mean's log loss, AUC)`.
fn scores(stdout: &str) -> (f64, f64, f64) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("tessera: held-out log loss "))
        .unwrap_or_else(|| panic!("no log loss line:\n{stdout}"));
    let numbers: Vec<f64> = line
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect();
    match numbers[..] {
        [loss, baseline, auc] => (loss, baseline, auc),
        _ => panic!("unparsable scores line `{line}`"),
    }
}

/// Asserts the model learnt: its held-out log loss is below the label mean's by `margin`,
/// and its AUC is above chance by as much.
fn assert_learnt(stdout: &str, margin: f64) {
    let (loss, baseline, auc) = scores(stdout);
    assert!(
        loss < baseline - margin,
        "held-out log loss {loss}, the label mean's {baseline}:\n{stdout}"
    );
    assert!(auc > 0.5 + margin, "AUC {auc}:\n{stdout}");
}

#[test]
fn a_million_row_table_over_two_ps_tasks_trains_below_the_label_means_log_loss() {
    let runs = tempfile::tempdir().unwrap();
    // No --data: the embedding model's own default, the click log.
    let stdout = local(
        &[
            "--model",
            "embedding",
            "--ps",
            "2",
            "--table_rows",
            "1000000",
            "--embedding_dim",
            "32",
            "--steps",
            "600",
        ],
        runs.path(),
    );
    assert!(
        stdout.contains("1 ps and 2 workers") || stdout.contains("2 ps and 2 workers"),
        "{stdout}"
    );
    assert!(stdout.contains("1000000 x 32 embedding table"), "{stdout}");
    assert!(stdout.contains("trained to global step 6"), "{stdout}");
    // Measured: 0.603 against 0.650 after 600 steps (AUC 0.68).
    assert_learnt(&stdout, 0.02);
}

#[test]
fn towers_and_synchronous_replicas_train_the_embedding_model() {
    let runs = tempfile::tempdir().unwrap();
    let small = [
        "--model",
        "embedding",
        "--data",
        "clicks",
        "--ps",
        "2",
        "--table_rows",
        "50000",
        "--steps",
        "300",
    ];
    let towers = local(&[&small[..], &["--towers", "2"]].concat(), runs.path());
    assert_learnt(&towers, 0.02);
    let sync = local(&[&small[..], &["--sync"]].concat(), runs.path());
    assert!(sync.contains("trained to global step 300 "), "{sync}");
    assert_learnt(&sync, 0.02);
}

/// Writes a click log as CSV: a header, two id columns (`user`, `item`: large, sparse
/// integers), one dense column, the label in the middle. The label is 1 for a fixed third of
/// the users and 0 otherwise, flipped one time in ten.
fn write_clicks_csv(path: &Path, rows: usize) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut text = String::from("user,clicked,item,price\n");
    for _ in 0..rows {
        let user: i64 = 1_000_000_007 * rng.random_range(0..100i64);
        let item: i64 = rng.random_range(-50_000..50_000);
        let price: f32 = rng.random_range(0.0..1.0);
        let likes = user % 3 == 0;
        let clicked = likes != rng.random_bool(0.1);
        text.push_str(&format!("{user},{},{item},{price}\n", i64::from(clicked)));
    }
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_csv_of_id_columns_named_in_its_header_trains_the_embedding_model() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("clicks.csv");
    write_clicks_csv(&csv, 3000);
    let data = format!("csv:{}", csv.display());
    let stdout = local(
        &[
            "--model",
            "embedding",
            "--data",
            &data,
            "--id_columns",
            "user,item",
            "--label_column",
            "clicked",
            "--ps",
            "2",
            "--table_rows",
            "10000",
            "--learning_rate",
            "0.1",
            "--steps",
            "300",
        ],
        dir.path(),
    );
    // The users' ids decide the label: a model that learns them nears the log loss of the
    // flips alone, H(0.1) = 0.325 (measured: 0.356, the label mean's 0.658, AUC 0.88).
    let (loss, baseline, auc) = scores(&stdout);
    assert!(loss < 0.6 * baseline, "{loss} vs {baseline}:\n{stdout}");
    assert!(auc > 0.85, "AUC {auc}:\n{stdout}");
    // The TensorBoard run holds the scores the chief printed.
    let scalars = final_scalars(dir.path());
    for (tag, printed) in [("log_loss", loss), ("auc", auc)] {
        let logged = scalars.iter().find(|(t, _)| t == tag).map(|(_, v)| *v);
        let logged = logged.unwrap_or_else(|| panic!("no `{tag}` in the event file: {scalars:?}"));
        assert!(
            (logged - printed).abs() < 1e-3,
            "{tag}: logged {logged}, printed {printed}"
        );
    }
}

/// The scalars (tag, value) of every event file under `logdir`.
fn final_scalars(logdir: &Path) -> Vec<(String, f64)> {
    use tessera::proto::summary::value::Value;
    let mut found = Vec::new();
    for entry in std::fs::read_dir(logdir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("events.out.tfevents") {
            continue;
        }
        for event in tessera::format::events::read_events(&entry.path()).unwrap() {
            let Some(tessera::proto::event::What::Summary(summary)) = event.what else {
                continue;
            };
            for v in summary.value {
                if let Some(Value::SimpleValue(x)) = v.value {
                    found.push((v.tag, f64::from(x)));
                }
            }
        }
    }
    found
}

#[test]
fn the_embedding_model_without_ids_or_ids_without_it_is_refused_naming_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |args: &[&str]| {
        let output = Command::new(BIN)
            .arg("local")
            .args(args)
            .args(["--steps", "5", "--timeout", "120s", "--logdir"])
            .arg(dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} was accepted");
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    };
    let text = refused(&["--model", "embedding", "--data", "digits"]);
    assert!(
        text.contains("has no id columns") && text.contains("--id_columns"),
        "{text}"
    );
    let text = refused(&["--model", "mlp", "--data", "clicks"]);
    assert!(text.contains("only --model embedding"), "{text}");
    let text = refused(&["--model", "mlp", "--table_rows", "10"]);
    assert!(text.contains("--model embedding only"), "{text}");
}
