//! Datasets made from other datasets, element by element: `Map` and `ParallelMap` (a graph
//! function per element; the parallel form maps a run of elements over the device's intra-op
//! threads and keeps their order), `Filter`, `FlatMap`, `Interleave` and its parallel forms
//! (TensorFlow's cycle order), `Take`, `Skip`, `Repeat`, `Zip`, `Concatenate`, `Cache` (in
//! memory), `Shard`, `Unbatch`, and the wrappers TensorFlow puts around a pipeline for its own
//! optimizer and thread pools (`OptimizeDataset`, `ModelDataset`, `OptionsDataset`,
//! `MaxIntraOpParallelismDataset`, `PrivateThreadPoolDataset`), which pass their input on.
//! `DatasetCardinality` answers what a dataset knows of its length.

use std::sync::{Arc, Mutex};

use super::{
    dataset_input, dataset_of, dataset_op, int64_input, Dataset, DatasetNode, Element, Iter,
    Origin, Signature, INFINITE, UNKNOWN,
};
use crate::error::Result;
use crate::kernels::cpu::rows;
use crate::kernels::functional::Function;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::tensor::{DType, Tensor};

/// TensorFlow's `AUTOTUNE`, accepted wherever a parallelism or buffer size is.
pub(super) const AUTOTUNE: i64 = -1;

pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "MapDataset" => |n| dataset_op(n, |ctx, d| map(ctx, d, None)),
        "ParallelMapDataset" | "ParallelMapDatasetV2" => {
            |n| dataset_op(n, |ctx, d| map(ctx, d, Some(ctx.num_inputs() - 1)))
        }
        "FilterDataset" => |n| dataset_op(n, filter),
        "FlatMapDataset" => |n| dataset_op(n, |ctx, d| interleave(ctx, d, true)),
        "InterleaveDataset"
        | "ParallelInterleaveDatasetV2"
        | "ParallelInterleaveDatasetV3"
        | "ParallelInterleaveDatasetV4" => |n| dataset_op(n, |ctx, d| interleave(ctx, d, false)),
        "TakeDataset" => |n| dataset_op(n, |ctx, d| counted(ctx, d, Counted::Take)),
        "SkipDataset" => |n| dataset_op(n, |ctx, d| counted(ctx, d, Counted::Skip)),
        "RepeatDataset" => |n| dataset_op(n, |ctx, d| counted(ctx, d, Counted::Repeat)),
        "ZipDataset" => |n| dataset_op(n, zip),
        "ConcatenateDataset" => |n| dataset_op(n, concatenate),
        "CacheDataset" | "CacheDatasetV2" => |n| dataset_op(n, cache),
        "ShardDataset" => |n| dataset_op(n, shard),
        "UnbatchDataset" => |n| dataset_op(n, unbatch),
        "OptimizeDataset"
        | "OptimizeDatasetV2"
        | "ModelDataset"
        | "OptionsDataset"
        | "MaxIntraOpParallelismDataset"
        | "PrivateThreadPoolDataset" => |n| dataset_op(n, |ctx, _| dataset_input(ctx, 0)),
        "DatasetCardinality" | "ExperimentalDatasetCardinality" => {
            |_| Ok(Arc::new(Cardinality) as Arc<dyn OpKernel>)
        }
        _ => return None,
    };
    Some(factory)
}

/// A graph function applied to elements, with the tensors it captured (`other_arguments`).
struct Mapper {
    function: Function,
    captured: Vec<Tensor>,
}

impl Mapper {
    /// The function `node`'s attr `attr` names, with the captured inputs from `first` on
    /// (up to `end`).
    fn new(ctx: &OpContext<'_>, attr: &str, first: usize, end: usize) -> Result<Self> {
        let function = ctx.functions()?.instantiate(ctx.node(), attr)?;
        Ok(Self {
            function,
            captured: ctx.inputs()[first..end].to_vec(),
        })
    }

    fn call(&self, ctx: &OpContext<'_>, element: Element) -> Result<Element> {
        let mut args = element;
        args.extend(self.captured.iter().cloned());
        self.function.call(ctx, &args)
    }
}

/// `MapDataset`: `f(element)` for each element; `ParallelMapDataset` maps up to
/// `parallelism` elements at once and yields them in order.
struct Map {
    origin: Origin,
    input: Arc<dyn Dataset>,
    mapper: Mapper,
    signature: Option<Signature>,
    parallelism: usize,
}

/// `parallel_input`: where a parallel map's `num_parallel_calls` is, `None` for `MapDataset`.
fn map(
    ctx: &OpContext<'_>,
    d: &DatasetNode,
    parallel_input: Option<usize>,
) -> Result<Arc<dyn Dataset>> {
    let input = dataset_input(ctx, 0)?;
    let end = parallel_input.unwrap_or(ctx.num_inputs());
    let parallelism = match parallel_input {
        None => 1,
        Some(i) => match int64_input(ctx, i, "num_parallel_calls")? {
            AUTOTUNE => ctx.intra().threads().max(1),
            n if n > 0 => n as usize,
            n => {
                return Err(ctx.invalid(format!(
                    "num_parallel_calls must be positive or AUTOTUNE (-1), got {n}"
                )))
            }
        },
    };
    Ok(Arc::new(Map {
        origin: d.origin.clone(),
        input,
        mapper: Mapper::new(ctx, "f", 1, end)?,
        signature: d.signature.clone(),
        parallelism,
    }))
}

impl Dataset for Map {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, ctx: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        Ok(Box::new(MapIter {
            input: self.input.clone().iterate(ctx)?,
            ready: std::collections::VecDeque::new(),
            failed: None,
            dataset: self,
        }))
    }

    fn cardinality(&self) -> i64 {
        self.input.cardinality()
    }
}

struct MapIter {
    dataset: Arc<Map>,
    input: Box<dyn Iter>,
    /// Mapped elements not yet asked for (a parallel map maps a run at once).
    ready: std::collections::VecDeque<Element>,
    /// The error of the run's first element that failed, given once the elements mapped
    /// before it have been.
    failed: Option<crate::error::Status>,
}

impl Map {
    fn map_one(&self, ctx: &OpContext<'_>, element: Element) -> Result<Element> {
        let d = self;
        let out = d.mapper.call(ctx, element).map_err(|e| d.origin.named(e))?;
        if let Some(mismatch) = d.signature.as_ref().and_then(|s| s.mismatch(&out)) {
            return Err(d.origin.invalid(format!(
                "function `{}` returned {mismatch}",
                d.mapper.function.name
            )));
        }
        Ok(out)
    }
}

impl Iter for MapIter {
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        if let Some(out) = self.ready.pop_front() {
            return Ok(Some(out));
        }
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if self.dataset.parallelism <= 1 {
            return match self.input.next(ctx)? {
                Some(element) => self.dataset.map_one(ctx, element).map(Some),
                None => Ok(None),
            };
        }
        let mut run = Vec::with_capacity(self.dataset.parallelism);
        while run.len() < self.dataset.parallelism {
            match self.input.next(ctx)? {
                Some(element) => run.push(element),
                None => break,
            }
        }
        if run.is_empty() {
            return Ok(None);
        }
        let d = &*self.dataset;
        let mapped = ctx.intra().map(run, |element| d.map_one(ctx, element));
        for out in mapped {
            // An error is met where its element would have been yielded: the ones mapped
            // before it are yielded first, the ones after it never.
            match out {
                Ok(out) => self.ready.push_back(out),
                Err(e) => {
                    self.failed = Some(e);
                    break;
                }
            }
        }
        match self.ready.pop_front() {
            Some(out) => Ok(Some(out)),
            None => Err(self
                .failed
                .take()
                .expect("a run that mapped nothing failed")),
        }
    }
}

/// `FilterDataset`: the elements for which `predicate` is true.
struct Filter {
    origin: Origin,
    input: Arc<dyn Dataset>,
    predicate: Mapper,
}

fn filter(ctx: &OpContext<'_>, d: &DatasetNode) -> Result<Arc<dyn Dataset>> {
    Ok(Arc::new(Filter {
        origin: d.origin.clone(),
        input: dataset_input(ctx, 0)?,
        predicate: Mapper::new(ctx, "predicate", 1, ctx.num_inputs())?,
    }))
}

impl Dataset for Filter {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, ctx: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        Ok(Box::new(FilterIter {
            input: self.input.clone().iterate(ctx)?,
            dataset: self,
        }))
    }
}

struct FilterIter {
    dataset: Arc<Filter>,
    input: Box<dyn Iter>,
}

impl Iter for FilterIter {
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        let d = &self.dataset;
        while let Some(element) = self.input.next(ctx)? {
            let out = d
                .predicate
                .call(ctx, element.clone())
                .map_err(|e| d.origin.named(e))?;
            let keep = match out.as_slice() {
                [t] if t.dtype() == DType::Bool && t.num_elements() == 1 => t.values::<bool>()?[0],
                _ => {
                    return Err(d
                        .origin
                        .invalid("the filter predicate must return a scalar bool tensor"))
                }
            };
            if keep {
                return Ok(Some(element));
            }
        }
        Ok(None)
    }
}

/// `InterleaveDataset` and its parallel forms: `f` turns each input element into a dataset,
/// and `cycle_length` of those are walked in turn, `block_length` elements from each, in
/// TensorFlow's order; `FlatMapDataset` is the same with a cycle of one.
struct Interleave {
    origin: Origin,
    input: Arc<dyn Dataset>,
    f: Mapper,
    cycle_length: usize,
    block_length: usize,
}

fn interleave(ctx: &OpContext<'_>, d: &DatasetNode, flat: bool) -> Result<Arc<dyn Dataset>> {
    let input = dataset_input(ctx, 0)?;
    // Inputs: the dataset, the captured arguments, then (interleave) cycle_length,
    // block_length and the parallel forms' extra scalars.
    let scalars = match d.origin.op.as_str() {
        "FlatMapDataset" => 0,
        "InterleaveDataset" => 2,
        "ParallelInterleaveDatasetV2" | "ParallelInterleaveDatasetV3" => 3,
        _ => 5,
    };
    let end = ctx.num_inputs() - scalars;
    let (cycle_length, block_length) = if flat {
        (1, 1)
    } else {
        let cycle = match int64_input(ctx, end, "cycle_length")? {
            AUTOTUNE => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n if n > 0 => n as usize,
            n => {
                return Err(ctx.invalid(format!(
                    "cycle_length must be greater than zero or AUTOTUNE (-1), got {n}"
                )))
            }
        };
        let block = match int64_input(ctx, end + 1, "block_length")? {
            n if n > 0 => n as usize,
            n => {
                return Err(ctx.invalid(format!("block_length must be greater than zero, got {n}")))
            }
        };
        (cycle, block)
    };
    Ok(Arc::new(Interleave {
        origin: d.origin.clone(),
        input,
        f: Mapper::new(ctx, "f", 1, end)?,
        cycle_length,
        block_length,
    }))
}

impl Dataset for Interleave {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, ctx: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        Ok(Box::new(InterleaveIter {
            input: self.input.clone().iterate(ctx)?,
            current: (0..self.cycle_length).map(|_| None).collect(),
            cycle_index: 0,
            block_index: 0,
            end_of_input: false,
            num_open: 0,
            dataset: self,
        }))
    }
}

struct InterleaveIter {
    dataset: Arc<Interleave>,
    input: Box<dyn Iter>,
    current: Vec<Option<Box<dyn Iter>>>,
    cycle_index: usize,
    block_index: usize,
    end_of_input: bool,
    num_open: usize,
}

impl InterleaveIter {
    fn advance_to_next_in_cycle(&mut self) {
        self.block_index = 0;
        self.cycle_index = (self.cycle_index + 1) % self.dataset.cycle_length;
    }
}

impl Iter for InterleaveIter {
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        let d = self.dataset.clone();
        while !self.end_of_input || self.num_open > 0 {
            if let Some(current) = self.current[self.cycle_index].as_mut() {
                if let Some(element) = current.next(ctx)? {
                    self.block_index += 1;
                    if self.block_index == d.block_length {
                        self.advance_to_next_in_cycle();
                    }
                    return Ok(Some(element));
                }
                self.current[self.cycle_index] = None;
                self.num_open -= 1;
                self.advance_to_next_in_cycle();
            } else if !self.end_of_input {
                match self.input.next(ctx)? {
                    Some(element) => {
                        let out = d.f.call(ctx, element).map_err(|e| d.origin.named(e))?;
                        let dataset = match out.as_slice() {
                            [t] => dataset_of(ctx, t).map_err(|e| d.origin.named(e))?,
                            _ => {
                                return Err(d.origin.invalid(format!(
                                    "function `{}` must return one dataset, it returned {} \
                                     tensors",
                                    d.f.function.name,
                                    out.len()
                                )))
                            }
                        };
                        self.current[self.cycle_index] = Some(dataset.iterate(ctx)?);
                        self.num_open += 1;
                    }
                    None => self.end_of_input = true,
                }
            } else {
                self.advance_to_next_in_cycle();
            }
        }
        Ok(None)
    }
}

/// The datasets with a count: `Take`, `Skip` and `Repeat` (-1: every element, all of them,
/// forever).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Counted {
    Take,
    Skip,
    Repeat,
}

struct CountedDataset {
    origin: Origin,
    input: Arc<dyn Dataset>,
    kind: Counted,
    count: i64,
}

fn counted(ctx: &OpContext<'_>, d: &DatasetNode, kind: Counted) -> Result<Arc<dyn Dataset>> {
    Ok(Arc::new(CountedDataset {
        origin: d.origin.clone(),
        input: dataset_input(ctx, 0)?,
        kind,
        count: int64_input(ctx, 1, "count")?,
    }))
}

impl Dataset for CountedDataset {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, ctx: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        let input = if self.kind == Counted::Repeat && self.count == 0 {
            None
        } else {
            Some(self.input.clone().iterate(ctx)?)
        };
        Ok(Box::new(CountedIter {
            dataset: self,
            input,
            done: 0,
            produced_this_epoch: false,
        }))
    }

    fn cardinality(&self) -> i64 {
        let n = self.input.cardinality();
        match self.kind {
            Counted::Take if self.count < 0 => n,
            Counted::Take if n == UNKNOWN => UNKNOWN,
            Counted::Take if n == INFINITE => self.count,
            Counted::Take => n.min(self.count),
            Counted::Skip if n == INFINITE || n == UNKNOWN => n,
            Counted::Skip if self.count < 0 => 0,
            Counted::Skip => (n - self.count).max(0),
            Counted::Repeat if self.count == 0 || n == 0 => 0,
            Counted::Repeat if self.count < 0 || n == INFINITE => INFINITE,
            Counted::Repeat if n == UNKNOWN => UNKNOWN,
            Counted::Repeat => n.saturating_mul(self.count),
        }
    }
}

struct CountedIter {
    dataset: Arc<CountedDataset>,
    input: Option<Box<dyn Iter>>,
    /// Take: elements given; skip: elements skipped; repeat: epochs finished.
    done: i64,
    /// Repeat: whether this epoch gave an element (an empty epoch ends an endless repeat).
    produced_this_epoch: bool,
}

impl Iter for CountedIter {
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        let count = self.dataset.count;
        match self.dataset.kind {
            Counted::Take => {
                if count >= 0 && self.done >= count {
                    return Ok(None);
                }
                let Some(input) = self.input.as_mut() else {
                    return Ok(None);
                };
                let element = input.next(ctx)?;
                if element.is_some() {
                    self.done += 1;
                } else {
                    self.input = None;
                }
                Ok(element)
            }
            Counted::Skip => {
                let Some(input) = self.input.as_mut() else {
                    return Ok(None);
                };
                while count < 0 || self.done < count {
                    if input.next(ctx)?.is_none() {
                        self.input = None;
                        return Ok(None);
                    }
                    self.done += 1;
                }
                input.next(ctx)
            }
            Counted::Repeat => loop {
                let Some(input) = self.input.as_mut() else {
                    return Ok(None);
                };
                if let Some(element) = input.next(ctx)? {
                    self.produced_this_epoch = true;
                    return Ok(Some(element));
                }
                self.done += 1;
                let endless_and_empty = count < 0 && !self.produced_this_epoch;
                if endless_and_empty || (count >= 0 && self.done >= count) {
                    self.input = None;
                    return Ok(None);
                }
                self.produced_this_epoch = false;
                self.input = Some(self.dataset.input.clone().iterate(ctx)?);
            },
        }
    }
}

/// `ZipDataset`: one element of each input, joined; ends with the shortest input.
struct Zip {
    origin: Origin,
    inputs: Vec<Arc<dyn Dataset>>,
}

fn zip(ctx: &OpContext<'_>, d: &DatasetNode) -> Result<Arc<dyn Dataset>> {
    let inputs = (0..ctx.num_inputs())
        .map(|i| dataset_input(ctx, i))
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(Zip {
        origin: d.origin.clone(),
        inputs,
    }))
}

impl Dataset for Zip {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, ctx: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        let inputs = self
            .inputs
            .iter()
            .map(|d| d.clone().iterate(ctx))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(ZipIter { inputs }))
    }

    fn cardinality(&self) -> i64 {
        let all: Vec<i64> = self.inputs.iter().map(|d| d.cardinality()).collect();
        if all.iter().all(|&n| n == INFINITE) {
            INFINITE
        } else if all.contains(&UNKNOWN) {
            UNKNOWN
        } else {
            all.into_iter().filter(|&n| n >= 0).min().unwrap_or(0)
        }
    }
}

struct ZipIter {
    inputs: Vec<Box<dyn Iter>>,
}

impl Iter for ZipIter {
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        let mut out = Vec::new();
        for input in &mut self.inputs {
            match input.next(ctx)? {
                Some(element) => out.extend(element),
                None => return Ok(None),
            }
        }
        Ok(Some(out))
    }
}

/// `ConcatenateDataset`: every element of the first input, then of the second.
struct Concatenate {
    origin: Origin,
    first: Arc<dyn Dataset>,
    second: Arc<dyn Dataset>,
}

fn concatenate(ctx: &OpContext<'_>, d: &DatasetNode) -> Result<Arc<dyn Dataset>> {
    Ok(Arc::new(Concatenate {
        origin: d.origin.clone(),
        first: dataset_input(ctx, 0)?,
        second: dataset_input(ctx, 1)?,
    }))
}

impl Dataset for Concatenate {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, ctx: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        Ok(Box::new(ConcatenateIter {
            current: Some(self.first.clone().iterate(ctx)?),
            on_second: false,
            dataset: self,
        }))
    }

    fn cardinality(&self) -> i64 {
        match (self.first.cardinality(), self.second.cardinality()) {
            (INFINITE, _) | (_, INFINITE) => INFINITE,
            (UNKNOWN, _) | (_, UNKNOWN) => UNKNOWN,
            (a, b) => a + b,
        }
    }
}

struct ConcatenateIter {
    dataset: Arc<Concatenate>,
    current: Option<Box<dyn Iter>>,
    on_second: bool,
}

impl Iter for ConcatenateIter {
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        while let Some(current) = self.current.as_mut() {
            if let Some(element) = current.next(ctx)? {
                return Ok(Some(element));
            }
            self.current = if self.on_second {
                None
            } else {
                self.on_second = true;
                Some(self.dataset.second.clone().iterate(ctx)?)
            };
        }
        Ok(None)
    }
}

/// `CacheDataset`: the first complete walk of the input is kept in memory and replayed by
/// every later walk. A file name is accepted and the cache still kept in memory (the
/// elements are the same; only a restarted task walks its input again).
struct Cache {
    origin: Origin,
    input: Arc<dyn Dataset>,
    filled: Mutex<Option<Arc<Vec<Element>>>>,
}

fn cache(ctx: &OpContext<'_>, d: &DatasetNode) -> Result<Arc<dyn Dataset>> {
    let filename = ctx.input(1)?;
    if let Some(name) = filename.strings()?.first().filter(|n| !n.is_empty()) {
        tracing::info!(
            node = %d.origin.name,
            file = %String::from_utf8_lossy(name),
            "dataset cache kept in memory rather than in the file"
        );
    }
    Ok(Arc::new(Cache {
        origin: d.origin.clone(),
        input: dataset_input(ctx, 0)?,
        filled: Mutex::new(None),
    }))
}

impl Dataset for Cache {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, ctx: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        let filled = self.filled.lock().expect("cache lock poisoned").clone();
        Ok(match filled {
            Some(elements) => Box::new(CacheReplay { elements, next: 0 }),
            None => Box::new(CacheFill {
                input: self.input.clone().iterate(ctx)?,
                seen: Vec::new(),
                dataset: self,
            }),
        })
    }

    fn cardinality(&self) -> i64 {
        self.input.cardinality()
    }
}

struct CacheFill {
    dataset: Arc<Cache>,
    input: Box<dyn Iter>,
    seen: Vec<Element>,
}

impl Iter for CacheFill {
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        match self.input.next(ctx)? {
            Some(element) => {
                self.seen.push(element.clone());
                Ok(Some(element))
            }
            None => {
                let mut filled = self.dataset.filled.lock().expect("cache lock poisoned");
                if filled.is_none() {
                    *filled = Some(Arc::new(std::mem::take(&mut self.seen)));
                }
                Ok(None)
            }
        }
    }
}

struct CacheReplay {
    elements: Arc<Vec<Element>>,
    next: usize,
}

impl Iter for CacheReplay {
    fn next(&mut self, _: &OpContext<'_>) -> Result<Option<Element>> {
        let element = self.elements.get(self.next).cloned();
        self.next += 1;
        Ok(element)
    }
}

/// `ShardDataset`: the elements whose position is `index` modulo `num_shards`.
struct Shard {
    origin: Origin,
    input: Arc<dyn Dataset>,
    num_shards: usize,
    index: usize,
}

fn shard(ctx: &OpContext<'_>, d: &DatasetNode) -> Result<Arc<dyn Dataset>> {
    let num_shards = int64_input(ctx, 1, "num_shards")?;
    let index = int64_input(ctx, 2, "index")?;
    if num_shards <= 0 {
        return Err(ctx.invalid(format!(
            "Number of shards must be greater than zero (currently num_shards = {num_shards})"
        )));
    }
    if index < 0 || index >= num_shards {
        return Err(ctx.invalid(format!(
            "Index must be between 0 and {} (currently index = {index})",
            num_shards - 1
        )));
    }
    Ok(Arc::new(Shard {
        origin: d.origin.clone(),
        input: dataset_input(ctx, 0)?,
        num_shards: num_shards as usize,
        index: index as usize,
    }))
}

impl Dataset for Shard {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, ctx: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        Ok(Box::new(ShardIter {
            input: self.input.clone().iterate(ctx)?,
            next_position: 0,
            dataset: self,
        }))
    }
}

struct ShardIter {
    dataset: Arc<Shard>,
    input: Box<dyn Iter>,
    next_position: usize,
}

impl Iter for ShardIter {
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        while let Some(element) = self.input.next(ctx)? {
            let position = self.next_position;
            self.next_position += 1;
            if position % self.dataset.num_shards == self.dataset.index {
                return Ok(Some(element));
            }
        }
        Ok(None)
    }
}

/// `UnbatchDataset`: each element's rows, one element per row.
struct Unbatch {
    origin: Origin,
    input: Arc<dyn Dataset>,
}

fn unbatch(ctx: &OpContext<'_>, d: &DatasetNode) -> Result<Arc<dyn Dataset>> {
    Ok(Arc::new(Unbatch {
        origin: d.origin.clone(),
        input: dataset_input(ctx, 0)?,
    }))
}

impl Dataset for Unbatch {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, ctx: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        Ok(Box::new(UnbatchIter {
            input: self.input.clone().iterate(ctx)?,
            rows: std::collections::VecDeque::new(),
            dataset: self,
        }))
    }
}

struct UnbatchIter {
    dataset: Arc<Unbatch>,
    input: Box<dyn Iter>,
    rows: std::collections::VecDeque<Element>,
}

impl Iter for UnbatchIter {
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        while self.rows.is_empty() {
            let Some(batch) = self.input.next(ctx)? else {
                return Ok(None);
            };
            let n = batch.first().and_then(|t| t.dims().first().copied());
            let Some(n) = n else {
                return Err(self
                    .dataset
                    .origin
                    .invalid("unbatch needs components of rank >= 1"));
            };
            let mut per_component = Vec::with_capacity(batch.len());
            for (i, t) in batch.iter().enumerate() {
                if t.dims().first() != Some(&n) {
                    return Err(self.dataset.origin.invalid(format!(
                        "unbatch needs every component to have {n} rows, component {i} has \
                         shape {}",
                        t.shape()
                    )));
                }
                per_component.push(rows::unstack(t)?);
            }
            for r in 0..n {
                self.rows
                    .push_back(per_component.iter().map(|c| c[r].clone()).collect());
            }
        }
        Ok(self.rows.pop_front())
    }
}

/// `DatasetCardinality`: the number of elements the dataset knows it has (-1 infinite, -2
/// unknown).
struct Cardinality;

impl OpKernel for Cardinality {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dataset = dataset_input(ctx, 0)?;
        ctx.set_output(0, Tensor::scalar(dataset.cardinality()));
        Ok(())
    }
}
