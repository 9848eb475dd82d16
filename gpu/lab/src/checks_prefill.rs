//! Checks of the bf16 prefill attention (`flash_prefill`) against f64 on the same bf16
//! inputs: causal and not, varlen rows in one launch, outputs poisoned with NaN first;
//! batch invariance; the chunked prefill merged by LSE (and its F1 mutant); the gather
//! from the paged bf16 cache.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::checks::{bf16_vec, download, max_rel_err, upload, CaseResult, BF16_TOL, UNWRITTEN};
use crate::reference::attention_f64;
use specmla_gpu::device::{GpuDevice, GpuError};
use specmla_gpu::ops::{
    prefill_rows_valid, FlashKernels, Kernels, MlaDims, PrefillBufs, PrefillKeyLayout,
    PrefillShape, PrefillTile, State, PREFILL_DQK, PREFILL_DV,
};

/// The launch shape of `rows` (queries, keys) and their start locations.
fn shape_of(
    heads: usize,
    rows: &[(usize, usize)],
    causal: bool,
) -> (PrefillShape, Vec<i32>, Vec<i32>) {
    let q_loc = start_locs(rows.iter().map(|r| r.0));
    let k_loc = start_locs(rows.iter().map(|r| r.1));
    let s = PrefillShape {
        batch: rows.len(),
        heads,
        max_q_len: rows.iter().map(|r| r.0).max().unwrap_or(0),
        total_q: *q_loc.last().unwrap_or(&0) as usize,
        total_k: *k_loc.last().unwrap_or(&0) as usize,
        causal,
    };
    (s, q_loc, k_loc)
}

/// Prefix sums of `lens`, as the kernel takes them.
pub fn start_locs(lens: impl Iterator<Item = usize>) -> Vec<i32> {
    let mut loc = vec![0i32];
    for l in lens {
        loc.push(loc.last().copied().unwrap_or(0) + l as i32);
    }
    loc
}

/// Keys and values of `keys` keys in `layout`, bf16, random: the three device arrays
/// (k_nope, k_rope, v; the up-projected layout keeps k_nope and v in one buffer, so v is
/// that buffer again) and, for the reference, each key of each head as `[192]` and each
/// value as `[128]`.
struct Keys {
    k_nope: Vec<u16>,
    k_rope: Vec<u16>,
    /// `None`: v lives in `k_nope`'s buffer at offset 128.
    v: Option<Vec<u16>>,
    k_ref: Vec<f32>,
    v_ref: Vec<f32>,
}

fn keys(rng: &mut ChaCha8Rng, keys: usize, heads: usize, layout: PrefillKeyLayout) -> Keys {
    let shared = layout == PrefillKeyLayout::up_projected(heads);
    let nope_len = if keys == 0 {
        0
    } else {
        (keys - 1) * layout.k_nope_row + heads * layout.k_nope_head
    };
    let rope_len = keys * layout.k_rope_row;
    let (k_nope, nope) = bf16_vec(rng, nope_len, 1.0);
    let (k_rope, rope) = bf16_vec(rng, rope_len, 1.0);
    let (v, vals) = if shared {
        (None, nope.clone())
    } else {
        let (b, f) = bf16_vec(rng, keys * layout.v_row, 1.0);
        (Some(b), f)
    };
    let v_off = if shared { 128 } else { 0 };
    let rope_off = if shared { 512 } else { 0 };
    let mut k_ref = Vec::with_capacity(keys * heads * PREFILL_DQK);
    let mut v_ref = Vec::with_capacity(keys * heads * PREFILL_DV);
    for j in 0..keys {
        for h in 0..heads {
            let n0 = j * layout.k_nope_row + h * layout.k_nope_head;
            k_ref.extend_from_slice(&nope[n0..n0 + 128]);
            let r0 = j * layout.k_rope_row + rope_off;
            k_ref.extend_from_slice(&rope[r0..r0 + 64]);
            let v0 = j * layout.v_row + h * layout.v_head + v_off;
            v_ref.extend_from_slice(&vals[v0..v0 + PREFILL_DV]);
        }
    }
    Keys {
        k_nope,
        k_rope,
        v,
        k_ref,
        v_ref,
    }
}

/// One launch over `rows` (queries, keys) of `heads` heads against f64, keys laid out as
/// `layout` says.
pub fn check_flash_prefill(
    dev: &GpuDevice,
    fk: &FlashKernels,
    (heads, layout): (usize, PrefillKeyLayout),
    rows: &[(usize, usize)],
    causal: bool,
    seed: u64,
) -> Result<Vec<CaseResult>, GpuError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (s, q_loc, k_loc) = shape_of(heads, rows, causal);
    assert!(
        prefill_rows_valid(&s, &q_loc, &k_loc),
        "check rows {rows:?}"
    );
    let (q_bits, q) = bf16_vec(&mut rng, s.total_q * heads * PREFILL_DQK, 1.0);
    let kv = keys(&mut rng, s.total_k, heads, layout);
    // An empty batch still gets buffers to point at: every Buf holds at least one element.
    let mut out = upload(dev, &vec![UNWRITTEN; s.total_q * heads * PREFILL_DV])?;
    let mut lse = upload(dev, &vec![UNWRITTEN; s.total_q * heads])?;
    let qd = upload(dev, &q_bits)?;
    let (nd, rd) = (upload(dev, &kv.k_nope)?, upload(dev, &kv.k_rope)?);
    let vd = kv.v.map(|v| upload(dev, &v)).transpose()?;
    let (ql, kl) = (upload(dev, &q_loc)?, upload(dev, &k_loc)?);
    let shared_v = || nd.ptr().offset(128.min(nd.len()));
    let bufs = PrefillBufs {
        q: qd.ptr(),
        k_nope: nd.ptr(),
        // The up-projected layout's rope sits at column 512 of 576-wide rows.
        k_rope: if vd.is_none() {
            rd.ptr().offset(512.min(rd.len()))
        } else {
            rd.ptr()
        },
        v: vd.as_ref().map_or_else(shared_v, |v| v.ptr()),
        layout,
        q_start_loc: ql.ptr(),
        k_start_loc: kl.ptr(),
        out: out.ptr(),
        lse: lse.ptr(),
    };
    let scale = 1.0 / (PREFILL_DQK as f32).sqrt();
    let dims = (heads, PREFILL_DQK, PREFILL_DV);
    let (want_out, want_lse) = attention_f64(
        (&q, &kv.k_ref, &kv.v_ref),
        (&q_loc, &k_loc),
        dims,
        causal,
        scale as f64,
    );
    let shown: Vec<_> = rows.iter().take(4).collect();
    let mut results = Vec::new();
    for tile in PrefillTile::ALL
        .into_iter()
        .filter(|t| !t.hopper() || fk.wide.hopper())
    {
        // Poisoned again for each variant.
        out.write(dev, &vec![UNWRITTEN; out.len()])?;
        lse.write(dev, &vec![UNWRITTEN; lse.len()])?;
        // SAFETY: the start locations passed prefill_rows_valid above.
        unsafe { fk.flash_prefill_with(tile, dev, s, bufs, scale) }?;
        let n_out = s.total_q * heads * PREFILL_DV;
        let got_out = &download(dev, &out)?[..n_out];
        let got_lse = &download(dev, &lse)?[..s.total_q * heads];
        let err = max_rel_err(got_out, &want_out).max(max_rel_err(got_lse, &want_lse));
        results.push(CaseResult {
            kernel: tile.function(),
            case: format!(
                "bf16, {} heads {heads}, rows (q, k) {shown:?}{}{}",
                if causal { "causal" } else { "non-causal" },
                if rows.len() > 4 { " ..." } else { "" },
                if vd.is_none() {
                    ", up-projected layout"
                } else {
                    ""
                }
            ),
            max_rel_err: err,
            passed: err <= BF16_TOL,
        });
    }
    Ok(results)
}

/// Heads, rows (queries, keys), causal.
type Case = (usize, Vec<(usize, usize)>, bool);

/// The grid: causal self-attention from 1 to 8192 tokens (non-aligned lengths, many rows
/// in one launch), causal queries over a longer tail-aligned key range, and non-causal
/// queries over context chunks (empty, short, long, a row with no queries).
pub fn run_prefill_checks(
    dev: &GpuDevice,
    k: &Kernels,
    fk: &FlashKernels,
) -> Result<Vec<CaseResult>, GpuError> {
    let self_attn = |lens: &[usize]| lens.iter().map(|&l| (l, l)).collect::<Vec<_>>();
    let cases: Vec<Case> = vec![
        (16, self_attn(&[1]), true),
        (16, self_attn(&[5, 64, 65, 1, 130]), true),
        (128, self_attn(&[64, 100]), true),
        (16, self_attn(&[1000]), true),
        (1, self_attn(&[8192]), true),
        (16, vec![(37, 300), (1, 64)], true),
        (16, vec![(64, 2048)], false),
        (16, vec![(7, 0)], false),
        (16, vec![(3, 5), (0, 10), (20, 1), (65, 129)], false),
        (128, vec![(9, 24)], false),
    ];
    let mut out = Vec::new();
    for (i, (heads, rows, causal)) in cases.into_iter().enumerate() {
        let layout = PrefillKeyLayout::separate(heads);
        out.extend(check_flash_prefill(
            dev,
            fk,
            (heads, layout),
            &rows,
            causal,
            900 + i as u64,
        )?);
    }
    // K and V straight from the up-projection's output, rope from the gathered latent.
    for (i, (heads, rows)) in [(16, vec![(5, 300), (64, 64)]), (128, vec![(3, 130)])]
        .into_iter()
        .enumerate()
    {
        let layout = PrefillKeyLayout::up_projected(heads);
        out.extend(check_flash_prefill(
            dev,
            fk,
            (heads, layout),
            &rows,
            true,
            950 + i as u64,
        )?);
    }
    out.extend(check_prefill_invariance(dev, fk)?);
    for case in [MergeCase::Clean, MergeCase::F1, MergeCase::StaleContextKey] {
        out.push(check_prefill_merge(dev, k, fk, case)?);
    }
    out.push(check_gather_latent(dev, fk)?);
    Ok(out)
}

/// Rows `rows` of a `[n, width]` array, concatenated.
fn take_rows<T: Copy>(v: &[T], width: usize, rows: impl Iterator<Item = usize>) -> Vec<T> {
    rows.flat_map(|r| v[r * width..(r + 1) * width].iter().copied())
        .collect()
}

/// Keys and values of `n` keys, separate layout, as device buffers plus host copies.
struct KeySet {
    k_nope: Vec<u16>,
    k_rope: Vec<u16>,
    v: Vec<u16>,
}

impl KeySet {
    fn random(rng: &mut ChaCha8Rng, n: usize, heads: usize) -> (Self, Keys) {
        let k = keys(rng, n, heads, PrefillKeyLayout::separate(heads));
        let set = KeySet {
            k_nope: k.k_nope.clone(),
            k_rope: k.k_rope.clone(),
            v: k.v.clone().unwrap_or_default(),
        };
        (set, k)
    }

    /// Key `key`'s nope, rope and value parts set to NaN.
    fn poison(&mut self, heads: usize, key: usize) {
        let nan = 0x7fc0u16;
        self.k_nope[key * heads * 128..(key + 1) * heads * 128].fill(nan);
        self.k_rope[key * 64..(key + 1) * 64].fill(nan);
        self.v[key * heads * PREFILL_DV..(key + 1) * heads * PREFILL_DV].fill(nan);
    }

    fn rows(&self, heads: usize, rows: &[usize]) -> KeySet {
        KeySet {
            k_nope: take_rows(&self.k_nope, heads * 128, rows.iter().copied()),
            k_rope: take_rows(&self.k_rope, 64, rows.iter().copied()),
            v: take_rows(&self.v, heads * PREFILL_DV, rows.iter().copied()),
        }
    }
}

/// Runs `flash_prefill` (or the variant `tile`) over `rows` (queries, keys) with the given
/// queries and keys (separate layout); returns the output and the LSE.
fn run_prefill(
    dev: &GpuDevice,
    fk: &FlashKernels,
    tile: Option<PrefillTile>,
    heads: usize,
    rows: &[(usize, usize)],
    causal: bool,
    (q, k): (&[u16], &KeySet),
) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
    let (s, q_loc, k_loc) = shape_of(heads, rows, causal);
    assert!(prefill_rows_valid(&s, &q_loc, &k_loc), "rows {rows:?}");
    let out = upload(dev, &vec![UNWRITTEN; s.total_q * heads * PREFILL_DV])?;
    let lse = upload(dev, &vec![UNWRITTEN; s.total_q * heads])?;
    let (qd, nd) = (upload(dev, q)?, upload(dev, &k.k_nope)?);
    let (rd, vd) = (upload(dev, &k.k_rope)?, upload(dev, &k.v)?);
    let (ql, kl) = (upload(dev, &q_loc)?, upload(dev, &k_loc)?);
    let bufs = PrefillBufs {
        q: qd.ptr(),
        k_nope: nd.ptr(),
        k_rope: rd.ptr(),
        v: vd.ptr(),
        layout: PrefillKeyLayout::separate(heads),
        q_start_loc: ql.ptr(),
        k_start_loc: kl.ptr(),
        out: out.ptr(),
        lse: lse.ptr(),
    };
    let scale = 1.0 / (PREFILL_DQK as f32).sqrt();
    // SAFETY: the start locations passed prefill_rows_valid above.
    match tile {
        Some(t) => unsafe { fk.flash_prefill_with(t, dev, s, bufs, scale) }?,
        None => unsafe { fk.flash_prefill(dev, s, bufs, scale) }?,
    }
    let o = download(dev, &out)?[..s.total_q * heads * PREFILL_DV].to_vec();
    let l = download(dev, &lse)?[..s.total_q * heads].to_vec();
    Ok((o, l))
}

/// Batch invariance: row 1 of three causal rows gives the same bits alone as in the
/// batch (output, and its LSE out of the batch's `[heads, tokens]`), for each family
/// `flash_prefill` picks from. mma.sync: the batch's longest row (2100 queries) takes
/// 128-query CTAs, the row alone (1500) 64-query ones, so the CTA size must not change a
/// row's bits either. TMA (sm_90a): its boxes read past a row's keys into its
/// neighbours', which must not leak in.
pub fn check_prefill_invariance(
    dev: &GpuDevice,
    fk: &FlashKernels,
) -> Result<Vec<CaseResult>, GpuError> {
    let (heads, lens) = (16, [2100usize, 1500, 90]);
    let mut rng = ChaCha8Rng::seed_from_u64(960);
    let total: usize = lens.iter().sum();
    let (q, _) = bf16_vec(&mut rng, total * heads * PREFILL_DQK, 1.0);
    let (keys, _) = KeySet::random(&mut rng, total, heads);
    let rows: Vec<(usize, usize)> = lens.iter().map(|&l| (l, l)).collect();
    let mine: Vec<usize> = (lens[0]..lens[0] + lens[1]).collect();
    let q1 = take_rows(&q, heads * PREFILL_DQK, mine.iter().copied());
    let keys1 = keys.rows(heads, &mine);
    let mut families = vec![(PrefillTile::Rows128, PrefillTile::Rows64)];
    if fk.wide.hopper() {
        families.push((PrefillTile::Tma128, PrefillTile::Tma128));
    }
    let mut results = Vec::new();
    for (batched, single) in families {
        let (out, lse) = run_prefill(dev, fk, Some(batched), heads, &rows, true, (&q, &keys))?;
        let alone = run_prefill(
            dev,
            fk,
            Some(single),
            heads,
            &rows[1..2],
            true,
            (&q1, &keys1),
        )?;
        let w = heads * PREFILL_DV;
        let in_batch = &out[lens[0] * w..(lens[0] + lens[1]) * w];
        let lse_in_batch: Vec<f32> = (0..heads)
            .flat_map(|h| mine.iter().map(move |&t| (h, t)))
            .map(|(h, t)| lse[h * total + t])
            .collect();
        let same = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count()
        };
        let differ = same(in_batch, &alone.0) + same(&lse_in_batch, &alone.1);
        results.push(CaseResult {
            kernel: batched.function(),
            case: format!(
                "invariance: row of 1500 alone ({}) vs between rows of 2100 and 90 ({}): \
                 {differ} values differ",
                single.function(),
                batched.function()
            ),
            max_rel_err: differ as f64,
            passed: differ == 0,
        });
    }
    Ok(results)
}

/// The chunked prefill on the bf16 path: each row's new tokens causal over themselves,
/// its context non-causal, the two merged by LSE (`merge_states`), against one f64
/// softmax over context + new tokens. The merge runs as the backend's does (the context's
/// state, then the new tokens' merged into it); with it reading the new tokens' LSE
/// transposed (F1 as the catalog has it, the mutant) the same inputs must fail.
pub fn check_prefill_merge(
    dev: &GpuDevice,
    k: &Kernels,
    fk: &FlashKernels,
    case: MergeCase,
) -> Result<CaseResult, GpuError> {
    let f1 = case == MergeCase::F1;
    let heads = 16;
    let rows: [(usize, usize); 3] = [(9, 300), (64, 0), (37, 129)];
    let mut rng = ChaCha8Rng::seed_from_u64(970);
    let total_q: usize = rows.iter().map(|r| r.0).sum();
    let total_k: usize = rows.iter().map(|r| r.0 + r.1).sum();
    let (q_bits, q) = bf16_vec(&mut rng, total_q * heads * PREFILL_DQK, 1.0);
    let (keys, full) = KeySet::random(&mut rng, total_k, heads);
    // Each row's keys: its context, then its new tokens.
    let (mut ctx_rows, mut new_rows, mut at) = (Vec::new(), Vec::new(), 0);
    for &(q_len, ctx) in &rows {
        ctx_rows.extend(at..at + ctx);
        new_rows.extend(at + ctx..at + ctx + q_len);
        at += ctx + q_len;
    }
    let new_shape: Vec<(usize, usize)> = rows.iter().map(|r| (r.0, r.0)).collect();
    let ctx_shape: Vec<(usize, usize)> = rows.iter().map(|r| (r.0, r.1)).collect();
    let new = run_prefill(
        dev,
        fk,
        None,
        heads,
        &new_shape,
        true,
        (&q_bits, &keys.rows(heads, &new_rows)),
    )?;
    let mut ctx_keys = keys.rows(heads, &ctx_rows);
    if case == MergeCase::StaleContextKey {
        ctx_keys.poison(heads, STALE_KEY);
    }
    let ctx = run_prefill(
        dev,
        fk,
        None,
        heads,
        &ctx_shape,
        false,
        (&q_bits, &ctx_keys),
    )?;
    let (a_out, a_lse) = (upload(dev, &ctx.0)?, upload(dev, &ctx.1)?);
    let (b_out, b_lse) = (upload(dev, &new.0)?, upload(dev, &new.1)?);
    let d = MlaDims {
        heads,
        kv_lora: 512,
        rope: 64,
        nope: 128,
        v: PREFILL_DV,
    };
    let a = State {
        out: a_out.ptr(),
        lse: a_lse.ptr(),
    };
    let b = State {
        out: b_out.ptr(),
        lse: b_lse.ptr(),
    };
    k.merge(dev, d, a, b, total_q, f1)?;
    let (got_out, got_lse) = (download(dev, &a_out)?, download(dev, &a_lse)?);
    let q_loc = start_locs(rows.iter().map(|r| r.0));
    let k_loc = start_locs(rows.iter().map(|r| r.0 + r.1));
    let dims = (heads, PREFILL_DQK, PREFILL_DV);
    let (want_out, want_lse) = attention_f64(
        (&q, &full.k_ref, &full.v_ref),
        (&q_loc, &k_loc),
        dims,
        true,
        1.0 / (PREFILL_DQK as f64).sqrt(),
    );
    if case == MergeCase::StaleContextKey {
        return Ok(stale_key_result(
            rows,
            heads,
            (&got_out, &got_lse),
            (&want_out, &want_lse),
        ));
    }
    let err = max_rel_err(&got_out, &want_out).max(max_rel_err(&got_lse, &want_lse));
    Ok(CaseResult {
        kernel: "prefill+merge bf16",
        case: format!(
            "new tokens causal + context non-causal, merged, rows (q, ctx) {rows:?}{}",
            if f1 {
                "; mutant F1 (the new tokens' LSE read transposed): must fail"
            } else {
                ""
            }
        ),
        max_rel_err: err,
        // The mutant passes when it is caught.
        passed: (err <= BF16_TOL) != f1,
    })
}

/// What [`check_prefill_merge`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeCase {
    Clean,
    /// The catalog's F1: the new tokens' LSE read transposed (must be caught).
    F1,
    /// Context key [`STALE_KEY`] (row 0's) is NaN, as a latent read from a stale or
    /// missing slot is.
    StaleContextKey,
}

/// The context key poisoned by [`MergeCase::StaleContextKey`]: row 0's 151st.
const STALE_KEY: usize = 150;

/// The stale-key case: row 0's tokens come out NaN, output and LSE (the poison survives
/// the non-causal context pass and both merges instead of reading as an empty chunk),
/// and the other rows as the clean reference.
/// Columns `cols` of each head's row of a `[heads, total_q]` LSE array.
fn lse_cols<T: Copy>(v: &[T], heads: usize, cols: std::ops::Range<usize>) -> Vec<T> {
    let total_q = v.len() / heads;
    (0..heads)
        .flat_map(|h| v[h * total_q..(h + 1) * total_q][cols.clone()].to_vec())
        .collect()
}

fn stale_key_result(
    rows: [(usize, usize); 3],
    heads: usize,
    (got_out, got_lse): (&[f32], &[f32]),
    (want_out, want_lse): (&[f64], &[f64]),
) -> CaseResult {
    let total_q: usize = rows.iter().map(|r| r.0).sum();
    let row0 = rows[0].0 * heads;
    let poisoned_out = got_out[..row0 * PREFILL_DV].iter().all(|x| x.is_nan());
    // LSE [heads, tokens]: row 0's tokens are columns 0..q of each head.
    let poisoned_lse = lse_cols(got_lse, heads, 0..rows[0].0)
        .iter()
        .all(|x| x.is_nan());
    let rest = rows[0].0..total_q;
    let err = max_rel_err(
        &got_out[row0 * PREFILL_DV..],
        &want_out[row0 * PREFILL_DV..],
    )
    .max(max_rel_err(
        &lse_cols(got_lse, heads, rest.clone()),
        &lse_cols(want_lse, heads, rest),
    ));
    CaseResult {
        kernel: "prefill+merge bf16",
        case: format!(
            "rows (q, ctx) {rows:?}, context key {STALE_KEY} of row 0 NaN (a stale slot): row \
             0 all NaN (output {poisoned_out}, LSE {poisoned_lse}), the others as the \
             reference"
        ),
        max_rel_err: err,
        passed: poisoned_out && poisoned_lse && err <= BF16_TOL,
    }
}

/// `gather_latent_bf16` against a host gather through the same shuffled block table:
/// bit for bit, rows of 0, 1, 63, 64, 65 and 200 positions from position 0 and from
/// chunk starts (0, 5, 0, 17, 64, 17), and from 0 for half their length (the rest left
/// as it was), pages of 16; one table entry -1 and one row read past the table's width,
/// both of which must gather NaN.
pub fn check_gather_latent(dev: &GpuDevice, fk: &FlashKernels) -> Result<CaseResult, GpuError> {
    let (page, lens) = (16usize, [0usize, 1, 63, 64, 65, 200]);
    let width = 208usize.div_ceil(page);
    let mut rng = ChaCha8Rng::seed_from_u64(980);
    let blocks = lens.len() * width;
    let mut table: Vec<i32> = crate::checks::shuffled_ids(&mut rng, blocks);
    // Row 3 (from 17, 64 positions) meets a missing block at positions 32..48.
    table[3 * width + 2] = -1;
    let (cache, _) = bf16_vec(&mut rng, blocks * page * 576, 1.0);
    let k_loc = start_locs(lens.iter().copied());
    let total = *k_loc.last().unwrap() as usize;
    let (cd, td, kd) = (
        upload(dev, &cache)?,
        upload(dev, &table)?,
        upload(dev, &k_loc)?,
    );
    let mut passed = true;
    // From chunk starts, row 5 (from 17, 200 positions) reaches 216, past the 208
    // positions the width holds.
    // The third pass gathers the first half of each row only (a DFlash row's context):
    // the rest of its rows must stay as they were.
    let halves: Vec<i32> = lens.iter().map(|&l| (l / 2) as i32).collect();
    for (starts, short) in [
        ([0i32; 6], false),
        ([0, 5, 0, 17, 64, 17], false),
        ([0; 6], true),
    ] {
        let out = upload(dev, &vec![0xffffu16; total * 576])?;
        let sd = upload(dev, &starts)?;
        let hd = upload(dev, &halves)?;
        let from = starts.iter().any(|&s| s != 0).then(|| sd.ptr());
        // SAFETY: every table entry is -1 or a block inside the cache; positions past the
        // width are the kernel's own missing-block case.
        unsafe {
            fk.gather_latent_bf16(
                dev,
                cd.ptr(),
                td.ptr(),
                (kd.ptr(), from, short.then(|| hd.ptr())),
                (lens.len(), width, page, 200),
                out.ptr(),
            )
        }?;
        let got = download(dev, &out)?;
        let mut want = Vec::with_capacity(total * 576);
        for (b, &len) in lens.iter().enumerate() {
            for j in 0..len {
                if short && j >= len / 2 {
                    want.extend(std::iter::repeat_n(0xffffu16, 576));
                    continue;
                }
                let pos = starts[b] as usize + j;
                let blk = match pos / page < width {
                    true => table[b * width + pos / page],
                    false => -1,
                };
                match blk {
                    -1 => want.extend(std::iter::repeat_n(0x7fc0u16, 576)),
                    blk => {
                        let slot = blk as usize * page + pos % page;
                        want.extend_from_slice(&cache[slot * 576..(slot + 1) * 576]);
                    }
                }
            }
        }
        passed &= got == want;
    }
    Ok(CaseResult {
        kernel: "gather_latent_bf16",
        case: format!(
            "page {page}, rows of {lens:?} positions from 0, from chunk starts and their first \
             halves only, a missing block and a row past the width gathering NaN, bit for bit"
        ),
        max_rel_err: if passed { 0.0 } else { 1.0 },
        passed,
    })
}
