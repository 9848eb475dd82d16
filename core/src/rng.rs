//! Deterministic randomness keyed by what it decides, never by call order: a ChaCha8
//! stream per (seed, component, request, position), so results do not depend on batch
//! composition, row order or thread count.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Components that draw randomness (each gets its own ChaCha stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Stream {
    TargetWeights = 1,
    DrafterWeights = 2,
    Workload = 10,
    Acceptance = 11,
    Verify = 12,
    DraftSample = 13,
    Grammar = 14,
    /// Garbage for the graph buffers' unwritten regions (poison mode).
    Poison = 15,
    /// The acceptance controller's draw of a forced draft under temperature > 0.
    AcceptanceSample = 16,
}

/// An RNG for one decision about `req_id` at `position`.
pub fn keyed_rng(seed: u64, stream: Stream, req_id: u64, position: u64) -> ChaCha8Rng {
    // SplitMix64-style mixing keeps nearby keys far apart in seed space.
    let mut x = seed ^ req_id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= position.wrapping_mul(0xC2B2_AE3D_27D4_EB4F).rotate_left(17);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    let mut rng = ChaCha8Rng::seed_from_u64(x ^ (x >> 31));
    rng.set_stream(stream as u64);
    rng
}

/// A sequential RNG for one component.
pub fn stream_rng(seed: u64, stream: Stream) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream as u64);
    rng
}
