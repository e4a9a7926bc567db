//! The protobuf codec of every generated gRPC client and server (wired in `build.rs`).
//!
//! It is tonic's prost codec with one difference: a message that does not parse is
//! INVALID_ARGUMENT, not INTERNAL. gRPC's status table files parse failures under INTERNAL,
//! but for a daemon on a shared cluster a truncated or mistyped request is the caller's bad
//! argument, and callers (and TensorFlow's retry logic) treat INTERNAL as "the server is
//! broken". The message keeps prost's description, which names the message type and field
//! path (`RunStepRequest.feed: NamedTensorProto.tensor: invalid wire type ...`).

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// A prost codec whose decode errors are INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct ProtoCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for ProtoCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for ProtoCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProtoDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProtoDecoder(ProstCodec::<T, U>::raw_decoder(BufferSettings::default()))
    }
}

/// Decodes with prost and reports a malformed message as INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct ProtoDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default> Decoder for ProtoDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            Status::invalid_argument(format!(
                "malformed {} message: {}; send a valid protobuf encoding",
                std::any::type_name::<U>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("protobuf"),
                status.message()
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
