//! TensorProto bytes → `Tensor::from_proto`, the conversion every feed, fetch, `Const` value
//! and RecvTensor answer goes through. A tensor that converts must survive a round trip
//! through both of tessera's encodings unchanged (checked up to a million elements: a tensor
//! near the 2 GiB limit and its encodings together would pass the fuzzer's memory limit).
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tessera::proto::TensorProto;
use tessera::tensor::Tensor;

/// The largest tensor whose round trip is checked.
const ROUND_TRIP_ELEMENTS: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(proto) = TensorProto::decode(data) else {
        return;
    };
    let Ok(tensor) = Tensor::from_proto(&proto) else {
        return;
    };
    if tensor.num_elements() > ROUND_TRIP_ELEMENTS {
        return;
    }
    for encoded in [tensor.to_proto(), tensor.to_proto_content()] {
        let back = Tensor::from_proto(&encoded).expect("a tensor's own proto converts back");
        assert!(back == tensor, "round trip changed the tensor");
    }
});
