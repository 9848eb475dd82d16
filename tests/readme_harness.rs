//! Runs the README's examples and compares their output with the page, so the two cannot
//! drift apart. Included by path (`#[path]`) from the `sim` and `replay` CLI tests, each
//! of which runs the commands of its own binary.
//!
//! A README block marked `<!-- readme-test: NAME -->` holds `$ command` lines, each
//! followed by its expected output. `$ cat FILE` lines instead write FILE with the lines
//! that follow. An expected line ending in `...` matches any line starting with the
//! text before it, and a line that is only `...` stands for any number of lines.
//! Commands run without a shell, in a scratch directory; a trailing `> FILE` writes the
//! output there instead of comparing it (`> /dev/null` discards it).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// One `$` command of a block and the output the README shows for it.
pub struct Example {
    pub argv: Vec<String>,
    pub expected: Vec<String>,
    /// Where `> FILE` sends the output (None: compare it with `expected`).
    pub redirect: Option<PathBuf>,
}

/// The examples of block `name`, after writing the block's `cat` files into `dir`.
pub fn examples(name: &str, dir: &Path) -> Vec<Example> {
    // The workspace root is the nearest ancestor of the test's crate with a README.md.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("README.md").is_file() && d.join("Cargo.lock").is_file())
        .expect("the workspace root above the crate");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let marker = format!("<!-- readme-test: {name} -->");
    let block = readme
        .split(&marker)
        .nth(1)
        .and_then(|rest| rest.split("```").nth(1))
        .unwrap_or_else(|| panic!("README has no block {marker}"));
    let mut out: Vec<Example> = Vec::new();
    let mut cat: Option<(PathBuf, Vec<String>)> = None;
    for line in block.lines().skip(1) {
        if let Some(cmd) = line.strip_prefix("$ ") {
            flush_cat(&mut cat);
            if let Some(file) = cmd.strip_prefix("cat ") {
                cat = Some((dir.join(file.trim()), Vec::new()));
                continue;
            }
            let (cmd, redirect) = match cmd.split_once(" > ") {
                Some((c, file)) => (c, Some(dir.join(file.trim()))),
                None => (cmd, None),
            };
            out.push(Example {
                argv: cmd.split_whitespace().map(str::to_string).collect(),
                expected: Vec::new(),
                redirect,
            });
        } else if let Some((_, lines)) = cat.as_mut() {
            lines.push(line.to_string());
        } else if let Some(e) = out.last_mut() {
            e.expected.push(line.to_string());
        }
    }
    flush_cat(&mut cat);
    out
}

fn flush_cat(cat: &mut Option<(PathBuf, Vec<String>)>) {
    if let Some((path, lines)) = cat.take() {
        std::fs::write(path, lines.join("\n") + "\n").expect("scratch file");
    }
}

/// Panics with a diff-like message unless `actual` is what the README shows (or writes
/// it to the example's redirect).
pub fn assert_shown(e: &Example, actual: &str) {
    if let Some(path) = &e.redirect {
        if !path.ends_with("/dev/null") {
            std::fs::write(path, actual).expect("redirect file");
        }
        return;
    }
    let got: Vec<&str> = actual.lines().collect();
    let want: Vec<&str> = e.expected.iter().map(String::as_str).collect();
    assert!(
        matches(&want, &got),
        "README example `{}` drifted from the program.\n--- README:\n{}\n--- program:\n{}",
        e.argv.join(" "),
        want.join("\n"),
        got.join("\n")
    );
}

fn line_matches(want: &str, got: &str) -> bool {
    match want.strip_suffix("...") {
        Some(prefix) => got.starts_with(prefix.trim_end()),
        None => got == want,
    }
}

/// Whether `got` is `want`, with `...` lines standing for any number of lines.
fn matches(want: &[&str], got: &[&str]) -> bool {
    match want.split_first() {
        None => got.is_empty(),
        Some((&"...", rest)) => (0..=got.len()).any(|skip| matches(rest, &got[skip..])),
        Some((w, rest)) => got
            .split_first()
            .is_some_and(|(g, got_rest)| line_matches(w, g) && matches(rest, got_rest)),
    }
}

/// A fresh scratch directory for one block.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specmla-readme-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[test]
fn the_matcher_can_fail() {
    assert!(matches(&["a", "b..."], &["a", "bcd"]));
    assert!(matches(&["a", "...", "z"], &["a", "x", "y", "z"]));
    assert!(matches(&["...", "z"], &["z"]));
    assert!(!matches(&["a", "b"], &["a", "c"]));
    assert!(!matches(&["a"], &["a", "extra"]));
    assert!(!matches(&["a", "...", "z"], &["a", "x"]));
}
