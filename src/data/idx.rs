//! The IDX format of the MNIST files: a 4-byte magic number (two zero bytes, an element type
//! code, the number of dimensions), each dimension as a big-endian u32, then the elements in
//! row-major order. MNIST's images are `[n, 28, 28]` and its labels `[n]`, both unsigned
//! bytes (type code 0x08), which is the element type read and written here.
//!
//! A file shorter than its header promises is DATA_LOSS naming the file and both sizes (a
//! half-downloaded file is the usual cause); one that is not IDX at all (or still gzipped) is
//! INVALID_ARGUMENT.

use std::path::Path;

use super::Dataset;
use crate::error::{Result, Status};

/// The type code of unsigned bytes.
const U8: u8 = 0x08;

/// An IDX array of unsigned bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct IdxArray {
    /// The dimensions.
    pub dims: Vec<usize>,
    /// The elements, row-major.
    pub data: Vec<u8>,
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| read_error(path, &e))
}

/// Why `path` could not be read, with the code its I/O error maps to.
fn read_error(path: &Path, e: &std::io::Error) -> Status {
    let status = match e.kind() {
        std::io::ErrorKind::NotFound => Status::not_found,
        std::io::ErrorKind::PermissionDenied => Status::permission_denied,
        _ => Status::unavailable,
    };
    status(format!("cannot read IDX file {}: {e}", path.display()))
}

/// The dimensions an IDX file's header declares, read without its elements (whose count
/// [`read_idx`] checks).
pub fn read_idx_dims(path: impl AsRef<Path>) -> Result<Vec<usize>> {
    use std::io::Read;
    let path = path.as_ref();
    let mut head = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(4 + 4 * 255).read_to_end(&mut head))
        .map_err(|e| read_error(path, &e))?;
    parse_header(&head, &path.display().to_string()).map(|(dims, _)| dims)
}

/// Reads an IDX file of unsigned bytes.
pub fn read_idx(path: impl AsRef<Path>) -> Result<IdxArray> {
    let path = path.as_ref();
    parse_idx(&read_file(path)?, &path.display().to_string())
}

/// Parses IDX bytes; `file` names them in errors.
pub fn parse_idx(bytes: &[u8], file: &str) -> Result<IdxArray> {
    let (dims, header) = parse_header(bytes, file)?;
    let count = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| Status::invalid_argument(format!("{file}: dimensions {dims:?} overflow")))?;
    let have = bytes.len() - header;
    if have < count {
        return Err(Status::data_loss(format!(
            "{file} is truncated: its header declares dimensions {dims:?} ({count} bytes of \
             data), the file has {have}; download it again"
        )));
    }
    if have > count {
        return Err(Status::data_loss(format!(
            "{file} has {} bytes after the {count} its header (dimensions {dims:?}) declares",
            have - count
        )));
    }
    Ok(IdxArray {
        dims,
        data: bytes[header..].to_vec(),
    })
}

/// The dimensions and the header's length in bytes of IDX `bytes` (which may stop after the
/// header); `file` names them in errors.
fn parse_header(bytes: &[u8], file: &str) -> Result<(Vec<usize>, usize)> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return Err(Status::invalid_argument(format!(
            "{file} is gzip-compressed; decompress it (gunzip) before reading"
        )));
    }
    if bytes.len() < 4 {
        return Err(Status::data_loss(format!(
            "{file} is truncated: {} bytes, shorter than the 4-byte IDX magic number",
            bytes.len()
        )));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(Status::invalid_argument(format!(
            "{file} is not an IDX file: its magic number starts {:#04x} {:#04x}, not 0x00 0x00",
            bytes[0], bytes[1]
        )));
    }
    if bytes[2] != U8 {
        return Err(Status::unimplemented(format!(
            "{file} holds IDX element type {:#04x}; only unsigned bytes (0x08) are read",
            bytes[2]
        )));
    }
    let rank = bytes[3] as usize;
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(Status::data_loss(format!(
            "{file} is truncated: its header declares {rank} dimensions ({header} bytes), the \
             file has {} bytes",
            bytes.len()
        )));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    Ok((dims, header))
}

/// Encodes an array of unsigned bytes as IDX.
pub fn encode_idx(array: &IdxArray) -> Result<Vec<u8>> {
    let count: usize = array.dims.iter().product();
    if count != array.data.len() || array.dims.len() > 255 {
        return Err(Status::invalid_argument(format!(
            "IDX dimensions {:?} do not hold {} elements",
            array.dims,
            array.data.len()
        )));
    }
    let mut out = vec![0, 0, U8, array.dims.len() as u8];
    for &d in &array.dims {
        let d = u32::try_from(d).map_err(|_| {
            Status::invalid_argument(format!("IDX dimension {d} does not fit in 32 bits"))
        })?;
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(&array.data);
    Ok(out)
}

/// Writes an array of unsigned bytes as an IDX file.
pub fn write_idx(path: impl AsRef<Path>, array: &IdxArray) -> Result<()> {
    let path = path.as_ref();
    std::fs::write(path, encode_idx(array)?)
        .map_err(|e| Status::unavailable(format!("cannot write IDX file {}: {e}", path.display())))
}

/// Reads MNIST-style images (`[n, rows, cols]`, or `[n, d]`) and labels (`[n]`) into a data
/// set: pixels scaled to `[0, 1]`, each image flattened to `rows * cols` features.
pub fn read_mnist(images: impl AsRef<Path>, labels: impl AsRef<Path>) -> Result<Dataset> {
    let (images, labels) = (images.as_ref(), labels.as_ref());
    let x = read_idx(images)?;
    let y = read_idx(labels)?;
    if x.dims.len() < 2 {
        return Err(Status::invalid_argument(format!(
            "{}: images need at least 2 dimensions [n, ...], got {:?}",
            images.display(),
            x.dims
        )));
    }
    if y.dims.len() != 1 || y.dims[0] != x.dims[0] {
        return Err(Status::invalid_argument(format!(
            "{} has dimensions {:?} but {} holds {} images; the labels must be [{}]",
            labels.display(),
            y.dims,
            images.display(),
            x.dims[0],
            x.dims[0]
        )));
    }
    let d: usize = x.dims[1..].iter().product();
    let features = x.data.iter().map(|&p| p as f32 / 255.0).collect();
    let labels = y.data.iter().map(|&l| l as i64).collect();
    Dataset::new(features, labels, d)
}
