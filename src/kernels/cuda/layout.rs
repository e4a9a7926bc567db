//! How the GPU kernels index their tensors: the `layout` arrays that `binary_f32` and
//! `reduce_f32` (in `kernels.cu`) take, and the `params` of the convolution and pooling
//! kernels, worked out on the host. Plain functions of shapes and attrs, so they are tested
//! without a GPU, and the same arrays drive the kernels when `tests/gpu_emulated.rs` runs them
//! on the CPU.

use crate::error::Result;
use crate::graph::window::{ConvAttrs, DataFormat, PoolAttrs, WindowDim};

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

/// A 2-D convolution or pooling as the `conv2d_*` and `*_pool_*` kernels index it: its
/// sizes in `NHWC` terms, and the `params` array they read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// How the input and output are laid out.
    pub format: DataFormat,
    /// The input's (batch, height, width, channels).
    pub input: [usize; 4],
    /// The output's (batch, height, width, channels).
    pub output: [usize; 4],
    /// The filter's (height, width, input depth, output depth), `HWIO`; for pooling, the
    /// window's height and width with a depth of 1 and the channels.
    pub filter: [usize; 4],
    /// The geometry as `kernels.cu` reads it, [`Window::PARAMS`] entries: batch, in_h, in_w,
    /// in_c, out_h, out_w, out_c, window_h, window_w, stride_h, stride_w, dilation_h,
    /// dilation_w, pad_top, pad_left, nchw (1 for `NCHW`, 0 for `NHWC`), the filter's depth
    /// (input channels per group; 1 for pooling).
    pub params: Vec<i64>,
}

impl Window {
    /// The number of entries of [`Window::params`].
    pub const PARAMS: usize = 17;

    /// The convolution of an input of `input` dims (in `attrs.format`) by an `HWIO` filter of
    /// `filter` dims, with TensorFlow's geometry ([`ConvAttrs::dims`]). The filter's depth
    /// divides the input's channels (the CPU kernel's checks, run first, say so otherwise):
    /// each group of that many input channels feeds `out_c / groups` output channels.
    pub fn conv(attrs: &ConvAttrs, input: &[usize], filter: &[usize]) -> Result<Window> {
        let input = attrs.format.nhwc(input);
        let filter = [filter[0], filter[1], filter[2], filter[3]];
        let dims = attrs.dims([input[1], input[2]], [filter[0], filter[1]])?;
        Ok(Window::new(attrs.format, input, filter, dims))
    }

    /// The pooling of an input of `input` dims (in `attrs.format`) with TensorFlow's geometry
    /// ([`PoolAttrs::dims`]), channel by channel.
    pub fn pool(attrs: &PoolAttrs, input: &[usize]) -> Result<Window> {
        let input = attrs.format.nhwc(input);
        let dims = attrs.dims([input[1], input[2]])?;
        let filter = [attrs.ksize[0], attrs.ksize[1], 1, input[3]];
        Ok(Window::new(attrs.format, input, filter, dims))
    }

    fn new(
        format: DataFormat,
        input: [usize; 4],
        filter: [usize; 4],
        dims: [WindowDim; 2],
    ) -> Self {
        let output = [input[0], dims[0].output, dims[1].output, filter[3]];
        let [h, w] = dims;
        let params = [
            input[0],
            input[1],
            input[2],
            input[3],
            output[1],
            output[2],
            output[3],
            h.window,
            w.window,
            h.stride,
            w.stride,
            h.dilation,
            w.dilation,
            h.pad_before,
            w.pad_before,
            usize::from(format == DataFormat::Nchw),
            filter[2],
        ]
        .map(|v| v as i64)
        .to_vec();
        Window {
            format,
            input,
            output,
            filter,
            params,
        }
    }

    /// The input's dims in the window's format.
    pub fn input_dims(&self) -> Vec<usize> {
        self.format.from_nhwc(self.input).to_vec()
    }

    /// The output's dims in the window's format.
    pub fn output_dims(&self) -> Vec<usize> {
        self.format.from_nhwc(self.output).to_vec()
    }

    /// The number of input elements.
    pub fn input_len(&self) -> usize {
        self.input.iter().product()
    }

    /// The number of output elements.
    pub fn output_len(&self) -> usize {
        self.output.iter().product()
    }

    /// The number of filter elements.
    pub fn filter_len(&self) -> usize {
        self.filter.iter().product()
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

    fn node(op: &str, attrs: &[(&str, crate::proto::AttrValue)]) -> crate::proto::NodeDef {
        let mut node = crate::proto::NodeDef {
            name: "w".into(),
            op: op.into(),
            ..Default::default()
        };
        for (k, v) in attrs {
            node.attr.insert(k.to_string(), v.clone());
        }
        node
    }

    #[test]
    fn windows_hold_tensorflows_geometry_in_nhwc_terms() {
        use crate::graph::attr::value;
        // NCHW [2, 4, 5, 7] by a 3×2 filter of depth 2 (two groups) to 6 channels, stride
        // (2, 1), dilation (1, 2), SAME: rows ceil(5 / 2) = 3, 1 padded above and 1 below;
        // columns 7, the dilated window 3 wide, 1 padded each side.
        let conv = node(
            "Conv2D",
            &[
                ("data_format", value::string("NCHW")),
                ("strides", value::int_list(vec![1, 1, 2, 1])),
                ("dilations", value::int_list(vec![1, 1, 1, 2])),
                ("padding", value::string("SAME")),
            ],
        );
        let attrs = ConvAttrs::of(&conv).unwrap();
        let w = Window::conv(&attrs, &[2, 4, 5, 7], &[3, 2, 2, 6]).unwrap();
        assert_eq!(w.input, [2, 5, 7, 4]);
        assert_eq!(w.output, [2, 3, 7, 6]);
        assert_eq!(w.output_dims(), vec![2, 6, 3, 7]);
        assert_eq!(w.input_dims(), vec![2, 4, 5, 7]);
        assert_eq!(
            (w.input_len(), w.output_len(), w.filter_len()),
            (280, 252, 72)
        );
        assert_eq!(
            w.params,
            vec![2, 5, 7, 4, 3, 7, 6, 3, 2, 2, 1, 1, 2, 1, 1, 1, 2]
        );
        assert_eq!(w.params.len(), Window::PARAMS);
        // NHWC max pooling 2×3, stride 2, VALID over [1, 6, 7, 3]: 3×3 outputs, no padding.
        let pool = node(
            "MaxPool",
            &[
                ("ksize", value::int_list(vec![1, 2, 3, 1])),
                ("strides", value::int_list(vec![1, 2, 2, 1])),
                ("padding", value::string("VALID")),
            ],
        );
        let w = Window::pool(&PoolAttrs::of(&pool).unwrap(), &[1, 6, 7, 3]).unwrap();
        assert_eq!(w.output_dims(), vec![1, 3, 3, 3]);
        assert_eq!(
            w.params,
            vec![1, 6, 7, 3, 3, 3, 3, 2, 3, 2, 2, 1, 1, 0, 0, 0, 1]
        );
    }
}
