//! One GPU as the kernels use it: a CUDA context, a stream of its own, a cuBLAS handle, the
//! NVRTC-compiled module of `kernels.cu` and a cache of freed buffers, made once per GPU per
//! process on first use; and its memory as the place a GPU device's tensors live
//! ([`GpuMemory`], [`GpuBuffer`]).
//!
//! A GPU is a serial stream: kernels lock [`Gpu::lock`] for their whole computation (copies in,
//! launches, copies out), so concurrent steps on one GPU take turns, and a cuBLAS handle is
//! never used from two threads at once. Driver, cuBLAS and NVRTC failures become statuses; an
//! allocation the driver refuses is RESOURCE_EXHAUSTED naming the node and the bytes.
//!
//! Contexts (`device::context`): the GPU's tower threads make its context current as they
//! start ([`GpuMemory`]'s `bind`), and [`Gpu::lock`] makes it current again (as TensorFlow's
//! `ScopedActivateContext`, since an all-reduce or a read of another GPU's tensor leaves that
//! GPU's current). A [`GpuBuffer`] dropped on any thread makes no driver call: its slice goes
//! back to the GPU ([`Released`]), and the next lock takes it into the GPU's cache, where an
//! allocation of the same length reuses it on the same stream; the cache frees (under the lock,
//! with the context current) only past [`CACHE_BYTES`] or when an allocation is refused. cudarc
//! frees a `CudaSlice` in its `drop` without making its context current, which on a thread of
//! another device failed and parked `CUDA_ERROR_INVALID_CONTEXT` for the GPU's next call.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bytes::Bytes;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchArgs,
    LaunchConfig, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use crate::cluster::DeviceName;
use crate::device::context::{BufferCache, Released};
use crate::device::space::{Copies, CopyCounter, MemorySpace};
use crate::error::{Result, Status};
use crate::tensor::{DType, DeviceBuffer, Element, Shape, Tensor};

/// The CUDA C source of every kernel; entry points are `extern "C"`.
const SOURCE: &str = include_str!("kernels.cu");

/// The entry points of [`SOURCE`].
pub const FUNCTIONS: [&str; 14] = [
    "binary_f32",
    "unary_f32",
    "reduce_f32",
    "softmax_f32",
    "softmax_xent_f32",
    "sparse_xent_f32",
    "apply_f32",
    "conv2d_f32",
    "conv2d_input_grad_f32",
    "conv2d_filter_grad_f32",
    "max_pool_f32",
    "max_pool_grad_f32",
    "avg_pool_f32",
    "avg_pool_grad_f32",
];

/// Threads per block of the element-wise launches.
pub const BLOCK: u32 = 256;

/// The most bytes of freed buffers a GPU keeps for reuse; a buffer freed past it goes back to
/// the driver. The device's memory budget (`gpu_memory_fraction`) counts what kernels hold,
/// not this cache, so the process may hold up to this much more of the GPU.
pub const CACHE_BYTES: usize = 1 << 30;

/// Bytes of a float32.
const F32: usize = std::mem::size_of::<f32>();

/// The GPU's handles, used under [`Gpu::lock`].
pub struct GpuInner {
    /// The stream every copy and launch goes to: the GPU's own.
    pub stream: Arc<CudaStream>,
    /// cuBLAS on that stream.
    pub blas: CudaBlas,
    functions: HashMap<&'static str, CudaFunction>,
    /// Freed float buffers for reuse on the stream, up to [`CACHE_BYTES`] (a `RefCell`: only
    /// used under the lock, with the context current, so what it frees is freed there).
    cache: RefCell<BufferCache<CudaSlice<f32>>>,
}

/// One GPU, shared by the kernels of every node placed on it.
pub struct Gpu {
    ordinal: usize,
    context: Arc<CudaContext>,
    /// Buffers of dropped tensors, for the next lock to take into the cache.
    released: Released<CudaSlice<f32>>,
    inner: Mutex<GpuInner>,
}

/// The GPUs opened so far, by driver ordinal.
fn opened() -> &'static Mutex<HashMap<usize, Arc<Gpu>>> {
    static OPENED: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
    OPENED.get_or_init(Mutex::default)
}

impl Gpu {
    /// The GPU behind the device named `device` (`.../device:GPU:i`): its driver ordinal is
    /// the one device discovery recorded for that name (`visible_gpus` may remap), else `i`.
    pub fn for_device(device: &str) -> Result<Arc<Gpu>> {
        let ordinal = match crate::device::gpu_ordinal(device) {
            Some(ordinal) => ordinal as usize,
            None => {
                let name = DeviceName::parse(device)?;
                match (name.device_type.as_deref(), name.id) {
                    (Some("GPU"), Some(id)) => id as usize,
                    _ => {
                        return Err(Status::invalid_argument(format!(
                            "a GPU kernel was asked to run on `{device}`, which is not a GPU"
                        )))
                    }
                }
            }
        };
        Gpu::open(ordinal)
    }

    /// Opens GPU `ordinal` (once per process): context, stream, cuBLAS, and the kernels
    /// compiled by NVRTC for it.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>> {
        let mut all = opened().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(gpu) = all.get(&ordinal) {
            return Ok(Arc::clone(gpu));
        }
        let driver = |e: DriverError| Status::internal(format!("GPU {ordinal}: {e}"));
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        // One stream orders all of the GPU's work, so cudarc need not track each buffer's
        // reads and writes with events (it would with more than one stream).
        // SAFETY: no buffer exists on this context yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver)?;
        let blas = CudaBlas::new(Arc::clone(&stream))
            .map_err(|e| Status::internal(format!("GPU {ordinal}: cuBLAS: {e}")))?;
        let ptx = compile().map_err(|e| e.context(format!("GPU {ordinal}")))?;
        let module = ctx.load_module(ptx).map_err(driver)?;
        let mut functions = HashMap::new();
        for name in FUNCTIONS {
            functions.insert(name, module.load_function(name).map_err(driver)?);
        }
        let gpu = Arc::new(Gpu {
            ordinal,
            context: ctx,
            released: Released::default(),
            inner: Mutex::new(GpuInner {
                stream,
                blas,
                functions,
                cache: RefCell::new(BufferCache::new(CACHE_BYTES)),
            }),
        });
        all.insert(ordinal, Arc::clone(&gpu));
        Ok(gpu)
    }

    /// Returns the driver ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Makes the GPU's context current on the calling thread; returns (once) an error a call
    /// that could not report it parked.
    pub fn bind(&self) -> Result<()> {
        self.context.bind_to_thread().map_err(driver_error)
    }

    /// Takes the GPU for one kernel's computation: makes its context current, then takes the
    /// buffers dropped since into the cache.
    pub fn lock(&self) -> Result<MutexGuard<'_, GpuInner>> {
        self.bind()?;
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let released = self.released.take();
        if !released.is_empty() {
            let mut cache = inner.cache.borrow_mut();
            for slice in released {
                let len = slice.len();
                // Past the cache's limit the slice is freed here, under the context.
                drop(cache.keep(slice, len, F32));
            }
        }
        Ok(inner)
    }

    /// Returns (once) an error a call that could not report it parked in the GPU's context.
    pub fn check(&self) -> Result<()> {
        self.context.check_err().map_err(driver_error)
    }
}

/// Compiles the kernels' source to PTX with NVRTC (loaded at run time). Needs no GPU: the
/// driver turns the PTX into the GPU's own code when a module is loaded.
pub fn compile() -> Result<Ptx> {
    // SAFETY: only tries to dlopen the library and drops it.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Status::failed_precondition(
            "NVRTC (libnvrtc) not found; install the CUDA toolkit's NVRTC or add its directory \
             to LD_LIBRARY_PATH",
        ));
    }
    cudarc::nvrtc::compile_ptx(SOURCE)
        .map_err(|e| Status::internal(format!("NVRTC cannot compile the GPU kernels: {e}")))
}

impl GpuInner {
    /// Copies `host` to a new device buffer; `node` is named if the GPU is out of memory. An
    /// empty slice gets a buffer of one zero (the driver refuses empty allocations), which
    /// no kernel reads.
    pub fn upload<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        node: &str,
        host: &[T],
    ) -> Result<CudaSlice<T>> {
        self.allocate(node, std::mem::size_of_val(host), |stream| {
            if host.is_empty() {
                stream.alloc_zeros::<T>(1)
            } else {
                stream.clone_htod(host)
            }
        })
    }

    /// [`upload`](Self::upload) of a tensor's floats into a freed buffer of their length when
    /// the cache has one.
    pub fn upload_floats(&self, node: &str, host: &[f32]) -> Result<CudaSlice<f32>> {
        let cached = self.cache.borrow_mut().take(host.len().max(1), F32);
        match cached {
            Some(mut slice) if !host.is_empty() => {
                self.stream
                    .memcpy_htod(host, &mut slice)
                    .map_err(driver_error)?;
                Ok(slice)
            }
            Some(mut slice) => {
                self.stream.memset_zeros(&mut slice).map_err(driver_error)?;
                Ok(slice)
            }
            None => self.upload(node, host),
        }
    }

    /// A new zeroed device buffer of `len` floats: a freed one of that length when the cache
    /// has one, else from the driver.
    pub fn zeros(&self, node: &str, len: usize) -> Result<CudaSlice<f32>> {
        // A zero-length allocation is an error in the driver; keep one element instead.
        let len = len.max(1);
        let cached = self.cache.borrow_mut().take(len, F32);
        if let Some(mut slice) = cached {
            self.stream.memset_zeros(&mut slice).map_err(driver_error)?;
            return Ok(slice);
        }
        self.allocate(node, len * 4, |stream| stream.alloc_zeros::<f32>(len))
    }

    /// An allocation of `bytes` for `node` by `allocate`; when the driver is out of memory and
    /// the cache holds buffers, they are freed and the allocation tried once more.
    fn allocate<T>(
        &self,
        node: &str,
        bytes: usize,
        allocate: impl Fn(&Arc<CudaStream>) -> std::result::Result<CudaSlice<T>, DriverError>,
    ) -> Result<CudaSlice<T>> {
        let first = allocate(&self.stream);
        if matches!(&first, Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) {
            let freed = self.cache.borrow_mut().drain();
            if !freed.is_empty() {
                drop(freed);
                return allocate(&self.stream).map_err(|e| alloc_error(e, node, bytes));
            }
        }
        first.map_err(|e| alloc_error(e, node, bytes))
    }

    /// Copies a device buffer back to the host (waits for the stream).
    pub fn download(&self, device: &CudaSlice<f32>, len: usize) -> Result<Vec<f32>> {
        let mut host = self.stream.clone_dtoh(device).map_err(driver_error)?;
        host.truncate(len);
        Ok(host)
    }

    /// Returns the compiled kernel `name`.
    pub fn function(&self, name: &str) -> Result<&CudaFunction> {
        self.functions
            .get(name)
            .ok_or_else(|| Status::internal(format!("no GPU kernel `{name}` was compiled")))
    }

    /// Launches kernel `function` over `threads` threads (in blocks of [`BLOCK`]) with the
    /// arguments `push` gives it.
    ///
    /// # Safety
    ///
    /// The arguments must match `function`'s parameters in `kernels.cu` in number, order and
    /// type, and every buffer must hold what the kernel reads and writes for `threads`.
    pub unsafe fn launch<'a>(
        &'a self,
        function: &str,
        threads: usize,
        push: impl FnOnce(&mut LaunchArgs<'a>),
    ) -> Result<()> {
        let mut launch = self.stream.launch_builder(self.function(function)?);
        push(&mut launch);
        // SAFETY: the caller's promise above.
        unsafe { launch.launch(launch_config(threads)) }.map_err(driver_error)?;
        Ok(())
    }
}

/// The memory of the GPU device named `device`: the space its tensors live in between its
/// kernels ([`GpuBuffer`]s), with the copies in and out counted. Opening the GPU waits for the
/// first copy or kernel.
pub struct GpuMemory {
    device: String,
    counter: Arc<CopyCounter>,
    gpu: OnceLock<Arc<Gpu>>,
}

impl GpuMemory {
    /// The memory of the GPU device named `device` (its full name).
    pub fn new(device: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            device: device.into(),
            counter: Arc::default(),
            gpu: OnceLock::new(),
        })
    }

    /// The GPU, opened on first use.
    fn gpu(&self) -> Result<&Arc<Gpu>> {
        if let Some(gpu) = self.gpu.get() {
            return Ok(gpu);
        }
        let gpu = Gpu::for_device(&self.device)?;
        Ok(self.gpu.get_or_init(|| gpu))
    }

    /// Counts the device's copies.
    pub fn counter(&self) -> &Arc<CopyCounter> {
        &self.counter
    }
}

impl MemorySpace for GpuMemory {
    fn device(&self) -> &str {
        &self.device
    }

    fn holds(&self, dtype: DType) -> bool {
        // The GPU kernels compute float32; other dtypes stay in host memory.
        dtype == DType::Float
    }

    fn upload(&self, tensor: &Tensor) -> Result<Tensor> {
        let gpu = self.gpu()?;
        let values = tensor.values::<f32>()?;
        let slice = gpu.lock()?.upload_floats(&self.device, &values)?;
        self.counter.to_device(std::mem::size_of_val(&values[..]));
        GpuBuffer::tensor(
            &self.device,
            gpu,
            slice,
            tensor.shape().clone(),
            &self.counter,
        )
    }

    fn copies(&self) -> Copies {
        self.counter.read()
    }

    fn bind(&self) -> Result<()> {
        self.gpu()?.bind()
    }

    fn settle(&self) -> Result<()> {
        let gpu = self.gpu()?;
        drop(gpu.lock()?);
        gpu.check()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One float32 tensor's elements in a GPU's memory. When the last tensor holding it goes, on
/// whatever thread, the slice goes back to its GPU for the next lock to cache (see the
/// module's notes on contexts); it is reused after the work queued on the GPU's one stream.
pub struct GpuBuffer {
    device: String,
    gpu: Arc<Gpu>,
    /// Taken by `drop`.
    slice: Option<CudaSlice<f32>>,
    /// Elements held (the slice keeps at least one: the driver refuses empty allocations).
    len: usize,
    counter: Arc<CopyCounter>,
}

impl GpuBuffer {
    /// A tensor of `shape` whose elements are `slice` (at least `shape`'s element count) on
    /// the GPU `gpu` of device `device`; `counter` counts its copy to the host.
    pub fn tensor(
        device: &str,
        gpu: &Arc<Gpu>,
        slice: CudaSlice<f32>,
        shape: Shape,
        counter: &Arc<CopyCounter>,
    ) -> Result<Tensor> {
        let buffer = GpuBuffer {
            device: device.to_string(),
            gpu: Arc::clone(gpu),
            slice: Some(slice),
            len: shape.num_elements(),
            counter: Arc::clone(counter),
        };
        Tensor::on_device(DType::Float, shape, buffer)
    }

    /// The elements of `tensor` in `gpu`'s memory, when that is where they are.
    pub fn on<'t>(tensor: &'t Tensor, gpu: &Gpu) -> Option<&'t CudaSlice<f32>> {
        let buffer = tensor
            .device_buffer()?
            .as_any()
            .downcast_ref::<GpuBuffer>()?;
        (buffer.gpu.ordinal == gpu.ordinal)
            .then_some(buffer.slice.as_ref())
            .flatten()
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if let Some(slice) = self.slice.take() {
            self.gpu.released.push(slice);
        }
    }
}

impl DeviceBuffer for GpuBuffer {
    fn device(&self) -> &str {
        &self.device
    }

    fn byte_len(&self) -> usize {
        self.len * std::mem::size_of::<f32>()
    }

    fn copy_to_host(&self) -> Result<Bytes> {
        let slice = self.slice.as_ref().ok_or_else(|| {
            Status::internal(format!("{}: a dropped buffer was read", self.device))
        })?;
        let host = self.gpu.lock()?.download(slice, self.len)?;
        self.counter.to_host(self.byte_len());
        Ok(f32::into_bytes(host))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `t` as a kernel on `device` may read it while holding GPU locks: in `device`'s memory or the
/// host's. A tensor of another device's memory (normally placed by a `_Recv` already) is copied
/// to the host first, before any lock is taken, since that copy takes the other GPU's lock.
pub fn here_or_host(device: &str, t: &Tensor) -> Result<Tensor> {
    match t.device_buffer() {
        Some(buffer) if buffer.device() != device => t.to_host(),
        _ => Ok(t.clone()),
    }
}

/// A float32 input on the GPU: where an earlier kernel left it, or copied in for this kernel.
pub enum Operand<'t> {
    /// In a [`GpuBuffer`] of the tensor.
    Resident(&'t CudaSlice<f32>),
    /// Copied in from the host.
    Copied(CudaSlice<f32>),
}

impl std::ops::Deref for Operand<'_> {
    type Target = CudaSlice<f32>;

    fn deref(&self) -> &CudaSlice<f32> {
        match self {
            Operand::Resident(slice) => slice,
            Operand::Copied(slice) => slice,
        }
    }
}

/// A launch of `n` threads in blocks of [`BLOCK`].
fn launch_config(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).max(1);
    LaunchConfig {
        grid_dim: (blocks.min(u32::MAX as usize) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A driver error as a status.
pub fn driver_error(e: DriverError) -> Status {
    Status::internal(format!("CUDA driver: {e}"))
}

/// An allocation failure: RESOURCE_EXHAUSTED naming the node and bytes when the GPU is out of
/// memory, else the driver's error.
fn alloc_error(e: DriverError, node: &str, bytes: usize) -> Status {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        Status::resource_exhausted(format!(
            "OOM when allocating {bytes} bytes on the GPU for node `{node}`; use a smaller \
             batch or more towers"
        ))
    } else {
        driver_error(e)
    }
}
