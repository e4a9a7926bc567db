//! The stateless random ops TensorFlow 2.21's initializers write: `StatelessRandomGetKeyCounter`
//! (a Philox key and counter from a seed pair) and `StatelessRandomUniformV2` (uniform samples
//! in `[0, 1)` from a key and counter), as TensorFlow's CPU kernels compute them
//! (`stateless_random_ops.cc`, `stateless_random_ops_v2.cc`, `random_ops_util.h`).
//!
//! A key and counter come from a seed as TensorFlow's `GenerateKey` makes them: the seeds'
//! 32-bit halves are the counter of one Philox block under a fixed key, and that block's words
//! are the new key and the counter's high half. The outputs pack the words little end first
//! into uint64s (key `[k1 << 32 | k0]`, counter `[c1 << 32 | c0, c3 << 32 | c2]`), which is how
//! `StatelessRandomUniformV2` reads them back. The samples are [`random`]'s uniform ones from
//! that generator, with no skip, so they are `RandomUniform`'s for the same key and counter;
//! float16 and bfloat16 take one word each, as TensorFlow's `Uint16ToHalf` and
//! `Uint16ToGfloat16` do. The samples depend only on the inputs, so the kernels hold no state.

use std::sync::Arc;

use half::{bf16, f16};

use super::random::{uniform_f32, uniform_f64, Philox};
use super::{input, shape_values};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Tensor};

/// Returns the factory for a stateless random op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "StatelessRandomGetKeyCounter" => |_| super::stateless(get_key_counter),
        "StatelessRandomUniformV2" => UniformV2::create,
        _ => return None,
    };
    Some(factory)
}

/// TensorFlow's `RNG_ALG_PHILOX` and `RNG_ALG_AUTO_SELECT` (Philox on the CPU).
const ALG_PHILOX: i32 = 1;
const ALG_AUTO_SELECT: i32 = 3;

/// The key and counter TensorFlow's `GenerateKey` makes from a seed pair.
fn key_counter(seed0: i64, seed1: i64) -> ([u32; 2], [u32; 4]) {
    let (s0, s1) = (seed0 as u64, seed1 as u64);
    let counter = [s0 as u32, (s0 >> 32) as u32, s1 as u32, (s1 >> 32) as u32];
    let mix = Philox::from_words(counter, [0x3ec8_f720, 0x0246_1e29]).next_block();
    ([mix[0], mix[1]], [0, 0, mix[2], mix[3]])
}

/// Two 32-bit words as one uint64, the first the low half.
fn pack(lo: u32, hi: u32) -> u64 {
    u64::from(hi) << 32 | u64::from(lo)
}

/// StatelessRandomGetKeyCounter(seed: int32 or int64 [2]) -> key: uint64 [1], counter: uint64 [2].
fn get_key_counter(ctx: &mut OpContext<'_>) -> Result<()> {
    let seed = input(ctx, 0)?;
    if seed.dims() != [2] {
        return Err(ctx.invalid(format!("seed must have shape [2], not {}", seed.shape())));
    }
    let seeds = super::int_values(ctx, &seed, "seed")?;
    let (key, counter) = key_counter(seeds[0], seeds[1]);
    ctx.set_output(0, Tensor::from_vec(vec![1], vec![pack(key[0], key[1])])?);
    let counter = vec![pack(counter[0], counter[1]), pack(counter[2], counter[3])];
    ctx.set_output(1, Tensor::from_vec(vec![2], counter)?);
    Ok(())
}

/// StatelessRandomUniformV2(shape, key, counter, alg): uniform samples of `dtype` in `[0, 1)`.
struct UniformV2 {
    dtype: DType,
}

impl UniformV2 {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let dtype = match attr::get(node, "dtype") {
            Some(_) => attr::dtype(node, "dtype")?,
            None => DType::Float,
        };
        Ok(Arc::new(UniformV2 { dtype }))
    }
}

/// The generator the `key` (uint64 [1]) and `counter` (uint64 [2] at least) inputs name, with
/// TensorFlow's checks (`GetKeyCounterAlgFromInputs`); only Philox is there on the CPU.
fn generator(ctx: &OpContext<'_>, key: &Tensor, counter: &Tensor, alg: &Tensor) -> Result<Philox> {
    if alg.rank() != 0 || alg.dtype() != DType::Int32 {
        return Err(ctx.invalid(format!(
            "alg must be an int32 scalar, got {} of shape {}",
            alg.dtype(),
            alg.shape()
        )));
    }
    let alg = alg.scalar_value::<i32>()?;
    if alg != ALG_PHILOX && alg != ALG_AUTO_SELECT {
        // TensorFlow 2.21's CPU kernel has no ThreeFry either, and says so this way.
        return Err(ctx.invalid(format!("Unsupported algorithm id: {alg}")));
    }
    if key.dtype() != DType::UInt64 || key.dims() != [1] {
        return Err(ctx.invalid(format!(
            "key must have shape [1], not {}. (Note that batched keys are not supported yet.)",
            key.shape()
        )));
    }
    if counter.dtype() != DType::UInt64 || counter.rank() != 1 || counter.dims()[0] < 2 {
        return Err(ctx.invalid(format!(
            "counter must be a vector with length at least 2; got shape: {}. (Note that \
             batched counters are not supported yet.)",
            counter.shape()
        )));
    }
    let k = key.values::<u64>()?[0];
    let c = counter.values::<u64>()?;
    let words = |x: u64| [x as u32, (x >> 32) as u32];
    let ([c0, c1], [c2, c3]) = (words(c[0]), words(c[1]));
    Ok(Philox::from_words([c0, c1, c2, c3], words(k)))
}

/// `n` 16-bit floats, one per word: `1.m - 1` with the word's low mantissa bits.
fn uniform_words<T>(gen: Philox, n: usize, f: impl Fn(u32) -> T) -> Vec<T> {
    let mut gen = gen;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let block = gen.next_block();
        let take = 4.min(n - out.len());
        out.extend(block[..take].iter().map(|&x| f(x)));
    }
    out
}

impl OpKernel for UniformV2 {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let shape = input(ctx, 0)?;
        let (key, counter, alg) = (input(ctx, 1)?, input(ctx, 2)?, input(ctx, 3)?);
        let dims = shape_values(ctx, &shape, "shape")?;
        let gen = generator(ctx, &key, &counter, &alg)?;
        let n: usize = dims.iter().product();
        let out = match self.dtype {
            DType::Float => Tensor::from_vec(dims, uniform_f32(gen, n))?,
            DType::Double => Tensor::from_vec(dims, uniform_f64(gen, n))?,
            // 1.m - 1 is exact in the narrow type, so computing it in float32 changes nothing.
            DType::Half => Tensor::from_vec(
                dims,
                uniform_words(gen, n, |x| {
                    f16::from_f32(f16::from_bits(0x3c00 | (x & 0x3ff) as u16).to_f32() - 1.0)
                }),
            )?,
            DType::BFloat16 => Tensor::from_vec(
                dims,
                uniform_words(gen, n, |x| {
                    bf16::from_f32(bf16::from_bits(0x3f80 | (x & 0x7f) as u16).to_f32() - 1.0)
                }),
            )?,
            other => {
                let accepted = [DType::Half, DType::BFloat16, DType::Float, DType::Double];
                return Err(super::unsupported_dtype(ctx, other, &accepted));
            }
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_and_counter_of_seed_one_two_are_tensorflows() {
        // tf.raw_ops.StatelessRandomGetKeyCounter(seed=[1, 2]) in TensorFlow 2.21.
        let (key, counter) = key_counter(1, 2);
        assert_eq!(pack(key[0], key[1]), 0x9085_02c9_6d2f_7fba);
        assert_eq!(pack(counter[0], counter[1]), 0);
        assert_eq!(pack(counter[2], counter[3]), 0xf773_4320_619c_b60b);
    }
}
