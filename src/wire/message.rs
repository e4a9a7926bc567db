//! One gRPC message on an HTTP/2 stream, by hand: the RecvTensor response encoded as pieces
//! that share the tensor's buffer, a body that hands those pieces to hyper, and a reader that
//! gathers a received message into one buffer, placed so that `tensor_content` is aligned.
//!
//! ```text
//! gRPC message:   flag(0) │ u32 BE length │ protobuf bytes
//! RecvTensorResponse, as sent (the same bytes prost writes, in three pieces):
//!   [flag, length, 0x0a len(tensor), dtype, shape, version, 0x22 len(content)]  small, new
//!   [tensor_content]                                                            shared Bytes
//!   [TensorProto fields 5.., RecvTensorResponse fields 2..5]                     small, new
//! ```
//!
//! prost writes fields in field-number order, and `tensor_content` is field 4 of `TensorProto`
//! (fields 1-3 before it, everything else after), which is what makes the split possible. The
//! tests compare every piece boundary against prost's own encoding, so a change of the protos
//! that breaks this is caught.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
use prost::Message;
use tonic::codegen::http::HeaderMap;
use tonic::codegen::Body;

use super::pool;
use crate::proto::{RecvTensorResponse, TensorProto};

/// The gRPC message header: compressed flag (1 byte) and big-endian length (4 bytes).
pub const HEADER_BYTES: usize = 5;

/// Alignment of `tensor_content` in a received buffer: a cache line, enough for every dtype and
/// for vector loads, so kernels view the elements in place.
pub const CONTENT_ALIGN: usize = 64;

/// Field number of `RecvTensorResponse.tensor`.
const RESPONSE_TENSOR: u32 = 1;
/// Field number of `TensorProto.tensor_content`.
const TENSOR_CONTENT: u32 = 4;

/// Encodes `response` as one framed gRPC message in pieces: `tensor_content` travels as the
/// `Bytes` it already is, never copied. The concatenated pieces are exactly
/// `header ++ response.encode_to_vec()`.
///
/// Fails with RESOURCE_EXHAUSTED when the message exceeds `max_bytes` (gRPC's length field is
/// 32 bits; tessera's limit is protobuf's 2 GiB).
pub fn encode_recv_tensor_response(
    response: RecvTensorResponse,
    max_bytes: usize,
) -> Result<Vec<Bytes>, tonic::Status> {
    let RecvTensorResponse {
        tensor,
        is_dead,
        send_start_micros,
        transport_options,
        require_ack,
    } = response;
    // The response's other fields (2..5) all come after the tensor (1).
    let rest = RecvTensorResponse {
        tensor: None,
        is_dead,
        send_start_micros,
        transport_options,
        require_ack,
    }
    .encode_to_vec();
    let Some(mut tensor) = tensor else {
        return Ok(vec![framed(&[&rest], max_bytes)?]);
    };
    let content = std::mem::take(&mut tensor.tensor_content);
    // Fields 1-3 of TensorProto precede tensor_content; all others follow it.
    let head = TensorProto {
        dtype: std::mem::take(&mut tensor.dtype),
        tensor_shape: tensor.tensor_shape.take(),
        version_number: std::mem::take(&mut tensor.version_number),
        ..Default::default()
    };
    let tail = tensor;
    let content_field = if content.is_empty() {
        0
    } else {
        key_len(TENSOR_CONTENT) + encoded_len_varint(content.len() as u64) + content.len()
    };
    let tensor_len = head.encoded_len() + content_field + tail.encoded_len();
    let message_len =
        key_len(RESPONSE_TENSOR) + encoded_len_varint(tensor_len as u64) + tensor_len + rest.len();
    check_len(message_len, max_bytes)?;

    let mut first = BytesMut::with_capacity(HEADER_BYTES + 24 + head.encoded_len());
    first.put_u8(0);
    first.put_u32(message_len as u32);
    encode_key(RESPONSE_TENSOR, WireType::LengthDelimited, &mut first);
    encode_varint(tensor_len as u64, &mut first);
    first.put_slice(&head.encode_to_vec());
    if content.is_empty() {
        first.put_slice(&tail.encode_to_vec());
        first.put_slice(&rest);
        return Ok(vec![first.freeze()]);
    }
    encode_key(TENSOR_CONTENT, WireType::LengthDelimited, &mut first);
    encode_varint(content.len() as u64, &mut first);
    let mut last = BytesMut::with_capacity(tail.encoded_len() + rest.len());
    last.put_slice(&tail.encode_to_vec());
    last.put_slice(&rest);
    let mut pieces = vec![first.freeze(), content];
    if !last.is_empty() {
        pieces.push(last.freeze());
    }
    Ok(pieces)
}

/// One framed gRPC message holding the concatenation of `parts` (for small messages).
pub fn framed(parts: &[&[u8]], max_bytes: usize) -> Result<Bytes, tonic::Status> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    check_len(len, max_bytes)?;
    let mut buf = BytesMut::with_capacity(HEADER_BYTES + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    for part in parts {
        buf.put_slice(part);
    }
    Ok(buf.freeze())
}

fn check_len(len: usize, max_bytes: usize) -> Result<(), tonic::Status> {
    if len > max_bytes.min(u32::MAX as usize) {
        return Err(tonic::Status::resource_exhausted(format!(
            "a RecvTensor response of {len} bytes exceeds the gRPC message limit of {max_bytes} \
             bytes; split the tensor"
        )));
    }
    Ok(())
}

fn key_len(field: u32) -> usize {
    prost::encoding::key_len(field)
}

/// An HTTP/2 response body: the pieces of one framed message, then the gRPC trailers.
#[derive(Debug)]
pub struct MessageBody {
    pieces: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
}

impl MessageBody {
    /// A body sending `pieces` in order, then `trailers` (a response's gRPC status; requests
    /// have none).
    pub fn new(pieces: Vec<Bytes>, trailers: Option<HeaderMap>) -> Self {
        Self {
            pieces: pieces.into_iter().filter(|p| !p.is_empty()).collect(),
            trailers,
        }
    }
}

impl Body for MessageBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        if let Some(piece) = this.pieces.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.is_empty() && self.trailers.is_none()
    }

    // No exact size hint: hyper would turn it into a content-length header, which neither
    // tonic nor TensorFlow sends.
}

/// What [`read_message`] found on a stream: the message (if one came) and the trailers.
#[derive(Debug, Default)]
pub struct Received {
    /// The protobuf bytes of the first message, without the gRPC header.
    pub message: Option<Bytes>,
    /// The trailers, when the peer sent any.
    pub trailers: Option<HeaderMap>,
}

/// Reads `body` to its end, gathering its single gRPC message into one buffer.
///
/// The buffer is sized from the message header (one copy of each DATA frame, no regrowth),
/// comes from the receive [`pool`], and the message is placed so that a `tensor_content` whose
/// start is visible in the first frame lands on a [`CONTENT_ALIGN`] boundary. Fails with
/// RESOURCE_EXHAUSTED past `max_bytes`, INTERNAL for a compressed or truncated message or a
/// second message, and with the body's own status when the stream breaks.
pub async fn read_message<B>(body: B, max_bytes: usize) -> Result<Received, tonic::Status>
where
    B: Body<Data = Bytes>,
    B::Error: Into<tonic::Status>,
{
    let mut body = std::pin::pin!(body);
    let mut header = [0u8; HEADER_BYTES];
    let mut header_filled = 0;
    let mut buffer: Option<Gather> = None;
    let mut received = Received::default();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(Into::into)?;
        let mut data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    match &mut received.trailers {
                        Some(all) => all.extend(trailers),
                        None => received.trailers = Some(trailers),
                    }
                }
                continue;
            }
        };
        while !data.is_empty() {
            if let Some(gather) = &mut buffer {
                let take = gather.missing().min(data.len());
                gather.extend(&data.split_to(take));
                if gather.missing() == 0 && !data.is_empty() {
                    return Err(tonic::Status::internal(
                        "protocol error: a unary RecvTensor response carried more than one message",
                    ));
                }
                continue;
            }
            let take = (HEADER_BYTES - header_filled).min(data.len());
            header[header_filled..header_filled + take].copy_from_slice(&data.split_to(take));
            header_filled += take;
            if header_filled < HEADER_BYTES {
                continue;
            }
            if header[0] != 0 {
                return Err(tonic::Status::internal(format!(
                    "protocol error: received a message with compression flag {} but no \
                     compression was negotiated",
                    header[0]
                )));
            }
            let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            if len > max_bytes {
                return Err(tonic::Status::resource_exhausted(format!(
                    "a received message of {len} bytes exceeds the limit of {max_bytes} bytes"
                )));
            }
            buffer = Some(Gather::new(len, content_offset(&data)));
        }
    }
    match buffer {
        Some(gather) if gather.missing() == 0 => received.message = Some(gather.finish()),
        None if header_filled == 0 => {}
        _ => {
            return Err(tonic::Status::internal(
                "protocol error: the stream ended inside a message",
            ))
        }
    }
    Ok(received)
}

/// A message being gathered into a pooled buffer, at an offset chosen for alignment.
struct Gather {
    buf: pool::Buffer,
    start: usize,
    len: usize,
}

impl Gather {
    fn new(len: usize, content_offset: Option<usize>) -> Self {
        let mut buf = pool::take(len + CONTENT_ALIGN);
        let start = content_offset.map_or(0, |offset| {
            let at = buf.as_ptr() as usize + offset;
            (CONTENT_ALIGN - at % CONTENT_ALIGN) % CONTENT_ALIGN
        });
        buf.resize_to(start);
        Self { buf, start, len }
    }

    fn missing(&self) -> usize {
        self.start + self.len - self.buf.len()
    }

    fn extend(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    fn finish(self) -> Bytes {
        let (start, len) = (self.start, self.len);
        self.buf.freeze().slice(start..start + len)
    }
}

/// Where `tensor_content`'s bytes start within a RecvTensorResponse whose first bytes are
/// `prefix`, if the prefix reaches that far (it does for tessera's and TensorFlow's senders,
/// which both put the small fields first). Any parse trouble answers `None`: alignment is an
/// optimisation, the full decode judges the message.
pub fn content_offset(prefix: &[u8]) -> Option<usize> {
    // Outer fields in any order (TensorFlow writes send_start_micros before the tensor),
    // until the tensor; then its fields until tensor_content.
    let (mut at, tensor_end) = field(prefix, 0, usize::MAX, RESPONSE_TENSOR)?;
    loop {
        let key = varint(prefix, &mut at)?;
        if key == u64::from(TENSOR_CONTENT << 3 | 2) {
            varint(prefix, &mut at)?;
            return Some(at);
        }
        at = skip(prefix, at, key)?;
        if at >= tensor_end {
            return None;
        }
    }
}

/// Finds length-delimited field `wanted` among the fields in `bytes[at..end]`: the start and
/// end of its value.
fn field(bytes: &[u8], mut at: usize, end: usize, wanted: u32) -> Option<(usize, usize)> {
    while at < end.min(bytes.len()) {
        let key = varint(bytes, &mut at)?;
        if key == u64::from(wanted << 3 | 2) {
            let len = varint(bytes, &mut at)? as usize;
            return Some((at, at.checked_add(len)?));
        }
        at = skip(bytes, at, key)?;
    }
    None
}

/// The position after the value of a field whose key was just read, at `at`.
fn skip(bytes: &[u8], mut at: usize, key: u64) -> Option<usize> {
    match key & 7 {
        0 => {
            varint(bytes, &mut at)?;
            Some(at)
        }
        1 => at.checked_add(8),
        2 => {
            let len = varint(bytes, &mut at)? as usize;
            at.checked_add(len)
        }
        5 => at.checked_add(4),
        _ => None,
    }
}

/// Reads one varint at `*at`, advancing it; `None` when the prefix ends first or it overflows.
fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
#[path = "message_tests.rs"]
mod tests;
