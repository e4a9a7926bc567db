//! Helpers shared by the kernel tests: build a `NodeDef`, run its CPU kernel once, and compare
//! outputs with values worked out in the test.

#![allow(dead_code)]

use tessera::device::DeviceType;
use tessera::error::{Code, Result};
use tessera::kernels::{create_kernel, OpContext};
use tessera::proto::{AttrValue, NodeDef};
use tessera::runtime::resource::ResourceMgr;
use tessera::tensor::{DType, Shape, Tensor};

pub use tessera::graph::attr::value;

pub mod json;

/// The device name kernels see in these tests.
pub const DEVICE: &str = "/job:localhost/replica:0/task:0/device:CPU:0";

/// A `NodeDef` named `x` for `op`, with attrs added by [`NodeBuilder::attr`].
pub struct NodeBuilder(NodeDef);

pub fn node(op: &str) -> NodeBuilder {
    NodeBuilder(NodeDef {
        name: "x".into(),
        op: op.into(),
        ..Default::default()
    })
}

impl NodeBuilder {
    pub fn name(mut self, name: &str) -> Self {
        self.0.name = name.into();
        self
    }

    pub fn attr(mut self, key: &str, value: AttrValue) -> Self {
        self.0.attr.insert(key.into(), value);
        self
    }

    /// Sets the `T` attr.
    pub fn t(self, dtype: DType) -> Self {
        self.attr("T", value::dtype(dtype))
    }

    pub fn build(self) -> NodeDef {
        self.0
    }

    /// The `NodeDef` built so far.
    pub fn def(&self) -> &NodeDef {
        &self.0
    }

    /// Runs the node once on `resources`.
    pub fn run_on(self, inputs: Vec<Tensor>, resources: &ResourceMgr) -> Result<Vec<Tensor>> {
        run_with(&self.0, inputs, resources)
    }

    /// Runs the node once on a fresh resource manager.
    pub fn run(self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        run_with(&self.0, inputs, &ResourceMgr::new())
    }
}

/// Creates the node's CPU kernel and runs it once; returns every output (all must be set).
pub fn run_with(
    node: &NodeDef,
    inputs: Vec<Tensor>,
    resources: &ResourceMgr,
) -> Result<Vec<Tensor>> {
    let kernel = create_kernel(node, DeviceType::Cpu)?;
    let mut ctx = OpContext::new(node, inputs, resources, DEVICE, 1);
    kernel.compute(&mut ctx)?;
    Ok(ctx
        .take_outputs()
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| panic!("output {i} of {} was not set", node.op)))
        .collect())
}

/// Runs the node and returns its only (first) output, panicking on error.
pub fn run1(b: NodeBuilder, inputs: Vec<Tensor>) -> Tensor {
    let op = b.0.op.clone();
    b.run(inputs)
        .unwrap_or_else(|e| panic!("{op} failed: {e}"))
        .remove(0)
}

/// Runs the node expecting an error with `code` whose message contains `needle`.
pub fn expect_err(b: NodeBuilder, inputs: Vec<Tensor>, code: Code, needle: &str) -> String {
    let err = b.run(inputs).expect_err("the op should fail");
    assert_eq!(err.code(), code, "unexpected code for: {err}");
    assert!(
        err.message().contains(needle),
        "message `{}` lacks `{needle}`",
        err.message()
    );
    err.message().to_string()
}

pub fn f32s(dims: &[usize], values: &[f32]) -> Tensor {
    Tensor::from_vec(Shape::new(dims.to_vec()), values.to_vec()).unwrap()
}

pub fn f64s(dims: &[usize], values: &[f64]) -> Tensor {
    Tensor::from_vec(Shape::new(dims.to_vec()), values.to_vec()).unwrap()
}

pub fn i32s(dims: &[usize], values: &[i32]) -> Tensor {
    Tensor::from_vec(Shape::new(dims.to_vec()), values.to_vec()).unwrap()
}

pub fn i64s(dims: &[usize], values: &[i64]) -> Tensor {
    Tensor::from_vec(Shape::new(dims.to_vec()), values.to_vec()).unwrap()
}

pub fn bools(dims: &[usize], values: &[bool]) -> Tensor {
    Tensor::from_vec(Shape::new(dims.to_vec()), values.to_vec()).unwrap()
}

/// A 1-D int32 tensor (shapes, axes, indices).
pub fn ivec(values: &[i32]) -> Tensor {
    i32s(&[values.len()], values)
}

/// A float32, float64, int32 or int64 tensor's values as f64.
pub fn as_f64s(t: &Tensor) -> Vec<f64> {
    fn widen<T: tessera::tensor::Element + Copy + Into<f64>>(t: &Tensor) -> Vec<f64> {
        t.values::<T>().unwrap().iter().map(|&v| v.into()).collect()
    }
    match t.dtype() {
        DType::Float => widen::<f32>(t),
        DType::Double => widen::<f64>(t),
        DType::Int32 => widen::<i32>(t),
        DType::Int64 => t
            .values::<i64>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        other => panic!("no numbers in a {other} tensor"),
    }
}

/// Asserts the tensor is float32 with these dims and values within `tol`.
pub fn assert_f32(t: &Tensor, dims: &[usize], expected: &[f64], tol: f64) {
    assert_eq!(t.dtype(), DType::Float, "{t:?}");
    assert_eq!(t.dims(), dims, "{t:?}");
    let got = t.values::<f32>().unwrap();
    assert_eq!(got.len(), expected.len());
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (g as f64 - e).abs() <= tol,
            "element {i}: got {g}, expected {e} ({t:?})"
        );
    }
}

/// Asserts the tensor is float64 with these dims and values within `tol`.
pub fn assert_f64(t: &Tensor, dims: &[usize], expected: &[f64], tol: f64) {
    assert_eq!(t.dtype(), DType::Double, "{t:?}");
    assert_eq!(t.dims(), dims, "{t:?}");
    let got = t.values::<f64>().unwrap();
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (g - e).abs() <= tol,
            "element {i}: got {g}, expected {e} ({t:?})"
        );
    }
}

/// Asserts the tensor has this dtype `T`, these dims and exactly these values.
pub fn assert_exact<T: tessera::tensor::Element>(t: &Tensor, dims: &[usize], expected: &[T]) {
    assert_eq!(t.dtype(), T::DTYPE, "{t:?}");
    assert_eq!(t.dims(), dims, "{t:?}");
    assert_eq!(t.values::<T>().unwrap().as_ref(), expected, "{t:?}");
}

/// Finds the golden directory: `$TESSERA_GOLDEN_DIR`, then `../shared/golden` next to the crate,
/// then `/work/shared/golden`.
pub fn golden_dir() -> std::path::PathBuf {
    let mut candidates = Vec::new();
    if let Ok(dir) = std::env::var("TESSERA_GOLDEN_DIR") {
        candidates.push(std::path::PathBuf::from(dir));
    }
    candidates.push(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/golden"));
    candidates.push(std::path::PathBuf::from("/work/shared/golden"));
    candidates
        .iter()
        .find(|d| d.join("graph.pb").is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!("golden files not found; tried {candidates:?} (set TESSERA_GOLDEN_DIR)")
        })
}

/// Decodes a golden protobuf file.
pub fn golden<M: prost::Message + Default>(name: &str) -> M {
    let path = golden_dir().join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    M::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("decoding {}: {e}", path.display()))
}
