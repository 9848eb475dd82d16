//! The `gpu-bench` CSV: its schema, parsing with line-and-column errors, and the two
//! ceilings (copy bandwidth, bf16 GEMM rate) the pictures measure kernels against.

use std::path::Path;

use crate::error::PlotError;

/// The header line, field by field, as `gpu-bench` writes it before its last, optional
/// column ([`CLOCK_COLUMN`]).
pub const HEADER: [&str; 14] = [
    "kernel",
    "mode",
    "heads",
    "q_len",
    "batch",
    "context",
    "page",
    "time_us",
    "bytes",
    "flops",
    "gb_per_s",
    "tflop_per_s",
    "pct_copy",
    "pct_gemm",
];

/// An optional last column: the SM clock (MHz) `gpu-bench` read right after the timed
/// rounds of the row's shape; empty where it was not read. Files written before it have no
/// such column, and rows appended from a peer's file in the older format (a `flashmla` or
/// SDPA row, 14 fields) may omit it under a header that has it.
pub const CLOCK_COLUMN: &str = "sm_mhz";

/// Ceiling row: device-to-device copy; `gb_per_s` is read + write bandwidth.
pub const COPY_KERNEL: &str = "copy";
/// Ceiling row: bf16 GEMM; `tflop_per_s` is the measured rate.
pub const GEMM_KERNEL: &str = "gemm_bf16";
/// Our uniform MLA decode kernel (`mode` is `invariant` or `fast`).
pub const DECODE_KERNEL: &str = "decode";
/// Our f32 materialized prefill path, timed on spec-step shapes.
pub const PREFILL_KERNEL: &str = "prefill_path";
/// The bf16 prefill path (gather, up-projection, `flash_prefill`) on spec-step shapes.
pub const FLASH_PREFILL_PATH_KERNEL: &str = "prefill_flash_path";
/// The bf16 prefill attention alone (`context` is the keys per row).
pub const FLASH_PREFILL_KERNEL: &str = "prefill_flash";
/// Its peer at the same shapes, PyTorch SDPA on cuDNN (`gpu/tools/sdpa_peer.py BENCH_CSV --csv FILE`).
pub const PREFILL_PEER_KERNEL: &str = "prefill_sdpa_cudnn";

/// The decode peer, DeepSeek's FlashMLA (its sm90 dense split-KV kernel and combine), timed
/// at `gpu-bench`'s decode shapes in the same device call and written in this CSV format
/// (mode `splitkv`). Nothing here builds or runs it: a user appends its rows.
pub const DECODE_PEER_KERNEL: &str = "flashmla";

/// Whether `kernel` is a prefill path or the prefill attention: not decode-like work.
pub fn is_prefill(kernel: &str) -> bool {
    [
        PREFILL_KERNEL,
        FLASH_PREFILL_PATH_KERNEL,
        FLASH_PREFILL_KERNEL,
        PREFILL_PEER_KERNEL,
    ]
    .contains(&kernel)
}

/// One measurement (or ceiling) line of the CSV.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// 1-based line in the file, for messages.
    pub line: u64,
    /// Which kernel: `copy`, `gemm_bf16`, `decode`, `prefill_path`, `triton_peer`, ...
    pub kernel: String,
    /// Kernel variant (`invariant`, `fast`); may be empty.
    pub mode: String,
    /// Query heads.
    pub heads: u32,
    /// Query tokens per request (1 + K on a spec step).
    pub q_len: u32,
    /// Requests in the batch.
    pub batch: u32,
    /// Tokens of KV per request.
    pub context: u64,
    /// KV page size in tokens.
    pub page: u32,
    /// Kernel time.
    pub time_us: f64,
    /// Bytes the kernel moves (the bench's count).
    pub bytes: f64,
    /// Floating-point operations the kernel does.
    pub flops: f64,
    /// Achieved bandwidth.
    pub gb_per_s: f64,
    /// Achieved compute rate.
    pub tflop_per_s: f64,
    /// Bandwidth as a percentage of the copy ceiling.
    pub pct_copy: f64,
    /// Compute rate as a percentage of the GEMM ceiling.
    pub pct_gemm: f64,
    /// The SM clock after the row's timed batch, MHz, where the file has it.
    pub sm_mhz: Option<f64>,
}

impl Row {
    /// Whether this row is a ceiling (copy or GEMM) rather than a kernel measurement.
    pub fn is_ceiling(&self) -> bool {
        self.kernel == COPY_KERNEL || self.kernel == GEMM_KERNEL
    }

    /// FLOP per byte, when both counts are positive.
    pub fn arithmetic_intensity(&self) -> Option<f64> {
        (self.flops > 0.0 && self.bytes > 0.0).then(|| self.flops / self.bytes)
    }

    /// `kernel` or `kernel/mode`, for legends.
    pub fn kernel_label(&self) -> String {
        kernel_label(&self.kernel, &self.mode)
    }
}

/// `kernel` or `kernel/mode` when the mode is set.
pub fn kernel_label(kernel: &str, mode: &str) -> String {
    if mode.is_empty() {
        kernel.to_string()
    } else {
        format!("{kernel}/{mode}")
    }
}

/// The best measured ceilings; `None` where the CSV has no usable row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ceilings {
    /// Copy bandwidth, read + write, GB/s.
    pub copy_gb_per_s: Option<f64>,
    /// bf16 GEMM rate, TFLOP/s.
    pub gemm_tflop_per_s: Option<f64>,
}

/// A parsed CSV file.
#[derive(Debug, Clone)]
pub struct Bench {
    /// The path as given, for messages.
    pub path: String,
    /// Every data row, in file order.
    pub rows: Vec<Row>,
}

impl Bench {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, PlotError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| PlotError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&bytes, &shown)
    }

    /// Parses CSV text; `path` only names the file in messages.
    ///
    /// Blank lines and lines starting with `#` are skipped (hand-typed peer numbers may
    /// carry a note); line numbers in errors still count them.
    pub fn parse(text: &[u8], path: &str) -> Result<Self, PlotError> {
        // A spreadsheet that saved hand-typed peer numbers may have put a UTF-8 BOM first.
        let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .trim(csv::Trim::All)
            .comment(Some(b'#'))
            .from_reader(text);
        let csv_error = |e: csv::Error| PlotError::Csv {
            path: path.to_string(),
            message: e.to_string().replace('\n', " "),
        };
        let mut records = reader.records();
        let header = match records.next() {
            None => {
                return Err(PlotError::Empty {
                    path: path.to_string(),
                    expected: HEADER.join(","),
                })
            }
            Some(r) => r.map_err(csv_error)?,
        };
        let with_clock =
            header.len() == HEADER.len() + 1 && header.get(HEADER.len()) == Some(CLOCK_COLUMN);
        let columns = if with_clock {
            HEADER.len() + 1
        } else {
            HEADER.len()
        };
        if !header.iter().take(HEADER.len()).eq(HEADER.iter().copied()) || header.len() != columns {
            return Err(PlotError::Header {
                path: path.to_string(),
                line: line_of(&header, text),
                found: header.iter().collect::<Vec<_>>().join(","),
                problem: header_problem(&header.iter().collect::<Vec<_>>()),
            });
        }
        let mut rows = Vec::new();
        for record in records {
            let record = record.map_err(csv_error)?;
            rows.push(parse_row(&record, line_of(&record, text), path, columns)?);
        }
        if rows.is_empty() {
            return Err(PlotError::NoRows {
                path: path.to_string(),
            });
        }
        Ok(Self {
            path: path.to_string(),
            rows,
        })
    }

    /// Rows that measure a kernel (not a ceiling).
    pub fn measurements(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| !r.is_ceiling())
    }

    /// The ceilings: the best (largest positive) value over all rows of each kind, since
    /// a bench may measure a ceiling at several sizes and only the fastest is the roof.
    pub fn ceilings(&self) -> Ceilings {
        let best = |kernel: &str, value: fn(&Row) -> f64| {
            self.rows
                .iter()
                .filter(|r| r.kernel == kernel)
                .map(value)
                .filter(|v| *v > 0.0)
                .reduce(f64::max)
        };
        Ceilings {
            copy_gb_per_s: best(COPY_KERNEL, |r| r.gb_per_s),
            gemm_tflop_per_s: best(GEMM_KERNEL, |r| r.tflop_per_s),
        }
    }
}

/// The 1-based line a record starts on. The csv crate's position points at where it
/// started reading, before any comment or blank lines it skipped, so skip those here.
fn line_of(record: &csv::StringRecord, text: &[u8]) -> u64 {
    let mut start = record
        .position()
        .map_or(0, |p| p.byte() as usize)
        .min(text.len());
    let mut line = 1 + text[..start].iter().filter(|b| **b == b'\n').count() as u64;
    loop {
        let rest = &text[start..];
        let end = rest.iter().position(|b| *b == b'\n');
        let this = &rest[..end.unwrap_or(rest.len())];
        let skipped = this.is_empty() || this == b"\r" || this.starts_with(b"#");
        match end {
            Some(end) if skipped => {
                start += end + 1;
                line += 1;
            }
            _ => return line,
        }
    }
}

/// Names what is wrong with a header: missing columns, unknown ones, or the order.
fn header_problem(found: &[&str]) -> String {
    let missing: Vec<&str> = HEADER
        .iter()
        .copied()
        .filter(|c| !found.contains(c))
        .collect();
    let unknown: Vec<&str> = found
        .iter()
        .copied()
        .filter(|c| !HEADER.contains(c) && *c != CLOCK_COLUMN)
        .collect();
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("missing column(s) {}", missing.join(", ")));
    }
    if !unknown.is_empty() {
        parts.push(format!("unknown column(s) {}", unknown.join(", ")));
    }
    if parts.is_empty() {
        parts.push(format!(
            "columns out of order (expected `{}`, optionally then `{CLOCK_COLUMN}`)",
            HEADER.join(",")
        ));
    }
    parts.join("; ")
}

/// One data line of a file whose header has `columns` columns (with or without the clock;
/// under a header with it, a row may still end before it).
fn parse_row(
    record: &csv::StringRecord,
    line: u64,
    path: &str,
    columns: usize,
) -> Result<Row, PlotError> {
    if record.len() != columns && record.len() != HEADER.len() {
        return Err(PlotError::FieldCount {
            path: path.to_string(),
            line,
            found: record.len(),
            expected: columns,
        });
    }
    let field = |column: usize| Field {
        text: &record[column],
        path,
        line,
        column,
    };
    let kernel = field(0).text.to_string();
    if kernel.is_empty() {
        return Err(field(0).error("kernel is empty".into()));
    }
    Ok(Row {
        line,
        kernel,
        mode: field(1).text.to_string(),
        heads: field(2).int()?,
        q_len: field(3).int()?,
        batch: field(4).int()?,
        context: field(5).int()?,
        page: field(6).int()?,
        time_us: field(7).float()?,
        bytes: field(8).float()?,
        flops: field(9).float()?,
        gb_per_s: field(10).float()?,
        tflop_per_s: field(11).float()?,
        pct_copy: field(12).float()?,
        pct_gemm: field(13).float()?,
        sm_mhz: match record.get(HEADER.len()) {
            None | Some("") => None,
            Some(_) => Some(field(HEADER.len()).float()?),
        },
    })
}

/// One field with what a message needs to name it.
struct Field<'a> {
    text: &'a str,
    path: &'a str,
    line: u64,
    /// 0-based index into [`HEADER`].
    column: usize,
}

impl Field<'_> {
    fn error(&self, reason: String) -> PlotError {
        PlotError::Field {
            path: self.path.to_string(),
            line: self.line,
            column: self.column + 1,
            name: HEADER.get(self.column).copied().unwrap_or(CLOCK_COLUMN),
            reason,
        }
    }

    fn int<T: std::str::FromStr>(&self) -> Result<T, PlotError> {
        if self.text.is_empty() {
            return Err(self.error("empty (write 0 where a field does not apply)".into()));
        }
        self.text
            .parse()
            .map_err(|_| self.error(format!("`{}` is not a non-negative integer", self.text)))
    }

    fn float(&self) -> Result<f64, PlotError> {
        if self.text.is_empty() {
            return Err(self.error("empty (write 0 where a field does not apply)".into()));
        }
        let value: f64 = self
            .text
            .parse()
            .map_err(|_| self.error(format!("`{}` is not a number", self.text)))?;
        // "nan" and "inf" parse as f64 but would silently vanish from a log axis.
        if !value.is_finite() || value < 0.0 {
            return Err(self.error(format!(
                "`{}` is not a finite non-negative number",
                self.text
            )));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str =
        "kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_copy,pct_gemm\n";

    fn parse(body: &str) -> Result<Bench, PlotError> {
        Bench::parse(format!("{HEAD}{body}").as_bytes(), "t.csv")
    }

    #[test]
    fn parses_every_field_of_a_synthetic_csv() {
        let bench = parse(
            "copy,,0,0,0,0,0,0,0,0,3000.5,0,0,0\n\
             gemm_bf16,,0,0,0,0,0,0,0,0,0,700,0,0\n\
             decode,fast,128,4,64,8192,64,123.25,1.5e9,2.5e11,2400,350.5,80,50.1\n",
        )
        .unwrap();
        assert_eq!(bench.rows.len(), 3);
        let d = &bench.rows[2];
        assert_eq!(d.line, 4);
        assert_eq!((d.kernel.as_str(), d.mode.as_str()), ("decode", "fast"));
        assert_eq!(
            (d.heads, d.q_len, d.batch, d.context, d.page),
            (128, 4, 64, 8192, 64)
        );
        assert_eq!(d.time_us, 123.25);
        assert_eq!(d.bytes, 1.5e9);
        assert_eq!(d.flops, 2.5e11);
        assert_eq!((d.gb_per_s, d.tflop_per_s), (2400.0, 350.5));
        assert_eq!((d.pct_copy, d.pct_gemm), (80.0, 50.1));
        assert_eq!(d.arithmetic_intensity(), Some(2.5e11 / 1.5e9));
        assert_eq!(d.kernel_label(), "decode/fast");
        assert_eq!(bench.measurements().count(), 1);
        assert_eq!(
            bench.ceilings(),
            Ceilings {
                copy_gb_per_s: Some(3000.5),
                gemm_tflop_per_s: Some(700.0)
            }
        );
    }

    #[test]
    fn ceilings_take_the_best_row_and_ignore_zeros() {
        let bench = parse(
            "copy,,0,0,0,0,0,0,0,0,2000,0,0,0\n\
             copy,,0,0,0,0,0,0,0,0,3100,0,0,0\n\
             gemm_bf16,,0,0,0,0,0,0,0,0,0,0,0,0\n",
        )
        .unwrap();
        let c = bench.ceilings();
        assert_eq!(c.copy_gb_per_s, Some(3100.0));
        assert_eq!(c.gemm_tflop_per_s, None);
    }

    #[test]
    fn bad_field_names_its_line_and_column() {
        let err = parse(
            "# a note\n\
             decode,fast,128,4,64,8192,64,1,1,1,1,1,1,1\n\
             \n\
             decode,fast,128,4,64,8192,64,abc,1,1,1,1,1,1\n",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "t.csv line 5, column 8 (time_us): `abc` is not a number"
        );
        let err = parse("decode,fast,1.5,4,64,8192,64,1,1,1,1,1,1,1\n").unwrap_err();
        assert!(
            err.to_string().contains("line 2, column 3 (heads)"),
            "{err}"
        );
        let err = parse("decode,fast,1,4,64,8192,64,1,1,1,nan,1,1,1\n").unwrap_err();
        assert!(err.to_string().contains("column 11 (gb_per_s)"), "{err}");
        let err = parse("decode,fast,1,4,64,8192,64,1,1,1,1\n").unwrap_err();
        assert_eq!(err.to_string(), "t.csv line 2: 11 fields, expected 14");
    }

    /// `gpu-bench` now ends each row with the SM clock it read after the row's batch (empty
    /// where unread); files without the column still parse, and the column is checked like
    /// any other.
    #[test]
    fn clock_column_is_optional_and_read() {
        let head = format!("{},sm_mhz\n", HEAD.trim_end());
        let body = "gemm_bf16,ceiling,0,0,0,0,0,0,0,0,0,700,0,100,1848\n\
                    decode,fast,128,4,64,8192,64,1,1,1,1,1,1,1,\n";
        let b = Bench::parse(format!("{head}{body}").as_bytes(), "t.csv").unwrap();
        assert_eq!(b.rows[0].sm_mhz, Some(1848.0));
        assert_eq!(b.rows[1].sm_mhz, None);
        assert_eq!(
            parse("decode,fast,1,4,64,8192,64,1,1,1,1,1,1,1\n")
                .unwrap()
                .rows[0]
                .sm_mhz,
            None
        );
        // A peer's row appended in the older format: no clock.
        let mixed = format!("{head}{body}flashmla,splitkv,128,4,64,8192,64,1,1,1,1,1,1,1\n");
        let b = Bench::parse(mixed.as_bytes(), "t.csv").unwrap();
        assert_eq!((b.rows.len(), b.rows[2].sm_mhz), (3, None));
        let err = Bench::parse(format!("{head}decode,fast,1,4\n").as_bytes(), "t.csv").unwrap_err();
        assert_eq!(err.to_string(), "t.csv line 2: 4 fields, expected 15");
        let bad = format!("{head}decode,fast,1,4,64,8192,64,1,1,1,1,1,1,1,slow\n");
        let err = Bench::parse(bad.as_bytes(), "t.csv").unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.csv line 2, column 15 (sm_mhz): `slow` is not a number"
        );
        // A clock value under a header without the column is one field too many.
        let err = parse("decode,fast,1,4,64,8192,64,1,1,1,1,1,1,1,1848\n").unwrap_err();
        assert_eq!(err.to_string(), "t.csv line 2: 15 fields, expected 14");
        // The clock column only last.
        let err = Bench::parse(b"sm_mhz,kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_copy,pct_gemm\n", "t.csv").unwrap_err();
        assert!(err.to_string().contains("columns out of order"), "{err}");
    }

    #[test]
    fn header_must_match_exactly() {
        let err = Bench::parse(b"kernel,mode,heads\ndecode,fast,1\n", "t.csv").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("t.csv line 1: header is `kernel,mode,heads`"),
            "{err}"
        );
        let with_bom = format!("\u{feff}{HEAD}decode,fast,1,4,64,8192,64,1,1,1,1,1,1,1\n");
        assert_eq!(
            Bench::parse(with_bom.as_bytes(), "t.csv")
                .unwrap()
                .rows
                .len(),
            1
        );
        let err = Bench::parse(b"", "t.csv").unwrap_err();
        assert!(err.to_string().starts_with("t.csv is empty"), "{err}");
        let err = Bench::parse(HEAD.as_bytes(), "t.csv").unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.csv has its header but no data rows: nothing to draw"
        );
        let err = Bench::parse(b"kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_gemm,pct_copy\n", "t.csv").unwrap_err();
        assert!(err.to_string().ends_with("columns out of order (expected `kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_copy,pct_gemm`, optionally then `sm_mhz`)"), "{err}");
        let err = Bench::parse(b"kernel,mode\n", "t.csv").unwrap_err();
        assert!(
            err.to_string().contains("missing column(s) heads, q_len"),
            "{err}"
        );
    }
}
