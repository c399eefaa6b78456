//! The limiter handle: construction (memory, JSON, file, environment), connecting,
//! freeing.

use super::*;

/// The limiter of a handle (0 once closed: the Java side refuses calls then).
pub(crate) fn limiter<'a>(h: jlong) -> Result<&'a Limiter, Fail> {
    if h == 0 {
        return Err(invalid("limiter", "is closed").into());
    }
    // SAFETY: a handle is a `Box<Limiter>` from `boxed`, freed only by `Native.free`, which
    // the Java side calls under its write lock once no call holds the read lock.
    Ok(unsafe { &*(h as *const Limiter) })
}

fn boxed(l: Limiter) -> jlong {
    Box::into_raw(Box::new(l)) as jlong
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_memory(
    mut env: JNIEnv,
    _: JClass,
    clock: jlong,
) -> jlong {
    run(&mut env, 0, |_| {
        Ok(boxed(with_clock(Limiter::memory(), clock)?))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_fromJson(
    mut env: JNIEnv,
    _: JClass,
    json: JByteArray,
    clock: jlong,
) -> jlong {
    run(&mut env, 0, |env| {
        let text = text(env, &json, "config")?;
        Ok(boxed(with_clock(Limiter::from_json(&text)?, clock)?))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_fromConfigFile(
    mut env: JNIEnv,
    _: JClass,
    path: JByteArray,
    clock: jlong,
) -> jlong {
    run(&mut env, 0, |env| {
        let path = text(env, &path, "path")?;
        Ok(boxed(with_clock(Limiter::from_config_file(&path)?, clock)?))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_fromEnv(
    mut env: JNIEnv,
    _: JClass,
    clock: jlong,
) -> jlong {
    run(&mut env, 0, |_| {
        Ok(boxed(with_clock(Limiter::from_env()?, clock)?))
    })
}

/// Frees a limiter handle. Its I/O thread is joined when the last reference goes, which
/// may take a deadline: never on the caller's thread.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_free(mut env: JNIEnv, _: JClass, h: jlong) {
    run(&mut env, (), |_| {
        if h != 0 {
            // SAFETY: see `limiter`; the Java side calls this once, after the last use.
            let l = unsafe { Box::from_raw(h as *mut Limiter) };
            std::thread::Builder::new()
                .name("shardlimit-close".into())
                .spawn(move || drop(l))
                .map_err(|e| internal(format!("could not start the closing thread: {e}")))?;
        }
        Ok(())
    })
}

/// Connects to every shard within `timeout_us`.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_connect(
    env: JNIEnv,
    _: JClass,
    h: jlong,
    timeout_us: jlong,
    call: JObject,
) {
    async_call!(env, call, |env| {
        let l = limiter(h)?;
        let timeout = match timeout_us {
            1..=3_600_000_000 => Duration::from_micros(timeout_us as u64),
            _ => return Err(invalid("timeout", "must be above 0, at most 1 hour").into()),
        };
        let me = l.clone();
        let fut = async move { me.connect(timeout).await };
        (l, fut, nothing as Convert<()>)
    })
}
