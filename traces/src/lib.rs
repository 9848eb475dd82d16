//! specmla-traces: the on-disk trace format for recording and replaying specmla runs.
//!
//! This crate owns the serializable trace types, the byte layout (see `FORMAT.md`),
//! the stable digests and the streaming reader/writer. It deliberately depends on
//! neither specmla-core nor specmla-sim: the format must stay stable while the engine
//! changes, so conversions from engine types live with the engine.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod digest;
pub mod error;
pub mod format;
pub mod fuzzing;
pub mod io;
pub mod types;

pub use digest::{digest_bytes, digest_f32, digest_u64s, Fnv1a64, DIGEST_SCHEME};
pub use error::{Result, TraceError};
pub use format::{FORMAT_VERSION, MAGIC, MAX_BLOCK_BYTES};
pub use io::{read_all, read_all_from, Completeness, TraceReader, TraceWriter};
pub use types::{
    ForcedDraft, LayerDigest, RowPath, StepRecord, StepTensors, TraceFooter, TraceHeader,
    TraceRequest, TraceRow, TraceViolation,
};
