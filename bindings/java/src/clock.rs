//! The manual clock of deterministic tests, as a handle the Java `ManualClock` owns.

use super::*;

fn clock(h: jlong) -> Option<Arc<shardlimit::ManualClock>> {
    if h == 0 {
        None
    } else {
        // SAFETY: a clock handle is a `Box<Arc<ManualClock>>` freed by `clockFree` only
        // when the Java clock is unreachable (its Cleaner).
        Some(unsafe { &*(h as *const Arc<shardlimit::ManualClock>) }.clone())
    }
}

pub(crate) fn with_clock(l: Limiter, c: jlong) -> shardlimit::Result<Limiter> {
    match clock(c) {
        Some(c) => l.with_clock(c),
        None => Ok(l),
    }
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_clockNew(
    mut env: JNIEnv,
    _: JClass,
    start_us: jlong,
) -> jlong {
    run(&mut env, 0, |_| {
        let c = shardlimit::ManualClock::new(units("startUs", start_us)?);
        Ok(Box::into_raw(Box::new(c)) as jlong)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_clockSet(
    mut env: JNIEnv,
    _: JClass,
    c: jlong,
    to_us: jlong,
    advance: jboolean,
) -> jlong {
    run(&mut env, 0, |_| {
        use shardlimit::Clock;
        let c = clock(c).ok_or_else(|| invalid("clock", "is freed"))?;
        if to_us != -1 {
            let n = units("us", to_us)?;
            if advance != 0 {
                c.advance_us(n);
            } else {
                c.set_us(n);
            }
        }
        Ok(c.now_us() as jlong)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_clockFree(_: JNIEnv, _: JClass, c: jlong) {
    if c != 0 {
        // SAFETY: called once by the Java clock's Cleaner.
        let _ =
            catch_unwind(|| drop(unsafe { Box::from_raw(c as *mut Arc<shardlimit::ManualClock>) }));
    }
}
