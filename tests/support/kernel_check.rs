//! Comparing a kernel with tessera's CPU kernel for the same op: node building, seeded inputs,
//! a NaN-aware closeness check, and the optimizer updates on fresh variables. Used by the GPU
//! tests (`tests/gpu.rs`) and the host-emulated GPU kernels (`tests/gpu_emulated.rs`).

use std::sync::Arc;

use tessera::device::DeviceType;
use tessera::graph::attr::value;
use tessera::kernels::{kernel_for, OpContext};
use tessera::proto::{AttrValue, NodeDef};
use tessera::runtime::resource::{ResourceMgr, Var};
use tessera::tensor::{DType, PartialShape, ResourceHandle, Tensor};

pub const GPU: &str = "/job:localhost/replica:0/task:0/device:GPU:0";
pub const CPU: &str = "/job:localhost/replica:0/task:0/device:CPU:0";

/// A float32 node of `op` named `check/<op>` with `attrs`.
pub fn node(op: &str, attrs: &[(&str, AttrValue)]) -> NodeDef {
    let mut node = NodeDef {
        name: format!("check/{op}"),
        op: op.into(),
        ..Default::default()
    };
    node.attr.insert("T".into(), value::dtype(DType::Float));
    for (k, v) in attrs {
        node.attr.insert(k.to_string(), v.clone());
    }
    node
}

/// Runs `node`'s kernel for `device_type` on `device` with `inputs`; returns every output.
pub fn run_on(
    node: &NodeDef,
    device_type: DeviceType,
    device: &str,
    inputs: &[Tensor],
    resources: &ResourceMgr,
) -> Vec<Tensor> {
    let factory = kernel_for(&node.op, device_type)
        .unwrap_or_else(|| panic!("no {device_type:?} kernel for {}", node.op));
    let kernel = factory(node).unwrap();
    let mut ctx = OpContext::new(node, inputs.to_vec(), resources, device, 1);
    kernel
        .compute(&mut ctx)
        .unwrap_or_else(|e| panic!("{} on {device_type:?}: {e}", node.op));
    ctx.take_outputs().into_iter().map(Option::unwrap).collect()
}

/// Runs `node`'s CPU kernel; returns every output.
pub fn cpu(node: &NodeDef, inputs: &[Tensor]) -> Vec<Tensor> {
    run_on(node, DeviceType::Cpu, CPU, inputs, &ResourceMgr::new())
}

/// Values with both signs and varied magnitudes: v[i] = sin(0.37 i + seed) · (1 + i mod 3).
pub fn tensor(dims: &[usize], seed: f32) -> Tensor {
    let n: usize = dims.iter().product();
    let values = (0..n)
        .map(|i| (0.37 * i as f32 + seed).sin() * (1.0 + (i % 3) as f32))
        .collect();
    Tensor::from_vec(dims.to_vec(), values).unwrap()
}

/// [`tensor`]'s values made positive: |v| + 0.5.
pub fn positive(dims: &[usize], seed: f32) -> Tensor {
    let t = tensor(dims, seed);
    let values = t
        .values::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.abs() + 0.5)
        .collect();
    Tensor::from_vec(dims.to_vec(), values).unwrap()
}

/// Asserts `got` has `want`'s shape and each value within `tolerance` absolute plus
/// `tolerance` relative; NaN matches NaN and an infinity the same infinity.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tolerance: f32) {
    assert_eq!(got.shape(), want.shape(), "{what}: shapes");
    let (g, w) = (got.values::<f32>().unwrap(), want.values::<f32>().unwrap());
    for (i, (&g, &w)) in g.iter().zip(w.iter()).enumerate() {
        let same = (g.is_nan() && w.is_nan()) || g == w;
        let near = (g - w).abs() <= tolerance + tolerance * w.abs();
        assert!(same || near, "{what}[{i}]: got {g}, CPU {w}");
    }
}

/// One optimizer update to check: the op, its attrs, the starting values of the variable and
/// its slots, and the op's other inputs (hyper-parameters and gradient) in input order after
/// the resource handles.
pub struct UpdateCase {
    pub op: &'static str,
    /// Boolean attrs (`use_nesterov`, `update_slots`).
    pub attrs: Vec<(&'static str, bool)>,
    pub variables: Vec<Tensor>,
    pub rest: Vec<Tensor>,
}

impl UpdateCase {
    /// The node, named after the op and its attrs.
    pub fn node(&self) -> NodeDef {
        let attrs: Vec<(&str, AttrValue)> = self
            .attrs
            .iter()
            .map(|&(k, v)| (k, value::bool(v)))
            .collect();
        let mut node = node(self.op, &attrs);
        for (k, v) in &self.attrs {
            node.name.push_str(&format!(",{k}={v}"));
        }
        node
    }

    /// The gradient: the last input, but for ResourceApplyMomentum, whose momentum follows it,
    /// and the Ftrl rules, whose hyper-parameters follow it.
    pub fn grad(&self) -> &Tensor {
        if self.op.starts_with("ResourceApplyFtrl") {
            return &self.rest[0];
        }
        let from_end = if self.op == "ResourceApplyMomentum" {
            2
        } else {
            1
        };
        &self.rest[self.rest.len() - from_end]
    }

    /// Every input: the handles `v0..` of the variables (on `device`), then the rest; the
    /// gradient of ResourceApplyMomentum comes before its momentum, as in the op.
    pub fn inputs(&self, device: &str) -> Vec<Tensor> {
        let mut inputs: Vec<Tensor> = (0..self.variables.len())
            .map(|i| {
                Tensor::resource(ResourceHandle {
                    device: device.into(),
                    container: "localhost".into(),
                    name: format!("v{i}"),
                    type_name: "Var".into(),
                })
            })
            .collect();
        inputs.extend(self.rest.iter().cloned());
        inputs
    }

    /// Runs the update with `device_type`'s kernel on fresh variables; returns their values
    /// after it (the variable, then the slots).
    pub fn run(&self, device_type: DeviceType, device: &str) -> Vec<Tensor> {
        let resources = ResourceMgr::new();
        let vars: Vec<Arc<Var>> = self
            .variables
            .iter()
            .enumerate()
            .map(|(i, start)| {
                let shape: Vec<Option<usize>> = start.dims().iter().map(|&d| Some(d)).collect();
                let shape = PartialShape::new(shape);
                let var: Arc<Var> = resources
                    .lookup_or_create("localhost", &format!("v{i}"), || {
                        Ok(Var::new(DType::Float, shape))
                    })
                    .unwrap();
                *var.value.write().unwrap() = Some(start.clone());
                var
            })
            .collect();
        run_on(
            &self.node(),
            device_type,
            device,
            &self.inputs(device),
            &resources,
        );
        vars.iter()
            .map(|v| v.value.read().unwrap().clone().unwrap())
            .collect()
    }
}

/// Every optimizer update tessera has, with and without its flags, on `dims` variables. Slot
/// values are positive where the rule takes their square root.
pub fn update_cases(dims: &[usize]) -> Vec<UpdateCase> {
    let s = Tensor::scalar::<f32>;
    let grad = || tensor(dims, 1.7);
    let nesterov = |on: bool| vec![("use_nesterov", on)];
    let var = || tensor(dims, 0.6);
    let mut cases = vec![UpdateCase {
        op: "ResourceApplyGradientDescent",
        attrs: vec![],
        variables: vec![var()],
        rest: vec![s(0.25), grad()],
    }];
    for update_slots in [true, false] {
        cases.push(UpdateCase {
            op: "ResourceApplyAdagrad",
            attrs: vec![("update_slots", update_slots)],
            variables: vec![var(), positive(dims, 0.2)],
            rest: vec![s(0.1), grad()],
        });
    }
    cases.push(UpdateCase {
        op: "ResourceApplyAdagradV2",
        attrs: vec![],
        variables: vec![var(), positive(dims, 0.2)],
        rest: vec![s(0.1), s(1e-3), grad()],
    });
    for on in [false, true] {
        cases.push(UpdateCase {
            op: "ResourceApplyMomentum",
            attrs: nesterov(on),
            variables: vec![var(), tensor(dims, 0.3)],
            rest: vec![s(0.1), grad(), s(0.9)],
        });
        cases.push(UpdateCase {
            op: "ResourceApplyAdam",
            attrs: nesterov(on),
            variables: vec![var(), tensor(dims, 0.3), positive(dims, 0.9)],
            rest: vec![s(0.9), s(0.999), s(0.01), s(0.9), s(0.999), s(1e-7), grad()],
        });
    }
    cases.push(UpdateCase {
        op: "ResourceApplyRMSProp",
        attrs: vec![],
        variables: vec![var(), positive(dims, 0.4), tensor(dims, 0.5)],
        rest: vec![s(0.01), s(0.9), s(0.5), s(1e-6), grad()],
    });
    // Centered: mg small beside ms, so that ms - mg² stays positive.
    let mg = tensor(dims, 0.8);
    let mg = Tensor::from_vec(
        dims.to_vec(),
        mg.values::<f32>()
            .unwrap()
            .iter()
            .map(|v| v * 0.1)
            .collect(),
    )
    .unwrap();
    cases.push(UpdateCase {
        op: "ResourceApplyCenteredRMSProp",
        attrs: vec![],
        variables: vec![var(), mg, positive(dims, 0.4), tensor(dims, 0.5)],
        rest: vec![s(0.01), s(0.9), s(0.5), s(1e-6), grad()],
    });
    cases.push(UpdateCase {
        op: "ResourceApplyProximalGradientDescent",
        attrs: vec![],
        variables: vec![var()],
        rest: vec![s(0.25), s(0.05), s(0.1), grad()],
    });
    cases.push(UpdateCase {
        op: "ResourceApplyAdadelta",
        attrs: vec![],
        variables: vec![var(), positive(dims, 0.2), positive(dims, 0.3)],
        rest: vec![s(1.0), s(0.95), s(1e-6), grad()],
    });
    cases.push(UpdateCase {
        op: "ResourceApplyProximalAdagrad",
        attrs: vec![],
        variables: vec![var(), positive(dims, 0.2)],
        rest: vec![s(0.1), s(0.01), s(0.02), grad()],
    });
    for multiply_linear_by_lr in [false, true] {
        let attrs = vec![("multiply_linear_by_lr", multiply_linear_by_lr)];
        let variables = || vec![var(), positive(dims, 0.2), tensor(dims, 0.3)];
        cases.push(UpdateCase {
            op: "ResourceApplyFtrl",
            attrs: attrs.clone(),
            variables: variables(),
            rest: vec![grad(), s(0.5), s(0.1), s(0.2), s(-0.5)],
        });
        cases.push(UpdateCase {
            op: "ResourceApplyFtrlV2",
            attrs,
            variables: variables(),
            rest: vec![grad(), s(0.5), s(0.1), s(0.2), s(0.1), s(-0.7)],
        });
    }
    cases.push(UpdateCase {
        op: "ResourceApplyAdaMax",
        attrs: vec![],
        variables: vec![var(), tensor(dims, 0.3), positive(dims, 0.9)],
        rest: vec![s(0.9), s(0.01), s(0.9), s(0.999), s(1e-7), grad()],
    });
    for (op, base) in [
        ("ResourceApplyAddSign", 1.0),
        ("ResourceApplyPowerSign", std::f32::consts::LN_2),
    ] {
        cases.push(UpdateCase {
            op,
            attrs: vec![],
            variables: vec![var(), tensor(dims, 0.3)],
            rest: vec![s(0.1), s(base), s(0.5), s(0.9), grad()],
        });
    }
    cases
}
