//! How the GPU kernels index their tensors: the `layout` arrays that `binary_f32` and
//! `reduce_f32` (in `kernels.cu`) take, worked out on the host. Plain functions of shapes, so
//! they are tested without a GPU, and the same arrays drive the kernels when
//! `tests/gpu_emulated.rs` runs them on the CPU.

/// Row-major strides of `dims`.
fn strides(dims: &[usize]) -> Vec<i64> {
    let mut strides = vec![0i64; dims.len()];
    let mut step = 1i64;
    for (stride, &d) in strides.iter_mut().zip(dims).rev() {
        *stride = step;
        step *= d as i64;
    }
    strides
}

/// A two-input element-wise op over broadcast operands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broadcast {
    /// The output's dimensions.
    pub dims: Vec<usize>,
    /// The output's dims, then a's strides, then b's strides (`dims.len()` each; a stride is
    /// 0 along a dimension the operand broadcasts), as `binary_f32` reads them.
    pub layout: Vec<i64>,
}

impl Broadcast {
    /// The layout of `a op b` with numpy broadcasting, or `None` when the shapes do not
    /// broadcast together.
    pub fn new(a: &[usize], b: &[usize]) -> Option<Broadcast> {
        let dims = crate::kernels::cpu::broadcast::broadcast_shape(a, b)?;
        let rank = dims.len();
        let operand = |s: &[usize]| -> Vec<i64> {
            let own = strides(s);
            let pad = rank - s.len();
            (0..rank)
                .map(|d| match d.checked_sub(pad) {
                    Some(k) if s[k] != 1 => own[k],
                    _ => 0,
                })
                .collect()
        };
        let mut layout: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        layout.extend(operand(a));
        layout.extend(operand(b));
        Some(Broadcast { dims, layout })
    }

    /// BiasAdd's layout: a bias of the value's `channel_axis` dimension added along it. The
    /// bias is seen as `[channels, 1, ..., 1]` up to the value's last dimension.
    pub fn bias(value: &[usize], channel_axis: usize) -> Broadcast {
        let mut bias = vec![1; value.len() - channel_axis];
        bias[0] = value[channel_axis];
        Broadcast::new(value, &bias).expect("a bias broadcasts along its value")
    }

    /// The output's rank.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The number of output elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// Whether the output is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A reduction of a tensor over some of its axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reduction {
    /// Output elements: the product of the kept dimensions.
    pub outputs: usize,
    /// Elements folded into each output: the product of the reduced dimensions.
    pub reduced_len: usize,
    /// The number of kept dimensions.
    pub kept: usize,
    /// The number of reduced dimensions.
    pub reduced: usize,
    /// The kept dims, their strides, the reduced dims, their strides, as `reduce_f32` reads
    /// them.
    pub layout: Vec<i64>,
}

impl Reduction {
    /// The reduction of a tensor of `dims` over the axes marked in `reduced`.
    pub fn new(dims: &[usize], reduced: &[bool]) -> Reduction {
        let all = strides(dims);
        let pick = |want: bool| -> (Vec<i64>, Vec<i64>) {
            dims.iter()
                .zip(&all)
                .zip(reduced)
                .filter(|&(_, &r)| r == want)
                .map(|((&d, &s), _)| (d as i64, s))
                .unzip()
        };
        let (kept_dims, kept_strides) = pick(false);
        let (reduced_dims, reduced_strides) = pick(true);
        let product = |d: &[i64]| d.iter().product::<i64>() as usize;
        Reduction {
            outputs: product(&kept_dims),
            reduced_len: product(&reduced_dims),
            kept: kept_dims.len(),
            reduced: reduced_dims.len(),
            layout: [kept_dims, kept_strides, reduced_dims, reduced_strides].concat(),
        }
    }

    /// The reduction over every axis but `axis` (BiasAddGrad's, with `axis` the channels).
    pub fn all_but(dims: &[usize], axis: usize) -> Reduction {
        let reduced: Vec<bool> = (0..dims.len()).map(|d| d != axis).collect();
        Reduction::new(dims, &reduced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_strides_are_zero_where_an_operand_repeats() {
        // [2, 1] against [3]: out [2, 3]; a steps by 1 along rows only, b along columns only.
        let b = Broadcast::new(&[2, 1], &[3]).unwrap();
        assert_eq!(b.dims, vec![2, 3]);
        assert_eq!(b.layout, vec![2, 3, 1, 0, 0, 1]);
        // Same shapes: plain row-major strides on both sides.
        let same = Broadcast::new(&[4, 5], &[4, 5]).unwrap();
        assert_eq!(same.layout, vec![4, 5, 5, 1, 5, 1]);
        // A scalar against a matrix.
        let scalar = Broadcast::new(&[], &[2, 2]).unwrap();
        assert_eq!(scalar.layout, vec![2, 2, 0, 0, 2, 1]);
        assert_eq!(scalar.len(), 4);
        // NCHW bias: [C, 1, 1] against [N, C, H, W].
        let nchw = Broadcast::bias(&[2, 3, 4, 5], 1);
        assert_eq!(nchw.layout[8..12], [0, 1, 0, 0]);
        assert_eq!(Broadcast::bias(&[2, 3], 1).layout, vec![2, 3, 3, 1, 0, 1]);
        // Scalars together: rank 0, one element.
        let both = Broadcast::new(&[], &[]).unwrap();
        assert_eq!((both.rank(), both.len(), both.layout.len()), (0, 1, 0));
        assert!(Broadcast::new(&[2, 3], &[4]).is_none());
    }

    #[test]
    fn reductions_split_kept_and_reduced_axes_with_their_strides() {
        // [4, 6, 5] over axes 0 and 2 (not adjacent): 6 outputs of 20 elements each.
        let r = Reduction::new(&[4, 6, 5], &[true, false, true]);
        assert_eq!((r.outputs, r.reduced_len, r.kept, r.reduced), (6, 20, 1, 2));
        assert_eq!(r.layout, vec![6, 5, 4, 5, 30, 1]);
        // Nothing reduced: every element is its own output.
        let none = Reduction::new(&[3, 2], &[false, false]);
        assert_eq!((none.outputs, none.reduced_len), (6, 1));
        // Everything reduced: one output.
        let all = Reduction::new(&[3, 2], &[true, true]);
        assert_eq!((all.outputs, all.reduced_len, all.kept), (1, 6, 0));
        // BiasAddGrad over NCHW keeps the channels.
        let channels = Reduction::all_but(&[2, 3, 4], 1);
        assert_eq!((channels.outputs, channels.reduced_len), (3, 8));
        assert_eq!(channels.layout, vec![3, 4, 2, 4, 12, 1]);
        // An empty reduced axis folds nothing into each output.
        let empty = Reduction::new(&[3, 0], &[false, true]);
        assert_eq!((empty.outputs, empty.reduced_len), (3, 0));
    }
}
