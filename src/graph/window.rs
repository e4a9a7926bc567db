//! Sliding-window geometry of the 2-D convolution and pooling ops, shared by their shape
//! functions (build time) and their CPU kernels (run time), so both give the same output sizes
//! and the same errors.
//!
//! It follows TensorFlow's `GetWindowedOutputSizeVerbose` (`framework/kernel_shape_util.cc`)
//! and the attr checks of `conv_ops.cc` and `pooling_ops_common.cc`: `SAME` pads so that the
//! output has `ceil(input / stride)` entries, putting the odd pixel after; `VALID` does not
//! pad; `EXPLICIT` takes the padding from `explicit_paddings` (before and after, per dimension
//! in `data_format` order). Integer division truncates toward zero as in C++, so a window just
//! too big for its input gives an output of size 0 rather than an error, as in TensorFlow.

use crate::error::{Result, Status};
use crate::graph::attr;
use crate::proto::NodeDef;

/// How a node lays out its 4-D values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataFormat {
    /// Batch, height, width, channels (TensorFlow's default).
    Nhwc,
    /// Batch, channels, height, width (what GPUs prefer).
    Nchw,
}

impl DataFormat {
    /// Reads a node's `data_format` attr (default `NHWC`).
    pub fn of(node: &NodeDef) -> Result<DataFormat> {
        match attr::string_or(node, "data_format", "NHWC")?.as_str() {
            "NHWC" => Ok(DataFormat::Nhwc),
            "NCHW" => Ok(DataFormat::Nchw),
            other => Err(node_error(
                node,
                Status::invalid_argument(format!(
                    "unknown data_format `{other}`; use NHWC or NCHW"
                )),
            )),
        }
    }

    /// The indices of (batch, height, width, channels) in a 4-D value of this format.
    pub fn axes(self) -> [usize; 4] {
        match self {
            DataFormat::Nhwc => [0, 1, 2, 3],
            DataFormat::Nchw => [0, 2, 3, 1],
        }
    }

    /// Reads (batch, height, width, channels) out of dims (or attr values) in this format.
    pub fn nhwc<T: Copy>(self, dims: &[T]) -> [T; 4] {
        self.axes().map(|a| dims[a])
    }

    /// Lays out (batch, height, width, channels) in this format.
    pub fn from_nhwc<T: Copy>(self, nhwc: [T; 4]) -> [T; 4] {
        match self {
            DataFormat::Nhwc => nhwc,
            DataFormat::Nchw => [nhwc[0], nhwc[3], nhwc[1], nhwc[2]],
        }
    }

    /// The format's name, as the attr spells it.
    pub fn name(self) -> &'static str {
        match self {
            DataFormat::Nhwc => "NHWC",
            DataFormat::Nchw => "NCHW",
        }
    }
}

/// How a window is padded at the borders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// The output covers every input position at the stride (`ceil(input / stride)`).
    Same,
    /// Only windows that fit inside the input.
    Valid,
    /// The padding `explicit_paddings` gives.
    Explicit,
}

impl Padding {
    /// Reads a node's `padding` attr; `EXPLICIT` only where `explicit` says the op has it.
    pub fn of(node: &NodeDef, explicit: bool) -> Result<Padding> {
        match attr::string_or(node, "padding", "")?.as_str() {
            "SAME" => Ok(Padding::Same),
            "VALID" => Ok(Padding::Valid),
            "EXPLICIT" if explicit => Ok(Padding::Explicit),
            other => {
                let known = if explicit {
                    "SAME, VALID or EXPLICIT"
                } else {
                    "SAME or VALID"
                };
                Err(node_error(
                    node,
                    Status::invalid_argument(format!("unknown padding `{other}`; use {known}")),
                ))
            }
        }
    }
}

/// One spatial dimension of a windowed op: sizes, stride, dilation and the padding it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowDim {
    /// The input's size along this dimension.
    pub input: usize,
    /// The window's (filter's) size, before dilation.
    pub window: usize,
    /// Steps between windows.
    pub stride: usize,
    /// Steps between the window's taps.
    pub dilation: usize,
    /// The output's size.
    pub output: usize,
    /// Padding before the first input entry.
    pub pad_before: usize,
    /// Padding after the last input entry.
    pub pad_after: usize,
}

impl WindowDim {
    /// Computes the output size and padding of one dimension, as TensorFlow's
    /// `GetWindowedOutputSizeVerbose` does; `explicit` is (before, after) for `EXPLICIT`.
    pub fn new(
        input: usize,
        window: usize,
        dilation: usize,
        stride: usize,
        padding: Padding,
        explicit: (usize, usize),
    ) -> Result<WindowDim> {
        if stride == 0 {
            return Err(Status::invalid_argument("Stride must be > 0, but got 0"));
        }
        if dilation == 0 {
            return Err(Status::invalid_argument(
                "Dilation rate must be >= 1, but got 0",
            ));
        }
        let (i, s) = (input as i64, stride as i64);
        let effective = (window as i64 - 1) * dilation as i64 + 1;
        let (output, before, after) = match padding {
            Padding::Valid => ((i - effective + s) / s, 0, 0),
            Padding::Explicit => {
                let (b, a) = (explicit.0 as i64, explicit.1 as i64);
                ((i + b + a - effective + s) / s, b, a)
            }
            Padding::Same => {
                let output = (i + s - 1) / s;
                let needed = ((output - 1) * s + effective - i).max(0);
                (output, needed / 2, needed - needed / 2)
            }
        };
        if output < 0 {
            return Err(Status::invalid_argument(format!(
                "Computed output size would be negative: {output} [input_size: {input}, \
                 effective_filter_size: {effective}, stride: {stride}]"
            )));
        }
        Ok(WindowDim {
            input,
            window,
            stride,
            dilation,
            output: output as usize,
            pad_before: before as usize,
            pad_after: after as usize,
        })
    }

    /// The input index of tap `k` of window `o`, or `None` where it falls in the padding.
    #[inline]
    pub fn tap(&self, o: usize, k: usize) -> Option<usize> {
        (o * self.stride + k * self.dilation)
            .checked_sub(self.pad_before)
            .filter(|&i| i < self.input)
    }
}

/// The attrs of a 2-D convolution (`Conv2D` and its two backprops), checked as TensorFlow's
/// `InitConv2DParameters` checks them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvAttrs {
    /// The layout of the input and output.
    pub format: DataFormat,
    /// Strides along (height, width).
    pub strides: [usize; 2],
    /// Dilations along (height, width).
    pub dilations: [usize; 2],
    /// The padding scheme.
    pub padding: Padding,
    /// (before, after) padding along (height, width), for `EXPLICIT`.
    pub explicit: [(usize, usize); 2],
}

impl ConvAttrs {
    /// Reads and checks a convolution node's attrs.
    pub fn of(node: &NodeDef) -> Result<ConvAttrs> {
        let format = DataFormat::of(node)?;
        let padding = Padding::of(node, true)?;
        let fail = |s: Status| node_error(node, s);
        let dilations = list_or(node, "dilations", &[1, 1, 1, 1])?;
        let strides = list_or(node, "strides", &[])?;
        if dilations.len() != 4 {
            return Err(fail(Status::invalid_argument(format!(
                "Sliding window dilations field must specify 4 dimensions, got {dilations:?}"
            ))));
        }
        if strides.len() != 4 {
            return Err(fail(Status::invalid_argument(format!(
                "Sliding window strides field must specify 4 dimensions, got {strides:?}"
            ))));
        }
        let [sn, sh, sw, sc] = format.nhwc(&strides);
        if sn != 1 || sc != 1 {
            return Err(fail(Status::unimplemented(format!(
                "Current implementation does not yet support strides in the batch and depth \
                 dimensions (strides {strides:?}, data_format {}); use 1 there",
                format.name()
            ))));
        }
        if sh <= 0 || sw <= 0 {
            return Err(fail(Status::invalid_argument(format!(
                "Row and column strides should be larger than 0 (strides {strides:?})"
            ))));
        }
        let [dn, dh, dw, dc] = format.nhwc(&dilations);
        if dn != 1 || dc != 1 {
            return Err(fail(Status::unimplemented(format!(
                "Current implementation does not yet support dilations in the batch and depth \
                 dimensions (dilations {dilations:?}, data_format {}); use 1 there",
                format.name()
            ))));
        }
        if dh <= 0 || dw <= 0 {
            return Err(fail(Status::invalid_argument(format!(
                "Dilated rates should be larger than 0 (dilations {dilations:?})"
            ))));
        }
        let explicit = explicit_paddings(node, format, padding)?;
        Ok(ConvAttrs {
            format,
            strides: [sh as usize, sw as usize],
            dilations: [dh as usize, dw as usize],
            padding,
            explicit,
        })
    }

    /// The geometry of a convolution of an input of (height, width) with a filter of
    /// (height, width).
    pub fn dims(&self, input: [usize; 2], filter: [usize; 2]) -> Result<[WindowDim; 2]> {
        let dim = |a: usize| {
            WindowDim::new(
                input[a],
                filter[a],
                self.dilations[a],
                self.strides[a],
                self.padding,
                self.explicit[a],
            )
        };
        Ok([dim(0)?, dim(1)?])
    }
}

/// The attrs of a 2-D pooling op (`MaxPool`, `AvgPool` and their gradients), checked as
/// TensorFlow's pooling kernels check them. `MaxPoolV2` takes `ksize` and `strides` as inputs
/// and builds these with [`PoolAttrs::from_lists`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolAttrs {
    /// The layout of the input and output.
    pub format: DataFormat,
    /// The window's (height, width).
    pub ksize: [usize; 2],
    /// Strides along (height, width).
    pub strides: [usize; 2],
    /// The padding scheme.
    pub padding: Padding,
    /// (before, after) padding along (height, width), for `EXPLICIT` (max pooling only).
    pub explicit: [(usize, usize); 2],
}

impl PoolAttrs {
    /// Reads and checks a pooling node's attrs (`ksize` and `strides` from its attrs).
    pub fn of(node: &NodeDef) -> Result<PoolAttrs> {
        let ksize = list_or(node, "ksize", &[])?;
        let strides = list_or(node, "strides", &[])?;
        Self::from_lists(node, &ksize, &strides)
    }

    /// Checks a pooling node's attrs with `ksize` and `strides` given (`MaxPoolV2`'s inputs).
    pub fn from_lists(node: &NodeDef, ksize: &[i64], strides: &[i64]) -> Result<PoolAttrs> {
        let format = DataFormat::of(node)?;
        let explicit_allowed = node.op.starts_with("MaxPool") && !node.op.ends_with("V2");
        let padding = Padding::of(node, explicit_allowed)?;
        let fail = |s: Status| node_error(node, s);
        if ksize.len() != 4 {
            return Err(fail(Status::invalid_argument(format!(
                "Sliding window ksize field must specify 4 dimensions, got {ksize:?}"
            ))));
        }
        if strides.len() != 4 {
            return Err(fail(Status::invalid_argument(format!(
                "Sliding window stride field must specify 4 dimensions, got {strides:?}"
            ))));
        }
        if ksize.iter().any(|&k| k <= 0) {
            let shown: Vec<String> = ksize.iter().map(i64::to_string).collect();
            return Err(fail(Status::invalid_argument(format!(
                "Sliding window ksize must be positive. The specified or inferred ksize is: {}",
                shown.join(",")
            ))));
        }
        if strides.iter().any(|&s| s <= 0) {
            return Err(fail(Status::invalid_argument(format!(
                "Sliding window strides must be positive, got {strides:?}"
            ))));
        }
        let [kn, kh, kw, kc] = format.nhwc(ksize);
        let [sn, sh, sw, sc] = format.nhwc(strides);
        if kn != 1 || sn != 1 {
            return Err(fail(Status::unimplemented(format!(
                "Pooling is not yet supported on the batch dimension (ksize {ksize:?}, strides \
                 {strides:?}); use 1 there"
            ))));
        }
        if kc != 1 || sc != 1 {
            return Err(fail(Status::unimplemented(format!(
                "tessera pools over height and width only, not across depth (ksize {ksize:?}, \
                 strides {strides:?}, data_format {}); use 1 in the channel dimension",
                format.name()
            ))));
        }
        let explicit = explicit_paddings(node, format, padding)?;
        Ok(PoolAttrs {
            format,
            ksize: [kh as usize, kw as usize],
            strides: [sh as usize, sw as usize],
            padding,
            explicit,
        })
    }

    /// The geometry of pooling an input of (height, width).
    pub fn dims(&self, input: [usize; 2]) -> Result<[WindowDim; 2]> {
        let dim = |a: usize| {
            WindowDim::new(
                input[a],
                self.ksize[a],
                1,
                self.strides[a],
                self.padding,
                self.explicit[a],
            )
        };
        Ok([dim(0)?, dim(1)?])
    }
}

/// Reads an int list attr, or `default` when absent.
fn list_or(node: &NodeDef, name: &str, default: &[i64]) -> Result<Vec<i64>> {
    match attr::get(node, name) {
        None => Ok(default.to_vec()),
        Some(_) => attr::int_list(node, name),
    }
}

/// Reads and checks `explicit_paddings` (TensorFlow's `CheckValidPadding`); returns the
/// (before, after) padding of height and width.
fn explicit_paddings(
    node: &NodeDef,
    format: DataFormat,
    padding: Padding,
) -> Result<[(usize, usize); 2]> {
    let values = list_or(node, "explicit_paddings", &[])?;
    let fail = |m: String| node_error(node, Status::invalid_argument(m));
    if padding != Padding::Explicit {
        if !values.is_empty() {
            return Err(fail(format!(
                "explicit_paddings attribute must be empty if the padding attribute is not \
                 EXPLICIT (got {values:?})"
            )));
        }
        return Ok([(0, 0); 2]);
    }
    if values.len() != 8 {
        return Err(fail(format!(
            "explicit_paddings attribute must contain 8 values, but got: {}",
            values.len()
        )));
    }
    if values.iter().any(|&v| v < 0) {
        return Err(fail(format!(
            "All elements of explicit_paddings must be nonnegative (got {values:?})"
        )));
    }
    let pairs: Vec<(usize, usize)> = values
        .chunks(2)
        .map(|p| (p[0] as usize, p[1] as usize))
        .collect();
    let [n, h, w, c] = format.nhwc(&pairs);
    if n != (0, 0) || c != (0, 0) {
        return Err(fail(format!(
            "Nonzero explicit padding in the batch or depth dimensions is not supported (got \
             {values:?}, data_format {})",
            format.name()
        )));
    }
    Ok([h, w])
}

/// Puts the node in front of a status's message, as kernels and shape functions name it.
pub fn node_error(node: &NodeDef, status: Status) -> Status {
    status.context(format!("node `{}` (op {})", node.name, node.op))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_pads_the_odd_pixel_after() {
        let d = WindowDim::new(5, 2, 1, 2, Padding::Same, (0, 0)).unwrap();
        assert_eq!((d.output, d.pad_before, d.pad_after), (3, 0, 1));
        let d = WindowDim::new(7, 3, 2, 1, Padding::Same, (0, 0)).unwrap();
        assert_eq!((d.output, d.pad_before, d.pad_after), (7, 2, 2));
    }

    #[test]
    fn valid_truncates_toward_zero_like_tensorflow() {
        assert_eq!(
            WindowDim::new(5, 7, 1, 2, Padding::Valid, (0, 0))
                .unwrap()
                .output,
            0
        );
        let err = WindowDim::new(5, 7, 1, 1, Padding::Valid, (0, 0)).unwrap_err();
        assert!(err.message().contains("would be negative: -1"), "{err}");
    }

    #[test]
    fn taps_skip_the_padding() {
        let d = WindowDim::new(4, 3, 1, 1, Padding::Same, (0, 0)).unwrap();
        assert_eq!(d.tap(0, 0), None);
        assert_eq!(d.tap(0, 1), Some(0));
        assert_eq!(d.tap(3, 2), None);
    }
}
