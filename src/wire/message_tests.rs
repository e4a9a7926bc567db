//! Tests of hand framing against prost's own encoding, and of gathering received frames.

use bytes::Bytes;
use prost::Message;
use tonic::codegen::http::{HeaderMap, HeaderValue};
use tonic::Code;

use super::*;
use crate::proto::{tensor_shape_proto, DataType, TensorShapeProto};

const LIMIT: usize = i32::MAX as usize;

fn float_tensor(content: Bytes) -> TensorProto {
    TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: Some(TensorShapeProto {
            dim: vec![tensor_shape_proto::Dim {
                size: (content.len() / 4) as i64,
                name: String::new(),
            }],
            unknown_rank: false,
        }),
        tensor_content: content,
        ..Default::default()
    }
}

/// `header ++ prost's encoding`: what tonic sends for `response`.
fn tonic_bytes(response: &RecvTensorResponse) -> Vec<u8> {
    let body = response.encode_to_vec();
    let mut expected = vec![0u8];
    expected.extend_from_slice(&(body.len() as u32).to_be_bytes());
    expected.extend_from_slice(&body);
    expected
}

fn concat(pieces: &[Bytes]) -> Vec<u8> {
    pieces.iter().flat_map(|p| p.iter().copied()).collect()
}

/// Responses covering every field on both sides of `tensor_content`.
fn responses() -> Vec<RecvTensorResponse> {
    let content = Bytes::from((0..4000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    let mut every_field = float_tensor(content.clone());
    every_field.version_number = 3;
    every_field.string_val = vec![Bytes::from_static(b"after")];
    vec![
        RecvTensorResponse {
            tensor: Some(float_tensor(content.clone())),
            send_start_micros: 1_795_290_313_843_161,
            ..Default::default()
        },
        RecvTensorResponse {
            tensor: Some(every_field),
            is_dead: true,
            send_start_micros: -5,
            transport_options: Some(prost_types::Any {
                type_url: "type.googleapis.com/x".into(),
                value: vec![1, 2, 3],
            }),
            require_ack: true,
        },
        // A tensor without content (a scalar in float_val), an empty tensor, no tensor.
        RecvTensorResponse {
            tensor: Some(TensorProto {
                dtype: DataType::DtFloat as i32,
                float_val: vec![2.5],
                ..Default::default()
            }),
            ..Default::default()
        },
        RecvTensorResponse {
            tensor: Some(TensorProto::default()),
            is_dead: true,
            ..Default::default()
        },
        RecvTensorResponse {
            require_ack: true,
            ..Default::default()
        },
        // 200 KiB of content: a multi-byte length varint.
        RecvTensorResponse {
            tensor: Some(float_tensor(Bytes::from(vec![7u8; 200 << 10]))),
            ..Default::default()
        },
    ]
}

#[test]
fn pieces_concatenate_to_exactly_what_prost_and_tonic_send() {
    for response in responses() {
        let expected = tonic_bytes(&response);
        let pieces = encode_recv_tensor_response(response.clone(), LIMIT).unwrap();
        assert_eq!(concat(&pieces), expected, "{response:?}");
    }
}

#[test]
fn tensor_content_is_sent_from_the_tensors_own_buffer() {
    let content = Bytes::from(vec![9u8; 1 << 20]);
    let response = RecvTensorResponse {
        tensor: Some(float_tensor(content.clone())),
        send_start_micros: 12,
        ..Default::default()
    };
    let pieces = encode_recv_tensor_response(response, LIMIT).unwrap();
    // head, content, tail (send_start_micros): the middle one is the tensor's buffer.
    assert_eq!(pieces.len(), 3);
    assert_eq!(pieces[1].as_ptr(), content.as_ptr());
    assert_eq!(pieces[1].len(), content.len());
    // Small pieces around it: key, length, dtype, shape... and field 3 of the response.
    assert!(pieces[0].len() < 32, "{}", pieces[0].len());
    assert_eq!(&pieces[2][..], &[0x18, 12]);
}

#[test]
fn a_message_over_the_limit_is_refused_before_anything_is_sent() {
    let response = RecvTensorResponse {
        tensor: Some(float_tensor(Bytes::from(vec![0u8; 4096]))),
        ..Default::default()
    };
    let err = encode_recv_tensor_response(response, 4000).unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("4000"), "{err}");
}

#[test]
fn content_offset_points_at_the_content_bytes() {
    let content = Bytes::from(
        (0..4096u32)
            .map(|i| (i * 7 % 256) as u8)
            .collect::<Vec<_>>(),
    );
    let response = RecvTensorResponse {
        tensor: Some(TensorProto {
            version_number: 1,
            ..float_tensor(content.clone())
        }),
        ..Default::default()
    };
    let encoded = response.encode_to_vec();
    // Found independently: where the content's distinct 64-byte opening sits in the encoding.
    let expected = encoded
        .windows(64)
        .position(|w| w == &content[..64])
        .unwrap();
    assert_eq!(content_offset(&encoded[..40]), Some(expected));
    // A prefix that stops before the content field says nothing.
    assert_eq!(content_offset(&encoded[..3]), None);
    // A response whose tensor has no content, or no tensor: nothing to align.
    let empty = RecvTensorResponse {
        is_dead: true,
        ..Default::default()
    };
    assert_eq!(content_offset(&empty.encode_to_vec()), None);
}

/// A body delivering `bytes` in DATA frames of `chunk` bytes, then `trailers`.
fn body(bytes: &[u8], chunk: usize, trailers: Option<HeaderMap>) -> MessageBody {
    let pieces = bytes
        .chunks(chunk)
        .map(Bytes::copy_from_slice)
        .collect::<Vec<_>>();
    MessageBody::new(pieces, trailers)
}

fn ok_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    trailers
}

#[tokio::test]
async fn frames_of_any_size_gather_into_the_message_with_aligned_content() {
    for response in responses() {
        let wire = tonic_bytes(&response);
        for chunk in [1, 7, 4096, 1 << 20] {
            let received = read_message(body(&wire, chunk, Some(ok_trailers())), LIMIT)
                .await
                .unwrap();
            let message = received.message.unwrap();
            assert_eq!(&message[..], &wire[HEADER_BYTES..]);
            assert_eq!(received.trailers.unwrap()["grpc-status"], "0");
            let decoded = RecvTensorResponse::decode(message).unwrap();
            assert_eq!(decoded, response);
            let content = decoded.tensor.unwrap_or_default().tensor_content;
            // The content's start was in the first frame only when chunks are large enough.
            if !content.is_empty() && chunk >= 64 {
                assert_eq!(
                    content.as_ptr() as usize % CONTENT_ALIGN,
                    0,
                    "chunk {chunk}"
                );
            }
        }
    }
}

#[tokio::test]
async fn broken_streams_are_errors_not_short_messages() {
    let wire = tonic_bytes(&responses()[0]);
    // Cut inside the message.
    let err = read_message(body(&wire[..wire.len() - 1], 100, None), LIMIT)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(err.message().contains("ended inside a message"), "{err}");
    // Cut inside the header.
    let err = read_message(body(&wire[..3], 100, None), LIMIT)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    // Over the receiver's limit.
    let err = read_message(body(&wire, 100, None), 100).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("limit of 100 bytes"), "{err}");
    // Compressed, which was never negotiated.
    let mut compressed = wire.clone();
    compressed[0] = 1;
    let err = read_message(body(&compressed, 100, None), LIMIT)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(err.message().contains("compression flag 1"), "{err}");
    // Two messages on a unary stream.
    let twice = [wire.clone(), wire].concat();
    let err = read_message(body(&twice, 100, None), LIMIT)
        .await
        .unwrap_err();
    assert!(err.message().contains("more than one message"), "{err}");
}

#[tokio::test]
async fn an_empty_stream_has_no_message_but_keeps_its_trailers() {
    let received = read_message(body(&[], 1, Some(ok_trailers())), LIMIT)
        .await
        .unwrap();
    assert!(received.message.is_none());
    assert_eq!(received.trailers.unwrap()["grpc-status"], "0");
}
