//! The one error type of the trace reader and writer.
//!
//! Every message is a single line fit to follow `error: ` in a CLI, and names the
//! record index where one applies, so a user can tell a corrupt file from a wrong one.

use std::path::PathBuf;

/// Result with [`TraceError`].
pub type Result<T, E = TraceError> = std::result::Result<T, E>;

/// Why a trace could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// An I/O error while reading or writing the stream. (The cause is part of the
    /// message and deliberately not a `source`, so a CLI printing the error chain says
    /// it once.)
    #[error("trace i/o failed: {0}")]
    Io(std::io::Error),
    /// The trace file could not be opened or created.
    #[error("cannot open trace {}: {error}", path.display())]
    Open {
        /// The path given.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },
    /// The input does not start with the trace magic.
    #[error("not a specmla trace (bad magic bytes)")]
    NotATrace,
    /// The trace was written by another format version.
    #[error("trace written by format {written}, this reads {reads}")]
    Version {
        /// Version found in the file.
        written: u32,
        /// Version this build reads.
        reads: u32,
    },
    /// The trace's digests follow another scheme than this build computes.
    #[error("trace digests follow scheme {written}, this build computes scheme {computes}")]
    DigestScheme {
        /// Scheme recorded in the header.
        written: u32,
        /// [`crate::DIGEST_SCHEME`].
        computes: u32,
    },
    /// The input ends before its header is complete, so nothing can be read.
    #[error("trace ends inside its header after {bytes} bytes")]
    HeaderTruncated {
        /// Bytes present.
        bytes: u64,
    },
    /// A complete record block whose checksum does not match its payload.
    #[error("checksum mismatch in record {record}: the trace is corrupt")]
    Checksum {
        /// 0-based index of the record block.
        record: u64,
    },
    /// A complete record block with a valid checksum that does not decode.
    #[error("record {record} does not decode: {reason}")]
    Decode {
        /// 0-based index of the record block.
        record: u64,
        /// Decoder message.
        reason: String,
    },
    /// A block length beyond [`crate::MAX_BLOCK_BYTES`].
    #[error("block length {len} exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Length found (or asked to write).
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// Any other structural damage: bad header checksum, unknown tag, footer mismatch.
    #[error("corrupt trace: {reason}")]
    Corrupt {
        /// What is wrong, and where.
        reason: String,
    },
    /// The writer was used after an earlier write failed.
    #[error("trace writer is unusable after an earlier write error")]
    WriterFailed,
}

impl TraceError {
    /// A [`TraceError::Corrupt`] with `reason`.
    pub(crate) fn corrupt(reason: impl Into<String>) -> Self {
        Self::Corrupt {
            reason: reason.into(),
        }
    }
}

impl From<std::io::Error> for TraceError {
    fn from(e: std::io::Error) -> Self {
        TraceError::Io(e)
    }
}
