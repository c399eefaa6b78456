//! One error type for the whole crate, with a stable [`ErrorKind`] per variant.
//!
//! Bindings map errors by kind (C result codes, Python exception classes, JS `err.code`)
//! through [`ErrorKind::ALL`], never by parsing messages.

use std::fmt;

/// The result type of every fallible shardlimit call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Stable error kinds. The numeric codes and names are a public contract: a retired
/// number is never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u32)]
pub enum ErrorKind {
    /// The configuration is invalid (a field is missing, malformed or out of range).
    Config = 1,
    /// An argument of a call is invalid (empty key, zero cost, unknown policy, ...).
    InvalidArgument = 2,
    /// A Redis shard could not be reached or the connection broke.
    Connection = 3,
    /// A Redis shard did not answer within the deadline.
    Timeout = 4,
    /// Redis answered with an error while running a script or command.
    Script = 5,
    // 6 was `Routing`, retired unused (every key routes to a shard): never reuse it.
    /// A named policy does not exist in the configuration.
    UnknownPolicy = 7,
    /// Reading a file (configuration) failed.
    Io = 8,
    /// A bug in shardlimit: an invariant was broken. Please report it.
    Internal = 9,
    /// A shard's circuit breaker is open after repeated failures: it is skipped until a
    /// background probe sees it answer again.
    Unavailable = 10,
    /// This process has more checks waiting for a shard's connection than its queue holds
    /// (`max_queue`): the check is refused, neither admitted nor sent to `on_error`.
    Overloaded = 11,
}

impl ErrorKind {
    /// Codes once used and retired: never reused. `(code, name)`.
    pub const RETIRED: &'static [(u32, &'static str)] = &[(6, "routing")];

    /// Every kind, in code order. Bindings generate or test their tables from this.
    pub const ALL: &'static [ErrorKind] = &[
        ErrorKind::Config,
        ErrorKind::InvalidArgument,
        ErrorKind::Connection,
        ErrorKind::Timeout,
        ErrorKind::Script,
        ErrorKind::UnknownPolicy,
        ErrorKind::Io,
        ErrorKind::Internal,
        ErrorKind::Unavailable,
        ErrorKind::Overloaded,
    ];

    /// The stable numeric code of this kind.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The stable snake_case name of this kind (`"config"`, `"timeout"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Config => "config",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Connection => "connection",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Script => "script",
            ErrorKind::UnknownPolicy => "unknown_policy",
            ErrorKind::Io => "io",
            ErrorKind::Internal => "internal",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Overloaded => "overloaded",
        }
    }

    /// One sentence a user reads in every binding's docs: what this kind means.
    pub fn description(self) -> &'static str {
        match self {
            ErrorKind::Config => "the configuration is invalid: a field is missing, malformed or out of range",
            ErrorKind::InvalidArgument => "an argument of a call is invalid (empty key, zero cost, ...)",
            ErrorKind::Connection => "a Redis shard could not be reached or the connection broke",
            ErrorKind::Timeout => "a Redis shard did not answer within the deadline",
            ErrorKind::Script => "Redis answered with an error, or with a reply shardlimit does not trust",
            ErrorKind::UnknownPolicy => "a named policy does not exist in the configuration",
            ErrorKind::Io => "reading a file (a configuration) failed",
            ErrorKind::Internal => "a bug in shardlimit: an invariant was broken (please report it)",
            ErrorKind::Unavailable => "a shard's circuit is open after repeated failures; it is skipped until a probe sees it answer",
            ErrorKind::Overloaded => "more checks wait for a shard's connection in this process than its queue holds (max_queue); the check was neither admitted nor sent to on_error",
        }
    }

    /// The kind this one is a special case of, if any: every binding's error hierarchy
    /// follows it (an unknown policy is an invalid argument everywhere).
    pub fn parent(self) -> Option<ErrorKind> {
        match self {
            ErrorKind::UnknownPolicy => Some(ErrorKind::InvalidArgument),
            _ => None,
        }
    }

    /// True for kinds that mean "the backend failed" (as opposed to a caller mistake):
    /// these are the ones a policy's `on_error` mode applies to.
    pub fn is_backend(self) -> bool {
        matches!(
            self,
            ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::Script | ErrorKind::Unavailable
        )
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A shardlimit error. Match on [`Error::kind`] rather than on variants: new variants may
/// be added.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `field` is the dotted path of the offending field, e.g. `policies.login.window`.
    #[error("{field}: {message}")]
    Config { field: String, message: String },
    /// `what` names the argument, e.g. `key` or `cost`.
    #[error("invalid argument `{what}`: {message}")]
    InvalidArgument { what: String, message: String },
    #[error("unknown policy `{0}`")]
    UnknownPolicy(String),
    #[error("shard `{shard}`: connection failed: {message}")]
    Connection { shard: String, message: String },
    #[error("shard `{shard}`: no answer within {timeout_ms} ms")]
    Timeout { shard: String, timeout_ms: u64 },
    #[error("shard `{shard}`: redis error: {message}")]
    Script { shard: String, message: String },
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("internal error (a bug in shardlimit): {0}")]
    Internal(String),
    #[error("shard `{shard}` is unavailable: its circuit is open after repeated failures")]
    Unavailable { shard: String },
    #[error("shard `{shard}`: overloaded: {max_queue} checks are waiting for its connection already (max_queue)")]
    Overloaded { shard: String, max_queue: usize },
}

impl Error {
    /// The stable kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Config { .. } => ErrorKind::Config,
            Error::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Error::UnknownPolicy(_) => ErrorKind::UnknownPolicy,
            Error::Connection { .. } => ErrorKind::Connection,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Script { .. } => ErrorKind::Script,
            Error::Io { .. } => ErrorKind::Io,
            Error::Internal(_) => ErrorKind::Internal,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Overloaded { .. } => ErrorKind::Overloaded,
        }
    }
    /// The numeric code of [`Error::kind`].
    pub fn code(&self) -> u32 {
        self.kind().code()
    }
    pub fn is_config(&self) -> bool {
        self.kind() == ErrorKind::Config
    }
    pub fn is_timeout(&self) -> bool {
        self.kind() == ErrorKind::Timeout
    }
    pub fn is_connection(&self) -> bool {
        self.kind() == ErrorKind::Connection
    }
    pub fn is_invalid_argument(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::InvalidArgument | ErrorKind::UnknownPolicy
        )
    }
    /// True when the backend (Redis) failed rather than the caller.
    pub fn is_backend(&self) -> bool {
        self.kind().is_backend()
    }

    pub(crate) fn config(field: impl Into<String>, message: impl Into<String>) -> Error {
        Error::Config {
            field: field.into(),
            message: message.into(),
        }
    }
    pub(crate) fn invalid(what: impl Into<String>, message: impl Into<String>) -> Error {
        Error::InvalidArgument {
            what: what.into(),
            message: message.into(),
        }
    }
}
