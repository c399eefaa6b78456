//! Time: the clocks a limiter decides with ([`clock`]) and duration parsing ([`duration`]).

pub mod clock;
pub(crate) mod duration;
