//! The cluster file, environment overrides, classic flags and `TF_CONFIG`: each good input's
//! typed values and each bad input's exact message.
//!
//! Environment overrides are passed to `from_file_with_env` as a list, so no test touches the
//! process environment and tests cannot race.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera::cluster::{ClassicFlags, ClusterSpec, ConfigError, TaskConfig, TaskId};
use tessera::Code;

/// A file under `tests/data`, as a relative path so messages name it as a person would.
fn data(name: &str) -> PathBuf {
    let path = Path::new("tests/data").join(name);
    assert!(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(&path).exists(),
        "fixture {} is missing",
        path.display()
    );
    path
}

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn load(name: &str, vars: &[(&str, &str)]) -> Result<TaskConfig, ConfigError> {
    // Cargo runs integration tests in the package root, where `tests/data/...` resolves.
    TaskConfig::from_file_with_env(&data(name), env(vars))
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("test address")
}

#[test]
fn the_example_file_loads_with_the_values_its_comments_document() {
    let path = Path::new("config/cluster.example.toml");
    let config = TaskConfig::from_file_with_env(path, Vec::new()).expect("example loads");
    let expected = ClusterSpec::from_dense([
        ("chief", vec!["c0.example:2222"]),
        ("ps", vec!["ps0.example:2222"]),
        ("worker", vec!["w0.example:2222", "w1.example:2222"]),
    ]);
    assert_eq!(config.cluster, expected);
    assert_eq!(
        config.standbys.addresses.get(&0).map(String::as_str),
        Some("ps0b.example:2222"),
        "ps 0's standby, outside the cluster's jobs"
    );
    assert_eq!(config.task, TaskId::new("worker", 0));
    assert_eq!(config.listen, addr("0.0.0.0:2222"));
    assert_eq!(config.devices.cpu_count.get(), 1);
    assert_eq!(config.devices.gpu_count, Some(1));
    assert_eq!(config.devices.gpu_memory_fraction, 0.9);
    assert!(!config.devices.allow_growth);
    assert_eq!(config.devices.visible_devices, vec![0, 1]);
    assert!(config.devices.soft_placement);
    assert_eq!(config.timeouts.connect, Duration::from_secs(10));
    assert_eq!(config.timeouts.rpc, Duration::from_secs(60));
    assert_eq!(config.timeouts.create_session, Duration::from_secs(30));
    assert_eq!(config.timeouts.shutdown_grace, Duration::from_secs(5));
    assert_eq!(config.timeouts.startup, Duration::from_secs(2 * 60 * 60));
    assert_eq!(config.task_address().unwrap(), "w0.example:2222");
    assert_eq!(
        config.checkpoints.allowed_dirs,
        Some(vec![PathBuf::from("/var/lib/tessera/checkpoints")])
    );
    assert_eq!(
        config.data.allowed_dirs,
        Some(vec![PathBuf::from("/var/lib/tessera/data")])
    );
    assert!(
        !config.is_chief(),
        "the example has a chief job, so worker 0 is not chief"
    );
}

#[test]
fn the_embedded_local_file_is_one_ps_and_two_workers_on_port_zero() {
    let from_disk = std::fs::read_to_string("config/local.toml").unwrap();
    assert_eq!(TaskConfig::embedded_local(), from_disk);
    let config = TaskConfig::from_embedded_local(Vec::new()).unwrap();
    let expected = ClusterSpec::from_dense([
        ("ps", vec!["127.0.0.1:0"]),
        ("worker", vec!["127.0.0.1:0", "127.0.0.1:0"]),
    ]);
    assert_eq!(config.cluster, expected);
    assert_eq!(config.task, TaskId::new("worker", 0));
    assert_eq!(config.listen, addr("127.0.0.1:0"));
    // The launcher starts the ps from the same text with one override.
    let ps = TaskConfig::from_embedded_local(env(&[("TESSERA__TASK__JOB", "ps")])).unwrap();
    assert_eq!(ps.task, TaskId::new("ps", 0));
}

#[test]
fn sparse_jobs_keep_their_integer_keys_and_listen_defaults_to_the_task_port() {
    let config = load("good_sparse.toml", &[]).unwrap();
    assert_eq!(config.cluster.task_indices("worker").unwrap(), vec![1, 3]);
    assert_eq!(
        config.cluster.task_address("worker", 3).unwrap(),
        "w3.example:2222"
    );
    assert_eq!(config.task, TaskId::new("worker", 3));
    // No `listen`: every interface, at the port of w3.example:2222.
    assert_eq!(config.listen, addr("0.0.0.0:2222"));
    // "1m30s" is 60 + 30 seconds; the others keep their defaults.
    assert_eq!(config.timeouts.rpc, Duration::from_secs(90));
    assert_eq!(config.timeouts.connect, Duration::from_secs(10));
}

#[test]
fn checkpoint_directories_come_from_the_file_or_a_comma_separated_variable() {
    let base = "bad_task_index.toml";
    let index = ("TESSERA__TASK__INDEX", "0");
    assert_eq!(load(base, &[index]).unwrap().checkpoints.allowed_dirs, None);
    let config = load(
        base,
        &[
            index,
            ("TESSERA__CHECKPOINTS__ALLOWED_DIRS", "/ckpt/a, /ckpt/b"),
        ],
    )
    .unwrap();
    assert_eq!(
        config.checkpoints.allowed_dirs,
        Some(vec![PathBuf::from("/ckpt/a"), PathBuf::from("/ckpt/b")])
    );
    let err = load(
        base,
        &[index, ("TESSERA__CHECKPOINTS__ALLOWED_DIRS", "/ckpt/a,,")],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("checkpoints.allowed_dirs: an entry is empty"),
        "{err}"
    );
    let err = load(
        base,
        &[index, ("TESSERA__CHECKPOINTS__ALLOWED_PATHS", "/x")],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("allowed_dirs"), "{err}");
}

#[test]
fn data_directories_come_from_the_file_or_a_comma_separated_variable() {
    let base = "bad_task_index.toml";
    let index = ("TESSERA__TASK__INDEX", "0");
    let config = load(base, &[index]).unwrap();
    assert_eq!(config.data.allowed_dirs, None);
    // Neither section: reads go anywhere, as in TensorFlow.
    assert_eq!(config.data.read_dirs(&config.checkpoints), None);
    let config = load(
        base,
        &[index, ("TESSERA__DATA__ALLOWED_DIRS", "/data/a, /data/b")],
    )
    .unwrap();
    assert_eq!(
        config.data.allowed_dirs,
        Some(vec![PathBuf::from("/data/a"), PathBuf::from("/data/b")])
    );
    // Only [checkpoints]: reads stay under the checkpoint directories, not anywhere.
    let config = load(
        base,
        &[index, ("TESSERA__CHECKPOINTS__ALLOWED_DIRS", "/ckpt")],
    )
    .unwrap();
    assert_eq!(config.data.allowed_dirs, None);
    assert_eq!(
        config.data.read_dirs(&config.checkpoints),
        Some(vec![PathBuf::from("/ckpt")])
    );
    // Both: the data directories and the checkpoint directories.
    let config = load(
        base,
        &[
            index,
            ("TESSERA__CHECKPOINTS__ALLOWED_DIRS", "/ckpt"),
            ("TESSERA__DATA__ALLOWED_DIRS", "/data"),
        ],
    )
    .unwrap();
    assert_eq!(
        config.data.read_dirs(&config.checkpoints),
        Some(vec![PathBuf::from("/data"), PathBuf::from("/ckpt")])
    );
    let err = load(base, &[index, ("TESSERA__DATA__ALLOWED_DIRS", "/data/a,,")])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "environment variable TESSERA__DATA__ALLOWED_DIRS: data.allowed_dirs: an entry is \
         empty; list directories such as [\"/var/lib/tessera/data\"], or [] to read only \
         under the checkpoint directories"
    );
    let err = load(base, &[index, ("TESSERA__DATA__DIRS", "/x")])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "environment variable TESSERA__DATA__DIRS: data.dirs: unknown key; the keys allowed in \
         [data] are allowed_dirs"
    );
}

#[test]
fn environment_overrides_pick_the_task_and_replace_values() {
    let base = "bad_task_index.toml"; // index 3 of a 3-worker job, fixed by the override
    let config = load(base, &[("TESSERA__TASK__INDEX", "2")]).unwrap();
    assert_eq!(config.task, TaskId::new("worker", 2));

    let config = load(
        base,
        &[("TESSERA__TASK__JOB", "ps"), ("TESSERA__TASK__INDEX", "0")],
    )
    .unwrap();
    assert_eq!(config.task, TaskId::new("ps", 0));

    // Variable names are case-insensitive; other variables are ignored.
    let config = load(
        base,
        &[
            ("tessera__task__index", "1"),
            ("PATH", "/bin"),
            ("TESSERA", "x"),
        ],
    );
    assert_eq!(config.unwrap().task, TaskId::new("worker", 1));

    let config = load(
        base,
        &[
            ("TESSERA__TASK__INDEX", "0"),
            ("TESSERA__CLUSTER__WORKER", "a.example:1, b.example:2"),
            ("TESSERA__TASK__LISTEN", "127.0.0.1:0"),
            ("TESSERA__DEVICES__VISIBLE_GPUS", "3,1"),
            ("TESSERA__DEVICES__GPU_MEMORY_FRACTION", "0.5"),
            ("TESSERA__DEVICES__ALLOW_GROWTH", "true"),
            ("TESSERA__TIMEOUTS__CONNECT", "250ms"),
        ],
    )
    .unwrap();
    assert_eq!(
        config.cluster.task_address("worker", 1).unwrap(),
        "b.example:2"
    );
    assert_eq!(config.cluster.num_tasks("worker").unwrap(), 2);
    assert_eq!(config.listen, addr("127.0.0.1:0"));
    assert_eq!(config.devices.visible_devices, vec![3, 1]);
    assert_eq!(config.devices.gpu_memory_fraction, 0.5);
    assert!(config.devices.allow_growth);
    assert_eq!(config.timeouts.connect, Duration::from_millis(250));

    // One task of a dense job replaced, one added: the others stay.
    let config = load(
        base,
        &[
            ("TESSERA__TASK__INDEX", "0"),
            ("TESSERA__CLUSTER__WORKER__1", "x:1"),
            ("TESSERA__CLUSTER__WORKER__5", "y:1"),
        ],
    )
    .unwrap();
    let expected = ClusterSpec::from_sparse([
        ("ps", vec![(0, "ps0:2222")]),
        (
            "worker",
            vec![(0, "w0:2222"), (1, "x:1"), (2, "w2:2222"), (5, "y:1")],
        ),
    ]);
    assert_eq!(config.cluster, expected);

    // A sparse task added from the environment.
    let config = load(
        base,
        &[
            ("TESSERA__TASK__INDEX", "0"),
            ("TESSERA__CLUSTER__CHIEF__4", "c:1"),
        ],
    );
    assert_eq!(
        config.unwrap().cluster.task_indices("chief").unwrap(),
        vec![4]
    );
}

/// Each bad file and the message it must give (after the file name and ": ").
const BAD_FILES: &[(&str, &str)] = &[
    (
        "bad_unknown_key.toml",
        "task.port: unknown key; the keys allowed in [task] are job, index, listen",
    ),
    (
        "bad_unknown_section.toml",
        "device: unknown key; the keys allowed at the top level are cluster, task, devices, \
         timeouts, metrics, limits, checkpoints, data, tls, auth",
    ),
    (
        "bad_duplicate_address.toml",
        "cluster.worker: tasks /job:ps/task:0 and /job:worker/task:1 both have address \
         \"h1:2222\"; give each task its own host:port (port 0 lets each task pick one)",
    ),
    (
        "bad_task_index.toml",
        "task.index: task index 3 not in job \"worker\" (tasks: 0, 1, 2); set task.index to one \
         of them",
    ),
    (
        "bad_task_job.toml",
        "task.job: job \"chief\" not in the cluster (jobs: ps, worker); set task.job to one of \
         them",
    ),
    (
        "bad_address_no_port.toml",
        "cluster.worker[1]: \"w1\" is not host:port (no port); write it as host:port, e.g. \
         \"w0.example:2222\"",
    ),
    (
        "bad_address_port_range.toml",
        "cluster.worker[0]: port 70000 in \"w0:70000\" is out of range; use a port from 0 to \
         65535",
    ),
    (
        "bad_listen.toml",
        "task.listen: \"everywhere\" is not an IP address and port; use e.g. \"0.0.0.0:2222\" \
         (hostnames are not resolved here)",
    ),
    (
        "bad_gpu_fraction.toml",
        "devices.gpu_memory_fraction: 1.5 is outside (0, 1]; set the fraction of each GPU's \
         memory to use, e.g. 0.9",
    ),
    (
        "bad_cpu_zero.toml",
        "devices.cpu: 0 CPU devices; a task needs at least CPU:0, set devices.cpu to 1 or more",
    ),
    (
        "bad_sparse_key.toml",
        "cluster.worker.first: \"first\" is not a task index; keys of a sparse job are task \
         indices from 0 to 2147483647",
    ),
    (
        "bad_timeout.toml",
        "timeouts.rpc: \"60\" has no unit; write a number with a unit: ms, s, m or h (e.g. \
         \"10s\", \"500ms\", \"1m30s\")",
    ),
    (
        "bad_index_type.toml",
        "task.index: expected an integer, found string \"zero\"; set task.index to an integer",
    ),
    (
        "bad_no_task.toml",
        "task.job: missing; set task.job (or TESSERA__TASK__JOB) to this task's job, one of: ps, \
         worker",
    ),
    (
        "bad_empty_job.toml",
        "cluster.ps: job has no tasks; list its addresses or remove the job",
    ),
    (
        "bad_data_empty_dir.toml",
        "data.allowed_dirs: an entry is empty; list directories such as \
         [\"/var/lib/tessera/data\"], or [] to read only under the checkpoint directories",
    ),
    (
        "bad_data_dirs_type.toml",
        "data.allowed_dirs: expected a list of directories such as \
         [\"/var/lib/tessera/ckpt\"], found a list; set data.allowed_dirs to a list of \
         directories such as [\"/var/lib/tessera/ckpt\"]",
    ),
];

#[test]
fn each_bad_file_gives_its_message() {
    for (file, message) in BAD_FILES {
        let err = load(file, &[]).expect_err(file);
        assert_eq!(
            err.to_string(),
            format!("tests/data/{file}: {message}"),
            "{file}"
        );
        assert_eq!(err.code(), Code::InvalidArgument, "{file}");
    }
}

#[test]
fn invalid_toml_names_the_line_and_column() {
    let err = load("bad_toml.toml", &[]).unwrap_err();
    // Line 5 is `[task` (after three cluster lines and a blank); the parser stops after its
    // five characters, at column 6.
    assert_eq!(
        err.to_string(),
        "tests/data/bad_toml.toml:5:6: invalid TOML: unclosed table, expected `]`; fix the \
         syntax there"
    );
    assert!(matches!(
        err,
        ConfigError::Syntax {
            line: 5,
            column: 6,
            ..
        }
    ));
}

#[test]
fn a_missing_file_is_not_found_and_named() {
    let err = TaskConfig::from_file_with_env(Path::new("tests/data/nope.toml"), Vec::new());
    let err = err.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        err.to_string()
            .starts_with("tests/data/nope.toml: cannot read the cluster file: "),
        "{err}"
    );
    let status: tessera::Status = err.into();
    assert_eq!(status.code(), Code::NotFound);
}

#[test]
fn bad_environment_values_name_the_variable() {
    let base = "bad_task_index.toml";
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("TESSERA__TASK__INDEX", "abc")],
            "environment variable TESSERA__TASK__INDEX: task.index: expected an integer, found \
             string \"abc\"; set task.index to an integer",
        ),
        (
            &[("TESSERA__TASK__INDEX", "7")],
            "environment variable TESSERA__TASK__INDEX: task.index: task index 7 not in job \
             \"worker\" (tasks: 0, 1, 2); set task.index to one of them",
        ),
        (
            &[("TESSERA__TASK__INDEX", "0"), ("TESSERA__TASK__PORT", "1")],
            "environment variable TESSERA__TASK__PORT: task.port: unknown key; the keys allowed \
             in [task] are job, index, listen",
        ),
        (
            &[
                ("TESSERA__TASK__INDEX", "0"),
                ("TESSERA__CLUSTER__WORKER", "a:1,b"),
            ],
            "environment variable TESSERA__CLUSTER__WORKER: cluster.worker[1]: \"b\" is not \
             host:port (no port); write it as host:port, e.g. \"w0.example:2222\"",
        ),
        (
            &[
                ("TESSERA__TASK__INDEX", "0"),
                ("TESSERA__DEVICES__VISIBLE_GPUS", "x"),
            ],
            "environment variable TESSERA__DEVICES__VISIBLE_GPUS: devices.visible_gpus: \"x\" is \
             not a list of GPU ids; write e.g. \"0,1\"",
        ),
        (
            &[
                ("TESSERA__TASK__INDEX", "0"),
                ("TESSERA__DEVICES__GPU_MEMORY_FRACTION", "0"),
            ],
            "environment variable TESSERA__DEVICES__GPU_MEMORY_FRACTION: \
             devices.gpu_memory_fraction: 0 is outside (0, 1]; set the fraction of each GPU's \
             memory to use, e.g. 0.9",
        ),
        (
            &[("TESSERA__TASK__INDEX", "true")],
            "environment variable TESSERA__TASK__INDEX: task.index: expected an integer, found \
             boolean true; set task.index to an integer",
        ),
        (
            &[
                ("TESSERA__TASK__INDEX", "0"),
                ("TESSERA__TIMEOUTS__RPC", "10"),
            ],
            "environment variable TESSERA__TIMEOUTS__RPC: timeouts.rpc: expected a duration \
             string such as \"10s\", found integer 10; set timeouts.rpc to a duration string \
             such as \"10s\"",
        ),
        (
            &[("TESSERA__TASK", "x")],
            "environment variable TESSERA__TASK: task: expected a [task] table, found string \
             \"x\"; write [task] with its keys",
        ),
        (
            &[("TESSERA__", "x")],
            "environment variable TESSERA__: names no key; overrides are named \
             TESSERA__SECTION__KEY, e.g. TESSERA__TASK__INDEX",
        ),
        (
            &[("TESSERA__TASK__INDEX", "-1")],
            "environment variable TESSERA__TASK__INDEX: task.index: -1 is negative; task indices \
             start at 0",
        ),
    ];
    for (vars, message) in cases {
        let err = load(base, vars).expect_err(message);
        assert_eq!(err.to_string(), *message);
    }
}

fn flags(
    ps: Option<&str>,
    workers: Option<&str>,
    job: Option<&str>,
    index: Option<u32>,
) -> ClassicFlags {
    ClassicFlags {
        ps_hosts: ps.map(str::to_owned),
        worker_hosts: workers.map(str::to_owned),
        job_name: job.map(str::to_owned),
        task_index: index,
    }
}

#[test]
fn classic_flags_build_a_ps_worker_cluster() {
    let f = flags(
        Some("a:2222,b:2222"),
        Some("c:2223,d:2224"),
        Some("worker"),
        Some(1),
    );
    let config = TaskConfig::from_classic_flags(&f).unwrap();
    let expected = ClusterSpec::from_dense([
        ("ps", vec!["a:2222", "b:2222"]),
        ("worker", vec!["c:2223", "d:2224"]),
    ]);
    assert_eq!(config.cluster, expected);
    assert_eq!(config.task, TaskId::new("worker", 1));
    assert_eq!(config.listen, addr("0.0.0.0:2224"));

    // One job with one task: both flags may be left out (TensorFlow's ServerDef rules).
    let config = TaskConfig::from_classic_flags(&flags(None, Some("c:7"), None, None)).unwrap();
    assert_eq!(config.task, TaskId::new("worker", 0));
}

#[test]
fn classic_flag_errors_name_the_flag() {
    let cases = [
        (
            flags(Some("a:1"), Some("c:2"), None, Some(0)),
            "flags: --job_name: missing; the cluster has more than one job, so pass --job_name \
             ps or --job_name worker",
        ),
        (
            flags(Some("a:1"), Some("c:2,d:3"), Some("worker"), None),
            "flags: --task_index: missing; job \"worker\" has more than one task, so pass \
             --task_index with this task's position in its --*_hosts list",
        ),
        (
            flags(Some("a:1"), Some("c:2"), Some("chief"), Some(0)),
            "flags: --job_name: job \"chief\" not in the cluster (jobs: ps, worker); set \
             --job_name to one of them",
        ),
        (
            flags(Some("a:1"), Some("c:2"), Some("worker"), Some(2)),
            "flags: --task_index: task index 2 not in job \"worker\" (tasks: 0); set \
             --task_index to one of them",
        ),
        (
            flags(Some("a"), Some("c:2"), Some("worker"), Some(0)),
            "flags: --ps_hosts: \"a\" is not host:port (no port); write it as host:port, e.g. \
             \"w0.example:2222\"",
        ),
        (
            flags(Some("a:1"), Some("a:1"), Some("worker"), Some(0)),
            "flags: --worker_hosts: tasks /job:ps/task:0 and /job:worker/task:0 both have \
             address \"a:1\"; give each task its own host:port (port 0 lets each task pick one)",
        ),
        (
            flags(None, None, Some("worker"), Some(0)),
            "flags: --ps_hosts/--worker_hosts: no tasks; pass --worker_hosts (and --ps_hosts) as \
             comma-separated host:port lists",
        ),
    ];
    for (f, message) in cases {
        let err = TaskConfig::from_classic_flags(&f).expect_err(message);
        assert_eq!(err.to_string(), message);
    }
}

#[test]
fn tf_config_finds_the_task_and_applies_the_chief_rule() {
    let json = r#"{"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"],
                   "ps": ["h3:2222"]},
                   "task": {"type": "worker", "index": 1}, "environment": "cloud"}"#;
    let config = TaskConfig::from_tf_config(json).unwrap();
    assert_eq!(config.task, TaskId::new("worker", 1));
    assert_eq!(config.task_address().unwrap(), "h2:2222");
    assert_eq!(config.listen, addr("0.0.0.0:2222"));
    assert!(!config.is_chief());

    let chief = json.replace(
        r#""type": "worker", "index": 1"#,
        r#""type": "chief", "index": 0"#,
    );
    assert!(TaskConfig::from_tf_config(&chief).unwrap().is_chief());

    // Sparse jobs with string keys, as JSON must write them.
    let sparse = r#"{"cluster": {"chief": {"0": "c:1"}, "worker": {"3": "w3:1"}},
                     "task": {"type": "worker", "index": 3}}"#;
    let config = TaskConfig::from_tf_config(sparse).unwrap();
    assert_eq!(config.cluster.task_indices("worker").unwrap(), vec![3]);
}

#[test]
fn a_sparse_tf_config_of_dynamic_workers_gives_each_task_its_part_of_the_cluster() {
    // Kubeflow's TFJob with enableDynamicWorker: ps 1 sees only itself, as a one-address list.
    let ps = r#"{"sparseCluster": {"worker": {}, "ps": ["ps-1:2222"]},
                 "task": {"type": "ps", "index": 1}}"#;
    let config = TaskConfig::from_tf_config(ps).unwrap();
    assert!(config.partial_cluster);
    assert_eq!(config.task, TaskId::new("ps", 1));
    assert_eq!(config.task_address().unwrap(), "ps-1:2222");
    assert_eq!(config.cluster.jobs().collect::<Vec<_>>(), ["ps"]);
    // Worker 2 sees the ps tasks and itself; the chief, worker 0, is not in its view.
    let worker = r#"{"sparseCluster": {"worker": {"2": "w-2:2222"}, "ps": ["ps-0:2222", "ps-1:2222"]},
                     "task": {"type": "worker", "index": 2}}"#;
    let config = TaskConfig::from_tf_config(worker).unwrap();
    assert!(config.partial_cluster);
    assert_eq!(config.task_address().unwrap(), "w-2:2222");
    assert_eq!(config.cluster.task_address("ps", 1).unwrap(), "ps-1:2222");
    assert!(!config.is_chief());
    // The whole cluster under "cluster" is not partial, and still needs a chief.
    let whole = r#"{"cluster": {"worker": {"2": "w-2:2222"}, "ps": ["ps-0:2222"]},
                    "task": {"type": "worker", "index": 2}}"#;
    let err = TaskConfig::from_tf_config(whole).unwrap_err().to_string();
    assert!(err.contains("no task 0 in \"worker\""), "{err}");
}

#[test]
fn tf_config_takes_the_environment_overrides_a_cluster_file_takes() {
    // A TFJob pod: TF_CONFIG for the cluster, TESSERA__ variables for the rest.
    let json = r#"{"cluster": {"chief": ["c-0:2222"], "ps": ["ps-0:2222"],
                   "worker": {"1": "w-1:2222"}}, "task": {"type": "worker", "index": 1}}"#;
    let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let plain = TaskConfig::from_tf_config(json).unwrap();
    let config = TaskConfig::from_tf_config(json)
        .unwrap()
        .with_env(
            "TF_CONFIG",
            env(&[
                ("TESSERA__METRICS__LISTEN", "0.0.0.0:9100"),
                ("TESSERA__DEVICES__CPU_MEMORY_LIMIT", "1073741824"),
                ("TESSERA__TIMEOUTS__STARTUP", "10m"),
                ("PATH", "/usr/bin"),
            ]),
        )
        .unwrap();
    assert_eq!(config.task, plain.task);
    assert_eq!(config.listen, plain.listen);
    assert_eq!(config.cluster.task_indices("worker").unwrap(), vec![1]);
    assert_eq!(config.cluster.task_address("chief", 0).unwrap(), "c-0:2222");
    assert_eq!(config.metrics.listen, Some(addr("0.0.0.0:9100")));
    assert_eq!(config.devices.cpu_memory_limit, Some(1 << 30));
    assert_eq!(config.timeouts.startup, Duration::from_secs(600));
    // A bad value is named as a cluster file's would be.
    let err = TaskConfig::from_tf_config(json)
        .unwrap()
        .with_env("TF_CONFIG", env(&[("TESSERA__TIMEOUTS__STARTUP", "soon")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("TESSERA__TIMEOUTS__STARTUP"), "{err}");
}

/// What a Kubeflow TFJob with PS and Worker replicas sets: no chief job, so worker 0 is the
/// chief (as `TFConfigClusterResolver` and between-graph ps/worker programs have it), and the
/// log says so.
#[test]
fn tf_config_without_a_chief_makes_worker_zero_the_chief_and_says_so() {
    let json = r#"{"cluster": {"ps": ["ps-0:2222"], "worker": ["w-0:2222", "w-1:2222"]},
                   "task": {"type": "worker", "index": 0}}"#;
    let logs = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&logs);
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || LogWriter(Arc::clone(&sink)))
        .finish();
    let config = tracing::subscriber::with_default(subscriber, || {
        TaskConfig::from_tf_config(json).expect("ps + worker without chief is accepted")
    });
    assert_eq!(config.task, TaskId::new("worker", 0));
    assert!(
        config.is_chief(),
        "worker 0 is the chief without a chief job"
    );
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("no chief job in TF_CONFIG's cluster; worker 0 is the chief")
            && logs.contains("w-0:2222"),
        "the log names worker 0 as the chief: {logs}"
    );

    // The other tasks of that cluster are not the chief.
    for (job, index) in [("worker", 1), ("ps", 0)] {
        let other = json.replace(
            r#""type": "worker", "index": 0"#,
            &format!(r#""type": "{job}", "index": {index}"#),
        );
        let config = TaskConfig::from_tf_config(&other).unwrap();
        assert!(
            !config.is_chief(),
            "/job:{job}/task:{index} is not the chief"
        );
    }

    // With a chief job the Estimator rule holds: worker 0 is not the chief, and nothing about
    // worker 0 is logged.
    let with_chief = r#"{"cluster": {"chief": ["c:2222"], "ps": ["ps-0:2222"],
                         "worker": ["w-0:2222"]}, "task": {"type": "worker", "index": 0}}"#;
    let logs = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&logs);
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || LogWriter(Arc::clone(&sink)))
        .finish();
    let config = tracing::subscriber::with_default(subscriber, || {
        TaskConfig::from_tf_config(with_chief).unwrap()
    });
    assert!(!config.is_chief());
    assert!(
        logs.lock().unwrap().is_empty(),
        "nothing logged with a chief job"
    );
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn tf_config_errors_name_the_json_key() {
    let cases: &[(&str, &str, Code)] = &[
        (
            r#"{"cluster": {"chief": ["c:1"]}, "task": {"type": "evaluator", "index": 0}}"#,
            "TF_CONFIG: task.type: an \"evaluator\" is not part of the cluster and serves \
             nothing; run it as a client process, not as a tessera daemon",
            Code::FailedPrecondition,
        ),
        (
            r#"{"task": {"type": "worker", "index": 0}}"#,
            "TF_CONFIG: cluster: missing; without a cluster TensorFlow trains in-process and \
             there is nothing to serve; add \"cluster\": {\"chief\": [...], \"worker\": [...]}",
            Code::FailedPrecondition,
        ),
        (
            r#"{"cluster": {"ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}"#,
            "TF_CONFIG: cluster: has neither a \"chief\" nor a \"worker\" job (jobs: ps); add \
             \"chief\": [\"host:port\"], or \"worker\": [...] whose task 0 becomes the chief",
            Code::InvalidArgument,
        ),
        (
            r#"{"cluster": {"ps": ["p:1"], "worker": {"1": "w1:1"}},
                "task": {"type": "worker", "index": 1}}"#,
            "TF_CONFIG: cluster: has no \"chief\" job and no task 0 in \"worker\" to be the chief \
             (jobs: ps, worker); add \"chief\": [\"host:port\"] or a worker with index 0",
            Code::InvalidArgument,
        ),
        (
            r#"{"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}"#,
            "TF_CONFIG: cluster.chief: The \"cluster\" in TF_CONFIG must have only one \"chief\" \
             node, found 2; keep one and move the others to \"worker\"",
            Code::InvalidArgument,
        ),
        (
            r#"{"cluster": {"chief": ["c:1"], "worker": ["w:1"]},
                "task": {"type": "worker", "index": 1}}"#,
            "TF_CONFIG: task.index: task index 1 not in job \"worker\" (tasks: 0); set \
             task.index to one of them",
            Code::InvalidArgument,
        ),
        (
            r#"{"cluster": {"chief": ["c:1"]}, "task": {"type": "ps", "index": 0}}"#,
            "TF_CONFIG: task.type: job \"ps\" not in the cluster (jobs: chief); set task.type to \
             one of them",
            Code::InvalidArgument,
        ),
        (
            r#"{"cluster": {"chief": ["c:1"]}, "task": {"type": "chief", "index": -1}}"#,
            "TF_CONFIG: task.index: -1 is not a task index; set it to an integer from 0",
            Code::InvalidArgument,
        ),
        (
            r#"{"cluster": {"chief": ["c:1"]}, "task": {"index": 0}}"#,
            "TF_CONFIG: task.type: missing; set it to this task's job (chief, worker, ps)",
            Code::InvalidArgument,
        ),
        (
            r#"{"cluster": {"chief": "c:1"}, "task": {"type": "chief", "index": 0}}"#,
            "TF_CONFIG: cluster: The tasks for job 'chief' must be a list or a dictionary from \
             integers to strings.",
            Code::InvalidArgument,
        ),
        (
            r#"{"cluster": {"chief": ["c:1"]}, "task": {"type": "chief", "index": 0},
                "rpc_layer": "grpc+verbs"}"#,
            "TF_CONFIG: rpc_layer: \"grpc+verbs\" is not supported; tessera speaks \"grpc\", \
             remove rpc_layer or set it to \"grpc\"",
            Code::InvalidArgument,
        ),
        (
            "{\"cluster\": ",
            "TF_CONFIG:1:12: invalid JSON: EOF while parsing a value at line 1 column 12; fix the \
             syntax there",
            Code::InvalidArgument,
        ),
    ];
    for (json, message, code) in cases {
        let err = TaskConfig::from_tf_config(json).expect_err(message);
        assert_eq!(err.to_string(), *message);
        assert_eq!(err.code(), *code, "{message}");
    }
}

#[test]
fn a_ps_standby_job_gives_each_ps_task_a_second_daemon_outside_the_cluster() {
    let text = r#"
[cluster]
ps = ["127.0.0.1:2222"]
ps_standby = ["127.0.0.1:2223"]
worker = ["127.0.0.1:2224"]
"#;
    let as_task = |job: &str| {
        TaskConfig::from_toml_with_env(
            text,
            "cluster.toml",
            env(&[("TESSERA__TASK__JOB", job), ("TESSERA__TASK__INDEX", "0")]),
        )
        .unwrap()
    };
    // The standby is ps task 0 at its own address; no job of the cluster names it.
    let standby = as_task("ps_standby");
    assert_eq!(standby.task, TaskId::new("ps", 0));
    assert_eq!(standby.listen, addr("127.0.0.1:2223"));
    let jobs: Vec<&str> = standby.cluster.jobs().collect();
    assert_eq!(jobs, ["ps", "worker"]);
    let pair = standby.standbys.own.clone().unwrap();
    assert!(pair.standby);
    assert_eq!(
        (pair.own.as_str(), pair.partner.as_str()),
        ("127.0.0.1:2223", "127.0.0.1:2222")
    );
    // The primary knows its standby; a worker knows where each ps task fails over to.
    let primary = as_task("ps").standbys.own.unwrap();
    assert!(!primary.standby);
    assert_eq!(primary.partner, "127.0.0.1:2223");
    let worker = as_task("worker");
    assert_eq!(worker.standbys.own, None);
    assert_eq!(
        worker.standbys.addresses.get(&0).map(String::as_str),
        Some("127.0.0.1:2223")
    );

    let orphan = TaskConfig::from_toml_with_env(
        "[cluster]\nps = [\"127.0.0.1:2222\"]\nps_standby = [\"127.0.0.1:2223\", \"127.0.0.1:2225\"]\n",
        "cluster.toml",
        env(&[("TESSERA__TASK__JOB", "ps"), ("TESSERA__TASK__INDEX", "0")]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        orphan.contains("task 1 stands by for ps task 1, which the cluster does not have"),
        "{orphan}"
    );
}
