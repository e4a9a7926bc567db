//! The handwritten digits built into tessera: the UCI optical recognition of handwritten
//! digits data set as scikit-learn ships it (`data/digits.csv.gz`, see `data/README.md` for
//! its source and licence), embedded in the binary so that the main job trains on real data
//! with nothing to download.
//!
//! 1797 examples of 64 features (an 8×8 image of pixel counts 0 to 16, row by row) and a digit
//! label 0 to 9. The features are scaled to `[0, 1]` (divided by 16), as `read_mnist` scales
//! MNIST's bytes, so the same learning rates train both.

use std::io::Read;

use super::csv::{parse_csv, CsvOptions};
use super::Dataset;
use crate::error::{Result, Status};

/// The gzipped CSV: 64 pixel counts and the label per line, no header.
const DIGITS_CSV_GZ: &[u8] = include_bytes!("../../data/digits.csv.gz");

/// Examples in the data set.
pub const EXAMPLES: usize = 1797;
/// Features per example (8×8 pixels).
pub const FEATURES: usize = 64;
/// The largest pixel count.
const MAX_PIXEL: f32 = 16.0;

/// The digits, features scaled to `[0, 1]`, in the file's order.
pub fn digits() -> Result<Dataset> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(DIGITS_CSV_GZ)
        .read_to_string(&mut text)
        .map_err(|e| Status::data_loss(format!("the built-in digits do not decompress: {e}")))?;
    let raw = parse_csv(&text, "data/digits.csv.gz", &CsvOptions::default())?;
    let features: Vec<f32> = (0..raw.len())
        .flat_map(|i| raw.features(i).iter().map(|p| p / MAX_PIXEL))
        .collect();
    Dataset::new(features, raw.labels().to_vec(), raw.num_features())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digits_are_1797_scaled_8x8_images_of_ten_classes() {
        let d = digits().unwrap();
        assert_eq!((d.len(), d.num_features()), (EXAMPLES, FEATURES));
        assert_eq!(d.num_classes(), 10);
        // scikit-learn's load_digits(): the first image is a 0 whose second row starts
        // 0, 0, 13, 15, 10, 15, 5, 0.
        assert_eq!(d.labels()[0], 0);
        let row: Vec<f32> = d.features(0)[8..16].iter().map(|p| p * MAX_PIXEL).collect();
        assert_eq!(row, [0.0, 0.0, 13.0, 15.0, 10.0, 15.0, 5.0, 0.0]);
        assert!((0..d.len()).all(|i| d.features(i).iter().all(|p| (0.0..=1.0).contains(p))));
        // Every digit has between 174 and 183 examples.
        for class in 0..10 {
            let n = d.labels().iter().filter(|&&l| l == class).count();
            assert!((174..=183).contains(&n), "{n} examples of {class}");
        }
    }
}
