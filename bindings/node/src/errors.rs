//! Core errors as JS errors (built by the factory `index.js` registers), and the table of
//! error kinds.

use super::*;

pub(crate) fn core_error(env: &Env, e: shardlimit::Error) -> Error {
    let kind = e.kind().name().to_string();
    let message = e.to_string();
    if let Some(factory) = env_data(env).and_then(|d| d.factory.as_ref()) {
        if let Ok(f) = factory.borrow_back(env) {
            if let Ok(obj) = f.call(FnArgs::from((kind.clone(), message.clone()))) {
                return Error::from(obj);
            }
        }
    }
    // no factory (the addon used without index.js): a plain Error whose `code` is the kind
    Error::new(
        Status::GenericFailure,
        format!("[{}] {message}", code_of(&kind)),
    )
}

pub(crate) fn code_of(kind_name: &str) -> String {
    format!("ERR_SHARDLIMIT_{}", kind_name.to_ascii_uppercase())
}

pub(crate) fn panic_error(payload: Box<dyn std::any::Any + Send>) -> shardlimit::Error {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    shardlimit::Error::Internal(format!("panic: {what}"))
}

pub(crate) fn invalid(what: &str, message: &str) -> shardlimit::Error {
    shardlimit::Error::InvalidArgument {
        what: what.to_string(),
        message: message.to_string(),
    }
}

/// Registers the JS error factory of this environment. Called once by `index.js`.
#[napi(catch_unwind)]
pub fn set_error_factory(
    env: Env,
    factory: Function<FnArgs<(String, String)>, Unknown<'static>>,
) -> Result<()> {
    let r = factory.create_ref()?;
    env_data_or_init(&env)?.factory = Some(r);
    Ok(())
}

/// One stable error kind of the core.
#[napi(object)]
pub struct ErrorKindInfo {
    /// The stable snake_case name (`config`, `timeout`, ...).
    pub name: String,
    /// The stable numeric code (the C binding's result code).
    pub number: u32,
    /// The JS `err.code` (`ERR_SHARDLIMIT_CONFIG`, ...).
    pub code: String,
}

/// Every error kind of the core (`ErrorKind::ALL`), in code order.
#[napi(catch_unwind)]
pub fn error_kinds() -> Vec<ErrorKindInfo> {
    shardlimit::ErrorKind::ALL
        .iter()
        .map(|k| ErrorKindInfo {
            name: k.name().to_string(),
            number: k.code(),
            code: code_of(k.name()),
        })
        .collect()
}

/// The version of the core this addon was built from.
#[napi(catch_unwind)]
pub fn core_version() -> String {
    shardlimit::VERSION.to_string()
}

/// A test-only panic, to check that panics become errors instead of crashing Node.
#[napi(catch_unwind)]
pub fn panic_for_test(env: Env, message: String) -> Result<()> {
    let r = guarded(|| -> shardlimit::Result<()> { panic!("{message}") });
    r.map_err(|e| core_error(&env, e))
}
