//! Random tensors: RandomUniform (`[0, 1)`), RandomStandardNormal and TruncatedNormal (normal
//! samples beyond two standard deviations are drawn again), of float32 or float64, drawing the
//! same numbers as TensorFlow's CPU kernels for the same seeds.
//!
//! Seeds follow TensorFlow's op-level contract: with `seed` and `seed2` both zero the kernel is
//! seeded from the OS's entropy; otherwise the pair keys a Philox4x32-10 generator exactly as
//! TensorFlow keys it (`seed` the key, `seed2` the high half of the counter), so a seeded
//! initializer gives a model the same initial weights on tessera and on TensorFlow. As in
//! TensorFlow, each run reserves 256 Philox blocks per output element and advances the
//! generator past them, so steps draw different values, and the outputs come in groups (four
//! floats or two doubles from one block; truncated normals from 256 blocks per group) laid out
//! as TensorFlow lays them out.

use std::sync::{Arc, Mutex};

use super::{input, shape_values};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Tensor};

/// Returns the factory for a random op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "RandomUniform" => |n| RandomOp::create(n, Distribution::Uniform),
        "RandomStandardNormal" => |n| RandomOp::create(n, Distribution::Normal),
        "TruncatedNormal" => |n| RandomOp::create(n, Distribution::TruncatedNormal),
        _ => return None,
    };
    Some(factory)
}

/// The Philox4x32-10 counter-based generator (Salmon et al., SC 2011) with TensorFlow's
/// keying and stepping: each call returns four 32-bit words from the 128-bit counter and
/// moves the counter on by one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Philox {
    counter: [u32; 4],
    key: [u32; 2],
}

impl Philox {
    const M0: u32 = 0xD251_1F53;
    const M1: u32 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;

    /// TensorFlow's generator for op seeds (`seed`, `seed2`): `seed` is the key, `seed2` the
    /// counter's high 64 bits.
    pub fn new(seed: u64, seed2: u64) -> Philox {
        Philox {
            counter: [0, 0, seed2 as u32, (seed2 >> 32) as u32],
            key: [seed as u32, (seed >> 32) as u32],
        }
    }

    /// The generator at this raw counter and key (the stateless ops' `key` and `counter`).
    pub fn from_words(counter: [u32; 4], key: [u32; 2]) -> Philox {
        Philox { counter, key }
    }

    /// Moves the 128-bit counter on by `count` blocks.
    pub fn skip(&mut self, count: u64) {
        let (lo, hi) = (count as u32, (count >> 32) as u32);
        let (c0, carry0) = self.counter[0].overflowing_add(lo);
        let (c1, carry1a) = self.counter[1].overflowing_add(hi);
        let (c1, carry1b) = c1.overflowing_add(u32::from(carry0));
        self.counter[0] = c0;
        self.counter[1] = c1;
        if carry1a || carry1b {
            let (c2, carry2) = self.counter[2].overflowing_add(1);
            self.counter[2] = c2;
            self.counter[3] = self.counter[3].wrapping_add(u32::from(carry2));
        }
    }

    /// The next block of four words.
    pub fn next_block(&mut self) -> [u32; 4] {
        let mut counter = self.counter;
        let mut key = self.key;
        for round in 0..10 {
            if round > 0 {
                key = [key[0].wrapping_add(Self::W0), key[1].wrapping_add(Self::W1)];
            }
            let p0 = u64::from(Self::M0) * u64::from(counter[0]);
            let p1 = u64::from(Self::M1) * u64::from(counter[2]);
            let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
            let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
            counter = [
                hi1 ^ counter[1] ^ key[0],
                lo1,
                hi0 ^ counter[3] ^ key[1],
                lo0,
            ];
        }
        self.skip(1);
        counter
    }
}

/// A float in `[0, 1)` from 23 bits of `x`, as TensorFlow makes it: `1.m - 1`.
fn uint32_to_f32(x: u32) -> f32 {
    f32::from_bits((127 << 23) | (x & 0x7f_ffff)) - 1.0
}

/// A double in `[0, 1)` from 20 bits of `x0` and all of `x1`: `1.m - 1`.
fn uint64_to_f64(x0: u32, x1: u32) -> f64 {
    let mantissa = (u64::from(x0 & 0xf_ffff) << 32) | u64::from(x1);
    f64::from_bits((1023 << 52) | mantissa) - 1.0
}

/// Two standard normal floats from two words (Box-Muller, as TensorFlow computes it: the
/// angle in double precision, the rest in float).
fn box_muller_f32(x0: u32, x1: u32) -> [f32; 2] {
    let u1 = uint32_to_f32(x0).max(1.0e-7);
    let v1 = (2.0 * std::f64::consts::PI * f64::from(uint32_to_f32(x1))) as f32;
    let u2 = (-2.0f32 * u1.ln()).sqrt();
    [v1.sin() * u2, v1.cos() * u2]
}

/// Two standard normal doubles from four words (Box-Muller).
fn box_muller_f64(x: [u32; 4]) -> [f64; 2] {
    let u1 = uint64_to_f64(x[0], x[1]).max(1.0e-7);
    let v1 = 2.0 * std::f64::consts::PI * uint64_to_f64(x[2], x[3]);
    let u2 = (-2.0 * u1.ln()).sqrt();
    [v1.sin() * u2, v1.cos() * u2]
}

/// One word at a time from successive blocks (TensorFlow's `SingleSampleAdapter`).
struct Words {
    gen: Philox,
    block: [u32; 4],
    used: usize,
}

impl Words {
    fn new(gen: Philox) -> Words {
        Words {
            gen,
            block: [0; 4],
            used: 4,
        }
    }

    fn next(&mut self) -> u32 {
        if self.used == 4 {
            self.block = self.gen.next_block();
            self.used = 0;
        }
        self.used += 1;
        self.block[self.used - 1]
    }
}

/// Blocks reserved per output element and run, and per truncated-normal output within a
/// group: TensorFlow's `kReservedSamplesPerOutput`.
const RESERVED_PER_OUTPUT: u64 = 256;

/// A float element type the random ops produce.
trait Sample: Copy + Default {
    /// Outputs per group: per block for the fixed distributions, per 256-block region for
    /// the truncated normal.
    const GROUP: usize;
    /// The uniform values of one block (the first [`Sample::GROUP`] are used).
    fn uniform(block: [u32; 4]) -> [Self; 4];
    /// The normal values of one block (the first [`Sample::GROUP`] are used).
    fn normal(block: [u32; 4]) -> [Self; 4];
    /// A pair of normals from the next words of `words`.
    fn normal_pair(words: &mut Words) -> [Self; 2];
    fn abs_below_two(self) -> bool;
}

impl Sample for f32 {
    const GROUP: usize = 4;
    fn uniform(block: [u32; 4]) -> [f32; 4] {
        block.map(uint32_to_f32)
    }
    fn normal(block: [u32; 4]) -> [f32; 4] {
        let [a, b] = box_muller_f32(block[0], block[1]);
        let [c, d] = box_muller_f32(block[2], block[3]);
        [a, b, c, d]
    }
    fn normal_pair(words: &mut Words) -> [f32; 2] {
        let (x0, x1) = (words.next(), words.next());
        box_muller_f32(x0, x1)
    }
    fn abs_below_two(self) -> bool {
        self.abs() < 2.0
    }
}

impl Sample for f64 {
    const GROUP: usize = 2;
    fn uniform(block: [u32; 4]) -> [f64; 4] {
        let (a, b) = (
            uint64_to_f64(block[0], block[1]),
            uint64_to_f64(block[2], block[3]),
        );
        [a, b, 0.0, 0.0]
    }
    fn normal(block: [u32; 4]) -> [f64; 4] {
        let [a, b] = box_muller_f64(block);
        [a, b, 0.0, 0.0]
    }
    fn normal_pair(words: &mut Words) -> [f64; 2] {
        box_muller_f64([words.next(), words.next(), words.next(), words.next()])
    }
    fn abs_below_two(self) -> bool {
        self.abs() < 2.0
    }
}

/// `n` values of `distribution` from `gen` (this run's reservation), in TensorFlow's order.
fn fill<T: Sample>(distribution: Distribution, gen: Philox, n: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(n);
    match distribution {
        Distribution::Uniform | Distribution::Normal => {
            let mut gen = gen;
            while out.len() < n {
                let block = gen.next_block();
                let group = match distribution {
                    Distribution::Uniform => T::uniform(block),
                    _ => T::normal(block),
                };
                let take = T::GROUP.min(n - out.len());
                out.extend_from_slice(&group[..take]);
            }
        }
        Distribution::TruncatedNormal => {
            // Each group of outputs draws from its own region of the stream.
            let per_group = T::GROUP as u64 * RESERVED_PER_OUTPUT / 4;
            for group in 0..n.div_ceil(T::GROUP) {
                let mut region = gen;
                region.skip(group as u64 * per_group);
                let mut words = Words::new(region);
                let want = T::GROUP.min(n - out.len());
                let mut taken = 0;
                while taken < want {
                    for x in T::normal_pair(&mut words) {
                        if taken < want && x.abs_below_two() {
                            out.push(x);
                            taken += 1;
                        }
                    }
                }
            }
        }
    }
    out
}

/// `n` uniform floats in `[0, 1)` from `gen`, four per block, as `RandomUniform` draws them.
pub(super) fn uniform_f32(gen: Philox, n: usize) -> Vec<f32> {
    fill(Distribution::Uniform, gen, n)
}

/// `n` uniform doubles in `[0, 1)` from `gen`, two per block.
pub(super) fn uniform_f64(gen: Philox, n: usize) -> Vec<f64> {
    fill(Distribution::Uniform, gen, n)
}

#[derive(Clone, Copy, Debug)]
enum Distribution {
    /// Uniform in `[0, 1)`.
    Uniform,
    /// Mean 0, standard deviation 1.
    Normal,
    /// Mean 0, standard deviation 1 before truncation, within `(-2, 2)`.
    TruncatedNormal,
}

/// A random op with its own generator.
struct RandomOp {
    distribution: Distribution,
    dtype: DType,
    gen: Mutex<Philox>,
}

impl RandomOp {
    fn create(node: &NodeDef, distribution: Distribution) -> Result<Arc<dyn OpKernel>> {
        let dtype = attr::dtype(node, "dtype")?;
        if !dtype.is_float() {
            return Err(Status::invalid_argument(format!(
                "node `{}` (op {}): dtype must be float32 or float64, got {dtype}",
                node.name, node.op
            )));
        }
        let seed = attr::int_or(node, "seed", 0)?;
        let seed2 = attr::int_or(node, "seed2", 0)?;
        let gen = if seed == 0 && seed2 == 0 {
            Philox::new(rand::random(), rand::random())
        } else {
            Philox::new(seed as u64, seed2 as u64)
        };
        Ok(Arc::new(RandomOp {
            distribution,
            dtype,
            gen: Mutex::new(gen),
        }))
    }
}

impl OpKernel for RandomOp {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let shape = input(ctx, 0)?;
        let dims = shape_values(ctx, &shape, "shape")?;
        let n: usize = dims.iter().product();
        // This run's part of the stream, reserved as TensorFlow reserves it.
        let gen = {
            let mut shared = self
                .gen
                .lock()
                .map_err(|_| Status::internal("random generator lock poisoned"))?;
            let reserved = *shared;
            shared.skip((n as u64).saturating_mul(RESERVED_PER_OUTPUT));
            reserved
        };
        let out = match self.dtype {
            DType::Float => Tensor::from_vec(dims, fill::<f32>(self.distribution, gen, n))?,
            _ => Tensor::from_vec(dims, fill::<f64>(self.distribution, gen, n))?,
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_carries_across_the_counter_words() {
        let mut gen = Philox::new(0, 0);
        gen.counter = [u32::MAX, u32::MAX, u32::MAX, 0];
        gen.skip(1);
        assert_eq!(gen.counter, [0, 0, 0, 1]);
        let mut gen = Philox::new(0, 0);
        gen.counter = [u32::MAX, 0, 0, 0];
        gen.skip(1 << 32 | 1);
        assert_eq!(gen.counter, [0, 2, 0, 0]);
    }

    #[test]
    fn unit_interval_conversions_keep_the_mantissa_bits() {
        assert_eq!(uint32_to_f32(0), 0.0);
        assert_eq!(uint32_to_f32(u32::MAX), 1.0 - f32::EPSILON);
        assert_eq!(uint64_to_f64(0, 0), 0.0);
        assert_eq!(uint64_to_f64(u32::MAX, u32::MAX), 1.0 - f64::EPSILON);
    }
}
