//! Rejection sampling (RULES §3 step 6): `verify::verify_rejection` must emit
//! tokens distributed exactly as the target alone, whatever the draft distribution.
//! On vocabularies of 4-6 tokens with random target/draft distributions (zeros
//! included, so the residual and the "draft has no mass here" cases both occur), the
//! draft is sampled from the draft distribution by the test's own sampler, and the
//! empirical distribution of the first emitted token over 20k seeded trials is compared
//! with the target (max abs error < 0.02, about 5 standard errors). A second property
//! checks the token emitted after an accepted first draft follows the second target
//! distribution. A negative control shows the statistic rejects "always accept".

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use specmla_core::verify::verify_rejection;

const TRIALS: usize = 20_000;

/// A distribution from integer weights (at least one positive).
fn normalize(w: &[u32]) -> Vec<f32> {
    let sum: u32 = w.iter().sum();
    w.iter().map(|&x| x as f32 / sum as f32).collect()
}

/// The test's own inverse-CDF sampler (not the core's `sample`).
fn draw(p: &[f32], rng: &mut ChaCha8Rng) -> u32 {
    let u: f64 = rng.gen::<f64>() * p.iter().map(|&x| x as f64).sum::<f64>();
    let mut acc = 0.0;
    for (t, &x) in p.iter().enumerate() {
        acc += x as f64;
        if u < acc {
            return t as u32;
        }
    }
    p.iter().rposition(|&x| x > 0.0).unwrap() as u32
}

fn max_abs_err(counts: &[usize], total: usize, p: &[f32]) -> f64 {
    counts
        .iter()
        .zip(p)
        .map(|(&c, &x)| (c as f64 / total as f64 - x as f64).abs())
        .fold(0.0, f64::max)
}

/// Weights over a vocab of 4-6 with at least one positive entry.
fn weights(vocab: usize) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(prop_oneof![1 => Just(0u32), 3 => 1u32..10], vocab)
        .prop_filter("some mass", |w| w.iter().any(|&x| x > 0))
}

/// Empirical distribution of the first emitted token with one draft from `q`.
fn first_token_counts(p: &[f32], q: &[f32], seed: u64) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut counts = vec![0usize; p.len()];
    let target = vec![p.to_vec(), p.to_vec()];
    let draft = vec![q.to_vec()];
    for _ in 0..TRIALS {
        let d = draw(q, &mut rng);
        let v = verify_rejection(1, &[d], &target, &draft, &mut rng);
        assert!(!v.new_tokens.is_empty() && v.new_tokens.len() <= 2);
        assert_eq!(v.num_accepted + 1, v.new_tokens.len());
        counts[v.new_tokens[0] as usize] += 1;
    }
    counts
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn first_token_follows_the_target(
        (tw, dw) in (4usize..=6).prop_flat_map(|v| (weights(v), weights(v))),
        seed in any::<u64>(),
    ) {
        let (p, q) = (normalize(&tw), normalize(&dw));
        let counts = first_token_counts(&p, &q, seed);
        let err = max_abs_err(&counts, TRIALS, &p);
        prop_assert!(err < 0.02, "first-token distribution {:?} vs target {:?} (err {})", counts, p, err);
    }

    /// Two drafts: when the first is accepted, the next emitted token follows the second
    /// target distribution (the process restarts with fresh randomness).
    #[test]
    fn token_after_an_accepted_draft_follows_the_next_target(
        (p0w, p1w, q0w, q1w) in (4usize..=6).prop_flat_map(|v| (weights(v), weights(v), weights(v), weights(v))),
        seed in any::<u64>(),
    ) {
        let (p0, p1, q0, q1) = (normalize(&p0w), normalize(&p1w), normalize(&q0w), normalize(&q1w));
        let target = vec![p0.clone(), p1.clone(), p1.clone()];
        let draft = vec![q0.clone(), q1.clone()];
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut first = vec![0usize; p0.len()];
        let mut second = vec![0usize; p1.len()];
        let mut n_second = 0;
        for _ in 0..TRIALS {
            let d = [draw(&q0, &mut rng), draw(&q1, &mut rng)];
            let v = verify_rejection(1, &d, &target, &draft, &mut rng);
            first[v.new_tokens[0] as usize] += 1;
            // Accepted tokens are the drafts themselves.
            prop_assert_eq!(&v.new_tokens[..v.num_accepted], &d[..v.num_accepted]);
            if let Some(&t) = v.new_tokens.get(1) {
                second[t as usize] += 1;
                n_second += 1;
            }
        }
        prop_assert!(max_abs_err(&first, TRIALS, &p0) < 0.02);
        // Tolerance of about 5 standard errors for the conditional sample size.
        if n_second >= 2000 {
            let tol = 5.0 * (0.25 / n_second as f64).sqrt();
            let err = max_abs_err(&second, n_second, &p1);
            prop_assert!(err < tol, "second token {:?} of {} vs {:?} (err {} tol {})", second, n_second, p1, err, tol);
        }
    }
}

/// The tolerance has power: a sampler that always keeps the draft emits q, which the
/// same check rejects when q and p differ by 0.1 or more somewhere.
#[test]
fn check_rejects_always_accepting() {
    let p = normalize(&[1, 1, 1, 1]);
    let q = normalize(&[7, 1, 1, 1]);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut counts = vec![0usize; 4];
    for _ in 0..TRIALS {
        counts[draw(&q, &mut rng) as usize] += 1;
    }
    assert!(max_abs_err(&counts, TRIALS, &p) > 0.02);
    // ...while the real verifier passes on the same pair.
    assert!(max_abs_err(&first_token_counts(&p, &q, 5), TRIALS, &p) < 0.02);
}

/// Draft equals target: every draft is accepted.
#[test]
fn identical_distributions_accept_everything() {
    let p = normalize(&[3, 0, 5, 2, 1]);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for _ in 0..2000 {
        let d = draw(&p, &mut rng);
        let v = verify_rejection(
            1,
            &[d],
            &[p.clone(), p.clone()],
            std::slice::from_ref(&p),
            &mut rng,
        );
        assert_eq!(v.num_accepted, 1);
        assert_eq!(v.new_tokens[0], d);
    }
}
