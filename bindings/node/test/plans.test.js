'use strict'
// Multi-limit policies, plans and rate strings from Node: the core decides (one script
// call per check on Redis), the addon converts; headers are the core's.

const test = require('node:test')
const assert = require('node:assert/strict')
const { Limiter, Limit, ManualClock } = require('..')
const { startRedis } = require('./support/redis.js')

const T0 = 1_700_006_400_000_000 // the start of a day (UTC), in µs
let redis
test.before(async () => {
  redis = await startRedis()
})
test.after(() => redis.stop())

const policies = {
  api: '2/second; 3/minute',
  login: { algorithm: 'sliding_log', rate: '5/minute', on_error: 'closed' },
}
const plans = { pro: { api: { limits: ['10/second', '100/minute'] } } }

for (const engine of ['memory', 'redis']) {
  test(`multi-limit policies and plans (${engine})`, async () => {
    const clock = new ManualClock(T0)
    const cfg = engine === 'redis' ? redis.config(policies, { plans }) : { policies, plans }
    const limiter = Limiter.fromJson(cfg, { clock })
    let d = await limiter.check('u', { policy: 'api', cost: 2 })
    assert.equal(d.allowed, true)
    assert.equal(d.limitIndex, 0)
    assert.deepEqual(d.quotas, [{ limit: 2, windowMs: 1000 }, { limit: 3, windowMs: 60000 }])
    assert.equal(d.headers()['RateLimit-Policy'], '"api";q=2;w=1, "api#1";q=3;w=60')
    clock.setUs(T0 + 1_000_000)
    d = await limiter.check('u', { policy: 'api', cost: 2 })
    // the minute denies, and nothing was taken from the second
    assert.equal(d.allowed, false)
    assert.equal(d.limitIndex, 1)
    assert.equal(d.headers().RateLimit, '"api#1";r=1;t=59')
    assert.equal(JSON.parse(JSON.stringify(d)).limitIndex, 1)
    assert.equal((await limiter.peek('u', 'api')).remaining, 1)
    // under a plan: the same name, so the same keys and headers
    d = await limiter.check('u', { policy: 'api', plan: 'pro', cost: 2 })
    assert.equal(d.allowed, true)
    assert.equal(d.policy, 'api')
    assert.deepEqual(d.quotas.map((q) => q.limit), [10, 100])
    d = await limiter.peek('u', { policy: 'api', plan: 'pro' })
    assert.equal(d.remaining, 8)
    const info = limiter.planPolicy('pro', 'api')
    assert.equal(info.name, 'api')
    assert.deepEqual(info.limits.map((l) => l.params.limit), [10, 100])
    assert.equal(limiter.policy('login').algorithm, 'sliding_log')
    assert.equal(limiter.policy('login').limits, undefined)
    await assert.rejects(limiter.check('u', { policy: 'api', plan: 'gold' }), (e) => e.kind === 'invalid_argument' && /gold/.test(e.message))
    assert.throws(() => limiter.planPolicy('pro', 'nope'), (e) => e.kind === 'unknown_policy')
    // ad-hoc rate strings: one limit or several
    const adhoc = new Limit('1/second; 2/minute')
    assert.equal((await limiter.check('a', { limit: adhoc })).limitIndex, 0)
    clock.setUs(T0 + 2_000_000)
    assert.equal((await limiter.check('a', { limit: adhoc })).allowed, true)
    clock.setUs(T0 + 3_000_000)
    d = await limiter.check('a', { limit: adhoc })
    assert.equal(d.allowed, false)
    assert.equal(d.limitIndex, 1)
    d = await limiter.check('b', { limit: '3/minute', cost: 3 })
    assert.equal(d.remaining, 0)
    assert.throws(() => new Limit('5/fortnight'), (e) => e.kind === 'config' && /fortnight/.test(e.message))
  })
}

test('config errors name the field', () => {
  assert.throws(() => Limiter.fromJson({ policies: { login: '5/fortnight' } }), (e) => e.kind === 'config' && /policies\.login: .*fortnight/.test(e.message))
  assert.throws(() => Limiter.fromJson({ policies, plans: { free: { upload: '1/second' } } }), (e) => /plans\.free\.upload: no policy/.test(e.message))
})
