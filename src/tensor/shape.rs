//! Shapes: [`Shape`] is fully known (a tensor's), [`PartialShape`] may have unknown dimensions
//! or an unknown rank (a graph edge's, before it runs).

use std::fmt;

use crate::error::{Result, Status};
use crate::proto::{tensor_shape_proto, TensorShapeProto};

/// The dimensions of a tensor, outermost first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// A shape with these dimensions.
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Self(dims.into())
    }

    /// The shape of a scalar.
    pub fn scalar() -> Self {
        Self(Vec::new())
    }

    /// Returns the dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Returns the number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Returns the number of elements (1 for a scalar).
    pub fn num_elements(&self) -> usize {
        self.0.iter().product()
    }

    /// Returns dimension `i`.
    pub fn dim(&self, i: usize) -> usize {
        self.0[i]
    }

    /// Returns TensorFlow's `TensorShapeProto`.
    pub fn to_proto(&self) -> TensorShapeProto {
        TensorShapeProto {
            dim: self
                .0
                .iter()
                .map(|&size| tensor_shape_proto::Dim {
                    size: size as i64,
                    name: String::new(),
                })
                .collect(),
            unknown_rank: false,
        }
    }

    /// Reads a `TensorShapeProto` that must be fully known and whose element count fits in a
    /// `usize` (so that [`Shape::num_elements`] cannot overflow on a peer's shape).
    pub fn from_proto(proto: &TensorShapeProto) -> Result<Self> {
        let partial = PartialShape::from_proto(proto)?;
        let shape = partial.to_shape().ok_or_else(|| {
            Status::invalid_argument(format!(
                "shape {partial} is not fully defined; a tensor needs every dimension"
            ))
        })?;
        if shape
            .0
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .is_none()
        {
            return Err(Status::invalid_argument(format!(
                "shape {shape} has more elements than fit in memory"
            )));
        }
        Ok(shape)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Self {
        Self(dims)
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Self {
        Self(dims.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Self(dims.to_vec())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// A shape known only in part: `None` for an unknown rank, `Some(None)` dims for unknown sizes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PartialShape(Option<Vec<Option<usize>>>);

impl PartialShape {
    /// A shape of unknown rank.
    pub fn unknown() -> Self {
        Self(None)
    }

    /// A shape of known rank with these (possibly unknown) dimensions.
    pub fn new(dims: impl Into<Vec<Option<usize>>>) -> Self {
        Self(Some(dims.into()))
    }

    /// A shape of known rank whose every dimension is unknown.
    pub fn unknown_dims(rank: usize) -> Self {
        Self(Some(vec![None; rank]))
    }

    /// Returns the dimensions, or `None` when the rank is unknown.
    pub fn dims(&self) -> Option<&[Option<usize>]> {
        self.0.as_deref()
    }

    /// Returns the rank, if known.
    pub fn rank(&self) -> Option<usize> {
        self.0.as_ref().map(Vec::len)
    }

    /// Whether every dimension is known.
    pub fn is_fully_defined(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|d| d.iter().all(Option::is_some))
    }

    /// Returns the full shape when every dimension is known.
    pub fn to_shape(&self) -> Option<Shape> {
        self.0
            .as_ref()?
            .iter()
            .copied()
            .collect::<Option<Vec<_>>>()
            .map(Shape)
    }

    /// Whether a tensor of shape `shape` fits this partial shape.
    pub fn is_compatible_with(&self, shape: &Shape) -> bool {
        match &self.0 {
            None => true,
            Some(dims) => {
                dims.len() == shape.rank()
                    && dims
                        .iter()
                        .zip(shape.dims())
                        .all(|(d, s)| d.is_none_or(|d| d == *s))
            }
        }
    }

    /// The shape that is both `self` and `other`: the known dimension wherever one of them
    /// knows it (TensorFlow's `PartialTensorShape::MergeWith`). INVALID_ARGUMENT when the
    /// ranks or two known dimensions differ.
    pub fn merge_with(&self, other: &PartialShape) -> Result<PartialShape> {
        let (Some(a), Some(b)) = (&self.0, &other.0) else {
            return Ok(if self.0.is_some() {
                self.clone()
            } else {
                other.clone()
            });
        };
        if a.len() != b.len() {
            return Err(Status::invalid_argument(format!(
                "Incompatible ranks during merge: {} vs. {}",
                a.len(),
                b.len()
            )));
        }
        let dims = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| match (x, y) {
                (Some(x), Some(y)) if x != y => None,
                (Some(x), _) | (_, Some(x)) => Some(Some(x)),
                (None, None) => Some(None),
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "Incompatible shapes during merge: {self} vs. {other}"
                ))
            })?;
        Ok(PartialShape(Some(dims)))
    }

    /// Whether some tensor shape fits both `self` and `other`.
    pub fn is_compatible_with_partial(&self, other: &PartialShape) -> bool {
        self.merge_with(other).is_ok()
    }

    /// Returns TensorFlow's `TensorShapeProto` (-1 for unknown dimensions).
    pub fn to_proto(&self) -> TensorShapeProto {
        match &self.0 {
            None => TensorShapeProto {
                dim: Vec::new(),
                unknown_rank: true,
            },
            Some(dims) => TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|d| tensor_shape_proto::Dim {
                        size: d.map_or(-1, |d| d as i64),
                        name: String::new(),
                    })
                    .collect(),
                unknown_rank: false,
            },
        }
    }

    /// Reads a `TensorShapeProto`; sizes below -1 are an error.
    pub fn from_proto(proto: &TensorShapeProto) -> Result<Self> {
        if proto.unknown_rank {
            return Ok(Self(None));
        }
        let dims = proto
            .dim
            .iter()
            .map(|d| match d.size {
                -1 => Ok(None),
                s if s >= 0 => Ok(Some(s as usize)),
                s => Err(Status::invalid_argument(format!(
                    "dimension size {s} is invalid; use -1 for an unknown dimension"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self(Some(dims)))
    }
}

impl From<&Shape> for PartialShape {
    fn from(shape: &Shape) -> Self {
        Self(Some(shape.dims().iter().map(|&d| Some(d)).collect()))
    }
}

impl From<Shape> for PartialShape {
    fn from(shape: Shape) -> Self {
        Self::from(&shape)
    }
}

impl fmt::Display for PartialShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("<unknown>"),
            Some(dims) => {
                f.write_str("[")?;
                for (i, d) in dims.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    match d {
                        Some(d) => write!(f, "{d}")?,
                        None => f.write_str("?")?,
                    }
                }
                f.write_str("]")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_shapes_print_and_match() {
        let p = PartialShape::new(vec![None, Some(64)]);
        assert_eq!(p.to_string(), "[?,64]");
        assert!(p.is_compatible_with(&Shape::new([8, 64])));
        assert!(!p.is_compatible_with(&Shape::new([8, 32])));
        assert!(!p.is_compatible_with(&Shape::new([64])));
        assert!(PartialShape::unknown().is_compatible_with(&Shape::scalar()));
        assert_eq!(PartialShape::from_proto(&p.to_proto()).unwrap(), p);
        assert_eq!(Shape::new([2, 3]).num_elements(), 6);
        assert_eq!(Shape::scalar().num_elements(), 1);
        assert!(Shape::from_proto(&p.to_proto()).is_err());
    }

    #[test]
    fn merging_partial_shapes_keeps_what_either_knows() {
        let a = PartialShape::new(vec![None, Some(3)]);
        let b = PartialShape::new(vec![Some(2), None]);
        assert_eq!(a.merge_with(&b).unwrap().to_string(), "[2,3]");
        assert_eq!(PartialShape::unknown().merge_with(&a).unwrap(), a);
        let err = a
            .merge_with(&PartialShape::new(vec![Some(2), Some(4)]))
            .unwrap_err();
        assert!(err.message().contains("[?,3] vs. [2,4]"), "{err}");
        assert!(!a.is_compatible_with_partial(&PartialShape::new(vec![None])));
    }
}
