//! The devices a task creates at start, as TensorFlow's `DeviceAttributes`.
//!
//! A task has `cpu_count` CPU devices and the GPUs found at run time through the CUDA driver
//! ([`cuda`]), filtered by the task's [`DeviceConfig`]. The list is built once per process
//! start: every device gets a fresh random incarnation, so a peer that sees a new incarnation
//! knows the task restarted. Nothing here changes after start; a session's config cannot add
//! or remove devices (TensorFlow behaves the same way).
//!
//! The building is a plain function of (task, config, what the probe found) so that tests can
//! drive it with made-up GPUs; [`discover`] plugs in the real CUDA probe.

pub mod context;
pub mod cuda;
pub mod host_pool;
pub mod memory;
pub mod space;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use tracing::{info, warn};

use crate::cluster::{DeviceConfig, TaskId};
use crate::error::{Code, Result, Status};
use crate::proto::{DeviceAttributes, DeviceLocality};

pub use cuda::CudaProbe;
pub use memory::{Charge, MemoryBudget};

/// The kinds of device a task has and a kernel can exist for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// Host CPU.
    Cpu,
    /// NVIDIA GPU through cudarc.
    Gpu,
}

impl DeviceType {
    /// The device type TensorFlow's string names ("CPU", "GPU"), if tessera has it.
    pub fn parse(name: &str) -> Option<DeviceType> {
        match name {
            "CPU" => Some(DeviceType::Cpu),
            "GPU" => Some(DeviceType::Gpu),
            _ => None,
        }
    }

    /// Returns TensorFlow's device type string ("CPU", "GPU").
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::Cpu => "CPU",
            DeviceType::Gpu => "GPU",
        }
    }
}

/// One GPU as the driver describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuInfo {
    /// The driver's ordinal (the physical id `visible_devices` refers to).
    pub ordinal: u32,
    /// The product name ("NVIDIA H100 80GB HBM3").
    pub name: String,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// PCI address as `domain:bus:device.0` in hex, when the driver reports it.
    pub pci_bus_id: Option<String>,
    /// Compute capability (major, minor), when the driver reports it.
    pub compute_capability: Option<(i32, i32)>,
}

/// What looking for GPUs found.
#[derive(Clone, Debug, PartialEq)]
pub enum GpuScan {
    /// No usable CUDA driver: no library, or it failed to initialize. Not an error: most
    /// hosts (every ps, CPU-only workers) have no GPU.
    Unavailable {
        /// Why, for the log.
        reason: String,
    },
    /// The driver answered; these are its GPUs in ordinal order (possibly none).
    Found(Vec<GpuInfo>),
}

/// Looks for the host's GPUs. The real one is [`CudaProbe`]; tests use fakes.
pub trait GpuProbe {
    /// Returns what was found. Never panics.
    fn scan(&self) -> GpuScan;
}

/// Builds the task's devices with the real CUDA probe: CPUs first, then GPUs. Each GPU's
/// driver ordinal is recorded for [`gpu_ordinal`], which the GPU kernels ask.
pub fn discover(task: &TaskId, config: &DeviceConfig) -> Result<Vec<DeviceAttributes>> {
    let devices = build_devices(task, config, &CudaProbe)?;
    let mut ordinals = gpu_ordinals().lock().unwrap_or_else(|e| e.into_inner());
    for device in devices.iter().filter(|d| d.device_type == "GPU") {
        // `physical_device_desc` starts with "device: <ordinal>, " (see `gpu_attributes`).
        let ordinal = device
            .physical_device_desc
            .strip_prefix("device: ")
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse::<u32>().ok());
        if let Some(ordinal) = ordinal {
            ordinals.insert(device.name.clone(), ordinal);
        }
    }
    Ok(devices)
}

/// The driver ordinal of the GPU device named `device` (full name) that [`discover`] created
/// in this process, if any: `visible_gpus = [3]` makes `GPU:0` ordinal 3.
pub fn gpu_ordinal(device: &str) -> Option<u32> {
    let canonical = crate::cluster::DeviceName::parse(device).ok()?.to_string();
    gpu_ordinals()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&canonical)
        .copied()
}

fn gpu_ordinals() -> &'static Mutex<HashMap<String, u32>> {
    static ORDINALS: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
    ORDINALS.get_or_init(Mutex::default)
}

/// Builds the task's devices from `config` and what `probe` finds: `CPU:0..cpu_count`, then
/// the chosen GPUs as `GPU:0..`, each with a fresh random non-zero incarnation.
///
/// GPUs are chosen as TensorFlow chooses them: `visible_devices` (physical ids, in the order
/// they become `GPU:0`, `GPU:1`, ...) or every GPU when it is empty, then at most `gpu_count`
/// of those. A visible id the driver does not have is INVALID_ARGUMENT; when there is no
/// driver at all, `visible_devices` is ignored with a warning, so that one cluster file can
/// serve hosts with and without GPUs.
pub fn build_devices(
    task: &TaskId,
    config: &DeviceConfig,
    probe: &dyn GpuProbe,
) -> Result<Vec<DeviceAttributes>> {
    let prefix = task.device_prefix();
    let mut devices: Vec<DeviceAttributes> = (0..config.cpu_count.get())
        .map(|i| DeviceAttributes {
            name: format!("{prefix}/device:CPU:{i}"),
            device_type: "CPU".into(),
            // The budget the device's steps and variables are held to (TensorFlow's CPU devices
            // report a nominal 256 MiB; `tessera status` and the metrics show the real one).
            memory_limit: i64::try_from(config.cpu_memory_budget()).unwrap_or(i64::MAX),
            locality: Some(DeviceLocality {
                bus_id: 1,
                ..Default::default()
            }),
            incarnation: new_incarnation(),
            physical_device_desc: String::new(),
            xla_global_id: -1,
        })
        .collect();

    if config.gpu_count == Some(0) {
        info!(task = %task, "gpus hidden by devices.gpu = 0");
        return Ok(devices);
    }
    let gpus = match probe.scan() {
        GpuScan::Unavailable { reason } => {
            info!(task = %task, reason = %reason, "no gpu driver, cpu devices only");
            if !config.visible_devices.is_empty() {
                warn!(
                    task = %task,
                    visible_devices = ?config.visible_devices,
                    "devices.visible_gpus ignored: no gpu driver on this host"
                );
            }
            return Ok(devices);
        }
        GpuScan::Found(gpus) => gpus,
    };
    let chosen = choose_gpus(&gpus, config)?;
    for (i, gpu) in chosen.into_iter().enumerate() {
        devices.push(gpu_attributes(&prefix, i, gpu, config.gpu_memory_fraction));
    }
    Ok(devices)
}

/// Why the task's devices could not be built.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// `visible_devices` names a GPU the driver does not have.
    #[error(
        "devices.visible_gpus lists GPU {id} but this host has {count} GPU(s){ids}; \
         remove it or fix the id",
        ids = if *count == 0 { String::new() } else { format!(" (ids 0..={})", count - 1) }
    )]
    UnknownVisibleGpu {
        /// The physical id asked for.
        id: u32,
        /// How many GPUs the driver reports.
        count: usize,
    },
    /// `visible_devices` names a GPU twice.
    #[error("devices.visible_gpus lists GPU {id} twice; list each physical GPU once")]
    DuplicateVisibleGpu {
        /// The repeated physical id.
        id: u32,
    },
}

impl DeviceError {
    /// Returns the status code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            DeviceError::UnknownVisibleGpu { .. } => Code::InvalidArgument,
            DeviceError::DuplicateVisibleGpu { .. } => Code::InvalidArgument,
        }
    }
}

impl From<DeviceError> for Status {
    fn from(e: DeviceError) -> Self {
        Status::new(e.code(), e.to_string())
    }
}

/// Picks the GPUs to use, in `GPU:i` order.
fn choose_gpus<'a>(
    gpus: &'a [GpuInfo],
    config: &DeviceConfig,
) -> Result<Vec<&'a GpuInfo>, DeviceError> {
    let mut chosen = Vec::new();
    if config.visible_devices.is_empty() {
        chosen.extend(gpus.iter());
    } else {
        for (position, &id) in config.visible_devices.iter().enumerate() {
            if config.visible_devices[..position].contains(&id) {
                return Err(DeviceError::DuplicateVisibleGpu { id });
            }
            let gpu =
                gpus.iter()
                    .find(|g| g.ordinal == id)
                    .ok_or(DeviceError::UnknownVisibleGpu {
                        id,
                        count: gpus.len(),
                    })?;
            chosen.push(gpu);
        }
    }
    if let Some(max) = config.gpu_count {
        chosen.truncate(max as usize);
    }
    Ok(chosen)
}

/// Describes one chosen GPU as `GPU:index`, in TensorFlow's `physical_device_desc` format.
fn gpu_attributes(prefix: &str, index: usize, gpu: &GpuInfo, fraction: f64) -> DeviceAttributes {
    let mut desc = format!("device: {}, name: {}", gpu.ordinal, gpu.name);
    if let Some(bus) = &gpu.pci_bus_id {
        desc.push_str(&format!(", pci bus id: {bus}"));
    }
    if let Some((major, minor)) = gpu.compute_capability {
        desc.push_str(&format!(", compute capability: {major}.{minor}"));
    }
    // The fraction is validated to (0, 1] by the config loader; the clamp keeps a bad value
    // from producing a negative or oversized limit all the same.
    let limit = (gpu.total_memory as f64 * fraction.clamp(0.0, 1.0)) as i64;
    DeviceAttributes {
        name: format!("{prefix}/device:GPU:{index}"),
        device_type: "GPU".into(),
        memory_limit: limit,
        locality: Some(DeviceLocality {
            bus_id: 1,
            ..Default::default()
        }),
        incarnation: new_incarnation(),
        physical_device_desc: desc,
        xla_global_id: -1,
    }
}

/// Returns a random non-zero u64: zero means "unknown incarnation" on the wire.
fn new_incarnation() -> u64 {
    loop {
        let value: u64 = rand::random();
        if value != 0 {
            return value;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::num::NonZeroU32;

    use super::*;

    struct FakeProbe(GpuScan);

    impl GpuProbe for FakeProbe {
        fn scan(&self) -> GpuScan {
            self.0.clone()
        }
    }

    fn gpu(ordinal: u32, gib: u64) -> GpuInfo {
        GpuInfo {
            ordinal,
            name: format!("Fake GPU {ordinal}"),
            total_memory: gib << 30,
            pci_bus_id: Some(format!("0000:{:02x}:00.0", ordinal + 1)),
            compute_capability: Some((9, 0)),
        }
    }

    fn four_gpus() -> FakeProbe {
        FakeProbe(GpuScan::Found(vec![
            gpu(0, 80),
            gpu(1, 80),
            gpu(2, 40),
            gpu(3, 40),
        ]))
    }

    fn no_driver() -> FakeProbe {
        FakeProbe(GpuScan::Unavailable {
            reason: "libcuda.so not found".into(),
        })
    }

    fn names(devices: &[DeviceAttributes]) -> Vec<&str> {
        devices.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn cpu_only_host_gets_cpu_devices_named_after_the_task() {
        let config = DeviceConfig {
            cpu_count: NonZeroU32::new(2).unwrap(),
            ..Default::default()
        };
        let devices = build_devices(&TaskId::new("ps", 1), &config, &no_driver()).unwrap();
        assert_eq!(
            names(&devices),
            [
                "/job:ps/replica:0/task:1/device:CPU:0",
                "/job:ps/replica:0/task:1/device:CPU:1"
            ]
        );
        for d in &devices {
            assert_eq!(d.device_type, "CPU");
            assert_eq!(d.memory_limit as u64, config.cpu_memory_budget());
            assert_eq!(d.xla_global_id, -1);
            assert_ne!(d.incarnation, 0);
        }
    }

    #[test]
    fn every_gpu_is_used_when_nothing_filters() {
        let config = DeviceConfig::default();
        let devices = build_devices(&TaskId::new("worker", 0), &config, &four_gpus()).unwrap();
        assert_eq!(devices.len(), 5);
        assert_eq!(devices[1].name, "/job:worker/replica:0/task:0/device:GPU:0");
        assert_eq!(devices[4].name, "/job:worker/replica:0/task:0/device:GPU:3");
        assert_eq!(devices[4].device_type, "GPU");
        assert_eq!(devices[4].memory_limit, 40 << 30);
        assert_eq!(
            devices[1].physical_device_desc,
            "device: 0, name: Fake GPU 0, pci bus id: 0000:01:00.0, compute capability: 9.0"
        );
    }

    #[test]
    fn visible_devices_remap_physical_ids_and_gpu_count_caps_them() {
        let config = DeviceConfig {
            visible_devices: vec![3, 1, 2],
            gpu_count: Some(2),
            ..Default::default()
        };
        let devices = build_devices(&TaskId::new("worker", 0), &config, &four_gpus()).unwrap();
        // GPU:0 is physical 3, GPU:1 is physical 1; physical 2 is cut by gpu_count = 2.
        assert_eq!(devices.len(), 3);
        assert!(devices[1].physical_device_desc.starts_with("device: 3,"));
        assert!(devices[2].physical_device_desc.starts_with("device: 1,"));
        assert_eq!(devices[2].name, "/job:worker/replica:0/task:0/device:GPU:1");
    }

    #[test]
    fn gpu_count_zero_hides_gpus() {
        let config = DeviceConfig {
            gpu_count: Some(0),
            ..Default::default()
        };
        let devices = build_devices(&TaskId::new("worker", 0), &config, &four_gpus()).unwrap();
        assert_eq!(
            names(&devices),
            ["/job:worker/replica:0/task:0/device:CPU:0"]
        );
    }

    #[test]
    fn memory_fraction_scales_the_gpu_limit() {
        let config = DeviceConfig {
            gpu_memory_fraction: 0.25,
            ..Default::default()
        };
        let devices = build_devices(&TaskId::new("worker", 0), &config, &four_gpus()).unwrap();
        assert_eq!(devices[1].memory_limit, 20 << 30); // 80 GiB / 4
        assert_eq!(devices[3].memory_limit, 10 << 30); // 40 GiB / 4
    }

    #[test]
    fn unknown_visible_gpu_is_invalid_argument_naming_it() {
        let config = DeviceConfig {
            visible_devices: vec![7],
            ..Default::default()
        };
        let err = build_devices(&TaskId::new("worker", 0), &config, &four_gpus()).unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(err.message().contains("GPU 7"), "{err}");
        assert!(err.message().contains("has 4 GPU(s)"), "{err}");
    }

    #[test]
    fn duplicate_visible_gpu_is_refused() {
        let config = DeviceConfig {
            visible_devices: vec![1, 1],
            ..Default::default()
        };
        let err = build_devices(&TaskId::new("worker", 0), &config, &four_gpus()).unwrap_err();
        assert!(err.message().contains("GPU 1 twice"), "{err}");
    }

    #[test]
    fn visible_devices_without_a_driver_is_not_an_error() {
        let config = DeviceConfig {
            visible_devices: vec![0, 1],
            ..Default::default()
        };
        let devices = build_devices(&TaskId::new("worker", 0), &config, &no_driver()).unwrap();
        assert_eq!(devices.len(), 1);
    }

    #[test]
    fn incarnations_are_fresh_per_build() {
        let config = DeviceConfig {
            cpu_count: NonZeroU32::new(4).unwrap(),
            ..Default::default()
        };
        let task = TaskId::new("worker", 0);
        let a = build_devices(&task, &config, &four_gpus()).unwrap();
        let b = build_devices(&task, &config, &four_gpus()).unwrap();
        let all: HashSet<u64> = a.iter().chain(&b).map(|d| d.incarnation).collect();
        // 16 draws of a random u64 collide with probability ~ 16^2 / 2^65: never in practice.
        assert_eq!(all.len(), 16);
    }

    #[test]
    fn the_real_probe_never_panics() {
        // On a host without libcuda this is `Unavailable`; with one, `Found`. Either is fine.
        let _ = CudaProbe.scan();
    }
}
