'use strict'
// The rest of the core's surface in Node: fromEnv, close, ad-hoc limits, policy and config
// introspection, metrics as an object, events, watchConfig, the in-memory engine with a
// manual clock. Redis parts use a real redis-server.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const sl = require('..')
const { Limiter, Limit, ManualClock, InvalidArgumentError, ConfigError } = sl
const { startRedis } = require('./support/redis.js')

const T0 = 1_800_000_000_000_000
let redis
test.before(async () => {
  redis = await startRedis()
})
test.after(() => redis.stop())

/** Resolves once `cond()` holds, checking every 10 ms; fails after `ms`. */
async function until(cond, ms, what) {
  const end = Date.now() + ms
  while (!(await cond())) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 10))
  }
}

async function connectedClients() {
  const info = await redis.command('INFO', 'clients')
  return Number(/connected_clients:(\d+)/.exec(info)[1])
}

test('fromEnv: SHARDLIMIT_CONFIG as inline JSON, as a path, and unset', async (t) => {
  const saved = process.env.SHARDLIMIT_CONFIG
  t.after(() => {
    if (saved === undefined) delete process.env.SHARDLIMIT_CONFIG
    else process.env.SHARDLIMIT_CONFIG = saved
  })
  process.env.SHARDLIMIT_CONFIG = JSON.stringify(redis.config({ api: { algorithm: 'fixed_window', limit: 1, window: '1m' } }))
  const fromJson = Limiter.fromEnv()
  assert.equal(fromJson.isRedis, true)
  assert.deepEqual(fromJson.policies, ['api'])
  fromJson.close()
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'shardlimit-env-'))
  t.after(() => fs.rmSync(dir, { recursive: true }))
  const file = path.join(dir, 'c.json')
  fs.writeFileSync(file, JSON.stringify({ policies: { files: { algorithm: 'fixed_window', limit: 1, window: '1m' } } }))
  process.env.SHARDLIMIT_CONFIG = file
  assert.deepEqual(Limiter.fromEnv().policies, ['files'])
  process.env.SHARDLIMIT_CONFIG = '{"policies": 5}'
  assert.throws(() => Limiter.fromEnv(), ConfigError)
  delete process.env.SHARDLIMIT_CONFIG
  assert.equal(Limiter.fromEnv().isRedis, false)
})

test('close: the connections go, later calls throw a clear error, calls in flight finish', async () => {
  const before = await connectedClients()
  const limiter = Limiter.fromJson(redis.config({ api: { algorithm: 'fixed_window', limit: 10, window: '1m' } }))
  assert.equal((await limiter.check('close:k', 'api')).allowed, true)
  assert.ok((await connectedClients()) > before)
  const inFlight = limiter.check('close:k', 'api')
  limiter.close()
  assert.equal((await inFlight).remaining, 8, 'a call made before close() finishes')
  await assert.rejects(limiter.check('close:k', 'api'), (e) => e instanceof InvalidArgumentError && /closed/.test(e.message))
  assert.throws(() => limiter.policies, /closed/)
  assert.throws(() => limiter.metrics(), /closed/)
  limiter.close() // idempotent
  await until(async () => (await connectedClients()) === before, 5000, 'the connections to close')
})

test('ad-hoc limits: validated once, named by the caller, counted in metrics', async () => {
  const clock = new ManualClock(T0)
  const limiter = Limiter.memory({ clock })
  const burst = new Limit({ algorithm: 'fixed_window', limit: 2, window: '10s' }, { name: 'burst' })
  assert.equal(burst.name, 'burst')
  assert.equal(burst.algorithm, 'fixed_window')
  assert.deepEqual(burst.info(), { name: 'burst', algorithm: 'fixed_window', max: 2, onError: 'open', params: { limit: 2, windowMs: 10_000 } })
  const a = await limiter.check('u', { limit: burst })
  assert.equal(a.policy, 'burst')
  assert.equal(a.remaining, 1)
  assert.equal(a.headers()['RateLimit-Policy'], '"burst";q=2;w=10')
  assert.equal((await limiter.check('u', { limit: burst, cost: 2 })).allowed, false)
  // a spec is accepted too; unnamed, it is named after its parameters
  const spec = await limiter.check('u', { limit: { algorithm: 'token_bucket', capacity: 3, refill_per_sec: 1 } })
  assert.equal(spec.policy, 'token_bucket-3-1ps')
  clock.advanceUs(10_000_000)
  assert.equal((await limiter.peek('u', { limit: burst })).remaining, 2)
  // concurrency: acquire and release with the limit
  const slots = new Limit({ algorithm: 'concurrency', max: 1, lease_ttl: '30s' }, { name: 'slots' })
  const { lease } = await limiter.acquire('job', { limit: slots })
  assert.equal((await limiter.acquire('job', { limit: slots })).lease, null)
  assert.equal(await limiter.release(lease, { limit: slots }), true)
  assert.ok((await limiter.acquire('job', { limit: slots })).lease)
  const m = limiter.metricsSnapshot().policies.find((p) => p.policy === 'burst')
  assert.deepEqual(m, { policy: 'burst', allowed: 1, denied: 1, fallback: 0, blocked: 0, localAdmitted: 0, redisErrors: 0, shadowDenied: 0, nearLimit: 0 })
  assert.match(limiter.metrics(), /policy="burst"/)
  // mistakes surface when the limit is built, naming the field
  assert.throws(() => new Limit({ algorithm: 'fixed_window', limit: 0, window: '1m' }), (e) => e instanceof ConfigError && e.message.startsWith('limit.limit:'))
  assert.throws(() => new Limit({ algorithm: 'nope' }), (e) => e instanceof ConfigError && e.message.startsWith('limit.algorithm'))
  assert.throws(() => new Limit({ algorithm: 'fixed_window', limit: 1, window: '1m' }, { name: 'a b' }), (e) => e instanceof ConfigError && e.message.startsWith('limit.name:'))
  // a rate string is a spec too; anything but a string or an object is not
  assert.equal(new Limit('5/minute').name, 'fixed_window-5-60000ms')
  assert.throws(() => new Limit(5), TypeError)
  await assert.rejects(limiter.check('u', { limit: burst, policy: 'x' }), TypeError)
})

test('policy, config, memoryKeys', () => {
  const limiter = Limiter.fromJson(
    redis.config({ api: { algorithm: 'leaky_bucket', capacity: 4, leak_per_sec: 2, on_error: 'closed' } }, { timeout_ms: 120 })
  )
  assert.deepEqual(limiter.policy('api'), { name: 'api', algorithm: 'leaky_bucket', max: 4, onError: 'closed', params: { capacity: 4, leakPerSec: 2 } })
  const c = limiter.config
  assert.equal(c.engine, 'redis')
  assert.deepEqual(c.shards, ['s0'])
  assert.equal(c.timeoutMs, 120)
  assert.equal(c.policies.length, 1)
  assert.ok(!JSON.stringify(c).includes('redis://'), 'no shard URL (a URL may carry a password)')
  assert.equal(limiter.memoryKeys, null)
  const mem = Limiter.memory()
  assert.equal(mem.memoryKeys, 0)
  limiter.close()
})

test('subscribe: denials arrive as events on the event loop', async () => {
  const limiter = Limiter.fromJson(redis.config({ tiny: { algorithm: 'fixed_window', limit: 1, window: '1m' } }))
  const events = []
  let arrived
  const got = new Promise((r) => (arrived = r))
  limiter.subscribe((e) => {
    // (the first check also crosses the default near_limit of 0.8: a near_limit event)
    if (e.kind !== 'denied') return
    events.push(e)
    arrived()
  })
  assert.throws(() => limiter.subscribe('nope'), TypeError)
  await limiter.check('ev:k', 'tiny')
  assert.equal((await limiter.check('ev:k', 'tiny')).allowed, false)
  await got
  assert.equal(events.length, 1)
  assert.equal(events[0].kind, 'denied')
  assert.equal(events[0].policy, 'tiny')
  assert.equal(events[0].key, 'ev:k')
  assert.equal(events[0].limit, '1')
  assert.match(events[0].retryAfterMs, /^\d+$/)
  limiter.close()
})

test('watchConfig: a changed file is applied, a bad one ignored, close() stops it', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'shardlimit-watch-'))
  t.after(() => fs.rmSync(dir, { recursive: true }))
  const file = path.join(dir, 'c.json')
  const write = (policies, mtimeS) => {
    fs.writeFileSync(file, typeof policies === 'string' ? policies : JSON.stringify({ policies }))
    fs.utimesSync(file, mtimeS, mtimeS) // a distinct mtime whatever the file system's granularity
  }
  const p = (limit) => ({ algorithm: 'fixed_window', limit, window: '1m' })
  write({ a: p(1) }, 1000)
  const limiter = Limiter.fromConfigFile(file)
  const watcher = limiter.watchConfig(file, { intervalMs: 10 })
  write({ a: p(1), b: p(2) }, 2000)
  await until(() => limiter.policies.includes('b'), 5000, 'the reload')
  write('{"policies": {"c": {"algorithm": "magic"}}}', 3000)
  write({ a: p(1), b: p(2), d: p(3) }, 4000)
  await until(() => limiter.policies.includes('d'), 5000, 'the next good file')
  assert.equal(limiter.policies.includes('c'), false)
  watcher.close()
  assert.throws(() => limiter.watchConfig(file, { intervalMs: 0 }), TypeError)
})

test('connect: connections and scripts at start-up, within its own timeout', async (t) => {
  await Limiter.memory().connect() // nothing to connect: resolves
  const own = await startRedis()
  t.after(() => own.stop())
  const l = Limiter.fromJson(own.config({ p: { algorithm: 'fixed_window', limit: 5, window: '1m' } }))
  t.after(() => l.close())
  const info = async () => Number(/connected_clients:(\d+)/.exec(await own.command('INFO', 'clients'))[1])
  const before = await info()
  await l.connect({ timeoutMs: 2000 })
  assert.ok((await info()) > before, 'connect made the connections')
  const scripts = await own.command('INFO', 'memory')
  assert.match(scripts, /number_of_cached_scripts:[1-9]/, 'connect loaded the scripts')
  await assert.rejects(l.connect({ timeoutMs: 0 }), InvalidArgumentError)
  await assert.rejects(l.connect({ timeoutMs: 'soon' }), TypeError)
  // a shard that does not answer: the connect's own timeout, named in the error
  const frozen = await startRedis()
  process.kill(frozen.pid, 'SIGSTOP')
  t.after(() => {
    process.kill(frozen.pid, 'SIGCONT')
    return frozen.stop()
  })
  const f = Limiter.fromJson(frozen.config({}, { timeout_ms: 50 }))
  t.after(() => f.close())
  await assert.rejects(f.connect({ timeoutMs: 300 }), (e) => e.code === 'ERR_SHARDLIMIT_TIMEOUT' && /300 ms/.test(e.message))
})
