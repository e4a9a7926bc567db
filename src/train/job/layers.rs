//! What the built-in models share: Glorot-uniform initial values and stacks of dense layers
//! (`layer<k>/w`, `layer<k>/b`; ReLU between layers, none after the last).

use rand::rngs::StdRng;
use rand::Rng;

use crate::error::{Result, Status};
use crate::graph::{Graph, Output, Variable};
use crate::tensor::{DType, Tensor};

/// Glorot-uniform values of `shape`: `U(-l, l)`, `l = √(6 / (fan_in + fan_out))`.
pub fn glorot(rng: &mut StdRng, shape: &[usize], fan_in: usize, fan_out: usize) -> Result<Tensor> {
    let limit = (6.0 / (fan_in + fan_out) as f32).sqrt();
    let n: usize = shape.iter().product();
    // The value is built here, then sent in the graph: refuse what no task of this host could
    // hold, and an allocation that fails anyway, instead of aborting the process.
    let bytes = (n as u64).saturating_mul(4);
    let budget = crate::cluster::DeviceConfig::default().cpu_memory_budget();
    let refused = || {
        Status::resource_exhausted(format!(
            "OOM when allocating the initial value of a variable of shape {shape:?}: {bytes} \
             bytes, more than the {budget} bytes a task of this host may take (80% of its \
             memory); use smaller layers (--hidden, --filters, --inputs, --outputs)"
        ))
    };
    if bytes > budget {
        return Err(refused());
    }
    let mut values = Vec::new();
    values.try_reserve_exact(n).map_err(|_| refused())?;
    values.extend((0..n).map(|_| rng.random_range(-limit..limit)));
    Tensor::from_vec(shape.to_vec(), values)
}

/// Creates dense layers from `widths[0]` inputs through each next width: `layer<k>/w`
/// (Glorot-uniform from `rng`) and `layer<k>/b` (zeros) per layer; returns them named, in
/// order.
pub fn dense_variables(
    g: &mut Graph,
    rng: &mut StdRng,
    widths: &[usize],
) -> Result<Vec<(String, Variable)>> {
    let mut params = Vec::new();
    for (layer, pair) in widths.windows(2).enumerate() {
        let (fan_in, fan_out) = (pair[0], pair[1]);
        let w0 = g.constant(&glorot(rng, &[fan_in, fan_out], fan_in, fan_out)?)?;
        let name = format!("layer{layer}/w");
        params.push((name.clone(), g.variable(&name, &w0)?));
        let b0 = g.constant(&Tensor::zeros(DType::Float, [fan_out])?)?;
        let name = format!("layer{layer}/b");
        params.push((name.clone(), g.variable(&name, &b0)?));
    }
    Ok(params)
}

/// The layers' dense maps on `x`: `h = x·w + b` per layer, ReLU between layers; returns the
/// last layer's output. `values` are `w, b` of each layer in turn (reads of the variables).
pub fn dense_forward(g: &mut Graph, x: &Output, values: &[Output]) -> Result<Output> {
    let mut h = x.clone();
    let layers = values.len() / 2;
    for (layer, pair) in values.chunks_exact(2).enumerate() {
        let z = g.matmul(&h, &pair[0])?;
        h = g.bias_add(&z, &pair[1])?;
        if layer + 1 < layers {
            h = g.relu(&h)?;
        }
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn an_initial_value_no_task_could_hold_is_refused_not_allocated() {
        let mut rng = StdRng::seed_from_u64(1);
        let err = glorot(&mut rng, &[64, 100_000_000_000], 64, 100_000_000_000).unwrap_err();
        assert_eq!(err.code(), crate::error::Code::ResourceExhausted);
        assert!(err.message().contains("--hidden"), "{}", err.message());
        let small = glorot(&mut rng, &[3, 4], 3, 4).unwrap();
        assert_eq!(small.num_elements(), 12);
    }
}
