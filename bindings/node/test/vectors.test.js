'use strict'
// The decision vectors of tests/vectors (format: the top of algorithms.json) replayed as
// core/tests/vectors.rs does: every case on a fresh limiter with a ManualClock set to each
// step's t_us, every op of every file (check, peek, acquire, release, reset, check_all,
// batch; charge, refund, reserve, settle; shadow checks and shadowReport; setOverride,
// deleteOverride), on both engines. Decisions must equal the vectors to the microsecond.
// Every file of tests/vectors is replayed here, replayed by the test named in OTHER_FILES,
// or skipped with a reason (SKIPPED_FILES).

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const { Limiter, ManualClock } = require('..')
const { startRedis } = require('./support/redis.js')

const VECTORS = path.join(__dirname, '..', '..', '..', 'tests', 'vectors')
// every file of decision vectors, replayed in full
const FILES = ['algorithms.json', 'plans.json', 'precision.json', 'settle.json', 'shadow.json', 'overrides.json']
// the other files of tests/vectors, and the test that replays each
const OTHER_FILES = { 'keys.json': 'keys.test.js', 'routing.json': 'this file: the routing contract' }
// files no Node test replays, with the reason (none today)
const SKIPPED_FILES = {}
const cases = FILES.flatMap((f) =>
  JSON.parse(fs.readFileSync(path.join(VECTORS, f), 'utf8')).cases.map((c) => ({ file: f, ...c }))
)
const OPS = ['check', 'peek', 'acquire', 'release', 'reset', 'check_all', 'batch', 'charge', 'refund', 'reserve', 'settle', 'shadow_report', 'set_override', 'delete_override']
const totalSteps = cases.reduce((n, c) => n + c.steps.length, 0)
const us = (ms) => Math.round(ms * 1000)

function observed(d) {
  return {
    allowed: d.allowed,
    limit: d.limit,
    remaining: d.remaining,
    reset_after_us: us(d.resetAfter),
    retry_after_us: d.retryAfter === null ? null : us(d.retryAfter),
    delay_us: us(d.delay),
    policy: d.policy,
    layer: d.layer,
    // multi-limit policies (plans.json): which limit decided, and every window
    ...(d.limitIndex === null ? {} : { limit_index: d.limitIndex, rate_limit_policy: d.headers()['RateLimit-Policy'] }),
    // shadow.json: written only when true
    ...(d.shadowDenied ? { shadow_denied: true } : {}),
  }
}

// one check, peek or acquire: { decision, lease }
async function call(limiter, item) {
  switch (item.op) {
    case 'check':
      return { decision: await limiter.check(item.key, { policy: item.policy, plan: item.plan, cost: item.cost, shadow: item.shadow }), lease: null }
    case 'peek':
      return { decision: await limiter.peek(item.key, { policy: item.policy, plan: item.plan }), lease: null }
    case 'acquire':
      return limiter.acquire(item.key, { policy: item.policy, units: item.units })
    default:
      throw new Error(`op ${JSON.stringify(item.op)} cannot be a check or a batch item`)
  }
}

// A finding, not a skip: charge, refund and reserve take a policy name (ChargeOptions has
// no plan), so a step under a plan cannot be expressed in Node; no vector has one today.
function noPlan(step, where) {
  assert.equal(step.plan, undefined, `${where}: Node cannot ${step.op} under a plan (ChargeOptions takes a policy name only)`)
}

async function replay(limiterFor, source) {
  let steps = 0
  for (const c of cases) {
    const clock = new ManualClock(0)
    const limiter = await limiterFor(c, clock)
    const leases = new Map()
    const reservations = new Map()
    const decided = (item, { decision: d, lease }, where) => {
      assert.equal(d.source, source, where)
      assert.deepEqual(observed(d), item.expect, where)
      if (item.lease_as !== undefined) {
        assert.ok(lease, `${where}: no lease`)
        leases.set(item.lease_as, lease)
      }
    }
    for (const [i, step] of c.steps.entries()) {
      clock.setUs(step.t_us)
      const where = `${c.file}: ${c.name}, step ${i}: ${JSON.stringify(step)}`
      assert.ok(OPS.includes(step.op), `${where}: unknown op ${step.op}`)
      switch (step.op) {
        case 'batch':
          // one after another: calls made together (Promise.all) have no order, and the
          // items' decisions depend on it (core/tests/vectors.rs sends them together)
          for (const [j, item] of step.items.entries()) {
            decided(item, await call(limiter, item), `${where}, item ${j}`)
          }
          break
        case 'release': {
          assert.ok(leases.has(step.lease), `${where}: no lease ${step.lease} was taken`)
          assert.equal(await limiter.release(leases.get(step.lease)), step.expect_released, where)
          break
        }
        case 'reset':
          await limiter.reset(step.key, step.policy)
          break
        case 'charge':
        case 'refund':
          noPlan(step, where)
          decided(step, { decision: await limiter[step.op](step.key, { policy: step.policy, cost: step.cost }), lease: null }, where)
          break
        case 'reserve': {
          noPlan(step, where)
          const { decision, reservation } = await limiter.reserve(step.key, { policy: step.policy, cost: step.cost })
          decided(step, { decision, lease: null }, where)
          if (step.reserve_as !== undefined) {
            assert.ok(reservation, `${where}: no reservation`)
            reservations.set(step.reserve_as, reservation)
          }
          break
        }
        case 'settle':
          assert.ok(reservations.has(step.reservation), `${where}: no reservation ${step.reservation}`)
          decided(step, { decision: await limiter.settle(reservations.get(step.reservation), step.actual), lease: null }, where)
          break
        case 'shadow_report': {
          const report = await limiter.shadowReport(step.policy, step.top === undefined ? {} : { top: step.top })
          assert.deepEqual(report, step.expect_report, where)
          break
        }
        case 'set_override':
          await limiter.setOverride(step.key, step.policy, step.limit, step.ttl_ms === undefined ? {} : { ttl: step.ttl_ms })
          break
        case 'delete_override':
          assert.equal(await limiter.deleteOverride(step.key, step.policy), step.expect_deleted, where)
          break
        case 'check_all': {
          const layers = step.layers.map((l) => ({ key: l.key, policy: l.policy, cost: l.cost }))
          decided(step, { decision: await limiter.checkAll(layers), lease: null }, where)
          break
        }
        default:
          decided(step, await call(limiter, step), where)
      }
      steps++
    }
  }
  return steps
}

// a case's config beside its policies (plans.json)
const extra = (c) => ({ plans: c.plans, default_algorithm: c.default_algorithm })

test('the vectors hold every op on every algorithm', () => {
  const ops = new Set(cases.flatMap((c) => c.steps.map((s) => s.op)))
  assert.deepEqual([...ops].sort(), [...OPS].sort())
  const algorithms = new Set(cases.filter((c) => c.file === 'algorithms.json').flatMap((c) => Object.values(c.policies).map((p) => p.algorithm)))
  assert.equal(algorithms.size, 6)
  assert.ok(totalSteps > 100, `${totalSteps} steps`)
})

test('every file of tests/vectors is replayed or skipped with a reason', () => {
  const present = fs.readdirSync(VECTORS).filter((f) => f.endsWith('.json')).sort()
  const known = [...FILES, ...Object.keys(OTHER_FILES), ...Object.keys(SKIPPED_FILES)].sort()
  assert.deepEqual(present, known, 'a vector file neither replayed by Node nor skipped with a reason (or one listed that is gone)')
  for (const why of Object.values(SKIPPED_FILES)) assert.ok(why, 'a skip without a reason')
  assert.ok(fs.existsSync(path.join(VECTORS, 'README.md')), 'tests/vectors/README.md documents the step formats')
})

test('the routing contract: every case of routing.json among 1 to 16 shards', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  const doc = JSON.parse(fs.readFileSync(path.join(VECTORS, 'routing.json'), 'utf8'))
  assert.ok(doc.cases.length > 0)
  const base = redis.config({})
  for (let n = 1; n <= 16; n++) {
    const shards = Array.from({ length: n }, (_, i) => ({ ...base.shards[0], name: `s${i}` }))
    const limiter = Limiter.fromJson({ ...base, shards })
    for (const c of doc.cases) {
      const want = c.shard_for[n - 1]
      assert.deepEqual(limiter.route(c.key), { index: want, name: `s${want}` }, `${JSON.stringify(c.key)} among ${n} shards`)
    }
  }
})

test('the in-memory engine matches the vectors', async () => {
  const n = await replay((c, clock) => Limiter.fromJson({ policies: c.policies, ...extra(c) }, { clock }), 'memory')
  assert.equal(n, totalSteps)
})

test('the Redis engine matches the vectors', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  const n = await replay(async (c, clock) => {
    await redis.command('FLUSHALL') // a fresh key space per case
    const limiter = Limiter.fromJson(redis.config(c.policies, extra(c)), { clock })
    assert.equal(limiter.isRedis, true)
    return limiter
  }, 'redis')
  assert.equal(n, totalSteps)
})

// precision.json's offsets (the per-key window offset function) through decisions: at a
// multiple of the window, a per_key fixed window of window_us resets for the key in exactly
// offset_us (a whole window when the offset is 0), on both engines.
test('the window offsets of precision.json', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  const { offsets } = JSON.parse(fs.readFileSync(path.join(VECTORS, 'precision.json'), 'utf8'))
  assert.ok(offsets.length >= 64)
  const policies = Object.fromEntries(
    offsets.map((o) => [`w${o.window_us}`, { algorithm: 'fixed_window', limit: 1, window: `${o.window_us}us`, window_offset: 'per_key' }])
  )
  for (const cfg of [{ policies }, redis.config(policies, { key_prefix: 'offsets:' })]) {
    const clock = new ManualClock(0)
    const limiter = Limiter.fromJson(cfg, { clock })
    for (const o of offsets) {
      const w = BigInt(o.window_us)
      clock.setUs(Number((1_700_000_000_000_000n / w + 1n) * w)) // the first multiple of w after 1.7e15
      const d = await limiter.check(o.key, { policy: `w${o.window_us}` })
      assert.equal(d.allowed, true, JSON.stringify(o))
      assert.equal(us(d.resetAfter), o.offset_us || o.window_us, JSON.stringify(o))
    }
  }
})
