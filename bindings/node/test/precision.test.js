'use strict'
// Per-key window offsets and exact bucket rates through Node:
// `window_offset` in a Limit spec (named or not) and in a config, on both engines; the
// offsets are those pinned by tests/vectors/precision.json.

const test = require('node:test')
const assert = require('node:assert/strict')
const sl = require('..')
const { Limiter, Limit, ManualClock } = sl
const { startRedis } = require('./support/redis.js')

const T0 = 1_800_000_000_000_000
let redis
test.before(async () => {
  redis = await startRedis()
})
test.after(() => redis.stop())

const policies = {
  daily: { algorithm: 'fixed_window', limit: 1, window: '1d', window_offset: 'per_key' },
  fast: { algorithm: 'token_bucket', capacity: 3_000_000, refill_per_sec: 300_000 },
}

for (const engine of ['memory', 'redis']) {
  const make = () => {
    const clock = new ManualClock(T0)
    const cfg = engine === 'redis' ? redis.config(policies) : { policies }
    return { limiter: Limiter.fromJson(cfg, { clock }), clock }
  }

  test(`${engine}: a per-key window resets at the key's own offset`, async () => {
    const { limiter } = make()
    // offsets of 'a' and 'tenant:1' in a day (tests/vectors/precision.json, offsets)
    // past midnight UTC; T0 is 8 h past one
    const day = 86_400_000_000
    const until = (offset) => (offset - (T0 % day) + day) % day
    const d = await limiter.check('a', 'daily')
    assert.equal(d.allowed, true)
    assert.equal(Math.round(d.resetAfter * 1000), until(52_766_353_057))
    const t = await limiter.check('tenant:1', 'daily')
    assert.equal(Math.round(t.resetAfter * 1000), until(40_405_616_687))
    const denied = await limiter.check('a', 'daily')
    assert.equal(Math.round(denied.retryAfter * 1000), until(52_766_353_057))
  })

  test(`${engine}: ad-hoc limits take window_offset, named or not`, async () => {
    const { limiter, clock } = make()
    for (const options of [undefined, { name: 'persec' }]) {
      const limit = new Limit({ algorithm: 'sliding_window', limit: 2, window: '1s', window_offset: 'per_key' }, options)
      clock.setUs(T0)
      const d = await limiter.check('a', { limit, cost: 2 })
      assert.equal(d.allowed, true)
      // the key's window began 1e6 - 353057 µs ago: both counters age out a window later
      assert.equal(Math.round(d.resetAfter * 1000), 2_000_000 - (1_000_000 - 353_057))
      assert.equal((await limiter.check('a', { limit })).allowed, false)
    }
    assert.throws(
      () => new Limit({ algorithm: 'token_bucket', capacity: 5, refill_per_sec: 1, window_offset: 'per_key' }),
      (e) => e instanceof sl.ConfigError && /limit\.window_offset/.test(e.message) && /fixed_window and sliding_window/.test(e.message)
    )
    assert.throws(
      () => new Limit({ algorithm: 'fixed_window', limit: 5, window: '1s', window_offset: 'hourly' }),
      (e) => e instanceof sl.ConfigError && /limit\.window_offset/.test(e.message)
    )
  })

  test(`${engine}: 300,000/s refills exactly 10/3 µs per token`, async () => {
    const { limiter, clock } = make()
    assert.equal((await limiter.check('k', { policy: 'fast', cost: 3_000_000 })).allowed, true)
    const denied = await limiter.check('k', 'fast')
    assert.equal(Math.round(denied.retryAfter * 1000), 4)
    // a second later, exactly 300,000 tokens (rounded to 3 µs a token it was 333,333)
    clock.setUs(T0 + 1_000_000)
    const p = await limiter.peek('k', 'fast')
    assert.equal(p.remaining, 300_000)
  })
}
