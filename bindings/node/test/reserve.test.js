'use strict'
// Charge, refund and reserve-and-settle from Node, on Redis and in memory: a charge puts
// the key into debt, a refund never goes above the limit, a settle gives the unused part
// back to the window that admitted it.

const test = require('node:test')
const assert = require('node:assert/strict')
const { Limiter, ManualClock } = require('..')
const { startRedis } = require('./support/redis')

const POLICIES = {
  tokens: { algorithm: 'fixed_window', limit: 10, window: '1s' },
  conc: { algorithm: 'concurrency', max: 2, lease_ttl: '1s' },
}
const T0 = 1_800_000_000_000_000

test('charge, refund, reserve and settle on Redis and in memory', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  for (const config of [redis.config(POLICIES), { policies: POLICIES }]) {
    const clock = new ManualClock(T0)
    const limiter = Limiter.fromJson(config, { clock })
    let d = await limiter.charge('llm', { policy: 'tokens', cost: 14 })
    assert.equal(d.allowed, true)
    assert.equal(d.remaining, 0)
    d = await limiter.check('llm', 'tokens')
    assert.equal(d.allowed, false)
    assert.equal(d.retryAfter, 1000)
    assert.equal((await limiter.refund('llm', { policy: 'tokens', cost: 99 })).remaining, 10)
    const { decision, reservation } = await limiter.reserve('llm', { policy: 'tokens', cost: 8 })
    assert.equal(decision.allowed, true)
    assert.deepEqual(reservation, { key: 'llm', policy: 'tokens', units: 8, atUs: T0 })
    assert.equal((await limiter.settle(reservation, 3)).remaining, 7)
    const denied = await limiter.reserve('llm', { policy: 'tokens', cost: 11 })
    assert.equal(denied.decision.allowed, false)
    assert.equal(denied.reservation, null)
    // a settle in a later window gives nothing to that window
    const r = (await limiter.reserve('llm', { policy: 'tokens', cost: 3 })).reservation
    clock.setUs(T0 + 1_000_000)
    assert.equal((await limiter.check('llm', { policy: 'tokens', cost: 10 })).allowed, true)
    assert.equal((await limiter.settle(r, 0)).remaining, 0)
    await assert.rejects(limiter.charge('llm', 'conc'), (e) => e.code === 'ERR_SHARDLIMIT_INVALID_ARGUMENT' && /acquire and release/.test(e.message))
    await assert.rejects(limiter.charge('llm', { policy: 'tokens', cost: 0 }), /cost/)
    await assert.rejects(limiter.settle(null, 1), /reservation/)
    await assert.rejects(limiter.charge('llm', { limit: { algorithm: 'fixed_window', limit: 5, window: '1s' } }), /named policy/)
  }
})
