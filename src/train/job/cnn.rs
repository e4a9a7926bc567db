//! The convolutional model of `--model cnn`: each example's features read as a square
//! grayscale image, a stack of 3×3 convolutions, then one dense layer to the logits.
//!
//! ```text
//! x [b, side²] → Reshape [b, side, side, 1]
//! per conv<k> (k = 0..): Conv2D 3×3 SAME (stride 1) → BiasAdd → Relu → MaxPool 2×2 SAME (stride 2)
//! Reshape [b, ⌈side / 2^k⌉² · filters_last] → MatMul dense/w → BiasAdd dense/b → logits
//! ```
//!
//! The variables (`conv<k>/w` `[3, 3, in, out]`, `conv<k>/b`, `dense/w`, `dense/b`) are
//! created by the caller's graph under its device function, so they land on the ps tasks like
//! the MLP's; the computation runs wherever the caller's reads of them are placed (the
//! worker, or each tower's device). Every worker draws the same Glorot-uniform initial values
//! from the job's seed.

use rand::rngs::StdRng;

use crate::error::{Result, Status};
use crate::graph::{Graph, Output, Variable};
use crate::tensor::{DType, Tensor};

use super::layers::glorot;

/// The filter counts of the convolutions when `--filters` is not given: two layers, 16 then 32
/// filters (8×8 digits: 4×4×16, then 2×2×32 into the dense layer; 28×28 MNIST: 7×7×32).
pub const DEFAULT_FILTERS: [usize; 2] = [16, 32];

/// The side of a convolution's square window.
const KERNEL: usize = 3;

/// The shape of one `--model cnn` network: its input images and its layers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cnn {
    /// The input images are `side × side`, one channel.
    side: usize,
    /// Filters per convolution, input side first.
    filters: Vec<usize>,
    /// Logits per example.
    classes: usize,
}

impl Cnn {
    /// The network for examples of `features` features (a square image of one channel) in
    /// `classes` classes; INVALID_ARGUMENT when `features` is not a square.
    pub fn new(features: usize, filters: &[usize], classes: usize) -> Result<Self> {
        let side = image_side(features)?;
        if filters.is_empty() || filters.contains(&0) {
            return Err(Status::invalid_argument(format!(
                "--filters {filters:?}: a cnn needs at least one convolution, each of at least \
                 one filter (e.g. --filters 16,32)"
            )));
        }
        Ok(Self {
            side,
            filters: filters.to_vec(),
            classes,
        })
    }

    /// The side of the input images.
    pub fn side(&self) -> usize {
        self.side
    }

    /// The side of the feature maps after the last pooling: each 2×2 `SAME` pool halves it,
    /// rounding up.
    fn final_side(&self) -> usize {
        self.filters.iter().fold(self.side, |s, _| s.div_ceil(2))
    }

    /// The inputs of the dense layer: the last feature maps, flattened.
    fn flat(&self) -> usize {
        let last = *self.filters.last().expect("at least one convolution");
        self.final_side() * self.final_side() * last
    }

    /// Creates the network's variables in `g` with Glorot-uniform weights drawn from `rng`
    /// and zero biases; returns them named, input side first (the order [`Cnn::forward`]
    /// takes their values in).
    pub fn variables(&self, g: &mut Graph, rng: &mut StdRng) -> Result<Vec<(String, Variable)>> {
        let mut out = Vec::with_capacity(2 * self.filters.len() + 2);
        let mut channels = 1;
        for (k, &filters) in self.filters.iter().enumerate() {
            let shape = [KERNEL, KERNEL, channels, filters];
            let taps = KERNEL * KERNEL;
            let w0 = g.constant(&glorot(rng, &shape, taps * channels, taps * filters)?)?;
            let name = format!("conv{k}/w");
            out.push((name.clone(), g.variable(&name, &w0)?));
            let b0 = g.constant(&Tensor::zeros(DType::Float, [filters])?)?;
            let name = format!("conv{k}/b");
            out.push((name.clone(), g.variable(&name, &b0)?));
            channels = filters;
        }
        let (fan_in, fan_out) = (self.flat(), self.classes);
        let w0 = g.constant(&glorot(rng, &[fan_in, fan_out], fan_in, fan_out)?)?;
        out.push(("dense/w".into(), g.variable("dense/w", &w0)?));
        let b0 = g.constant(&Tensor::zeros(DType::Float, [fan_out])?)?;
        out.push(("dense/b".into(), g.variable("dense/b", &b0)?));
        Ok(out)
    }

    /// The logits `[b, classes]` of the flat images `x` (`[b, side²]`), with `values` the
    /// variables' values in the order [`Cnn::variables`] returns them.
    pub fn forward(&self, g: &mut Graph, x: &Output, values: &[Output]) -> Result<Output> {
        if values.len() != 2 * self.filters.len() + 2 {
            return Err(Status::internal(format!(
                "the cnn has {} variables, given {} values",
                2 * self.filters.len() + 2,
                values.len()
            )));
        }
        let side = self.side as i64;
        let mut h = g.reshape_to(x, &[-1, side, side, 1])?;
        for pair in values[..values.len() - 2].chunks_exact(2) {
            h = g.conv2d(&h, &pair[0], &[1, 1, 1, 1], "SAME")?;
            h = g.bias_add(&h, &pair[1])?;
            h = g.relu(&h)?;
            h = g.max_pool(&h, &[1, 2, 2, 1], &[1, 2, 2, 1], "SAME")?;
        }
        let h = g.reshape_to(&h, &[-1, self.flat() as i64])?;
        let dense = &values[values.len() - 2..];
        let z = g.matmul(&h, &dense[0])?;
        g.bias_add(&z, &dense[1])
    }
}

/// The side of the square one-channel image of `features` pixels, or INVALID_ARGUMENT
/// saying what the data would need to be.
pub fn image_side(features: usize) -> Result<usize> {
    let side = (features as f64).sqrt().round() as usize;
    if side == 0 || side * side != features {
        let below = (features as f64).sqrt().floor() as usize;
        return Err(Status::invalid_argument(format!(
            "--model cnn reads each example as a square grayscale image, but the data has \
             {features} features per example, which is not a square ({below}x{below} = {}, \
             {}x{} = {}); give images of side x side pixels (8x8 = 64 for the digits, \
             28x28 = 784 for MNIST) or use --model mlp",
            below * below,
            below + 1,
            below + 1,
            (below + 1) * (below + 1)
        )));
    }
    Ok(side)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_side_is_the_square_root_of_the_features() {
        assert_eq!(image_side(64).unwrap(), 8);
        assert_eq!(image_side(784).unwrap(), 28);
        assert_eq!(image_side(1).unwrap(), 1);
        let err = image_side(560).unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(
            err.message().contains("560 features per example")
                && err.message().contains("23x23 = 529, 24x24 = 576"),
            "{err}"
        );
        assert!(image_side(0).is_err());
    }

    #[test]
    fn each_pool_halves_the_maps_rounding_up() {
        let digits = Cnn::new(64, &[16, 32], 10).unwrap();
        assert_eq!((digits.final_side(), digits.flat()), (2, 2 * 2 * 32));
        let mnist = Cnn::new(784, &[16, 32], 10).unwrap();
        assert_eq!((mnist.final_side(), mnist.flat()), (7, 7 * 7 * 32));
        let odd = Cnn::new(25, &[4, 4, 4], 3).unwrap();
        // 5 → 3 → 2 → 1.
        assert_eq!(odd.flat(), 4);
        assert!(Cnn::new(64, &[], 10).is_err());
        assert!(Cnn::new(64, &[8, 0], 10).is_err());
    }
}
