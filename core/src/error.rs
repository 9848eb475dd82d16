//! Error types of the core: configuration and user-supplied batch descriptions.

use thiserror::Error;

/// A configuration that cannot run, with a one-line reason.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Invalid(String),
}
