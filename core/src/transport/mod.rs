//! Bytes to and from Redis: the framing of replies under hard limits ([`resp`]), the
//! pipelined connection of async calls ([`pipe`]), the blocking connections of calls made
//! on the caller's thread ([`blocking`]), the I/O runtime that drives them ([`runtime`]),
//! and how many CPUs the process may use, which decides whether waiting spins ([`cpus`]).

pub(crate) mod batch;
pub(crate) mod blocking;
pub(crate) mod cpus;
pub(crate) mod pipe;
pub(crate) mod resp;
pub(crate) mod runtime;
pub(crate) mod sansio;

use std::io;

/// Why a call was refused before it was queued: the connection's queue holds `max_queue`
/// calls already. Not a failure of the shard (it is answering, this process sends more
/// than it answers), so never a reason to fall back to `on_error`: the caller gets its
/// own error.
#[derive(Debug, Clone)]
pub(crate) struct Overloaded {
    pub max_queue: usize,
}

impl std::fmt::Display for Overloaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} checks are waiting for this shard's connection already (max_queue)",
            self.max_queue
        )
    }
}

impl std::error::Error for Overloaded {}

/// The [`Overloaded`] an I/O error carries, if it is one.
pub(crate) fn overloaded(e: &io::Error) -> Option<&Overloaded> {
    e.get_ref().and_then(|i| i.downcast_ref::<Overloaded>())
}

/// The outcome of a handshake command (`what`: AUTH, SELECT), which answers +OK.
pub(crate) fn expect_ok(what: &str, reply: resp::Reply) -> io::Result<()> {
    match reply {
        resp::Reply::Str(s) if s == b"OK" => Ok(()),
        resp::Reply::Error(e) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{what} failed: {e}"),
        )),
        other => Err(resp::protocol(format!(
            "{what}: unexpected reply {other:?}"
        ))),
    }
}
