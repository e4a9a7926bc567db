//! The op registry: for every op type tessera knows, its inputs and outputs, attrs with types
//! and defaults, statefulness, shape function and gradient function.
//!
//! Ops are declared the way TensorFlow's `REGISTER_OP` declares them (`"a: T"`,
//! `"values: N * T"`, `"transpose_a: bool = false"`), so a definition can be checked line by
//! line against `tensorflow/core/ops/*.cc`. The per-family declarations live in
//! [`super::ops`]; this file holds the types, the spec parser and the lookup. Which device types
//! can run an op is not recorded here: placement asks the kernels (`exec::placement`).

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::error::{Result, Status};
use crate::graph::attr;
use crate::graph::gradients::GradFn;
use crate::graph::shape_fn::ShapeFn;
use crate::proto::attr_value::{ListValue, Value};
use crate::proto::{AttrValue, NodeDef};
use crate::tensor::{DType, PartialShape};

/// Where an input's or output's dtype comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgType {
    /// Always this dtype (`resource`, `bool`, ...).
    Fixed(DType),
    /// The value of a `type` attr (`T`, `dtype`, `out_type`, ...).
    Attr(String),
    /// The values of a `list(type)` attr (`IdentityN`'s `T`, `SaveV2`'s `dtypes`).
    List(String),
}

/// One input or output of an op.
#[derive(Clone, Debug)]
pub struct ArgDef {
    /// The argument's name in TensorFlow's op definition.
    pub name: String,
    /// Where its dtype comes from.
    pub ty: ArgType,
    /// For `N * T` arguments, the `int` attr counting the tensors.
    pub number_attr: Option<String>,
    /// A reference argument (`Ref(T)`): the tensor aliases a variable's storage instead of
    /// holding a value (TensorFlow 1's `VariableV2`, `Assign`, `Apply*`, `RefSwitch`).
    pub is_ref: bool,
}

/// One attr of an op.
#[derive(Clone, Debug)]
pub struct AttrDef {
    /// The attr's name.
    pub name: String,
    /// TensorFlow's attr type: `type`, `int`, `bool`, `float`, `string`, `shape`, `tensor`,
    /// `func`, `list(type)`, `list(int)`, `list(string)`, `list(shape)`.
    pub ty: String,
    /// The default filled in when a `NodeDef` leaves the attr out.
    pub default: Option<AttrValue>,
    /// For `type` attrs, the dtypes allowed (empty: any).
    pub allowed: Vec<DType>,
    /// For `int` attrs, the smallest value allowed.
    pub minimum: Option<i64>,
}

/// What the gradient machinery does with an op.
#[derive(Clone, Copy)]
pub enum Gradient {
    /// No gradient flows through (comparisons, `Shape`, integer outputs, `StopGradient`).
    NotDifferentiable,
    /// Nobody wrote a gradient: reaching the op from a loss is an error.
    Missing,
    /// The gradient function.
    Fn(GradFn),
}

/// An op's definition.
#[derive(Clone)]
pub struct OpDef {
    /// The op type (`MatMul`).
    pub name: &'static str,
    /// Inputs, in order.
    pub inputs: Vec<ArgDef>,
    /// Outputs, in order.
    pub outputs: Vec<ArgDef>,
    /// Attrs (attrs starting with `_` are never declared and always allowed).
    pub attrs: Vec<AttrDef>,
    /// Whether the op has side effects or state, so it must not be folded or deduplicated.
    pub stateful: bool,
    /// Infers output shapes from input shapes; `None` gives unknown shapes.
    pub shape_fn: Option<ShapeFn>,
    /// The gradient.
    pub gradient: Gradient,
}

impl OpDef {
    /// Starts a definition; chain `input`, `output`, `attr`, ... and finish with `register`.
    pub fn build(name: &'static str) -> OpBuilder {
        OpBuilder {
            def: OpDef {
                name,
                inputs: Vec::new(),
                outputs: Vec::new(),
                attrs: Vec::new(),
                stateful: false,
                shape_fn: None,
                gradient: Gradient::Missing,
            },
            inputs: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// Returns the declaration of attr `name`.
    pub fn attr(&self, name: &str) -> Option<&AttrDef> {
        self.attrs.iter().find(|a| a.name == name)
    }

    /// Fills in the defaults of attrs the node leaves out, then checks that every declared
    /// attr is present with the right kind and that no undeclared attr is set.
    pub fn fill_and_check_attrs(&self, node: &mut NodeDef) -> Result<()> {
        for a in &self.attrs {
            if !node.attr.contains_key(&a.name) {
                match &a.default {
                    Some(d) => {
                        node.attr.insert(a.name.clone(), d.clone());
                    }
                    None => {
                        return Err(Status::invalid_argument(format!(
                            "node `{}` (op {}) is missing attr `{}` ({}); set it",
                            node.name, node.op, a.name, a.ty
                        )))
                    }
                }
            }
            let value = node.attr.get(&a.name).and_then(|v| v.value.as_ref());
            check_attr_kind(node, a, value)?;
        }
        for key in node.attr.keys() {
            if !key.starts_with('_') && self.attr(key).is_none() {
                return Err(Status::invalid_argument(format!(
                    "node `{}` has attr `{key}`, which op {} does not declare (declared: {})",
                    node.name,
                    node.op,
                    self.attrs
                        .iter()
                        .map(|a| a.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Returns the dtypes of the node's inputs (attrs must be filled in).
    pub fn input_types(&self, node: &NodeDef) -> Result<Vec<DType>> {
        arg_types(node, &self.inputs)
    }

    /// For each of the node's inputs, whether it is a reference input (`Ref(T)`): the kernel
    /// gets the variable itself, not its value.
    pub fn ref_inputs(&self, node: &NodeDef) -> Result<Vec<bool>> {
        arg_flags(node, &self.inputs)
    }

    /// For each of the node's outputs, whether it is a reference output (`Ref(T)`).
    pub fn ref_outputs(&self, node: &NodeDef) -> Result<Vec<bool>> {
        arg_flags(node, &self.outputs)
    }

    /// Returns the dtypes of the node's outputs (attrs must be filled in).
    pub fn output_types(&self, node: &NodeDef) -> Result<Vec<DType>> {
        arg_types(node, &self.outputs)
    }
}

fn check_attr_kind(node: &NodeDef, a: &AttrDef, value: Option<&Value>) -> Result<()> {
    let ok = match (a.ty.as_str(), value) {
        ("type", Some(Value::Type(t))) => {
            if !a.allowed.is_empty() {
                let dtype = DType::from_i32(*t)
                    .map_err(|e| e.context(format!("attr `{}` of node `{}`", a.name, node.name)))?;
                if !a.allowed.contains(&dtype) {
                    return Err(Status::invalid_argument(format!(
                        "node `{}` (op {}): attr `{}` is {dtype}, allowed: {}",
                        node.name,
                        node.op,
                        a.name,
                        a.allowed
                            .iter()
                            .map(|d| d.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
            true
        }
        ("int", Some(Value::I(i))) => {
            if let Some(min) = a.minimum {
                if *i < min {
                    return Err(Status::invalid_argument(format!(
                        "node `{}` (op {}): attr `{}` is {i}, must be at least {min}",
                        node.name, node.op, a.name
                    )));
                }
            }
            true
        }
        ("bool", Some(Value::B(_)))
        | ("float", Some(Value::F(_)))
        | ("string", Some(Value::S(_)))
        | ("shape", Some(Value::Shape(_)))
        | ("tensor", Some(Value::Tensor(_)))
        | ("func", Some(Value::Func(_))) => true,
        (t, Some(Value::List(_))) if t.starts_with("list(") => true,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "attr `{}` of node `{}` (op {}) must be a {}",
            a.name, node.name, node.op, a.ty
        )))
    }
}

/// How many tensors argument `arg` of `node`'s op stands for (1, or its `N` or list length).
pub fn arg_count(node: &NodeDef, arg: &ArgDef) -> Result<usize> {
    Ok(arg_types(node, std::slice::from_ref(arg))?.len())
}

fn arg_flags(node: &NodeDef, args: &[ArgDef]) -> Result<Vec<bool>> {
    let mut out = Vec::new();
    for arg in args {
        out.extend(std::iter::repeat_n(arg.is_ref, arg_count(node, arg)?));
    }
    Ok(out)
}

fn arg_types(node: &NodeDef, args: &[ArgDef]) -> Result<Vec<DType>> {
    let mut out = Vec::new();
    for arg in args {
        match &arg.ty {
            ArgType::List(name) => out.extend(attr::dtype_list(node, name)?),
            ty => {
                let dtype = match ty {
                    ArgType::Fixed(d) => *d,
                    ArgType::Attr(name) => attr::dtype(node, name)?,
                    ArgType::List(_) => unreachable!("handled above"),
                };
                let n = match &arg.number_attr {
                    Some(n) => {
                        let n = attr::int(node, n)?;
                        usize::try_from(n).map_err(|_| {
                            Status::invalid_argument(format!(
                                "node `{}`: attr `{}` is negative ({n})",
                                node.name,
                                arg.number_attr.as_deref().unwrap_or_default()
                            ))
                        })?
                    }
                    None => 1,
                };
                out.extend(std::iter::repeat_n(dtype, n));
            }
        }
    }
    Ok(out)
}

/// Chains the parts of an [`OpDef`]; argument types resolve once all attrs are known.
pub struct OpBuilder {
    def: OpDef,
    inputs: Vec<&'static str>,
    outputs: Vec<&'static str>,
}

impl OpBuilder {
    /// Adds an input, written as in TensorFlow: `"a: T"`, `"values: N * T"`, `"x: float"`.
    pub fn input(mut self, spec: &'static str) -> Self {
        self.inputs.push(spec);
        self
    }

    /// Adds an output, written like an input.
    pub fn output(mut self, spec: &'static str) -> Self {
        self.outputs.push(spec);
        self
    }

    /// Adds an attr: `"T: type"`, `"T: {float, double}"`, `"N: int >= 1"`,
    /// `"keep_dims: bool = false"`, `"Tidx: {int32, int64} = DT_INT32"`.
    pub fn attr(mut self, spec: &'static str) -> Self {
        self.def.attrs.push(parse_attr(self.def.name, spec));
        self
    }

    /// Marks the op stateful.
    pub fn stateful(mut self) -> Self {
        self.def.stateful = true;
        self
    }

    /// Sets the shape function.
    pub fn shape(mut self, f: ShapeFn) -> Self {
        self.def.shape_fn = Some(f);
        self
    }

    /// Sets the gradient function.
    pub fn grad(mut self, f: GradFn) -> Self {
        self.def.gradient = Gradient::Fn(f);
        self
    }

    /// Marks the op not differentiable.
    pub fn no_grad(mut self) -> Self {
        self.def.gradient = Gradient::NotDifferentiable;
        self
    }

    /// Finishes the definition and adds it to `registry`.
    pub fn register(mut self, registry: &mut Registry) {
        let inputs = std::mem::take(&mut self.inputs);
        let outputs = std::mem::take(&mut self.outputs);
        self.def.inputs = inputs.iter().map(|s| self.parse_arg(s)).collect();
        self.def.outputs = outputs.iter().map(|s| self.parse_arg(s)).collect();
        registry.ops.insert(self.def.name, self.def);
    }

    fn parse_arg(&self, spec: &str) -> ArgDef {
        let (name, ty) = spec
            .split_once(':')
            .unwrap_or_else(|| panic!("op {}: bad arg `{spec}`", self.def.name));
        let ty = ty.trim();
        let (number_attr, ty) = match ty.split_once('*') {
            Some((n, t)) => (Some(n.trim().to_string()), t.trim()),
            None => (None, ty),
        };
        let (is_ref, ty) = match ty.strip_prefix("Ref(").and_then(|t| t.strip_suffix(')')) {
            Some(inner) => (true, inner.trim()),
            None => (false, ty),
        };
        let ty = match dtype_named(ty) {
            Some(d) => ArgType::Fixed(d),
            None => match self.def.attr(ty) {
                Some(a) if a.ty == "list(type)" => ArgType::List(ty.to_string()),
                Some(a) if a.ty == "type" => ArgType::Attr(ty.to_string()),
                _ => panic!("op {}: arg `{spec}` names no type attr", self.def.name),
            },
        };
        ArgDef {
            name: name.trim().to_string(),
            ty,
            number_attr,
            is_ref,
        }
    }
}

/// Maps TensorFlow's type names (`float`, `DT_INT64`) onto tessera's dtypes.
pub fn dtype_named(name: &str) -> Option<DType> {
    Some(
        match name
            .trim()
            .trim_start_matches("DT_")
            .to_ascii_lowercase()
            .as_str()
        {
            "float" | "float32" => DType::Float,
            "double" | "float64" => DType::Double,
            "int32" => DType::Int32,
            "int64" => DType::Int64,
            "bool" => DType::Bool,
            "string" => DType::String,
            "resource" => DType::Resource,
            "variant" => DType::Variant,
            "uint8" => DType::UInt8,
            "int8" => DType::Int8,
            "int16" => DType::Int16,
            "uint16" => DType::UInt16,
            "uint32" => DType::UInt32,
            "uint64" => DType::UInt64,
            "half" | "float16" => DType::Half,
            "bfloat16" => DType::BFloat16,
            "complex64" => DType::Complex64,
            _ => return None,
        },
    )
}

fn parse_attr(op: &str, spec: &str) -> AttrDef {
    let bad = || -> ! { panic!("op {op}: bad attr spec `{spec}`") };
    let (name, rest) = spec.split_once(':').unwrap_or_else(|| bad());
    // The default follows the first `=` that is not part of `>=`.
    let eq = rest
        .char_indices()
        .find(|&(i, c)| c == '=' && !rest[..i].ends_with('>'))
        .map(|(i, _)| i);
    let (ty, default) = match eq {
        Some(i) => (rest[..i].trim(), Some(rest[i + 1..].trim())),
        None => (rest.trim(), None),
    };
    let mut def = AttrDef {
        name: name.trim().to_string(),
        ty: ty.to_string(),
        default: None,
        allowed: Vec::new(),
        minimum: None,
    };
    if let Some(set) = ty.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        if set.contains('\'') {
            def.ty = "string".into();
        } else {
            def.ty = "type".into();
            for t in set.split(',') {
                match t.trim() {
                    // TensorFlow's sets, less the dtypes tessera has no element type for.
                    t @ ("numbertype" | "realnumbertype") => {
                        def.allowed.extend([
                            DType::Float,
                            DType::Double,
                            DType::Int32,
                            DType::Int64,
                            DType::UInt8,
                            DType::Int8,
                            DType::Int16,
                            DType::UInt16,
                            DType::UInt32,
                            DType::UInt64,
                            DType::Half,
                            DType::BFloat16,
                        ]);
                        if t == "numbertype" {
                            def.allowed.push(DType::Complex64);
                        }
                    }
                    "floatingpoint" => def.allowed.extend([
                        DType::Float,
                        DType::Double,
                        DType::Half,
                        DType::BFloat16,
                    ]),
                    other => def.allowed.extend(dtype_named(other)),
                }
            }
        }
    } else if let Some((t, min)) = ty.split_once(">=") {
        def.ty = t.trim().to_string();
        if def.ty == "int" {
            def.minimum = Some(min.trim().parse().unwrap_or_else(|_| bad()));
        }
    }
    def.default = default.map(|d| {
        let value = match def.ty.as_str() {
            "bool" => Value::B(d == "true"),
            "int" => Value::I(d.parse().unwrap_or_else(|_| bad())),
            "float" => Value::F(d.parse().unwrap_or_else(|_| bad())),
            "string" => Value::S(bytes::Bytes::copy_from_slice(
                d.trim_matches('\'').as_bytes(),
            )),
            "type" => Value::Type(dtype_named(d).unwrap_or_else(|| bad()).to_proto() as i32),
            // TensorFlow writes an unknown shape `{ unknown_rank: true }`.
            "shape" if d == "unknown" || d.replace(' ', "") == "{unknown_rank:true}" => {
                Value::Shape(PartialShape::unknown().to_proto())
            }
            t if t.starts_with("list(") && d == "[]" => Value::List(ListValue::default()),
            // A list of ints with values (`dilations: list(int) = [1, 1, 1, 1]`).
            "list(int)" => {
                let items = d.strip_prefix('[').and_then(|d| d.strip_suffix(']'));
                let i = items
                    .unwrap_or_else(|| bad())
                    .split(',')
                    .map(|v| v.trim().parse().unwrap_or_else(|_| bad()))
                    .collect();
                Value::List(ListValue {
                    i,
                    ..Default::default()
                })
            }
            _ => bad(),
        };
        AttrValue { value: Some(value) }
    });
    def
}

/// Every op definition, by op type.
#[derive(Default)]
pub struct Registry {
    ops: HashMap<&'static str, OpDef>,
}

impl Registry {
    /// Returns the definition of `op`, if registered.
    pub fn get(&self, op: &str) -> Option<&OpDef> {
        self.ops.get(op)
    }

    /// Returns every registered op type, sorted.
    pub fn op_names(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.ops.keys().copied().collect();
        names.sort_unstable();
        names
    }
}

/// Returns the process-wide registry, built on first use.
pub fn global() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut r = Registry::default();
        super::ops::register_all(&mut r);
        r
    })
}

/// Returns the definition of `node`'s op, or NOT_FOUND naming the node.
pub fn lookup(node: &NodeDef) -> Result<&'static OpDef> {
    global().get(&node.op).ok_or_else(|| {
        Status::not_found(format!(
            "node `{}` uses op `{}`, which tessera does not register",
            node.name, node.op
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::attr::value;

    #[test]
    fn matmul_declares_tf_attrs_and_defaults() {
        let def = global().get("MatMul").unwrap();
        assert_eq!(def.inputs.len(), 2);
        assert_eq!(def.inputs[0].ty, ArgType::Attr("T".into()));
        let mut node = NodeDef {
            name: "mm".into(),
            op: "MatMul".into(),
            ..Default::default()
        };
        node.attr.insert("T".into(), value::dtype(DType::Float));
        def.fill_and_check_attrs(&mut node).unwrap();
        assert!(!attr::bool_or(&node, "transpose_a", true).unwrap());
        assert!(!attr::bool_or(&node, "transpose_b", true).unwrap());
        assert!(!def.stateful);
    }

    #[test]
    fn missing_attr_without_default_names_the_node() {
        let def = global().get("MatMul").unwrap();
        let mut node = NodeDef {
            name: "mm".into(),
            op: "MatMul".into(),
            ..Default::default()
        };
        let err = def.fill_and_check_attrs(&mut node).unwrap_err();
        assert!(
            err.message().contains("`mm`") && err.message().contains("`T`"),
            "{err}"
        );
    }

    #[test]
    fn disallowed_type_and_unknown_attr_are_rejected() {
        let def = global().get("MatMul").unwrap();
        let mut node = NodeDef {
            name: "mm".into(),
            op: "MatMul".into(),
            ..Default::default()
        };
        node.attr.insert("T".into(), value::dtype(DType::Bool));
        assert!(def.fill_and_check_attrs(&mut node).is_err());
        node.attr.insert("T".into(), value::dtype(DType::Float));
        node.attr.insert("bogus".into(), value::int(1));
        assert!(def.fill_and_check_attrs(&mut node).is_err());
        node.attr.remove("bogus");
        node.attr
            .insert("_class".into(), value::string_list(["loc:@x"]));
        def.fill_and_check_attrs(&mut node).unwrap();
    }

    #[test]
    fn number_and_list_attrs_count_arguments() {
        let addn = global().get("AddN").unwrap();
        let mut node = NodeDef {
            name: "s".into(),
            op: "AddN".into(),
            ..Default::default()
        };
        node.attr.insert("T".into(), value::dtype(DType::Double));
        node.attr.insert("N".into(), value::int(3));
        addn.fill_and_check_attrs(&mut node).unwrap();
        assert_eq!(addn.input_types(&node).unwrap(), vec![DType::Double; 3]);
        let idn = global().get("IdentityN").unwrap();
        let mut node = NodeDef {
            name: "i".into(),
            op: "IdentityN".into(),
            ..Default::default()
        };
        node.attr
            .insert("T".into(), value::dtype_list(&[DType::Float, DType::Int64]));
        idn.fill_and_check_attrs(&mut node).unwrap();
        assert_eq!(
            idn.output_types(&node).unwrap(),
            vec![DType::Float, DType::Int64]
        );
    }

    #[test]
    fn stateful_ops_and_gradients_are_declared() {
        for op in [
            "VarHandleOp",
            "RandomUniform",
            "AssignVariableOp",
            "_Send",
            "_Recv",
            "SaveV2",
        ] {
            assert!(global().get(op).unwrap().stateful, "{op}");
        }
        assert!(matches!(
            global().get("Shape").unwrap().gradient,
            Gradient::NotDifferentiable
        ));
        assert!(matches!(
            global().get("MatMul").unwrap().gradient,
            Gradient::Fn(_)
        ));
        assert!(matches!(
            global().get("SaveV2").unwrap().gradient,
            Gradient::Missing | Gradient::NotDifferentiable
        ));
    }
}
