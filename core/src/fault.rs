//! Fault switches: the known-bug catalog of RULES §9. Each switch re-introduces a
//! bug that shipped in a real engine, in the place where it lived (core or a backend),
//! and is off by default. The harness must catch every one.

use serde::{Deserialize, Serialize};

/// One known bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Fault {
    /// LSE [tokens, heads] read as [heads, tokens] in the context merge (CPU backend).
    F1,
    /// Graph captured with max_query_len 1, replayed with q = 1 + K (core: the shapes
    /// `cudagraph::graph_shapes` hands the backends to capture).
    F2,
    /// Capture sizes not rounded to multiples of 1 + K (core: cudagraph).
    F3,
    /// Padded drafter keeps the rejected tokens' seq_lens in passes 2..K (core: drafter).
    F4,
    /// DFlash block index not clamped to the block-table width (core: drafter).
    F5,
    /// DFlash position >= max_model_len gets a live slot instead of PAD (core: drafter).
    F6,
    /// A prompt chunk of 1 + K tokens dispatched onto the verify graph by shape alone
    /// (core: cudagraph).
    F7,
    /// Decode split planner built over all rows of a mixed batch (core: plan).
    F8,
    /// Grammar masks read drafts from a pure-decode token layout (core: plan).
    F9,
    /// Non-uniform decode rows sent to a uniform kernel (core: plan, through the split it
    /// asks reorder for).
    F10,
    /// Graph padding rows keep earlier steps' request-state slots in `idx_mapping`, which
    /// draft sampling writes through (core: `graph_buffers`; the write itself is not
    /// modelled, the invariant names it).
    F11,
    /// The split-KV schedule not copied into the graph's persistent buffer: a replay reads
    /// the capture-time schedule (core: `graph_buffers`).
    F12,
    /// The padding rows' seq_lens not zeroed in the graph's persistent buffer: they keep
    /// an earlier step's lengths (core: `graph_buffers`).
    F13,
    /// A non-causal drafter raises the reorder threshold on a SingleOnly profile, so
    /// verify rows reach the single-token decode kernel unexpanded (core: the threshold).
    F14,
    /// An idle rank's dummy step maps its rows to request-state slots, so its drafter
    /// decode computes KV slots through their stale block tables (core:
    /// `graph_buffers::dummy_step`; planned and checked, not executed).
    F15,
    /// Data-parallel padding leaks into the draft decode passes' attention metadata: their
    /// `num_actual_tokens` is the padded count (core: drafter).
    F16,
}

impl Fault {
    pub const ALL: [Fault; 16] = [
        Fault::F1,
        Fault::F2,
        Fault::F3,
        Fault::F4,
        Fault::F5,
        Fault::F6,
        Fault::F7,
        Fault::F8,
        Fault::F9,
        Fault::F10,
        Fault::F11,
        Fault::F12,
        Fault::F13,
        Fault::F14,
        Fault::F15,
        Fault::F16,
    ];

    /// The catalog id, e.g. "F1".
    pub fn id(self) -> &'static str {
        match self {
            Fault::F1 => "F1",
            Fault::F2 => "F2",
            Fault::F3 => "F3",
            Fault::F4 => "F4",
            Fault::F5 => "F5",
            Fault::F6 => "F6",
            Fault::F7 => "F7",
            Fault::F8 => "F8",
            Fault::F9 => "F9",
            Fault::F10 => "F10",
            Fault::F11 => "F11",
            Fault::F12 => "F12",
            Fault::F13 => "F13",
            Fault::F14 => "F14",
            Fault::F15 => "F15",
            Fault::F16 => "F16",
        }
    }

    /// Parses a catalog id such as "F1" (case-insensitive).
    pub fn from_id(id: &str) -> Option<Fault> {
        Self::ALL
            .into_iter()
            .find(|f| f.id().eq_ignore_ascii_case(id))
    }

    /// The real bug it mirrors.
    pub fn mirrors(self) -> &'static str {
        match self {
            Fault::F1 => {
                "vLLM #26042 (fixed in #26063): transposed LSE in the chunked-prefill merge"
            }
            Fault::F2 => {
                "vLLM #21505: MLA graph captured for max_query_len 1, replayed with MTP q = 2"
            }
            Fault::F3 => "vLLM #28207: capture size not a multiple of 1 + K",
            Fault::F4 => "vLLM #26191 (fixed in #29845): padded drafter keeps rejected seq_lens",
            Fault::F5 => "vLLM DFlash PR review: block number not clamped to the table width",
            Fault::F6 => "vLLM DFlash PR review: position >= max_model_len not mapped to PAD",
            Fault::F7 => {
                "vLLM #49918: a 1 + K token prompt chunk replayed on the verify graph (shape-only \
                 uniform-decode test; fixed by requiring every row past its prompt)"
            }
            Fault::F8 => "TokenSpeed mixed batching part 3: FlashMLA planner over all rows",
            Fault::F9 => "TokenSpeed mixed batching part 3: grammar masks from a decode layout",
            Fault::F10 => "FlashInfer-MLA fallback: non-uniform decode rows on a uniform kernel",
            Fault::F12 => {
                "vLLM #33638 (fixed in #35175): FlashMLA's split schedule computed into fresh \
                 tensors, not the graph's buffers; replay used the capture-time schedule"
            }
            Fault::F13 => {
                "vllm-ascend #7290: padded seq_lens not zeroed in the persistent buffer; the \
                 padding entry keeps an earlier step's length"
            }
            Fault::F11 => {
                "vLLM #47066: FULL-graph padding rows keep stale idx_mapping entries; draft \
                 sampling writes draft logits through them"
            }
            Fault::F15 => {
                "vLLM #56734: an idle DP rank's dummy batch maps to live request-state slots; \
                 the drafter writes KV through their stale block tables"
            }
            Fault::F16 => {
                "vLLM #55458: DP sync's padded token count used as the draft decode's \
                 num_actual_tokens"
            }
            Fault::F14 => {
                "vLLM #51848 (fixed in #51065): a non-causal drafter raised the threshold on \
                 TritonMLA (SingleOnly); verify rows met its single-token kernel unexpanded"
            }
        }
    }
}

impl Fault {
    /// The smallest workload that makes the switch fire, as its property test shrank it
    /// (the frozen test that pins it names the same case).
    pub fn trigger(self) -> &'static str {
        match self {
            Fault::F1 => "1 request, 1-token prompt, K = 1: the first verify row (q 2, context 1) takes the prefill path with context",
            Fault::F2 => "1 request, K = 1, a verify row on a graph",
            Fault::F3 => "K = 1, graphs on (the unrounded capture size 1)",
            Fault::F4 => "a padded drafter, K = 2, a verify row with nothing accepted",
            Fault::F5 => "DFlash K = 1, a block crossing max_model_len",
            Fault::F6 => "DFlash K = 1, a block crossing max_model_len",
            Fault::F7 => "a fresh prompt of 1 + K tokens arriving while the others decode on a graph",
            Fault::F8 => "a mixed batch: a prefill row beside a decode-region row",
            Fault::F9 => "a constrained verify row after a prefill row in a mixed batch",
            Fault::F10 => "a non-uniform profile's decode rows with q = [1, 2] on a uniform kernel",
            Fault::F11 => "K = 1, a step of 4 rows on graphs, then 3 rows replayed on the 4-row graph",
            Fault::F12 => "K = 1, a graph replaying rows past one split of the capture's schedule",
            Fault::F13 => "as F11: a padding row after a step that had more rows",
            Fault::F14 => "TritonMLA with a non-causal (DFlash) drafter, K = 1: a verify row (scenario triton_dflash)",
            Fault::F15 => "data parallelism, K = 2: a request finishes, the rank idles a step, another arrives (scenario dp_idle)",
            Fault::F16 => "data parallelism, K = 2: 1 request against a peer rank of 4 tokens (scenario dp_idle)",
        }
    }
}

/// A set of fault switches (all off by default). In a config it reads and writes as a
/// list of catalog ids, `["F1", "F7"]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Faults(u32);

// One bit per catalog entry.
const _: () = assert!(Fault::ALL.len() <= u32::BITS as usize);

impl Serialize for Faults {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(Fault::id))
    }
}

impl<'de> Deserialize<'de> for Faults {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ids = Vec::<String>::deserialize(d)?;
        ids.iter()
            .map(|id| {
                Fault::from_id(id).ok_or_else(|| {
                    serde::de::Error::custom(format!("unknown fault {id:?} (F1..F16)"))
                })
            })
            .collect()
    }
}

impl Faults {
    /// No fault.
    pub fn none() -> Self {
        Self(0)
    }

    /// Whether `f` is on.
    pub fn has(self, f: Fault) -> bool {
        self.0 >> (f as u32) & 1 == 1
    }

    /// The set with `f` turned on.
    pub fn with(self, f: Fault) -> Self {
        Self(self.0 | 1 << (f as u32))
    }

    /// The switches that are on, in catalog order.
    pub fn iter(self) -> impl Iterator<Item = Fault> {
        Fault::ALL.into_iter().filter(move |&f| self.has(f))
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl FromIterator<Fault> for Faults {
    fn from_iter<I: IntoIterator<Item = Fault>>(iter: I) -> Self {
        iter.into_iter().fold(Faults::none(), Faults::with)
    }
}
