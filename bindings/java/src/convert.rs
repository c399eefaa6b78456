//! Arguments from Java (UTF-8 `byte[]`, counts, durations) and small results to Java.

use super::*;

/// A UTF-8 `byte[]` argument as a string; null or bytes that are not UTF-8 are an
/// `invalid_argument` error naming `what`.
pub(crate) fn text(env: &JNIEnv, bytes: &JByteArray, what: &str) -> Result<String, Fail> {
    if bytes.as_raw().is_null() {
        return Err(invalid(what, "must not be null").into());
    }
    let v = env.convert_byte_array(bytes)?;
    String::from_utf8(v).map_err(|_| invalid(what, "is not valid UTF-8").into())
}

pub(crate) fn opt_text(
    env: &JNIEnv,
    bytes: &JByteArray,
    what: &str,
) -> Result<Option<String>, Fail> {
    if bytes.as_raw().is_null() {
        Ok(None)
    } else {
        text(env, bytes, what).map(Some)
    }
}

/// A count of units from a Java `long` (negative is invalid).
pub(crate) fn units(what: &str, n: jlong) -> shardlimit::Result<u64> {
    u64::try_from(n).map_err(|_| invalid(what, "must not be negative"))
}

/// A duration in microseconds; negative means none.
pub(crate) fn opt_us(what: &str, us: jlong) -> shardlimit::Result<Option<Duration>> {
    match us {
        -1 => Ok(None),
        n if n >= 0 => Ok(Some(Duration::from_micros(n as u64))),
        _ => Err(invalid(what, "must not be negative")),
    }
}

pub(crate) fn jstr<'l>(env: &mut JNIEnv<'l>, s: impl AsRef<str>) -> Result<jstring, Fail> {
    Ok(env.new_string(s.as_ref())?.into_raw())
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}
