//! Command-line conventions shared by `sim` and `replay`, so both say and take things
//! the same way: counted nouns, fault lists, and the global `--json` flag.

/// `n` and the noun, plural unless `n` is 1: "1 row", "3 rows".
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
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
    use super::*;

    #[test]
    fn counts_and_lists() {
        assert_eq!(count(1, "row"), "1 row");
        assert_eq!(count(0, "request"), "0 requests");
        assert_eq!(fault_list(&[]), "none");
        assert_eq!(fault_list(&["F1".into(), "F7".into()]), "F1, F7");
    }
}
