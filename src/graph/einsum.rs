//! Einsum equations as TensorFlow 2.21 reads them (`einsum_op_util.cc`, `einsum_op_impl.h`):
//! the parse that the `Einsum` kernel, its shape function and its gradient share, and the
//! implicit form (`"ij,jk"`) that `tf.einsum` completes in Python before it builds the op.
//!
//! An equation is `in0[,in1]->out`. A subscript is a sequence of labels, each one character,
//! where `.` starts an ellipsis and TensorFlow skips the two characters after it (so `i..j`
//! reads as `i...`). A label repeated in an input reads that input's diagonal; a label
//! repeated in the output writes one (zeros elsewhere). The dimensions under an ellipsis
//! broadcast against the other input's, aligned on the right, and must appear in the output
//! through its own ellipsis.

use std::collections::BTreeMap;

/// One label of a subscript.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Label {
    /// A named axis.
    Named(u8),
    /// `...`: the broadcast dimensions.
    Ellipsis,
}

/// A parsed equation: the labels of each input and of the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Equation {
    pub inputs: Vec<Vec<Label>>,
    pub output: Vec<Label>,
}

/// TensorFlow's `MapToLabels`: a `.` is an ellipsis and the two characters after it are
/// skipped, whatever they are.
fn labels(subscript: &str) -> Vec<Label> {
    let bytes = subscript.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'.' {
            out.push(Label::Ellipsis);
            i += 3;
        } else {
            out.push(Label::Named(bytes[i]));
            i += 1;
        }
    }
    out
}

impl Equation {
    /// Parses `equation`; the error is TensorFlow's message (INVALID_ARGUMENT in the kernel).
    pub fn parse(equation: &str) -> Result<Equation, String> {
        let parts: Vec<&str> = equation.split("->").collect();
        let [inputs, output] = parts[..] else {
            return Err(format!(
                "Expecting exactly one '->' in einsum equation: {equation}"
            ));
        };
        let inputs: Vec<&str> = inputs.split(',').collect();
        if inputs.len() != 1 && inputs.len() != 2 {
            return Err(format!(
                "Expecting 1 or 2 input subscripts in equation '{equation}' but got: {}",
                inputs.len()
            ));
        }
        Ok(Equation {
            inputs: inputs.into_iter().map(labels).collect(),
            output: labels(output),
        })
    }

    /// The explicit form of `equation` as `tf.einsum` builds it: unchanged when it has
    /// `->`; else the output is `...` (when an input has one) and then the labels that
    /// appear once among the inputs, in alphabetical order.
    pub fn explicit(equation: &str) -> String {
        let equation: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
        if equation.contains("->") {
            return equation;
        }
        let mut counts: BTreeMap<char, usize> = BTreeMap::new();
        for c in equation.chars().filter(|c| c.is_alphabetic()) {
            *counts.entry(c).or_default() += 1;
        }
        let once: String = counts
            .into_iter()
            .filter(|&(_, n)| n == 1)
            .map(|(c, _)| c)
            .collect();
        let ellipsis = if equation.contains("...") { "..." } else { "" };
        format!("{equation}->{ellipsis}{once}")
    }

    /// Whether a subscript has an ellipsis.
    pub fn has_ellipsis(labels: &[Label]) -> bool {
        labels.contains(&Label::Ellipsis)
    }
}

/// Writes a subscript back as text.
pub fn subscript(labels: &[Label]) -> String {
    labels
        .iter()
        .map(|l| match l {
            Label::Named(c) => (*c as char).to_string(),
            Label::Ellipsis => "...".to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equations_parse_as_tensorflow_reads_them() {
        let e = Equation::parse("ab...,b->a...").unwrap();
        assert_eq!(e.inputs.len(), 2);
        assert_eq!(
            e.inputs[0],
            vec![Label::Named(b'a'), Label::Named(b'b'), Label::Ellipsis]
        );
        assert_eq!(subscript(&e.output), "a...");
        // `.` skips two characters whatever they are.
        assert_eq!(
            subscript(&Equation::parse("i..j->ij").unwrap().inputs[0]),
            "i..."
        );
        assert_eq!(
            Equation::parse("ij").unwrap_err(),
            "Expecting exactly one '->' in einsum equation: ij"
        );
        assert!(Equation::parse("i,j,k->ijk")
            .unwrap_err()
            .contains("Expecting 1 or 2 input subscripts"));
    }

    #[test]
    fn implicit_outputs_are_the_labels_seen_once_in_order() {
        assert_eq!(Equation::explicit("ij,jk"), "ij,jk->ik");
        assert_eq!(Equation::explicit("ba"), "ba->ab");
        assert_eq!(Equation::explicit("ii"), "ii->");
        assert_eq!(Equation::explicit("...ij,...jk"), "...ij,...jk->...ik");
        assert_eq!(Equation::explicit("ij -> ji"), "ij->ji");
    }
}
