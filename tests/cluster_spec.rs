//! `ClusterSpec` against `tf.train.ClusterSpec`'s documented behaviour (reference §1.2), the
//! golden `ClusterDef`s TensorFlow wrote, and the `ServerDef` rules (§1.3, §2.3).

use std::collections::BTreeMap;
use std::path::PathBuf;

use prost::Message;
use serde_json::json;
use tessera::cluster::server_def::{device_config, override_server_def, session_config};
use tessera::cluster::{
    local_task, make_server_def, ClusterSpec, DeviceConfig, JobTasks, ServerDefArgs, TaskConfig,
    TaskId,
};
use tessera::proto::{ClusterDef, ConfigProto, GpuOptions, JobDef, ServerDef};
use tessera::Code;

/// The golden fixtures: `$TESSERA_GOLDEN_DIR`, else `shared/golden` beside the checkout, else
/// `/work/shared/golden`.
fn golden(name: &str) -> Vec<u8> {
    let candidates: Vec<PathBuf> = std::env::var_os("TESSERA_GOLDEN_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/golden")),
            PathBuf::from("/work/shared/golden"),
        ])
        .collect();
    let Some(dir) = candidates.iter().find(|d| d.is_dir()) else {
        panic!(
            "golden fixtures not found; set TESSERA_GOLDEN_DIR to shared/golden (looked in {:?})",
            candidates
        );
    };
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
}

fn s(v: &str) -> String {
    v.to_owned()
}

fn sparse(entries: &[(u32, &str)]) -> BTreeMap<u32, String> {
    entries.iter().map(|&(i, a)| (i, s(a))).collect()
}

/// `{"ps": ["ps0:2222"], "worker": {1: "w1:2222", 3: "w3:2222"}}`.
fn mixed() -> ClusterSpec {
    ClusterSpec::from_jobs([
        (
            "worker",
            JobTasks::Sparse(sparse(&[(1, "w1:2222"), (3, "w3:2222")])),
        ),
        ("ps", JobTasks::Dense(vec![s("ps0:2222")])),
    ])
}

#[test]
fn accessors_on_dense_and_sparse_jobs() {
    let spec = mixed();
    assert_eq!(
        spec.jobs().collect::<Vec<_>>(),
        ["ps", "worker"],
        "sorted like a dict"
    );
    // num_tasks counts defined tasks, not the largest index + 1.
    assert_eq!(spec.num_tasks("worker").unwrap(), 2);
    assert_eq!(spec.num_tasks("ps").unwrap(), 1);
    assert_eq!(spec.task_indices("worker").unwrap(), vec![1, 3]);
    assert_eq!(spec.task_address("worker", 3).unwrap(), "w3:2222");
    // job_tasks has length max + 1 = 4 with holes at 0 and 2.
    assert_eq!(
        spec.job_tasks("worker").unwrap(),
        vec![None, Some(s("w1:2222")), None, Some(s("w3:2222"))]
    );
    assert_eq!(spec.job_tasks("ps").unwrap(), vec![Some(s("ps0:2222"))]);
    assert!(!spec.is_empty());
    assert!(ClusterSpec::default().is_empty());
    let tasks: Vec<(TaskId, &str)> = spec.all_tasks().collect();
    assert_eq!(tasks[0], (TaskId::new("ps", 0), "ps0:2222"));
    assert_eq!(tasks[2], (TaskId::new("worker", 3), "w3:2222"));
}

#[test]
fn unknown_jobs_and_indices_are_invalid_argument_with_tensorflows_messages() {
    let spec = mixed();
    for err in [
        spec.num_tasks("chief").unwrap_err(),
        spec.task_indices("chief").unwrap_err(),
        spec.job_tasks("chief").unwrap_err(),
        spec.task_address("chief", 0).unwrap_err(),
    ] {
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(err.message(), "No such job in cluster: 'chief'");
    }
    let err = spec.task_address("worker", 2).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(err.message(), "No task with index 2 in job 'worker'");
}

#[test]
fn a_job_named_twice_keeps_the_later_tasks_as_a_dict_would() {
    let spec = ClusterSpec::from_dense([("ps", vec!["a:1"]), ("ps", vec!["b:1", "c:1"])]);
    assert_eq!(spec.jobs().collect::<Vec<_>>(), ["ps"]);
    assert_eq!(
        spec.job_tasks("ps").unwrap(),
        vec![Some(s("b:1")), Some(s("c:1"))]
    );
}

#[test]
fn a_job_with_no_tasks_is_an_empty_dict_and_has_no_task_list() {
    let spec = ClusterSpec::from_jobs([
        ("ps", JobTasks::Dense(vec![])),
        ("worker", JobTasks::Dense(vec![s("w:1")])),
    ]);
    assert_eq!(spec.num_tasks("ps").unwrap(), 0);
    assert_eq!(spec.as_dict()["ps"], JobTasks::Sparse(BTreeMap::new()));
    assert_eq!(
        spec.job_tasks("ps").unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        spec.to_string(),
        "ClusterSpec({'ps': {}, 'worker': ['w:1']})"
    );
}

#[test]
fn as_dict_is_dense_only_for_indices_zero_to_n() {
    let spec = ClusterSpec::from_jobs([
        ("a", JobTasks::Sparse(sparse(&[(0, "a0:1"), (1, "a1:1")]))),
        ("b", JobTasks::Sparse(sparse(&[(1, "b1:1")]))),
        ("c", JobTasks::Dense(vec![s("c0:1")])),
    ]);
    let dict = spec.as_dict();
    assert_eq!(dict["a"], JobTasks::Dense(vec![s("a0:1"), s("a1:1")]));
    assert_eq!(dict["b"], JobTasks::Sparse(sparse(&[(1, "b1:1")])));
    assert_eq!(dict["c"], JobTasks::Dense(vec![s("c0:1")]));
}

#[test]
fn display_is_pythons_repr_with_sorted_keys() {
    assert_eq!(
        mixed().to_string(),
        "ClusterSpec({'ps': ['ps0:2222'], 'worker': {1: 'w1:2222', 3: 'w3:2222'}})"
    );
    assert_eq!(ClusterSpec::default().to_string(), "ClusterSpec({})");
}

#[test]
fn equality_compares_the_normalized_mapping() {
    let dense = ClusterSpec::from_dense([("worker", vec!["w0:1", "w1:1"])]);
    let as_sparse = ClusterSpec::from_sparse([("worker", [(1, "w1:1"), (0, "w0:1")])]);
    assert_eq!(dense, as_sparse);
    let other_address = ClusterSpec::from_dense([("worker", vec!["w0:1", "w1:2"])]);
    assert_ne!(dense, other_address);
    let fewer = ClusterSpec::from_sparse([("worker", [(0, "w0:1")])]);
    assert_ne!(dense, fewer);
    // Job order does not matter: a ClusterDef keeps its own order.
    let def = ClusterDef {
        job: vec![
            JobDef {
                name: s("worker"),
                tasks: [(0, s("w:1"))].into(),
            },
            JobDef {
                name: s("ps"),
                tasks: [(0, s("p:1"))].into(),
            },
        ],
    };
    let from_def = ClusterSpec::from_cluster_def(&def).unwrap();
    assert_eq!(from_def.jobs().collect::<Vec<_>>(), ["worker", "ps"]);
    assert_eq!(
        from_def,
        ClusterSpec::from_dense([("ps", vec!["p:1"]), ("worker", vec!["w:1"])])
    );
}

#[test]
fn cluster_defs_round_trip_and_keep_their_job_order() {
    let def = ClusterDef {
        job: vec![
            JobDef {
                name: s("worker"),
                tasks: [(1, s("w1:1")), (3, s("w3:1"))].into(),
            },
            JobDef {
                name: s("chief"),
                tasks: [(0, s("c:1"))].into(),
            },
        ],
    };
    let spec = ClusterSpec::from_cluster_def(&def).unwrap();
    assert_eq!(spec.to_cluster_def(), def);
    assert_eq!(ClusterDef::from(&spec), def);
    assert_eq!(ClusterSpec::try_from(&def).unwrap(), spec);
    // Built from a map, jobs come out sorted by name.
    let sorted = ClusterSpec::from_sparse([
        ("worker", vec![(1, "w1:1"), (3, "w3:1")]),
        ("chief", vec![(0, "c:1")]),
    ]);
    let names: Vec<String> = sorted
        .to_cluster_def()
        .job
        .into_iter()
        .map(|j| j.name)
        .collect();
    assert_eq!(names, ["chief", "worker"]);
}

#[test]
fn bad_cluster_defs_are_refused() {
    let negative = ClusterDef {
        job: vec![JobDef {
            name: s("w"),
            tasks: [(-1, s("a:1"))].into(),
        }],
    };
    let err = ClusterSpec::from_cluster_def(&negative).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("negative task index -1"),
        "{}",
        err.message()
    );
    let twice = ClusterDef {
        job: vec![
            JobDef {
                name: s("w"),
                tasks: Default::default(),
            },
            JobDef {
                name: s("w"),
                tasks: Default::default(),
            },
        ],
    };
    assert!(ClusterSpec::from_cluster_def(&twice)
        .unwrap_err()
        .message()
        .contains("twice"));
}

#[test]
fn golden_dense_cluster_def_from_tensorflow() {
    let def = ClusterDef::decode(golden("cluster_def.pb").as_slice()).unwrap();
    let spec = ClusterSpec::from_cluster_def(&def).unwrap();
    let expected = ClusterSpec::from_dense([
        ("ps", vec!["ps0:2222", "ps1:2222"]),
        (
            "worker",
            vec!["worker0:2222", "worker1:2222", "worker2:2222"],
        ),
    ]);
    assert_eq!(spec, expected);
    assert_eq!(spec.to_cluster_def(), def);
    assert_eq!(
        expected.to_cluster_def(),
        def,
        "TensorFlow sorted the dict's jobs too"
    );
}

#[test]
fn golden_sparse_cluster_def_from_tensorflow() {
    let def = ClusterDef::decode(golden("cluster_def_sparse.pb").as_slice()).unwrap();
    let spec = ClusterSpec::from_cluster_def(&def).unwrap();
    assert_eq!(spec.task_indices("worker").unwrap(), vec![1, 3]);
    assert_eq!(
        spec.to_string(),
        "ClusterSpec({'worker': {1: 'worker1:2222', 3: 'worker3:2222'}})"
    );
    assert_eq!(spec.to_cluster_def(), def);
}

#[test]
fn from_json_takes_lists_and_integer_string_keyed_objects() {
    let spec = ClusterSpec::from_json(&json!({
        "worker": {"1": "w1:1", "3": "w3:1"},
        "ps": ["p0:1", "p1:1"],
    }))
    .unwrap();
    assert_eq!(
        spec,
        ClusterSpec::from_jobs([
            ("ps", JobTasks::Dense(vec![s("p0:1"), s("p1:1")])),
            (
                "worker",
                JobTasks::Sparse(sparse(&[(1, "w1:1"), (3, "w3:1")]))
            ),
        ])
    );
    let message = "The tasks for job 'ps' must be a list or a dictionary from integers to strings.";
    for bad in [
        json!({"ps": "p0:1"}),
        json!({"ps": {"zero": "p0:1"}}),
        json!({"ps": [1]}),
        json!({"ps": {"0": 5}}),
    ] {
        let err = ClusterSpec::from_json(&bad).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(err.message(), message, "{bad}");
    }
    assert!(ClusterSpec::from_json(&json!(["a:1"]))
        .unwrap_err()
        .message()
        .contains("dictionary"));
}

#[test]
fn duplicate_addresses_name_both_tasks_but_port_zero_never_clashes() {
    let spec =
        ClusterSpec::from_dense([("ps", vec!["h:1", "h:0"]), ("worker", vec!["h:0", "h:1"])]);
    let (first, second, address) = spec.duplicate_address().unwrap();
    assert_eq!(
        (first, second, address),
        (TaskId::new("ps", 0), TaskId::new("worker", 1), "h:1")
    );
    let spec = ClusterSpec::from_dense([("worker", vec!["127.0.0.1:0", "127.0.0.1:0"])]);
    assert_eq!(spec.duplicate_address(), None);
}

// ----- ServerDef rules -----

fn two_jobs() -> ClusterSpec {
    ClusterSpec::from_dense([
        ("ps", vec!["ps0:2222"]),
        ("worker", vec!["w0:2222", "w1:2223"]),
    ])
}

#[test]
fn make_server_def_defaults_job_task_and_protocol_only_when_unambiguous() {
    let one = ClusterSpec::from_dense([("local", vec!["localhost:0"])]);
    let def = make_server_def(&one, ServerDefArgs::default()).unwrap();
    assert_eq!(
        (def.job_name.as_str(), def.task_index, def.protocol.as_str()),
        ("local", 0, "grpc")
    );
    assert_eq!(def.cluster.unwrap(), one.to_cluster_def());

    let err = make_server_def(&two_jobs(), ServerDefArgs::default()).unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::InvalidArgument, "Must specify an explicit job_name.")
    );
    let args = ServerDefArgs {
        job_name: Some(s("worker")),
        ..Default::default()
    };
    let err = make_server_def(&two_jobs(), args).unwrap_err();
    assert_eq!(err.message(), "Must specify an explicit task_index.");
    let args = ServerDefArgs {
        job_name: Some(s("ps")),
        ..Default::default()
    };
    assert_eq!(make_server_def(&two_jobs(), args).unwrap().task_index, 0);
    let args = ServerDefArgs {
        job_name: Some(s("chief")),
        ..Default::default()
    };
    let err = make_server_def(&two_jobs(), args).unwrap_err();
    assert_eq!(err.message(), "No such job in cluster: 'chief'");
}

#[test]
fn config_merges_into_an_existing_server_def() {
    let def = make_server_def(
        &two_jobs(),
        ServerDefArgs {
            job_name: Some(s("worker")),
            task_index: Some(1),
            protocol: Some(s("grpc+verbs")),
            config: Some(ConfigProto {
                allow_soft_placement: true,
                ..Default::default()
            }),
        },
    )
    .unwrap();
    assert_eq!(def.protocol, "grpc+verbs");
    let mut extra = ConfigProto::default();
    extra.device_filters.push(s("/job:ps"));
    let def = override_server_def(
        def,
        ServerDefArgs {
            task_index: Some(0),
            config: Some(extra),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!((def.job_name.as_str(), def.task_index), ("worker", 0));
    let config = def.default_session_config.unwrap();
    assert!(
        config.allow_soft_placement,
        "merge keeps what the first config set"
    );
    assert_eq!(config.device_filters, ["/job:ps"]);
}

#[test]
fn local_task_errors_are_tensorflows() {
    let mut def = make_server_def(
        &two_jobs(),
        ServerDefArgs {
            job_name: Some(s("worker")),
            task_index: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    let local = local_task(&def).unwrap();
    assert_eq!(
        (local.task, local.address.as_str(), local.port),
        (TaskId::new("worker", 1), "w1:2223", 2223)
    );
    def.port = 9000; // newer ServerDefs override the cluster's port
    assert_eq!(local_task(&def).unwrap().port, 9000);

    let mut missing_job = def.clone();
    missing_job.job_name = s("chief");
    let err = local_task(&missing_job).unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::Internal, "Job \"chief\" was not defined in cluster")
    );
    let mut missing_task = def.clone();
    missing_task.task_index = 5;
    let err = local_task(&missing_task).unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (
            Code::InvalidArgument,
            "Task 5 was not defined in job \"worker\""
        )
    );

    let bad_port = ClusterSpec::from_dense([("local", vec!["localhost"])]);
    let def = make_server_def(&bad_port, ServerDefArgs::default()).unwrap();
    let err = local_task(&def).unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (
            Code::InvalidArgument,
            "Could not parse port for local server from \"localhost\""
        )
    );
}

#[test]
fn golden_server_def_becomes_a_task_config() {
    let def = ServerDef::decode(golden("server_def.pb").as_slice()).unwrap();
    let config = TaskConfig::from_server_def(&def).unwrap();
    assert_eq!(config.task, TaskId::new("worker", 2));
    assert_eq!(config.task_address().unwrap(), "worker2:2222");
    assert_eq!(config.listen, "0.0.0.0:2222".parse().unwrap());
    // device_count {GPU: 0}, per_process_gpu_memory_fraction 0.2, allow_soft_placement true.
    assert_eq!(config.devices.gpu_count, Some(0));
    assert_eq!(config.devices.gpu_memory_fraction, 0.2);
    assert!(config.devices.soft_placement);
    assert_eq!(config.devices.cpu_count.get(), 1);

    // And back: the same cluster, task and device settings.
    let back = config.to_server_def().unwrap();
    assert_eq!(back.cluster, def.cluster);
    assert_eq!((back.job_name.as_str(), back.task_index), ("worker", 2));
    assert_eq!(
        device_config(back.default_session_config.as_ref()).unwrap(),
        config.devices
    );
}

#[test]
fn device_config_round_trips_through_config_proto() {
    let devices = DeviceConfig {
        cpu_count: 2.try_into().unwrap(),
        gpu_count: Some(1),
        gpu_memory_fraction: 0.5,
        allow_growth: true,
        visible_devices: vec![3, 1],
        soft_placement: false,
        cpu_memory_limit: None,
        intra_op_threads: Some(6),
    };
    let config = session_config(&devices);
    assert_eq!(
        config.gpu_options.as_ref().unwrap().visible_device_list,
        "3,1"
    );
    assert_eq!(config.intra_op_parallelism_threads, 6);
    assert_eq!(device_config(Some(&config)).unwrap(), devices);
    let unified = ConfigProto {
        gpu_options: Some(GpuOptions {
            per_process_gpu_memory_fraction: 1.5,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        device_config(Some(&unified)).unwrap_err().code(),
        Code::InvalidArgument
    );
}
