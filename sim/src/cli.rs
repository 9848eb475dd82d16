//! Command-line conventions shared by `sim` and `replay`, so both say and take things
//! the same way: counted nouns, fault lists, and the global `--json` flag.

/// `x` in scientific notation with as few digits as show it exactly: "1e-3", "1.5e-1".
pub fn sci(x: f64) -> String {
    let short = format!("{x:.0e}");
    match short.parse::<f64>() {
        Ok(v) if v == x => short,
        _ => format!("{x:.1e}"),
    }
}

/// `n` and the noun, plural unless `n` is 1: "1 row", "3 rows".
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// A flag's parser for a whole number in `lo..=hi`, whose error says so in words (clap's
/// own says "invalid digit found in string" for `-5`).
pub fn whole(
    lo: u64,
    hi: u64,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |v: &str| {
        let upto = if hi == u64::MAX {
            format!("{lo} or more")
        } else {
            format!("from {lo} to {hi}")
        };
        match v.trim().parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(format!("expected a whole number {upto}, got {v:?}")),
        }
    }
}

/// Armed faults and how often each fired: "F12 fired in 49 steps, F1 fired in 1 step".
pub fn fault_counts(faults: &[crate::runner::FaultCount]) -> String {
    faults
        .iter()
        .map(|f| {
            format!(
                "{} fired in {}",
                f.id,
                count(f.fired_steps as usize, "step")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A list of fault ids, or "none".
pub fn fault_list(ids: &[String]) -> String {
    if ids.is_empty() {
        "none".to_string()
    } else {
        ids.join(", ")
    }
}

/// The program's arguments with a `--json` given before a subcommand moved after it: the
/// top-level run flags may not be mixed with a subcommand, but `--json` means the same
/// to all of them.
pub fn args_with_json_last(subcommands: &[&str]) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let sub = args.iter().position(|a| subcommands.iter().any(|s| a == s));
    if let (Some(sub), Some(j)) = (sub, args.iter().position(|a| a == "--json")) {
        if j < sub {
            let flag = args.remove(j);
            args.push(flag);
        }
    }
    args
}

#[cfg(test)]
mod tests {
    /// Tolerances print as given: one digit where that is exact, two otherwise.
    #[test]
    fn sci_keeps_the_digits_a_value_has() {
        assert_eq!(super::sci(1e-3), "1e-3");
        assert_eq!(super::sci(1.5e-1), "1.5e-1");
        assert_eq!(super::sci(3e-1), "3e-1");
    }

    use super::*;

    #[test]
    fn whole_numbers_say_what_they_take() {
        let requests = whole(1, 100_000);
        assert_eq!(requests("7"), Ok(7));
        for bad in ["-5", "0", "100001", "2.5", "lots", ""] {
            let e = requests(bad).unwrap_err();
            assert!(e.contains("whole number from 1 to 100000"), "{bad}: {e}");
        }
        assert!(whole(1, u64::MAX)("0").unwrap_err().contains("1 or more"));
    }

    #[test]
    fn counts_and_lists() {
        assert_eq!(count(1, "row"), "1 row");
        assert_eq!(count(0, "request"), "0 requests");
        assert_eq!(fault_list(&[]), "none");
        assert_eq!(fault_list(&["F1".into(), "F7".into()]), "F1, F7");
    }
}
