//! Bytes a peer sends back on the tensor channel → the client's reading of them
//! (`wire::channel::client::parse_answer`): the response head, the metadata and the content,
//! each bounded before it is allocated, then the tensor conversion a `_Recv` makes. The limit
//! is 16 MiB of content (the receiving device's budget in this run): an answer announcing more
//! must be refused, never allocated. The first 12 bytes are also read as a hello's answer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera::tensor::Tensor;
use tessera::wire::channel::{AnswerHead, ChannelLimit, ANSWER_HEAD_BYTES};

const ROOM: u64 = 16 << 20;

fuzz_target!(|data: &[u8]| {
    if let Ok(head) = <[u8; ANSWER_HEAD_BYTES]>::try_from(&data[..data.len().min(ANSWER_HEAD_BYTES)]) {
        let _ = AnswerHead::parse(&head);
    }
    let limit = ChannelLimit {
        max_message_bytes: 64 << 20,
        room: ROOM,
    };
    let Ok(response) = tessera::wire::channel::client::parse_answer(data, limit) else {
        return;
    };
    if let Some(tensor) = &response.tensor {
        assert!(tensor.tensor_content.len() as u64 <= ROOM, "content past the room was read");
        let _ = Tensor::from_proto(tensor);
    }
});
