//! The fuzz target's body (`fuzz/fuzz_targets/trace_reader.rs`), here so that the
//! corpus replay test runs exactly what the fuzzer ran.

use crate::format::{encode_payload, header_block, tagged_block, TAG_FOOTER, TAG_RECORD};
use crate::{read_all_from, TraceFooter, TraceHeader, TraceReader, DIGEST_SCHEME, FORMAT_VERSION};

/// Reads `data` as a trace every way the tools do: whole, with and without its length
/// known, and record by record; then again framed with valid checksums, as a header's
/// payload and as a record's payload after a valid header, so the decoders behind the
/// checksums are reached too. Any result is fine; a panic, a hang or an error message of
/// more than one line is a bug.
pub fn read_any(data: &[u8]) {
    read_every_way(data);
    read_every_way(&header_block(data));
    read_every_way(&record_after_valid_header(data));
}

fn read_every_way(data: &[u8]) {
    for total in [Some(data.len() as u64), None] {
        if let Err(e) = read_all_from(data, total) {
            assert!(!e.to_string().contains('\n'), "a multi-line error: {e}");
        }
    }
    if let Ok(reader) = TraceReader::new(data, Some(data.len() as u64)) {
        for r in reader {
            if let Err(e) = r {
                assert!(!e.to_string().contains('\n'), "a multi-line error: {e}");
                break;
            }
        }
    }
}

/// A minimal valid header, `payload` as one record block, and a footer counting it.
fn record_after_valid_header(payload: &[u8]) -> Vec<u8> {
    let header = TraceHeader {
        format_version: FORMAT_VERSION,
        tool_version: String::new(),
        scenario: String::new(),
        seed: 0,
        config_json: String::new(),
        faults: Vec::new(),
        acceptance_rates: vec![0.0],
        trace_tensors: false,
        workload: Vec::new(),
        backend: String::new(),
        kernels: String::new(),
        digest_scheme: DIGEST_SCHEME,
        bf16_compute: false,
    };
    let footer = TraceFooter {
        num_records: 1,
        records_digest: crate::digest_bytes(payload),
    };
    let (Ok(h), Ok(f)) = (encode_payload(&header), encode_payload(&footer)) else {
        return Vec::new();
    };
    let mut out = header_block(&h);
    out.extend_from_slice(&tagged_block(TAG_RECORD, payload));
    out.extend_from_slice(&tagged_block(TAG_FOOTER, &f));
    out
}
