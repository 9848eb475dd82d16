//! `sim sweep`: a grid of spec-decoding configurations, each run as a steady workload of
//! `batch` requests arriving together, every check on; one CSV row per point. This module
//! owns the grid (its axes, the fixed order of its points, each point's key and its
//! scenario), the shard a machine takes, and the CSV: its rows, the keys a resumed sweep
//! skips, and the merge of shards. Running a point is `runner::run_with`'s.
//!
//! A point's key names its grid coordinates and nothing else, so a sweep killed and
//! restarted with the same grid skips exactly the points it finished, and shards of one
//! grid merge without overlap.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use specmla_core::config::{BackendProfile, DrafterBatch, SpecConfig};

use crate::acceptance::AcceptanceRates;
use crate::cost_sink::SimulatedTime;
use crate::runner::RunSummary;
use crate::scenarios::Scenario;
use crate::step_time::StepKindTime;

/// One speculation setting of the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecChoice {
    Off,
    /// MTP / EAGLE multi-step drafting with K tokens.
    MultiStep(usize),
    /// DFlash block drafting with K tokens.
    DFlash(usize),
}

impl SpecChoice {
    /// `off`, `mtpK` or `dflashK` (K from 1 to 16).
    pub fn parse(s: &str) -> Result<Self, String> {
        let k = |rest: &str| match rest.parse::<usize>() {
            Ok(k) if (1..=16).contains(&k) => Ok(k),
            _ => Err(format!(
                "spec setting {s:?}: K must be a whole number from 1 to 16 (e.g. mtp3)"
            )),
        };
        match s {
            "off" => Ok(SpecChoice::Off),
            _ if s.starts_with("mtp") => Ok(SpecChoice::MultiStep(k(&s[3..])?)),
            _ if s.starts_with("dflash") => Ok(SpecChoice::DFlash(k(&s[6..])?)),
            _ => Err(format!(
                "unknown spec setting {s:?} (off, mtpK or dflashK, e.g. mtp3)"
            )),
        }
    }

    pub fn name(self) -> String {
        match self {
            SpecChoice::Off => "off".into(),
            SpecChoice::MultiStep(k) => format!("mtp{k}"),
            SpecChoice::DFlash(k) => format!("dflash{k}"),
        }
    }

    fn k(self) -> usize {
        match self {
            SpecChoice::Off => 0,
            SpecChoice::MultiStep(k) | SpecChoice::DFlash(k) => k,
        }
    }
}

/// The axes of a sweep; the grid is their product, minus the coordinates a setting
/// does not have (a drafter batch mode only under multi-step drafting).
#[derive(Clone, Debug, PartialEq)]
pub struct SweepAxes {
    pub batches: Vec<usize>,
    pub specs: Vec<SpecChoice>,
    pub profiles: Vec<BackendProfile>,
    pub drafter_batches: Vec<DrafterBatch>,
    pub graphs: Vec<bool>,
    /// Each a per-position list (`0.9/0.8/0.6`) or one rate for every position.
    pub acceptance_rates: Vec<AcceptanceRates>,
}

/// One point of the grid.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepPoint {
    pub batch: usize,
    pub spec: SpecChoice,
    pub profile: BackendProfile,
    /// `None` where the setting drafts no multi-step batch.
    pub drafter_batch: Option<DrafterBatch>,
    pub graphs: bool,
    /// `None` without speculation (nothing is accepted or rejected).
    pub acceptance_rate: Option<AcceptanceRates>,
}

fn batch_name(b: DrafterBatch) -> &'static str {
    match b {
        DrafterBatch::Padded => "padded",
        DrafterBatch::Compacted => "compacted",
    }
}

impl SweepAxes {
    /// Every point, in the grid's fixed order (batch outermost, then spec, profile,
    /// drafter batch, graphs, acceptance rate), each once (a value given twice on an
    /// axis is one coordinate).
    pub fn points(&self) -> Vec<SweepPoint> {
        let mut out = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for &batch in &self.batches {
            for &spec in &self.specs {
                let modes: Vec<Option<DrafterBatch>> = match spec {
                    SpecChoice::MultiStep(_) => {
                        self.drafter_batches.iter().map(|&b| Some(b)).collect()
                    }
                    _ => vec![None],
                };
                let rates: Vec<Option<AcceptanceRates>> = match spec {
                    SpecChoice::Off => vec![None],
                    _ => self.acceptance_rates.iter().cloned().map(Some).collect(),
                };
                for &profile in &self.profiles {
                    for &drafter_batch in &modes {
                        for &graphs in &self.graphs {
                            for acceptance_rate in &rates {
                                let p = SweepPoint {
                                    batch,
                                    spec,
                                    profile,
                                    drafter_batch,
                                    graphs,
                                    acceptance_rate: acceptance_rate.clone(),
                                };
                                if seen.insert(p.key()) {
                                    out.push(p);
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// Which of `n` shards takes point `index`: shard `i` takes every n-th point from i.
pub fn in_shard(index: usize, (i, n): (usize, usize)) -> bool {
    index % n == i
}

/// `i/n` with `i < n`, as `--shard` takes it.
pub fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--shard {s:?}: expected i/n with 0 <= i < n, e.g. 0/4");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let (i, n) = (i.parse::<usize>(), n.parse::<usize>());
    match (i, n) {
        (Ok(i), Ok(n)) if i < n => Ok((i, n)),
        _ => Err(bad()),
    }
}

/// The CSV's key columns, then the measured ones.
pub const KEY_COLUMNS: [&str; 6] = [
    "batch",
    "spec",
    "profile",
    "drafter_batch",
    "graphs",
    "acceptance_rate",
];
pub const VALUE_COLUMNS: [&str; 23] = [
    "steps",
    "generated_tokens",
    "drafts",
    "mean_acceptance_length",
    "analytic_acceptance_length",
    "acceptance_per_pos",
    "checks_passed",
    "timed_step_wall_ms",
    "tokens_per_s",
    "decode_step_median_ms",
    "decode_step_kernel_share",
    "device",
    "simulated_step_ms",
    "simulated_tokens_per_s",
    "simulated_attention_share",
    "simulated_gemm_share",
    "simulated_comm_share",
    "simulated_overhead_share",
    "measured_attention_share",
    "measured_gemm_share",
    "measured_graph_share",
    "measured_host_share",
    "simulated_decode_tokens_per_s",
];

/// The CSV header line.
pub fn csv_header() -> String {
    KEY_COLUMNS
        .iter()
        .chain(VALUE_COLUMNS.iter())
        .copied()
        .collect::<Vec<_>>()
        .join(",")
}

impl SweepPoint {
    /// The key columns, comma-joined: what identifies the point in a CSV.
    pub fn key(&self) -> String {
        format!(
            "{},{},{},{},{},{}",
            self.batch,
            self.spec.name(),
            self.profile.name(),
            self.drafter_batch.map_or("-", batch_name),
            if self.graphs { "on" } else { "off" },
            self.acceptance_rate
                .as_ref()
                .map_or("-".to_string(), |r| r.to_string()),
        )
    }

    /// `base` with this point's coordinates: `batch` requests arriving together, the
    /// speculation setting, the profile, the drafter batch, graphs and the acceptance
    /// rate. The rest (model, prompt and output lengths, cache) stays `base`'s.
    pub fn scenario(&self, base: &Scenario) -> Scenario {
        let mut s = base.clone();
        s.name = format!("sweep {}", self.key());
        s.workload.num_requests = self.batch;
        s.workload.arrival_steps = 1;
        s.workload.grammar_fraction = 0.0;
        s.cfg.scheduler.max_num_seqs = s.cfg.scheduler.max_num_seqs.max(self.batch);
        let temperature = s.cfg.spec.temperature;
        s.cfg.spec = match self.spec {
            SpecChoice::Off => SpecConfig::off(),
            SpecChoice::MultiStep(k) => {
                SpecConfig::multi_step(k, self.drafter_batch.unwrap_or(DrafterBatch::Padded))
            }
            SpecChoice::DFlash(k) => SpecConfig::dflash(k),
        };
        s.cfg.spec.temperature = temperature;
        s.cfg.backends = vec![self.profile];
        s.cfg.cuda_graphs = self.graphs;
        s.acceptance_rate = self
            .acceptance_rate
            .clone()
            .unwrap_or(AcceptanceRates::uniform(0.0));
        // Padded vs compacted is a sweep axis here, not a second run to compare.
        s.check_drafter_batches = false;
        s
    }

    /// 1 + r1 + r1 r2 + ... + r1 ... rK: the mean acceptance length if the K positions
    /// are accepted with the controller's per-position rates, in order (a drafter's own
    /// proposal can also match where the controller does not force one, so a measured
    /// length sits at or a little above this).
    pub fn analytic_acceptance_length(&self) -> Option<f64> {
        let r = self.acceptance_rate.as_ref()?;
        Some(r.expected_acceptance_length(self.spec.k()))
    }

    /// The CSV row of a point whose run failed before it finished (an engine failure):
    /// its checks did not pass, and it measured nothing.
    pub fn failed_row(&self, device: &str) -> String {
        let device = csv_field(device);
        let fields: Vec<&str> = VALUE_COLUMNS
            .iter()
            .map(|&c| match c {
                "checks_passed" => "false",
                "device" => &device,
                _ => "",
            })
            .collect();
        format!("{},{}", self.key(), fields.join(","))
    }

    /// The CSV row of this point's run, with its simulated time where a cost model
    /// priced it (`sim sweep --cost-model`).
    pub fn csv_row(&self, s: &RunSummary, simulated: Option<&SimulatedTime>) -> String {
        let sd = &s.spec_decoding;
        let times = &s.step_times;
        let wall_us: f64 = times.iter().map(|k| k.total_wall_us).sum();
        let decode = times.iter().find(|k| k.kind.starts_with("decode-only"));
        let opt =
            |v: Option<f64>, digits: usize| v.map_or(String::new(), |v| format!("{v:.digits$}"));
        let share = |part: fn(&SimulatedTime) -> f64| {
            opt(
                simulated
                    .filter(|t| t.total_us > 0.0)
                    .map(|t| part(t) / t.total_us),
                3,
            )
        };
        let mut row = self.key();
        let _ = write!(
            row,
            ",{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            s.stats.steps,
            s.stats.generated_tokens,
            sd.num_drafts,
            opt((sd.num_drafts > 0).then_some(sd.mean_acceptance_length), 4),
            opt(self.analytic_acceptance_length(), 4),
            per_pos(&sd.per_position_acceptance_rate),
            s.passed() && !s.hit_step_limit && !s.interrupted,
            opt((wall_us > 0.0).then_some(wall_us / 1e3), 3),
            opt(
                (wall_us > 0.0).then(|| s.stats.generated_tokens as f64 / (wall_us / 1e6)),
                1
            ),
            opt(decode.map(|k| k.median_wall_us / 1e3), 3),
            opt(
                decode.map(|k| k.attention_share + k.gemm_share + k.graph_share),
                3
            ),
            csv_field(&s.device),
            opt(simulated.map(|t| t.total_us / 1e3), 3),
            opt(
                simulated.map(|t| t.tokens_per_s(s.stats.generated_tokens)),
                1
            ),
            share(|t| t.attention_us),
            share(|t| t.gemm_us),
            share(|t| t.comm_us),
            share(|t| t.host_us),
        );
        for share in measured_shares(times) {
            let _ = write!(row, ",{}", opt(share, 3));
        }
        let decode = simulated.filter(|t| t.decode_us > 0.0);
        let _ = write!(row, ",{}", opt(decode.map(|t| t.decode_tokens_per_s()), 1));
        row
    }
}

/// The measured shares of the timed steps' wall time (all kinds, weighted by wall time):
/// eager attention, eager GEMMs, graph replays (their attention and GEMMs inside), and
/// the host (what no device work covered). None where the backend times nothing.
fn measured_shares(kinds: &[StepKindTime]) -> [Option<f64>; 4] {
    let wall: f64 = kinds.iter().map(|k| k.total_wall_us).sum();
    let share = |part: fn(&StepKindTime) -> f64| {
        (wall > 0.0).then(|| kinds.iter().map(|k| part(k) * k.total_wall_us).sum::<f64>() / wall)
    };
    [
        share(|k| k.attention_share),
        share(|k| k.gemm_share),
        share(|k| k.graph_share),
        share(|k| k.host_share),
    ]
}

/// vLLM's per-position acceptance rates (`num_accepted_tokens_per_pos[i] / num_drafts`)
/// as one field, `/`-separated.
fn per_pos(rates: &[f64]) -> String {
    let r: Vec<String> = rates.iter().map(|r| format!("{r:.3}")).collect();
    r.join("/")
}

/// `v` as one CSV field: quoted when it holds a comma or a quote.
fn csv_field(v: &str) -> String {
    match v.contains([',', '"', '\n']) {
        true => format!("\"{}\"", v.replace('"', "\"\"").replace('\n', " ")),
        false => v.to_string(),
    }
}

/// The key of each data row of a sweep CSV (its first six fields), checking the header:
/// what a resumed sweep skips.
pub fn done_keys(csv: &str) -> Result<Vec<String>, String> {
    let mut lines = csv.lines();
    match lines.next() {
        None => return Ok(Vec::new()),
        Some(h) if h == csv_header() => {}
        Some(h) => {
            return Err(format!(
                "its header is not this sweep's: {h:?} (expected {:?})",
                csv_header()
            ))
        }
    }
    // The device, last, may hold commas (quoted): a whole row has at least every column.
    let columns = KEY_COLUMNS.len() + VALUE_COLUMNS.len();
    lines
        .filter(|l| !l.is_empty())
        .enumerate()
        .map(|(i, l)| {
            let fields: Vec<&str> = l.split(',').collect();
            match fields.len() >= columns {
                true => Ok(fields[..KEY_COLUMNS.len()].join(",")),
                false => Err(format!(
                    "row {} has {} of the {columns} columns (a row cut short?)",
                    i + 2,
                    fields.len()
                )),
            }
        })
        .collect()
}

/// Merges sweep CSVs (shards of one grid, or a sweep and its resumption) into one, rows
/// ordered by key. A point in two inputs must have the same row in both (a resumed
/// sweep never runs a point twice, so two rows for one point come from two runs and
/// their timings would differ): otherwise an error naming the point.
pub fn merge(inputs: &[(String, String)]) -> Result<String, String> {
    let mut rows: BTreeMap<String, (String, String)> = BTreeMap::new();
    for (name, text) in inputs {
        let keys = done_keys(text).map_err(|e| format!("{name}: {e}"))?;
        for (key, line) in keys
            .into_iter()
            .zip(text.lines().skip(1).filter(|l| !l.is_empty()))
        {
            match rows.get(&key) {
                Some((other, row)) if row != line => {
                    return Err(format!(
                        "point {key} has different rows in {other} and {name}"
                    ))
                }
                Some(_) => {}
                None => {
                    rows.insert(key, (name.clone(), line.to_string()));
                }
            }
        }
    }
    let mut out = csv_header();
    out.push('\n');
    for (_, (_, row)) in rows {
        out.push_str(&row);
        out.push('\n');
    }
    Ok(out)
}

/// One group's tuning: per measured batch, the best K by tokens/s (0: no speculation)
/// and its speedup over no speculation at that batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuned {
    /// The coordinates the group shares: spec family (`mtp` or `dflash`), profile,
    /// drafter batch, graphs, acceptance rate.
    pub group: String,
    /// `(batch, best K, its tokens/s, speedup over K = 0)`, by batch.
    pub best: Vec<(usize, usize, f64, f64)>,
    /// Which throughput was compared: `measured` (`tokens_per_s`) or `simulated`
    /// (`simulated_tokens_per_s`).
    pub source: &'static str,
}

/// A timed row of a sweep CSV, as the tuner reads it.
struct TimedRow<'a> {
    batch: usize,
    spec: SpecChoice,
    rest: [&'a str; 4],
    tokens_per_s: f64,
}

fn timed_rows<'a>(csv: &'a str, column: &str) -> Result<Vec<TimedRow<'a>>, String> {
    done_keys(csv)?;
    let col = |name: &str| {
        KEY_COLUMNS.len()
            + VALUE_COLUMNS
                .iter()
                .position(|c| *c == name)
                .expect("a column")
    };
    let (tps, passed) = (col(column), col("checks_passed"));
    let mut out = Vec::new();
    for (i, line) in csv.lines().skip(1).filter(|l| !l.is_empty()).enumerate() {
        let f: Vec<&str> = line.split(',').collect();
        let bad = |what: &str| format!("row {}: {what}", i + 2);
        // A run that failed its checks measured nothing worth comparing.
        let Some(t) = f.get(tps).filter(|t| !t.is_empty() && f[passed] == "true") else {
            continue;
        };
        out.push(TimedRow {
            batch: f[0].parse().map_err(|_| bad("batch is not a number"))?,
            spec: SpecChoice::parse(f[1]).map_err(|e| bad(&e))?,
            rest: [f[2], f[3], f[4], f[5]],
            tokens_per_s: t
                .parse()
                .map_err(|_| bad(&format!("{column} is not a number")))?,
        });
    }
    Ok(out)
}

/// The best K per batch size from a sweep CSV's timed rows (`--backend gpu` fills them):
/// for each speculating group (family, profile, drafter batch, graphs, acceptance rate),
/// at each batch it measured, the K with the most tokens/s, the profile's and graphs'
/// no-speculation row competing as K = 0.
pub fn tune(csv: &str) -> Result<Vec<Tuned>, String> {
    let measured = timed_rows(csv, "tokens_per_s")?;
    let (rows, source) = match measured.is_empty() {
        false => (measured, "measured"),
        true => (timed_rows(csv, "simulated_tokens_per_s")?, "simulated"),
    };
    if rows.is_empty() {
        return Err(
            "no row has tokens_per_s or simulated_tokens_per_s: only a backend that times \
             itself (--backend gpu) measures throughput, and only --cost-model simulates it"
                .into(),
        );
    }
    let mut groups: BTreeMap<String, BTreeMap<usize, (usize, f64)>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.spec != SpecChoice::Off) {
        let family = match r.spec {
            SpecChoice::DFlash(_) => "dflash",
            _ => "mtp",
        };
        let group = format!(
            "{family},{},{},{},{}",
            r.rest[0], r.rest[1], r.rest[2], r.rest[3]
        );
        let best = groups
            .entry(group)
            .or_default()
            .entry(r.batch)
            .or_insert((0, f64::MIN));
        if r.tokens_per_s > best.1 {
            *best = (r.spec.k(), r.tokens_per_s);
        }
    }
    let off = |profile: &str, graphs: &str, batch: usize| {
        rows.iter()
            .find(|r| {
                r.spec == SpecChoice::Off
                    && r.batch == batch
                    && r.rest[0] == profile
                    && r.rest[2] == graphs
            })
            .map(|r| r.tokens_per_s)
    };
    let mut out = Vec::new();
    for (group, by_batch) in groups {
        let g: Vec<&str> = group.split(',').collect();
        let mut best = Vec::new();
        for (batch, (k, tps)) in by_batch {
            let base = off(g[1], g[3], batch).ok_or_else(|| {
                format!("group {group} at batch {batch}: no timed `off` row to compare with")
            })?;
            let (k, tps) = if base >= tps { (0, base) } else { (k, tps) };
            best.push((batch, k, tps, tps / base));
        }
        out.push(Tuned {
            group,
            best,
            source,
        });
    }
    Ok(out)
}

/// vLLM's `num_speculative_tokens_per_batch_size` for one group's best K per batch: 3-item
/// `[bs_lo, bs_hi, K]` ranges, sorted, not overlapping, the first from 1, as
/// `validate_and_normalize_dynamic_sd_schedule` (`vllm/v1/spec_decode/dynamic/utils.py`,
/// `14b450ca`) requires. Each measured batch's K holds from it up to the next measured
/// batch (the first from 1); past the last, vLLM's lookup keeps the last range's K.
/// Neighbouring ranges with one K are one range.
pub fn schedule(best: &[(usize, usize, f64, f64)]) -> Vec<[usize; 3]> {
    let mut out: Vec<[usize; 3]> = Vec::new();
    for (i, &(batch, k, _, _)) in best.iter().enumerate() {
        let lo = if i == 0 { 1 } else { batch };
        let hi = best.get(i + 1).map_or(batch, |n| n.0 - 1);
        match out.last_mut() {
            Some(last) if last[2] == k => last[1] = hi,
            _ => out.push([lo, hi, k]),
        }
    }
    out
}

/// The K vLLM's dense lookup (`build_dynamic_sd_schedule_lookup`, same file) gives batch
/// `bs` under a 3-item schedule: the range holding it; in a gap, the previous range's
/// K; past the last, the last's.
pub fn lookup(schedule: &[[usize; 3]], bs: usize) -> Option<usize> {
    let mut k = None;
    for &[lo, hi, kk] in schedule {
        if bs < lo {
            break;
        }
        k = Some(kk);
        if bs <= hi {
            break;
        }
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes() -> SweepAxes {
        SweepAxes {
            batches: vec![1, 8],
            specs: vec![
                SpecChoice::Off,
                SpecChoice::MultiStep(2),
                SpecChoice::DFlash(4),
            ],
            profiles: vec![BackendProfile::FlashMla, BackendProfile::CutlassMla],
            drafter_batches: vec![DrafterBatch::Padded, DrafterBatch::Compacted],
            graphs: vec![true, false],
            acceptance_rates: vec![AcceptanceRates::uniform(0.5), AcceptanceRates::uniform(0.9)],
        }
    }

    #[test]
    fn the_grid_has_each_coordinate_a_setting_has_once() {
        let points = axes().points();
        // Per batch and profile and graphs: off 1, mtp2 2 modes x 2 rates, dflash4 2 rates.
        assert_eq!(points.len(), 2 * 2 * 2 * (1 + 4 + 2));
        let keys: std::collections::BTreeSet<String> = points.iter().map(|p| p.key()).collect();
        assert_eq!(keys.len(), points.len());
        assert_eq!(points[0].key(), "1,off,flashmla,-,on,-");
        assert!(keys.contains("8,mtp2,cutlass-mla,compacted,off,0.9"));
        assert!(keys.contains("1,dflash4,flashmla,-,on,0.5"));
    }

    #[test]
    fn shards_partition_the_grid() {
        let n = axes().points().len();
        for shards in 1..5 {
            for p in 0..n {
                let takers = (0..shards).filter(|&i| in_shard(p, (i, shards))).count();
                assert_eq!(takers, 1);
            }
        }
        assert_eq!(parse_shard("1/4"), Ok((1, 4)));
        for bad in ["4/4", "1", "a/2", "1/0", "-1/2"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn spec_settings_parse_and_name_each_other() {
        for s in ["off", "mtp1", "mtp4", "dflash8"] {
            assert_eq!(SpecChoice::parse(s).unwrap().name(), s);
        }
        for bad in ["mtp0", "mtp", "dflash17", "eagle3", ""] {
            assert!(SpecChoice::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_analytic_length_sums_the_powers_of_the_rate() {
        let p = SweepPoint {
            batch: 1,
            spec: SpecChoice::MultiStep(3),
            profile: BackendProfile::FlashMla,
            drafter_batch: Some(DrafterBatch::Padded),
            graphs: true,
            acceptance_rate: Some(AcceptanceRates::uniform(0.5)),
        };
        assert_eq!(p.analytic_acceptance_length(), Some(1.875));
        let off = SweepPoint {
            spec: SpecChoice::Off,
            acceptance_rate: None,
            ..p
        };
        assert_eq!(off.analytic_acceptance_length(), None);
    }

    fn timed(rows: &[(&str, f64)]) -> String {
        let mut csv = csv_header();
        for (key, tps) in rows {
            csv.push_str(&format!(
                "\n{key},10,20,5,2.0,2.0,,true,1.0,{tps},1.0,0.8,gpu,,,,,,,,,,,"
            ));
        }
        csv
    }

    #[test]
    fn the_tuner_picks_the_fastest_k_per_batch_and_no_speculation_where_it_wins() {
        let csv = timed(&[
            ("1,off,flashmla,-,on,-", 100.0),
            ("1,mtp1,flashmla,padded,on,0.7", 150.0),
            ("1,mtp3,flashmla,padded,on,0.7", 180.0),
            ("8,off,flashmla,-,on,-", 700.0),
            ("8,mtp1,flashmla,padded,on,0.7", 800.0),
            ("8,mtp3,flashmla,padded,on,0.7", 760.0),
            ("64,off,flashmla,-,on,-", 4000.0),
            ("64,mtp1,flashmla,padded,on,0.7", 3900.0),
            ("64,mtp3,flashmla,padded,on,0.7", 3000.0),
        ]);
        let t = tune(&csv).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].group, "mtp,flashmla,padded,on,0.7");
        let ks: Vec<(usize, usize)> = t[0].best.iter().map(|b| (b.0, b.1)).collect();
        assert_eq!(ks, [(1, 3), (8, 1), (64, 0)]);
        assert!((t[0].best[0].3 - 1.8).abs() < 1e-12);
        assert_eq!(t[0].best[2].3, 1.0);
        let sched = schedule(&t[0].best);
        assert_eq!(sched, [[1, 7, 3], [8, 63, 1], [64, 64, 0]]);
        // vLLM's lookup of the schedule gives each measured batch its best K, and
        // batches past the last measured one the last K.
        for (bs, k) in [(1, 3), (7, 3), (8, 1), (63, 1), (64, 0), (500, 0)] {
            assert_eq!(lookup(&sched, bs), Some(k), "batch {bs}");
        }
        // One K over neighbouring batches is one range.
        assert_eq!(
            schedule(&[(1, 2, 0.0, 0.0), (4, 2, 0.0, 0.0), (16, 0, 0.0, 0.0)]),
            [[1, 15, 2], [16, 16, 0]]
        );
    }

    #[test]
    fn a_failed_point_has_a_whole_row_that_says_so() {
        let p = axes().points()[3].clone();
        let row = p.failed_row("cpu, f32");
        let csv = format!("{}\n{row}\n", csv_header());
        assert_eq!(done_keys(&csv).unwrap(), vec![p.key()]);
        let f: Vec<&str> = row.split(',').collect();
        assert_eq!(f[KEY_COLUMNS.len() + 6], "false");
        assert!(row.ends_with(",\"cpu, f32\",,,,,,,,,,,"), "{row}");
        let csv_fields = row.matches(',').count() + 1 - 1; // the device holds one comma
        assert_eq!(csv_fields, KEY_COLUMNS.len() + VALUE_COLUMNS.len());
    }

    #[test]
    fn repeated_axis_values_are_one_coordinate() {
        let mut a = axes();
        a.batches = vec![8, 8];
        a.acceptance_rates = vec![AcceptanceRates::uniform(0.5); 2];
        assert_eq!(a.points().len(), 2 * 2 * (1 + 2 + 1));
    }

    #[test]
    fn the_tuner_needs_timed_rows_and_a_baseline() {
        let cpu = format!(
            "{}\n1,off,flashmla,-,on,-,6,6,0,,,,true,,,,,cpu,,,,,,,,,,,\n",
            csv_header()
        );
        assert!(tune(&cpu)
            .unwrap_err()
            .contains("no row has tokens_per_s or simulated_tokens_per_s"));
        let no_off = timed(&[("4,mtp2,flashmla,padded,on,0.7", 10.0)]);
        assert!(tune(&no_off).unwrap_err().contains("no timed `off` row"));
        // A row that failed its checks does not compete, its baseline neither.
        let failed = timed(&[("1,mtp1,flashmla,padded,on,0.7", 99.0)]).replace(",true,", ",false,");
        assert!(tune(&failed)
            .unwrap_err()
            .contains("no row has tokens_per_s"));
    }

    /// Without measured rows the tuner compares the cost model's simulated throughput,
    /// and says so; measured rows win where both exist.
    #[test]
    fn the_tuner_falls_back_to_simulated_throughput() {
        let sim = |key: &str, tps: f64| {
            format!("\n{key},10,20,5,2.0,2.0,,true,,,,,cpu,3.0,{tps},0.1,0.5,0,0.4,,,,,")
        };
        let csv = format!(
            "{}{}{}",
            csv_header(),
            sim("1,off,flashmla,-,on,-", 100.0),
            sim("1,mtp1,flashmla,padded,on,0.7", 130.0)
        );
        let t = tune(&csv).unwrap();
        assert_eq!((t[0].source, t[0].best[0].1), ("simulated", 1));
        assert!((t[0].best[0].3 - 1.3).abs() < 1e-12);
        let measured = timed(&[
            ("1,off,flashmla,-,on,-", 100.0),
            ("1,mtp1,flashmla,padded,on,0.7", 90.0),
        ]);
        assert_eq!(tune(&measured).unwrap()[0].source, "measured");
    }

    #[test]
    fn vllm_lookup_semantics_fill_gaps_with_the_previous_k() {
        // `build_dynamic_sd_schedule_lookup`: a gap takes the previous range's K.
        let s = [[1, 4, 3], [9, 16, 1]];
        assert_eq!(lookup(&s, 6), Some(3));
        assert_eq!(lookup(&s, 12), Some(1));
        assert_eq!(lookup(&s, 100), Some(1));
    }

    #[test]
    fn resumed_and_merged_csvs_are_read_by_key() {
        let h = csv_header();
        let values = ",1,2,3,,,,true,,,,,cpu,,,,,,,,,,,";
        let a = format!("{h}\n1,off,flashmla,-,on,-{values}\n");
        let b = format!("{h}\n8,off,flashmla,-,on,-{values}\n1,off,flashmla,-,on,-{values}\n");
        assert_eq!(done_keys(&a).unwrap(), vec!["1,off,flashmla,-,on,-"]);
        let merged = merge(&[("a".into(), a.clone()), ("b".into(), b)]).unwrap();
        assert_eq!(merged.lines().count(), 3);
        assert!(merged.lines().nth(1).unwrap().starts_with("1,off"));
        let conflict = format!("{h}\n1,off,flashmla,-,on,-,9,2,3,,,,true,,,,,cpu,,,,,,,,,,,\n");
        let torn = format!("{h}\n1,off,flashmla,-,on,-,9,2\n");
        assert!(done_keys(&torn)
            .unwrap_err()
            .contains("row 2 has 8 of the 29 columns"));
        let err = merge(&[("a".into(), a), ("c".into(), conflict)]).unwrap_err();
        assert!(err.contains("point 1,off,flashmla,-,on,- has different rows in a and c"));
        assert!(done_keys("batch,spec\n").is_err());
    }
}
