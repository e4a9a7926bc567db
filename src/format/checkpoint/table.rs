//! The immutable sorted string table of a checkpoint's `.index` file: LevelDB's SSTable format,
//! which TensorFlow's `tensorflow/core/lib/io/table` reads and writes.
//!
//! ```text
//! [data block 0][trailer] … [data block n][trailer] [metaindex block][trailer]
//! [index block][trailer] [footer: metaindex handle, index handle, padding to 40 bytes, magic]
//! block   = entries (varint32 shared, varint32 non_shared, varint32 value_len, key delta, value)
//!           restart offsets (fixed32 each) then their count (fixed32)
//! trailer = compression type (1 byte, 0 = none) + masked CRC32C of block contents and type
//! ```
//!
//! Written here rather than with a crate: the LevelDB crates on crates.io either bind the C++
//! library (a heavy native build) or implement a whole database whose table module is not a
//! stable public API, and the format is small. TensorFlow writes its bundle indices without
//! compression, so this module writes uncompressed blocks and refuses compressed ones with
//! UNIMPLEMENTED. Index files are small (one entry per tensor), so a table is read whole into
//! memory and every block's checksum is verified on open.

use std::path::Path;

use crate::error::{Result, Status};
pub use crate::format::{mask_crc, unmask_crc};

/// The magic number closing every table (LevelDB's `kTableMagicNumber`).
pub const TABLE_MAGIC: u64 = 0xdb47_7524_8b80_fb57;
/// The footer: two block handles padded to 40 bytes, then the 8-byte magic number.
const FOOTER_LEN: usize = 48;
/// A block's trailer: one compression byte and a masked CRC32C.
const TRAILER_LEN: usize = 5;
/// Keys between restart points (LevelDB's and TensorFlow's default).
const RESTART_INTERVAL: usize = 16;
/// TensorFlow's `table::Options::block_size` (256 KiB).
pub const DEFAULT_BLOCK_SIZE: usize = 256 * 1024;
/// Appends `v` as a base-128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Decodes a varint at `*pos`, advancing it; `None` when truncated or longer than 10 bytes.
pub fn get_varint(data: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *data.get(*pos)?;
        *pos += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Where a block lies in the file (its size excludes the trailer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BlockHandle {
    offset: u64,
    size: u64,
}

impl BlockHandle {
    fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.offset);
        put_varint(out, self.size);
    }

    fn decode(data: &[u8], pos: &mut usize) -> Option<Self> {
        Some(Self {
            offset: get_varint(data, pos)?,
            size: get_varint(data, pos)?,
        })
    }
}

/// Builds one block: prefix-compressed entries with a restart point every 16 keys.
#[derive(Default)]
struct BlockBuilder {
    buf: Vec<u8>,
    restarts: Vec<u32>,
    since_restart: usize,
    last_key: Vec<u8>,
    entries: usize,
}

impl BlockBuilder {
    fn add(&mut self, key: &[u8], value: &[u8]) {
        let shared = if self.since_restart < RESTART_INTERVAL && self.entries > 0 {
            key.iter()
                .zip(&self.last_key)
                .take_while(|(a, b)| a == b)
                .count()
        } else {
            self.restarts.push(self.buf.len() as u32);
            self.since_restart = 0;
            0
        };
        put_varint(&mut self.buf, shared as u64);
        put_varint(&mut self.buf, (key.len() - shared) as u64);
        put_varint(&mut self.buf, value.len() as u64);
        self.buf.extend_from_slice(&key[shared..]);
        self.buf.extend_from_slice(value);
        self.last_key.clear();
        self.last_key.extend_from_slice(key);
        self.since_restart += 1;
        self.entries += 1;
    }

    /// The size the finished block would have.
    fn estimated_size(&self) -> usize {
        self.buf.len() + 4 * (self.restarts.len().max(1) + 1)
    }

    /// Returns the block contents and resets the builder.
    fn finish(&mut self) -> Vec<u8> {
        let mut restarts = std::mem::take(&mut self.restarts);
        if restarts.is_empty() {
            restarts.push(0);
        }
        let mut out = std::mem::take(&mut self.buf);
        for r in &restarts {
            out.extend_from_slice(&r.to_le_bytes());
        }
        out.extend_from_slice(&(restarts.len() as u32).to_le_bytes());
        self.since_restart = 0;
        self.entries = 0;
        self.last_key.clear();
        out
    }
}

/// Appends `contents` and its trailer (no compression) to `file`; returns its handle.
fn write_block(file: &mut Vec<u8>, contents: &[u8]) -> BlockHandle {
    let handle = BlockHandle {
        offset: file.len() as u64,
        size: contents.len() as u64,
    };
    file.extend_from_slice(contents);
    let crc = crc32c::crc32c_append(crc32c::crc32c(contents), &[0]);
    file.push(0);
    file.extend_from_slice(&mask_crc(crc).to_le_bytes());
    handle
}

/// Serializes `entries` (keys strictly increasing, bytewise) as a table whose data blocks hold
/// about `block_size` bytes each. Out-of-order or duplicate keys are INVALID_ARGUMENT.
pub fn build_table(entries: &[(Vec<u8>, Vec<u8>)], block_size: usize) -> Result<Vec<u8>> {
    let mut file = Vec::new();
    let mut data = BlockBuilder::default();
    let mut index = BlockBuilder::default();
    for (i, (key, value)) in entries.iter().enumerate() {
        if i > 0 && entries[i - 1].0 >= *key {
            return Err(Status::invalid_argument(format!(
                "table keys must be strictly increasing: {:?} comes after {:?}",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(&entries[i - 1].0)
            )));
        }
        data.add(key, value);
        if data.estimated_size() >= block_size {
            // The index key separates this block from the next: the shortest key ≥ this
            // block's last key and < the next key (LevelDB's FindShortestSeparator).
            let separator = match entries.get(i + 1) {
                Some((next, _)) => shortest_separator(key, next),
                None => short_successor(key),
            };
            flush_data_block(&mut file, &mut data, &mut index, &separator);
        }
    }
    if data.entries > 0 {
        let separator = short_successor(&data.last_key);
        flush_data_block(&mut file, &mut data, &mut index, &separator);
    }
    let metaindex = write_block(&mut file, &BlockBuilder::default().finish());
    let index_handle = write_block(&mut file, &index.finish());
    let mut footer = Vec::with_capacity(FOOTER_LEN);
    metaindex.encode(&mut footer);
    index_handle.encode(&mut footer);
    footer.resize(FOOTER_LEN - 8, 0);
    footer.extend_from_slice(&TABLE_MAGIC.to_le_bytes());
    file.extend_from_slice(&footer);
    Ok(file)
}

/// Writes the pending data block and its index entry under `index_key`.
fn flush_data_block(
    file: &mut Vec<u8>,
    data: &mut BlockBuilder,
    index: &mut BlockBuilder,
    index_key: &[u8],
) {
    let handle = write_block(file, &data.finish());
    let mut value = Vec::new();
    handle.encode(&mut value);
    index.add(index_key, &value);
}

/// LevelDB's bytewise `FindShortestSeparator`: a short key in `[start, limit)`, made by
/// bumping the first byte where they differ when that keeps it below `limit`. TensorFlow's
/// table builder uses it for index keys, so tessera's index files match TensorFlow's byte
/// for byte (readers would accept any separator).
fn shortest_separator(start: &[u8], limit: &[u8]) -> Vec<u8> {
    let common = start.iter().zip(limit).take_while(|(a, b)| a == b).count();
    if common < start.len() && common < limit.len() {
        let byte = start[common];
        if byte < 0xff && byte + 1 < limit[common] {
            let mut key = start[..=common].to_vec();
            key[common] += 1;
            return key;
        }
    }
    start.to_vec()
}

/// LevelDB's bytewise `FindShortSuccessor`: the first byte that is not 0xff, bumped, and
/// the key cut after it (a short key ≥ `key`), for the last block's index entry.
fn short_successor(key: &[u8]) -> Vec<u8> {
    match key.iter().position(|&b| b != 0xff) {
        Some(i) => {
            let mut k = key[..=i].to_vec();
            k[i] += 1;
            k
        }
        None => key.to_vec(),
    }
}

/// A table's entries: (key, value) in key order.
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// A table read whole: its entries in key order.
#[derive(Debug, Clone)]
pub struct Table {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Table {
    /// Reads and checks the table at `path`: NOT_FOUND when the file is missing, DATA_LOSS
    /// naming it when it is truncated, corrupt or fails a checksum.
    pub fn open(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| io_error(path, "read", &e))?;
        Self::parse(&bytes, path)
    }

    /// Parses the table in `file` (read from `path`, named in errors).
    pub fn parse(file: &[u8], path: &Path) -> Result<Self> {
        let corrupt = |what: &str| {
            Status::data_loss(format!(
                "checkpoint index {} is corrupt: {what}; the file is truncated or damaged, \
                 restore from another checkpoint",
                path.display()
            ))
        };
        if file.len() < FOOTER_LEN {
            return Err(corrupt(&format!(
                "{} bytes is shorter than a table footer ({FOOTER_LEN} bytes)",
                file.len()
            )));
        }
        let footer = &file[file.len() - FOOTER_LEN..];
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&footer[FOOTER_LEN - 8..]);
        if u64::from_le_bytes(magic) != TABLE_MAGIC {
            return Err(corrupt("bad magic number (not an SSTable)"));
        }
        let mut pos = 0;
        let _metaindex =
            BlockHandle::decode(footer, &mut pos).ok_or_else(|| corrupt("bad metaindex handle"))?;
        let index_handle =
            BlockHandle::decode(footer, &mut pos).ok_or_else(|| corrupt("bad index handle"))?;
        let body = &file[..file.len() - FOOTER_LEN];
        let index =
            read_block(body, index_handle).map_err(|e| corrupt(&format!("index block: {e}")))?;
        let mut entries = Vec::new();
        for (i, (_, handle)) in index.into_iter().enumerate() {
            let mut p = 0;
            let handle = BlockHandle::decode(&handle, &mut p)
                .ok_or_else(|| corrupt(&format!("bad handle of data block {i}")))?;
            let block =
                read_block(body, handle).map_err(|e| corrupt(&format!("data block {i}: {e}")))?;
            for (key, value) in block {
                if entries
                    .last()
                    .is_some_and(|(k, _): &(Vec<u8>, Vec<u8>)| *k >= key)
                {
                    return Err(corrupt("keys out of order"));
                }
                entries.push((key, value));
            }
        }
        Ok(Self { entries })
    }

    /// Returns the value of `key`, if present.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.entries
            .binary_search_by(|(k, _)| k.as_slice().cmp(key))
            .ok()
            .map(|i| self.entries[i].1.as_slice())
    }

    /// Returns the entries in key order.
    pub fn entries(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.entries
    }
}

/// Reads, checks and decodes the block at `handle`.
fn read_block(file: &[u8], handle: BlockHandle) -> std::result::Result<Entries, String> {
    let start = usize::try_from(handle.offset).map_err(|_| "offset too large")?;
    let size = usize::try_from(handle.size).map_err(|_| "size too large")?;
    let end = start
        .checked_add(size)
        .and_then(|e| e.checked_add(TRAILER_LEN))
        .filter(|&e| e <= file.len())
        .ok_or_else(|| format!("block at {start}+{size} runs past the end of the file"))?;
    let contents = &file[start..start + size];
    let kind = file[start + size];
    let mut stored = [0u8; 4];
    stored.copy_from_slice(&file[start + size + 1..end]);
    let actual = crc32c::crc32c_append(crc32c::crc32c(contents), &[kind]);
    if unmask_crc(u32::from_le_bytes(stored)) != actual {
        return Err(format!("checksum mismatch in block at offset {start}"));
    }
    if kind != 0 {
        return Err(format!(
            "block compressed with type {kind}; only uncompressed tables are read"
        ));
    }
    decode_block(contents)
}

/// Decodes the entries of a block's contents.
fn decode_block(contents: &[u8]) -> std::result::Result<Entries, String> {
    let n = contents.len();
    if n < 4 {
        return Err("block shorter than its restart count".into());
    }
    let num_restarts = u32::from_le_bytes([
        contents[n - 4],
        contents[n - 3],
        contents[n - 2],
        contents[n - 1],
    ]) as usize;
    let restarts_len = num_restarts
        .checked_mul(4)
        .and_then(|l| l.checked_add(4))
        .filter(|&l| l <= n)
        .ok_or("restart array larger than the block")?;
    let limit = n - restarts_len;
    let mut entries = Vec::new();
    let mut pos = 0;
    let mut key: Vec<u8> = Vec::new();
    while pos < limit {
        let data = &contents[..limit];
        let shared = get_varint(data, &mut pos).ok_or("truncated entry")? as usize;
        let non_shared = get_varint(data, &mut pos).ok_or("truncated entry")? as usize;
        let value_len = get_varint(data, &mut pos).ok_or("truncated entry")? as usize;
        if shared > key.len() {
            return Err("entry shares more bytes than the previous key has".into());
        }
        let key_end = pos
            .checked_add(non_shared)
            .filter(|&e| e <= limit)
            .ok_or("key runs past block")?;
        let value_end = key_end
            .checked_add(value_len)
            .filter(|&e| e <= limit)
            .ok_or("value runs past block")?;
        key.truncate(shared);
        key.extend_from_slice(&data[pos..key_end]);
        entries.push((key.clone(), data[key_end..value_end].to_vec()));
        pos = value_end;
    }
    Ok(entries)
}

/// Maps an I/O error on `path` onto TensorFlow's codes: a missing file is NOT_FOUND, anything
/// else while reading is DATA_LOSS, both naming the file.
pub(crate) fn io_error(path: &Path, action: &str, e: &std::io::Error) -> Status {
    match e.kind() {
        std::io::ErrorKind::NotFound => Status::not_found(format!(
            "checkpoint file {} not found ({action}: {e}); check the checkpoint prefix and that \
             every shard was written",
            path.display()
        )),
        std::io::ErrorKind::PermissionDenied => Status::permission_denied(format!(
            "cannot {action} checkpoint file {}: {e}",
            path.display()
        )),
        _ => Status::data_loss(format!(
            "cannot {action} checkpoint file {}: {e}",
            path.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_round_trips_and_matches_leveldb() {
        // LevelDB's crc32c_test: Mask is not the identity and Unmask inverts it.
        let crc = crc32c::crc32c(b"foo");
        assert_ne!(mask_crc(crc), crc);
        assert_eq!(unmask_crc(mask_crc(crc)), crc);
        // CRC32C("123456789") = 0xe3069283 (the standard check value).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn separators_are_leveldbs() {
        assert_eq!(shortest_separator(b"abcdef", b"abzzz"), b"abd");
        // Bumping 'c' would reach the limit's 'd': unchanged.
        assert_eq!(shortest_separator(b"abc", b"abd"), b"abc");
        // A prefix of the limit: unchanged.
        assert_eq!(shortest_separator(b"ab", b"abc"), b"ab");
        assert_eq!(short_successor(b"\xff\xffa"), b"\xff\xffb");
        assert_eq!(short_successor(b"w1/Adagrad"), b"x");
        assert_eq!(short_successor(b"\xff"), b"\xff");
    }

    #[test]
    fn empty_block_is_one_restart() {
        assert_eq!(
            BlockBuilder::default().finish(),
            vec![0, 0, 0, 0, 1, 0, 0, 0]
        );
    }
}
