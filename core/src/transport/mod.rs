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
