//! specmla-core: the scheduler/metadata core shared by every backend.
//!
//! Pure logic only: no I/O, no `unsafe`, no CUDA. A backend receives a fully built
//! [`plan::StepPlan`] and returns outputs; it never re-derives a scheduling decision.
#![forbid(unsafe_code)]

pub mod audit;
pub mod backend;
pub mod balanced;
pub mod batch;
pub mod block_pool;
pub mod chunked_context;
pub mod config;
pub mod cost;
pub mod cudagraph;
pub mod drafter;
pub mod engine;
pub mod error;
pub mod fault;
pub mod fired;
pub mod grammar;
pub mod graph_buffers;
pub mod invariant_launch;
pub mod invariants;
pub mod memory;
pub mod metadata;
pub mod plan;
pub mod reorder;
pub mod request;
pub mod rng;
pub mod scheduler;
pub mod split;
pub mod verify;
