//! Slices of partitioned variables, as TensorFlow's checkpoints store them: the
//! `shape_and_slice` strings of `SaveV2`/`RestoreV2` (`"10 4 0,5:-"`: full shape `[10, 4]`,
//! rows 0..5, every column), the [`TensorSlice`] they name, the index key a stored slice is
//! filed under, and the copy of one slice's overlap into another.
//!
//! A slice has one extent per axis: `start,length`, or `-` for the whole axis. TensorFlow keeps
//! the two spellings apart (`0,10` on an axis of 10 is not `-`), in equality and in the key, so
//! [`TensorSlice`] keeps them apart too.
//!
//! A bundle files a slice of tensor `name` under TensorFlow's `EncodeTensorNameSlice` key,
//! built with its `OrderedCode` encoding:
//!
//! ```text
//! NumIncreasing(0) | String(name) | NumIncreasing(rank) | per axis: SignedNumIncreasing(start),
//!                                                                   SignedNumIncreasing(length)
//! ```
//!
//! where a whole axis is start 0, length -1. Every such key starts with byte 0, so slices sort
//! after the header (key `""`) and before every tensor name.

use std::fmt;
use std::ops::Range;

use crate::error::{Result, Status};
use crate::proto::tensor_slice_proto::{extent::HasLength, Extent};
use crate::proto::TensorSliceProto;
use crate::tensor::Shape;

/// TensorFlow's `kFullExtent`: the length of an axis taken whole.
const FULL_EXTENT: i64 = -1;

/// A box of a tensor: per axis a start and a length, or the whole axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorSlice {
    starts: Vec<i64>,
    lengths: Vec<i64>,
}

impl TensorSlice {
    /// The whole of a rank-`rank` tensor (`-` on every axis).
    pub fn full(rank: usize) -> Self {
        Self {
            starts: vec![0; rank],
            lengths: vec![FULL_EXTENT; rank],
        }
    }

    /// A slice of explicit `(start, length)` extents.
    pub fn from_extents(extents: &[(usize, usize)]) -> Self {
        Self {
            starts: extents.iter().map(|&(s, _)| s as i64).collect(),
            lengths: extents.iter().map(|&(_, l)| l as i64).collect(),
        }
    }

    /// Parses TensorFlow's slice string: extents joined by `:`, each `start,length` (start
    /// at least 0, length at least 1) or `-`.
    pub fn parse(text: &str) -> Result<Self> {
        let mut slice = Self::full(0);
        for item in text.split(':').filter(|s| !s.is_empty()) {
            let (start, length) = if item == "-" {
                (0, FULL_EXTENT)
            } else {
                let pair: Vec<&str> = item.split(',').filter(|s| !s.is_empty()).collect();
                let parsed = match pair.as_slice() {
                    [s, l] => s.parse::<i64>().ok().zip(l.parse::<i64>().ok()),
                    _ => None,
                };
                let Some((start, length)) = parsed else {
                    return Err(Status::invalid_argument(format!(
                        "Expected a pair of numbers or '-' but got '{item}': string = {text}; \
                         write each axis as start,length or -"
                    )));
                };
                if start < 0 || length <= 0 || start.checked_add(length).is_none() {
                    return Err(Status::invalid_argument(format!(
                        "Expected non-negative start and positive length but got start = \
                         {start}, length = {length}: string = {text}"
                    )));
                }
                (start, length)
            };
            slice.starts.push(start);
            slice.lengths.push(length);
        }
        Ok(slice)
    }

    /// Reads a slice stored in a bundle entry; a malformed extent is DATA_LOSS.
    pub fn from_proto(proto: &TensorSliceProto) -> Result<Self> {
        let mut slice = Self::full(0);
        for e in &proto.extent {
            let length = match e.has_length {
                Some(HasLength::Length(l)) => l,
                None => FULL_EXTENT,
            };
            let whole = e.start == 0 && length == FULL_EXTENT;
            if !whole && (e.start < 0 || length <= 0 || e.start.checked_add(length).is_none()) {
                return Err(Status::data_loss(format!(
                    "stored slice extent start {} length {length} is malformed",
                    e.start
                )));
            }
            slice.starts.push(e.start);
            slice.lengths.push(length);
        }
        Ok(slice)
    }

    /// The proto a bundle entry lists: a whole axis as an empty extent.
    pub fn to_proto(&self) -> TensorSliceProto {
        let extent = (0..self.rank())
            .map(|d| {
                if self.is_full_at(d) {
                    Extent::default()
                } else {
                    Extent {
                        start: self.starts[d],
                        has_length: Some(HasLength::Length(self.lengths[d])),
                    }
                }
            })
            .collect();
        TensorSliceProto { extent }
    }

    /// Returns the number of axes.
    pub fn rank(&self) -> usize {
        self.starts.len()
    }

    /// Whether axis `d` is taken whole (`-`).
    pub fn is_full_at(&self, d: usize) -> bool {
        self.lengths[d] == FULL_EXTENT && self.starts[d] == 0
    }

    /// Whether every axis is `-`.
    pub fn is_full(&self) -> bool {
        (0..self.rank()).all(|d| self.is_full_at(d))
    }

    /// The index ranges this slice covers in a tensor of shape `full`, or INVALID_ARGUMENT
    /// when the ranks differ or an extent runs past its axis.
    pub fn ranges(&self, full: &[usize]) -> Result<Vec<Range<usize>>> {
        if full.len() != self.rank() {
            return Err(Status::invalid_argument(format!(
                "slice {self} has {} axes but the tensor's shape {} has {}",
                self.rank(),
                Shape::new(full.to_vec()),
                full.len()
            )));
        }
        (0..self.rank())
            .map(|d| {
                if self.lengths[d] == FULL_EXTENT {
                    return Ok(0..full[d]);
                }
                let (start, end) = (self.starts[d], self.starts[d] + self.lengths[d]);
                match (usize::try_from(start), usize::try_from(end)) {
                    (Ok(s), Ok(e)) if e <= full[d] => Ok(s..e),
                    _ => Err(Status::invalid_argument(format!(
                        "Extent in dimension {d} out of bounds: shape = {}, slice = {self}",
                        Shape::new(full.to_vec())
                    ))),
                }
            })
            .collect()
    }

    /// Whether this slice is all of a tensor of shape `full` (`-`, or start 0 and the whole
    /// length, on every axis); TensorFlow saves such a slice as a whole tensor.
    pub fn covers(&self, full: &[usize]) -> bool {
        self.ranges(full)
            .is_ok_and(|r| r.iter().zip(full).all(|(r, &d)| *r == (0..d)))
    }
}

impl fmt::Display for TensorSlice {
    /// TensorFlow's spelling: `0,5:-`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in 0..self.rank() {
            if d > 0 {
                f.write_str(":")?;
            }
            if self.is_full_at(d) {
                f.write_str("-")?;
            } else {
                write!(f, "{},{}", self.starts[d], self.lengths[d])?;
            }
        }
        Ok(())
    }
}

/// A `shape_and_slice` spec: the full variable's shape and the slice of it a tensor holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeAndSlice {
    /// The full variable's shape.
    pub full_shape: Shape,
    /// The slice of it.
    pub slice: TensorSlice,
}

impl ShapeAndSlice {
    /// Parses TensorFlow's spec: the full dims, then the slice string, separated by single
    /// spaces (`"10 4 0,5:-"`); the slice must fit the shape.
    pub fn parse(spec: &str) -> Result<Self> {
        let mut parts: Vec<&str> = spec.split(' ').collect();
        if parts.len() < 2 {
            return Err(Status::invalid_argument(format!(
                "Need least two elements in shape_and_slice specification: \"{spec}\"; write \
                 the full dims, then the slice (\"10 4 0,5:-\")"
            )));
        }
        let slice = TensorSlice::parse(parts.pop().unwrap_or_default())?;
        let dims = parts
            .iter()
            .map(|d| d.parse::<usize>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| {
                Status::invalid_argument(format!(
                    "Non numerical dimension in shape_and_slice: \"{spec}\"; the dims are \
                     non-negative integers separated by single spaces"
                ))
            })?;
        let spec = Self {
            full_shape: Shape::new(dims),
            slice,
        };
        spec.slice.ranges(spec.full_shape.dims())?;
        Ok(spec)
    }

    /// Returns the shape of the slice.
    pub fn slice_shape(&self) -> Shape {
        let ranges = self.ranges();
        Shape::new(ranges.iter().map(|r| r.len()).collect::<Vec<_>>())
    }

    /// Returns the index ranges of the slice (checked when parsed).
    pub fn ranges(&self) -> Vec<Range<usize>> {
        self.slice
            .ranges(self.full_shape.dims())
            .unwrap_or_else(|_| self.full_shape.dims().iter().map(|&d| 0..d).collect())
    }

    /// Whether the slice is the whole variable.
    pub fn is_whole(&self) -> bool {
        self.slice.covers(self.full_shape.dims())
    }
}

impl fmt::Display for ShapeAndSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in self.full_shape.dims() {
            write!(f, "{d} ")?;
        }
        write!(f, "{}", self.slice)
    }
}

/// The index key of slice `slice` of tensor `name` (TensorFlow's `EncodeTensorNameSlice`).
pub fn slice_key(name: &str, slice: &TensorSlice) -> Vec<u8> {
    let mut key = Vec::with_capacity(name.len() + 4 + 4 * slice.rank());
    ordered::write_num_increasing(&mut key, 0);
    ordered::write_string(&mut key, name.as_bytes());
    ordered::write_num_increasing(&mut key, slice.rank() as u64);
    for d in 0..slice.rank() {
        ordered::write_signed_num_increasing(&mut key, slice.starts[d]);
        ordered::write_signed_num_increasing(&mut key, slice.lengths[d]);
    }
    key
}

/// Decodes a slice key into the tensor name and the slice; `None` when `key` is not one.
pub fn decode_slice_key(key: &[u8]) -> Option<(Vec<u8>, TensorSlice)> {
    let mut src = key;
    if ordered::read_num_increasing(&mut src)? != 0 {
        return None;
    }
    let name = ordered::read_string(&mut src)?;
    let rank = ordered::read_num_increasing(&mut src)?;
    if rank == 0 || rank > 255 {
        return None;
    }
    let mut slice = TensorSlice::full(0);
    for _ in 0..rank {
        let start = ordered::read_signed_num_increasing(&mut src)?;
        let length = ordered::read_signed_num_increasing(&mut src)?;
        let (start, length) = if length >= 0 {
            (start, length)
        } else {
            (0, FULL_EXTENT)
        };
        slice.starts.push(start);
        slice.lengths.push(length);
    }
    src.is_empty().then_some((name, slice))
}

/// The overlap of two boxes, or `None` when they do not meet.
pub fn intersect(a: &[Range<usize>], b: &[Range<usize>]) -> Option<Vec<Range<usize>>> {
    a.iter()
        .zip(b)
        .map(|(a, b)| {
            let r = a.start.max(b.start)..a.end.min(b.end);
            (r.start < r.end).then_some(r)
        })
        .collect()
}

/// Copies where the boxes overlap: `src` holds box `src_box` of the full tensor and `dst`
/// holds `dst_box`, both row-major, each element `elem` consecutive items of `T` (bytes of a
/// fixed-size dtype, or 1 string).
pub fn copy_overlap<T: Clone>(
    src: &[T],
    src_box: &[Range<usize>],
    dst: &mut [T],
    dst_box: &[Range<usize>],
    elem: usize,
) {
    let Some(common) = intersect(src_box, dst_box) else {
        return;
    };
    if common.is_empty() {
        dst[..elem].clone_from_slice(&src[..elem]);
        return;
    }
    let strides = |b: &[Range<usize>]| {
        let mut s = vec![1usize; b.len()];
        for d in (0..b.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * b[d + 1].len();
        }
        s
    };
    let (src_strides, dst_strides) = (strides(src_box), strides(dst_box));
    let last = common.len() - 1;
    let run = common[last].len() * elem;
    // Walk every index of the overlap but the last axis, copying one row at a time.
    let mut index: Vec<usize> = common.iter().map(|r| r.start).collect();
    loop {
        let offset = |bx: &[Range<usize>], strides: &[usize]| -> usize {
            index
                .iter()
                .zip(bx)
                .zip(strides)
                .map(|((&i, r), &s)| (i - r.start) * s)
                .sum::<usize>()
                * elem
        };
        let (from, to) = (offset(src_box, &src_strides), offset(dst_box, &dst_strides));
        dst[to..to + run].clone_from_slice(&src[from..from + run]);
        let mut d = last;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < common[d].end {
                break;
            }
            index[d] = common[d].start;
        }
    }
}

/// TensorFlow's `OrderedCode`: byte strings whose order follows the order of the values.
mod ordered {
    /// Big-endian with leading zero bytes dropped, after one length byte.
    pub fn write_num_increasing(out: &mut Vec<u8>, value: u64) {
        let bytes = value.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push((8 - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }

    pub fn read_num_increasing(src: &mut &[u8]) -> Option<u64> {
        let (&len, rest) = src.split_first()?;
        let len = usize::from(len);
        if len > 8 || rest.len() < len {
            return None;
        }
        let value = rest[..len]
            .iter()
            .fold(0u64, |v, &b| (v << 8) | u64::from(b));
        *src = &rest[len..];
        Some(value)
    }

    /// The bytes with 0x00 written 0x00 0xff and 0xff written 0xff 0x00, then 0x00 0x01.
    pub fn write_string(out: &mut Vec<u8>, s: &[u8]) {
        for &b in s {
            match b {
                0x00 => out.extend_from_slice(&[0x00, 0xff]),
                0xff => out.extend_from_slice(&[0xff, 0x00]),
                b => out.push(b),
            }
        }
        out.extend_from_slice(&[0x00, 0x01]);
    }

    pub fn read_string(src: &mut &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut i = 0;
        while i + 1 < src.len() {
            match (src[i], src[i + 1]) {
                (0x00, 0x01) => {
                    *src = &src[i + 2..];
                    return Some(out);
                }
                (0x00, 0xff) => out.push(0x00),
                (0xff, 0x00) => out.push(0xff),
                (0x00 | 0xff, _) => return None,
                (b, _) => {
                    out.push(b);
                    i += 1;
                    continue;
                }
            }
            i += 2;
        }
        None
    }

    /// Per encoded length, the header bits of its first two bytes.
    const HEADER_BITS: [[u8; 2]; 11] = [
        [0, 0],
        [0x80, 0],
        [0xc0, 0],
        [0xe0, 0],
        [0xf0, 0],
        [0xf8, 0],
        [0xfc, 0],
        [0xfe, 0],
        [0xff, 0],
        [0xff, 0x80],
        [0xff, 0xc0],
    ];

    /// Per number of significant bits, the encoded length.
    const BITS_TO_LENGTH: [usize; 64] = [
        1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 5, 5,
        5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9,
        9, 9, 9, 10,
    ];

    /// A sign bit, as many length bits as bytes follow, a delimiter bit, then the value in
    /// two's complement, big-endian: 1 to 10 bytes.
    pub fn write_signed_num_increasing(out: &mut Vec<u8>, value: i64) {
        let x = if value < 0 { !value } else { value } as u64;
        if x < 64 {
            out.push(0x80 ^ value as u8);
            return;
        }
        let sign = if value < 0 { 0xff } else { 0x00 };
        let mut buf = [sign; 10];
        buf[2..].copy_from_slice(&value.to_be_bytes());
        let len = BITS_TO_LENGTH[(64 - x.leading_zeros()) as usize];
        let begin = buf.len() - len;
        buf[begin] ^= HEADER_BITS[len][0];
        buf[begin + 1] ^= HEADER_BITS[len][1];
        out.extend_from_slice(&buf[begin..]);
    }

    /// Per encoded length, the header bits that overlap the value and are cleared on reading.
    const LENGTH_TO_MASK: [u64; 11] = [
        0,
        0x80,
        0xc000,
        0xe0_0000,
        0xf000_0000,
        0xf8_0000_0000,
        0xfc00_0000_0000,
        0xfe_0000_0000_0000,
        0xff00_0000_0000_0000,
        0x8000_0000_0000_0000,
        0,
    ];

    pub fn read_signed_num_increasing(src: &mut &[u8]) -> Option<i64> {
        let first = *src.first()?;
        let mask: u64 = if first & 0x80 == 0 { !0 } else { 0 };
        let byte = |i: usize| src.get(i).map(|&b| b ^ mask as u8);
        let first = first ^ mask as u8;
        let (len, mut x) = if first != 0xff {
            let len = first.leading_ones() as usize;
            let bytes = src.get(..len)?;
            let x = bytes.iter().fold(mask, |x, &b| (x << 8) | u64::from(b));
            (len, x)
        } else {
            let second = byte(1)?;
            let len = match second {
                0..=0x7f => 8,
                0x80..=0xbf => 9,
                0xc0 if byte(2)? < 0x80 => 10,
                _ => return None,
            };
            let bytes = src.get(len - 8..len)?;
            let mut eight = [0u8; 8];
            eight.copy_from_slice(bytes);
            (len, u64::from_be_bytes(eight))
        };
        x ^= LENGTH_TO_MASK[len];
        *src = &src[len..];
        Some(x as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_numbers_round_trip_and_keep_their_order() {
        let values = [
            i64::MIN,
            -(1 << 40),
            -8193,
            -8192,
            -65,
            -64,
            -1,
            0,
            1,
            63,
            64,
            8191,
            8192,
            1 << 40,
            i64::MAX,
        ];
        let mut last: Option<Vec<u8>> = None;
        for v in values {
            let mut out = Vec::new();
            ordered::write_signed_num_increasing(&mut out, v);
            let mut src = out.as_slice();
            assert_eq!(
                ordered::read_signed_num_increasing(&mut src),
                Some(v),
                "{v}"
            );
            assert!(src.is_empty(), "{v}");
            if let Some(prev) = &last {
                assert!(prev < &out, "{v}");
            }
            last = Some(out);
        }
    }

    #[test]
    fn tensorflows_examples_encode_as_documented() {
        let mut out = Vec::new();
        ordered::write_signed_num_increasing(&mut out, 0x424242);
        assert_eq!(out, [0xf0, 0x42, 0x42, 0x42]);
        out.clear();
        ordered::write_signed_num_increasing(&mut out, -0x800);
        assert_eq!(out, [0x38, 0x00]);
    }

    #[test]
    fn a_key_decodes_to_its_name_and_slice() {
        let slice = TensorSlice::parse("4,3:-").unwrap();
        let key = slice_key("a\0b\u{ff}", &slice);
        assert_eq!(key[0], 0);
        let (name, back) = decode_slice_key(&key).unwrap();
        assert_eq!(name, "a\0b\u{ff}".as_bytes());
        assert_eq!(back, slice);
    }

    #[test]
    fn the_overlap_of_two_boxes_is_copied() {
        // Rows 1..3 of a 4x3 tensor into rows 2..4.
        let src: Vec<u32> = (0..6).collect();
        let mut dst = vec![99u32; 6];
        copy_overlap(&src, &[1..3, 0..3], &mut dst, &[2..4, 0..3], 1);
        assert_eq!(dst, [3, 4, 5, 99, 99, 99]);
    }
}
