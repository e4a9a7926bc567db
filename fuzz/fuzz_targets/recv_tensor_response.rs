//! Bytes of a RecvTensor answer over gRPC → the client side that gathers and parses it
//! (`wire::message::read_message`, the aligned gather of DATA frames with its content-offset
//! scan, then `RecvTensorResponse` decoding and the tensor conversion a `_Recv` makes). The
//! first byte picks how the rest is cut into DATA frames, so message headers and content
//! straddle frame boundaries as they do on the wire. Messages are bounded at 16 MiB: one
//! announcing more must be refused, never allocated.
#![no_main]

use bytes::Bytes;
use http_body::Frame;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tessera::proto::RecvTensorResponse;
use tessera::tensor::Tensor;

const MAX_BYTES: usize = 16 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let size = usize::from(cut % 64) + 1;
    let frames: Vec<Result<Frame<Bytes>, tonic::Status>> = rest
        .chunks(size)
        .map(|chunk| Ok(Frame::data(Bytes::copy_from_slice(chunk))))
        .collect();
    let body = http_body_util::StreamBody::new(futures::stream::iter(frames));
    let received = futures::executor::block_on(tessera::wire::message::read_message(
        body, MAX_BYTES,
    ));
    let Ok(received) = received else {
        return;
    };
    let Some(message) = received.message else {
        return;
    };
    assert!(message.len() <= MAX_BYTES, "a message past the limit was gathered");
    if let Ok(response) = RecvTensorResponse::decode(message) {
        if let Some(tensor) = &response.tensor {
            let _ = Tensor::from_proto(tensor);
        }
    }
});
