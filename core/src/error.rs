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
    #[error("shard `{shard}`: connection failed: {message}{}", tls_hint(message))]
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

    /// This error with user keys taken out of the text that came from outside (a Redis
    /// error reply, a connection failure): `key` wherever it appears (when at least 4
    /// bytes long: a shorter one would blank common letters), and every word holding a
    /// brace (the Redis keys shardlimit builds hold the key's hash tag in braces, and the
    /// key itself after it), each written `<key>`. User keys are API keys and e-mail
    /// addresses: they belong in no log line.
    pub fn without_keys(self, key: Option<&str>) -> Error {
        match self {
            Error::Script { shard, message } => Error::Script {
                shard,
                message: scrub_keys(&message, key),
            },
            Error::Connection { shard, message } => Error::Connection {
                shard,
                message: scrub_keys(&message, key),
            },
            e => e,
        }
    }

    /// A config error. Its field path and message are bounded ([`bounded`]): a config
    /// value (or policy name) of 50 MB must not make an error message of 100 MB.
    pub(crate) fn config(field: impl Into<String>, message: impl Into<String>) -> Error {
        Error::Config {
            field: bounded(field.into(), MAX_FIELD_BYTES),
            message: bounded(message.into(), MAX_MESSAGE_BYTES),
        }
    }
    /// An invalid-argument error, bounded as [`Error::config`] is.
    pub(crate) fn invalid(what: impl Into<String>, message: impl Into<String>) -> Error {
        Error::InvalidArgument {
            what: bounded(what.into(), MAX_FIELD_BYTES),
            message: bounded(message.into(), MAX_MESSAGE_BYTES),
        }
    }
    /// An unknown policy, its name bounded as [`Error::config`]'s field is.
    pub(crate) fn unknown_policy(name: &str) -> Error {
        Error::UnknownPolicy(bounded(name.to_string(), MAX_FIELD_BYTES))
    }
}

/// The longest field path (or argument name, policy name) an error carries, in bytes.
pub const MAX_FIELD_BYTES: usize = 256;
/// The longest message an error carries, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `s` if it has at most `max` bytes, else its start and its end (on character boundaries)
/// around `…[N bytes elided]…`: the value a message quotes is cut, and what the message
/// says after it (what was expected) is kept.
pub(crate) fn bounded(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let tail_len = max / 4;
    let head_len = max - tail_len - 32; // room for the marker
    let mut head = head_len;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - tail_len;
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}…[{} bytes elided]…{}",
        &s[..head],
        tail - head,
        &s[tail..]
    )
}

#[cfg(test)]
mod bounded_tests {
    use super::*;

    #[test]
    fn a_huge_config_value_makes_a_short_message() {
        let big = "x".repeat(50_000_000);
        let e = Error::config(
            format!("policies.{big}.window"),
            format!("expected a duration like \"1m\", got \"{big}\""),
        );
        let m = e.to_string();
        assert!(
            m.len() <= MAX_FIELD_BYTES + MAX_MESSAGE_BYTES + 8,
            "{}",
            m.len()
        );
        assert!(m.starts_with("policies.xxx"), "{m}");
        assert!(m.contains("bytes elided]"), "{m}");
        assert!(m.contains("expected a duration like \"1m\""), "{m}");
        // multi-byte characters are cut on their boundaries
        let e = Error::invalid("key", "€".repeat(10_000));
        assert!(e.to_string().len() < MAX_FIELD_BYTES + MAX_MESSAGE_BYTES);
        assert!(Error::unknown_policy(&big).to_string().len() < 400);
        // short ones are left alone
        assert_eq!(Error::config("a", "b").to_string(), "a: b",);
    }
}

/// `message` with `key` (4 bytes or more) and every word holding a brace written `<key>`.
fn scrub_keys(message: &str, key: Option<&str>) -> String {
    let mut m = message.to_string();
    if m.contains(['{', '}']) {
        m = m
            .split(' ')
            .map(|w| if w.contains(['{', '}']) { "<key>" } else { w })
            .collect::<Vec<_>>()
            .join(" ");
    }
    match key {
        Some(k) if k.len() >= 4 => m.replace(k, "<key>"),
        _ => m,
    }
}

#[cfg(test)]
mod scrub_tests {
    use super::*;

    #[test]
    fn keys_leave_redis_error_text() {
        let e = Error::Script {
            shard: "s0".into(),
            message: "ERR user_script:76: unreadable state in sl:s:api:tq:{a b}=5:{a b} script: 07, on @user_script:76.".into(),
        };
        assert_eq!(
            e.without_keys(Some("{a b}")).to_string(),
            "shard `s0`: redis error: ERR user_script:76: unreadable state in <key> <key> <key> script: 07, on @user_script:76."
        );
        let e = Error::Connection {
            shard: "s0".into(),
            message: "refused: alice@example.com".into(),
        };
        assert!(!e
            .without_keys(Some("alice@example.com"))
            .to_string()
            .contains("alice"));
        // short keys are not blanked out of words; other errors are unchanged
        let e = Error::Script {
            shard: "s0".into(),
            message: "WRONGTYPE k".into(),
        };
        assert_eq!(
            e.without_keys(Some("k")).to_string(),
            "shard `s0`: redis error: WRONGTYPE k"
        );
        let e = Error::invalid("key", "{x}");
        assert_eq!(
            e.clone().without_keys(Some("{x}")).to_string(),
            e.to_string()
        );
    }
}

/// What a TLS verification failure named in `message` means and what to do about it, as
/// text to append to the message (empty when there is nothing to add). rustls names its
/// errors after the rule that failed (`CaUsedAsEndEntity`), which says little to whoever
/// made the certificate.
fn tls_hint(message: &str) -> &'static str {
    const HINTS: [(&str, &str); 6] = [
        (
            "InvalidContentType",
            " (the server did not answer in TLS: is this a plain `redis://` port? A \
             `rediss://` URL needs the server's `tls-port`)",
        ),
        (
            "CaUsedAsEndEntity",
            " (the server presented a CA certificate as its own: a certificate with \
             basicConstraints CA:TRUE, which is what `openssl req -x509` makes by default. \
             TLS accepts only a leaf certificate there: issue the server a certificate \
             signed by a CA, with the server's name or address in its subjectAltName, and \
             give that CA as `ca_file`; tests/tls/gen-certs.sh shows the openssl commands)",
        ),
        (
            "UnknownIssuer",
            " (the server's certificate is not signed by a CA this client trusts: set \
             `ca_file` to the CA that signed it, or check that the server sends its \
             intermediate certificates)",
        ),
        (
            "NotValidForName",
            " (the server's certificate does not hold the host of the shard URL in its \
             subjectAltName: connect by a name or address it holds, or reissue it with \
             this one)",
        ),
        (
            "Expired",
            " (the server's certificate has expired, or this machine's clock is wrong)",
        ),
        (
            "NotValidYet",
            " (the server's certificate is not valid yet: this machine's clock, or the \
             certificate's notBefore, is wrong)",
        ),
    ];
    HINTS
        .iter()
        .find(|(name, _)| message.contains(name))
        .map_or("", |(_, hint)| hint)
}
