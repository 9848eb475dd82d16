//! Verification of draft tokens against the target's logits: greedy (longest matching
//! prefix plus a bonus token) and seeded rejection sampling for temperature > 0.

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::grammar::{masked_argmax, TokenMask};

/// Result of verifying one sampling row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowVerify {
    pub req_id: u64,
    /// Greedy: the target's choice at each verify position (1 + drafts). Rejection
    /// sampling: the emitted tokens (a choice past the first rejection is never drawn).
    pub sampled: Vec<u32>,
    pub num_accepted: usize,
    /// Accepted drafts then the bonus token.
    pub new_tokens: Vec<u32>,
    /// Smallest top-2 logit margin over the positions whose choice was kept.
    pub min_margin: f32,
}

/// Greedy verification: accept drafts while they equal the target's (masked) argmax.
/// `logits[i]` and `masks[i]` belong to verify position i (0..=drafts.len()).
pub fn verify_greedy(
    req_id: u64,
    drafts: &[u32],
    logits: &[&[f32]],
    masks: &[Option<&TokenMask>],
) -> RowVerify {
    let choices: Vec<(u32, f32)> = logits
        .iter()
        .zip(masks)
        .map(|(l, m)| masked_argmax(l, *m))
        .collect();
    let sampled: Vec<u32> = choices.iter().map(|c| c.0).collect();
    let num_accepted = drafts
        .iter()
        .zip(&sampled)
        .take_while(|(d, s)| d == s)
        .count();
    let mut new_tokens = drafts[..num_accepted].to_vec();
    new_tokens.push(sampled[num_accepted]);
    let min_margin = choices[..=num_accepted]
        .iter()
        .map(|c| c.1)
        .fold(f32::INFINITY, f32::min);
    RowVerify {
        req_id,
        sampled,
        num_accepted,
        new_tokens,
        min_margin,
    }
}

/// Softmax of `logits / temperature` restricted to the mask.
pub fn probs(logits: &[f32], temperature: f32, mask: Option<&TokenMask>) -> Vec<f32> {
    let allowed = |t: usize| mask.is_none_or(|m| m.allows(t as u32));
    let max = logits
        .iter()
        .enumerate()
        .filter(|(t, _)| allowed(*t))
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    let mut p: Vec<f32> = logits
        .iter()
        .enumerate()
        .map(|(t, &v)| {
            if allowed(t) {
                ((v - max) / temperature).exp()
            } else {
                0.0
            }
        })
        .collect();
    let sum: f32 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= sum);
    p
}

/// Draws a token from a probability vector.
pub fn sample(p: &[f32], rng: &mut impl Rng) -> u32 {
    let u: f32 = rng.gen();
    let mut acc = 0.0;
    for (t, &x) in p.iter().enumerate() {
        acc += x;
        if u < acc {
            return t as u32;
        }
    }
    // Rounding left u above the total: take the last token with mass.
    p.iter().rposition(|&x| x > 0.0).unwrap_or(0) as u32
}

/// Standard speculative rejection sampling: accept draft i with probability
/// min(1, p_i(d)/q_i(d)); on the first rejection sample from norm(max(0, p_i - q_i));
/// if all are accepted, sample the bonus from p_K. The output is distributed exactly as
/// sampling from the target alone. An empty `q_i` is the target's own distribution (a
/// draft the acceptance controller drew from it): p/q = 1, so it is accepted.
pub fn verify_rejection(
    req_id: u64,
    drafts: &[u32],
    target_probs: &[Vec<f32>],
    draft_probs: &[Vec<f32>],
    rng: &mut impl Rng,
) -> RowVerify {
    let mut new_tokens = Vec::with_capacity(drafts.len() + 1);
    for (i, &d) in drafts.iter().enumerate() {
        let (p, q) = (&target_probs[i], &draft_probs[i]);
        let u: f32 = rng.gen();
        if q.is_empty() || u * q[d as usize] <= p[d as usize] {
            new_tokens.push(d);
            continue;
        }
        let mut residual: Vec<f32> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
        let sum: f32 = residual.iter().sum();
        if sum > 0.0 {
            residual.iter_mut().for_each(|x| *x /= sum);
        } else {
            residual.clone_from(p);
        }
        new_tokens.push(sample(&residual, rng));
        let num_accepted = i;
        return RowVerify {
            req_id,
            sampled: new_tokens.clone(),
            num_accepted,
            new_tokens,
            min_margin: f32::INFINITY,
        };
    }
    new_tokens.push(sample(&target_probs[drafts.len()], rng));
    let num_accepted = drafts.len();
    RowVerify {
        req_id,
        sampled: new_tokens.clone(),
        num_accepted,
        new_tokens,
        min_margin: f32::INFINITY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_accepts_longest_matching_prefix_plus_bonus() {
        let l0 = [0.0, 1.0, 0.0];
        let l1 = [2.0, 0.0, 0.0];
        let l2 = [0.0, 0.0, 3.0];
        let v = verify_greedy(7, &[1, 1], &[&l0, &l1, &l2], &[None, None, None]);
        assert_eq!(v.sampled, vec![1, 0, 2]);
        assert_eq!(v.num_accepted, 1);
        assert_eq!(v.new_tokens, vec![1, 0]);
    }
}
