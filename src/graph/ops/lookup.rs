//! Lookup-table ops (`core/ops/lookup_ops.cc`), the resource-handle (V2) forms that
//! `tf.lookup` and the vocabulary feature columns emit: `HashTableV2` and
//! `MutableHashTableV2` create a table in the device's resources, `InitializeTableV2`,
//! `InitializeTableFromTextFileV2` and `LookupTableImportV2` fill it, `LookupTableFindV2`,
//! `LookupTableInsertV2`, `LookupTableExportV2` and `LookupTableSizeV2` use it.
//!
//! Attrs and defaults are TensorFlow 2.21's. Every op is stateful; none has a gradient
//! (TensorFlow marks the finds, sizes and initializers not differentiable and registers none
//! for the others).

use crate::error::Result;
use crate::graph::attr::value;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::{DType, PartialShape};

pub(super) fn register(r: &mut Registry) {
    for op in ["HashTableV2", "MutableHashTableV2"] {
        OpDef::build(op)
            .output("table_handle: resource")
            .attr("container: string = ''")
            .attr("shared_name: string = ''")
            .attr("use_node_name_sharing: bool = false")
            .attr("key_dtype: type")
            .attr("value_dtype: type")
            .stateful()
            .shape(sf::scalar)
            .no_grad()
            .register(r);
    }
    OpDef::build("LookupTableFindV2")
        .input("table_handle: resource")
        .input("keys: Tin")
        .input("default_value: Tout")
        .output("values: Tout")
        .attr("Tin: type")
        .attr("Tout: type")
        .stateful()
        .shape(find_shape)
        .no_grad()
        .register(r);
    for op in ["LookupTableInsertV2", "LookupTableImportV2"] {
        OpDef::build(op)
            .input("table_handle: resource")
            .input("keys: Tin")
            .input("values: Tout")
            .attr("Tin: type")
            .attr("Tout: type")
            .stateful()
            .shape(sf::no_outputs)
            .no_grad()
            .register(r);
    }
    OpDef::build("LookupTableExportV2")
        .input("table_handle: resource")
        .output("keys: Tkeys")
        .output("values: Tvalues")
        .attr("Tkeys: type")
        .attr("Tvalues: type")
        .stateful()
        .shape(export_shape)
        .no_grad()
        .register(r);
    OpDef::build("LookupTableSizeV2")
        .input("table_handle: resource")
        .output("size: int64")
        .stateful()
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("InitializeTableV2")
        .input("table_handle: resource")
        .input("keys: Tkey")
        .input("values: Tval")
        .attr("Tkey: type")
        .attr("Tval: type")
        .stateful()
        .shape(initialize_shape)
        .no_grad()
        .register(r);
    OpDef::build("InitializeTableFromTextFileV2")
        .input("table_handle: resource")
        .input("filename: string")
        .attr("key_index: int >= -2")
        .attr("value_index: int >= -2")
        .attr("vocab_size: int >= -1 = -1")
        .attr("delimiter: string = '\t'")
        .attr("offset: int = 0")
        .stateful()
        .shape(text_file_shape)
        .no_grad()
        .register(r);
}

/// A find's values have the keys' shape (the tables hold scalar values).
fn find_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    ctx.with_rank(0, 0)?;
    Ok(vec![ctx.input(1)])
}

/// An export's keys and values are vectors of the table's size.
fn export_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    ctx.with_rank(0, 0)?;
    let vector = PartialShape::new(vec![None]);
    Ok(vec![vector.clone(), vector])
}

/// `InitializeTableV2` takes a scalar handle and keys and values of one shape.
fn initialize_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    ctx.with_rank(0, 0)?;
    sf::merge(ctx, &ctx.input(1), &ctx.input(2))?;
    Ok(vec![])
}

/// `InitializeTableFromTextFileV2` takes a scalar handle and a scalar file name.
fn text_file_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    ctx.with_rank(0, 0)?;
    ctx.with_rank(1, 0)?;
    Ok(vec![])
}

/// Constructors for the lookup-table ops.
impl Graph {
    /// `HashTableV2` (or `MutableHashTableV2` when `mutable`) of `key_dtype` keys and
    /// `value_dtype` values, shared across sessions on its device as `shared_name` (its
    /// node's name when empty).
    pub fn hash_table(
        &mut self,
        key_dtype: DType,
        value_dtype: DType,
        shared_name: &str,
        mutable: bool,
    ) -> Result<Output> {
        let op = if mutable {
            "MutableHashTableV2"
        } else {
            "HashTableV2"
        };
        self.add1(
            NodeSpec::new(op)
                .attr("key_dtype", value::dtype(key_dtype))
                .attr("value_dtype", value::dtype(value_dtype))
                .attr("shared_name", value::string(shared_name)),
        )
    }

    /// `InitializeTableV2(table, keys, values)`; returns the node name.
    pub fn initialize_table(
        &mut self,
        table: &Output,
        keys: &Output,
        values: &Output,
    ) -> Result<String> {
        self.add_op(
            NodeSpec::new("InitializeTableV2")
                .input(table)
                .input(keys)
                .input(values),
        )
    }

    /// `InitializeTableFromTextFileV2(table, filename)`: keys and values from the file's
    /// lines (`-2` the whole line, `-1` its number, else a column split by `delimiter`);
    /// returns the node name.
    pub fn initialize_table_from_text_file(
        &mut self,
        table: &Output,
        filename: &Output,
        key_index: i64,
        value_index: i64,
        delimiter: &str,
    ) -> Result<String> {
        self.add_op(
            NodeSpec::new("InitializeTableFromTextFileV2")
                .input(table)
                .input(filename)
                .attr("key_index", value::int(key_index))
                .attr("value_index", value::int(value_index))
                .attr("delimiter", value::string(delimiter)),
        )
    }

    /// `LookupTableFindV2(table, keys, default_value)`.
    pub fn lookup_table_find(
        &mut self,
        table: &Output,
        keys: &Output,
        default_value: &Output,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new("LookupTableFindV2")
                .input(table)
                .input(keys)
                .input(default_value),
        )
    }

    /// `LookupTableInsertV2(table, keys, values)`; returns the node name.
    pub fn lookup_table_insert(
        &mut self,
        table: &Output,
        keys: &Output,
        values: &Output,
    ) -> Result<String> {
        self.add_op(
            NodeSpec::new("LookupTableInsertV2")
                .input(table)
                .input(keys)
                .input(values),
        )
    }

    /// `LookupTableSizeV2(table)`.
    pub fn lookup_table_size(&mut self, table: &Output) -> Result<Output> {
        self.add1(NodeSpec::new("LookupTableSizeV2").input(table))
    }
}
