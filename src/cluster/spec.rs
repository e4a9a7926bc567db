//! `ClusterSpec`: jobs of tasks, dense or sparse (TensorFlow's `tf.train.ClusterSpec`).
//!
//! A cluster is a list of jobs; a job maps task indices to `host:port` addresses. Jobs are
//! dense (task `i` is the `i`-th address) or sparse (only some indices exist, as when a
//! `TF_CONFIG` names just the tasks one process needs). The spec keeps the job order it was
//! built with: sorted by name when built from a map (as TensorFlow sorts a dict), the original
//! order when built from a `ClusterDef`. Equality ignores that order and compares the
//! normalized job → index → address mapping, so a dense and a sparse spec describing the same
//! tasks are equal.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::{Result, Status};
use crate::proto::{ClusterDef, JobDef};

/// One task of the cluster: a job name and a task index.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    /// The job ("ps", "worker", "chief", ...).
    pub job: String,
    /// The task's index within its job.
    pub index: u32,
}

impl TaskId {
    /// The task `index` of `job`.
    pub fn new(job: impl Into<String>, index: u32) -> Self {
        Self {
            job: job.into(),
            index,
        }
    }

    /// Returns the task's device-name prefix, `/job:J/replica:0/task:T`.
    pub fn device_prefix(&self) -> String {
        format!("/job:{}/replica:0/task:{}", self.job, self.index)
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/job:{}/task:{}", self.job, self.index)
    }
}

/// A job's tasks as `as_dict` shows them: a list when the indices are exactly `0..n`, else a
/// map from index to address (an empty job is an empty map, as in TensorFlow).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobTasks {
    /// Task `i` is the `i`-th address.
    Dense(Vec<String>),
    /// Only the listed indices exist.
    Sparse(BTreeMap<u32, String>),
}

impl JobTasks {
    /// Returns the tasks as index → address.
    pub fn into_map(self) -> BTreeMap<u32, String> {
        match self {
            JobTasks::Dense(addrs) => (0u32..).zip(addrs).collect(),
            JobTasks::Sparse(tasks) => tasks,
        }
    }

    /// The dense form when `tasks` has indices `0..n` and at least one task, else the sparse one.
    fn normalize(tasks: &BTreeMap<u32, String>) -> Self {
        let dense = !tasks.is_empty() && tasks.keys().copied().eq(0..tasks.len() as u32);
        if dense {
            JobTasks::Dense(tasks.values().cloned().collect())
        } else {
            JobTasks::Sparse(tasks.clone())
        }
    }
}

impl From<Vec<String>> for JobTasks {
    fn from(addrs: Vec<String>) -> Self {
        JobTasks::Dense(addrs)
    }
}

impl From<BTreeMap<u32, String>> for JobTasks {
    fn from(tasks: BTreeMap<u32, String>) -> Self {
        JobTasks::Sparse(tasks)
    }
}

/// The jobs of a cluster, each a map from task index to `host:port`, in job order.
#[derive(Clone, Debug, Default)]
pub struct ClusterSpec {
    jobs: Vec<(String, BTreeMap<u32, String>)>,
}

impl ClusterSpec {
    /// A cluster of dense jobs: task `i` of a job is the `i`-th address. Jobs sorted by name.
    pub fn from_dense<J, A>(jobs: impl IntoIterator<Item = (J, Vec<A>)>) -> Self
    where
        J: Into<String>,
        A: Into<String>,
    {
        Self::from_jobs(jobs.into_iter().map(|(name, addrs)| {
            (
                name,
                JobTasks::Dense(addrs.into_iter().map(Into::into).collect()),
            )
        }))
    }

    /// A cluster of sparse jobs: each job maps task index to address. Jobs sorted by name.
    pub fn from_sparse<J, T, A>(jobs: impl IntoIterator<Item = (J, T)>) -> Self
    where
        J: Into<String>,
        T: IntoIterator<Item = (u32, A)>,
        A: Into<String>,
    {
        Self::from_jobs(jobs.into_iter().map(|(name, tasks)| {
            (
                name,
                JobTasks::Sparse(tasks.into_iter().map(|(i, a)| (i, a.into())).collect()),
            )
        }))
    }

    /// A cluster mixing dense and sparse jobs. Jobs sorted by name; a job named twice keeps the
    /// later tasks (as a later key replaces an earlier one in a Python dict).
    pub fn from_jobs<J>(jobs: impl IntoIterator<Item = (J, JobTasks)>) -> Self
    where
        J: Into<String>,
    {
        let map: BTreeMap<String, BTreeMap<u32, String>> = jobs
            .into_iter()
            .map(|(name, tasks)| (name.into(), tasks.into_map()))
            .collect();
        Self {
            jobs: map.into_iter().collect(),
        }
    }

    /// The same cluster without the job `name`.
    pub fn without_job(mut self, name: &str) -> Self {
        self.jobs.retain(|(job, _)| job != name);
        self
    }

    /// A cluster from a `ClusterDef`, keeping its job order. Refuses negative task indices and
    /// a job named twice.
    pub fn from_cluster_def(def: &ClusterDef) -> Result<Self> {
        let mut jobs: Vec<(String, BTreeMap<u32, String>)> = Vec::with_capacity(def.job.len());
        for job in &def.job {
            if jobs.iter().any(|(name, _)| name == &job.name) {
                return Err(Status::invalid_argument(format!(
                    "ClusterDef names job '{}' twice; merge its tasks into one JobDef",
                    job.name
                )));
            }
            let mut tasks = BTreeMap::new();
            for (&index, addr) in &job.tasks {
                let index = u32::try_from(index).map_err(|_| {
                    Status::invalid_argument(format!(
                        "ClusterDef job '{}' has negative task index {index}; task indices \
                         start at 0",
                        job.name
                    ))
                })?;
                tasks.insert(index, addr.clone());
            }
            jobs.push((job.name.clone(), tasks));
        }
        Ok(Self { jobs })
    }

    /// A cluster from JSON as in `TF_CONFIG`'s `cluster`: an object whose values are lists of
    /// addresses (dense) or objects from integer strings to addresses (sparse).
    pub fn from_json(value: &serde_json::Value) -> Result<Self> {
        let object = value.as_object().ok_or_else(|| {
            Status::invalid_argument(
                "`cluster` must be a dictionary mapping one or more job names to lists of \
                 network addresses, or a ClusterDef",
            )
        })?;
        let type_error = |job: &str| {
            Status::invalid_argument(format!(
                "The tasks for job '{job}' must be a list or a dictionary from integers to \
                 strings."
            ))
        };
        let mut jobs = Vec::with_capacity(object.len());
        for (job, tasks) in object {
            let tasks = match tasks {
                serde_json::Value::Array(addrs) => {
                    let addrs = addrs
                        .iter()
                        .map(|a| a.as_str().map(str::to_owned).ok_or_else(|| type_error(job)))
                        .collect::<Result<Vec<_>>>()?;
                    JobTasks::Dense(addrs)
                }
                serde_json::Value::Object(entries) => {
                    let mut sparse = BTreeMap::new();
                    for (key, addr) in entries {
                        let index: u32 = key.trim().parse().map_err(|_| type_error(job))?;
                        let addr = addr.as_str().ok_or_else(|| type_error(job))?;
                        sparse.insert(index, addr.to_owned());
                    }
                    JobTasks::Sparse(sparse)
                }
                _ => return Err(type_error(job)),
            };
            jobs.push((job.clone(), tasks));
        }
        Ok(Self::from_jobs(jobs))
    }

    /// Returns the cluster as a `ClusterDef`, jobs in this spec's order.
    pub fn to_cluster_def(&self) -> ClusterDef {
        ClusterDef {
            job: self
                .jobs
                .iter()
                .map(|(name, tasks)| JobDef {
                    name: name.clone(),
                    // Indices fit in i32: they came from a ClusterDef or were checked on entry
                    // by the loaders; a larger one saturates rather than wraps.
                    tasks: tasks
                        .iter()
                        .map(|(&i, a)| (i32::try_from(i).unwrap_or(i32::MAX), a.clone()))
                        .collect(),
                })
                .collect(),
        }
    }

    /// Returns the job names, in order.
    pub fn jobs(&self) -> impl Iterator<Item = &str> {
        self.jobs.iter().map(|(name, _)| name.as_str())
    }

    /// Whether the cluster has no jobs.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Returns the number of tasks `job` defines (not its largest index + 1).
    pub fn num_tasks(&self, job: &str) -> Result<usize> {
        Ok(self.tasks(job)?.len())
    }

    /// Returns `job`'s task indices, ascending.
    pub fn task_indices(&self, job: &str) -> Result<Vec<u32>> {
        Ok(self.tasks(job)?.keys().copied().collect())
    }

    /// Returns the address of `job`'s task `index`.
    pub fn task_address(&self, job: &str, index: u32) -> Result<&str> {
        let tasks = self.tasks(job)?;
        tasks.get(&index).map(String::as_str).ok_or_else(|| {
            Status::invalid_argument(format!("No task with index {index} in job '{job}'"))
        })
    }

    /// Returns `job`'s addresses by index up to its largest index, `None` in the holes of a
    /// sparse job. A job with no tasks has no largest index and is refused.
    pub fn job_tasks(&self, job: &str) -> Result<Vec<Option<String>>> {
        let tasks = self.tasks(job)?;
        let Some((&max, _)) = tasks.last_key_value() else {
            return Err(Status::invalid_argument(format!(
                "Job '{job}' has no tasks, so it has no task list"
            )));
        };
        Ok((0..=max).map(|i| tasks.get(&i).cloned()).collect())
    }

    /// Returns `job`'s tasks, index to address.
    pub fn tasks(&self, job: &str) -> Result<&BTreeMap<u32, String>> {
        self.jobs
            .iter()
            .find(|(name, _)| name == job)
            .map(|(_, tasks)| tasks)
            .ok_or_else(|| Status::invalid_argument(format!("No such job in cluster: '{job}'")))
    }

    /// Returns every job as TensorFlow's `as_dict` shows it, sorted by job name.
    pub fn as_dict(&self) -> BTreeMap<String, JobTasks> {
        self.jobs
            .iter()
            .map(|(name, tasks)| (name.clone(), JobTasks::normalize(tasks)))
            .collect()
    }

    /// Returns every task of the cluster with its address, job by job.
    pub fn all_tasks(&self) -> impl Iterator<Item = (TaskId, &str)> {
        self.jobs.iter().flat_map(|(job, tasks)| {
            tasks
                .iter()
                .map(move |(&i, addr)| (TaskId::new(job.clone(), i), addr.as_str()))
        })
    }

    /// Returns the first pair of tasks that share an address, in cluster order, as
    /// `(earlier, later, address)`. Port 0 addresses never clash: each such task binds a port
    /// of its own choosing.
    pub fn duplicate_address(&self) -> Option<(TaskId, TaskId, &str)> {
        let mut seen: BTreeMap<&str, TaskId> = BTreeMap::new();
        for (task, addr) in self.all_tasks() {
            if addr
                .rsplit_once(':')
                .is_some_and(|(_, port)| port.parse() == Ok(0u16))
            {
                continue;
            }
            if let Some(first) = seen.get(addr) {
                return Some((first.clone(), task, addr));
            }
            seen.insert(addr, task);
        }
        None
    }

    /// The normalized mapping equality compares.
    fn normalized(&self) -> BTreeMap<&str, &BTreeMap<u32, String>> {
        self.jobs
            .iter()
            .map(|(name, tasks)| (name.as_str(), tasks))
            .collect()
    }
}

impl From<&ClusterSpec> for ClusterDef {
    fn from(spec: &ClusterSpec) -> Self {
        spec.to_cluster_def()
    }
}

impl TryFrom<&ClusterDef> for ClusterSpec {
    type Error = Status;

    fn try_from(def: &ClusterDef) -> Result<Self> {
        Self::from_cluster_def(def)
    }
}

impl PartialEq for ClusterSpec {
    fn eq(&self, other: &Self) -> bool {
        self.normalized() == other.normalized()
    }
}

impl Eq for ClusterSpec {}

/// Writes a Python string literal the way `repr` does for plain ASCII text.
fn py_str(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    write!(f, "{quote}")?;
    for c in s.chars() {
        match c {
            '\\' => write!(f, "\\\\")?,
            '\n' => write!(f, "\\n")?,
            c if c == quote => write!(f, "\\{c}")?,
            c => write!(f, "{c}")?,
        }
    }
    write!(f, "{quote}")
}

impl fmt::Display for ClusterSpec {
    /// Writes the spec as TensorFlow's `repr` does:
    /// `ClusterSpec({'ps': ['ps0:2222'], 'worker': {1: 'w1:2222'}})`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterSpec({{")?;
        for (n, (job, tasks)) in self.as_dict().iter().enumerate() {
            if n > 0 {
                write!(f, ", ")?;
            }
            py_str(f, job)?;
            write!(f, ": ")?;
            match tasks {
                JobTasks::Dense(addrs) => {
                    write!(f, "[")?;
                    for (i, addr) in addrs.iter().enumerate() {
                        if i > 0 {
                            write!(f, ", ")?;
                        }
                        py_str(f, addr)?;
                    }
                    write!(f, "]")?;
                }
                JobTasks::Sparse(tasks) => {
                    write!(f, "{{")?;
                    for (i, (index, addr)) in tasks.iter().enumerate() {
                        if i > 0 {
                            write!(f, ", ")?;
                        }
                        write!(f, "{index}: ")?;
                        py_str(f, addr)?;
                    }
                    write!(f, "}}")?;
                }
            }
        }
        write!(f, "}})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_jobs_are_sorted_and_indexed_by_position() {
        let spec = ClusterSpec::from_dense([("worker", vec!["w0:1", "w1:1"]), ("ps", vec!["p:1"])]);
        assert_eq!(spec.jobs().collect::<Vec<_>>(), ["ps", "worker"]);
        assert_eq!(spec.task_address("worker", 1).unwrap(), "w1:1");
    }

    #[test]
    fn normalize_picks_dense_only_for_zero_based_contiguous_indices() {
        let dense: BTreeMap<u32, String> = [(0, "a".into()), (1, "b".into())].into();
        let holey: BTreeMap<u32, String> = [(1, "b".into())].into();
        assert_eq!(
            JobTasks::normalize(&dense),
            JobTasks::Dense(vec!["a".into(), "b".into()])
        );
        assert_eq!(JobTasks::normalize(&holey), JobTasks::Sparse(holey.clone()));
        assert_eq!(
            JobTasks::normalize(&BTreeMap::new()),
            JobTasks::Sparse(BTreeMap::new())
        );
    }

    #[test]
    fn port_zero_addresses_are_never_duplicates() {
        let spec = ClusterSpec::from_dense([("worker", vec!["127.0.0.1:0", "127.0.0.1:0"])]);
        assert_eq!(spec.duplicate_address(), None);
        let spec = ClusterSpec::from_dense([("ps", vec!["h:1"]), ("worker", vec!["h:1"])]);
        let (a, b, addr) = spec.duplicate_address().unwrap();
        assert_eq!(
            (a, b, addr),
            (TaskId::new("ps", 0), TaskId::new("worker", 0), "h:1")
        );
    }
}
