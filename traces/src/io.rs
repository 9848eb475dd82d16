//! Streaming trace writer and reader.
//!
//! Owns the order of blocks in a file (header, records, footer), the running record
//! count and records digest, and truncation semantics: a file that stops at or inside
//! a block is a usable prefix, never an error; damage inside a complete block is.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use crate::digest::Fnv1a64;
use crate::error::{Result, TraceError};
use crate::format::{
    decode_payload, encode_payload, header_block, read_block, read_header, tagged_block, Block,
    Input, FORMAT_VERSION, TAG_FOOTER, TAG_RECORD,
};
use crate::types::{StepRecord, TraceFooter, TraceHeader};

/// Writes a trace one step at a time.
///
/// Every block is flushed as it is written, so a run killed at any point leaves a file
/// whose complete records read back (as a truncated trace).
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    w: W,
    num_records: u64,
    digest: Fnv1a64,
    failed: bool,
}

impl TraceWriter<BufWriter<File>> {
    /// Creates (or truncates) the file at `path` and writes the header.
    pub fn create(path: impl AsRef<Path>, header: &TraceHeader) -> Result<Self> {
        let path = path.as_ref();
        let file = File::create(path).map_err(|error| TraceError::Open {
            path: path.to_path_buf(),
            error,
        })?;
        Self::new(BufWriter::new(file), header)
    }
}

impl<W: Write> TraceWriter<W> {
    /// Writes the header block to `w`. The header's `format_version` is stamped with
    /// [`FORMAT_VERSION`] whatever the caller put there, since this code defines the layout.
    pub fn new(w: W, header: &TraceHeader) -> Result<Self> {
        let stamped = TraceHeader {
            format_version: FORMAT_VERSION,
            ..header.clone()
        };
        let block = header_block(&encode_payload(&stamped)?);
        let mut writer = Self {
            w,
            num_records: 0,
            digest: Fnv1a64::new(),
            failed: false,
        };
        writer.put(&block)?;
        Ok(writer)
    }

    /// Appends one record block and flushes it.
    pub fn write_step(&mut self, record: &StepRecord) -> Result<()> {
        let payload = encode_payload(record)?;
        self.put(&tagged_block(TAG_RECORD, &payload))?;
        self.digest.update(&payload);
        self.num_records += 1;
        Ok(())
    }

    /// Records written so far.
    pub fn num_records(&self) -> u64 {
        self.num_records
    }

    /// The inner writer (for example, to see how many bytes a `Vec` holds so far).
    pub fn get_ref(&self) -> &W {
        &self.w
    }

    /// Writes the footer, flushes, and returns the inner writer.
    pub fn finish(mut self) -> Result<W> {
        let footer = TraceFooter {
            num_records: self.num_records,
            records_digest: self.digest.finish(),
        };
        let payload = encode_payload(&footer)?;
        self.put(&tagged_block(TAG_FOOTER, &payload))?;
        Ok(self.w)
    }

    /// Writes and flushes `bytes`; after a failure the stream may hold half a block,
    /// so further writes are refused rather than appending after garbage.
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        if self.failed {
            return Err(TraceError::WriterFailed);
        }
        let res = self.w.write_all(bytes).and_then(|()| self.w.flush());
        self.failed = res.is_err();
        Ok(res?)
    }
}

/// Whether a trace ended with its footer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completeness {
    /// The footer was present and matched the records.
    Complete,
    /// The trace stopped without a footer after `records` complete records.
    Truncated {
        /// Complete records read.
        records: u64,
    },
}

/// Reads a trace one step at a time.
///
/// After the last record, [`TraceReader::next_step`] returns `Ok(None)` and
/// [`TraceReader::is_truncated`] tells whether the footer was missing. After an error
/// the reader is finished: further calls return `Ok(None)`.
#[derive(Debug)]
pub struct TraceReader<R: Read> {
    input: Input<R>,
    header: TraceHeader,
    num_records: u64,
    digest: Fnv1a64,
    footer: Option<TraceFooter>,
    truncated: bool,
    done: bool,
}

impl TraceReader<BufReader<File>> {
    /// Opens the file at `path`, using its size to bound every allocation.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let open_err = |error| TraceError::Open {
            path: path.to_path_buf(),
            error,
        };
        let file = File::open(path).map_err(open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        Self::new(BufReader::new(file), Some(len))
    }
}

impl<R: Read> TraceReader<R> {
    /// Reads and validates the header from `r`. `total_len` is the input's length when
    /// known; reads are then never sized beyond it.
    pub fn new(r: R, total_len: Option<u64>) -> Result<Self> {
        let mut input = Input::new(r, total_len);
        let header = read_header(&mut input)?;
        Ok(Self {
            input,
            header,
            num_records: 0,
            digest: Fnv1a64::new(),
            footer: None,
            truncated: false,
            done: false,
        })
    }

    /// The validated header.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// Complete records returned so far.
    pub fn records_read(&self) -> u64 {
        self.num_records
    }

    /// True once the input ended without a footer (the records read are a prefix).
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }

    /// The footer, once it has been read and checked.
    pub fn footer(&self) -> Option<&TraceFooter> {
        self.footer.as_ref()
    }

    /// How the trace ended, once [`TraceReader::next_step`] has returned `Ok(None)`
    /// without an error; `None` before that.
    pub fn completeness(&self) -> Option<Completeness> {
        if self.truncated {
            Some(Completeness::Truncated {
                records: self.num_records,
            })
        } else {
            self.footer.as_ref().map(|_| Completeness::Complete)
        }
    }

    /// The next record, `Ok(None)` at the end (footer or truncation), or an error.
    pub fn next_step(&mut self) -> Result<Option<StepRecord>> {
        if self.done {
            return Ok(None);
        }
        let res = self.advance();
        // Any end, error or not, finishes the reader: after damage the framing of the
        // following bytes is unknown, so nothing after it can be trusted.
        if !matches!(res, Ok(Some(_))) {
            self.done = true;
        }
        res
    }

    /// One block: a record, the footer (then `None`), or the end of input.
    fn advance(&mut self) -> Result<Option<StepRecord>> {
        match read_block(&mut self.input)? {
            Block::Eof | Block::Partial => {
                self.truncated = true;
                Ok(None)
            }
            Block::DamagedPrefix { offset } => Err(TraceError::corrupt(format!(
                "block {} (at byte {offset}): its length does not match its checksum",
                self.num_records
            ))),
            Block::UnknownTag { tag, offset } => Err(TraceError::corrupt(format!(
                "unknown block tag {tag} at byte {offset}, after record {}",
                self.num_records
            ))),
            Block::Complete {
                tag,
                payload,
                crc_ok,
            } if tag == TAG_RECORD => self.take_record(&payload, crc_ok).map(Some),
            Block::Complete {
                payload, crc_ok, ..
            } => self.take_footer(&payload, crc_ok).map(|()| None),
        }
    }

    /// Checks and decodes a record block's payload.
    fn take_record(&mut self, payload: &[u8], crc_ok: bool) -> Result<StepRecord> {
        let record = self.num_records;
        if !crc_ok {
            return Err(TraceError::Checksum { record });
        }
        let step =
            decode_payload(payload).map_err(|reason| TraceError::Decode { record, reason })?;
        self.digest.update(payload);
        self.num_records += 1;
        Ok(step)
    }

    /// Checks the footer against the records read, and that nothing follows it.
    fn take_footer(&mut self, payload: &[u8], crc_ok: bool) -> Result<()> {
        if !crc_ok {
            return Err(TraceError::corrupt("checksum mismatch in the footer"));
        }
        let footer: TraceFooter = decode_payload(payload)
            .map_err(|reason| TraceError::corrupt(format!("footer does not decode: {reason}")))?;
        if footer.num_records != self.num_records {
            return Err(TraceError::corrupt(format!(
                "footer counts {} records but the trace holds {}",
                footer.num_records, self.num_records
            )));
        }
        if footer.records_digest != self.digest.finish() {
            return Err(TraceError::corrupt(
                "records digest does not match the footer",
            ));
        }
        if !self.input.at_eof()? {
            return Err(TraceError::corrupt("bytes after the footer"));
        }
        self.footer = Some(footer);
        Ok(())
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<StepRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_step().transpose()
    }
}

/// Reads a whole trace file: header, every record, and how it ended.
pub fn read_all(path: impl AsRef<Path>) -> Result<(TraceHeader, Vec<StepRecord>, Completeness)> {
    collect(TraceReader::open(path)?)
}

/// [`read_all`] over any reader; `total_len` as in [`TraceReader::new`].
pub fn read_all_from<R: Read>(
    r: R,
    total_len: Option<u64>,
) -> Result<(TraceHeader, Vec<StepRecord>, Completeness)> {
    collect(TraceReader::new(r, total_len)?)
}

/// Drains `reader` into memory.
fn collect<R: Read>(
    mut reader: TraceReader<R>,
) -> Result<(TraceHeader, Vec<StepRecord>, Completeness)> {
    let records = reader.by_ref().collect::<Result<Vec<_>>>()?;
    let completeness = reader.completeness().unwrap_or(Completeness::Truncated {
        records: reader.records_read(),
    });
    Ok((reader.header, records, completeness))
}
