//! The string ops of everyday programs (`core/ops/string_ops.cc`, `logging_ops.cc`,
//! `io_ops.cc`): splitting (`StringSplit`, `StringSplitV2`, sparse outputs), `Substr`,
//! `RegexReplace` and `StaticRegexReplace`, `StringLength`, `StringLower`, `StringUpper`,
//! `StringStrip`, `AsString`, `StringFormat`, the printing ops `PrintV2` and the TF1 `Print`,
//! and whole-file `ReadFile` / `WriteFile`. `StringJoin` and `StaticRegexFullMatch` are
//! registered with the checkpoint ops (`io.rs`).
//!
//! Attrs, defaults and shape functions are TensorFlow 2.21's. Strings carry no gradient;
//! `Print` passes its output's gradient to its first input, as TensorFlow's `_PrintGrad`.

use crate::error::Result;
use crate::graph::builder::{Graph, Output};
use crate::graph::gradients::GradCtx;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::PartialShape;

pub(super) fn register(r: &mut Registry) {
    OpDef::build("StringSplit")
        .input("input: string")
        .input("delimiter: string")
        .output("indices: int64")
        .output("values: string")
        .output("shape: int64")
        .attr("skip_empty: bool = true")
        .shape(split_shape)
        .no_grad()
        .register(r);
    OpDef::build("StringSplitV2")
        .input("input: string")
        .input("sep: string")
        .output("indices: int64")
        .output("values: string")
        .output("shape: int64")
        .attr("maxsplit: int = -1")
        .shape(split_shape)
        .no_grad()
        .register(r);
    OpDef::build("Substr")
        .input("input: string")
        .input("pos: T")
        .input("len: T")
        .output("output: string")
        .attr("T: {int32, int64}")
        .attr("unit: {'BYTE', 'UTF8_CHAR'} = 'BYTE'")
        .shape(substr_shape)
        .no_grad()
        .register(r);
    OpDef::build("RegexReplace")
        .input("input: string")
        .input("pattern: string")
        .input("rewrite: string")
        .output("output: string")
        .attr("replace_global: bool = true")
        .shape(regex_replace_shape)
        .no_grad()
        .register(r);
    OpDef::build("StaticRegexReplace")
        .input("input: string")
        .output("output: string")
        .attr("pattern: string")
        .attr("rewrite: string")
        .attr("replace_global: bool = true")
        .shape(sf::unchanged)
        .no_grad()
        .register(r);
    OpDef::build("StringLength")
        .input("input: string")
        .output("output: int32")
        .attr("unit: {'BYTE', 'UTF8_CHAR'} = 'BYTE'")
        .shape(sf::unchanged)
        .no_grad()
        .register(r);
    for op in ["StringLower", "StringUpper"] {
        OpDef::build(op)
            .input("input: string")
            .output("output: string")
            .attr("encoding: string = ''")
            .shape(sf::unchanged)
            .no_grad()
            .register(r);
    }
    OpDef::build("StringStrip")
        .input("input: string")
        .output("output: string")
        .shape(sf::unchanged)
        .no_grad()
        .register(r);
    OpDef::build("AsString")
        .input("input: T")
        .output("output: string")
        .attr("T: {realnumbertype, complex64, bool, variant, string}")
        .attr("precision: int = -1")
        .attr("scientific: bool = false")
        .attr("shortest: bool = false")
        .attr("width: int = -1")
        .attr("fill: string = ''")
        .shape(sf::unchanged)
        .no_grad()
        .register(r);
    OpDef::build("StringFormat")
        .input("inputs: T")
        .output("output: string")
        .attr("T: list(type) >= 0")
        .attr("template: string = '%s'")
        .attr("placeholder: string = '%s'")
        .attr("summarize: int = 3")
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("PrintV2")
        .input("input: string")
        .attr("output_stream: string = 'stderr'")
        .attr("end: string = '\n'")
        .stateful()
        .shape(print_v2_shape)
        .no_grad()
        .register(r);
    OpDef::build("Print")
        .input("input: T")
        .input("data: U")
        .output("output: T")
        .attr("T: type")
        .attr("U: list(type) >= 0")
        .attr("message: string = ''")
        .attr("first_n: int = -1")
        .attr("summarize: int = 3")
        .stateful()
        .shape(sf::unchanged)
        .grad(print_grad)
        .register(r);
    OpDef::build("ReadFile")
        .input("filename: string")
        .output("contents: string")
        .shape(read_file_shape)
        .no_grad()
        .register(r);
    OpDef::build("WriteFile")
        .input("filename: string")
        .input("contents: string")
        .stateful()
        .shape(write_file_shape)
        .no_grad()
        .register(r);
}

/// `Print`: the gradient to the printed input, none to the data.
fn print_grad(_: &mut Graph, c: &GradCtx) -> Result<Vec<Option<Output>>> {
    let mut out = vec![c.grads.first().cloned().flatten()];
    out.resize(c.inputs.len(), None);
    Ok(out)
}

/// Fails unless input `i` is a scalar (or of unknown rank), in TensorFlow's words.
fn scalar_input(ctx: &ShapeCtx<'_>, i: usize, what: &str) -> Result<()> {
    match ctx.input(i).rank() {
        Some(r) if r != 0 => {
            Err(ctx.error(format!("Shape must be rank 0 but is rank {r} for {what}")))
        }
        _ => Ok(()),
    }
}

/// The splits: a vector and a scalar separator in; `[?, 2]` indices, `[?]` values and a
/// `[2]` shape out.
fn split_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    if let Some(r) = ctx.input(0).rank().filter(|&r| r != 1) {
        return Err(ctx.error(format!("Shape must be rank 1 but is rank {r} for input")));
    }
    scalar_input(ctx, 1, "the separator")?;
    Ok(vec![
        PartialShape::new(vec![None, Some(2)]),
        PartialShape::new(vec![None]),
        PartialShape::new(vec![Some(2)]),
    ])
}

/// `pos` and `len` agree; the output is `input` broadcast against `pos`.
fn substr_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    sf::merge(ctx, &ctx.input(1), &ctx.input(2))?;
    Ok(vec![sf::broadcast(ctx, &ctx.input(0), &ctx.input(1))?])
}

fn regex_replace_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    scalar_input(ctx, 1, "pattern")?;
    scalar_input(ctx, 2, "rewrite")?;
    Ok(vec![ctx.input(0)])
}

fn print_v2_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    scalar_input(ctx, 0, "input")?;
    Ok(Vec::new())
}

fn read_file_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    scalar_input(ctx, 0, "filename")?;
    Ok(vec![PartialShape::new(vec![])])
}

fn write_file_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    scalar_input(ctx, 0, "filename")?;
    scalar_input(ctx, 1, "contents")?;
    Ok(Vec::new())
}
