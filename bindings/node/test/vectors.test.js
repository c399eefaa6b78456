'use strict'
// tests/vectors/algorithms.json replayed exactly as core/tests/vectors.rs does: a fresh
// limiter per case with an injected clock, every check an acquire (leases named by
// lease_as), on both engines. Decisions must equal `expect` to the microsecond.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const { Limiter, ManualClock } = require('..')
const { startRedis } = require('./support/redis.js')

const doc = JSON.parse(
  fs.readFileSync(path.join(__dirname, '..', '..', '..', 'tests', 'vectors', 'algorithms.json'), 'utf8')
)
const us = (ms) => Math.round(ms * 1000)

async function replay(limiterFor) {
  let steps = 0
  for (const c of doc.cases) {
    const clock = new ManualClock(0)
    const limiter = await limiterFor(c, clock)
    const leases = new Map()
    for (const [i, step] of c.steps.entries()) {
      clock.setUs(step.t_us)
      const where = `${c.name}, step ${i}: ${JSON.stringify(step)}`
      if (step.op === 'release') {
        const released = await limiter.release(leases.get(step.lease))
        assert.equal(released, step.expect_released, where)
      } else {
        assert.equal(step.op, 'check', where)
        const { decision: d, lease } = await limiter.acquire(step.key, { policy: 'p', units: step.cost })
        if (step.lease_as !== undefined && lease) leases.set(step.lease_as, lease)
        const got = {
          allowed: d.allowed,
          remaining: d.remaining,
          reset_after_us: us(d.resetAfter),
          retry_after_us: d.retryAfter === null ? null : us(d.retryAfter),
          delay_us: us(d.delay),
        }
        assert.deepEqual(got, step.expect, where)
      }
      steps++
    }
  }
  return steps
}

test('the in-memory engine matches the vectors', async () => {
  const n = await replay((c, clock) => Limiter.fromJson({ policies: { p: c.policy } }, { clock }))
  assert.ok(n > 30, `replayed ${n} steps`)
})

test('the Redis engine matches the vectors', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  const n = await replay(async (c, clock) => {
    await redis.command('FLUSHALL') // a fresh key space per case
    const limiter = Limiter.fromJson(redis.config({ p: c.policy }), { clock })
    assert.equal(limiter.isRedis, true)
    return limiter
  })
  assert.ok(n > 30, `replayed ${n} steps`)
})
