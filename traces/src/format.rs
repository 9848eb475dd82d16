//! The byte layout of a trace file: constants, block framing and bounded reads.
//!
//! Owns everything that decides which bytes go where (see `FORMAT.md`): the magic, the
//! version, the tagged length-prefixed blocks, a CRC-32 over each block's prefix (so a
//! damaged length reads as corruption, never as a cut-off file) and one over its
//! payload, and the rule that a read never allocates more than the input can still
//! hold. The streaming API in
//! [`crate::io`] is built on these pieces and adds record counting and the footer check.

use std::io::{ErrorKind, Read};

use serde::{de::DeserializeOwned, Serialize};

use crate::error::{Result, TraceError};
use crate::types::TraceHeader;

/// First 8 bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"SPECMLA\0";
/// Version of the byte layout and of every type in [`crate::types`].
pub const FORMAT_VERSION: u32 = 7;
/// Largest payload a block may declare (256 MiB); larger lengths are corruption.
pub const MAX_BLOCK_BYTES: u32 = 256 << 20;
/// Tag byte of a record block.
pub const TAG_RECORD: u8 = 1;
/// Tag byte of the footer block.
pub const TAG_FOOTER: u8 = 2;
/// Bytes before the header payload: magic, version, length, the CRC-32 of version and
/// length.
pub const HEADER_PREFIX_LEN: usize = 20;
/// Bytes before a record or footer payload: tag, length, the CRC-32 of tag and length.
pub const BLOCK_PREFIX_LEN: usize = 9;
/// Bytes of the CRC-32 after every payload.
pub const CRC_LEN: usize = 4;
/// Initial buffer when the input length is unknown; the buffer then grows only as
/// bytes actually arrive, so a lying length cannot force a large allocation.
const UNKNOWN_LEN_CHUNK: u64 = 64 << 10;

/// CRC-32 (IEEE, as crc32fast computes it) of a payload.
pub fn crc32(payload: &[u8]) -> u32 {
    crc32fast::hash(payload)
}

/// postcard encoding of `value`, refused if it exceeds [`MAX_BLOCK_BYTES`] because the
/// reader would reject it.
pub fn encode_payload<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    let bytes = postcard::to_stdvec(value)
        .map_err(|e| TraceError::corrupt(format!("cannot encode block: {e}")))?;
    check_len(bytes.len() as u64)?;
    Ok(bytes)
}

/// Decodes a whole payload; bytes left over after the value are an error, so a
/// payload never silently carries more than it says.
pub fn decode_payload<T: DeserializeOwned>(bytes: &[u8]) -> std::result::Result<T, String> {
    let (value, rest) = postcard::take_from_bytes(bytes).map_err(|e| e.to_string())?;
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(format!("{} trailing bytes after the value", rest.len()))
    }
}

/// The header block around an encoded header payload.
pub fn header_block(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_PREFIX_LEN + payload.len() + CRC_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    push_payload(&mut out, MAGIC.len(), payload);
    out
}

/// A record or footer block around an encoded payload.
pub fn tagged_block(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(BLOCK_PREFIX_LEN + payload.len() + CRC_LEN);
    out.push(tag);
    push_payload(&mut out, 0, payload);
    out
}

/// Appends `len: u32`, the CRC-32 of `out[prefix_from..]` (the tag or version) and the
/// length, the payload and its CRC-32. Callers have checked the length through
/// [`encode_payload`], so the cast cannot truncate.
fn push_payload(out: &mut Vec<u8>, prefix_from: usize, payload: &[u8]) {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    let prefix_crc = crc32(&out[prefix_from..]);
    out.extend_from_slice(&prefix_crc.to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&crc32(payload).to_le_bytes());
}

/// Refuses lengths beyond [`MAX_BLOCK_BYTES`].
fn check_len(len: u64) -> Result<()> {
    if len > u64::from(MAX_BLOCK_BYTES) {
        return Err(TraceError::TooLarge {
            len,
            limit: u64::from(MAX_BLOCK_BYTES),
        });
    }
    Ok(())
}

/// Initial capacity for a `len`-byte read: never more than the bytes the input can
/// still hold, and only a small chunk when that is unknown.
pub fn alloc_bound(len: u64, remaining: Option<u64>) -> usize {
    let bound = len.min(remaining.unwrap_or(UNKNOWN_LEN_CHUNK));
    usize::try_from(bound).unwrap_or(0)
}

/// A reader that knows how many bytes it has consumed and, when given, how many the
/// input holds in total.
#[derive(Debug)]
pub struct Input<R> {
    r: R,
    pos: u64,
    total_len: Option<u64>,
}

impl<R: Read> Input<R> {
    /// Wraps `r`; `total_len` is the input's length when known (a file's size).
    pub fn new(r: R, total_len: Option<u64>) -> Self {
        Self {
            r,
            pos: 0,
            total_len,
        }
    }

    /// Bytes consumed so far.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Bytes the input can still hold, when its length is known.
    pub fn remaining(&self) -> Option<u64> {
        self.total_len.map(|t| t.saturating_sub(self.pos))
    }

    /// Reads until `buf` is full or the input ends; returns the bytes read.
    pub fn fill(&mut self, buf: &mut [u8]) -> Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match self.r.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.pos += got as u64;
        Ok(got)
    }

    /// Reads exactly `len` bytes, or `None` if the input ends first. Allocation is
    /// bounded by [`alloc_bound`] and otherwise grows only with bytes actually read.
    pub fn read_vec(&mut self, len: u64) -> Result<Option<Vec<u8>>> {
        let mut buf = Vec::with_capacity(alloc_bound(len, self.remaining()));
        let got = (&mut self.r).take(len).read_to_end(&mut buf)?;
        self.pos += got as u64;
        Ok((got as u64 == len).then_some(buf))
    }

    /// A little-endian `u32`, or `None` if the input ends first.
    fn read_u32(&mut self) -> Result<Option<u32>> {
        let mut b = [0u8; 4];
        Ok((self.fill(&mut b)? == 4).then(|| u32::from_le_bytes(b)))
    }

    /// Whether the input has no byte left (consumes one byte if it has).
    pub fn at_eof(&mut self) -> Result<bool> {
        Ok(self.fill(&mut [0u8; 1])? == 0)
    }

    /// A payload of `len` bytes followed by its CRC-32, or `None` if the input ends
    /// first. Lengths that cannot fit in the rest of a known-length input are treated
    /// as a cut-off block, without allocating.
    fn read_payload(&mut self, len: u32) -> Result<Option<(Vec<u8>, bool)>> {
        check_len(u64::from(len))?;
        let needed = u64::from(len) + CRC_LEN as u64;
        if self.remaining().is_some_and(|rem| needed > rem) {
            return Ok(None);
        }
        let Some(payload) = self.read_vec(u64::from(len))? else {
            return Ok(None);
        };
        let Some(crc) = self.read_u32()? else {
            return Ok(None);
        };
        let crc_ok = crc == crc32(&payload);
        Ok(Some((payload, crc_ok)))
    }
}

/// What [`read_block`] found after the header.
#[derive(Debug)]
pub enum Block {
    /// The input ended exactly at a block boundary.
    Eof,
    /// The input ended inside a block.
    Partial,
    /// A block whose tag and length do not match their CRC-32, at byte `offset`: a
    /// damaged length, which must not be read as a cut-off block.
    DamagedPrefix {
        /// Byte offset of the block.
        offset: u64,
    },
    /// A tag byte that is neither [`TAG_RECORD`] nor [`TAG_FOOTER`], at byte `offset`.
    UnknownTag {
        /// The tag found.
        tag: u8,
        /// Byte offset of the tag.
        offset: u64,
    },
    /// A whole block; `crc_ok` says whether its checksum matched.
    Complete {
        /// The tag.
        tag: u8,
        /// The payload bytes.
        payload: Vec<u8>,
        /// Whether the stored CRC-32 matched the payload.
        crc_ok: bool,
    },
}

/// Reads the next record or footer block.
pub fn read_block<R: Read>(input: &mut Input<R>) -> Result<Block> {
    let offset = input.pos();
    let mut tag = [0u8; 1];
    if input.fill(&mut tag)? == 0 {
        return Ok(Block::Eof);
    }
    let tag = tag[0];
    if tag != TAG_RECORD && tag != TAG_FOOTER {
        return Ok(Block::UnknownTag { tag, offset });
    }
    let Some(len) = input.read_u32()? else {
        return Ok(Block::Partial);
    };
    let Some(prefix_crc) = input.read_u32()? else {
        return Ok(Block::Partial);
    };
    let mut prefix = [tag, 0, 0, 0, 0];
    prefix[1..].copy_from_slice(&len.to_le_bytes());
    if prefix_crc != crc32(&prefix) {
        return Ok(Block::DamagedPrefix { offset });
    }
    Ok(match input.read_payload(len)? {
        None => Block::Partial,
        Some((payload, crc_ok)) => Block::Complete {
            tag,
            payload,
            crc_ok,
        },
    })
}

/// Reads and validates the header block: magic, version, length, CRC-32, payload.
pub fn read_header<R: Read>(input: &mut Input<R>) -> Result<TraceHeader> {
    let mut prefix = [0u8; HEADER_PREFIX_LEN];
    let got = input.fill(&mut prefix)?;
    let magic_len = got.min(MAGIC.len());
    if prefix[..magic_len] != MAGIC[..magic_len] {
        return Err(TraceError::NotATrace);
    }
    // The version is checked before the length so that a future format with a
    // different header layout still gets the version message, not a framing error.
    if got < 12 {
        return Err(TraceError::HeaderTruncated { bytes: got as u64 });
    }
    let version = le_u32(&prefix, 8);
    if version != FORMAT_VERSION {
        return Err(TraceError::Version {
            written: version,
            reads: FORMAT_VERSION,
        });
    }
    if got < HEADER_PREFIX_LEN {
        return Err(TraceError::HeaderTruncated { bytes: got as u64 });
    }
    if le_u32(&prefix, 16) != crc32(&prefix[8..16]) {
        return Err(TraceError::corrupt(
            "the header's version and length do not match their checksum",
        ));
    }
    let Some((payload, crc_ok)) = input.read_payload(le_u32(&prefix, 12))? else {
        // With a known length, report the input's size rather than what was read.
        let bytes = input.pos() + input.remaining().unwrap_or(0);
        return Err(TraceError::HeaderTruncated { bytes });
    };
    if !crc_ok {
        return Err(TraceError::corrupt("checksum mismatch in the header"));
    }
    decode_header(&payload, version)
}

/// Decodes the header payload and checks that its version field agrees with the prefix.
fn decode_header(payload: &[u8], version: u32) -> Result<TraceHeader> {
    let header: TraceHeader = decode_payload(payload)
        .map_err(|reason| TraceError::corrupt(format!("header does not decode: {reason}")))?;
    if header.format_version != version {
        return Err(TraceError::corrupt(format!(
            "header says format {} but its block says {version}",
            header.format_version
        )));
    }
    if header.digest_scheme != crate::DIGEST_SCHEME {
        return Err(TraceError::DigestScheme {
            written: header.digest_scheme,
            computes: crate::DIGEST_SCHEME,
        });
    }
    Ok(header)
}

/// The little-endian `u32` at byte `at` (8, 12 or 16) of the header prefix.
fn le_u32(prefix: &[u8; HEADER_PREFIX_LEN], at: usize) -> u32 {
    u32::from_le_bytes([prefix[at], prefix[at + 1], prefix[at + 2], prefix[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_bound_never_exceeds_remaining_or_chunk() {
        assert_eq!(alloc_bound(u64::from(u32::MAX), Some(10)), 10);
        assert_eq!(alloc_bound(5, Some(10)), 5);
        assert_eq!(
            alloc_bound(u64::from(MAX_BLOCK_BYTES), None),
            UNKNOWN_LEN_CHUNK as usize
        );
    }

    #[test]
    fn read_vec_of_lying_length_on_unknown_input_is_short() {
        let data = [7u8; 100];
        let mut input = Input::new(&data[..], None);
        let got = input.read_vec(u64::from(MAX_BLOCK_BYTES)).unwrap();
        assert!(got.is_none());
        assert_eq!(input.pos(), 100);
    }

    #[test]
    fn decode_rejects_trailing_bytes() {
        let mut bytes = postcard::to_stdvec(&7u64).unwrap();
        bytes.push(0);
        assert!(decode_payload::<u64>(&bytes).is_err());
    }

    #[test]
    fn block_layout_is_tag_len_prefix_crc_payload_crc() {
        let b = tagged_block(TAG_RECORD, b"abc");
        assert_eq!(b[0], TAG_RECORD);
        assert_eq!(&b[1..5], &3u32.to_le_bytes());
        assert_eq!(&b[5..9], &crc32fast::hash(&b[0..5]).to_le_bytes());
        assert_eq!(&b[9..12], b"abc");
        assert_eq!(&b[12..16], &crc32fast::hash(b"abc").to_le_bytes());
        let h = header_block(b"xy");
        assert_eq!(&h[8..12], &FORMAT_VERSION.to_le_bytes());
        assert_eq!(&h[16..20], &crc32fast::hash(&h[8..16]).to_le_bytes());
        // The standard CRC-32 check value pins the polynomial crc32fast uses.
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }
}
