//! Rate-string policies, plans and multi-limit decisions.

use super::*;

/// Rate strings and plans through the ABI: a multi-limit policy decides in one call, the
/// decision carries its limits, and the headers rendered from the C struct are the core's.
#[test]
fn rate_policies_plans_and_multi_limit_decisions() {
    const PLANS: &str = r#"{"policies":{"api":"2/second; 3/minute"},
        "plans":{"pro":{"api":"10/second; 100/minute"}}}"#;
    let header = |d: &shardlimit_decision, name: &str| -> String {
        let mut h = null_mut();
        unsafe {
            assert_eq!(
                shardlimit_decision_headers(d, &mut h, null_mut()),
                SHARDLIMIT_OK
            );
            let mut found = String::new();
            for i in 0..shardlimit_headers_len(h) {
                let (mut n, mut v) = (shardlimit_str::EMPTY, shardlimit_str::EMPTY);
                shardlimit_headers_get(h, i, &mut n, &mut v, null_mut());
                if s(n) == name {
                    found = s(v);
                }
            }
            shardlimit_headers_free(h);
            found
        }
    };
    unsafe {
        let mut clock = null_mut();
        shardlimit_clock_new(1_700_006_400_000_000, &mut clock, null_mut());
        let mut lim = null_mut();
        assert_eq!(
            shardlimit_limiter_new_json(
                PLANS.as_ptr().cast(),
                PLANS.len(),
                clock,
                &mut lim,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        // an ad-hoc rate string, named and unnamed
        let rate = "1/second; 2/minute";
        let mut p = null_mut();
        let fw = shardlimit_algorithm::SHARDLIMIT_ALGORITHM_FIXED_WINDOW as u32;
        assert_eq!(
            shardlimit_policy_new_rate(
                b"burst".as_ptr().cast(),
                5,
                rate.as_ptr().cast(),
                rate.len(),
                fw,
                &mut p,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        assert_eq!(s(shardlimit_policy_name(p)), "burst");
        let mut d: shardlimit_decision = std::mem::zeroed();
        assert_eq!(
            shardlimit_check(lim, b"k".as_ptr().cast(), 1, p, 1, &mut d, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(d.allowed && d.has_limit_index && d.limit_index == 0 && d.quota_count == 2);
        assert_eq!((d.quotas[1].limit, d.quotas[1].window_us), (2, 60_000_000));
        assert_eq!(
            header(&d, "RateLimit-Policy"),
            r#""burst";q=1;w=1, "burst#1";q=2;w=60"#
        );
        assert_eq!(
            shardlimit_check(lim, b"k".as_ptr().cast(), 1, p, 1, &mut d, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(!d.allowed && d.limit_index == 0);
        shardlimit_policy_free(p);
        let mut anon = null_mut();
        assert_eq!(
            shardlimit_policy_new_rate(
                null(),
                0,
                rate.as_ptr().cast(),
                rate.len(),
                fw,
                &mut anon,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        assert_eq!(
            s(shardlimit_policy_name(anon)),
            "fixed_window-1-1000ms--fixed_window-2-60000ms"
        );
        shardlimit_policy_free(anon);
        let mut e = null_mut();
        let bad = "5/fortnight";
        assert_eq!(
            shardlimit_policy_new_rate(
                null(),
                0,
                bad.as_ptr().cast(),
                bad.len(),
                fw,
                &mut anon,
                &mut e
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("fortnight"));
        let mut e = null_mut();
        assert_eq!(
            shardlimit_policy_new_rate(
                null(),
                0,
                rate.as_ptr().cast(),
                rate.len(),
                99,
                &mut anon,
                &mut e
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        take_err(e);
        // under a plan: the same name and state
        let mut pro = null_mut();
        assert_eq!(
            shardlimit_plan_policy(
                lim,
                b"pro".as_ptr().cast(),
                3,
                b"api".as_ptr().cast(),
                3,
                &mut pro,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        assert_eq!(s(shardlimit_policy_name(pro)), "api");
        for _ in 0..2 {
            shardlimit_check_named(
                lim,
                b"t".as_ptr().cast(),
                1,
                b"api".as_ptr().cast(),
                3,
                1,
                &mut d,
                null_mut(),
            );
        }
        assert!(!{
            shardlimit_check_named(
                lim,
                b"t".as_ptr().cast(),
                1,
                b"api".as_ptr().cast(),
                3,
                1,
                &mut d,
                null_mut(),
            );
            d.allowed
        });
        assert_eq!(
            shardlimit_check(lim, b"t".as_ptr().cast(), 1, pro, 1, &mut d, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(d.allowed && d.limit == 10 && d.remaining == 7);
        shardlimit_policy_free(pro);
        let mut e = null_mut();
        assert_eq!(
            shardlimit_plan_policy(
                lim,
                b"gold".as_ptr().cast(),
                4,
                b"api".as_ptr().cast(),
                3,
                &mut pro,
                &mut e
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("gold"));
        // a decision from C is checked before headers are rendered from it
        let mut forged = d;
        forged.has_limit_index = true;
        forged.quota_count = 17;
        let mut h = null_mut();
        let mut e = null_mut();
        assert_eq!(
            shardlimit_decision_headers(&forged, &mut h, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("quota_count"));
        forged.quota_count = 2;
        forged.limit_index = 2;
        let mut e = null_mut();
        assert_eq!(
            shardlimit_decision_headers(&forged, &mut h, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("limit_index"));
        shardlimit_limiter_free(lim);
        shardlimit_clock_free(clock);
    }
}
