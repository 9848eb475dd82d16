//! The additive roofline every measured kernel class is fitted to:
//! `t_us = overhead_us + gb * us_per_gb + tflop * us_per_tflop + kcta * us_per_kcta`, the
//! coefficients non-negative (the CTA term counts a launch's serial work units: a split-KV
//! decode's row groups times splits, a prefill's or a GEMM's waves times the steps each
//! CTA walks, which bytes and flops alone do not tell), chosen to minimize the sum of
//! squared *relative* errors over the samples (so a 5 µs launch weighs as much as a 5 ms
//! one).

use serde::{Deserialize, Serialize};

/// One measured launch: what it moved and computed, and its median time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// What was timed, for the report (shape and kernel).
    pub label: String,
    pub bytes: f64,
    pub flops: f64,
    /// CTAs launched (work units), where the class counts them.
    #[serde(default)]
    pub ctas: f64,
    pub us: f64,
    /// A GEMM sample's `[m, k, n]`: the shapes the calibration timed are priced from
    /// their own samples ([`super::KernelClass::gemm_table_us`]), not the fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_mkn: Option<[usize; 3]>,
}

/// A fitted additive roofline.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fit {
    pub overhead_us: f64,
    /// Microseconds per 1e9 bytes moved (the inverse of an effective bandwidth).
    pub us_per_gb: f64,
    /// Microseconds per 1e12 flops (the inverse of an effective throughput).
    pub us_per_tflop: f64,
    /// Microseconds per 1000 CTAs.
    #[serde(default)]
    pub us_per_kcta: f64,
}

impl Fit {
    /// The fitted time of a launch of `bytes`, `flops` and `ctas`.
    pub fn us(&self, bytes: f64, flops: f64, ctas: f64) -> f64 {
        self.overhead_us
            + bytes * 1e-9 * self.us_per_gb
            + flops * 1e-12 * self.us_per_tflop
            + ctas * 1e-3 * self.us_per_kcta
    }

    /// Relative error of the fit on each sample, `(fit - measured) / measured`.
    pub fn rel_errors(&self, samples: &[Sample]) -> Vec<f64> {
        samples
            .iter()
            .map(|s| (self.us(s.bytes, s.flops, s.ctas) - s.us) / s.us)
            .collect()
    }

    /// The fit over `samples` (at least one, each with a positive time). Every subset of
    /// the three terms is solved by least squares and the best one whose coefficients are
    /// all non-negative wins, so no term ever subtracts time.
    pub fn of(samples: &[Sample]) -> Result<Fit, String> {
        if samples.is_empty() {
            return Err("no samples to fit".into());
        }
        if let Some(s) = samples
            .iter()
            .find(|s| s.us.is_nan() || s.us <= 0.0 || s.bytes < 0.0 || s.flops < 0.0)
        {
            return Err(format!(
                "sample `{}` has a non-positive time or a negative size",
                s.label
            ));
        }
        let rows: Vec<([f64; 4], f64)> = samples
            .iter()
            .map(|s| ([1.0, s.bytes * 1e-9, s.flops * 1e-12, s.ctas * 1e-3], s.us))
            .collect();
        let c = nonneg_relative_lsq(&rows).ok_or("no non-negative fit exists for these samples")?;
        Ok(Fit {
            overhead_us: c[0],
            us_per_gb: c[1],
            us_per_tflop: c[2],
            us_per_kcta: c[3],
        })
    }
}

/// The non-negative coefficients `c` minimizing `sum ((c . x - y) / y)^2` over `rows` of
/// features `x` and positive targets `y`: every subset of the features is solved by least
/// squares and the best whose coefficients are all non-negative wins (`None` if none is).
pub fn nonneg_relative_lsq<const N: usize>(rows: &[([f64; N], f64)]) -> Option<[f64; N]> {
    let mut best: Option<(f64, [f64; N])> = None;
    for mask in 1u32..(1 << N) {
        let Some(c) = solve_subset(rows, mask) else {
            continue;
        };
        let err: f64 = rows
            .iter()
            .map(|(x, y)| {
                let e = (x.iter().zip(&c).map(|(a, b)| a * b).sum::<f64>() - y) / y;
                e * e
            })
            .sum();
        if best.as_ref().is_none_or(|(e, _)| err < *e) {
            best = Some((err, c));
        }
    }
    best.map(|(_, c)| c)
}

/// Weighted least squares over the features in `mask`; `None` if singular or a
/// coefficient comes out negative.
fn solve_subset<const N: usize>(rows: &[([f64; N], f64)], mask: u32) -> Option<[f64; N]> {
    let terms: Vec<usize> = (0..N).filter(|i| mask >> i & 1 == 1).collect();
    let n = terms.len();
    let mut a = vec![vec![0.0; n + 1]; n];
    for (x, y) in rows {
        let w = 1.0 / (y * y);
        for (i, &ti) in terms.iter().enumerate() {
            for (j, &tj) in terms.iter().enumerate() {
                a[i][j] += w * x[ti] * x[tj];
            }
            a[i][n] += w * x[ti] * y;
        }
    }
    let sol = gauss(a)?;
    let mut c = [0.0; N];
    for (i, &t) in terms.iter().enumerate() {
        if sol[i].is_nan() || sol[i] < 0.0 {
            return None;
        }
        c[t] = sol[i];
    }
    Some(c)
}

/// Solves the augmented system `a` (n x (n + 1)) by Gaussian elimination with partial
/// pivoting; `None` if singular.
fn gauss(mut a: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let n = a.len();
    for col in 0..n {
        let piv = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, piv);
        for r in col + 1..n {
            let f = a[r][col] / a[col][col];
            for c in col..=n {
                a[r][c] -= f * a[col][c];
            }
        }
    }
    let mut x = vec![0.0; n];
    for r in (0..n).rev() {
        let s: f64 = (r + 1..n).map(|c| a[r][c] * x[c]).sum();
        x[r] = (a[r][n] - s) / a[r][r];
    }
    Some(x)
}

/// Median and largest absolute value of `v` (0 for an empty slice).
pub fn median_and_max_abs(v: &[f64]) -> (f64, f64) {
    let mut a: Vec<f64> = v.iter().map(|x| x.abs()).collect();
    a.sort_by(f64::total_cmp);
    match a.len() {
        0 => (0.0, 0.0),
        n if n % 2 == 1 => (a[n / 2], a[n - 1]),
        n => ((a[n / 2 - 1] + a[n / 2]) / 2.0, a[n - 1]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(bytes: f64, flops: f64, us: f64) -> Sample {
        Sample {
            label: String::new(),
            bytes,
            flops,
            ctas: 0.0,
            us,
            gemm_mkn: None,
        }
    }

    #[test]
    fn recovers_an_exact_roofline() {
        let truth = Fit {
            overhead_us: 4.0,
            us_per_gb: 1e6 / 3000.0,
            us_per_tflop: 1e6 / 600.0,
            us_per_kcta: 0.0,
        };
        let pts: Vec<Sample> = [
            (1e6, 1e9),
            (1e8, 1e10),
            (5e8, 4e12),
            (2e7, 9e11),
            (3e9, 1e9),
        ]
        .iter()
        .map(|&(b, f)| sample(b, f, truth.us(b, f, 0.0)))
        .collect();
        let fit = Fit::of(&pts).unwrap();
        for e in fit.rel_errors(&pts) {
            assert!(e.abs() < 1e-9, "{e}");
        }
        assert!((fit.overhead_us - 4.0).abs() < 1e-6);
    }

    #[test]
    fn never_fits_a_negative_term() {
        // Times that fall as bytes grow would want a negative bandwidth term.
        let pts = vec![
            sample(1e6, 0.0, 10.0),
            sample(1e9, 0.0, 9.0),
            sample(5e8, 0.0, 9.5),
        ];
        let fit = Fit::of(&pts).unwrap();
        assert!(fit.overhead_us >= 0.0 && fit.us_per_gb >= 0.0 && fit.us_per_tflop >= 0.0);
        assert!(fit.us_per_gb == 0.0);
    }

    #[test]
    fn refuses_empty_and_nonpositive_samples() {
        assert!(Fit::of(&[]).is_err());
        assert!(Fit::of(&[sample(1.0, 1.0, 0.0)]).is_err());
    }

    #[test]
    fn median_and_max() {
        assert_eq!(median_and_max_abs(&[0.1, -0.3, 0.2]), (0.2, 0.3));
        assert_eq!(median_and_max_abs(&[0.1, -0.3]), (0.2, 0.3));
    }
}
