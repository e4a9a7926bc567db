//! Finding the host's GPUs through the CUDA driver, loaded at run time.
//!
//! cudarc loads `libcuda` lazily on the first driver call and panics when the library or one
//! of its symbols is missing. Hosts without a GPU are the common case (every ps), so the probe
//! checks for the library first and runs the driver calls under `catch_unwind`: a missing or
//! broken driver becomes [`GpuScan::Unavailable`], never a crash.
//!
//! A process asks the driver once: the first scan is kept for every later one (a process's
//! GPUs do not change under it, and the driver's `cuInit` holds for the process too), so that
//! a test or bench starting many tasks, or `tessera train` checking its towers before its
//! daemon starts, does not look for the library again each time (about 0.7 ms).

use std::panic::{self, AssertUnwindSafe};
use std::sync::OnceLock;

use cudarc::driver::{result, sys};

use super::{GpuInfo, GpuProbe, GpuScan};

/// The real probe: asks the CUDA driver API (`cuInit`, `cuDeviceGetCount`, ...).
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaProbe;

impl GpuProbe for CudaProbe {
    fn scan(&self) -> GpuScan {
        static SCAN: OnceLock<GpuScan> = OnceLock::new();
        SCAN.get_or_init(scan_once).clone()
    }
}

/// Looks for the driver and, when it loads, lists its GPUs.
fn scan_once() -> GpuScan {
    // SAFETY: `is_culib_present` only tries to dlopen the library and drops it.
    if !unsafe { sys::is_culib_present() } {
        return GpuScan::Unavailable {
            reason: "libcuda not found".into(),
        };
    }
    match panic::catch_unwind(AssertUnwindSafe(scan_driver)) {
        Ok(Ok(gpus)) => GpuScan::Found(gpus),
        Ok(Err(e)) => GpuScan::Unavailable {
            reason: format!("cuda driver: {e}"),
        },
        Err(panic) => {
            let reason = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "cuda driver panicked".into());
            GpuScan::Unavailable { reason }
        }
    }
}

/// Lists every GPU the driver sees, in ordinal order.
fn scan_driver() -> Result<Vec<GpuInfo>, result::DriverError> {
    result::init()?;
    let count = result::device::get_count()?;
    let mut gpus = Vec::new();
    for ordinal in 0..count {
        let dev = result::device::get(ordinal)?;
        let name = result::device::get_name(dev)?;
        // SAFETY: `dev` was returned by `cuDeviceGet` above.
        let total_memory = unsafe { result::device::total_mem(dev)? } as u64;
        let attr = |a| unsafe { result::device::get_attribute(dev, a) }.ok();
        use sys::CUdevice_attribute::*;
        let pci_bus_id = match (
            attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
            attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
            attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID),
        ) {
            (Some(domain), Some(bus), Some(device)) => {
                Some(format!("{domain:04x}:{bus:02x}:{device:02x}.0"))
            }
            _ => None,
        };
        let compute_capability = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .zip(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
        gpus.push(GpuInfo {
            ordinal: ordinal as u32,
            name,
            total_memory,
            pci_bus_id,
            compute_capability,
        });
    }
    Ok(gpus)
}
