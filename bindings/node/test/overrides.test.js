'use strict'
// Live per-key overrides through the Node API: in memory on a manual clock, and two
// limiters on one real Redis (two processes): what one sets, the other's next check uses.

const test = require('node:test')
const assert = require('node:assert/strict')
const { Limiter, ManualClock } = require('..')
const { startRedis } = require('./support/redis')

const policies = {
  api: { algorithm: 'fixed_window', limit: 3, window: '1h', overrides: true },
  plain: { algorithm: 'fixed_window', limit: 3, window: '1h' },
}

test('memory engine: set, check, expire on the injected clock, errors', async () => {
  const clock = new ManualClock(1_000_000)
  const l = Limiter.fromJson({ policies }, { clock })
  assert.equal((await l.check('t', 'api')).limit, 3)
  const info = await l.setOverride('t', 'api', '10/hour', { ttl: 5000 })
  assert.deepEqual(info, {
    key: 't',
    policy: 'api',
    limit: { algorithm: 'fixed_window', limit: 10, window: '3600000ms' },
    remainingMs: 5000,
  })
  const d = await l.check('t', 'api')
  assert.equal(d.limit, 10)
  assert.equal(d.remaining, 8)
  clock.advanceUs(5_000_000)
  assert.equal((await l.check('t', 'api')).limit, 3)
  assert.equal(await l.getOverride('t', 'api'), null)
  // an object is a limit object
  await l.setOverride('t', 'api', { algorithm: 'token_bucket', capacity: 4, refill_per_sec: 1 })
  assert.equal((await l.check('t', 'api')).limit, 4)
  await assert.rejects(l.setOverride('t', 'plain', '5/minute'), (e) => e.code === 'ERR_SHARDLIMIT_INVALID_ARGUMENT' && /overrides/.test(e.message))
  await assert.rejects(l.setOverride('t', 'api', 'gold'), (e) => e.code === 'ERR_SHARDLIMIT_INVALID_ARGUMENT' && /nor a plan of the config/.test(e.message))
  await assert.rejects(l.setOverride('t', 'api', 5), TypeError)
  await assert.rejects(l.getOverride('t', 'nope'), (e) => e.code === 'ERR_SHARDLIMIT_UNKNOWN_POLICY')
  await assert.rejects(l.listOverrides('api', { limit: 0 }), TypeError)
})

test('two limiters on one Redis: the next check uses the other one\'s override', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  const config = redis.config(policies)
  const a = Limiter.fromJson(config)
  const b = Limiter.fromJson(config)
  assert.equal((await b.check('acme', 'api')).limit, 3)
  await a.setOverride('acme', 'api', '100/hour', { ttl: 3_600_000 })
  const d = await b.check('acme', 'api')
  assert.equal(d.limit, 100)
  assert.equal(d.remaining, 98)
  assert.equal(d.policy, 'api')
  const got = await b.getOverride('acme', 'api')
  assert.equal(got.limit.limit, 100)
  assert.ok(got.remainingMs > 0 && got.remainingMs <= 3_600_000)
  await a.setOverride('globex', 'api', '{"limit": 7, "window": "1h"}')
  const keys = []
  let cursor = null
  do {
    const page = await b.listOverrides('api', { cursor, limit: 1 })
    for (const o of page.overrides) keys.push(o.key)
    cursor = page.cursor
  } while (cursor !== null)
  assert.deepEqual(keys.sort(), ['acme', 'globex'])
  assert.equal(await a.deleteOverride('acme', 'api'), true)
  assert.equal(await a.deleteOverride('acme', 'api'), false)
  assert.equal((await b.check('acme', 'api')).limit, 3)
})

test('an override of several limits (rate string, plan name) reaches the core unchanged', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  const multi = { ...policies, multi: { rate: '2/second; 100/day', overrides: true } }
  const config = { ...redis.config(multi), plans: { pro: { api: '4/second; 5/day' } } }
  const a = Limiter.fromJson(config, { clock: new ManualClock(1_700_000_000_000_000) })
  const b = Limiter.fromJson(config, { clock: new ManualClock(1_700_000_000_000_000) })
  const info = await a.setOverride('t', 'multi', '3/second; 10/day')
  assert.deepEqual(info.limits.map((l) => l.limit), [3, 10])
  const allowed = []
  for (let i = 0; i < 4; i++) allowed.push((await b.check('t', 'multi')).allowed)
  assert.deepEqual(allowed, [true, true, true, false])
  const d = await b.check('t', 'multi')
  assert.equal(d.limit, 3)
  assert.deepEqual(d.quotas.map((q) => q.limit), [3, 10])
  await a.setOverride('u', 'api', 'pro')
  const pro = []
  for (let i = 0; i < 5; i++) pro.push((await b.check('u', 'api')).allowed)
  assert.deepEqual(pro, [true, true, true, true, false])
  const got = await b.getOverride('u', 'api')
  assert.deepEqual(got.limits.map((l) => l.limit), [4, 5])
})
