//! The JVM binding of shardlimit: the JNI library behind the `io.shardlimit` jar.
//!
//! A thin skin over the core: it converts types and errors only. Every native method is a
//! static method of `io.shardlimit.Native`; the Java classes hold the public API.
//! One module per area, as the other bindings (check, lease, settle, block, overrides,
//! admin, events...); `Java_io_shardlimit_Native_*` functions live in any of them.
//!
//! Async calls never block a Java thread inside JNI: a native method only *starts* the
//! core's future on the limiter's I/O runtime (`Limiter::spawner`) and returns. When the
//! future is done, the I/O thread (attached to the JVM as a daemon) converts the result
//! and calls `Native.deliver`, which hands the completion of the caller's
//! `CompletableFuture` to a Java executor: no user callback runs on the I/O thread. On
//! the in-memory engine a call never waits, so it runs to completion at once on the
//! calling thread and its future is returned already complete.
//!
//! Errors: a core error becomes the exception class of its `ErrorKind` (built by
//! `Native.error(code, message)`). Panics are caught at every entry point (and around
//! every future) and become `internal` errors: nothing unwinds into the JVM.
//!
//! Keys and policy names arrive as UTF-8 `byte[]` (the cheapest way through JNI); bytes
//! that are not UTF-8 are an `invalid_argument` error naming the argument.

// the core's check futures nest deeply (layers, fallback, handoff)
#![recursion_limit = "256"]

use jni::objects::{
    GlobalRef, JByteArray, JClass, JLongArray, JObject, JObjectArray, JString, JValue,
};
use jni::sys::{jboolean, jdouble, jint, jlong, jobject, jstring, JNI_ERR, JNI_VERSION_1_8};
use jni::{JNIEnv, JavaVM};
use serde_json::{json, Value};
use shardlimit::{Decision, Limiter, Source};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

mod admin;
mod block;
mod check;
mod clock;
mod convert;
mod decision;
mod delivery;
mod errors;
mod events;
mod ip;
mod lease;
mod limiter;
mod logging;
mod overrides;
mod policy;
mod settle;

use clock::*;
use convert::*;
use decision::*;
use delivery::*;
use errors::*;
use events::*;
use limiter::*;
use policy::*;

/// What `JNI_OnLoad` caches: the VM (to attach the I/O threads) and the classes the
/// library calls, found with the class loader that loaded the jar (a thread attached
/// from Rust would only see the system class loader).
struct Globals {
    vm: JavaVM,
    native: GlobalRef,
    decision: GlobalRef,
    string: GlobalRef,
    object: GlobalRef,
}

static GLOBALS: OnceLock<Globals> = OnceLock::new();

/// # Safety
/// Called by the JVM with its own `JavaVM` pointer when `System.load` loads the library.
#[no_mangle]
pub unsafe extern "system" fn JNI_OnLoad(vm: *mut jni::sys::JavaVM, _: *mut u8) -> jint {
    let r = catch_unwind(AssertUnwindSafe(|| -> jni::errors::Result<()> {
        let vm = JavaVM::from_raw(vm)?;
        let mut env = vm.get_env()?;
        let mut class = |name: &str| -> jni::errors::Result<GlobalRef> {
            let c = env.find_class(name)?;
            env.new_global_ref(c)
        };
        let native = class("io/shardlimit/Native")?;
        let decision = class("io/shardlimit/Decision")?;
        let string = class("java/lang/String")?;
        let object = class("java/lang/Object")?;
        let _ = GLOBALS.set(Globals {
            vm,
            native,
            decision,
            string,
            object,
        });
        Ok(())
    }));
    match r {
        Ok(Ok(())) => JNI_VERSION_1_8,
        _ => JNI_ERR,
    }
}

fn globals() -> Result<&'static Globals, Fail> {
    GLOBALS.get().ok_or_else(|| {
        Fail::Core(internal(
            "the library was not loaded by io.shardlimit.Native",
        ))
    })
}

fn class(g: &GlobalRef) -> &JClass<'static> {
    <&JClass>::from(g.as_obj())
}
