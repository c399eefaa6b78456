//! Result codes, owned errors, handles that were freed or never were, panics.

use super::*;

#[test]
fn result_codes_match_the_core() {
    for k in ErrorKind::ALL {
        let c = shardlimit_result::from_kind(*k);
        assert_eq!(c as u32, k.code(), "{k:?}");
        assert_eq!(s(shardlimit_result_name(k.code())), k.name());
        assert_eq!(shardlimit_result_is_backend(k.code()), k.is_backend());
        assert_eq!(
            shardlimit_result_parent(k.code()),
            k.parent().map_or(0, |p| p.code())
        );
    }
    assert_eq!(
        shardlimit_result_parent(SHARDLIMIT_ERR_UNKNOWN_POLICY as u32),
        SHARDLIMIT_ERR_INVALID_ARGUMENT as u32
    );
    assert_eq!(shardlimit_result_parent(SHARDLIMIT_ERR_CLOSED as u32), 0);
    assert_eq!(shardlimit_result_parent(4242), 0);
    assert_eq!(s(shardlimit_result_name(0)), "ok");
    for src in [
        Source::Redis,
        Source::Memory,
        Source::Local,
        Source::Fallback,
        Source::Block,
        Source::LocalFallback,
    ] {
        let code = source_to_c(src) as u32;
        assert_eq!(source_from_c(code), Some(src));
        assert_eq!(s(shardlimit_source_name(code)), src.name());
    }
    assert_eq!(s(shardlimit_source_name(0)), "unknown");
    assert_eq!(s(shardlimit_result_name(4242)), "unknown");
    assert!(!shardlimit_result_is_backend(0));
}

#[test]
fn version_matches_the_core_and_the_header() {
    assert_eq!(
        format!("{SHARDLIMIT_VERSION_MAJOR}.{SHARDLIMIT_VERSION_MINOR}.{SHARDLIMIT_VERSION_PATCH}"),
        shardlimit::VERSION
    );
    assert_eq!(s(shardlimit_version()), shardlimit::VERSION);
    let header = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../include/shardlimit.h"
    ))
    .expect("include/shardlimit.h is committed");
    assert!(header.contains(&format!(
        "#define SHARDLIMIT_VERSION \"{}\"",
        shardlimit::VERSION
    )));
}

#[test]
fn errors_come_back_owned_and_out_params_stay_untouched() {
    let f = Fixture::new();
    let mut d: shardlimit_decision = unsafe { std::mem::zeroed() };
    d.limit = 77;
    type Case = (
        &'static [u8],
        &'static [u8],
        u64,
        shardlimit_result,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            b"k",
            b"nope",
            1,
            SHARDLIMIT_ERR_UNKNOWN_POLICY,
            "unknown policy `nope`",
        ),
        (b"", b"api", 1, SHARDLIMIT_ERR_INVALID_ARGUMENT, "key"),
        (b"k", b"api", 0, SHARDLIMIT_ERR_INVALID_ARGUMENT, "cost"),
        (b"\xff", b"api", 1, SHARDLIMIT_ERR_INVALID_ARGUMENT, "UTF-8"),
        (b"a\0b", b"api", 1, SHARDLIMIT_ERR_INVALID_ARGUMENT, "NUL"),
    ];
    for (key, policy, cost, code, needle) in cases {
        let mut e = null_mut();
        let r = unsafe {
            shardlimit_check_named(
                f.lim,
                key.as_ptr().cast(),
                key.len(),
                policy.as_ptr().cast(),
                policy.len(),
                cost,
                &mut d,
                &mut e,
            )
        };
        assert_eq!(r, code);
        let (c, m) = take_err(e);
        assert_eq!(c, code);
        assert!(m.contains(needle), "{m}");
        assert_eq!(d.limit, 77, "out-param written on failure");
    }
    // NULL with a length, a wild length, a NULL limiter, a NULL out
    unsafe {
        let p = "api";
        assert_eq!(
            shardlimit_check_named(
                f.lim,
                null(),
                3,
                p.as_ptr().cast(),
                3,
                1,
                &mut d,
                null_mut()
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            shardlimit_check_named(
                f.lim,
                p.as_ptr().cast(),
                usize::MAX,
                p.as_ptr().cast(),
                3,
                1,
                &mut d,
                null_mut()
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            shardlimit_check_named(
                null(),
                p.as_ptr().cast(),
                1,
                p.as_ptr().cast(),
                3,
                1,
                &mut d,
                null_mut()
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            shardlimit_check_named(
                f.lim,
                p.as_ptr().cast(),
                1,
                p.as_ptr().cast(),
                3,
                1,
                null_mut(),
                null_mut()
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            shardlimit_error_code(null()),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(s(shardlimit_error_message(null())), "");
        shardlimit_error_free(null_mut());
    }
    assert_eq!(d.limit, 77);
}

#[test]
fn bad_configs_name_the_field() {
    let bad: &[(&str, shardlimit_result, &str)] = &[
        ("{", SHARDLIMIT_ERR_CONFIG, "not valid JSON"),
        (
            r#"{"policies":{"a":{"algorithm":"fixed_window","limit":0,"window":"1s"}}}"#,
            SHARDLIMIT_ERR_CONFIG,
            "policies.a.limit",
        ),
        (r#"{"shards":[]}"#, SHARDLIMIT_ERR_CONFIG, "shards"),
    ];
    for (json, code, needle) in bad {
        let sentinel: *mut shardlimit_limiter = std::ptr::NonNull::dangling().as_ptr();
        let mut lim = sentinel;
        let mut e = null_mut();
        let r = unsafe {
            shardlimit_limiter_new_json(json.as_ptr().cast(), json.len(), null(), &mut lim, &mut e)
        };
        assert_eq!(r, *code);
        assert_eq!(lim, sentinel, "out-param written on failure");
        let (c, m) = take_err(e);
        assert_eq!(c, *code);
        assert!(m.contains(needle), "{m}");
    }
    let mut lim = null_mut();
    let path = "/nonexistent/shardlimit.json";
    let mut e = null_mut();
    let r = unsafe {
        shardlimit_limiter_new_file(path.as_ptr().cast(), path.len(), null(), &mut lim, &mut e)
    };
    assert_eq!(r, SHARDLIMIT_ERR_IO);
    assert!(take_err(e).1.contains(path));
    assert!(lim.is_null());
}

#[test]
fn freed_and_foreign_handles_are_detected() {
    unsafe {
        let lim = limiter("{}");
        shardlimit_limiter_free(lim);
        shardlimit_limiter_free(lim); // a double free is a no-op
        shardlimit_limiter_free(null_mut());
        let mut p = null_mut();
        let mut e = null_mut();
        let n = "x";
        assert_eq!(
            shardlimit_limiter_policy(lim, n.as_ptr().cast(), 1, &mut p, &mut e),
            SHARDLIMIT_ERR_CLOSED
        );
        let (code, msg) = take_err(e);
        assert_eq!(code, SHARDLIMIT_ERR_CLOSED);
        assert!(msg.contains("shardlimit_limiter was freed"), "{msg}");
        assert_eq!(
            s(shardlimit_result_name(SHARDLIMIT_ERR_CLOSED as u32)),
            "closed"
        );
        assert!(!shardlimit_result_is_backend(SHARDLIMIT_ERR_CLOSED as u32));

        // a handle of another type is not a limiter, and freeing it as one frees nothing
        let mut clock = null_mut();
        assert_eq!(
            shardlimit_clock_new(0, &mut clock, null_mut()),
            SHARDLIMIT_OK
        );
        let mut e = null_mut();
        assert_eq!(
            shardlimit_limiter_policy(clock.cast(), n.as_ptr().cast(), 1, &mut p, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        let msg = take_err(e).1;
        assert!(
            msg.contains("is a shardlimit_clock, not a shardlimit_limiter"),
            "{msg}"
        );
        shardlimit_limiter_free(clock.cast());
        shardlimit_policy_free(clock.cast());
        assert_eq!(shardlimit_clock_set_us(clock, 5, null_mut()), SHARDLIMIT_OK);
        shardlimit_clock_free(clock);
        assert_eq!(
            shardlimit_clock_set_us(clock, 5, null_mut()),
            SHARDLIMIT_ERR_CLOSED
        );

        // a real address, NULL, and a value in the handle range never issued
        let real = Box::into_raw(Box::new(0u64));
        for (bogus, want) in [
            (
                real as *const shardlimit_limiter,
                "never returned by shardlimit",
            ),
            (null(), "is NULL"),
            (
                std::ptr::without_provenance(HANDLE_BASE | (MAX_ID >> 1) << TAG_BITS | 1),
                "never returned by shardlimit",
            ),
        ] {
            let mut e = null_mut();
            assert_eq!(
                shardlimit_limiter_policy(bogus, n.as_ptr().cast(), 1, &mut p, &mut e),
                SHARDLIMIT_ERR_INVALID_ARGUMENT
            );
            let msg = take_err(e).1;
            assert!(msg.contains(want), "{msg}");
            shardlimit_limiter_free(bogus.cast_mut()); // a no-op, not a crash
        }
        drop(Box::from_raw(real));
        assert!(p.is_null());

        // errors: a freed error says CLOSED, a double free is a no-op
        let mut e = null_mut();
        assert_eq!(
            shardlimit_clock_new(0, null_mut(), &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(shardlimit_error_code(e), SHARDLIMIT_ERR_INVALID_ARGUMENT);
        shardlimit_error_free(e);
        shardlimit_error_free(e);
        assert_eq!(shardlimit_error_code(e), SHARDLIMIT_ERR_CLOSED);
        assert_eq!(shardlimit_error_message(e).len, 0);
        assert_eq!(
            shardlimit_error_code(null()),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn a_freed_handle_is_never_given_to_a_new_object() {
    unsafe {
        let first = limiter(CONFIG);
        shardlimit_limiter_free(first);
        // an allocator hands the freed block to the next object of the same size; a handle
        // table keyed by address then answered for the new limiter through the old handle
        let later: Vec<_> = (0..64).map(|_| limiter(CONFIG)).collect();
        assert!(later.iter().all(|l| *l != first));
        let (code, _) = check_named(first, "k", "api").unwrap_err();
        assert_eq!(code, SHARDLIMIT_ERR_CLOSED);
        for l in later {
            assert_eq!(check_named(l, "k", "api").unwrap().limit, 3);
            shardlimit_limiter_free(l);
        }
    }
}

#[test]
fn a_panic_becomes_internal() {
    let mut e = null_mut();
    let r = guard(&mut e, || panic!("boom"));
    assert_eq!(r, SHARDLIMIT_ERR_INTERNAL);
    let (c, m) = take_err(e);
    assert_eq!(c, SHARDLIMIT_ERR_INTERNAL);
    assert!(m.contains("panic: boom"), "{m}");
}
