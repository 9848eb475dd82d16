//! Report wording shared by `sim` and `replay`, so both say the same thing the same way.

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
