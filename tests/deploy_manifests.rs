//! The Kubernetes manifests under `deploy/` stay valid: `scripts/validate-deploy` checks each
//! document against the vendored schemas of its kind (`deploy/schemas/`), the cross-references
//! no schema sees (probes, Prometheus annotations and tessera's metrics address against the
//! container's ports, the ConfigMap's cluster file against the StatefulSets' DNS names), every
//! flag against `tessera COMMAND --help` and the cluster file with `tessera validate`, all
//! offline. Broken copies prove that it refuses what it should, naming the file, the object and
//! the field.
//!
//! The validator is Python with jsonschema and PyYAML (scripts/test installs them); without
//! them these tests skip, and under CI=true they fail (`support::requirement`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::cluster::BIN;
use crate::support::requirement;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether python3 can run the validator; says why not (skip, or fail under CI) otherwise.
fn validator_can_run(test: &str) -> bool {
    // tomllib is Python 3.11's; the validator takes the tomli package on older ones.
    let imports =
        "import jsonschema, yaml\ntry:\n import tomllib\nexcept ImportError:\n import tomli";
    let probe = Command::new("python3").args(["-c", imports]).output();
    if matches!(&probe, Ok(o) if o.status.success()) {
        return true;
    }
    requirement::missing(
        test,
        "python3 cannot import jsonschema, yaml and tomllib (or tomli)",
        "scripts/test installs jsonschema and PyYAML; or python3 -m pip install jsonschema pyyaml",
    );
    false
}

/// `scripts/validate-deploy --tessera BIN FILES...` (no files: every deploy/*.yaml).
fn validate(files: &[PathBuf]) -> Output {
    Command::new("python3")
        .arg(root().join("scripts/validate-deploy"))
        .arg("--tessera")
        .arg(BIN)
        .args(files)
        .current_dir(root())
        .output()
        .expect("run python3 scripts/validate-deploy")
}

/// A copy of `deploy/NAME` in a temp dir with `from` replaced by `to` (which must be there).
fn broken_copy(dir: &Path, name: &str, from: &str, to: &str) -> PathBuf {
    let text = std::fs::read_to_string(root().join("deploy").join(name)).expect("read manifest");
    assert!(
        text.contains(from),
        "deploy/{name} no longer contains {from:?}; update this test"
    );
    let path = dir.join(name);
    std::fs::write(&path, text.replacen(from, to, 1)).expect("write the broken copy");
    path
}

/// Runs the validator on `file`, expecting it to fail; returns its stderr.
fn refused(file: &Path) -> String {
    let output = validate(&[file.to_path_buf()]);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(
        output.status.code(),
        Some(1),
        "expected problems in {}:\n{stderr}",
        file.display()
    );
    stderr
}

#[test]
fn every_deploy_manifest_validates() {
    if !validator_can_run("every_deploy_manifest_validates") {
        return;
    }
    let output = validate(&[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "scripts/validate-deploy failed:\n{stdout}{stderr}"
    );
    for file in ["deploy/tfjob.yaml", "deploy/statefulset.yaml"] {
        assert!(
            stdout.contains(&format!("{file}: ")),
            "{file} not checked:\n{stdout}"
        );
    }
}

#[test]
fn an_unknown_field_is_named_with_its_path() {
    if !validator_can_run("an_unknown_field_is_named_with_its_path") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = broken_copy(
        dir.path(),
        "tfjob.yaml",
        "imagePullPolicy: IfNotPresent",
        "imagePulPolicy: IfNotPresent",
    );
    let stderr = refused(&file);
    let expected = format!(
        "{}: TFJob/tessera-digits: \
         $.spec.tfReplicaSpecs.Chief.template.spec.containers[0].imagePulPolicy: unknown field \
         (did you mean imagePullPolicy?)",
        file.display()
    );
    assert!(
        stderr.contains(&expected),
        "want {expected:?} in:\n{stderr}"
    );
}

#[test]
fn a_probe_on_another_port_than_the_tasks_is_refused() {
    if !validator_can_run("a_probe_on_another_port_than_the_tasks_is_refused") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = broken_copy(
        dir.path(),
        "statefulset.yaml",
        "readinessProbe:\n            grpc:\n              port: 2222",
        "readinessProbe:\n            grpc:\n              port: 2223",
    );
    let stderr = refused(&file);
    assert!(
        stderr.contains(
            "StatefulSet/tessera-ps: $.spec.template.spec.containers[0].readinessProbe.grpc.port: \
             probes port 2223, but the task's gRPC port is 2222"
        ),
        "{stderr}"
    );
}

#[test]
fn a_cluster_file_address_that_is_no_pods_is_refused() {
    if !validator_can_run("a_cluster_file_address_that_is_no_pods_is_refused") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = broken_copy(
        dir.path(),
        "statefulset.yaml",
        "\"tessera-worker-1.tessera.default.svc:2222\"",
        "\"tessera-worker-1.tessera.other.svc:2222\"",
    );
    let stderr = refused(&file);
    assert!(
        stderr.contains(
            "StatefulSet/tessera-worker: $.spec.replicas: ConfigMap tessera-cluster \
             (cluster.toml): cluster.worker[1] is \"tessera-worker-1.tessera.other.svc:2222\", \
             but pod 1 is tessera-worker-1.tessera.default.svc:2222"
        ),
        "{stderr}"
    );
}
