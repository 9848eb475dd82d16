//! The acceptance controller's rates, one per draft position (`--acceptance-rate
//! 0.9/0.8/0.6`): the chance that the i-th draft of a verify row proposes the oracle's
//! token, given the drafts before it. Published MTP numbers fall with the position (the
//! MTP head is trained for the first one and reused for the rest), so one rate for every
//! position cannot stand in for them. A list shorter than K repeats its last rate.
//!
//! In files and on the command line a single rate is a number (`0.7`), several are
//! `/`-separated (`0.9/0.8/0.6`) or, in TOML and JSON, an array.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The most draft positions a list names (speculation stops far below this).
pub const MAX_POSITIONS: usize = 64;

/// Per-position acceptance rates: non-empty, each within [0, 1] once checked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RatesRepr", into = "RatesRepr")]
pub struct AcceptanceRates(Vec<f64>);

/// The file form: one number, or one per position.
#[derive(Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum RatesRepr {
    One(f64),
    PerPosition(Vec<f64>),
}

impl AcceptanceRates {
    /// The same rate at every position.
    pub fn uniform(rate: f64) -> Self {
        Self(vec![rate])
    }

    /// Rates by position, the first for the first draft; checked.
    pub fn per_position(rates: Vec<f64>) -> Result<Self, String> {
        let r = Self(rates);
        r.check()?;
        Ok(r)
    }

    /// The rates as given (at least one).
    pub fn rates(&self) -> &[f64] {
        &self.0
    }

    /// The rate of draft `draft_index` (0 for the first draft of a row); past the list,
    /// its last rate.
    pub fn at(&self, draft_index: usize) -> f64 {
        let last = self.0.len().saturating_sub(1);
        self.0.get(draft_index.min(last)).copied().unwrap_or(0.0)
    }

    /// The mean acceptance length of a verify row with `k` drafts, the bonus token
    /// included: `1 + sum over i of the product of the rates of positions 0..=i` (draft i
    /// counts only when every draft before it was accepted).
    pub fn expected_acceptance_length(&self, k: usize) -> f64 {
        let mut reach = 1.0;
        let mut len = 1.0;
        for i in 0..k {
            reach *= self.at(i);
            len += reach;
        }
        len
    }

    /// One line naming what is wrong, if anything is.
    pub fn check(&self) -> Result<(), String> {
        if self.0.is_empty() {
            return Err("an acceptance rate list needs at least one rate".into());
        }
        if self.0.len() > MAX_POSITIONS {
            return Err(format!(
                "at most {MAX_POSITIONS} per-position acceptance rates, got {}",
                self.0.len()
            ));
        }
        match self
            .0
            .iter()
            .find(|r| !(r.is_finite() && (0.0..=1.0).contains(*r)))
        {
            Some(r) => Err(format!("an acceptance rate must be within [0, 1], got {r}")),
            None => Ok(()),
        }
    }
}

impl fmt::Display for AcceptanceRates {
    /// `0.7`, or `0.9/0.8/0.6`: the form `FromStr` reads (and the sweep CSV's key).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("/")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl FromStr for AcceptanceRates {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let rates = s
            .split('/')
            .map(|r| {
                r.trim().parse::<f64>().map_err(|_| {
                    format!("{s:?} is not an acceptance rate (0.7) or a list of them (0.9/0.8/0.6)")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::per_position(rates)
    }
}

impl TryFrom<RatesRepr> for AcceptanceRates {
    type Error = String;

    fn try_from(r: RatesRepr) -> Result<Self, String> {
        match r {
            RatesRepr::One(r) => Self::per_position(vec![r]),
            RatesRepr::PerPosition(v) => Self::per_position(v),
        }
    }
}

impl From<AcceptanceRates> for RatesRepr {
    fn from(r: AcceptanceRates) -> Self {
        match r.0.as_slice() {
            [one] => RatesRepr::One(*one),
            _ => RatesRepr::PerPosition(r.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prints_and_repeats_the_last_rate() {
        let r: AcceptanceRates = "0.9/0.8/0.6".parse().unwrap();
        assert_eq!(r.rates(), &[0.9, 0.8, 0.6]);
        assert_eq!((r.at(0), r.at(2), r.at(7)), (0.9, 0.6, 0.6));
        assert_eq!(r.to_string(), "0.9/0.8/0.6");
        assert_eq!("0.7".parse::<AcceptanceRates>().unwrap().to_string(), "0.7");
        for bad in ["", "0.9/", "1.5", "x", "0.5/-0.1", "NaN", "inf"] {
            assert!(bad.parse::<AcceptanceRates>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn expected_length_is_one_plus_the_sum_of_products() {
        let r = AcceptanceRates::per_position(vec![0.8, 0.5]).unwrap();
        // 1 + 0.8 + 0.8 * 0.5 + 0.8 * 0.5 * 0.5
        assert!((r.expected_acceptance_length(3) - 2.4).abs() < 1e-12);
        assert_eq!(r.expected_acceptance_length(0), 1.0);
        let u = AcceptanceRates::uniform(0.5);
        assert!((u.expected_acceptance_length(3) - 1.875).abs() < 1e-12);
    }

    #[test]
    fn a_file_holds_a_number_or_an_array() {
        #[derive(Serialize, Deserialize)]
        struct F {
            acceptance_rate: AcceptanceRates,
        }
        let one: F = toml::from_str("acceptance_rate = 0.7").unwrap();
        assert_eq!(one.acceptance_rate, AcceptanceRates::uniform(0.7));
        let many: F = toml::from_str("acceptance_rate = [0.9, 0.6]").unwrap();
        assert_eq!(many.acceptance_rate.rates(), &[0.9, 0.6]);
        assert_eq!(
            toml::to_string(&many).unwrap().trim(),
            "acceptance_rate = [0.9, 0.6]"
        );
        assert_eq!(
            toml::to_string(&one).unwrap().trim(),
            "acceptance_rate = 0.7"
        );
        let bad = toml::from_str::<F>("acceptance_rate = [0.9, 1.2]");
        assert!(bad.is_err_and(|e| e.to_string().contains("within [0, 1]")));
        assert!(toml::from_str::<F>("acceptance_rate = []").is_err());
    }
}
