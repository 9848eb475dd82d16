//! `gpu-bench` on bad input and without a GPU: exit 2 and a clear error, never a panic.

use std::process::Command;

fn bench(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_gpu-bench"))
        .args(args)
        .output()
        .expect("gpu-bench runs");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn zero_shapes_are_refused_before_touching_the_device() {
    for (flag, v) in [
        ("--page", "0"),
        ("--heads", "0"),
        ("--batch", "0"),
        ("--context", "x"),
    ] {
        let (code, err) = bench(&[flag, v]);
        assert_eq!(code, Some(2), "{flag} {v}: {err}");
        assert!(
            err.contains(flag) && err.contains("at least 1"),
            "{flag} {v}: {err}"
        );
    }
}

#[test]
fn without_a_gpu_it_says_why_in_one_line() {
    let dir = std::env::temp_dir().join(format!("specmla-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, extra) in [
        &[][..],
        &["--sweep-splits", "--heads", "16"][..],
        &["--twin", "--decode-only"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let csv = dir.join(format!("b{i}.csv"));
        let mut args = vec!["--quick", "--csv", csv.to_str().unwrap()];
        args.extend_from_slice(extra);
        let (code, err) = bench(&args);
        if code == Some(0) {
            // A machine with a GPU ran the sweep; the CSV must then exist.
            assert!(csv.exists());
            continue;
        }
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(!csv.exists(), "no CSV without measurements");
    }
}

#[test]
fn the_twin_is_refused_where_no_fast_launch_is_timed() {
    for other in [
        &["--sweep-splits"][..],
        &["--timeline", "tl"][..],
        &["--prefill-only"][..],
        &["--verify-step"][..],
    ] {
        let mut args = vec!["--twin"];
        args.extend_from_slice(other);
        let (code, err) = bench(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.contains("--twin") && err.contains(other[0]),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn the_scrub_takes_read_or_write_and_nothing_else() {
    let (code, err) = bench(&["--scrub", "memset"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--scrub") && err.contains("read") && err.contains("write"),
        "{err}"
    );
    // Accepted: without a GPU the run then stops at the device, in one line.
    let csv = std::env::temp_dir().join(format!("specmla-scrub-{}.csv", std::process::id()));
    let (code, err) = bench(&[
        "--quick",
        "--decode-only",
        "--scrub",
        "write",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    if code != Some(0) {
        assert_eq!(code, Some(2), "{err}");
        assert!(
            !err.contains("--scrub"),
            "the flag itself was refused: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
