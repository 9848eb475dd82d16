//! Corruption: bit flips, wrong magic or version, absurd lengths, spliced records and
//! random bytes never panic and never read back as different data.

mod common;

use common::{encode, header, read_outcome, record, sample_header, sample_records, Outcome};
use proptest::prelude::*;
use specmla_traces::format::{encode_payload, header_block, tagged_block, TAG_FOOTER, TAG_RECORD};
use specmla_traces::{
    read_all_from, StepRecord, TraceError, TraceHeader, FORMAT_VERSION, MAGIC, MAX_BLOCK_BYTES,
};

/// A damaged file must stop with an error or read as truncated, and whatever it did
/// return must be the original header and a prefix of the original records.
fn check_detected(
    out: &Outcome,
    h: &TraceHeader,
    records: &[StepRecord],
    what: &str,
) -> Result<(), String> {
    if out.error.is_none() && !out.truncated {
        return Err(format!("{what}: read back as a complete trace"));
    }
    if out.header.as_ref().is_some_and(|got| got != h) {
        return Err(format!("{what}: header changed silently"));
    }
    let n = out.records.len();
    if n > records.len() || out.records[..] != records[..n] {
        return Err(format!("{what}: records changed silently"));
    }
    Ok(())
}

/// Flips `bit` of `bytes[at]` and checks both reader modes.
fn flip_and_check(
    bytes: &[u8],
    at: usize,
    bit: u8,
    h: &TraceHeader,
    records: &[StepRecord],
) -> Result<(), String> {
    let mut damaged = bytes.to_vec();
    damaged[at] ^= 1 << bit;
    for known_len in [true, false] {
        let out = read_outcome(&damaged, known_len);
        check_detected(&out, h, records, &format!("byte {at} bit {bit}"))?;
    }
    Ok(())
}

#[test]
fn every_single_bit_flip_of_a_sample_file_is_detected() {
    let records = sample_records(3);
    let (bytes, _) = encode(&sample_header(), &records);
    for at in 0..bytes.len() {
        for bit in 0..8 {
            flip_and_check(&bytes, at, bit, &sample_header(), &records).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn bit_flips_in_random_traces_are_detected(
        h in header(),
        records in proptest::collection::vec(record(), 0..4),
        pos in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let (bytes, _) = encode(&h, &records);
        let at = pos.index(bytes.len());
        let stamped = TraceHeader { format_version: FORMAT_VERSION, ..h };
        flip_and_check(&bytes, at, bit, &stamped, &records).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        for known_len in [true, false] {
            let out = read_outcome(&bytes, known_len);
            // Random bytes almost never start with the magic.
            prop_assert!(out.header.is_none() || bytes.starts_with(&MAGIC));
        }
    }

    #[test]
    fn random_blocks_after_a_valid_header_never_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..400),
        tag in prop_oneof![Just(TAG_RECORD), Just(TAG_FOOTER), any::<u8>()],
    ) {
        let (mut bytes, ends) = encode(&sample_header(), &[]);
        bytes.truncate(ends[0]);
        bytes.push(tag);
        bytes.extend_from_slice(&tail);
        for known_len in [true, false] {
            let out = read_outcome(&bytes, known_len);
            prop_assert!(out.header.is_some());
        }
    }
}

#[test]
fn wrong_magic_is_not_a_trace() {
    let (mut bytes, _) = encode(&sample_header(), &sample_records(1));
    bytes[0] = b'X';
    let err = read_all_from(&bytes[..], None).unwrap_err();
    assert!(matches!(err, TraceError::NotATrace), "{err}");
    let err = read_all_from(&b"PK\x03\x04"[..], None).unwrap_err();
    assert!(matches!(err, TraceError::NotATrace), "{err}");
}

#[test]
fn a_future_version_gets_the_version_message() {
    let (mut bytes, _) = encode(&sample_header(), &sample_records(1));
    let future = FORMAT_VERSION + 1;
    bytes[8..12].copy_from_slice(&future.to_le_bytes());
    let err = read_all_from(&bytes[..], None).unwrap_err();
    assert!(matches!(
        err,
        TraceError::Version { written, reads: FORMAT_VERSION } if written == future
    ));
    assert_eq!(
        err.to_string(),
        format!("trace written by format {future}, this reads {FORMAT_VERSION}")
    );
    // Only the prefix up to the version is needed to tell.
    let err = read_all_from(&bytes[..12], None).unwrap_err();
    assert!(matches!(err, TraceError::Version { written, .. } if written == future));
}

/// The header as format 1 wrote it: no `backend` field.
#[derive(serde::Serialize)]
struct HeaderV1 {
    format_version: u32,
    tool_version: String,
    scenario: String,
    seed: u64,
    config_json: String,
    faults: Vec<String>,
    acceptance_rate: f64,
    trace_tensors: bool,
    workload: Vec<specmla_traces::TraceRequest>,
}

#[test]
fn a_version_1_trace_without_a_backend_is_refused_by_version() {
    // A real format-1 header block: its payload lacks `backend`, so read as the current
    // version it would misparse; the version check must stop it first, in one line.
    let h = sample_header();
    let v1 = HeaderV1 {
        format_version: 1,
        tool_version: h.tool_version,
        scenario: h.scenario,
        seed: h.seed,
        config_json: h.config_json,
        faults: h.faults,
        acceptance_rate: h.acceptance_rates[0],
        trace_tensors: h.trace_tensors,
        workload: h.workload,
    };
    let mut bytes = header_block(&encode_payload(&v1).unwrap());
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    let err = read_all_from(&bytes[..], None).unwrap_err();
    assert!(matches!(
        err,
        TraceError::Version {
            written: 1,
            reads: FORMAT_VERSION
        }
    ));
    assert_eq!(
        err.to_string(),
        format!("trace written by format 1, this reads {FORMAT_VERSION}")
    );
    // The same bytes stamped with the current version are not a valid header: the
    // check is what makes the message clear.
    bytes[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let err = read_all_from(&bytes[..], None).unwrap_err();
    assert!(!matches!(err, TraceError::Version { .. }), "{err}");
}

/// A valid header followed by a record block prefix declaring `len` (with the prefix's
/// own checksum, so the length reads as written on purpose) and a few bytes.
fn header_then_record_len(len: u32) -> Vec<u8> {
    let (mut bytes, ends) = encode(&sample_header(), &[]);
    bytes.truncate(ends[0]);
    let start = bytes.len();
    bytes.push(TAG_RECORD);
    bytes.extend_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&bytes[start..]);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes.extend_from_slice(&[0u8; 16]);
    bytes
}

/// Postmortem (issue 22, defect 6): a bit flipped in a record's length made the reader
/// wait for bytes past the end, so a damaged trace read as a cut-off one. The prefix's
/// checksum now says corrupt, naming the block.
#[test]
fn a_flipped_record_length_is_corruption_not_truncation() {
    let (mut bytes, ends) = encode(&sample_header(), &sample_records(3));
    bytes[ends[1] + 3] ^= 0x40;
    for total in [Some(bytes.len() as u64), None] {
        let err = read_all_from(&bytes[..], total).unwrap_err();
        assert!(matches!(err, TraceError::Corrupt { .. }), "{err}");
        assert!(
            err.to_string().contains("block 1 (at byte")
                && err
                    .to_string()
                    .contains("its length does not match its checksum"),
            "{err}"
        );
    }
}

#[test]
fn a_flipped_header_length_is_corruption() {
    let (mut bytes, _) = encode(&sample_header(), &[]);
    bytes[13] ^= 0x01;
    let err = read_all_from(&bytes[..], Some(bytes.len() as u64)).unwrap_err();
    assert!(
        err.to_string()
            .contains("version and length do not match their checksum"),
        "{err}"
    );
}

#[test]
fn an_absurd_record_length_is_too_large() {
    let bytes = header_then_record_len(u32::MAX);
    for total in [Some(bytes.len() as u64), None] {
        let err = read_all_from(&bytes[..], total).unwrap_err();
        assert!(
            matches!(err, TraceError::TooLarge { len, limit } if len == u64::from(u32::MAX) && limit == u64::from(MAX_BLOCK_BYTES)),
            "{err}"
        );
    }
}

#[test]
fn an_absurd_header_length_is_too_large() {
    let (mut bytes, _) = encode(&sample_header(), &[]);
    bytes[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    let crc = crc32fast::hash(&bytes[8..16]);
    bytes[16..20].copy_from_slice(&crc.to_le_bytes());
    let err = read_all_from(&bytes[..], Some(bytes.len() as u64)).unwrap_err();
    assert!(matches!(err, TraceError::TooLarge { .. }), "{err}");
}

#[test]
fn a_length_past_the_end_is_truncation_without_allocating() {
    // Under the block limit but far past the input: with a known length this must be
    // rejected before any buffer is sized; with an unknown one the buffer only grows
    // with bytes that arrive. Either way the trace is a truncated, empty prefix.
    let bytes = header_then_record_len(MAX_BLOCK_BYTES);
    for total in [Some(bytes.len() as u64), None] {
        let out = read_outcome(&bytes, total.is_some());
        assert!(out.error.is_none() && out.truncated && out.records.is_empty());
    }
}

#[test]
fn a_valid_checksum_over_garbage_is_a_decode_error_naming_the_record() {
    let (mut bytes, ends) = encode(&sample_header(), &sample_records(2));
    bytes.truncate(ends[2]);
    bytes.extend_from_slice(&tagged_block(TAG_RECORD, &[0xff; 12]));
    let err = read_all_from(&bytes[..], None).unwrap_err();
    assert!(matches!(err, TraceError::Decode { record: 2, .. }), "{err}");
    assert!(err.to_string().starts_with("record 2 does not decode: "));
}

#[test]
fn a_payload_flip_names_the_record() {
    let (mut bytes, ends) = encode(&sample_header(), &sample_records(3));
    // Past the tag, length and prefix checksum: inside the payload.
    bytes[ends[1] + 11] ^= 0x10;
    let err = read_all_from(&bytes[..], None).unwrap_err();
    assert!(matches!(err, TraceError::Checksum { record: 1 }), "{err}");
    assert_eq!(
        err.to_string(),
        "checksum mismatch in record 1: the trace is corrupt"
    );
}

#[test]
fn removed_duplicated_or_swapped_records_fail_the_footer() {
    let (bytes, ends) = encode(&sample_header(), &sample_records(3));
    let block = |i: usize| &bytes[ends[i]..ends[i + 1]];
    let footer = &bytes[ends[3]..];
    let splice = |order: &[usize]| {
        let mut out = bytes[..ends[0]].to_vec();
        for &i in order {
            out.extend_from_slice(block(i));
        }
        out.extend_from_slice(footer);
        out
    };
    for order in [&[0, 2][..], &[0, 1, 2, 2], &[1, 0, 2]] {
        let spliced = splice(order);
        let err = read_all_from(&spliced[..], None).unwrap_err();
        assert!(
            matches!(err, TraceError::Corrupt { .. }),
            "{order:?}: {err}"
        );
    }
    let err = read_all_from(&splice(&[0, 1])[..], None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "corrupt trace: footer counts 3 records but the trace holds 2"
    );
}

#[test]
fn bytes_after_the_footer_are_corrupt() {
    let (mut bytes, _) = encode(&sample_header(), &sample_records(1));
    bytes.push(0);
    let err = read_all_from(&bytes[..], None).unwrap_err();
    assert_eq!(err.to_string(), "corrupt trace: bytes after the footer");
}

#[test]
fn an_unknown_tag_is_corrupt_and_says_where() {
    let (mut bytes, ends) = encode(&sample_header(), &sample_records(2));
    bytes[ends[1]] = 9;
    let err = read_all_from(&bytes[..], None).unwrap_err();
    let want = format!(
        "corrupt trace: unknown block tag 9 at byte {}, after record 1",
        ends[1]
    );
    assert_eq!(err.to_string(), want);
}

#[test]
fn error_messages_are_single_lines() {
    let (bytes, _) = encode(&sample_header(), &sample_records(2));
    for at in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x41;
        if let Some(e) = read_outcome(&damaged, true).error {
            assert!(!e.to_string().contains('\n'), "{e}");
        }
    }
}

/// Postmortem (issue 22, defect 6): digests had no version, so a changed digest would
/// have read as a divergence at step 0. The header names its scheme, and a reader
/// refuses another by number.
#[test]
fn another_digest_scheme_is_refused_by_number() {
    let mut h = sample_header();
    h.digest_scheme = specmla_traces::DIGEST_SCHEME + 1;
    let (bytes, _) = encode(&h, &sample_records(1));
    let err = read_all_from(&bytes[..], None).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "trace digests follow scheme {}, this build computes scheme {}",
            specmla_traces::DIGEST_SCHEME + 1,
            specmla_traces::DIGEST_SCHEME
        )
    );
}

/// Violations found while recording survive the round trip.
#[test]
fn violations_are_recorded() {
    let (bytes, _) = encode(&sample_header(), &sample_records(3));
    let (_, records, _) = read_all_from(&bytes[..], None).unwrap();
    assert!(records[0].violations.is_empty());
    assert_eq!(records[1].violations[0].rule, "split_schedule");
    assert_eq!(records[1].violations[0].row, Some(0));
}
