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

test('a reservation settles once, and only one that reserve returned', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  for (const config of [redis.config(POLICIES), { policies: POLICIES }]) {
    const clock = new ManualClock(T0)
    const limiter = Limiter.fromJson(config, { clock })
    const { reservation } = await limiter.reserve('k', { policy: 'tokens', cost: 5 })
    assert.equal((await limiter.settle(reservation, 0)).remaining, 10)
    // a second settle would give the 5 units back again: refused, and nothing moves
    for (let i = 0; i < 2; i++) {
      await assert.rejects(limiter.settle(reservation, 0), (e) => e.code === 'ERR_SHARDLIMIT_INVALID_ARGUMENT' && /settled already/.test(e.message))
    }
    // settled twice at once: one of them settles
    const r2 = (await limiter.reserve('k', { policy: 'tokens', cost: 10 })).reservation
    const both = await Promise.allSettled([limiter.settle(r2, 0), limiter.settle(r2, 0)])
    assert.deepEqual(both.map((s) => s.status).sort(), ['fulfilled', 'rejected'])
    let admitted = 0
    for (let i = 0; i < 20; i++) if ((await limiter.check('k', 'tokens')).allowed) admitted++
    assert.equal(admitted, 10, 'a window of 10 admits 10')
    // a literal, a copy, or the reservation with its fields changed would give units back
    // to any key: only the object reserve returned is taken, and it cannot be changed
    const r3 = (await limiter.reserve('other', { policy: 'tokens', cost: 1 })).reservation
    const forged = [
      { key: 'k', policy: 'tokens', units: 10, atUs: T0 },
      { ...r3, key: 'k', units: 10 },
      JSON.parse(JSON.stringify(r3)),
      Object.create(r3),
    ]
    for (const f of forged) {
      await assert.rejects(limiter.settle(f, 0), (e) => e.code === 'ERR_INVALID_ARG_TYPE' && /returned by reserve/.test(e.message))
    }
    assert.throws(() => { r3.key = 'k' }, TypeError)
    assert.equal((await limiter.peek('k', 'tokens')).remaining, 0, 'no budget restored')
    // a refusal before anything was sent leaves it to settle once, as it should
    await assert.rejects(limiter.settle(r3, -1), /actual/)
    assert.equal((await limiter.settle(r3, 0)).remaining, 10)
  }
})

test('acquire of a policy that is not a concurrency limit is an invalid argument that takes nothing', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  for (const config of [redis.config(POLICIES), { policies: POLICIES }]) {
    const limiter = Limiter.fromJson(config)
    const invalid = (e) => e.code === 'ERR_SHARDLIMIT_INVALID_ARGUMENT' && /not a concurrency policy/.test(e.message)
    await assert.rejects(limiter.acquire('k', 'tokens'), invalid)
    await assert.rejects(limiter.acquire('k', { policy: 'tokens', units: 3 }), invalid)
    await assert.rejects(limiter.acquire('k', { limit: { algorithm: 'fixed_window', limit: 10, window: '1s' } }), invalid)
    assert.equal((await limiter.peek('k', 'tokens')).remaining, 10)
  }
})
