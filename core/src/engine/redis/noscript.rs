//! The one NOSCRIPT retry of the script calls that send EVALSHA themselves (the pipelined
//! and blocking checks, the crate-connection checks and shadow checks; `Script::invoke_async`
//! retries by itself): EVALSHA first, and when the server has lost its scripts (restart,
//! SCRIPT FLUSH) the same call once more as EVAL, which loads the script again. The caller
//! takes one deadline for both attempts.

use super::*;

/// A call's result that says the server no longer holds the script.
pub(super) trait LostScripts {
    fn lost_scripts(&self) -> bool;
}

impl LostScripts for Result<Reply> {
    fn lost_scripts(&self) -> bool {
        matches!(self, Ok(r) if r.is_noscript())
    }
}

impl<T> LostScripts for redis::RedisResult<T> {
    fn lost_scripts(&self) -> bool {
        matches!(self, Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript))
    }
}

/// `call(false)` (EVALSHA), then `call(true)` (EVAL) if the server had lost the script.
pub(super) async fn evalsha_then_eval<R, Fut>(mut call: impl FnMut(bool) -> Fut) -> R
where
    R: LostScripts,
    Fut: Future<Output = R>,
{
    let r = call(false).await;
    if r.lost_scripts() {
        return call(true).await;
    }
    r
}

/// [`evalsha_then_eval`] on the calling thread.
pub(super) fn evalsha_then_eval_blocking<R: LostScripts>(mut call: impl FnMut(bool) -> R) -> R {
    let r = call(false);
    if r.lost_scripts() {
        return call(true);
    }
    r
}

/// `sha` (an EVALSHA command) on `conn`, then `eval` (the same call as EVAL) if the server
/// had lost the script.
pub(super) async fn query_script<T: redis::FromRedisValue>(
    conn: Conn,
    sha: &redis::Cmd,
    eval: &redis::Cmd,
) -> redis::RedisResult<T> {
    evalsha_then_eval(|again| {
        let (cmd, mut conn) = (if again { eval } else { sha }, conn.clone());
        async move { cmd.query_async(&mut conn).await }
    })
    .await
}
