//! The crate's one error type: every way bad input, a missing ceiling or a failed write
//! is reported. Each message is a single line so the binary can print `error: ...`.

use std::path::PathBuf;

/// Why no pictures were drawn. Everything here is bad input or environment (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The CSV could not be read at all.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The CSV path as given.
        path: String,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The file has no header line.
    #[error("{path} is empty: expected the header `{expected}`")]
    Empty {
        /// The CSV path as given.
        path: String,
        /// The header we parse.
        expected: String,
    },
    /// The first line is not the header we parse.
    #[error("{path} line {line}: header is `{found}`: {problem}")]
    Header {
        /// The CSV path as given.
        path: String,
        /// 1-based line of the header.
        line: u64,
        /// The header found, fields joined by commas.
        found: String,
        /// Which columns are missing, unknown or out of order.
        problem: String,
    },
    /// A header and no data row: nothing to draw.
    #[error("{path} has its header but no data rows: nothing to draw")]
    NoRows {
        /// The CSV path as given.
        path: String,
    },
    /// A data line has the wrong number of fields.
    #[error("{path} line {line}: {found} fields, expected {expected}")]
    FieldCount {
        /// The CSV path as given.
        path: String,
        /// 1-based line number.
        line: u64,
        /// Fields on that line.
        found: usize,
        /// Fields in the header.
        expected: usize,
    },
    /// One field of a data line does not parse.
    #[error("{path} line {line}, column {column} ({name}): {reason}")]
    Field {
        /// The CSV path as given.
        path: String,
        /// 1-based line number.
        line: u64,
        /// 1-based column number.
        column: usize,
        /// The column's header name.
        name: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
    /// The CSV layer itself failed (bad UTF-8, broken quoting).
    #[error("{path}: {message}")]
    Csv {
        /// The CSV path as given.
        path: String,
        /// The csv crate's message, which names the line.
        message: String,
    },
    /// A picture has rows but its ceiling row is missing.
    #[error("picture `{picture}` needs the {what}: {path} has no `{kernel}` row with {field} > 0")]
    MissingCeiling {
        /// The picture's file stem.
        picture: &'static str,
        /// The ceiling in words.
        what: &'static str,
        /// The CSV path as given.
        path: String,
        /// The ceiling row's kernel name.
        kernel: &'static str,
        /// The ceiling row's field.
        field: &'static str,
    },
    /// The output directory could not be created.
    #[error("cannot create {path}: {source}")]
    OutDir {
        /// The directory.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// plotters failed while drawing or writing a file.
    #[error("drawing {path}: {message}")]
    Draw {
        /// The file being written.
        path: PathBuf,
        /// plotters' message.
        message: String,
    },
    /// The embedded font did not parse (a corrupt build, never bad input).
    #[error("the embedded font DejaVu Sans did not load")]
    Font,
}
