//! The fast decode's work partition: a launch's key tiles, request after request, cut
//! into `parts` contiguous shares of about equal cost, so that every CTA of a row block
//! does the same work. A request cut at a share's boundary becomes pieces, one per share
//! it spans, merged by LSE in piece order afterwards.
//!
//! This is the schedule of FlashMLA's decode (`get_mla_metadata_kernel` in
//! `csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu`, and
//! `num_sm_parts` in `csrc/api/dense_decode.h`, deepseek-ai/FlashMLA at 9241ae3): 64-key
//! tiles, a fixed overhead of 5 tiles charged to every piece (a piece's Q load, pipeline
//! fill and row store), and `num_sms / row_blocks` shares, each taken by one CTA per
//! 64-row block. Whole items per CTA leave the last wave part idle (256 row blocks over
//! 132 CTAs are 1.94 waves: 3% of the CTA time); equal shares do not.
//!
//! A piece's bits depend on where the shares cut its request, so on the whole batch: this
//! is a fast-mode schedule only. The batch-invariant mode keeps `split`'s rule.

use serde::{Deserialize, Serialize};

/// The tiles FlashMLA charges each piece beyond its own (`fixed_overhead_num_blocks`).
pub const PIECE_OVERHEAD_TILES: u32 = 5;

/// One share: requests `begin_req .. end_req` (end exclusive), starting at tile
/// `begin_tile` of the first and stopping before tile `end_tile` of the last
/// (`end_req - 1`). Empty when `begin_req == end_req`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub begin_req: u32,
    pub begin_tile: u32,
    /// The piece of `begin_req` this share computes (0 unless an earlier share cut it).
    pub begin_piece: u32,
    pub end_req: u32,
    pub end_tile: u32,
}

/// The partition of a launch: its shares in order, and where each request's pieces sit
/// among all pieces (request b's pieces are `piece_start[b] .. piece_start[b + 1]`; one
/// piece is a request no share cut, which needs no merge).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TilePartition {
    pub shares: Vec<Share>,
    pub piece_start: Vec<u32>,
}

impl TilePartition {
    /// Pieces in all: the partial slots a launch needs.
    pub fn pieces(&self) -> u32 {
        self.piece_start.last().copied().unwrap_or(0)
    }

    /// Request `b`'s pieces.
    pub fn pieces_of(&self, b: usize) -> u32 {
        self.piece_start[b + 1] - self.piece_start[b]
    }
}

/// Shares a launch of `row_blocks` 64-row blocks takes on `sms` multiprocessors: one CTA
/// a multiprocessor over all row blocks, at least one share (FlashMLA's `num_sm_parts`
/// with one KV head).
pub fn shares_for(row_blocks: usize, sms: usize) -> usize {
    (sms / row_blocks.max(1)).max(1)
}

/// Cuts requests of `tiles[b]` key tiles into `shares` shares. A piece costs its tiles
/// plus `overhead` (a request without tiles costs the overhead alone, and is never cut);
/// each share takes pieces while their cost fits `ceil(total / shares) + overhead`, where
/// `total` charges every request one overhead, and cuts the request that does not fit
/// where the share is full (only if at least one tile goes to the share). The last share
/// takes whatever is left, so every tile is in exactly one share.
pub fn partition_tiles(tiles: &[u32], shares: usize, overhead: u32) -> TilePartition {
    let shares = shares.max(1);
    let total: u64 = tiles.iter().map(|&t| (t + overhead) as u64).sum();
    let payload = total.div_ceil(shares as u64) + overhead as u64;
    let mut out = TilePartition {
        shares: Vec::with_capacity(shares),
        piece_start: vec![0; tiles.len() + 1],
    };
    // The walk: request `req`, from tile `tile`, as its piece `piece`.
    let (mut req, mut tile, mut piece) = (0usize, 0u32, 0u32);
    for i in 0..shares {
        let mut share = Share {
            begin_req: req as u32,
            begin_tile: tile,
            begin_piece: piece,
            ..Share::default()
        };
        let mut room = payload;
        let last = i + 1 == shares;
        while req < tiles.len() {
            let rest = (tiles[req] - tile) as u64;
            if last || room >= rest + overhead as u64 {
                // The rest of the request, as its last piece.
                room = room.saturating_sub(rest + overhead as u64);
                out.piece_start[req + 1] = piece + 1;
                (req, tile, piece) = (req + 1, 0, 0);
            } else {
                if room > overhead as u64 {
                    // Cut: this share's piece ends where the room does.
                    tile += (room - overhead as u64) as u32;
                    piece += 1;
                }
                break;
            }
        }
        // A cut request ends this share inside it; otherwise the share's last request
        // is whole.
        (share.end_req, share.end_tile) = if tile > 0 {
            (req as u32 + 1, tile)
        } else if req > share.begin_req as usize {
            (req as u32, tiles[req - 1])
        } else {
            (req as u32, 0)
        };
        out.shares.push(share);
    }
    for b in 0..tiles.len() {
        out.piece_start[b + 1] += out.piece_start[b];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every share's pieces as (request, first tile, end tile, piece index).
    fn pieces(p: &TilePartition, tiles: &[u32]) -> Vec<Vec<(u32, u32, u32, u32)>> {
        p.shares
            .iter()
            .map(|s| {
                (s.begin_req..s.end_req)
                    .map(|b| {
                        let first = b == s.begin_req;
                        let from = if first { s.begin_tile } else { 0 };
                        let to = if b + 1 == s.end_req {
                            s.end_tile
                        } else {
                            tiles[b as usize]
                        };
                        (b, from, to, if first { s.begin_piece } else { 0 })
                    })
                    .collect()
            })
            .collect()
    }

    /// Each request's tiles in exactly one piece each, in order, its pieces numbered
    /// 0.. in share order and counted by `piece_start`.
    fn check_cover(p: &TilePartition, tiles: &[u32]) -> Result<(), String> {
        let mut next = vec![(0u32, 0u32); tiles.len()]; // (next tile, next piece)
        for (i, share) in pieces(p, tiles).iter().enumerate() {
            for &(b, from, to, n) in share {
                let want = next[b as usize];
                if (from, n) != want || to < from || to > tiles[b as usize] {
                    return Err(format!(
                        "share {i}: request {b} {from}..{to} piece {n}, want {want:?}"
                    ));
                }
                next[b as usize] = (to, n + 1);
            }
        }
        for (b, (&(t, n), &want)) in next.iter().zip(tiles).enumerate() {
            if t != want || n != p.pieces_of(b) {
                return Err(format!(
                    "request {b}: {t} of {want} tiles, {n} pieces of {}",
                    p.pieces_of(b)
                ));
            }
        }
        Ok(())
    }

    #[test]
    fn a_batch_that_divides_evenly_is_never_cut() {
        // 64 requests of 64 tiles over 16 shares (q 4 at 128 heads on 132 SMs): 4 each.
        let p = partition_tiles(&[64; 64], 16, PIECE_OVERHEAD_TILES);
        check_cover(&p, &[64; 64]).unwrap();
        assert_eq!(p.pieces(), 64);
        for (i, s) in p.shares.iter().enumerate() {
            assert_eq!(
                (s.begin_req, s.begin_tile, s.end_req, s.end_tile),
                (4 * i as u32, 0, 4 * i as u32 + 4, 64)
            );
        }
    }

    #[test]
    fn q2_at_b64_cuts_a_request_at_most_once_a_share() {
        // 33 shares of 64 requests of 64 tiles (q 2 at 128 heads, 132 SMs): 1.94 each.
        let tiles = [64u32; 64];
        let p = partition_tiles(&tiles, shares_for(4, 132), PIECE_OVERHEAD_TILES);
        assert_eq!(p.shares.len(), 33);
        check_cover(&p, &tiles).unwrap();
        assert!(p.pieces() <= 64 + 32);
        // payload: ceil(64 * 69 / 33) + 5 = 139; a share's pieces cost at most that.
        for share in pieces(&p, &tiles) {
            let cost: u32 = share.iter().map(|&(_, a, b, _)| b - a + 5).sum();
            assert!(cost <= 139, "{share:?}");
        }
    }

    #[test]
    fn requests_without_tiles_are_whole_pieces() {
        let tiles = [0, 3, 0, 0, 40, 0];
        let p = partition_tiles(&tiles, 4, PIECE_OVERHEAD_TILES);
        check_cover(&p, &tiles).unwrap();
        for b in [0, 2, 3, 5] {
            assert_eq!(p.pieces_of(b), 1);
        }
    }

    #[test]
    fn more_shares_than_work_leaves_shares_empty() {
        let tiles = [1, 2];
        let p = partition_tiles(&tiles, 8, PIECE_OVERHEAD_TILES);
        check_cover(&p, &tiles).unwrap();
        assert_eq!(p.shares.len(), 8);
        assert!(p.shares.iter().any(|s| s.begin_req == s.end_req));
    }

    #[test]
    fn shares_follow_flashmla_num_sm_parts() {
        // 132 SMs: q 1 (2 blocks) 66, q 2 (4) 33, q 4 (8) 16, 200 blocks still 1.
        assert_eq!(
            [2, 4, 8, 200].map(|rb| shares_for(rb, 132)),
            [66, 33, 16, 1]
        );
    }

    proptest! {
        #[test]
        fn every_tile_lands_in_one_piece(
            tiles in prop::collection::vec(0u32..300, 1..40),
            shares in 1usize..140,
            overhead in 0u32..8,
        ) {
            let p = partition_tiles(&tiles, shares, overhead);
            prop_assert_eq!(p.shares.len(), shares);
            prop_assert_eq!(check_cover(&p, &tiles), Ok(()));
            // At most one cut at each share's end.
            prop_assert!(p.pieces() as usize <= tiles.len() + shares - 1);
        }
    }
}
