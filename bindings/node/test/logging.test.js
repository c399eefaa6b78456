'use strict'
// The core's rate-limited warning lines in Node: every fallback reaches the `logger`
// option (console.warn by default) on the event loop, one line per policy per
// log_interval with the count suppressed since the last.
const test = require('node:test')
const assert = require('node:assert')
const { Limiter, ManualClock } = require('..')
const { freePort } = require('./support/redis.js')

const T0 = 1_700_000_000_000_000

async function deadConfig(extra = {}) {
  // nothing listens on the port: every check falls back to on_error
  const port = await freePort()
  return {
    timeout_ms: 300,
    shards: [{ name: 'dead', url: `redis://127.0.0.1:${port}` }],
    policies: { api: { rate: '10/minute', on_error: 'open' } },
    ...extra,
  }
}

// Collects (line, record) pairs; until(n) waits (bounded) for n lines of a kind.
function collector() {
  const got = []
  const waiters = []
  const logger = (line, record) => {
    got.push({ line, record })
    for (const w of waiters.splice(0)) w()
  }
  const until = async (pred, n) => {
    const deadline = Date.now() + 10_000
    while (got.filter(pred).length < n) {
      assert.ok(Date.now() < deadline, `no ${n} lines within 10 s: ${JSON.stringify(got)}`)
      await new Promise((resolve) => {
        waiters.push(resolve)
        setTimeout(resolve, 100).unref()
      })
    }
    return got.filter(pred)
  }
  return { logger, until, got }
}

const apiFallback = (g) => g.record.reason === 'fallback' && g.record.subject === 'api'

test('a thousand fallbacks are one line, then the next carries the count', async () => {
  const clock = new ManualClock(T0)
  const c = collector()
  const limiter = Limiter.fromJson(await deadConfig(), { clock, logger: c.logger })
  for (let i = 0; i < 1000; i++) {
    const d = await limiter.check('k', 'api')
    assert.ok(d.allowed)
  }
  const [first] = await c.until(apiFallback, 1)
  assert.strictEqual(first.record.suppressed, 0)
  assert.strictEqual(first.record.allowed, true)
  assert.strictEqual(first.record.level, 'warn')
  assert.strictEqual(first.record.target, 'shardlimit')
  assert.match(first.line, /policy `api` fell back to on_error and allowed/)
  assert.ok(['connection', 'unavailable', 'timeout'].includes(first.record.errorKind), first.record.errorKind)
  // the interval later on the limiter's clock: the next line says 999 were not written,
  // so no other fallback line came between the two
  clock.advanceUs(10_000_000)
  await limiter.check('k', 'api')
  const lines = await c.until(apiFallback, 2)
  assert.deepStrictEqual(lines.map((g) => g.record.suppressed), [0, 999])
  assert.match(lines[1].line, /\(999 more since the last line/)
  const [circuit] = await c.until((g) => g.record.reason === 'circuit_opened', 1)
  assert.strictEqual(circuit.record.subject, 'dead')
  limiter.close()
})

test('console.warn by default, an object logger, and null silences', async () => {
  const warned = []
  const original = console.warn
  console.warn = (...args) => warned.push(args)
  try {
    const limiter = Limiter.fromJson(await deadConfig())
    await limiter.check('k', 'api')
    const deadline = Date.now() + 10_000
    while (!warned.some((a) => /fell back to on_error/.test(a[0]))) {
      assert.ok(Date.now() < deadline, 'no console.warn line within 10 s')
      await new Promise((r) => setTimeout(r, 10))
    }
    // the line alone: one argument
    assert.strictEqual(warned.find((a) => /fell back/.test(a[0])).length, 1)
    limiter.close()
  } finally {
    console.warn = original
  }
  const c = collector()
  const obj = { warn: c.logger, error: () => assert.fail('not an error line') }
  const limiter = Limiter.fromJson(await deadConfig(), { logger: obj })
  await limiter.check('k', 'api')
  await c.until(apiFallback, 1)
  assert.throws(() => limiter.setLogSink(42), /logger/)
  limiter.close()
  const silent = Limiter.fromJson(await deadConfig(), { logger: null })
  assert.ok((await silent.check('k', 'api')).allowed)
  silent.close()
})

test('the interval comes from the config and every fallback is counted', async () => {
  const clock = new ManualClock(T0)
  const c = collector()
  const limiter = Limiter.fromJson(await deadConfig({ log_interval: '1ms' }), { clock, logger: c.logger })
  for (let i = 1; i <= 300; i++) {
    await limiter.check('k', 'api')
    if (i % 100 === 0) clock.advanceUs(2000)
  }
  clock.advanceUs(2000)
  await limiter.check('k', 'api')
  const lines = await c.until(apiFallback, 4)
  assert.strictEqual(lines.reduce((n, g) => n + 1 + g.record.suppressed, 0), 301)
  limiter.close()
})
