//! The GPU kernels' CUDA C (`src/kernels/cuda/kernels.cu`) run on the host: the system C++
//! compiler builds the file as a shared library with `tests/support/cuda_host.h` standing in
//! for CUDA's built-ins, and each launch calls the kernel once per thread index, the padding
//! threads of the last block included, as the GPU would. Every kernel is checked against
//! tessera's CPU kernel for its op, with the op codes and layouts the GPU kernels pass
//! (`kernels::cuda::ops::*_code`, `kernels::cuda::layout`).
//!
//! This checks the kernels' arithmetic and indexing on every machine; the launches themselves
//! (argument passing, copies, cuBLAS) are checked on a GPU by `tests/gpu.rs`. Without a C++
//! compiler the tests print why and pass, except under CI, where they fail
//! (`support::requirement`).
//!
//! Tolerance: the host runs the kernels' float arithmetic with the same libm as the CPU
//! kernels; sums may fold in another order or precision, so 1e-5 absolute plus relative.

#![cfg(feature = "cuda")]

use std::ffi::{c_void, CString};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use tessera::device::DeviceType;
use tessera::graph::attr::value;
use tessera::graph::window::{ConvAttrs, PoolAttrs};
use tessera::kernels::cpu::training::Update;
use tessera::kernels::cuda::gpu::BLOCK;
use tessera::kernels::cuda::layout::{Broadcast, Reduction, Window};
use tessera::kernels::cuda::ops::{apply_codes, binary_code, reduce_code, unary_code};
use tessera::kernels::OpContext;
use tessera::proto::{AttrValue, NodeDef};
use tessera::runtime::resource::ResourceMgr;
use tessera::tensor::{DType, Tensor};

mod support;

use support::kernel_check::{assert_close, cpu, node, positive, tensor, update_cases, CPU};
use support::requirement;

const TOLERANCE: f32 = 1e-5;

/// The kernels built for the host and loaded.
struct Host {
    library: *mut c_void,
    _dir: tempfile::TempDir,
}

// SAFETY: the library handle is only used to look symbols up, which dlsym allows from any
// thread; the kernels keep their thread index in thread-local storage.
unsafe impl Send for Host {}
unsafe impl Sync for Host {}

type SetThread = unsafe extern "C" fn(u32, u32, u32);
type Binary = unsafe extern "C" fn(i32, *const f32, *const f32, *mut f32, i64, i32, *const i64);
type Unary = unsafe extern "C" fn(i32, *const f32, *mut f32, i64);
type Reduce = unsafe extern "C" fn(i32, *const f32, *mut f32, i64, i64, i32, i32, *const i64);
type Softmax = unsafe extern "C" fn(*const f32, *mut f32, i64, i64, i32);
type Xent = unsafe extern "C" fn(*const f32, *const f32, *mut f32, *mut f32, i64, i64);
type SparseXent = unsafe extern "C" fn(*const f32, *const i64, *mut f32, *mut f32, i64, i64);
type Window1 = unsafe extern "C" fn(*const f32, *mut f32, i64, *const i64);
type Window2 = unsafe extern "C" fn(*const f32, *const f32, *mut f32, i64, *const i64);
#[rustfmt::skip]
type Apply = unsafe extern "C" fn(
    i32, i32, *mut f32, *mut f32, *mut f32, *mut f32, *const f32,
    f32, f32, f32, f32, f32, f32, i64,
);

/// The kernels built and loaded once per test process; `None` (said once) without a compiler.
fn host(test: &str) -> Option<&'static Host> {
    static HOST: OnceLock<Option<Host>> = OnceLock::new();
    let host = HOST.get_or_init(build).as_ref();
    if host.is_none() {
        requirement::missing(
            test,
            "no C++ compiler (`c++`, or $CXX) to build the kernels",
            "scripts/test installs g++ where apt-get is available; or install g++ or clang",
        );
    }
    host
}

fn build() -> Option<Host> {
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let found = Command::new(&compiler).arg("--version").output();
    if !found.is_ok_and(|o| o.status.success()) {
        return None;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let library = dir.path().join("libkernels_host.so");
    let out = Command::new(&compiler)
        .args(["-O1", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Werror"])
        .arg("-include")
        .arg(root.join("tests/support/cuda_host.h"))
        .args(["-x", "c++"])
        .arg(root.join("src/kernels/cuda/kernels.cu"))
        .arg("-o")
        .arg(&library)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kernels.cu does not build for the host (a new CUDA built-in needs a stand-in in \
         tests/support/cuda_host.h):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = CString::new(library.to_str().unwrap()).unwrap();
    // SAFETY: a library just built from kernels.cu and the shim; its initialisers do nothing.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "cannot load {}", library.display());
    Some(Host {
        library: handle,
        _dir: dir,
    })
}

impl Host {
    /// The kernel `name`, as a function of type `F` (which must be its C signature).
    fn symbol<F: Copy>(&self, name: &str) -> F {
        let c_name = CString::new(name).unwrap();
        // SAFETY: a handle from dlopen above, never closed.
        let address = unsafe { libc::dlsym(self.library, c_name.as_ptr()) };
        assert!(!address.is_null(), "no kernel `{name}` in kernels.cu");
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: F is an `extern "C" fn` type of the symbol's signature (the type aliases
        // above mirror kernels.cu).
        unsafe { std::mem::transmute_copy(&address) }
    }

    /// Runs `kernel` once per thread of a launch of `threads` threads in blocks of [`BLOCK`],
    /// the last block's padding threads included, as `GpuInner::launch` launches.
    fn launch(&self, threads: usize, mut kernel: impl FnMut()) {
        let set: SetThread = self.symbol("tessera_emu_set_thread");
        let blocks = threads.div_ceil(BLOCK as usize).max(1);
        for block in 0..blocks as u32 {
            for thread in 0..BLOCK {
                // SAFETY: tessera_emu_set_thread(block, thread, block_dim) of the shim.
                unsafe { set(block, thread, BLOCK) };
                kernel();
            }
        }
    }
}

fn floats(t: &Tensor) -> Vec<f32> {
    t.values::<f32>().unwrap().into_owned()
}

/// `binary_f32` with `op`'s code on `a` and `b`.
fn binary(host: &Host, op: &str, a: &Tensor, b: &Tensor) -> Tensor {
    let layout = Broadcast::new(a.dims(), b.dims()).unwrap();
    let (av, bv) = (floats(a), floats(b));
    let mut out = vec![f32::NAN; layout.len()];
    let (code, n, rank) = (
        binary_code(op).unwrap(),
        layout.len() as i64,
        layout.rank() as i32,
    );
    let kernel: Binary = host.symbol("binary_f32");
    host.launch(layout.len(), || unsafe {
        kernel(
            code,
            av.as_ptr(),
            bv.as_ptr(),
            out.as_mut_ptr(),
            n,
            rank,
            layout.layout.as_ptr(),
        )
    });
    Tensor::from_vec(layout.dims.clone(), out).unwrap()
}

/// `reduce_f32` with `code` over `x` as `reduction` says; the values in output order.
fn reduce(host: &Host, code: i32, x: &Tensor, reduction: &Reduction) -> Vec<f32> {
    let xv = floats(x);
    let mut out = vec![f32::NAN; reduction.outputs];
    let kernel: Reduce = host.symbol("reduce_f32");
    let (o, r) = (reduction.outputs as i64, reduction.reduced_len as i64);
    let (kept, reduced) = (reduction.kept as i32, reduction.reduced as i32);
    host.launch(reduction.outputs, || unsafe {
        kernel(
            code,
            xv.as_ptr(),
            out.as_mut_ptr(),
            o,
            r,
            kept,
            reduced,
            reduction.layout.as_ptr(),
        )
    });
    out
}

#[test]
fn unary_ops_match_the_cpu() {
    let Some(host) = host("unary") else { return };
    let kernel: Unary = host.symbol("unary_f32");
    let ops = [
        "Neg",
        "Square",
        "Abs",
        "Sign",
        "Sqrt",
        "Rsqrt",
        "Exp",
        "Log",
        "Reciprocal",
        "Inv",
        "Sigmoid",
        "Tanh",
        "Relu",
    ];
    // Mixed signs (NaN from Sqrt and Log of negatives, on both sides), zeros, positives.
    let mut mixed = floats(&tensor(&[7, 5], 0.3));
    mixed[3] = 0.0;
    mixed[4] = -0.0;
    let mixed = Tensor::from_vec([7, 5], mixed).unwrap();
    for x in [mixed, positive(&[300], 0.1)] {
        for op in ops {
            let xv = floats(&x);
            let mut out = vec![f32::NAN; xv.len()];
            let (code, n) = (unary_code(op).unwrap(), xv.len() as i64);
            host.launch(xv.len(), || unsafe {
                kernel(code, xv.as_ptr(), out.as_mut_ptr(), n)
            });
            let got = Tensor::from_vec(x.shape().clone(), out).unwrap();
            assert_close(
                op,
                &got,
                &cpu(&node(op, &[]), std::slice::from_ref(&x))[0],
                TOLERANCE,
            );
        }
    }
}

#[test]
fn binary_ops_match_the_cpu_with_numpy_broadcasting() {
    let Some(host) = host("binary") else { return };
    let broadcasting = [
        "Add", "AddV2", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "Pow",
    ];
    // Same shapes, a suffix, a scalar, broadcasts on both sides, across rank.
    let shapes: [(&[usize], &[usize]); 6] = [
        (&[6, 5], &[6, 5]),
        (&[6, 5], &[5]),
        (&[], &[6, 5]),
        (&[6, 1], &[1, 5]),
        (&[2, 1, 3], &[4, 1]),
        (&[300], &[300]),
    ];
    for (sa, sb) in shapes {
        for op in broadcasting {
            // Pow of a positive base, so that most values are numbers.
            let a = if op == "Pow" {
                positive(sa, 0.3)
            } else {
                tensor(sa, 0.3)
            };
            let b = tensor(sb, 1.1);
            let got = binary(host, op, &a, &b);
            let want = &cpu(&node(op, &[]), &[a, b])[0];
            assert_close(&format!("{op} {sa:?} {sb:?}"), &got, want, TOLERANCE);
        }
    }
    // A NaN wins Maximum and Minimum, as on the CPU.
    let with_nan = Tensor::from_vec([3], vec![f32::NAN, 1.0, -1.0]).unwrap();
    for op in ["Maximum", "Minimum"] {
        let (a, b) = (
            with_nan.clone(),
            Tensor::from_vec([3], vec![0.0f32, f32::NAN, 0.0]).unwrap(),
        );
        let got = binary(host, op, &a, &b);
        assert_close(op, &got, &cpu(&node(op, &[]), &[a, b])[0], 0.0);
        assert!(got.values::<f32>().unwrap()[..2].iter().all(|v| v.is_nan()));
    }
    // The activation gradients take (y or gradients, dy or features) of one shape.
    for op in ["ReluGrad", "SigmoidGrad", "TanhGrad"] {
        let (a, b) = (tensor(&[7, 9], 0.4), tensor(&[7, 9], 2.2));
        let got = binary(host, op, &a, &b);
        assert_close(op, &got, &cpu(&node(op, &[]), &[a, b])[0], TOLERANCE);
    }
}

#[test]
fn bias_add_and_its_gradient_match_the_cpu_in_both_layouts() {
    let Some(host) = host("bias") else { return };
    for (format, dims, axis) in [("NHWC", [4, 3, 5], 2), ("NCHW", [4, 3, 5], 1)] {
        let attrs = [("data_format", value::string(format))];
        let (x, bias) = (tensor(&dims, 0.2), tensor(&[dims[axis]], 0.9));
        let layout = Broadcast::bias(&dims, axis);
        let (xv, bv) = (floats(&x), floats(&bias));
        let mut out = vec![f32::NAN; layout.len()];
        let kernel: Binary = host.symbol("binary_f32");
        let (n, rank) = (layout.len() as i64, layout.rank() as i32);
        let add = binary_code("BiasAdd").unwrap();
        host.launch(layout.len(), || unsafe {
            kernel(
                add,
                xv.as_ptr(),
                bv.as_ptr(),
                out.as_mut_ptr(),
                n,
                rank,
                layout.layout.as_ptr(),
            )
        });
        let got = Tensor::from_vec(dims.to_vec(), out).unwrap();
        let want = &cpu(&node("BiasAdd", &attrs), &[x.clone(), bias])[0];
        assert_close(&format!("BiasAdd {format}"), &got, want, TOLERANCE);

        let code = reduce_code("BiasAddGrad").unwrap();
        let sums = reduce(host, code, &x, &Reduction::all_but(&dims, axis));
        let got = Tensor::from_vec([dims[axis]], sums).unwrap();
        let want = &cpu(&node("BiasAddGrad", &attrs), &[x])[0];
        assert_close(&format!("BiasAddGrad {format}"), &got, want, TOLERANCE);
    }
}

#[test]
fn reductions_match_the_cpu_over_any_axes() {
    let Some(host) = host("reductions") else {
        return;
    };
    let x = tensor(&[4, 6, 5], 0.2);
    let axes_sets: [&[i32]; 8] = [&[0], &[1], &[2], &[0, 2], &[0, 1], &[0, 1, 2], &[], &[-1]];
    for op in ["Sum", "Mean", "Max", "Min", "Prod"] {
        for axes in axes_sets {
            let mut reduced = vec![false; 3];
            for &a in axes {
                reduced[a.rem_euclid(3) as usize] = true;
            }
            let got = reduce(
                host,
                reduce_code(op).unwrap(),
                &x,
                &Reduction::new(x.dims(), &reduced),
            );
            let axes_t = Tensor::from_vec([axes.len()], axes.to_vec()).unwrap();
            let attrs = [("Tidx", value::dtype(DType::Int32))];
            let want = &cpu(&node(op, &attrs), &[x.clone(), axes_t])[0];
            let got = Tensor::from_vec(want.shape().clone(), got).unwrap();
            assert_close(&format!("{op} over {axes:?}"), &got, want, TOLERANCE);
        }
        // An empty axis: the reducer's identity (NaN for Mean).
        let empty = Tensor::from_vec([3, 0], Vec::<f32>::new()).unwrap();
        let got = reduce(
            host,
            reduce_code(op).unwrap(),
            &empty,
            &Reduction::new(&[3, 0], &[false, true]),
        );
        let axes_t = Tensor::from_vec([1], vec![1i32]).unwrap();
        let want = &cpu(&node(op, &[]), &[empty, axes_t])[0];
        let got = Tensor::from_vec(want.shape().clone(), got).unwrap();
        assert_close(&format!("{op} of nothing"), &got, want, 0.0);
    }
    let got = reduce(
        host,
        reduce_code("L2Loss").unwrap(),
        &x,
        &Reduction::new(x.dims(), &[true; 3]),
    );
    let want = &cpu(&node("L2Loss", &[]), &[x])[0];
    assert_close(
        "L2Loss",
        &Tensor::from_vec(want.shape().clone(), got).unwrap(),
        want,
        TOLERANCE,
    );
}

#[test]
fn softmax_and_the_cross_entropies_match_the_cpu() {
    let Some(host) = host("softmax") else { return };
    let (rows, cols) = (7, 10);
    let logits = tensor(&[rows, cols], 0.5);
    let lv = floats(&logits);
    let (r, c) = (rows as i64, cols as i64);
    for (op, take_log) in [("Softmax", 0), ("LogSoftmax", 1)] {
        let kernel: Softmax = host.symbol("softmax_f32");
        let mut out = vec![f32::NAN; rows * cols];
        host.launch(rows, || unsafe {
            kernel(lv.as_ptr(), out.as_mut_ptr(), r, c, take_log)
        });
        let got = Tensor::from_vec([rows, cols], out).unwrap();
        assert_close(
            op,
            &got,
            &cpu(&node(op, &[]), std::slice::from_ref(&logits))[0],
            TOLERANCE,
        );
    }
    // Row r's class is (3 r) mod 10; the dense labels are its one-hot rows, then soft labels.
    let classes: Vec<i64> = (0..rows as i64).map(|r| (3 * r) % 10).collect();
    let mut one_hot = vec![0f32; rows * cols];
    for (row, &class) in classes.iter().enumerate() {
        one_hot[row * cols + class as usize] = 1.0;
    }
    let soft: Vec<f32> = floats(&positive(&[rows, cols], 0.7));
    let check = |what: &str, got: (Vec<f32>, Vec<f32>), want: &[Tensor]| {
        assert_close(
            &format!("{what} loss"),
            &Tensor::from_vec([rows], got.0).unwrap(),
            &want[0],
            TOLERANCE,
        );
        let back = Tensor::from_vec([rows, cols], got.1).unwrap();
        assert_close(&format!("{what} backprop"), &back, &want[1], TOLERANCE);
    };
    for labels in [one_hot, soft] {
        let kernel: Xent = host.symbol("softmax_xent_f32");
        let (mut loss, mut back) = (vec![f32::NAN; rows], vec![f32::NAN; rows * cols]);
        host.launch(rows, || unsafe {
            kernel(
                lv.as_ptr(),
                labels.as_ptr(),
                loss.as_mut_ptr(),
                back.as_mut_ptr(),
                r,
                c,
            )
        });
        let labels = Tensor::from_vec([rows, cols], labels).unwrap();
        let want = cpu(
            &node("SoftmaxCrossEntropyWithLogits", &[]),
            &[logits.clone(), labels],
        );
        check("SoftmaxCrossEntropyWithLogits", (loss, back), &want);
    }
    let kernel: SparseXent = host.symbol("sparse_xent_f32");
    let (mut loss, mut back) = (vec![f32::NAN; rows], vec![f32::NAN; rows * cols]);
    host.launch(rows, || unsafe {
        kernel(
            lv.as_ptr(),
            classes.as_ptr(),
            loss.as_mut_ptr(),
            back.as_mut_ptr(),
            r,
            c,
        )
    });
    let labels = Tensor::from_vec([rows], classes.clone()).unwrap();
    let want = cpu(
        &node("SparseSoftmaxCrossEntropyWithLogits", &[]),
        &[logits, labels],
    );
    check("SparseSoftmaxCrossEntropyWithLogits", (loss, back), &want);
}

#[test]
fn every_optimizer_update_matches_the_cpu() {
    let Some(host) = host("optimizers") else {
        return;
    };
    let kernel: Apply = host.symbol("apply_f32");
    let dims = [8, 3];
    for case in update_cases(&dims) {
        let node = case.node();
        let want = case.run(DeviceType::Cpu, CPU);
        // The codes and hyper-parameters the GPU kernel passes.
        let update = Update::new(&node).unwrap();
        // The rules apply_f32 lacks run the CPU computation on the GPU's node.
        let Some((rule, flags)) = apply_codes(&update) else {
            continue;
        };
        let resources = ResourceMgr::new();
        let ctx = OpContext::new(&node, case.inputs(CPU), &resources, CPU, 1);
        let mut p = update.params::<f32>(&ctx).unwrap();
        p.resize(6, 0.0);
        let grad = floats(case.grad());
        let mut values: Vec<Vec<f32>> = case.variables.iter().map(floats).collect();
        // The slots a rule does not have: one float each, which must stay untouched.
        values.resize(4, vec![-7.0]);
        let n = grad.len() as i64;
        let [var, s0, s1, s2] = &mut values[..] else {
            unreachable!()
        };
        host.launch(grad.len(), || unsafe {
            kernel(
                rule,
                flags,
                var.as_mut_ptr(),
                s0.as_mut_ptr(),
                s1.as_mut_ptr(),
                s2.as_mut_ptr(),
                grad.as_ptr(),
                p[0],
                p[1],
                p[2],
                p[3],
                p[4],
                p[5],
                n,
            )
        });
        let count = case.variables.len();
        for (i, (got, want)) in values[..count].iter().zip(&want).enumerate() {
            let got = Tensor::from_vec(dims.to_vec(), got.clone()).unwrap();
            assert_close(
                &format!("{} variable {i}", node.name),
                &got,
                want,
                TOLERANCE,
            );
        }
        for spare in &values[count..] {
            assert_eq!(
                spare,
                &vec![-7.0],
                "{}: a slot the rule does not have",
                node.name
            );
        }
    }
}

/// The window kernel `name` on `inputs` (one or two, in its parameter order) with `window`'s
/// params, one thread per element of an output of `dims`.
fn windowed(
    host: &Host,
    name: &str,
    inputs: &[&Tensor],
    dims: &[usize],
    window: &Window,
) -> Tensor {
    let values: Vec<Vec<f32>> = inputs.iter().map(|t| floats(t)).collect();
    let len = dims.iter().product();
    let mut out = vec![f32::NAN; len];
    let (n, p) = (len as i64, window.params.as_ptr());
    match &values[..] {
        [a] => {
            let kernel: Window1 = host.symbol(name);
            host.launch(len, || unsafe {
                kernel(a.as_ptr(), out.as_mut_ptr(), n, p)
            });
        }
        [a, b] => {
            let kernel: Window2 = host.symbol(name);
            host.launch(len, || unsafe {
                kernel(a.as_ptr(), b.as_ptr(), out.as_mut_ptr(), n, p)
            });
        }
        _ => unreachable!("the window kernels read one or two tensors"),
    }
    Tensor::from_vec(dims.to_vec(), out).unwrap()
}

/// One sliding-window geometry, in NHWC terms whatever its format.
struct WindowCase {
    format: &'static str,
    /// The input's (batch, height, width, channels).
    input: [usize; 4],
    /// A convolution's HWIO filter; a pool's window is its height and width.
    window: [usize; 4],
    strides: [i64; 2],
    /// A convolution's; pools take none.
    dilations: [i64; 2],
    padding: &'static str,
    /// (top, bottom, left, right) for EXPLICIT.
    explicit: [i64; 4],
}

impl WindowCase {
    /// NHWC values laid out in the case's format.
    fn laid_out<T: Copy>(&self, nhwc: [T; 4]) -> Vec<T> {
        let [n, h, w, c] = nhwc;
        match self.format {
            "NCHW" => vec![n, c, h, w],
            _ => vec![n, h, w, c],
        }
    }

    /// The node of `op` with the case's attrs (`ksize` for a pool, `dilations` for a
    /// convolution).
    fn node(&self, op: &str) -> NodeDef {
        let [sh, sw] = self.strides;
        let [dh, dw] = self.dilations;
        let mut attrs: Vec<(&str, AttrValue)> = vec![
            ("data_format", value::string(self.format)),
            ("strides", value::int_list(self.laid_out([1, sh, sw, 1]))),
            ("padding", value::string(self.padding)),
        ];
        if op.starts_with("Conv2D") {
            attrs.push(("dilations", value::int_list(self.laid_out([1, dh, dw, 1]))));
        } else {
            let [kh, kw] = [self.window[0], self.window[1]].map(|k| k as i64);
            attrs.push(("ksize", value::int_list(self.laid_out([1, kh, kw, 1]))));
        }
        if self.padding == "EXPLICIT" {
            let [t, b, l, r] = self.explicit;
            let pairs = self.laid_out([[0, 0], [t, b], [l, r], [0, 0]]);
            attrs.push(("explicit_paddings", value::int_list(pairs.concat())));
        }
        let mut node = node(op, &attrs);
        node.name = format!("{op} {self}");
        node
    }

    /// The input's dims in the case's format.
    fn input_dims(&self) -> Vec<usize> {
        self.laid_out(self.input)
    }
}

impl std::fmt::Display for WindowCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} input {:?} window {:?} strides {:?} dilations {:?} {} {:?}",
            self.format,
            self.input,
            self.window,
            self.strides,
            self.dilations,
            self.padding,
            self.explicit
        )
    }
}

/// A shape tensor (`input_sizes`, `filter_sizes`, `orig_input_shape`) of `dims`.
fn sizes(dims: &[usize]) -> Tensor {
    Tensor::from_vec([4], dims.iter().map(|&d| d as i32).collect::<Vec<_>>()).unwrap()
}

/// The geometries the window kernels are checked on: both formats, strides 1 and 2, SAME
/// (with odd sizes that pad one more pixel after than before), VALID and EXPLICIT, batches
/// and channels above 1, non-square windows; the convolutions also with dilation 2 and with
/// grouped filters (a filter depth that divides the input's channels).
fn window_cases() -> Vec<WindowCase> {
    let case = |format, input, window, strides, dilations, padding, explicit| WindowCase {
        format,
        input,
        window,
        strides,
        dilations,
        padding,
        explicit,
    };
    let none = [0; 4];
    vec![
        // SAME over 2-wide windows at stride 1: 0 before, 1 after.
        case(
            "NHWC",
            [2, 5, 7, 3],
            [3, 2, 3, 4],
            [1, 1],
            [1, 1],
            "SAME",
            none,
        ),
        // 7 rows and 6 columns at stride 2 by 2×3: 1 pixel padded, after.
        case(
            "NCHW",
            [2, 7, 6, 2],
            [2, 3, 2, 3],
            [2, 2],
            [1, 1],
            "SAME",
            none,
        ),
        case(
            "NHWC",
            [3, 9, 8, 2],
            [3, 2, 2, 5],
            [2, 2],
            [2, 2],
            "VALID",
            none,
        ),
        // Two groups of 3 channels, dilation 2 across the rows only.
        case(
            "NCHW",
            [2, 7, 8, 6],
            [2, 3, 3, 4],
            [1, 1],
            [2, 1],
            "VALID",
            none,
        ),
        case(
            "NHWC",
            [2, 6, 9, 4],
            [3, 3, 2, 6],
            [2, 1],
            [2, 2],
            "SAME",
            none,
        ),
        case(
            "NHWC",
            [1, 5, 6, 2],
            [2, 2, 2, 3],
            [1, 2],
            [1, 1],
            "EXPLICIT",
            [1, 2, 0, 1],
        ),
        // Padding wider than the window: the first rows of windows lie wholly in it.
        case(
            "NCHW",
            [2, 4, 5, 3],
            [2, 3, 3, 2],
            [1, 2],
            [1, 2],
            "EXPLICIT",
            [3, 1, 2, 2],
        ),
    ]
}

#[test]
fn convolutions_and_their_gradients_match_the_cpu() {
    let Some(host) = host("convolutions") else {
        return;
    };
    for (k, case) in window_cases().iter().enumerate() {
        let seed = k as f32 * 0.3;
        let x = tensor(&case.input_dims(), seed);
        let f = tensor(&case.window, seed + 1.1);
        let forward = case.node("Conv2D");
        let attrs = ConvAttrs::of(&forward).unwrap();
        // The window as the GPU kernels compute it from the input and filter dims.
        let window = Window::conv(&attrs, x.dims(), f.dims()).unwrap();
        let out_dims = window.output_dims();
        let got = windowed(host, "conv2d_f32", &[&x, &f], &out_dims, &window);
        let want = &cpu(&forward, &[x.clone(), f.clone()])[0];
        assert_close(&forward.name, &got, want, TOLERANCE);

        let dy = tensor(&out_dims, seed + 2.3);
        let node = case.node("Conv2DBackpropInput");
        let got = windowed(host, "conv2d_input_grad_f32", &[&f, &dy], x.dims(), &window);
        let want = &cpu(&node, &[sizes(x.dims()), f.clone(), dy.clone()])[0];
        assert_close(&node.name, &got, want, TOLERANCE);

        let node = case.node("Conv2DBackpropFilter");
        let got = windowed(
            host,
            "conv2d_filter_grad_f32",
            &[&x, &dy],
            f.dims(),
            &window,
        );
        let want = &cpu(&node, &[x.clone(), sizes(f.dims()), dy])[0];
        assert_close(&node.name, &got, want, TOLERANCE);
    }
}

/// [`tensor`]'s values rounded to whole numbers, so that windows hold equal maxima, with a NaN
/// at element 5 (a window's maximum only where it comes first, as on the CPU).
fn with_ties(dims: &[usize], seed: f32) -> Tensor {
    let mut values: Vec<f32> = floats(&tensor(dims, seed))
        .iter()
        .map(|v| v.round())
        .collect();
    values[5] = f32::NAN;
    Tensor::from_vec(dims.to_vec(), values).unwrap()
}

#[test]
fn pooling_and_its_gradients_match_the_cpu_ties_included() {
    let Some(host) = host("pooling") else {
        return;
    };
    for (k, case) in window_cases().iter().enumerate() {
        let seed = k as f32 * 0.7;
        let dims = case.input_dims();
        let plain = tensor(&dims, seed);
        let ties = with_ties(&dims, seed);
        let max = case.node("MaxPool");
        let window = Window::pool(&PoolAttrs::of(&max).unwrap(), &dims).unwrap();
        let out_dims = window.output_dims();
        let dy = tensor(&out_dims, seed + 1.9);
        for x in [&plain, &ties] {
            let got = windowed(host, "max_pool_f32", &[x], &out_dims, &window);
            let y = &cpu(&max, std::slice::from_ref(x))[0];
            assert_close(&max.name, &got, y, 0.0);

            // The gradient goes where the CPU sends it: exactly, ties and all.
            let node = case.node("MaxPoolGrad");
            let got = windowed(host, "max_pool_grad_f32", &[x, &dy], &dims, &window);
            let want = &cpu(&node, &[x.clone(), y.clone(), dy.clone()])[0];
            assert_close(&node.name, &got, want, 0.0);
        }
        // Average pooling takes SAME and VALID only.
        if case.padding == "EXPLICIT" {
            continue;
        }
        let avg = case.node("AvgPool");
        assert_eq!(
            Window::pool(&PoolAttrs::of(&avg).unwrap(), &dims).unwrap(),
            window
        );
        let got = windowed(host, "avg_pool_f32", &[&plain], &out_dims, &window);
        let want = &cpu(&avg, std::slice::from_ref(&plain))[0];
        assert_close(&avg.name, &got, want, TOLERANCE);

        let node = case.node("AvgPoolGrad");
        let got = windowed(host, "avg_pool_grad_f32", &[&dy], &dims, &window);
        let want = &cpu(&node, &[sizes(&dims), dy.clone()])[0];
        assert_close(&node.name, &got, want, TOLERANCE);
    }
}
