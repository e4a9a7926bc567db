//! Device memory as a place tensors live: a GPU's memory, or a host-memory stand-in for one.
//!
//! A device with a [`MemorySpace`] keeps the tensors its kernels compute in its own memory
//! ([`Tensor::on_device`]), and tensors cross between it and the host only where the step needs
//! them there:
//!
//! - into the device where a tensor enters its partition: a `_Recv` (a feed, or a tensor from
//!   another device or task) and a `Const`, whose kernel keeps its one copy for every step;
//! - out of it where host code reads the elements: a `_Send` to another device or task, a fetch.
//!
//! [`place`] is that rule, applied by the kernels that bring tensors in. Every crossing goes
//! through the space, which counts it ([`Copies`]), so a test can hold a step to the copies its
//! dataflow needs. [`Emulated`] is a space in host memory that copies and counts as a GPU
//! would: it runs the GPU's placement, partitioning and copies on a machine without one.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::context::{EmulatedContext, Released};
use crate::error::{Result, Status};
use crate::tensor::{DType, DeviceBuffer, Tensor};

/// A device's own memory.
pub trait MemorySpace: Send + Sync {
    /// The full name of the device.
    fn device(&self) -> &str;

    /// Whether the device keeps tensors of `dtype` in its memory: those its kernels compute.
    /// Others (a GPU's int32 shape arithmetic) stay in host memory, as TensorFlow keeps them.
    fn holds(&self, dtype: DType) -> bool;

    /// Copies a host tensor into the device's memory (counted in [`MemorySpace::copies`]).
    fn upload(&self, tensor: &Tensor) -> Result<Tensor>;

    /// The copies between the host and this memory so far.
    fn copies(&self) -> Copies;

    /// Makes the device's context current on the calling thread: each of its tower's threads
    /// calls it as it starts. Nothing to do for a memory without one.
    fn bind(&self) -> Result<()> {
        Ok(())
    }

    /// Called on one of the device's threads at the end of each of its steps: frees the
    /// buffers dropped elsewhere since, and returns an error the device parked meanwhile (a
    /// free that failed), so that it fails the step that caused it
    /// (see [`context`](super::context)).
    fn settle(&self) -> Result<()> {
        Ok(())
    }

    /// The space as `Any`, for the device's own kernels to reach their memory type.
    fn as_any(&self) -> &dyn Any;
}

/// Copies between the host and a device's memory, and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copies {
    /// Host-to-device copies.
    pub to_device: u64,
    /// Device-to-host copies.
    pub to_host: u64,
    /// Bytes copied to the device.
    pub bytes_to_device: u64,
    /// Bytes copied to the host.
    pub bytes_to_host: u64,
}

impl std::ops::Sub for Copies {
    type Output = Copies;

    /// The copies made between two readings.
    fn sub(self, before: Copies) -> Copies {
        Copies {
            to_device: self.to_device - before.to_device,
            to_host: self.to_host - before.to_host,
            bytes_to_device: self.bytes_to_device - before.bytes_to_device,
            bytes_to_host: self.bytes_to_host - before.bytes_to_host,
        }
    }
}

/// Counts a device's copies; shared by its space and every buffer it hands out, since a
/// buffer is copied to the host long after the space made it.
#[derive(Debug, Default)]
pub struct CopyCounter {
    to_device: AtomicU64,
    to_host: AtomicU64,
    bytes_to_device: AtomicU64,
    bytes_to_host: AtomicU64,
}

impl CopyCounter {
    /// Records a host-to-device copy of `bytes`.
    pub fn to_device(&self, bytes: usize) {
        self.to_device.fetch_add(1, Ordering::Relaxed);
        self.bytes_to_device
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Records a device-to-host copy of `bytes`.
    pub fn to_host(&self, bytes: usize) {
        self.to_host.fetch_add(1, Ordering::Relaxed);
        self.bytes_to_host
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The copies so far.
    pub fn read(&self) -> Copies {
        Copies {
            to_device: self.to_device.load(Ordering::Relaxed),
            to_host: self.to_host.load(Ordering::Relaxed),
            bytes_to_device: self.bytes_to_device.load(Ordering::Relaxed),
            bytes_to_host: self.bytes_to_host.load(Ordering::Relaxed),
        }
    }
}

/// Where `tensor` lives on a device with memory `space` (`None`: the host's): a tensor of a
/// dtype the device holds is copied into it, one in another device's memory is copied to the
/// host (and on into this device's when it holds the dtype), anything else is already in place.
pub fn place(space: Option<&dyn MemorySpace>, tensor: Tensor) -> Result<Tensor> {
    let resident = tensor.device_buffer().map(|b| b.device().to_string());
    match (space, resident) {
        (Some(space), Some(device)) if device == space.device() => Ok(tensor),
        (Some(space), _) if space.holds(tensor.dtype()) && !tensor.is_ref() => {
            space.upload(&tensor.to_host()?)
        }
        (_, Some(_)) => tensor.to_host(),
        (_, None) => Ok(tensor),
    }
}

/// A device memory in host memory: it keeps its tensors in buffers of its own, copies into
/// and out of them as a GPU copies over PCIe, and counts every copy. Its kernels are the CPU
/// kernels, run on the buffers in place ([`Emulated::read`], [`Emulated::adopt`]); see
/// `kernels::emulated`.
///
/// It holds its calls to a GPU driver's rule ([`EmulatedContext`]): copies in, kernels'
/// reads and writes and frees work only on a thread where the device's context is current,
/// a free elsewhere parks its error for the next call, and a copy to the host makes the
/// context current for itself. A buffer dropped anywhere is handed back and freed on the
/// device's threads ([`MemorySpace::settle`]).
#[derive(Debug)]
pub struct Emulated {
    device: String,
    counter: Arc<CopyCounter>,
    context: Arc<EmulatedContext>,
    released: Arc<Released<Bytes>>,
}

impl Emulated {
    /// The memory of the device named `device` (its full name), holding float32 tensors as
    /// tessera's GPU kernels compute them.
    pub fn new(device: impl Into<String>) -> Arc<Self> {
        let device = device.into();
        Arc::new(Self {
            context: Arc::new(EmulatedContext::new(device.clone())),
            device,
            counter: Arc::default(),
            released: Arc::default(),
        })
    }

    /// The device's context, which its threads make current.
    pub fn context(&self) -> &Arc<EmulatedContext> {
        &self.context
    }

    /// The elements of `tensor`, which is in this memory, as a host tensor sharing them: the
    /// device's kernels reading their own memory, which is no copy.
    pub fn read(&self, tensor: &Tensor) -> Result<Tensor> {
        self.context.call("a kernel's read of its memory")?;
        let buffer = self.buffer(tensor)?;
        Tensor::from_bytes(tensor.dtype(), tensor.shape().clone(), buffer.bytes.clone())
    }

    /// `tensor` (in host memory, just computed by one of the device's kernels) as a tensor in
    /// this memory, without a copy: what the device's kernel wrote into its own memory.
    pub fn adopt(&self, tensor: &Tensor) -> Result<Tensor> {
        self.context
            .allocate("a buffer for a kernel's output or a copy in")?;
        let bytes = tensor.shared_bytes().ok_or_else(|| {
            Status::internal(format!(
                "{}: only fixed-size host tensors can be put in device memory, not {tensor:?}",
                self.device
            ))
        })?;
        let buffer = EmulatedBuffer {
            device: self.device.clone(),
            bytes,
            counter: Arc::clone(&self.counter),
            context: Arc::clone(&self.context),
            released: Arc::clone(&self.released),
        };
        Tensor::on_device(tensor.dtype(), tensor.shape().clone(), buffer)
    }

    /// The buffer of `tensor`, which must be in this memory.
    fn buffer<'t>(&self, tensor: &'t Tensor) -> Result<&'t EmulatedBuffer> {
        tensor
            .device_buffer()
            .and_then(|b| b.as_any().downcast_ref::<EmulatedBuffer>())
            .filter(|b| b.device == self.device)
            .ok_or_else(|| {
                Status::internal(format!(
                    "{}: a kernel read {tensor:?} as this device's memory",
                    self.device
                ))
            })
    }
}

impl MemorySpace for Emulated {
    fn device(&self) -> &str {
        &self.device
    }

    fn holds(&self, dtype: DType) -> bool {
        dtype == DType::Float
    }

    fn upload(&self, tensor: &Tensor) -> Result<Tensor> {
        self.context.call("a copy to the device")?;
        let bytes = tensor.bytes().ok_or_else(|| {
            Status::internal(format!(
                "{}: only fixed-size host tensors can be copied to device memory, not {tensor:?}",
                self.device
            ))
        })?;
        self.counter.to_device(bytes.len());
        // A copy of its own, as device memory is: nothing the host does to its buffer shows.
        let copy = Tensor::from_bytes(
            tensor.dtype(),
            tensor.shape().clone(),
            Bytes::copy_from_slice(bytes),
        )?;
        self.adopt(&copy)
    }

    fn copies(&self) -> Copies {
        self.counter.read()
    }

    fn bind(&self) -> Result<()> {
        self.context.bind()
    }

    fn settle(&self) -> Result<()> {
        self.context.call("freeing the buffers handed back")?;
        for _buffer in self.released.take() {
            self.context.free();
        }
        self.context.check()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One tensor's elements in [`Emulated`] memory.
struct EmulatedBuffer {
    device: String,
    bytes: Bytes,
    counter: Arc<CopyCounter>,
    context: Arc<EmulatedContext>,
    released: Arc<Released<Bytes>>,
}

impl Drop for EmulatedBuffer {
    /// Hands the buffer back to its device, whatever thread drops it: a free here would be a
    /// call from a thread where the context may not be current.
    fn drop(&mut self) {
        self.released.push(std::mem::take(&mut self.bytes));
    }
}

impl DeviceBuffer for EmulatedBuffer {
    fn device(&self) -> &str {
        &self.device
    }

    fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    fn copy_to_host(&self) -> Result<Bytes> {
        // Makes the context current for the copy (and returns a parked error first).
        let _active = self.context.activate()?;
        self.counter.to_host(self.bytes.len());
        Ok(Bytes::copy_from_slice(&self.bytes))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: &str = "/job:localhost/replica:0/task:0/device:GPU:0";

    #[test]
    fn a_tensor_crosses_once_each_way_and_host_reads_share_the_copy() {
        let space = Emulated::new(GPU);
        space.bind().unwrap();
        let host = Tensor::from_vec([2], vec![1.0f32, 2.0]).unwrap();
        let on_gpu = place(Some(space.as_ref()), host.clone()).unwrap();
        assert_eq!(on_gpu.device_buffer().unwrap().device(), GPU);
        assert!(on_gpu.bytes().is_none(), "device memory has no host bytes");
        // Already there: placing it again copies nothing.
        let again = place(Some(space.as_ref()), on_gpu.clone()).unwrap();
        assert_eq!(space.copies().to_device, 1);
        // Its kernels read it where it is.
        assert_eq!(space.read(&again).unwrap(), host);
        assert_eq!(space.copies().to_host, 0);
        // The host copies it once, however many readers.
        assert_eq!(place(None, on_gpu.clone()).unwrap(), host);
        assert_eq!(on_gpu.values::<f32>().unwrap().as_ref(), &[1.0, 2.0]);
        assert_eq!(on_gpu.to_proto(), host.to_proto());
        assert_eq!(
            space.copies(),
            Copies {
                to_device: 1,
                to_host: 1,
                bytes_to_device: 8,
                bytes_to_host: 8
            }
        );
    }

    #[test]
    fn dtypes_the_device_does_not_compute_stay_on_the_host() {
        let space = Emulated::new(GPU);
        space.bind().unwrap();
        let shape = Tensor::from_vec([2], vec![3i32, 4]).unwrap();
        let placed = place(Some(space.as_ref()), shape.clone()).unwrap();
        assert_eq!(placed, shape);
        assert!(placed.device_buffer().is_none());
        assert_eq!(space.copies(), Copies::default());
    }

    #[test]
    fn a_tensor_of_another_device_goes_through_the_host() {
        let gpu0 = Emulated::new(GPU);
        let gpu1 = Emulated::new("/job:localhost/replica:0/task:0/device:GPU:1");
        gpu0.bind().unwrap();
        let on0 = gpu0.upload(&Tensor::scalar(5.0f32)).unwrap();
        // A thread of GPU:1 reads GPU:0's tensor: the copy out makes GPU:0's context current
        // for itself and puts GPU:1's back.
        gpu1.bind().unwrap();
        let on1 = place(Some(gpu1.as_ref()), on0).unwrap();
        assert_eq!(gpu1.read(&on1).unwrap(), Tensor::scalar(5.0f32));
        assert_eq!((gpu0.copies().to_host, gpu1.copies().to_device), (1, 1));
        assert!(gpu0.read(&on1).is_err(), "GPU:0 reads GPU:1's memory");
    }

    #[test]
    fn calls_need_the_context_and_buffers_dropped_anywhere_are_freed_by_the_device() {
        let space = Emulated::new(GPU);
        let host = Tensor::from_vec([2], vec![1.0f32, 2.0]).unwrap();
        let err = space.upload(&host).unwrap_err();
        assert!(
            err.message().contains("CUDA_ERROR_INVALID_CONTEXT"),
            "{err}"
        );
        space.bind().unwrap();
        let on_gpu = space.upload(&host).unwrap();
        // Read and dropped on a thread where the context is not current: the copy out makes it
        // current for itself, the drop hands the buffer back.
        std::thread::scope(|s| {
            s.spawn(move || {
                assert_eq!(on_gpu.to_host().unwrap(), host);
                drop(on_gpu);
            });
        });
        assert_eq!(space.context().frees(), 0);
        space.settle().unwrap();
        assert_eq!(
            (space.context().allocations(), space.context().frees()),
            (1, 1)
        );
        space.upload(&Tensor::scalar(1.0f32)).unwrap();
    }
}
