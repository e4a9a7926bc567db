//! The two string hashes TensorFlow's hash-bucket ops use, ported so that tessera's buckets are
//! TensorFlow's bit for bit: [`fingerprint64`], farmhash's `Fingerprint64` (its `farmhashna`
//! `Hash64`, which `tensorflow/core/platform/fingerprint.h` calls and whose values farmhash
//! promises never to change), behind `StringToHashBucketFast`; and [`sip_hash_24`], SipHash-2-4
//! with a 128-bit key (highwayhash's `SipHash`, TensorFlow's `StrongKeyedHash`), behind
//! `StringToHashBucketStrong`.
//!
//! Both read the input as little-endian 64-bit words, as farmhash and highwayhash do on the
//! little-endian machines TensorFlow runs on; every sum and product wraps, as unsigned C++
//! arithmetic does.

// Three of farmhash's primes between 2^63 and 2^64.
const K0: u64 = 0xc3a5_c85c_97cb_3127;
const K1: u64 = 0xb492_b66f_be98_f273;
const K2: u64 = 0x9ae1_6a3b_2f90_404f;

/// The little-endian 64-bit word at `s[i..i + 8]`.
fn fetch64(s: &[u8], i: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&s[i..i + 8]);
    u64::from_le_bytes(word)
}

/// The little-endian 32-bit word at `s[i..i + 4]`, widened.
fn fetch32(s: &[u8], i: usize) -> u64 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&s[i..i + 4]);
    u64::from(u32::from_le_bytes(word))
}

fn shift_mix(v: u64) -> u64 {
    v ^ (v >> 47)
}

/// farmhash's Murmur-inspired mix of two words.
fn hash_len16(u: u64, v: u64, mul: u64) -> u64 {
    let mut a = (u ^ v).wrapping_mul(mul);
    a ^= a >> 47;
    let mut b = (v ^ a).wrapping_mul(mul);
    b ^= b >> 47;
    b.wrapping_mul(mul)
}

fn hash_len0to16(s: &[u8]) -> u64 {
    let len = s.len();
    if len >= 8 {
        let mul = K2.wrapping_add(len as u64 * 2);
        let a = fetch64(s, 0).wrapping_add(K2);
        let b = fetch64(s, len - 8);
        let c = b.rotate_right(37).wrapping_mul(mul).wrapping_add(a);
        let d = a.rotate_right(25).wrapping_add(b).wrapping_mul(mul);
        return hash_len16(c, d, mul);
    }
    if len >= 4 {
        let mul = K2.wrapping_add(len as u64 * 2);
        let a = fetch32(s, 0);
        return hash_len16((len as u64).wrapping_add(a << 3), fetch32(s, len - 4), mul);
    }
    if len > 0 {
        let (a, b, c) = (s[0], s[len >> 1], s[len - 1]);
        let y = u32::from(a) + (u32::from(b) << 8);
        let z = len as u32 + (u32::from(c) << 2);
        return shift_mix(u64::from(y).wrapping_mul(K2) ^ u64::from(z).wrapping_mul(K0))
            .wrapping_mul(K2);
    }
    K2
}

fn hash_len17to32(s: &[u8]) -> u64 {
    let len = s.len();
    let mul = K2.wrapping_add(len as u64 * 2);
    let a = fetch64(s, 0).wrapping_mul(K1);
    let b = fetch64(s, 8);
    let c = fetch64(s, len - 8).wrapping_mul(mul);
    let d = fetch64(s, len - 16).wrapping_mul(K2);
    hash_len16(
        a.wrapping_add(b)
            .rotate_right(43)
            .wrapping_add(c.rotate_right(30))
            .wrapping_add(d),
        a.wrapping_add(b.wrapping_add(K2).rotate_right(18))
            .wrapping_add(c),
        mul,
    )
}

fn hash_len33to64(s: &[u8]) -> u64 {
    let len = s.len();
    let mul = K2.wrapping_add(len as u64 * 2);
    let a = fetch64(s, 0).wrapping_mul(K2);
    let b = fetch64(s, 8);
    let c = fetch64(s, len - 8).wrapping_mul(mul);
    let d = fetch64(s, len - 16).wrapping_mul(K2);
    let y = a
        .wrapping_add(b)
        .rotate_right(43)
        .wrapping_add(c.rotate_right(30))
        .wrapping_add(d);
    let z = hash_len16(
        y,
        a.wrapping_add(b.wrapping_add(K2).rotate_right(18))
            .wrapping_add(c),
        mul,
    );
    let e = fetch64(s, 16).wrapping_mul(mul);
    let f = fetch64(s, 24);
    let g = y.wrapping_add(fetch64(s, len - 32)).wrapping_mul(mul);
    let h = z.wrapping_add(fetch64(s, len - 24)).wrapping_mul(mul);
    hash_len16(
        e.wrapping_add(f)
            .rotate_right(43)
            .wrapping_add(g.rotate_right(30))
            .wrapping_add(h),
        e.wrapping_add(f.wrapping_add(a).rotate_right(18))
            .wrapping_add(g),
        mul,
    )
}

/// A 16-byte hash of the four words at `s[i..i + 32]` and the seeds `a` and `b`.
fn weak_hash_len32_with_seeds(s: &[u8], i: usize, mut a: u64, mut b: u64) -> (u64, u64) {
    let (w, x, y, z) = (
        fetch64(s, i),
        fetch64(s, i + 8),
        fetch64(s, i + 16),
        fetch64(s, i + 24),
    );
    a = a.wrapping_add(w);
    b = b.wrapping_add(a).wrapping_add(z).rotate_right(21);
    let c = a;
    a = a.wrapping_add(x).wrapping_add(y);
    b = b.wrapping_add(a.rotate_right(44));
    (a.wrapping_add(z), b.wrapping_add(c))
}

/// farmhash's `Fingerprint64(s)`: what TensorFlow's `Fingerprint64` returns for these bytes.
pub(crate) fn fingerprint64(s: &[u8]) -> u64 {
    let len = s.len();
    if len <= 16 {
        return hash_len0to16(s);
    }
    if len <= 32 {
        return hash_len17to32(s);
    }
    if len <= 64 {
        return hash_len33to64(s);
    }
    // Over 64 bytes: 64-byte blocks through a state of seven words, then the last 64 bytes
    // (which may overlap the last block).
    const SEED: u64 = 81;
    let mut x = SEED;
    let mut y = SEED.wrapping_mul(K1).wrapping_add(113);
    let mut z = shift_mix(y.wrapping_mul(K2).wrapping_add(113)).wrapping_mul(K2);
    let (mut v, mut w) = ((0u64, 0u64), (0u64, 0u64));
    x = x.wrapping_mul(K2).wrapping_add(fetch64(s, 0));
    let end = (len - 1) / 64 * 64;
    let last64 = len - 64;
    let mut at = 0;
    loop {
        x = x
            .wrapping_add(y)
            .wrapping_add(v.0)
            .wrapping_add(fetch64(s, at + 8))
            .rotate_right(37)
            .wrapping_mul(K1);
        y = y
            .wrapping_add(v.1)
            .wrapping_add(fetch64(s, at + 48))
            .rotate_right(42)
            .wrapping_mul(K1);
        x ^= w.1;
        y = y.wrapping_add(v.0).wrapping_add(fetch64(s, at + 40));
        z = z.wrapping_add(w.0).rotate_right(33).wrapping_mul(K1);
        v = weak_hash_len32_with_seeds(s, at, v.1.wrapping_mul(K1), x.wrapping_add(w.0));
        w = weak_hash_len32_with_seeds(
            s,
            at + 32,
            z.wrapping_add(w.1),
            y.wrapping_add(fetch64(s, at + 16)),
        );
        std::mem::swap(&mut z, &mut x);
        at += 64;
        if at == end {
            break;
        }
    }
    let mul = K1.wrapping_add((z & 0xff) << 1);
    let at = last64;
    w.0 = w.0.wrapping_add(((len - 1) & 63) as u64);
    v.0 = v.0.wrapping_add(w.0);
    w.0 = w.0.wrapping_add(v.0);
    x = x
        .wrapping_add(y)
        .wrapping_add(v.0)
        .wrapping_add(fetch64(s, at + 8))
        .rotate_right(37)
        .wrapping_mul(mul);
    y = y
        .wrapping_add(v.1)
        .wrapping_add(fetch64(s, at + 48))
        .rotate_right(42)
        .wrapping_mul(mul);
    x ^= w.1.wrapping_mul(9);
    y = y
        .wrapping_add(v.0.wrapping_mul(9))
        .wrapping_add(fetch64(s, at + 40));
    z = z.wrapping_add(w.0).rotate_right(33).wrapping_mul(mul);
    v = weak_hash_len32_with_seeds(s, at, v.1.wrapping_mul(mul), x.wrapping_add(w.0));
    w = weak_hash_len32_with_seeds(
        s,
        at + 32,
        z.wrapping_add(w.1),
        y.wrapping_add(fetch64(s, at + 16)),
    );
    std::mem::swap(&mut z, &mut x);
    hash_len16(
        hash_len16(v.0, w.0, mul)
            .wrapping_add(shift_mix(y).wrapping_mul(K0))
            .wrapping_add(z),
        hash_len16(v.1, w.1, mul).wrapping_add(x),
        mul,
    )
}

/// SipHash-2-4 of `data` under the 128-bit `key` (`key[0]` the low half): TensorFlow's
/// `StrongKeyedHash(key, data)`.
pub(crate) fn sip_hash_24(key: [u64; 2], data: &[u8]) -> u64 {
    let mut v = [
        0x736f_6d65_7073_6575 ^ key[0],
        0x646f_7261_6e64_6f6d ^ key[1],
        0x6c79_6765_6e65_7261 ^ key[0],
        0x7465_6462_7974_6573 ^ key[1],
    ];
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    let compress = |m: u64, v: &mut [u64; 4]| {
        v[3] ^= m;
        round(v);
        round(v);
        v[0] ^= m;
    };
    let words = data.chunks_exact(8);
    let tail = words.remainder();
    for word in words {
        compress(fetch64(word, 0), &mut v);
    }
    // The last word: the remaining bytes, and the length's low byte on top.
    let mut last = (data.len() as u64) << 56;
    for (i, &b) in tail.iter().enumerate() {
        last |= u64::from(b) << (8 * i);
    }
    compress(last, &mut v);
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sip_hash_matches_the_reference_vectors() {
        // The SipHash paper's key 00 01 .. 0f and messages 00 01 .. (n - 1) (its appendix A
        // and the reference implementation's `vectors.h`).
        let key = [0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908];
        let message: Vec<u8> = (0..64).collect();
        assert_eq!(sip_hash_24(key, &message[..0]), 0x726f_db47_dd0e_0e31);
        assert_eq!(sip_hash_24(key, &message[..1]), 0x74f8_39c5_93dc_67fd);
        assert_eq!(sip_hash_24(key, &message[..8]), 0x93f5_f579_9a93_2462);
        assert_eq!(sip_hash_24(key, &message[..15]), 0xa129_ca61_49be_45e5);
        assert_eq!(sip_hash_24(key, &message[..63]), 0x958a_324c_eb06_4572);
    }

    #[test]
    fn fingerprint_of_the_empty_string_is_k2() {
        // farmhash returns its constant k2 for no bytes; TensorFlow's
        // `tf.strings.to_hash_bucket_fast("", 2**62)` is k2 mod 2^62.
        assert_eq!(fingerprint64(b""), K2);
        assert_eq!(fingerprint64(b"") % (1 << 62), 1_936_946_117_179_621_455);
    }

    #[test]
    fn fingerprints_match_tensorflow_in_every_length_class() {
        // TensorFlow 2.21's `Fingerprint64` of "abcd...", the alphabet repeated to each length
        // (read back from `to_hash_bucket_fast` modulo 2^62 and 2^63 - 1): each branch of
        // farmhash (1-3, 4-7, 8-16, 17-32, 33-64 bytes, and the 64-byte blocks past them).
        let cases: [(usize, u64); 15] = [
            (0, 0x9ae1_6a3b_2f90_404f),
            (1, 0xb345_4265_b6df_75e3),
            (2, 0xaa8d_6e52_42ad_a51e),
            (3, 0x24a5_b3a0_74e7_f369),
            (4, 0x1a55_02de_4a1f_8101),
            (7, 0x3c40_c92b_1ccb_7355),
            (8, 0xfee9_d229_90c8_2909),
            (16, 0x5463_0bad_7705_cebd),
            (17, 0x9e21_06c7_2d77_93a8),
            (32, 0xff96_b8a5_4087_359a),
            (33, 0x1bd2_57e2_fc3d_a812),
            (64, 0x9c4a_595c_23bb_9bfa),
            (65, 0x2434_d891_7886_fe2a),
            (128, 0xc324_4d5e_c8a4_474a),
            (200, 0x25d4_0299_e841_9af6),
        ];
        for (len, want) in cases {
            let s: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            assert_eq!(fingerprint64(&s), want, "length {len}");
        }
    }
}
