//! Round trips: what is written reads back equal, and writing is deterministic.

mod common;

use std::io::{self, Write};

use common::{encode, header, record, sample_header, sample_records};
use proptest::prelude::*;
use specmla_traces::{
    read_all, read_all_from, Completeness, StepTensors, TraceError, TraceReader, TraceWriter,
    FORMAT_VERSION,
};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn round_trip_gives_equal_values_and_identical_bytes(
        h in header(),
        records in proptest::collection::vec(record(), 0..6),
    ) {
        let (bytes, _) = encode(&h, &records);
        for total in [Some(bytes.len() as u64), None] {
            let (h2, r2, c) = read_all_from(&bytes[..], total).unwrap();
            prop_assert_eq!(&h2, &h);
            prop_assert_eq!(&r2, &records);
            prop_assert_eq!(c, Completeness::Complete);
        }
        let (again, _) = encode(&h, &records);
        prop_assert_eq!(again, bytes);
    }
}

#[test]
fn file_round_trip_through_create_and_read_all() {
    let path = std::env::temp_dir().join(format!("specmla-traces-rt-{}.trace", std::process::id()));
    let records = sample_records(5);
    let mut w = TraceWriter::create(&path, &sample_header()).unwrap();
    for r in &records {
        w.write_step(r).unwrap();
    }
    assert_eq!(w.num_records(), 5);
    drop(w.finish().unwrap());
    let got = read_all(&path);
    let reader_records: Vec<_> = TraceReader::open(&path)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    let (h, r, c) = got.unwrap();
    assert_eq!(h, sample_header());
    assert_eq!(r, records);
    assert_eq!(reader_records, records);
    assert_eq!(c, Completeness::Complete);
}

#[test]
fn exact_float_bits_survive_including_nan_payloads() {
    let bits = [
        0x7fc0_0001u32,
        0xffc0_1234,
        0x8000_0000,
        0x0000_0001,
        0x7f80_0000,
    ];
    let mut rec = sample_records(1).remove(0);
    let floats: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    rec.tensors = Some(StepTensors {
        attn_outputs: vec![floats.clone()],
        logits: floats,
    });
    let mut h = sample_header();
    h.acceptance_rates = vec![0.5, f64::from_bits(0x7ff8_0000_0000_0042)];
    let (bytes, _) = encode(&h, &[rec]);
    let (h2, r2, _) = read_all_from(&bytes[..], None).unwrap();
    assert_eq!(h2.acceptance_rates[1].to_bits(), 0x7ff8_0000_0000_0042);
    let t = r2[0].tensors.as_ref().unwrap();
    let bits_of = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    assert_eq!(bits_of(&t.attn_outputs[0]), bits);
    assert_eq!(bits_of(&t.logits), bits);
}

/// The header says which backend kind recorded the trace, and reads back as written.
#[test]
fn the_header_backend_round_trips() {
    for kind in ["cpu", "gpu"] {
        let mut h = sample_header();
        h.backend = kind.to_string();
        let (bytes, _) = encode(&h, &sample_records(2));
        let (h2, _, _) = read_all_from(&bytes[..], None).unwrap();
        assert_eq!(h2.backend, kind);
        assert_eq!(h2, h);
    }
}

#[test]
fn writer_stamps_the_current_format_version() {
    let mut h = sample_header();
    h.format_version = 99;
    let (bytes, _) = encode(&h, &[]);
    let (h2, r2, c) = read_all_from(&bytes[..], None).unwrap();
    assert_eq!(h2.format_version, FORMAT_VERSION);
    assert!(r2.is_empty());
    assert_eq!(c, Completeness::Complete);
}

#[test]
fn reader_reports_footer_and_counts() {
    let (bytes, _) = encode(&sample_header(), &sample_records(3));
    let mut reader = TraceReader::new(&bytes[..], Some(bytes.len() as u64)).unwrap();
    assert_eq!(reader.completeness(), None);
    assert_eq!(reader.by_ref().count(), 3);
    assert_eq!(reader.records_read(), 3);
    assert!(!reader.is_truncated());
    assert_eq!(reader.footer().unwrap().num_records, 3);
    assert_eq!(reader.completeness(), Some(Completeness::Complete));
}

/// Accepts `budget` bytes, then fails every write.
struct FailAfter {
    budget: usize,
}

impl Write for FailAfter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.budget == 0 {
            return Err(io::Error::other("disk full"));
        }
        let n = buf.len().min(self.budget);
        self.budget -= n;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn writer_refuses_to_continue_after_a_failed_write() {
    let (bytes, ends) = encode(&sample_header(), &sample_records(1));
    assert!(bytes.len() > ends[0] + 3);
    let mut w = TraceWriter::new(
        FailAfter {
            budget: ends[0] + 3,
        },
        &sample_header(),
    )
    .unwrap();
    let rec = sample_records(1).remove(0);
    assert!(matches!(w.write_step(&rec), Err(TraceError::Io(_))));
    assert!(matches!(w.write_step(&rec), Err(TraceError::WriterFailed)));
    assert!(matches!(w.finish(), Err(TraceError::WriterFailed)));
}

#[test]
fn opening_a_missing_file_names_it() {
    let err = read_all("/nonexistent/dir/x.trace").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, TraceError::Open { .. }));
    assert!(
        msg.starts_with("cannot open trace /nonexistent/dir/x.trace: "),
        "{msg}"
    );
}
