//! `ShuffleDataset` (V1 to V3) and `ShuffleAndRepeatDataset` (V1, V2): TensorFlow's shuffle
//! buffer, element for element. For the same seeds a walk yields the elements in the order
//! TensorFlow's does: the buffer holds up to `buffer_size` elements in slices, one per epoch
//! of the input; each element is drawn uniformly from the oldest slice with a Philox
//! generator keyed by the iterator's seeds, `u32 % slice length`, and swapped out of the
//! buffer's ring as TensorFlow swaps it.
//!
//! Seeds: the op's `seed` and `seed2` (random ones when both are 0). With
//! `reshuffle_each_iteration` every new walk, and every epoch of a shuffle-and-repeat, draws
//! its seeds from a generator keyed by those seeds (two draws per walk), so epochs differ but
//! the sequence of epochs is the same each run; without it, every walk uses the op's seeds.
//! `AnonymousSeedGenerator` makes such a generator a resource that `ShuffleDatasetV2`/`V3`
//! share.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::{dataset_input, dataset_op, int64_input, Dataset, DatasetNode, Element, Iter};
use super::{Origin, INFINITE, UNKNOWN};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::cpu::random::Philox;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::resource::Resource;
use crate::tensor::{ResourceHandle, Tensor};

/// The most epochs the buffer holds elements of at once (TensorFlow's `kMaxEpochsInBuffer`).
const MAX_EPOCHS_IN_BUFFER: usize = 3;

pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "ShuffleDataset"
        | "ShuffleDatasetV2"
        | "ShuffleDatasetV3"
        | "ShuffleAndRepeatDataset"
        | "ShuffleAndRepeatDatasetV2" => |n| dataset_op(n, shuffle),
        "AnonymousSeedGenerator" | "DummySeedGenerator" => MakeSeedGenerator::create,
        "DeleteSeedGenerator" => |_| Ok(Arc::new(DeleteSeedGenerator) as Arc<dyn OpKernel>),
        _ => return None,
    };
    Some(factory)
}

/// Draws 32-bit words one at a time from Philox blocks (TensorFlow's `SingleSampleAdapter`).
struct Words {
    philox: Philox,
    block: [u32; 4],
    used: usize,
}

impl Words {
    fn new(seed: i64, seed2: i64) -> Self {
        Self {
            philox: Philox::new(seed as u64, seed2 as u64),
            block: [0; 4],
            used: 4,
        }
    }

    fn next(&mut self) -> u32 {
        if self.used == 4 {
            self.block = self.philox.next_block();
            self.used = 0;
        }
        self.used += 1;
        self.block[self.used - 1]
    }
}

/// Where a walk's seeds come from.
enum SeedGenerator {
    /// Every walk uses these.
    Fixed(i64, i64),
    /// Every walk draws two words.
    Random(Words),
}

impl SeedGenerator {
    /// TensorFlow's generator for `seed`, `seed2` (both 0: random ones).
    fn new(seed: i64, seed2: i64, reshuffle: bool) -> Self {
        let (seed, seed2) = if seed == 0 && seed2 == 0 {
            (rand::random::<i64>(), rand::random::<i64>())
        } else {
            (seed, seed2)
        };
        if reshuffle {
            SeedGenerator::Random(Words::new(seed, seed2))
        } else {
            SeedGenerator::Fixed(seed, seed2)
        }
    }

    fn generate(&mut self) -> (i64, i64) {
        match self {
            SeedGenerator::Fixed(a, b) => (*a, *b),
            SeedGenerator::Random(words) => {
                let a = words.next();
                let b = words.next();
                (i64::from(a), i64::from(b))
            }
        }
    }
}

/// A seed generator shared by datasets through a resource handle.
struct SharedSeeds(Arc<Mutex<SeedGenerator>>);

impl Resource for SharedSeeds {
    fn type_name(&self) -> &'static str {
        "seed generator"
    }
}

struct Shuffle {
    origin: Origin,
    input: Arc<dyn Dataset>,
    buffer_size: usize,
    /// Epochs of the input: 1 for a shuffle, the count (-1 forever) for shuffle-and-repeat.
    count: i64,
    seeds: Arc<Mutex<SeedGenerator>>,
}

fn shuffle(ctx: &OpContext<'_>, d: &DatasetNode) -> Result<Arc<dyn Dataset>> {
    let input = dataset_input(ctx, 0)?;
    let buffer_size = int64_input(ctx, 1, "buffer_size")?;
    if buffer_size <= 0 {
        return Err(ctx.invalid(format!(
            "buffer_size must be greater than zero, got {buffer_size} (a shuffle of the whole \
             dataset, buffer_size = UNKNOWN_CARDINALITY, is not supported yet)"
        )));
    }
    let reshuffle = attr::bool_or(ctx.node(), "reshuffle_each_iteration", true)?;
    let op = d.origin.op.as_str();
    let repeat = op.starts_with("ShuffleAndRepeat");
    let count = if repeat {
        let count = int64_input(ctx, 4, "count")?;
        if count <= 0 && count != -1 {
            return Err(ctx.invalid("count must be greater than zero or equal to -1"));
        }
        count
    } else {
        1
    };
    // The seed generator resource input, when the op has one.
    let handle_input = match op {
        "ShuffleDatasetV2" => Some(2),
        "ShuffleDatasetV3" => Some(4),
        "ShuffleAndRepeatDatasetV2" => Some(5),
        _ => None,
    };
    let shared = handle_input
        .and_then(|i| ctx.input(i).ok())
        .and_then(|t| t.resource_handle().ok().cloned())
        .and_then(|h| {
            ctx.resources
                .lookup::<SharedSeeds>(&h.container, &h.name)
                .ok()
        })
        .map(|s| s.0.clone());
    let seeds = match shared {
        Some(seeds) => seeds,
        None if op == "ShuffleDatasetV2" => Arc::new(Mutex::new(SeedGenerator::new(0, 0, true))),
        None => {
            let seed = int64_input(ctx, 2, "seed")?;
            let seed2 = int64_input(ctx, 3, "seed2")?;
            Arc::new(Mutex::new(SeedGenerator::new(seed, seed2, reshuffle)))
        }
    };
    Ok(Arc::new(Shuffle {
        origin: d.origin.clone(),
        input,
        buffer_size: buffer_size as usize,
        count,
        seeds,
    }))
}

impl Dataset for Shuffle {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, _: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        let (seed, seed2) = self.seeds.lock().expect("seed lock poisoned").generate();
        Ok(Box::new(ShuffleIter {
            buffer: (0..self.buffer_size).map(|_| None).collect(),
            words: Words::new(seed, seed2),
            slices: VecDeque::new(),
            input: None,
            epoch: 0,
            num_elements: 0,
            data_produced: false,
            dataset: self,
        }))
    }

    fn cardinality(&self) -> i64 {
        let n = self.input.cardinality();
        match self.count {
            1 => n,
            _ if n == 0 => 0,
            -1 => INFINITE,
            c if n >= 0 => n.saturating_mul(c),
            _ => UNKNOWN,
        }
    }
}

/// The part of the buffer's ring that holds one epoch's elements, `[start, end)` modulo the
/// buffer's size.
struct Slice {
    start: usize,
    end: usize,
}

struct ShuffleIter {
    dataset: Arc<Shuffle>,
    buffer: Vec<Option<Element>>,
    words: Words,
    slices: VecDeque<Slice>,
    input: Option<Box<dyn Iter>>,
    epoch: i64,
    num_elements: usize,
    data_produced: bool,
}

impl ShuffleIter {
    fn should_fill(&self) -> bool {
        let count = self.dataset.count;
        if self.input.is_none() && count != -1 && self.epoch >= count {
            return false;
        }
        if self.slices.len() > MAX_EPOCHS_IN_BUFFER && self.num_elements > 0 {
            return false;
        }
        self.num_elements < self.buffer.len()
    }

    fn fill(&mut self, ctx: &OpContext<'_>) -> Result<()> {
        while self.should_fill() {
            if self.input.is_none() {
                let start = self.slices.back().map_or(0, |s| s.end);
                self.slices.push_back(Slice { start, end: start });
                self.input = Some(self.dataset.input.clone().iterate(ctx)?);
                self.epoch += 1;
            }
            let next = self.input.as_mut().expect("opened above").next(ctx)?;
            match next {
                Some(element) => {
                    self.data_produced = true;
                    let slice = self.slices.back_mut().expect("a slice per epoch");
                    let index = slice.end % self.buffer.len();
                    self.buffer[index] = Some(element);
                    slice.end += 1;
                    self.num_elements += 1;
                }
                None => {
                    self.input = None;
                    // An endless shuffle-and-repeat of an empty input ends rather than spin.
                    if !self.data_produced && self.dataset.count == -1 {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }
}

impl Iter for ShuffleIter {
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        self.fill(ctx)?;
        if self.num_elements == 0 {
            return Ok(None);
        }
        while self.slices.front().is_some_and(|s| s.start == s.end) {
            self.slices.pop_front();
            let (seed, seed2) = self
                .dataset
                .seeds
                .lock()
                .expect("seed lock poisoned")
                .generate();
            self.words = Words::new(seed, seed2);
        }
        let len = self.buffer.len();
        let front = self.slices.front_mut().expect("a slice holds the elements");
        let offset = self.words.next() as usize % (front.end - front.start);
        let index = (front.start + offset) % len;
        let out = self.buffer[index].take();
        self.buffer.swap(index, front.start % len);
        front.start += 1;
        self.num_elements -= 1;
        Ok(out)
    }
}

/// `AnonymousSeedGenerator(seed, seed2, reshuffle)` and `DummySeedGenerator`: a seed generator
/// resource for `ShuffleDatasetV2`/`V3`, with a unique name per run.
struct MakeSeedGenerator {
    node: NodeDef,
}

impl MakeSeedGenerator {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(MakeSeedGenerator { node: node.clone() }))
    }
}

impl OpKernel for MakeSeedGenerator {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let name = format!(
            "{}/seed_generator_{}",
            self.node.name,
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let anonymous = self.node.op == "AnonymousSeedGenerator";
        if anonymous {
            let seed = int64_input(ctx, 0, "seed")?;
            let seed2 = int64_input(ctx, 1, "seed2")?;
            let reshuffle = super::bool_input(ctx, 2, "reshuffle")?;
            let seeds = SharedSeeds(Arc::new(Mutex::new(SeedGenerator::new(
                seed, seed2, reshuffle,
            ))));
            ctx.resources
                .lookup_or_create(super::iterator::ANONYMOUS, &name, || Ok(seeds))?;
        }
        ctx.set_output(
            0,
            Tensor::resource(ResourceHandle {
                device: ctx.device.to_string(),
                container: super::iterator::ANONYMOUS.to_string(),
                name: if anonymous { name } else { String::new() },
                type_name: "SeedGenerator".into(),
            }),
        );
        if anonymous {
            ctx.set_output(1, Tensor::variant(Arc::new(())));
        }
        Ok(())
    }
}

/// `DeleteSeedGenerator(handle, deleter)`: drops the generator (gone already is fine).
struct DeleteSeedGenerator;

impl OpKernel for DeleteSeedGenerator {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let h = ctx.input(0)?.resource_handle()?.clone();
        let _ = ctx.resources.delete(&h.container, &h.name);
        Ok(())
    }
}
