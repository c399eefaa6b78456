'use strict'
// Charge, refund and reserve-and-settle on every policy shape from Node (the core's, no API
// change): a 300000/s bucket (a rate string of the config, 10/3 µs a token, kept exact) is
// charged to the token, and a multi-limit policy ("5/hour; 100/day") is charged, refunded
// and settled in every limit. On Redis and in memory, with an injected clock.

const test = require('node:test')
const assert = require('node:assert/strict')
const { Limiter, ManualClock } = require('..')
const { startRedis } = require('./support/redis')

const POLICIES = {
  llm: { algorithm: 'token_bucket', rate: '300000/second' },
  plan: '5/hour; 100/day',
}
const T0 = 1_800_000_000_000_000

function engines(redis) {
  return [['redis', redis.config(POLICIES)], ['memory', { policies: POLICIES }]].map(([name, config]) => {
    const clock = new ManualClock(T0)
    return [name, Limiter.fromJson(config, { clock }), clock]
  })
}

test('an exact 300000/s bucket is charged, refunded and settled to the token', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  for (const [engine, limiter, clock] of engines(redis)) {
    // 250,000 first: 2,500,000 ticks of 1/3 µs ahead (833 ms: Redis expires state on the
    // wall clock, so it must outlive the test's calls)
    assert.equal((await limiter.charge('llm', { policy: 'llm', cost: 250_000 })).remaining, 50_000, engine)
    for (let i = 1; i <= 300; i++) {
      clock.setUs(T0 + i)
      const d = await limiter.charge('llm', 'llm')
      // each µs refills 3 ticks and each token costs 10: 7 ticks more a step
      assert.equal(d.remaining, Math.floor((3_000_000 - 2_500_000 - 7 * i) / 10), `${engine} ${i}`)
    }
    let d = await limiter.charge('llm', { policy: 'llm', cost: 40_000 })
    assert.equal(d.remaining, 9_790, engine)
    const { decision, reservation } = await limiter.reserve('llm', { policy: 'llm', cost: 9_000 })
    assert.equal(decision.remaining, 790, engine)
    assert.equal((await limiter.settle(reservation, 1_000)).remaining, 8_790, engine)
    // 100 tokens into debt, then 101 refunded: one free token, exactly
    assert.equal((await limiter.charge('llm', { policy: 'llm', cost: 8_890 })).remaining, 0, engine)
    assert.equal((await limiter.check('llm', 'llm')).allowed, false, engine)
    assert.equal((await limiter.refund('llm', { policy: 'llm', cost: 101 })).remaining, 1, engine)
    clock.setUs(T0 + 310)
    d = await limiter.peek('llm', 'llm')
    assert.equal(d.remaining, 4, `${engine}: 10 µs refill exactly 3 tokens`)
  }
})

test('a multi-limit policy is charged, refunded and settled in every limit', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  for (const [engine, limiter, clock] of engines(redis)) {
    let d = await limiter.charge('tenant', { policy: 'plan', cost: 7 })
    // the hour is in debt: the decision names it
    assert.deepEqual([d.allowed, d.remaining, d.limitIndex], [true, 0, 0], engine)
    assert.deepEqual(d.quotas.map((q) => q.limit), [5, 100], engine)
    assert.equal((await limiter.check('tenant', 'plan')).allowed, false, engine)
    d = await limiter.refund('tenant', { policy: 'plan', cost: 3 })
    assert.deepEqual([d.remaining, d.limitIndex], [1, 0], engine)
    // the next hour: the reservation is the all-or-nothing check, settled in both limits
    clock.setUs(T0 + 3_600_000_000)
    const { decision, reservation } = await limiter.reserve('tenant', { policy: 'plan', cost: 5 })
    assert.equal(decision.allowed, true, engine)
    assert.equal((await limiter.settle(reservation, 2)).remaining, 3, engine)
    // the day: 4 + 2 used; 94 more fill it
    assert.equal((await limiter.charge('tenant', { policy: 'plan', cost: 94 })).remaining, 0, engine)
    clock.setUs(T0 + 2 * 3_600_000_000)
    d = await limiter.check('tenant', 'plan')
    assert.deepEqual([d.allowed, d.limitIndex], [false, 1], `${engine}: the day denies`)
  }
})
