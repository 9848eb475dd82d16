//! Stable 64-bit digests of exact bytes and exact f32 bits.
//!
//! Owns the one hash used everywhere in a trace: FNV-1a-64. It is tiny, has no
//! dependencies and is fully specified by two constants, so a digest written today
//! compares equal to one computed by any later version on any platform. It is not
//! cryptographic: it only needs to detect divergence, not resist an adversary.

/// FNV-1a-64 offset basis.
const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a-64 prime.
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// Streaming FNV-1a-64 hasher: feeding bytes in pieces gives the same digest as
/// feeding them at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fnv1a64 {
    state: u64,
}

impl Default for Fnv1a64 {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv1a64 {
    /// A hasher that has seen no bytes (its digest is the offset basis).
    pub const fn new() -> Self {
        Self {
            state: OFFSET_BASIS,
        }
    }

    /// Feeds `bytes` in order.
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.state ^= u64::from(b);
            self.state = self.state.wrapping_mul(PRIME);
        }
    }

    /// Feeds each value's exact bit pattern as 4 little-endian bytes, so `-0.0`,
    /// `0.0` and distinct NaN payloads all hash differently.
    pub fn update_f32(&mut self, xs: &[f32]) {
        for x in xs {
            self.update(&x.to_bits().to_le_bytes());
        }
    }

    /// Feeds a `u64` as 8 little-endian bytes.
    pub fn update_u64(&mut self, x: u64) {
        self.update(&x.to_le_bytes());
    }

    /// The digest of everything fed so far.
    pub const fn finish(&self) -> u64 {
        self.state
    }
}

/// The digest scheme this crate computes, recorded in every header: FNV-1a-64 over the
/// bytes `FORMAT.md` lists for each digest. Scheme 2 digests hidden states and attention
/// outputs through per-token row digests (a device computes those without copying the
/// tensors to the host); scheme 1 hashed their values directly. Any change to what a
/// digest covers or how it is computed takes a new number.
pub const DIGEST_SCHEME: u32 = 2;

/// FNV-1a-64 of `b`.
pub fn digest_bytes(b: &[u8]) -> u64 {
    let mut h = Fnv1a64::new();
    h.update(b);
    h.finish()
}

/// FNV-1a-64 of the exact bits of `xs`: each value as `to_bits().to_le_bytes()`,
/// concatenated in order.
pub fn digest_f32(xs: &[f32]) -> u64 {
    let mut h = Fnv1a64::new();
    h.update_f32(xs);
    h.finish()
}

/// FNV-1a-64 of `xs` as `to_le_bytes()` each, concatenated in order: how a trace folds a
/// sequence of per-token row digests into one.
pub fn digest_u64s(xs: &[u64]) -> u64 {
    let mut h = Fnv1a64::new();
    for x in xs {
        h.update(&x.to_le_bytes());
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the published FNV-1a-64 test vectors and our f32 encoding. If this test
    /// changes, every recorded trace's digests change: bump DIGEST_SCHEME instead.
    #[test]
    fn known_answers_are_pinned() {
        assert_eq!(digest_bytes(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(digest_bytes(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(digest_bytes(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(digest_f32(&[]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(digest_f32(&[1.0]), digest_bytes(&[0x00, 0x00, 0x80, 0x3f]));
        assert_eq!(digest_f32(&[1.0, -2.5, 0.0]), KNOWN_F32);
        assert_eq!(digest_f32(&[-0.0]), KNOWN_NEG_ZERO);
        assert_eq!(digest_u64s(&[]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(digest_u64s(&[1]), digest_bytes(&[1, 0, 0, 0, 0, 0, 0, 0]));
    }

    // Computed independently (Python struct.pack("<3f", 1.0, -2.5, 0.0) + FNV-1a-64).
    const KNOWN_F32: u64 = 0x00f3_a969_ef35_0f78;
    const KNOWN_NEG_ZERO: u64 = 0x4d24_f67f_9dcd_3a75;

    #[test]
    fn exact_bits_matter() {
        assert_ne!(digest_f32(&[0.0]), digest_f32(&[-0.0]));
        let nan_a = f32::from_bits(0x7fc0_0000);
        let nan_b = f32::from_bits(0x7fc0_0001);
        assert_ne!(digest_f32(&[nan_a]), digest_f32(&[nan_b]));
    }

    #[test]
    fn streaming_equals_one_shot() {
        let data: Vec<u8> = (0u8..=255).collect();
        let mut h = Fnv1a64::new();
        h.update(&data[..100]);
        h.update(&data[100..]);
        assert_eq!(h.finish(), digest_bytes(&data));
        let mut h = Fnv1a64::new();
        h.update_u64(0x0102_0304_0506_0708);
        assert_eq!(h.finish(), digest_bytes(&[8, 7, 6, 5, 4, 3, 2, 1]));
    }
}
