'use strict'
// The Redis engine through the Node API: exact admission under concurrency, leases,
// reset/peek, routing, and what a dead shard looks like.

const test = require('node:test')
const assert = require('node:assert/strict')
const { Limiter, ManualClock, ShardlimitError } = require('..')
const { startRedis, freePort } = require('./support/redis.js')

let redis
test.before(async () => {
  redis = await startRedis()
})
test.after(() => redis.stop())

const T0 = 1_800_000_000_000_000

for (const [name, policy, limit] of [
  ['fixed_window', { algorithm: 'fixed_window', limit: 37, window: '1h' }, 37],
  ['sliding_log', { algorithm: 'sliding_log', limit: 37, window: '1h' }, 37],
  ['token_bucket', { algorithm: 'token_bucket', capacity: 37, refill_per_sec: 0.001 }, 37],
]) {
  test(`${name}: 64 concurrent checks on one key admit exactly the limit`, async () => {
    const clock = new ManualClock(T0) // one instant: no refill, no window edge
    const limiter = Limiter.fromJson(redis.config({ p: policy }), { clock })
    const key = `concurrent-${name}`
    const decisions = await Promise.all(Array.from({ length: 64 }, () => limiter.check(key, { policy: 'p' })))
    const allowed = decisions.filter((d) => d.allowed)
    assert.equal(allowed.length, limit)
    // every admitted check saw a distinct budget: the scripts are atomic
    assert.deepEqual(
      allowed.map((d) => d.remaining).sort((a, b) => a - b),
      Array.from({ length: limit }, (_, i) => i)
    )
    for (const d of decisions) {
      assert.equal(d.source, 'redis')
      assert.equal(d.shard, 0)
      assert.equal(d.limit, limit)
    }
    const denied = decisions.filter((d) => !d.allowed)
    assert.equal(denied.length, 64 - limit)
    for (const d of denied) assert.ok(d.retryAfter > 0)
    const after = await limiter.peek(key, { policy: 'p' })
    assert.equal(after.allowed, false)
    assert.equal(after.remaining, 0)
  })
}

test('weighted cost, peek and reset on Redis with the server clock', async () => {
  const limiter = Limiter.fromJson(redis.config({ api: { algorithm: 'sliding_log', limit: 10, window: '1h' } }))
  const key = 'weighted'
  let d = await limiter.check(key, { policy: 'api', cost: 7 })
  assert.equal(d.allowed, true)
  assert.equal(d.remaining, 3)
  d = await limiter.check(key, { policy: 'api', cost: 4 })
  assert.equal(d.allowed, false, 'a denied check consumes nothing')
  assert.equal((await limiter.peek(key, 'api')).remaining, 3)
  d = await limiter.check(key, { policy: 'api', cost: 11 })
  assert.equal(d.allowed, false)
  assert.equal(d.retryAfter, null, 'a cost above the limit can never fit')
  assert.equal(d.body().retry_after, null)
  await limiter.reset(key, { policy: 'api' })
  assert.equal((await limiter.peek(key, 'api')).remaining, 10)
})

test('concurrency leases: acquire, deny at max, release, release twice', async () => {
  const limiter = Limiter.fromJson(redis.config({ jobs: { algorithm: 'concurrency', max: 2, lease_ttl: '1m' } }))
  const a = await limiter.acquire('tenant', { policy: 'jobs' })
  const b = await limiter.acquire('tenant', { policy: 'jobs' })
  const c = await limiter.acquire('tenant', { policy: 'jobs' })
  assert.equal(a.decision.allowed, true)
  assert.equal(b.decision.allowed, true)
  assert.equal(c.decision.allowed, false)
  assert.equal(c.lease, null)
  assert.deepEqual(Object.keys(a.lease).sort(), ['id', 'key', 'policy', 'units'])
  // a lease is plain data: it survives a JSON round trip (e.g. to another worker)
  assert.equal(await limiter.release(JSON.parse(JSON.stringify(a.lease))), true)
  assert.equal(await limiter.release(a.lease), false)
  assert.equal((await limiter.acquire('tenant', { policy: 'jobs' })).decision.allowed, true)
})

test('keys route like the core says', async () => {
  const limiter = Limiter.fromJson(redis.config({}))
  assert.deepEqual(limiter.route('user:{42}:x'), { index: 0, name: 's0' })
  assert.equal(Limiter.memory().route('x'), null)
})

test('a dead shard: a clear backend error, or the on_error fallback', async () => {
  const port = await freePort() // nothing listens here
  const limiter = Limiter.fromJson({
    timeout_ms: 500,
    shards: [{ name: 'dead', url: `redis://127.0.0.1:${port}` }],
    policies: { p: { algorithm: 'fixed_window', limit: 5, window: '1m', on_error: 'closed' } },
  })
  let outcome
  try {
    outcome = await limiter.check('k', { policy: 'p' })
  } catch (e) {
    outcome = e
  }
  if (outcome instanceof ShardlimitError) {
    assert.ok(['ERR_SHARDLIMIT_CONNECTION', 'ERR_SHARDLIMIT_TIMEOUT'].includes(outcome.code), outcome.code)
    assert.equal(outcome.isBackend, true)
    assert.match(outcome.message, /dead/)
  } else {
    // the core applied the policy's on_error: closed
    assert.equal(outcome.source, 'fallback')
    assert.equal(outcome.allowed, false)
  }
})
