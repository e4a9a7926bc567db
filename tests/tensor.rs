//! `Tensor` <-> `TensorProto` conversion: every dtype both ways, TensorFlow's broadcast of
//! repeated values, TensorFlow's string list encoding in `tensor_content`, zero-copy reads and
//! the errors a bad proto gets.
//!
//! Expected bytes are written out by hand (IEEE-754 little-endian, protobuf varints).

use bytes::Bytes;
use prost::Message;
use tessera::error::Code;
use tessera::proto::{self, DataType, ResourceHandleProto, TensorProto, TensorShapeProto};
use tessera::tensor::{DType, ResourceHandle, Tensor};

fn shape(dims: &[i64]) -> Option<TensorShapeProto> {
    Some(TensorShapeProto {
        dim: dims
            .iter()
            .map(|&size| proto::tensor_shape_proto::Dim {
                size,
                name: String::new(),
            })
            .collect(),
        unknown_rank: false,
    })
}

fn proto_of(dtype: DataType, dims: &[i64]) -> TensorProto {
    TensorProto {
        dtype: dtype as i32,
        tensor_shape: shape(dims),
        ..Default::default()
    }
}

fn err(proto: &TensorProto) -> tessera::error::Status {
    Tensor::from_proto(proto).expect_err("the proto is invalid")
}

fn handle(name: &str) -> ResourceHandle {
    ResourceHandle {
        device: "/job:ps/replica:0/task:0/device:CPU:0".into(),
        container: "".into(),
        name: name.into(),
        type_name: "Var".into(),
    }
}

// ---------------------------------------------------------------------------------------------
// tensor_content, every fixed-size dtype, both ways.

#[test]
fn fixed_size_content_both_ways() {
    // (dtype, dims, hand-written little-endian bytes, check of the decoded values)
    let float = [0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0]; // 1.0, -2.5
    let double = [0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0x04, 0xc0]; // 1.0, -2.5
    let int32 = [0x01, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff]; // 1, -2
    let int64 = [0xff; 8]; // -1
    let boolean = [1, 0, 1]; // true, false, true

    let t = Tensor::from_proto(&TensorProto {
        tensor_content: Bytes::copy_from_slice(&float),
        ..proto_of(DataType::DtFloat, &[2])
    })
    .unwrap();
    assert_eq!((t.dtype(), t.dims()), (DType::Float, &[2usize][..]));
    assert_eq!(t.values::<f32>().unwrap().as_ref(), &[1.0, -2.5]);
    assert_eq!(t.to_proto().tensor_content.as_ref(), &float);

    let t = Tensor::from_proto(&TensorProto {
        tensor_content: Bytes::copy_from_slice(&double),
        ..proto_of(DataType::DtDouble, &[1, 2])
    })
    .unwrap();
    assert_eq!(t.values::<f64>().unwrap().as_ref(), &[1.0, -2.5]);
    assert_eq!(t.to_proto().tensor_content.as_ref(), &double);

    let t = Tensor::from_proto(&TensorProto {
        tensor_content: Bytes::copy_from_slice(&int32),
        ..proto_of(DataType::DtInt32, &[2])
    })
    .unwrap();
    assert_eq!(t.values::<i32>().unwrap().as_ref(), &[1, -2]);
    assert_eq!(t.to_proto().tensor_content.as_ref(), &int32);

    let t = Tensor::from_proto(&TensorProto {
        tensor_content: Bytes::copy_from_slice(&int64),
        ..proto_of(DataType::DtInt64, &[])
    })
    .unwrap();
    assert_eq!(t.scalar_value::<i64>().unwrap(), -1);
    assert_eq!(t.to_proto().tensor_content.as_ref(), &int64);

    let t = Tensor::from_proto(&TensorProto {
        tensor_content: Bytes::copy_from_slice(&boolean),
        ..proto_of(DataType::DtBool, &[3])
    })
    .unwrap();
    assert_eq!(t.values::<bool>().unwrap().as_ref(), &[true, false, true]);
    assert_eq!(t.to_proto().tensor_content.as_ref(), &boolean);
}

#[test]
fn to_proto_writes_dtype_shape_and_content() {
    let t = Tensor::from_vec([2, 1], vec![7i32, -1]).unwrap();
    let p = t.to_proto();
    assert_eq!(p.dtype, DataType::DtInt32 as i32);
    assert_eq!(p.tensor_shape, shape(&[2, 1]));
    assert_eq!(
        p.tensor_content.as_ref(),
        &[7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]
    );
    assert!(p.int_val.is_empty() && p.version_number == 0);
    // Scalars carry an empty shape, as tf.make_tensor_proto writes them.
    assert_eq!(Tensor::scalar(1.0f64).to_proto().tensor_shape, shape(&[]));
    // The wire form: dtype 3 (field 1), shape [2,1] (field 2), 8 content bytes (field 4).
    assert_eq!(
        p.encode_to_vec(),
        [
            [0x08, 0x03].as_slice(),
            &[0x12, 0x08, 0x12, 0x02, 0x08, 0x02, 0x12, 0x02, 0x08, 0x01],
            &[0x22, 0x08, 7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
        ]
        .concat()
    );
}

#[test]
fn round_trip_every_dtype() {
    let tensors = [
        Tensor::from_vec([2, 2], vec![0.5f32, -1.0, f32::INFINITY, 3.0]).unwrap(),
        Tensor::from_vec([3], vec![1e300f64, -0.0, 2.0]).unwrap(),
        Tensor::from_vec([1, 3], vec![i32::MIN, 0, i32::MAX]).unwrap(),
        Tensor::scalar(i64::MIN),
        Tensor::from_vec([2], vec![false, true]).unwrap(),
        Tensor::from_strings(
            [3],
            vec!["a".into(), Bytes::new(), Bytes::from(vec![0u8, 255])],
        )
        .unwrap(),
        Tensor::from_resources([2], vec![handle("w1"), handle("b1")]).unwrap(),
        Tensor::zeros(DType::Float, [0, 4]).unwrap(),
        Tensor::from_strings([0], vec![]).unwrap(),
    ];
    for t in tensors {
        let back = Tensor::from_proto(&t.to_proto()).unwrap();
        assert_eq!(back, t, "to_proto of {t:?}");
        let back = Tensor::from_proto(&t.to_proto_content()).unwrap();
        assert_eq!(back, t, "to_proto_content of {t:?}");
        // Through the wire as well.
        let wire = TensorProto::decode(t.to_proto().encode_to_vec().as_slice()).unwrap();
        assert_eq!(Tensor::from_proto(&wire).unwrap(), t, "wire form of {t:?}");
    }
}

#[test]
fn strings_and_resources_use_their_typed_fields() {
    let t = Tensor::from_strings([2], vec!["ab".into(), "".into()]).unwrap();
    let p = t.to_proto();
    assert_eq!(p.dtype, DataType::DtString as i32);
    assert_eq!(p.string_val, [Bytes::from("ab"), Bytes::new()]);
    assert!(p.tensor_content.is_empty());

    let t = Tensor::resource(handle("w1"));
    let p = t.to_proto();
    assert_eq!(p.dtype, DataType::DtResource as i32);
    assert_eq!(
        p.resource_handle_val,
        [ResourceHandleProto {
            device: "/job:ps/replica:0/task:0/device:CPU:0".into(),
            container: "".into(),
            name: "w1".into(),
            hash_code: 0,
            maybe_type_name: "Var".into(),
            ..Default::default()
        }]
    );
}

// ---------------------------------------------------------------------------------------------
// Typed repeated fields and TensorFlow's broadcast.

#[test]
fn typed_fields_fill_with_the_last_value() {
    let p = TensorProto {
        float_val: vec![1.0, 2.0],
        ..proto_of(DataType::DtFloat, &[2, 2])
    };
    assert_eq!(
        Tensor::from_proto(&p)
            .unwrap()
            .values::<f32>()
            .unwrap()
            .as_ref(),
        &[1., 2., 2., 2.]
    );

    let p = TensorProto {
        double_val: vec![-3.0],
        ..proto_of(DataType::DtDouble, &[3])
    };
    assert_eq!(
        Tensor::from_proto(&p)
            .unwrap()
            .values::<f64>()
            .unwrap()
            .as_ref(),
        &[-3.0; 3]
    );

    let p = TensorProto {
        int_val: vec![4, 5, 6],
        ..proto_of(DataType::DtInt32, &[3])
    };
    assert_eq!(
        Tensor::from_proto(&p)
            .unwrap()
            .values::<i32>()
            .unwrap()
            .as_ref(),
        &[4, 5, 6]
    );

    let p = TensorProto {
        int64_val: vec![9],
        ..proto_of(DataType::DtInt64, &[2])
    };
    assert_eq!(
        Tensor::from_proto(&p)
            .unwrap()
            .values::<i64>()
            .unwrap()
            .as_ref(),
        &[9, 9]
    );

    let p = TensorProto {
        bool_val: vec![false, true],
        ..proto_of(DataType::DtBool, &[3])
    };
    assert_eq!(
        Tensor::from_proto(&p)
            .unwrap()
            .values::<bool>()
            .unwrap()
            .as_ref(),
        &[false, true, true]
    );

    let p = TensorProto {
        string_val: vec!["x".into()],
        ..proto_of(DataType::DtString, &[2])
    };
    assert_eq!(
        Tensor::from_proto(&p).unwrap().strings().unwrap(),
        &[Bytes::from("x"), "x".into()]
    );

    let p = TensorProto {
        resource_handle_val: vec![handle("v").to_proto()],
        ..proto_of(DataType::DtResource, &[2])
    };
    assert_eq!(
        Tensor::from_proto(&p).unwrap().resources().unwrap(),
        &[handle("v"), handle("v")]
    );
}

#[test]
fn no_values_give_zeros() {
    let t = Tensor::from_proto(&proto_of(DataType::DtFloat, &[3])).unwrap();
    assert_eq!(t.values::<f32>().unwrap().as_ref(), &[0.0; 3]);
    let t = Tensor::from_proto(&proto_of(DataType::DtBool, &[2])).unwrap();
    assert_eq!(t.values::<bool>().unwrap().as_ref(), &[false, false]);
    let t = Tensor::from_proto(&proto_of(DataType::DtString, &[2])).unwrap();
    assert_eq!(t.strings().unwrap(), &[Bytes::new(), Bytes::new()]);
    // No shape at all is a scalar.
    let t = Tensor::from_proto(&TensorProto {
        dtype: DataType::DtInt64 as i32,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        (t.dims(), t.scalar_value::<i64>().unwrap()),
        (&[] as &[usize], 0)
    );
    // A zero-element tensor needs no values; TensorFlow writes an empty tensor_content.
    let t = Tensor::from_proto(&proto_of(DataType::DtFloat, &[0, 5])).unwrap();
    assert_eq!((t.dims(), t.num_elements()), (&[0usize, 5][..], 0));
}

#[test]
fn reference_dtypes_read_as_their_base_type() {
    let p = TensorProto {
        float_val: vec![1.5],
        ..proto_of(DataType::DtFloatRef, &[])
    };
    let t = Tensor::from_proto(&p).unwrap();
    assert_eq!(
        (t.dtype(), t.scalar_value::<f32>().unwrap()),
        (DType::Float, 1.5)
    );
}

// ---------------------------------------------------------------------------------------------
// Errors.

#[test]
fn too_many_values_are_rejected() {
    let e = err(&TensorProto {
        float_val: vec![1.0, 2.0, 3.0],
        ..proto_of(DataType::DtFloat, &[2])
    });
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("float32") && e.message().contains("[2]"),
        "{e:?}"
    );
    assert!(e.message().contains("3 values"), "{e:?}");
    let e = err(&TensorProto {
        string_val: vec!["a".into(), "b".into()],
        ..proto_of(DataType::DtString, &[])
    });
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = err(&TensorProto {
        resource_handle_val: vec![handle("a").to_proto(); 2],
        ..proto_of(DataType::DtResource, &[1])
    });
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[test]
fn wrong_content_length_is_rejected() {
    let e = err(&TensorProto {
        tensor_content: Bytes::from_static(&[0; 7]),
        ..proto_of(DataType::DtInt32, &[2])
    });
    assert_eq!(e.code(), Code::InvalidArgument);
    for needle in ["int32", "[2]", "7 bytes", "8"] {
        assert!(e.message().contains(needle), "{needle} missing from {e:?}");
    }
    // Content for a zero-element tensor is wrong too.
    let e = err(&TensorProto {
        tensor_content: Bytes::from_static(&[0; 4]),
        ..proto_of(DataType::DtFloat, &[0])
    });
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[test]
fn bad_bool_byte_is_rejected() {
    let e = err(&TensorProto {
        tensor_content: Bytes::from_static(&[1, 2]),
        ..proto_of(DataType::DtBool, &[2])
    });
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("element 1"), "{e:?}");
}

#[test]
fn unsupported_and_missing_dtypes_are_rejected() {
    let e = err(&TensorProto {
        dcomplex_val: vec![1.0, 0.0],
        ..proto_of(DataType::DtComplex128, &[1])
    });
    assert_eq!(e.code(), Code::Unimplemented);
    assert!(e.message().contains("DT_COMPLEX128"), "{e:?}");
    // float16 is read: its 16 bits in half_val (1 is the smallest subnormal).
    let t = Tensor::from_proto(&TensorProto {
        half_val: vec![1],
        ..proto_of(DataType::DtHalf, &[1])
    })
    .unwrap();
    assert_eq!(t.values::<tessera::tensor::f16>().unwrap()[0].to_bits(), 1);
    let e = err(&TensorProto {
        dtype: 0,
        ..Default::default()
    });
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = err(&TensorProto {
        dtype: 12345,
        ..Default::default()
    });
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[test]
fn values_in_the_wrong_field_are_rejected() {
    // TensorFlow would silently read zeros here.
    let e = err(&TensorProto {
        int_val: vec![1],
        ..proto_of(DataType::DtFloat, &[1])
    });
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("int_val") && e.message().contains("float_val"),
        "{e:?}"
    );
    // Both content and values: ambiguous.
    let e = err(&TensorProto {
        float_val: vec![1.0],
        tensor_content: Bytes::from_static(&[0; 4]),
        ..proto_of(DataType::DtFloat, &[1])
    });
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[test]
fn bad_shapes_are_rejected() {
    let e = err(&TensorProto {
        float_val: vec![1.0],
        ..proto_of(DataType::DtFloat, &[-1, 2])
    });
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = err(&TensorProto {
        float_val: vec![1.0],
        ..proto_of(DataType::DtFloat, &[-5])
    });
    assert_eq!(e.code(), Code::InvalidArgument);
    // An element count that overflows: an error, not a panic or an allocation.
    let huge = 1i64 << 40;
    let e = err(&TensorProto {
        float_val: vec![1.0],
        ..proto_of(DataType::DtFloat, &[huge, huge])
    });
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = err(&TensorProto {
        tensor_content: Bytes::from_static(&[1, b'a']),
        ..proto_of(DataType::DtString, &[huge, huge])
    });
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[test]
fn resource_tensors_need_a_handle() {
    let e = err(&proto_of(DataType::DtResource, &[]));
    assert_eq!(e.code(), Code::InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Zero copy.

#[test]
fn aligned_content_is_not_copied() {
    // A Vec<u64> gives 8-byte aligned storage for the content.
    let storage: Vec<u64> = vec![0x4000_0000_3f80_0000, 0x4080_0000_4040_0000]; // 1, 2, 3, 4
    let content = Bytes::from(
        storage
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    let p = TensorProto {
        tensor_content: content,
        ..proto_of(DataType::DtFloat, &[4])
    };
    let t = Tensor::from_proto(&p).unwrap();
    assert_eq!(t.bytes().unwrap().as_ptr(), p.tensor_content.as_ptr());
    let values = t.values::<f32>().unwrap();
    assert!(
        matches!(values, std::borrow::Cow::Borrowed(_)),
        "aligned values are borrowed"
    );
    assert_eq!(values.as_ref(), &[1.0, 2.0, 3.0, 4.0]);
    // And back: to_proto shares the same buffer.
    assert_eq!(
        t.to_proto().tensor_content.as_ptr(),
        p.tensor_content.as_ptr()
    );
}

#[test]
fn misaligned_content_still_reads() {
    let raw = Bytes::from(vec![0xaa, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40]);
    let content = raw.slice(1..);
    let p = TensorProto {
        tensor_content: content,
        ..proto_of(DataType::DtFloat, &[2])
    };
    let t = Tensor::from_proto(&p).unwrap();
    assert_eq!(t.values::<f32>().unwrap().as_ref(), &[1.0, 2.0]);
}

// ---------------------------------------------------------------------------------------------
// TensorFlow's string list encoding in tensor_content.

#[test]
fn string_content_is_decoded() {
    // Lengths 3, 0 and 200 (varint 0xc8 0x01), then the bytes.
    let long = vec![b'z'; 200];
    let content = [&[3u8, 0, 0xc8, 0x01][..], b"abc", &long].concat();
    let content = Bytes::from(content);
    let p = TensorProto {
        tensor_content: content.clone(),
        ..proto_of(DataType::DtString, &[3])
    };
    let t = Tensor::from_proto(&p).unwrap();
    let s = t.strings().unwrap();
    assert_eq!(s, &[Bytes::from("abc"), Bytes::new(), Bytes::from(long)]);
    // The strings are slices of the content, not copies.
    assert_eq!(s[0].as_ptr(), content[4..].as_ptr());
    // And the encoder writes exactly these bytes back.
    assert_eq!(t.to_proto_content().tensor_content, content);
}

#[test]
fn bad_string_content_is_rejected() {
    for (bytes, why) in [
        (&[5u8, b'a', b'b'][..], "lengths longer than the data"),
        (&[1u8, b'a', b'b'][..], "bytes left over"),
        (&[0x80u8][..], "a truncated varint"),
    ] {
        let p = TensorProto {
            tensor_content: Bytes::copy_from_slice(bytes),
            ..proto_of(DataType::DtString, &[])
        };
        assert_eq!(err(&p).code(), Code::InvalidArgument, "{why}");
    }
    // Two elements need at least two length bytes.
    let p = TensorProto {
        tensor_content: Bytes::from_static(&[0]),
        ..proto_of(DataType::DtString, &[2])
    };
    assert_eq!(err(&p).code(), Code::InvalidArgument);
}

#[test]
fn resource_content_is_decoded() {
    let encoded = handle("w1").to_proto().encode_to_vec();
    let content = [&[encoded.len() as u8][..], &encoded].concat();
    let p = TensorProto {
        tensor_content: Bytes::from(content),
        ..proto_of(DataType::DtResource, &[])
    };
    assert_eq!(
        Tensor::from_proto(&p).unwrap().resource_handle().unwrap(),
        &handle("w1")
    );
    let garbage = TensorProto {
        tensor_content: Bytes::from_static(&[2, 0xff, 0xff]),
        ..proto_of(DataType::DtResource, &[])
    };
    assert_eq!(err(&garbage).code(), Code::InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// NamedTensorProto.

#[test]
fn named_tensors() {
    let t = Tensor::from_vec([2], vec![1i64, 2]).unwrap();
    let named = t.to_named_proto("y:0");
    assert_eq!(named.name, "y:0");
    assert_eq!(
        Tensor::from_named_proto(&named).unwrap(),
        ("y:0".to_string(), t)
    );
    let e = Tensor::from_named_proto(&proto::NamedTensorProto {
        name: "x:0".into(),
        tensor: None,
    })
    .unwrap_err();
    assert!(e.message().contains("x:0"), "{e:?}");
    let bad = proto::NamedTensorProto {
        name: "x:0".into(),
        tensor: Some(TensorProto {
            int64_val: vec![1, 2, 3],
            ..proto_of(DataType::DtInt64, &[2])
        }),
    };
    let e = Tensor::from_named_proto(&bad).unwrap_err();
    assert!(e.message().contains("x:0"), "{e:?}");
}

#[test]
fn a_broadcast_proto_counts_what_it_expands_to_and_past_2_gib_is_not_decoded() {
    use tessera::proto::{tensor_shape_proto, TensorProto, TensorShapeProto};
    let broadcast = |dims: &[i64]| TensorProto {
        dtype: DType::Float.to_proto() as i32,
        tensor_shape: Some(TensorShapeProto {
            dim: dims
                .iter()
                .map(|&size| tensor_shape_proto::Dim {
                    size,
                    name: String::new(),
                })
                .collect(),
            unknown_rank: false,
        }),
        float_val: vec![1.0],
        ..Default::default()
    };
    // A few bytes on the wire, 24 GiB in memory.
    let huge = broadcast(&[1 << 31, 3]);
    assert_eq!(tessera::tensor::declared_bytes(&huge), 24 << 30);
    let err = Tensor::from_proto(&huge).unwrap_err();
    assert_eq!(err.code(), tessera::Code::ResourceExhausted);
    assert!(
        err.message()
            .contains("the most a TensorProto may describe"),
        "{err}"
    );
    // Small ones count their elements; an overflowing count counts its encoding and fails
    // to decode as INVALID_ARGUMENT.
    assert_eq!(tessera::tensor::declared_bytes(&broadcast(&[2, 3])), 24);
    let absurd = broadcast(&[1 << 62, 1 << 62]);
    assert!(tessera::tensor::declared_bytes(&absurd) < 100);
    assert_eq!(
        Tensor::from_proto(&absurd).unwrap_err().code(),
        tessera::Code::InvalidArgument
    );
}
