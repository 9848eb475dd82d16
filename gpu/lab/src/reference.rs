//! f64 references the kernels are checked against: deliberately simple loops over the
//! same layouts.

/// Reference uniform decode over a paged cache, with the causal mask inside the query
/// block (token j of a q_len block sees keys below seq_len - q_len + j + 1). Returns
/// out [tokens, heads, dv] and lse [heads, tokens].
#[allow(clippy::too_many_arguments)]
pub fn decode_f64(
    q: &[f32],
    cache: &[f32],
    block_table: &[i32],
    seq_lens: &[i32],
    (q_len, heads, dim, dv, page, width): (usize, usize, usize, usize, usize, usize),
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let rows = seq_lens.len();
    let tokens = rows * q_len;
    let mut out = vec![0.0; tokens * heads * dv];
    let mut lse = vec![f64::NEG_INFINITY; heads * tokens];
    for t in 0..tokens {
        let (r, j) = (t / q_len, t % q_len);
        let limit = (seq_lens[r] as i64 - q_len as i64 + j as i64 + 1).max(0) as usize;
        for h in 0..heads {
            let qv = &q[(t * heads + h) * dim..][..dim];
            // A position on a missing block (-1, or past the table's width) poisons the
            // row: output and LSE NaN, as a read of the CPU's NaN-initialized cache does.
            let block = |pos: usize| match pos / page {
                p if p < width => usize::try_from(block_table[r * width + p]).ok(),
                _ => None,
            };
            if (0..limit).any(|p| block(p).is_none()) {
                out[(t * heads + h) * dv..][..dv].fill(f64::NAN);
                lse[h * tokens + t] = f64::NAN;
                continue;
            }
            let key = |pos: usize| {
                let slot = block(pos).unwrap_or_default() * page + pos % page;
                &cache[slot * dim..][..dim]
            };
            let scores: Vec<f64> = (0..limit)
                .map(|p| {
                    qv.iter()
                        .zip(key(p))
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let Some(m) = scores.iter().cloned().reduce(f64::max) else {
                continue;
            };
            let sum: f64 = scores.iter().map(|s| (s - m).exp()).sum();
            lse[h * tokens + t] = m + sum.ln();
            let o = &mut out[(t * heads + h) * dv..][..dv];
            for (p, s) in scores.iter().enumerate() {
                let w = (s - m).exp() / sum;
                for (od, &kd) in o.iter_mut().zip(&key(p)[..dv]) {
                    *od += w * kd as f64;
                }
            }
        }
    }
    (out, lse)
}

/// Reference materialized attention of the last `m` of `n` latent rows' queries over all
/// `n` keys, causal (one softmax over context + new tokens). w_uk [H][kv_lora][nope],
/// w_uv [H][kv_lora][dv]. Returns out [m, H, dv] and lse [H, m].
#[allow(clippy::too_many_arguments)]
pub fn prefill_f64(
    q: &[f32],
    latent: &[f32],
    w_uk: &[f32],
    w_uv: &[f32],
    m: usize,
    n: usize,
    (heads, kv_lora, rope, nope, dv): (usize, usize, usize, usize, usize),
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let dim = kv_lora + rope;
    let expand = |j: usize, h: usize, w: &[f32], width: usize, e: usize| -> f64 {
        (0..kv_lora)
            .map(|x| latent[j * dim + x] as f64 * w[(h * kv_lora + x) * width + e] as f64)
            .sum()
    };
    let mut out = vec![0.0; m * heads * dv];
    let mut lse = vec![f64::NEG_INFINITY; heads * m];
    for i in 0..m {
        let visible = n - m + i + 1;
        for h in 0..heads {
            let qv = &q[(i * heads + h) * (nope + rope)..][..nope + rope];
            let scores: Vec<f64> = (0..visible)
                .map(|j| {
                    let a: f64 = (0..nope)
                        .map(|e| qv[e] as f64 * expand(j, h, w_uk, nope, e))
                        .sum();
                    let b: f64 = (0..rope)
                        .map(|e| qv[nope + e] as f64 * latent[j * dim + kv_lora + e] as f64)
                        .sum();
                    (a + b) * scale
                })
                .collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|s| (s - mx).exp()).sum();
            lse[h * m + i] = mx + sum.ln();
            for e in 0..dv {
                out[(i * heads + h) * dv + e] = scores
                    .iter()
                    .enumerate()
                    .map(|(j, s)| (s - mx).exp() / sum * expand(j, h, w_uv, dv, e))
                    .sum();
            }
        }
    }
    (out, lse)
}

/// Reference varlen attention over materialized per-head K and V (the layout of the
/// bf16 prefill kernel): q [tokens, H, dqk], k [keys, H, dqk], v [keys, H, dv]; row b's
/// queries `q_loc[b]..q_loc[b + 1]`, keys `k_loc[b]..k_loc[b + 1]`. Causal: query i of q
/// over k keys sees keys below `k - q + i + 1`. Returns out [tokens, H, dv] and lse
/// [H, tokens]; a query that sees no key gets 0 and -inf.
#[allow(clippy::too_many_arguments)]
pub fn attention_f64(
    (q, k, v): (&[f32], &[f32], &[f32]),
    (q_loc, k_loc): (&[i32], &[i32]),
    (heads, dqk, dv): (usize, usize, usize),
    causal: bool,
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let total_q = *q_loc.last().unwrap_or(&0) as usize;
    let mut out = vec![0.0; total_q * heads * dv];
    let mut lse = vec![f64::NEG_INFINITY; heads * total_q];
    for b in 0..q_loc.len().saturating_sub(1) {
        let (q0, q_len) = (q_loc[b] as usize, (q_loc[b + 1] - q_loc[b]) as usize);
        let (k0, k_len) = (k_loc[b] as usize, (k_loc[b + 1] - k_loc[b]) as usize);
        for i in 0..q_len {
            let visible = if causal {
                (k_len + i + 1).saturating_sub(q_len)
            } else {
                k_len
            };
            for h in 0..heads {
                let qv = &q[((q0 + i) * heads + h) * dqk..][..dqk];
                let scores: Vec<f64> = (0..visible)
                    .map(|j| {
                        let kv = &k[((k0 + j) * heads + h) * dqk..][..dqk];
                        qv.iter()
                            .zip(kv)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                if scores.is_empty() {
                    continue;
                }
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                let sum: f64 = w.iter().sum();
                lse[h * total_q + q0 + i] = mx + sum.ln();
                let o = &mut out[((q0 + i) * heads + h) * dv..][..dv];
                for (j, wj) in w.iter().enumerate() {
                    let vv = &v[((k0 + j) * heads + h) * dv..][..dv];
                    for (oe, &ve) in o.iter_mut().zip(vv) {
                        *oe += wj / sum * ve as f64;
                    }
                }
            }
        }
    }
    (out, lse)
}

#[cfg(test)]
mod tests {
    use super::decode_f64;

    /// Two rows of one head (dqk 1, dv 1): row 0 causal, 2 queries over 3 keys, the first
    /// seeing keys 0..2; row 1 no keys at all. Equal scores give plain averages.
    #[test]
    fn attention_reference_masks_the_tail_and_empty_rows() {
        let (q, k, v) = ([0.0f32, 0.0, 0.0], [0.0f32, 0.0, 0.0], [1.0f32, 2.0, 3.0]);
        let (out, lse) =
            super::attention_f64((&q, &k, &v), (&[0, 2, 3], &[0, 3, 3]), (1, 1, 1), true, 1.0);
        assert_eq!(&out[..2], &[1.5, 2.0]);
        assert_eq!(out[2], 0.0);
        assert!((lse[0] - 2f64.ln()).abs() < 1e-12 && (lse[1] - 3f64.ln()).abs() < 1e-12);
        assert_eq!(lse[2], f64::NEG_INFINITY);
    }

    /// One request of seq_len 3 and q_len 2, page 2, one head of width 1, keys 1..4 on
    /// blocks [0, 1]: the first token sees positions 0..2 (block 0 only), the second
    /// 0..3 (position 2 is on block 1). Taking block 1 away poisons the second token
    /// alone; with seq_len 4 both tokens see block 1.
    #[test]
    fn a_missing_block_poisons_exactly_the_rows_that_see_it() {
        let cache = [1.0f32, 2.0, 3.0, 4.0];
        let q = [1.0f32, 1.0];
        let shape = (2, 1, 1, 1, 2, 2);
        let (whole_out, whole_lse) = decode_f64(&q, &cache, &[0, 1], &[3], shape, 1.0);
        let (out, lse) = decode_f64(&q, &cache, &[0, -1], &[3], shape, 1.0);
        assert_eq!((out[0], lse[0]), (whole_out[0], whole_lse[0]));
        assert!(out[1].is_nan() && lse[1].is_nan());
        // A table one page short reads the same as a -1 there.
        let short = (2, 1, 1, 1, 2, 1);
        let (out, lse) = decode_f64(&q, &cache, &[0], &[3], short, 1.0);
        assert_eq!((out[0], lse[0]), (whole_out[0], whole_lse[0]));
        assert!(out[1].is_nan() && lse[1].is_nan());
        let (out, _) = decode_f64(&q, &cache, &[0, -1], &[4], shape, 1.0);
        assert!(out.iter().all(|v| v.is_nan()));
    }
}
