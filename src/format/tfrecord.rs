//! TFRecord framing, as TensorFlow's `TFRecordWriter` writes it and TensorBoard and
//! `tf.data.TFRecordDataset` read it. Each record is
//!
//! ```text
//! u64 length (little-endian) | u32 masked CRC32C of those 8 bytes | data | u32 masked CRC32C of data
//! ```
//!
//! Uncompressed only; a reader meets a compressed file as a length CRC that does not match,
//! and says so.

use std::io::{self, Read, Write};

use super::masked_crc32c;
use crate::error::{Result, Status};

/// The bytes around each record's data: the length, its CRC and the data's CRC.
pub const FRAMING_BYTES: usize = 8 + 4 + 4;

/// Writes records to `W`.
pub struct RecordWriter<W: Write> {
    out: W,
}

impl<W: Write> RecordWriter<W> {
    /// A writer appending records to `out`.
    pub fn new(out: W) -> Self {
        Self { out }
    }

    /// Appends one record.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        let length = (data.len() as u64).to_le_bytes();
        let mut header = [0u8; 12];
        header[..8].copy_from_slice(&length);
        header[8..].copy_from_slice(&masked_crc32c(&length).to_le_bytes());
        self.out.write_all(&header)?;
        self.out.write_all(data)?;
        self.out.write_all(&masked_crc32c(data).to_le_bytes())
    }

    /// Flushes what was written to the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The underlying writer.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    /// Returns the underlying writer.
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Reads records from `R`, checking both CRCs of each.
pub struct RecordReader<R: Read> {
    input: R,
    /// Named in errors: the file's path, or what the records are.
    name: String,
    /// The offset of the next record.
    offset: u64,
    /// Records longer than this are refused before their bytes are allocated.
    max_record_bytes: u64,
}

impl<R: Read> RecordReader<R> {
    /// A reader of the records in `input`; `name` (a path) is named in errors. Records over 1
    /// GiB are refused as corrupt.
    pub fn new(input: R, name: impl Into<String>) -> Self {
        Self {
            input,
            name: name.into(),
            offset: 0,
            max_record_bytes: 1 << 30,
        }
    }

    /// The next record, `None` at a clean end of the input. A truncated record or a CRC that
    /// does not match is DATA_LOSS naming the input and the record's offset.
    pub fn next_record(&mut self) -> Result<Option<Vec<u8>>> {
        let mut header = [0u8; 12];
        match read_full(&mut self.input, &mut header) {
            Ok(0) => return Ok(None),
            Ok(12) => {}
            Ok(n) => {
                return Err(self.corrupt(format!("the file ends {n} bytes into a record's header")))
            }
            Err(e) => return Err(self.io(e)),
        }
        let length_bytes: [u8; 8] = header[..8].try_into().expect("8 bytes");
        let length_crc = u32::from_le_bytes(header[8..].try_into().expect("4 bytes"));
        if masked_crc32c(&length_bytes) != length_crc {
            return Err(self.corrupt(
                "the record length's checksum does not match (not a TFRecord file, or a \
                 compressed one: tessera reads uncompressed TFRecords)"
                    .into(),
            ));
        }
        let length = u64::from_le_bytes(length_bytes);
        if length > self.max_record_bytes {
            return Err(self.corrupt(format!(
                "a record of {length} bytes, over the {} bytes a record may have",
                self.max_record_bytes
            )));
        }
        let mut data = vec![0u8; length as usize];
        let mut crc = [0u8; 4];
        let complete = read_full(&mut self.input, &mut data)
            .and_then(|n| Ok(n + read_full(&mut self.input, &mut crc)?))
            .map_err(|e| self.io(e))?;
        if complete < data.len() + 4 {
            return Err(self.corrupt(format!("the file ends inside a record of {length} bytes")));
        }
        if masked_crc32c(&data) != u32::from_le_bytes(crc) {
            return Err(self.corrupt("the record's data checksum does not match".into()));
        }
        self.offset += FRAMING_BYTES as u64 + length;
        Ok(Some(data))
    }

    fn corrupt(&self, what: String) -> Status {
        Status::data_loss(format!(
            "{}: corrupt TFRecord at byte {}: {what}",
            self.name, self.offset
        ))
    }

    fn io(&self, e: io::Error) -> Status {
        Status::data_loss(format!(
            "{}: cannot read the TFRecord at byte {}: {e}",
            self.name, self.offset
        ))
    }
}

impl<R: Read> Iterator for RecordReader<R> {
    type Item = Result<Vec<u8>>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    fn records(data: &[&[u8]]) -> Vec<u8> {
        let mut writer = RecordWriter::new(Vec::new());
        for d in data {
            writer.write(d).unwrap();
        }
        writer.into_inner()
    }

    #[test]
    fn records_round_trip() {
        let bytes = records(&[b"first", b"", &[7u8; 1000]]);
        assert_eq!(bytes.len(), 3 * FRAMING_BYTES + 5 + 1000);
        let read: Vec<Vec<u8>> = RecordReader::new(&bytes[..], "mem")
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(read, vec![b"first".to_vec(), Vec::new(), vec![7u8; 1000]]);
    }

    #[test]
    fn framing_matches_tensorflow() {
        // TensorFlow's `RecordWriter::WriteRecord`: length, its masked CRC, data, the data's.
        let bytes = records(&[b"abc"]);
        assert_eq!(&bytes[..8], &3u64.to_le_bytes());
        assert_eq!(
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            masked_crc32c(&3u64.to_le_bytes())
        );
        assert_eq!(&bytes[12..15], b"abc");
        assert_eq!(
            u32::from_le_bytes(bytes[15..19].try_into().unwrap()),
            masked_crc32c(b"abc")
        );
    }

    #[test]
    fn corruption_and_truncation_are_data_loss_naming_the_offset() {
        let good = records(&[b"one", b"two"]);
        let mut flipped = good.clone();
        let second_data = FRAMING_BYTES + 3 + 12;
        flipped[second_data] ^= 1;
        let err = RecordReader::new(&flipped[..], "train.tfrecord")
            .collect::<Result<Vec<_>>>()
            .unwrap_err();
        assert_eq!(err.code(), Code::DataLoss);
        assert!(err.message().contains("train.tfrecord"), "{err}");
        assert!(err.message().contains("byte 19"), "{err}");
        assert!(err.message().contains("data checksum"), "{err}");

        let truncated = &good[..good.len() - 2];
        let err = RecordReader::new(truncated, "t")
            .collect::<Result<Vec<_>>>()
            .unwrap_err();
        assert!(err.message().contains("ends inside a record"), "{err}");

        let err = RecordReader::new(&b"not a tfrecord file"[..], "notes.txt")
            .collect::<Result<Vec<_>>>()
            .unwrap_err();
        assert!(err.message().contains("length's checksum"), "{err}");
    }
}
