//! [`Saver`]: saves and restores variables by running save and restore ops built into the
//! graph, laid out as TensorFlow's `Saver(sharded=True)` lays them out, and keeps the
//! directory's `checkpoint` state file and the last `max_to_keep` checkpoints.
//!
//! ```text
//! save/filename/input (Const "model") → save/Const (PlaceholderWithDefault: the prefix P)
//! save/StringJoin = P + "_temp/part"                          (temp prefix of the shards)
//! per device group i (sorted by device), on that device's CPU:0:
//!   save/ShardedFilename_i → SaveV2_i(variables of the group) → save/control_dependency_i
//! on the last group's CPU:0:
//!   save/MergeV2Checkpoints/checkpoint_prefixes (Pack) → save/MergeV2Checkpoints(…, P)
//!   save/Identity = P after the merge                         (fetch it to save)
//! per group i: save/RestoreV2_i → save/AssignVariableOp_* → save/restore_shard_i
//! save/restore_all (NoOp after every shard)                   (run it to restore)
//! ```
//!
//! The parts of a partitioned variable ([`SavedVariable::parts`]) are saved and restored each
//! on its own task with its `shape_and_slices` spec (`"10 4 0,4:0,4"`), under the full
//! variable's name, as TensorFlow's saver does for a `PartitionedVariable`.
//!
//! So each ps writes its own variables on its own device and the last one merges the index,
//! as in TensorFlow (reference §9.3); the state file is written by the caller's process (the
//! chief). Names of the nodes follow TensorFlow's (first group unsuffixed, then `_1`, ...).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use super::state::{latest_checkpoint, read_state, write_state};
use crate::client::Session;
use crate::error::{Result, Status};
use crate::format::checkpoint::bundle::{delete_bundle, index_filename, BundleReader};
use crate::graph::attr::value;
use crate::graph::builder::{Graph, NodeSpec, Output, Variable};
use crate::graph::{PartitionedVariable, SaveSlice};
use crate::proto::CheckpointState;
use crate::tensor::{DType, PartialShape, Tensor};

/// TensorFlow's default `max_to_keep`.
pub const DEFAULT_MAX_TO_KEEP: usize = 5;
/// TensorFlow's default checkpoint basename.
pub const DEFAULT_BASENAME: &str = "model.ckpt";

/// What can run the saver's ops: the in-process [`Session`] or a distributed one.
pub trait SessionRun {
    /// Runs one step (feeds by tensor name, fetches by tensor name, targets by node name).
    fn run_step(
        &self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
    ) -> Result<Vec<Tensor>>;
}

impl SessionRun for Session {
    fn run_step(
        &self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
    ) -> Result<Vec<Tensor>> {
        self.run(feeds, fetches, targets)
    }
}

/// The names of the save and restore ops a [`Saver`] runs (TensorFlow's `SaverDef`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaverDef {
    /// The tensor to feed the checkpoint prefix into (`save/Const:0`).
    pub filename_tensor: String,
    /// The tensor to fetch to save (`save/Identity:0`, the prefix, after the merge).
    pub save_tensor: String,
    /// The node to run to restore (`save/restore_all`).
    pub restore_op: String,
}

impl Default for SaverDef {
    /// The names TensorFlow's sharded saver gives these nodes, as in the golden
    /// `graph_monitored.pbtxt`; [`build_saver_ops`] builds them under the same names.
    fn default() -> Self {
        Self {
            filename_tensor: "save/Const:0".into(),
            save_tensor: "save/Identity:0".into(),
            restore_op: "save/restore_all".into(),
        }
    }
}

/// Returns the CPU of the task `device` names (`/job:ps/task:0/device:CPU:0` for
/// `/job:ps/task:0` or `/job:ps/task:0/device:GPU:1`); `""` stays `""`.
fn task_cpu(device: &str) -> String {
    if device.is_empty() {
        return String::new();
    }
    let task: Vec<&str> = device
        .split('/')
        .filter(|p| {
            !p.is_empty()
                && !p.starts_with("device:")
                && !p.starts_with("cpu:")
                && !p.starts_with("gpu:")
        })
        .collect();
    if task.is_empty() {
        "/device:CPU:0".into()
    } else {
        format!("/{}/device:CPU:0", task.join("/"))
    }
}

/// A 1-D string tensor of `values`.
fn string_vector<'a>(values: impl Iterator<Item = &'a str>) -> Result<Tensor> {
    let values: Vec<bytes::Bytes> = values.map(|v| bytes::Bytes::from(v.to_string())).collect();
    Tensor::from_strings(vec![values.len()], values)
}

/// One variable a saver saves: a whole variable, or one part of a partitioned variable with
/// the slice of the full variable it holds (TensorFlow's `SaveSliceInfo`).
#[derive(Clone, Debug)]
pub struct SavedVariable {
    /// The checkpoint name (the full variable's, for a part).
    pub name: String,
    /// The variable (the part) read when saving and assigned when restoring.
    pub variable: Variable,
    /// Where the part sits in the full variable; `None` for a whole variable.
    pub slice: Option<SaveSlice>,
}

impl SavedVariable {
    /// A whole variable saved as `name`.
    pub fn whole(name: impl Into<String>, variable: Variable) -> Self {
        Self {
            name: name.into(),
            variable,
            slice: None,
        }
    }

    /// Every part of `var`, each saved as its slice of the full variable under the full
    /// variable's name, so that a restore may use another partitioning.
    pub fn parts(var: &PartitionedVariable) -> Vec<Self> {
        var.parts
            .iter()
            .zip(&var.slices)
            .map(|(part, slice)| Self {
                name: slice.full_name.clone(),
                variable: part.clone(),
                slice: Some(slice.clone()),
            })
            .collect()
    }

    /// What a checkpoint of `variables` (checkpoint name → variable) holds: each whole under
    /// its name, but the parts of `partitioned` and their optimizer slots, each saved as its
    /// slice of the whole variable (or slot) under the whole one's name, as TensorFlow saves a
    /// partitioned variable, so that a restore may split it otherwise.
    pub fn all(
        variables: &BTreeMap<String, Variable>,
        partitioned: &[PartitionedVariable],
    ) -> Vec<Self> {
        let sliced: Vec<Self> = partitioned
            .iter()
            .flat_map(|var| {
                let mut parts = Self::parts(var);
                parts.extend(Self::slots_of_parts(var, variables));
                parts
            })
            .collect();
        let is_sliced = |node: &str| sliced.iter().any(|s| s.variable.handle.node == node);
        variables
            .iter()
            .filter(|(_, var)| !is_sliced(&var.handle.node))
            .map(|(name, var)| Self::whole(name.clone(), var.clone()))
            .chain(sliced.iter().cloned())
            .collect()
    }

    /// The optimizer slots of `var`'s parts among `variables` (checkpoint name → variable): a
    /// part's slot is named `<part>/<slot>` (`embedding/part_0/Adagrad`) and is saved, as
    /// TensorFlow saves it, as the same slice of the whole slot `<var>/<slot>`
    /// (`embedding/Adagrad`), so that it too restores under another partitioning. Only
    /// variables of the part's own shape count as its slots.
    pub fn slots_of_parts(
        var: &PartitionedVariable,
        variables: &BTreeMap<String, Variable>,
    ) -> Vec<Self> {
        let mut slots = Vec::new();
        for (part, slice) in var.parts.iter().zip(&var.slices) {
            let prefix = format!("{}/", part.handle.node);
            for (name, candidate) in variables.range(prefix.clone()..) {
                let Some(slot) = name.strip_prefix(&prefix) else {
                    break;
                };
                if candidate.value.shape != part.value.shape {
                    continue;
                }
                let full_name = format!("{}/{slot}", slice.full_name);
                slots.push(Self {
                    name: full_name.clone(),
                    variable: candidate.clone(),
                    slice: Some(SaveSlice {
                        full_name,
                        ..slice.clone()
                    }),
                });
            }
        }
        slots
    }

    /// The `shape_and_slices` spec: `""` for a whole variable.
    fn spec(&self) -> String {
        self.slice.as_ref().map(SaveSlice::spec).unwrap_or_default()
    }
}

/// Adds TensorFlow's sharded saver ops for `variables` (checkpoint name → variable) to `g`.
/// Variables are grouped by the device of their handle; each group is saved and restored on
/// its task's CPU. The names must be unique (they are map keys) and non-empty.
pub fn build_saver_ops(g: &mut Graph, variables: &BTreeMap<String, Variable>) -> Result<SaverDef> {
    let saved: Vec<SavedVariable> = variables
        .iter()
        .map(|(name, var)| SavedVariable::whole(name.clone(), var.clone()))
        .collect();
    build_saver_ops_for(g, &saved)
}

/// [`build_saver_ops`] for whole variables and parts of partitioned ones
/// ([`SavedVariable::parts`]): each part is saved by `SaveV2` on its own task with its slice
/// spec, as TensorFlow's sharded saver does, so the merged checkpoint lists every slice under
/// the full variable's name; restoring reads each part's slice, whatever partitioning the
/// checkpoint was saved with. Within a device group the variables keep the order given.
pub fn build_saver_ops_for(g: &mut Graph, variables: &[SavedVariable]) -> Result<SaverDef> {
    if variables.is_empty() {
        return Err(Status::invalid_argument(
            "a saver needs at least one variable to save",
        ));
    }
    let mut groups: BTreeMap<String, Vec<&SavedVariable>> = BTreeMap::new();
    for saved in variables {
        let var = &saved.variable;
        let device = g
            .node(&var.handle.node)
            .map(|n| n.device.clone())
            .ok_or_else(|| {
                Status::not_found(format!(
                    "variable `{}`: no node `{}` in the graph",
                    saved.name, var.handle.node
                ))
            })?;
        groups.entry(task_cpu(&device)).or_default().push(saved);
    }
    let num_shards = groups.len();
    g.with_name_scope("save", |g| -> Result<SaverDef> {
        let default = g.constant_proto("filename/input", Tensor::string("model").to_proto())?;
        let prefix = g.add1(
            NodeSpec::new("PlaceholderWithDefault")
                .name("Const")
                .input(&default)
                .attr("shape", value::shape(&PartialShape::new(vec![]))),
        )?;
        let suffix = g.constant(&Tensor::string("_temp/part"))?;
        let temp = g.add1(
            NodeSpec::new("StringJoin")
                .input_list(&[prefix.clone(), suffix])
                .attr("separator", value::string("")),
        )?;
        let shards = g.scalar("num_shards", DType::Int32, num_shards as f64)?;
        let mut shard_files = Vec::new();
        let mut done = Vec::new();
        let mut restores = Vec::new();
        for (i, (device, vars)) in groups.iter().enumerate() {
            g.with_device(device, |g| -> Result<()> {
                let index = g.scalar("ShardedFilename/shard", DType::Int32, i as f64)?;
                let file = g.add1(
                    NodeSpec::new("ShardedFilename")
                        .input(&temp)
                        .input(&index)
                        .input(&shards),
                )?;
                let names_t = string_vector(vars.iter().map(|v| v.name.as_str()))?;
                let specs: Vec<String> = vars.iter().map(|v| v.spec()).collect();
                let specs_t = string_vector(specs.iter().map(String::as_str))?;
                let values: Vec<Output> = vars.iter().map(|v| v.variable.value.clone()).collect();
                let dtypes: Vec<DType> = values.iter().map(|v| v.dtype).collect();
                let names_c = g.constant_proto("SaveV2/tensor_names", names_t.to_proto())?;
                let specs_c = g.constant_proto("SaveV2/shape_and_slices", specs_t.to_proto())?;
                let save = g.add_op(
                    NodeSpec::new("SaveV2")
                        .input(&file)
                        .input(&names_c)
                        .input(&specs_c)
                        .input_list(&values)
                        .attr("dtypes", value::dtype_list(&dtypes)),
                )?;
                let dep = g.add1(
                    NodeSpec::new("Identity")
                        .name("control_dependency")
                        .input(&file)
                        .control(&save),
                )?;
                shard_files.push(file);
                done.push(dep.node);
                Ok(())
            })?;
        }
        let last = groups.keys().last().cloned().unwrap_or_default();
        let save_tensor = g.with_device(&last, |g| -> Result<Output> {
            let deps: Vec<&str> = done.iter().map(String::as_str).collect();
            g.with_control_dependencies(&deps, |g| -> Result<Output> {
                let packed = g.add1(
                    NodeSpec::new("Pack")
                        .name("MergeV2Checkpoints/checkpoint_prefixes")
                        .input_list(&shard_files)
                        .attr("axis", value::int(0)),
                )?;
                let merge = g.add_op(
                    NodeSpec::new("MergeV2Checkpoints")
                        .input(&packed)
                        .input(&prefix)
                        .attr("delete_old_dirs", value::bool(true)),
                )?;
                g.add1(NodeSpec::new("Identity").input(&prefix).control(&merge))
            })
        })?;
        // Restore ops after the save ops, so that `save/Identity` keeps TensorFlow's name.
        for (device, vars) in &groups {
            g.with_device(device, |g| -> Result<()> {
                let names = string_vector(vars.iter().map(|v| v.name.as_str()))?;
                let specs: Vec<String> = vars.iter().map(|v| v.spec()).collect();
                let specs = string_vector(specs.iter().map(String::as_str))?;
                let dtypes: Vec<DType> = vars.iter().map(|v| v.variable.value.dtype).collect();
                let names_r = g.constant_proto("RestoreV2/tensor_names", names.to_proto())?;
                let specs_r = g.constant_proto("RestoreV2/shape_and_slices", specs.to_proto())?;
                let restored = g.add_node(
                    NodeSpec::new("RestoreV2")
                        .input(&prefix)
                        .input(&names_r)
                        .input(&specs_r)
                        .attr("dtypes", value::dtype_list(&dtypes)),
                )?;
                let mut assigns = Vec::new();
                for (saved, value) in vars.iter().zip(&restored) {
                    let var = &saved.variable;
                    let value = g.add1(NodeSpec::new("Identity").input(value))?;
                    assigns.push(
                        g.add_op(
                            NodeSpec::new("AssignVariableOp")
                                .input(&var.handle)
                                .input(&value),
                        )?,
                    );
                }
                let refs: Vec<&str> = assigns.iter().map(String::as_str).collect();
                restores.push(g.group("restore_shard", &refs)?);
                Ok(())
            })?;
        }
        let refs: Vec<&str> = restores.iter().map(String::as_str).collect();
        let restore_op = g.group("restore_all", &refs)?;
        Ok(SaverDef {
            filename_tensor: prefix.name(),
            save_tensor: save_tensor.name(),
            restore_op,
        })
    })
}

/// Saves and restores checkpoints through a graph's saver ops and keeps the checkpoint
/// directory's state file; prunes all but the newest `max_to_keep` checkpoints.
pub struct Saver {
    def: SaverDef,
    max_to_keep: usize,
    basename: String,
    /// The checkpoints this saver keeps, oldest first, with their times (seconds since epoch).
    kept: Mutex<Option<VecDeque<(String, f64)>>>,
}

impl Saver {
    /// A saver running the ops of `def`, keeping `max_to_keep` checkpoints (0 keeps all).
    pub fn new(def: SaverDef, max_to_keep: usize) -> Self {
        Self {
            def,
            max_to_keep,
            basename: DEFAULT_BASENAME.into(),
            kept: Mutex::new(None),
        }
    }

    /// Sets the checkpoint basename (`model.ckpt` by default).
    pub fn with_basename(mut self, basename: &str) -> Self {
        self.basename = basename.to_string();
        self
    }

    /// Returns the op names this saver runs.
    pub fn def(&self) -> &SaverDef {
        &self.def
    }

    /// Saves the variables as `dir/<basename>-<global_step>` (no suffix without a step),
    /// updates `dir/checkpoint` and deletes checkpoints beyond `max_to_keep`; returns the
    /// prefix. A directory that cannot be created or written is an error naming it.
    pub fn save(
        &self,
        session: &dyn SessionRun,
        dir: &Path,
        global_step: Option<i64>,
    ) -> Result<PathBuf> {
        ensure_writable(dir)?;
        let name = match global_step {
            Some(step) => format!("{}-{step}", self.basename),
            None => self.basename.clone(),
        };
        let prefix = dir.join(name).to_string_lossy().into_owned();
        session
            .run_step(
                &[(&self.def.filename_tensor, Tensor::string(prefix.clone()))],
                &[&self.def.save_tensor],
                &[],
            )
            .map_err(|e| e.context(format!("saving checkpoint {prefix}")))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let mut guard = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let kept = guard.get_or_insert_with(|| recover(dir));
        kept.retain(|(p, _)| *p != prefix);
        kept.push_back((prefix.clone(), now));
        let mut last_preserved = 0.0;
        while self.max_to_keep > 0 && kept.len() > self.max_to_keep {
            if let Some((old, time)) = kept.pop_front() {
                delete_bundle(&old)?;
                last_preserved = time;
            }
        }
        let state = CheckpointState {
            model_checkpoint_path: prefix.clone(),
            all_model_checkpoint_paths: kept.iter().map(|(p, _)| p.clone()).collect(),
            all_model_checkpoint_timestamps: kept.iter().map(|(_, t)| *t).collect(),
            last_preserved_timestamp: last_preserved,
        };
        write_state(dir, &state)?;
        Ok(PathBuf::from(prefix))
    }

    /// Restores every variable from the checkpoint at `prefix`: NOT_FOUND naming the index
    /// when it does not exist; a missing tensor or a corrupt shard fails the whole restore.
    pub fn restore(&self, session: &dyn SessionRun, prefix: &Path) -> Result<()> {
        let prefix = prefix.to_string_lossy().into_owned();
        if !index_filename(&prefix).exists() {
            return Err(Status::not_found(format!(
                "checkpoint {prefix} not found ({} is missing); pass a prefix such as \
                 dir/model.ckpt-100, or use latest_checkpoint(dir)",
                index_filename(&prefix).display()
            )));
        }
        // Every tensor is read and its checksum checked before any variable is assigned, so a
        // corrupt or missing shard fails the restore before it has changed anything (the
        // restore ops of the shards run in parallel and could otherwise half-restore).
        BundleReader::open(&prefix)?.verify()?;
        session
            .run_step(
                &[(&self.def.filename_tensor, Tensor::string(prefix.clone()))],
                &[],
                &[&self.def.restore_op],
            )
            .map_err(|e| e.context(format!("restoring checkpoint {prefix}")))?;
        Ok(())
    }

    /// Restores from the latest checkpoint of `dir`; returns its prefix, or `None` (nothing
    /// restored) when the directory has none.
    pub fn restore_latest(&self, session: &dyn SessionRun, dir: &Path) -> Result<Option<PathBuf>> {
        let Some(prefix) = latest_checkpoint(dir)? else {
            return Ok(None);
        };
        self.restore(session, &prefix)?;
        Ok(Some(prefix))
    }
}

/// The checkpoints a previous saver kept in `dir` (so pruning goes on across restarts).
fn recover(dir: &Path) -> VecDeque<(String, f64)> {
    let Ok(Some(state)) = read_state(dir) else {
        return VecDeque::new();
    };
    state
        .all_model_checkpoint_paths
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (
                p.clone(),
                state
                    .all_model_checkpoint_timestamps
                    .get(i)
                    .copied()
                    .unwrap_or(0.0),
            )
        })
        .collect()
}

/// Creates `dir` if needed and checks that files can be created in it, so that a bad
/// checkpoint directory fails before any shard is written, naming the directory.
pub fn ensure_writable(dir: &Path) -> Result<()> {
    ensure_dir_writable(dir, "checkpoint directory", "--checkpoint_dir")
}

/// Creates `dir` if needed and checks that files can be created in it; PERMISSION_DENIED
/// names it as `what` and the flag that chose it. Nothing already in it is touched.
pub fn ensure_dir_writable(dir: &Path, what: &str, flag: &str) -> Result<()> {
    let fail = |e: std::io::Error| {
        Status::permission_denied(format!(
            "{what} {} is not writable: {e}; choose a directory this process can create files \
             in ({flag})",
            dir.display()
        ))
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let probe = dir.join(format!(".tessera-write-test-{}", rand::random::<u64>()));
    std::fs::write(&probe, b"").map_err(fail)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}
