//! The checkpoint file formats: the LevelDB-format table of `.index` files (against a layout
//! worked out by hand from the format description), tensor bundles for every dtype (data
//! bytes as TensorFlow lays them out), corruption and missing files, and merging shards.

use std::path::Path;

use bytes::Bytes;
use prost::Message;
use tessera::error::Code;
use tessera::format::checkpoint::bundle::{
    data_filename, index_filename, merge_bundles, write_bundle, BundleReader,
};
use tessera::format::checkpoint::table::{build_table, Table, DEFAULT_BLOCK_SIZE, TABLE_MAGIC};
use tessera::proto::{BundleEntryProto, BundleHeaderProto};
use tessera::tensor::Tensor;

/// LevelDB's CRC mask, written out here from the format description (rotate right by 15,
/// add 0xa282ead8) rather than taken from the code under test.
fn mask(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn block_crc(contents: &[u8]) -> [u8; 4] {
    let mut with_type = contents.to_vec();
    with_type.push(0);
    mask(crc32c::crc32c(&with_type)).to_le_bytes()
}

#[test]
fn one_entry_table_has_leveldbs_exact_layout() {
    let file = build_table(&[(b"a".to_vec(), b"b".to_vec())], DEFAULT_BLOCK_SIZE).unwrap();
    // Data block: entry (shared 0, non-shared 1, value 1, "a", "b"), restart [0], count 1.
    let data = [0u8, 1, 1, b'a', b'b', 0, 0, 0, 0, 1, 0, 0, 0];
    // Metaindex block: empty (restart [0], count 1).
    let meta = [0u8, 0, 0, 0, 1, 0, 0, 0];
    // Index block: key "b" (LevelDB's short successor of the last key "a") → handle
    // (offset 0, size 13) as two varints.
    let index = [0u8, 1, 2, b'b', 0, 13, 0, 0, 0, 0, 1, 0, 0, 0];
    let mut want = Vec::new();
    for block in [&data[..], &meta[..], &index[..]] {
        want.extend_from_slice(block);
        want.push(0);
        want.extend_from_slice(&block_crc(block));
    }
    assert_eq!(want.len(), 18 + 13 + 19);
    // Footer: metaindex handle (18, 8), index handle (31, 14), zero padding to 40, magic.
    let mut footer = vec![18u8, 8, 31, 14];
    footer.resize(40, 0);
    footer.extend_from_slice(&0xdb47_7524_8b80_fb57u64.to_le_bytes());
    want.extend_from_slice(&footer);
    assert_eq!(file, want);
    assert_eq!(TABLE_MAGIC, 0xdb47_7524_8b80_fb57);
}

fn many_keys(n: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    // Shared prefixes exercise prefix compression; 16+ keys per block exercise restarts.
    let mut keys: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
        .map(|i| {
            (
                format!("layer{}/weights/part_{i:04}", i % 7).into_bytes(),
                format!("value-{i}-{}", "x".repeat(i % 50)).into_bytes(),
            )
        })
        .collect();
    keys.sort();
    keys.insert(0, (Vec::new(), b"header".to_vec()));
    keys
}

#[test]
fn table_round_trips_many_keys_over_many_blocks() {
    let entries = many_keys(1000);
    // Small blocks: many data blocks and a multi-restart index.
    let file = build_table(&entries, 512).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.index");
    std::fs::write(&path, &file).unwrap();
    let table = Table::open(&path).unwrap();
    assert_eq!(table.entries(), entries.as_slice());
    assert_eq!(table.get(b""), Some(&b"header"[..]));
    assert_eq!(table.get(&entries[500].0), Some(entries[500].1.as_slice()));
    assert_eq!(table.get(b"layer9"), None);
    // The index holds one entry per data block: about 1000 entries * ~50 bytes / 512.
    let footer = &file[file.len() - 48..];
    let (index_offset, index_size) = varint_pair(footer, 2);
    assert!(
        index_size > 16 * 10,
        "index block of {index_size} bytes at {index_offset}"
    );
}

/// Decodes the `n`th varint pair of a footer (1 = metaindex, 2 = index).
fn varint_pair(buf: &[u8], n: usize) -> (u64, u64) {
    let mut pos = 0;
    let mut read = || {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let b = buf[pos];
            pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                return v;
            }
        }
    };
    let mut pair = (read(), read());
    if n == 2 {
        pair = (read(), read());
    }
    pair
}

#[test]
fn unsorted_keys_are_refused() {
    let err = build_table(&[(b"b".to_vec(), vec![]), (b"a".to_vec(), vec![])], 4096).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[test]
fn corrupt_truncated_and_missing_tables_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = build_table(&many_keys(100), 256).unwrap();
    let path = dir.path().join("x.index");

    let mut flipped = file.clone();
    flipped[20] ^= 0x40;
    std::fs::write(&path, &flipped).unwrap();
    let err = Table::open(&path).unwrap_err();
    assert_eq!(err.code(), Code::DataLoss, "{err}");
    assert!(
        err.message().contains("x.index") && err.message().contains("checksum"),
        "{err}"
    );

    std::fs::write(&path, &file[..file.len() - 10]).unwrap();
    let err = Table::open(&path).unwrap_err();
    assert_eq!(err.code(), Code::DataLoss, "{err}");
    assert!(err.message().contains("x.index"), "{err}");

    std::fs::write(&path, &file[..30]).unwrap();
    assert_eq!(Table::open(&path).unwrap_err().code(), Code::DataLoss);

    let err = Table::open(&dir.path().join("missing.index")).unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("missing.index"), "{err}");
}

fn prefix(dir: &Path, name: &str) -> String {
    dir.join(name).to_string_lossy().into_owned()
}

fn every_dtype() -> Vec<(String, Tensor)> {
    vec![
        (
            "a/f32".into(),
            Tensor::from_vec(vec![2, 2], vec![1.5f32, -2.0, f32::MIN_POSITIVE, 3.25]).unwrap(),
        ),
        (
            "a/f64".into(),
            Tensor::from_vec(vec![3], vec![std::f64::consts::PI, -0.0, 1e300]).unwrap(),
        ),
        (
            "b/i32".into(),
            Tensor::from_vec(vec![2], vec![i32::MIN, 7]).unwrap(),
        ),
        ("b/i64".into(), Tensor::scalar(1_i64 << 40)),
        (
            "c/bool".into(),
            Tensor::from_vec(vec![3], vec![true, false, true]).unwrap(),
        ),
        (
            "d/str".into(),
            Tensor::from_strings(
                vec![3],
                vec![
                    Bytes::from("ab"),
                    Bytes::new(),
                    Bytes::from(vec![0xffu8; 200]),
                ],
            )
            .unwrap(),
        ),
        (
            "e/empty".into(),
            Tensor::from_vec(vec![0, 4], Vec::<f32>::new()).unwrap(),
        ),
    ]
}

#[test]
fn bundle_round_trips_every_dtype_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let p = prefix(dir.path(), "sub/model.ckpt-7");
    let tensors = every_dtype();
    write_bundle(&p, &tensors).unwrap();
    let reader = BundleReader::open(&p).unwrap();
    assert_eq!(reader.num_shards(), 1);
    for (name, t) in &tensors {
        let back = reader.read(name).unwrap();
        assert_eq!(back.dtype(), t.dtype(), "{name}");
        assert_eq!(back.dims(), t.dims(), "{name}");
        match t.bytes() {
            Some(b) => assert_eq!(back.bytes().unwrap(), b, "{name}"),
            None => assert_eq!(back.strings().unwrap(), t.strings().unwrap(), "{name}"),
        }
    }
    // No temp files left behind.
    let names: Vec<String> = std::fs::read_dir(dir.path().join("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn bundle_bytes_are_laid_out_as_tensorflow_does() {
    let dir = tempfile::tempdir().unwrap();
    let p = prefix(dir.path(), "m");
    write_bundle(
        &p,
        &[
            (
                "z".into(),
                Tensor::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap(),
            ),
            (
                "s".into(),
                Tensor::from_strings(vec![2], vec![Bytes::from("ab"), Bytes::from("")]).unwrap(),
            ),
        ],
    )
    .unwrap();
    let data = std::fs::read(data_filename(&p, 0, 1)).unwrap();
    assert!(data_filename(&p, 0, 1).ends_with("m.data-00000-of-00001"));
    // Tensors are written in the order given: z then s.
    // z: 1.0f32 = 0x3f800000, 2.0f32 = 0x40000000, little-endian.
    assert_eq!(&data[..8], &[0, 0, 0x80, 0x3f, 0, 0, 0, 0x40]);
    // s: varint lengths 2, 0; masked CRC32C of the lengths as 4-byte LE u32s; the bytes.
    let lengths_crc = crc32c::crc32c(&[2, 0, 0, 0, 0, 0, 0, 0]);
    let mut s = vec![2u8, 0];
    s.extend_from_slice(&mask(lengths_crc).to_le_bytes());
    s.extend_from_slice(b"ab");
    assert_eq!(&data[8..], s.as_slice());

    let table = Table::open(&index_filename(&p)).unwrap();
    let keys: Vec<&[u8]> = table.entries().iter().map(|(k, _)| k.as_slice()).collect();
    assert_eq!(keys, vec![&b""[..], b"s", b"z"]);
    let header = BundleHeaderProto::decode(table.get(b"").unwrap()).unwrap();
    assert_eq!((header.num_shards, header.endianness), (1, 0));
    assert_eq!(header.version.unwrap().producer, 1);
    let z = BundleEntryProto::decode(table.get(b"z").unwrap()).unwrap();
    assert_eq!((z.dtype, z.shard_id, z.offset, z.size), (1, 0, 0, 8));
    assert_eq!(z.crc32c, mask(crc32c::crc32c(&data[..8])));
    let se = BundleEntryProto::decode(table.get(b"s").unwrap()).unwrap();
    assert_eq!((se.dtype, se.offset, se.size), (7, 8, 8));
    // The entry CRC covers the lengths (as u32s), the stored length checksum, the bytes.
    let mut covered = vec![2u8, 0, 0, 0, 0, 0, 0, 0];
    covered.extend_from_slice(&mask(lengths_crc).to_le_bytes());
    covered.extend_from_slice(b"ab");
    assert_eq!(se.crc32c, mask(crc32c::crc32c(&covered)));
}

#[test]
fn corrupt_or_missing_data_is_an_error_naming_the_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let p = prefix(dir.path(), "m");
    write_bundle(&p, &every_dtype()).unwrap();
    let data_path = data_filename(&p, 0, 1);
    let good = std::fs::read(&data_path).unwrap();

    let mut bad = good.clone();
    bad[0] ^= 1; // inside a/f32, the first tensor written
    std::fs::write(&data_path, &bad).unwrap();
    let reader = BundleReader::open(&p).unwrap();
    let err = reader.read("a/f32").unwrap_err();
    assert_eq!(err.code(), Code::DataLoss);
    assert!(
        err.message().contains("m.data-00000-of-00001") && err.message().contains("a/f32"),
        "{err}"
    );
    // Other tensors are intact and still read.
    assert_eq!(
        reader.read("b/i64").unwrap().scalar_value::<i64>().unwrap(),
        1 << 40
    );

    std::fs::write(&data_path, &good[..good.len() - 3]).unwrap();
    let err = reader.read("d/str").unwrap_err();
    assert_eq!(err.code(), Code::DataLoss, "{err}");

    std::fs::remove_file(&data_path).unwrap();
    let err = reader.read("a/f64").unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("m.data-00000-of-00001"), "{err}");

    let err = reader.read("no/such").unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        err.message().contains("no/such") && err.message().contains("m.index"),
        "{err}"
    );

    let err = BundleReader::open(&prefix(dir.path(), "nothing")).unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("nothing.index"), "{err}");
}

#[test]
fn merging_shards_renames_data_and_joins_indices() {
    let dir = tempfile::tempdir().unwrap();
    let dest = prefix(dir.path(), "model.ckpt-3");
    let temp = format!("{dest}_temp/part");
    let p0 = format!("{temp}-00000-of-00002");
    let p1 = format!("{temp}-00001-of-00002");
    write_bundle(
        &p0,
        &[
            ("b".into(), Tensor::scalar(2.0f32)),
            ("global_step".into(), Tensor::scalar(3i64)),
        ],
    )
    .unwrap();
    write_bundle(
        &p1,
        &[(
            "a".into(),
            Tensor::from_vec(vec![2], vec![5i32, 6]).unwrap(),
        )],
    )
    .unwrap();
    merge_bundles(&[p0, p1], &dest, true).unwrap();

    assert!(
        !Path::new(&format!("{dest}_temp")).exists(),
        "temp dir removed"
    );
    let reader = BundleReader::open(&dest).unwrap();
    assert_eq!(reader.num_shards(), 2);
    assert_eq!(reader.entries()["b"].shard_id, 0);
    assert_eq!(reader.entries()["a"].shard_id, 1);
    assert!(data_filename(&dest, 0, 2).exists() && data_filename(&dest, 1, 2).exists());
    assert_eq!(
        reader.read("a").unwrap().values::<i32>().unwrap().as_ref(),
        &[5, 6]
    );
    assert_eq!(
        reader
            .read("global_step")
            .unwrap()
            .scalar_value::<i64>()
            .unwrap(),
        3
    );
}

#[test]
fn merging_a_missing_shard_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let p0 = prefix(dir.path(), "t/part-00000-of-00002");
    write_bundle(&p0, &[("x".into(), Tensor::scalar(1.0f32))]).unwrap();
    let p1 = prefix(dir.path(), "t/part-00001-of-00002");
    let err = merge_bundles(&[p0, p1], &prefix(dir.path(), "m"), true).unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("part-00001-of-00002.index"), "{err}");
}
