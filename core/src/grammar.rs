//! Constrained decoding: a small token-level automaton per request and the token masks
//! of verify positions. The mask of verify position i derives from the committed state
//! advanced by the row's first i draft tokens, whatever the row layout of the batch.

use std::sync::Arc;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// A deterministic finite automaton over token ids: `next[state * vocab + token]` is the
/// next state, or -1 when the token is not allowed in that state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenAutomaton {
    pub num_states: usize,
    pub vocab_size: usize,
    next: Vec<i32>,
    /// The seed it was drawn from, so a trace can rebuild it.
    pub seed: u64,
}

/// A bitset over the vocabulary: bit t set means token t is allowed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TokenMask {
    pub words: Vec<u64>,
}

impl TokenMask {
    /// Whether `token` is allowed.
    pub fn allows(&self, token: u32) -> bool {
        let t = token as usize;
        self.words
            .get(t / 64)
            .is_some_and(|w| w >> (t % 64) & 1 == 1)
    }
}

/// Where an automaton stands after a sequence of tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GrammarState {
    Live(u32),
    /// A token outside the grammar was consumed (only drafts can do this).
    Dead,
}

impl TokenAutomaton {
    /// A random automaton: each state allows roughly `allowed_fraction` of the vocab
    /// (at least one token) and moves to a random state.
    pub fn random(num_states: usize, vocab_size: usize, allowed_fraction: f64, seed: u64) -> Self {
        let mut rng = crate::rng::stream_rng(seed, crate::rng::Stream::Grammar);
        let mut next = vec![-1i32; num_states * vocab_size];
        for s in 0..num_states {
            let row = &mut next[s * vocab_size..(s + 1) * vocab_size];
            for cell in row.iter_mut() {
                if rng.gen_bool(allowed_fraction) {
                    *cell = rng.gen_range(0..num_states) as i32;
                }
            }
            let forced = rng.gen_range(0..vocab_size);
            row[forced] = rng.gen_range(0..num_states) as i32;
        }
        Self {
            num_states,
            vocab_size,
            next,
            seed,
        }
    }

    /// The state after consuming `token` in `state`.
    pub fn advance(&self, state: GrammarState, token: u32) -> GrammarState {
        match state {
            GrammarState::Live(s) if (token as usize) < self.vocab_size => {
                match self.next[s as usize * self.vocab_size + token as usize] {
                    -1 => GrammarState::Dead,
                    n => GrammarState::Live(n as u32),
                }
            }
            _ => GrammarState::Dead,
        }
    }

    /// The tokens allowed in `state`; a dead state allows everything, because nothing
    /// sampled after a rejected draft is kept.
    pub fn mask(&self, state: GrammarState) -> TokenMask {
        let words = self.vocab_size.div_ceil(64);
        let mut mask = TokenMask {
            words: vec![0; words],
        };
        match state {
            GrammarState::Live(s) => {
                let row = &self.next[s as usize * self.vocab_size..][..self.vocab_size];
                for (t, &n) in row.iter().enumerate() {
                    if n >= 0 {
                        mask.words[t / 64] |= 1 << (t % 64);
                    }
                }
            }
            GrammarState::Dead => {
                for t in 0..self.vocab_size {
                    mask.words[t / 64] |= 1 << (t % 64);
                }
            }
        }
        mask
    }

    /// Masks of the `drafts.len() + 1` verify positions of one row: position i is
    /// constrained by the committed `state` advanced by `drafts[..i]`.
    pub fn verify_masks(&self, state: GrammarState, drafts: &[u32]) -> Vec<TokenMask> {
        let mut out = Vec::with_capacity(drafts.len() + 1);
        let mut s = state;
        out.push(self.mask(s));
        for &d in drafts {
            s = self.advance(s, d);
            out.push(self.mask(s));
        }
        out
    }
}

/// A request's grammar: the shared automaton and the state after its committed output.
#[derive(Clone, Debug)]
pub struct RequestGrammar {
    pub automaton: Arc<TokenAutomaton>,
    pub state: GrammarState,
}

/// Index of the largest logit among allowed tokens; ties go to the lower id so the
/// choice is deterministic. Returns the margin to the runner-up as well (infinite when
/// only one token is allowed).
pub fn masked_argmax(logits: &[f32], mask: Option<&TokenMask>) -> (u32, f32) {
    let mut best = (u32::MAX, f32::NEG_INFINITY);
    let mut second = f32::NEG_INFINITY;
    for (t, &v) in logits.iter().enumerate() {
        if mask.is_some_and(|m| !m.allows(t as u32)) {
            continue;
        }
        if v > best.1 || best.0 == u32::MAX {
            second = best.1;
            best = (t as u32, v);
        } else if v > second {
            second = v;
        }
    }
    (best.0, best.1 - second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_allows_a_token_and_masks_follow_drafts() {
        let a = TokenAutomaton::random(5, 100, 0.2, 3);
        for s in 0..5 {
            let m = a.mask(GrammarState::Live(s));
            assert!(m.words.iter().any(|&w| w != 0), "state {s} allows nothing");
        }
        let s0 = GrammarState::Live(0);
        let allowed: Vec<u32> = (0..100).filter(|&t| a.mask(s0).allows(t)).collect();
        let d = allowed[0];
        let masks = a.verify_masks(s0, &[d]);
        assert_eq!(masks[0], a.mask(s0));
        assert_eq!(masks[1], a.mask(a.advance(s0, d)));
    }

    #[test]
    fn masked_argmax_respects_mask() {
        let logits = [0.0, 5.0, 3.0, 1.0];
        let mut m = TokenMask { words: vec![0] };
        m.words[0] = 0b1101;
        assert_eq!(masked_argmax(&logits, Some(&m)), (2, 2.0));
        assert_eq!(masked_argmax(&logits, None), (1, 2.0));
    }
}
