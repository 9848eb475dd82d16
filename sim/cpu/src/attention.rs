//! MLA attention over latent KV rows in its two mathematically equal forms (RULES §5 and
//! §10): absorbed (the decode kernels' form: W_UK folded into the query, one KV head
//! shared by all query heads, W_UV applied after the softmax) and materialized (the prefill
//! form: per-head K and V expanded from the latent rows), plus the log-sum-exp merge that
//! folds context chunks into the new tokens' result.
//!
//! Layouts: a query block is `[m tokens][H][nope | rope]` (RoPE applied); keys are latent
//! rows `[n][c_kv (kv_lora) | k_rope (rope)]` and V is their `c_kv` part; outputs are
//! `[m tokens][H][v]`; LSEs (natural log) are `[H][m]`, addressed only through
//! [`lse_index`].

pub use specmla_core::config::MlaDims;

use crate::model::{axpy, dot, matvec, MlaLayer};

/// Which keys each query of a block may see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mask {
    /// Every query sees all `n` keys (context chunks, DFlash blocks).
    Full,
    /// The `m` queries are the last `m` of the `n` keys: query `i` sees keys
    /// `j < n - m + i + 1`.
    CausalTail,
}

impl Mask {
    /// How many keys (always a prefix) query `i` of `m` sees among `n`.
    pub fn visible(self, i: usize, m: usize, n: usize) -> usize {
        match self {
            Mask::Full => n,
            Mask::CausalTail => (n + i + 1).saturating_sub(m).min(n),
        }
    }
}

/// Where the LSE of head `h`, token `t` of an `m`-token block lives: `[heads, tokens]`.
/// Every LSE access in this module goes through here; the F1 fault (a transposed read)
/// acts in the backend's prefill merge, where the real bug lived.
pub fn lse_index(h: usize, t: usize, m: usize) -> usize {
    h * m + t
}

/// Attention output of an `m`-token query block.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnOutput {
    /// `[m][H][v]`; zero for a query that saw no key.
    pub out: Vec<f32>,
    /// `[H][m]` natural-log sum of the scaled exp-scores; `-inf` for a query that saw no key.
    pub lse: Vec<f32>,
}

impl AttnOutput {
    /// The result of attending to no keys: the identity of [`merge_attention_states`].
    pub fn empty(m: usize, dims: &MlaDims) -> Self {
        Self {
            out: vec![0.0; m * dims.heads * dims.v],
            lse: vec![f32::NEG_INFINITY; dims.heads * m],
        }
    }
}

/// Turns scores into probabilities in place and returns their log-sum-exp (`-inf` when
/// there are none). Subtracting the max keeps exp in range for any score scale.
fn softmax(scores: &mut [f32]) -> f32 {
    if scores.is_empty() {
        return f32::NEG_INFINITY;
    }
    let mx = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for s in scores.iter_mut() {
        *s = (*s - mx).exp();
        sum += *s;
    }
    for s in scores.iter_mut() {
        *s /= sum;
    }
    mx + sum.ln()
}

fn check_shapes(dims: &MlaDims, q: &[f32], m: usize, keys: &[f32], n: usize) {
    assert_eq!(q.len(), m * dims.heads * dims.qk(), "query block shape");
    assert_eq!(keys.len(), n * dims.latent(), "latent rows shape");
}

/// `(q_nope, q_rope)` of token `t`, head `h`.
fn query_parts<'q>(dims: &MlaDims, q: &'q [f32], t: usize, h: usize) -> (&'q [f32], &'q [f32]) {
    let start = (t * dims.heads + h) * dims.qk();
    q[start..start + dims.qk()].split_at(dims.nope)
}

fn latent_row<'k>(dims: &MlaDims, keys: &'k [f32], j: usize) -> (&'k [f32], &'k [f32]) {
    keys[j * dims.latent()..(j + 1) * dims.latent()].split_at(dims.kv_lora)
}

fn w_uk_head<'w>(dims: &MlaDims, layer: &'w MlaLayer, h: usize) -> &'w [f32] {
    let size = dims.kv_lora * dims.nope;
    &layer.w_uk[h * size..(h + 1) * size]
}

fn w_uv_head<'w>(dims: &MlaDims, layer: &'w MlaLayer, h: usize) -> &'w [f32] {
    let size = dims.kv_lora * dims.v;
    &layer.w_uv[h * size..(h + 1) * size]
}

/// Runs `head(t, h, visible)` for every query token and head of an `m`-token block over
/// `n` keys and collects each `(output [v], lse)` into the block's result.
fn per_query(
    dims: &MlaDims,
    (m, n, mask): (usize, usize, Mask),
    mut head: impl FnMut(usize, usize, usize) -> (Vec<f32>, f32),
) -> AttnOutput {
    let mut res = AttnOutput::empty(m, dims);
    for t in 0..m {
        let visible = mask.visible(t, m, n);
        for h in 0..dims.heads {
            let (o, lse) = head(t, h, visible);
            let start = (t * dims.heads + h) * dims.v;
            res.out[start..start + dims.v].copy_from_slice(&o);
            res.lse[lse_index(h, t, m)] = lse;
        }
    }
    res
}

/// Decode form: per head, `q_lat = W_UK_h q_nope` scores directly against the cached
/// `c_kv`, the probabilities average `c_kv` itself, and W_UV is applied once to that
/// average. `q` holds `m` tokens, `keys` holds `n` latent rows.
pub fn absorbed_attention(
    dims: &MlaDims,
    layer: &MlaLayer,
    q: &[f32],
    m: usize,
    keys: &[f32],
    n: usize,
    mask: Mask,
) -> AttnOutput {
    check_shapes(dims, q, m, keys, n);
    let scale = dims.softmax_scale();
    per_query(dims, (m, n, mask), |t, h, visible| {
        let (q_nope, q_rope) = query_parts(dims, q, t, h);
        let w_uk = w_uk_head(dims, layer, h);
        let q_lat: Vec<f32> = w_uk
            .chunks_exact(dims.nope)
            .map(|r| dot(r, q_nope))
            .collect();
        let mut p: Vec<f32> = (0..visible)
            .map(|j| {
                let (c_kv, k_rope) = latent_row(dims, keys, j);
                (dot(&q_lat, c_kv) + dot(q_rope, k_rope)) * scale
            })
            .collect();
        let lse = softmax(&mut p);
        let mut out_lat = vec![0.0; dims.kv_lora];
        for (j, pj) in p.iter().enumerate() {
            axpy(&mut out_lat, *pj, latent_row(dims, keys, j).0);
        }
        let w_uv = w_uv_head(dims, layer, h);
        (matvec(&out_lat, w_uv, dims.kv_lora, dims.v), lse)
    })
}

/// Per-head keys and values expanded from `n` latent rows: `k_nope [H][n][nope]`,
/// `v [H][n][v]`.
fn materialize(dims: &MlaDims, layer: &MlaLayer, keys: &[f32], n: usize) -> (Vec<f32>, Vec<f32>) {
    let mut k_nope = Vec::with_capacity(dims.heads * n * dims.nope);
    let mut v = Vec::with_capacity(dims.heads * n * dims.v);
    for h in 0..dims.heads {
        let (w_uk, w_uv) = (w_uk_head(dims, layer, h), w_uv_head(dims, layer, h));
        for j in 0..n {
            let c_kv = latent_row(dims, keys, j).0;
            k_nope.extend(matvec(c_kv, w_uk, dims.kv_lora, dims.nope));
            v.extend(matvec(c_kv, w_uv, dims.kv_lora, dims.v));
        }
    }
    (k_nope, v)
}

/// Prefill form: K and V are expanded per head once for all `n` keys, then ordinary
/// multi-head attention with the shared `k_rope`.
pub fn materialized_attention(
    dims: &MlaDims,
    layer: &MlaLayer,
    q: &[f32],
    m: usize,
    keys: &[f32],
    n: usize,
    mask: Mask,
) -> AttnOutput {
    check_shapes(dims, q, m, keys, n);
    let scale = dims.softmax_scale();
    let (k_nope, v) = materialize(dims, layer, keys, n);
    per_query(dims, (m, n, mask), |t, h, visible| {
        let (q_nope, q_rope) = query_parts(dims, q, t, h);
        let mut p: Vec<f32> = (0..visible)
            .map(|j| {
                let k = &k_nope[(h * n + j) * dims.nope..][..dims.nope];
                (dot(q_nope, k) + dot(q_rope, latent_row(dims, keys, j).1)) * scale
            })
            .collect();
        let lse = softmax(&mut p);
        let mut o = vec![0.0; dims.v];
        for (j, pj) in p.iter().enumerate() {
            axpy(&mut o, *pj, &v[(h * n + j) * dims.v..][..dims.v]);
        }
        (o, lse)
    })
}

/// Combines two partial results over disjoint key sets of the same `m` queries as if one
/// softmax had run over their union. An empty side (`lse = -inf`) has weight zero, and two
/// empty sides stay empty.
pub fn merge_attention_states(
    a: &AttnOutput,
    b: &AttnOutput,
    m: usize,
    dims: &MlaDims,
) -> AttnOutput {
    let mut res = AttnOutput::empty(m, dims);
    for t in 0..m {
        for h in 0..dims.heads {
            let i = lse_index(h, t, m);
            let (la, lb) = (a.lse[i], b.lse[i]);
            let mx = la.max(lb);
            if mx == f32::NEG_INFINITY {
                continue;
            }
            let (wa, wb) = ((la - mx).exp(), (lb - mx).exp());
            let start = (t * dims.heads + h) * dims.v;
            for k in start..start + dims.v {
                res.out[k] = (a.out[k] * wa + b.out[k] * wb) / (wa + wb);
            }
            res.lse[i] = mx + (wa + wb).ln();
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    fn setup(seed: u64) -> (MlaDims, MlaLayer, ChaCha8Rng) {
        let dims = specmla_core::config::ModelDims::tiny();
        let rng = ChaCha8Rng::seed_from_u64(seed);
        let layer = MlaLayer::from_seed(&dims, seed, 0);
        (MlaDims::from(&dims), layer, rng)
    }

    /// Wide enough that some softmaxes are peaked, not all near uniform.
    fn rand_vec(rng: &mut ChaCha8Rng, len: usize, half_width: f32) -> Vec<f32> {
        (0..len)
            .map(|_| rng.gen_range(-half_width..half_width))
            .collect()
    }

    fn max_rel_err(a: &[f32], b: &[f32]) -> f32 {
        let scale = b.iter().fold(1e-3f32, |s, v| s.max(v.abs()));
        a.iter()
            .zip(b)
            .fold(0.0f32, |e, (x, y)| e.max((x - y).abs()))
            / scale
    }

    #[test]
    fn absorbed_and_materialized_agree() {
        let (dims, layer, mut rng) = setup(21);
        let mut worst = 0.0f32;
        for mask in [Mask::Full, Mask::CausalTail] {
            for m in [1, 3, 5] {
                for n in [1, 7, 40] {
                    let q = rand_vec(&mut rng, m * dims.heads * dims.qk(), 4.0);
                    let keys = rand_vec(&mut rng, n * dims.latent(), 2.0);
                    let a = absorbed_attention(&dims, &layer, &q, m, &keys, n, mask);
                    let b = materialized_attention(&dims, &layer, &q, m, &keys, n, mask);
                    let finite = |l: &Vec<f32>| l.iter().map(|v| v.max(-1e4)).collect::<Vec<_>>();
                    let err = max_rel_err(&a.out, &b.out)
                        .max(max_rel_err(&finite(&a.lse), &finite(&b.lse)));
                    assert!(err < 1e-4, "{mask:?} m={m} n={n}: rel err {err}");
                    assert_eq!(
                        a.lse.iter().filter(|l| l.is_infinite()).count(),
                        b.lse.iter().filter(|l| l.is_infinite()).count()
                    );
                    worst = worst.max(err);
                }
            }
        }
        // Observed worst relative error: ~1e-6.
        eprintln!("absorbed vs materialized worst rel err {worst:e}");
    }

    #[test]
    fn lse_is_the_log_sum_exp_of_the_scaled_scores() {
        let (dims, layer, mut rng) = setup(25);
        let n = 5;
        let q = rand_vec(&mut rng, dims.heads * dims.qk(), 4.0);
        let keys = rand_vec(&mut rng, n * dims.latent(), 2.0);
        let h = dims.heads - 1;
        let (q_nope, q_rope) = query_parts(&dims, &q, 0, h);
        // Scores written out from the definition, in f64, independent of both forms.
        let want = (0..n)
            .map(|j| {
                let (c_kv, k_rope) = latent_row(&dims, &keys, j);
                let k_nope = matvec(c_kv, w_uk_head(&dims, &layer, h), dims.kv_lora, dims.nope);
                let s = f64::from(dot(q_nope, &k_nope) + dot(q_rope, k_rope));
                (s / (dims.qk() as f64).sqrt()).exp()
            })
            .sum::<f64>()
            .ln();
        for form in [absorbed_attention, materialized_attention] {
            let got = form(&dims, &layer, &q, 1, &keys, n, Mask::Full).lse[lse_index(h, 0, 1)];
            assert!((f64::from(got) - want).abs() < 1e-5, "lse {got} vs {want}");
        }
    }

    #[test]
    fn causal_tail_hides_future_keys() {
        let (dims, layer, mut rng) = setup(22);
        let (m, n) = (3, 6);
        let q = rand_vec(&mut rng, m * dims.heads * dims.qk(), 4.0);
        let mut keys = rand_vec(&mut rng, n * dims.latent(), 2.0);
        let before = materialized_attention(&dims, &layer, &q, m, &keys, n, Mask::CausalTail);
        // Only the last query sees the last key, so perturbing it must leave the
        // other queries bit-identical.
        keys[(n - 1) * dims.latent()] += 1.0;
        let after = materialized_attention(&dims, &layer, &q, m, &keys, n, Mask::CausalTail);
        let row = dims.heads * dims.v;
        assert_eq!(before.out[..2 * row], after.out[..2 * row]);
        assert_ne!(before.out[2 * row..], after.out[2 * row..]);
    }

    type Attn = fn(&MlaDims, &MlaLayer, &[f32], usize, &[f32], usize, Mask) -> AttnOutput;

    #[test]
    fn chunked_context_merge_equals_one_softmax() {
        let (dims, layer, mut rng) = setup(23);
        let lat = dims.latent();
        let forms: [Attn; 2] = [materialized_attention, absorbed_attention];
        for (case, form) in (0..6).zip(forms.iter().cycle()) {
            let (ctx, m) = (rng.gen_range(4..30), rng.gen_range(1..6));
            let q = rand_vec(&mut rng, m * dims.heads * dims.qk(), 4.0);
            let keys = rand_vec(&mut rng, (ctx + m) * lat, 2.0);
            let run = |rows: &[f32], mask| form(&dims, &layer, &q, m, rows, rows.len() / lat, mask);
            let whole = run(&keys, Mask::CausalTail);
            let new = run(&keys[ctx * lat..], Mask::CausalTail);
            // 2-4 chunks with random (non-empty) boundaries.
            let mut cuts: Vec<usize> = (0..rng.gen_range(1..4))
                .map(|_| rng.gen_range(1..ctx))
                .collect();
            cuts.extend([0, ctx]);
            cuts.sort_unstable();
            cuts.dedup();
            let chunks: Vec<AttnOutput> = cuts
                .windows(2)
                .map(|w| run(&keys[w[0] * lat..w[1] * lat], Mask::Full))
                .collect();
            let merge = |a: &AttnOutput, b: &AttnOutput| merge_attention_states(a, b, m, &dims);
            let forward = chunks.iter().fold(new.clone(), |acc, c| merge(&acc, c));
            let backward = chunks
                .iter()
                .rev()
                .fold(AttnOutput::empty(m, &dims), |acc, c| merge(c, &acc));
            let backward = merge(&backward, &new);
            for got in [&forward, &backward] {
                let err = max_rel_err(&got.out, &whole.out).max(max_rel_err(&got.lse, &whole.lse));
                assert!(
                    err < 1e-5,
                    "case {case} ctx={ctx} m={m} cuts={cuts:?}: err {err}"
                );
            }
        }
    }

    #[test]
    fn merge_with_empty_side_is_exact() {
        let (dims, layer, mut rng) = setup(24);
        let (m, n) = (3, 9);
        let q = rand_vec(&mut rng, m * dims.heads * dims.qk(), 4.0);
        let keys = rand_vec(&mut rng, n * dims.latent(), 2.0);
        let full = absorbed_attention(&dims, &layer, &q, m, &keys, n, Mask::Full);
        // A query block over zero keys is the natural empty side.
        let none = absorbed_attention(&dims, &layer, &q, m, &[], 0, Mask::Full);
        assert_eq!(none, AttnOutput::empty(m, &dims));
        assert_eq!(merge_attention_states(&full, &none, m, &dims), full);
        assert_eq!(merge_attention_states(&none, &full, m, &dims), full);
        assert_eq!(merge_attention_states(&none, &none, m, &dims), none);
    }
}
