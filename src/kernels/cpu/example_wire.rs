//! A serialized `tf.train.Example` read as TensorFlow's fast parser reads it
//! (`example_proto_fast_parsing.cc`), rather than decoded whole: the features' map entries
//! are found first, and only the lists of the features a parse asks for are read. So an
//! Example is refused where TensorFlow refuses it (a map entry without its key and value, a
//! group, a truncated length) and accepted where it is accepted (a corrupt list under a key
//! nobody asks for, fields it does not know, several Examples concatenated).

/// The value lists of one feature.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Values {
    Bytes(Vec<bytes::Bytes>),
    Float(Vec<f32>),
    Int64(Vec<i64>),
}

/// The kind of a feature's list, named as TensorFlow's messages name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Bytes,
    Float,
    Int64,
}

impl Kind {
    /// `DataTypeString`: `string`, `float`, `int64`.
    pub fn dtype_name(self) -> &'static str {
        match self {
            Kind::Bytes => "string",
            Kind::Float => "float",
            Kind::Int64 => "int64",
        }
    }

    /// The list's name in the "Number of ... values" messages: `bytes`, `float`, `int64`.
    pub fn list_name(self) -> &'static str {
        match self {
            Kind::Bytes => "bytes",
            Kind::Float => "float",
            Kind::Int64 => "int64",
        }
    }
}

/// A protobuf reader over `buf[pos..end]`.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader {
            buf,
            pos: 0,
            end: buf.len(),
        }
    }

    fn at_end(&self) -> bool {
        self.pos >= self.end
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            if self.at_end() {
                return None;
            }
            let b = self.buf[self.pos];
            self.pos += 1;
            if shift < 64 {
                v |= u64::from(b & 0x7f) << shift;
            }
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn varint32(&mut self) -> Option<usize> {
        self.varint().map(|v| v as u32 as usize)
    }

    /// Consumes the one-byte tag `tag` when it comes next.
    fn expect(&mut self, tag: u8) -> bool {
        if !self.at_end() && self.buf[self.pos] == tag {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn peek(&self) -> Option<u8> {
        (!self.at_end()).then(|| self.buf[self.pos])
    }

    fn raw(&mut self, n: usize) -> Option<&'a [u8]> {
        let to = self.pos.checked_add(n).filter(|&to| to <= self.end)?;
        let s = &self.buf[self.pos..to];
        self.pos = to;
        Some(s)
    }

    /// A length-delimited payload.
    fn delimited(&mut self) -> Option<&'a [u8]> {
        let n = self.varint32()?;
        self.raw(n)
    }

    /// A reader for the next `n` bytes (fewer where the buffer ends first, as protobuf's
    /// `PushLimit` allows), moving this one past them.
    fn limited(&mut self, n: usize) -> Reader<'a> {
        let end = self.pos.saturating_add(n).min(self.end);
        let sub = Reader {
            buf: self.buf,
            pos: self.pos,
            end,
        };
        self.pos = end;
        sub
    }

    /// TensorFlow's `SkipExtraneousTag`.
    fn skip_field(&mut self) -> bool {
        let Some(tag) = self.varint32() else {
            return false;
        };
        match tag & 7 {
            0 => self.varint().is_some(),
            1 => self.raw(8).is_some(),
            2 => match self.varint32() {
                Some(n) => {
                    self.pos = self.pos.saturating_add(n).min(self.end);
                    true
                }
                None => false,
            },
            5 => self.raw(4).is_some(),
            _ => false,
        }
    }
}

/// The features of a serialized Example, in the order they come, each a key and its
/// unparsed `Feature`; `None` when TensorFlow could not parse it.
pub(super) fn features(serialized: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let mut r = Reader::new(serialized);
    let mut out = Vec::new();
    while !r.at_end() {
        if !r.expect(0x0a) {
            if !r.skip_field() {
                return None;
            }
            continue;
        }
        let n = r.varint32()?;
        let mut features = r.limited(n);
        while !features.at_end() {
            if !features.expect(0x0a) {
                return None;
            }
            let n = features.varint32()?;
            let mut entry = features.limited(n);
            let (mut key, mut value) = (None, None);
            for _ in 0..2 {
                match entry.varint32()? {
                    0x0a => key = Some(entry.delimited()?),
                    0x12 => value = Some(entry.delimited()?),
                    _ => return None,
                }
            }
            if !entry.at_end() {
                return None;
            }
            out.push((key.unwrap_or_default(), value.unwrap_or_default()));
        }
    }
    Some(out)
}

/// The kind of a serialized `Feature`: `Ok(None)` when it holds no list (an empty feature,
/// which counts as missing), `Err` for a kind TensorFlow does not know.
pub(super) fn kind(feature: &[u8]) -> std::result::Result<Option<Kind>, ()> {
    match feature.first() {
        None => Ok(None),
        Some(0x0a) => Ok(Some(Kind::Bytes)),
        Some(0x12) => Ok(Some(Kind::Float)),
        Some(0x1a) => Ok(Some(Kind::Int64)),
        Some(_) => Err(()),
    }
}

/// The values of a feature of a known kind; `None` when its list cannot be parsed.
pub(super) fn values(feature: &[u8], kind: Kind) -> Option<Values> {
    let mut r = Reader::new(feature.get(1..)?);
    let n = r.varint32()?;
    let mut list = r.limited(n);
    match kind {
        Kind::Bytes => {
            let mut out = Vec::new();
            while !list.at_end() {
                if !list.expect(0x0a) {
                    return None;
                }
                out.push(bytes::Bytes::copy_from_slice(list.delimited()?));
            }
            Some(Values::Bytes(out))
        }
        Kind::Float => {
            let mut out = Vec::new();
            match list.peek() {
                None => {}
                Some(0x0a) => {
                    list.pos += 1;
                    let n = list.varint32()?;
                    let packed = list.raw(n - n % 4)?;
                    out.extend(
                        packed
                            .chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                    );
                }
                Some(0x0d) => {
                    while !list.at_end() {
                        if !list.expect(0x0d) {
                            return None;
                        }
                        let c = list.raw(4)?;
                        out.push(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                    }
                }
                Some(_) => return None,
            }
            Some(Values::Float(out))
        }
        Kind::Int64 => {
            let mut out = Vec::new();
            match list.peek() {
                None => {}
                Some(0x0a) => {
                    list.pos += 1;
                    let n = list.varint32()?;
                    let mut packed = list.limited(n);
                    while !packed.at_end() {
                        out.push(packed.varint()? as i64);
                    }
                }
                Some(0x08) => {
                    while !list.at_end() {
                        if !list.expect(0x08) {
                            return None;
                        }
                        out.push(list.varint()? as i64);
                    }
                }
                Some(_) => return None,
            }
            Some(Values::Int64(out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{feature, Example, Feature, Features, FloatList, Int64List};
    use prost::Message;

    #[test]
    fn reads_what_prost_writes() {
        let mut map = std::collections::HashMap::new();
        map.insert(
            "w".to_string(),
            Feature {
                kind: Some(feature::Kind::FloatList(FloatList {
                    value: vec![1.5, -2.0],
                })),
            },
        );
        map.insert(
            "n".to_string(),
            Feature {
                kind: Some(feature::Kind::Int64List(Int64List {
                    value: vec![-1, 1 << 40],
                })),
            },
        );
        let bytes = Example {
            features: Some(Features { feature: map }),
        }
        .encode_to_vec();
        let found = features(&bytes).unwrap();
        assert_eq!(found.len(), 2);
        for (key, f) in found {
            let k = kind(f).unwrap().unwrap();
            let v = values(f, k).unwrap();
            match key {
                b"w" => assert_eq!(v, Values::Float(vec![1.5, -2.0])),
                _ => assert_eq!(v, Values::Int64(vec![-1, 1 << 40])),
            }
        }
        assert!(features(b"garbage!").is_none());
        assert_eq!(features(b"").unwrap(), vec![]);
    }
}
