//! What the engine and the transports both speak, below both: the layout of a check
//! script call's arguments and the table of the Lua scripts. The engine writes calls in
//! this layout ([`CheckSink`]); the transports regroup a burst's calls by it into batch
//! calls (`transport/batch.rs`) and send the scripts by SHA1 or source. Neither imports
//! the other for it.

pub mod scripts;

/// The layout of a check call (`core/lua/check.lua`, `main_check.lua`): after `numkeys`,
/// its keys, its own arguments, its policy's (which a batch call, `main_batch.lua`, sends
/// once per distinct set) and its tag, each group as long as the policy and the call need
/// (a feature the policy does not use costs no key and no argument). The engine's
/// `CheckRequest::write` is the one place that writes them, marking where each group
/// begins; the transports regroup a burst's calls by these marks.
/// Where the groups of a check call's arguments begin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CheckPart {
    Item,
    Shape,
    Tag,
}

/// What a check call's arguments are written to: a `redis::Cmd`, or the pipe's packed call.
pub(crate) trait CheckSink {
    fn arg(&mut self, a: &[u8]);
    /// The next argument is the first of `part`.
    fn mark(&mut self, _part: CheckPart) {}
    fn int(&mut self, v: u64) {
        self.arg(itoa::Buffer::new().format(v).as_bytes());
    }
}

impl CheckSink for redis::Cmd {
    fn arg(&mut self, a: &[u8]) {
        redis::Cmd::arg(self, a);
    }
}
