//! Bytes to and from Redis: the framing of replies under hard limits ([`resp`]), the
//! pipelined connection of async calls ([`pipe`]), the blocking connections of calls made
//! on the caller's thread ([`blocking`]) and the I/O runtime that drives them ([`runtime`]).

pub(crate) mod blocking;
pub(crate) mod pipe;
pub(crate) mod resp;
pub(crate) mod runtime;
