//! Truncation: a file cut at any byte is never a panic, and a cut after the header
//! always yields exactly the complete records before the cut.

mod common;

use common::{encode, read_outcome, sample_header, sample_records};
use specmla_traces::{read_all_from, Completeness, TraceError};

/// Records whose blocks end at or before `cut`.
fn complete_before(ends: &[usize], cut: usize) -> usize {
    ends[1..].iter().filter(|&&e| e <= cut).count()
}

#[test]
fn every_cut_of_a_valid_file_yields_the_records_before_it() {
    let records = sample_records(4);
    let (bytes, ends) = encode(&sample_header(), &records);
    let header_end = ends[0];
    for cut in 0..bytes.len() {
        for known_len in [true, false] {
            let out = read_outcome(&bytes[..cut], known_len);
            if cut < header_end {
                assert!(
                    matches!(out.error, Some(TraceError::HeaderTruncated { .. })),
                    "cut {cut}: {:?}",
                    out.error
                );
                continue;
            }
            let k = complete_before(&ends, cut);
            assert!(out.error.is_none(), "cut {cut}: {:?}", out.error);
            assert!(out.truncated, "cut {cut} not reported truncated");
            assert_eq!(out.header.as_ref(), Some(&sample_header()), "cut {cut}");
            assert_eq!(out.records, records[..k], "cut {cut}");
        }
    }
}

#[test]
fn read_all_reports_truncated_after_n_records() {
    let records = sample_records(4);
    let (bytes, ends) = encode(&sample_header(), &records);
    // Right after the header: an empty but valid truncated trace.
    let (_, r, c) = read_all_from(&bytes[..ends[0]], Some(ends[0] as u64)).unwrap();
    assert!(r.is_empty());
    assert_eq!(c, Completeness::Truncated { records: 0 });
    // Inside record 2 (0-based): records 0 and 1 survive.
    let cut = ends[3] - 1;
    let (_, r, c) = read_all_from(&bytes[..cut], None).unwrap();
    assert_eq!(r, records[..2]);
    assert_eq!(c, Completeness::Truncated { records: 2 });
    // Only the footer is missing.
    let cut = ends[4];
    let (_, r, c) = read_all_from(&bytes[..cut], Some(cut as u64)).unwrap();
    assert_eq!(r, records);
    assert_eq!(c, Completeness::Truncated { records: 4 });
}

#[test]
fn an_empty_input_is_a_truncated_header() {
    let err = read_all_from(&[][..], Some(0)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "trace ends inside its header after 0 bytes"
    );
}
