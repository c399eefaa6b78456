'use strict'
// The JS surface on the in-memory engine: decisions, headers and body, errors and their
// codes, argument type checks, panics, versions and the ESM entry.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const sl = require('..')
const { Limiter, ManualClock, Decision } = sl

const T0 = 1_800_000_000_000_000
const config = {
  policies: {
    login: { algorithm: 'fixed_window', limit: 2, window: '1m' },
    shaper: { algorithm: 'leaky_bucket', capacity: 5, leak_per_sec: 10 },
  },
}

test('check: fields in ms, headers and the 429 body come from the core', async () => {
  const clock = new ManualClock(T0)
  const limiter = Limiter.fromJson(config, { clock })
  assert.equal(limiter.isRedis, false)
  assert.deepEqual(limiter.policies, ['login', 'shaper'])
  const a = await limiter.check('u1', { policy: 'login' })
  assert.ok(a instanceof Decision)
  assert.equal(a.allowed, true)
  assert.equal(a.limit, 2)
  assert.equal(a.remaining, 1)
  assert.equal(a.resetAfter, 60_000)
  assert.equal(a.retryAfter, null)
  assert.equal(a.delay, 0)
  assert.equal(a.policy, 'login')
  assert.equal(a.source, 'memory')
  assert.equal(a.shard, null)
  clock.advanceUs(500_000)
  await limiter.check('u1', 'login')
  const denied = await limiter.check('u1', { policy: 'login', cost: 1 })
  assert.equal(denied.allowed, false)
  assert.equal(denied.retryAfter, 59_500)
  // X-RateLimit-Reset: the Unix time of the reset (wall clock now + 59.5 s, rounded up),
  // the same in every language and middleware; RateLimit's t keeps delta seconds
  const h = denied.headers()
  const wall = Date.now() / 1000
  const reset = Number(h['X-RateLimit-Reset'])
  assert.ok(reset >= Math.floor(wall + 59.5) && reset <= Math.ceil(wall + 59.5) + 1, `${reset} vs ${wall}`)
  assert.deepEqual(h, {
    'X-RateLimit-Limit': '2',
    'X-RateLimit-Remaining': '0',
    'X-RateLimit-Reset': h['X-RateLimit-Reset'],
    'RateLimit-Policy': '"login";q=2;w=60',
    RateLimit: '"login";r=0;t=60',
    'Retry-After': '60',
  })
  assert.deepEqual(denied.body(), {
    error: 'rate_limited',
    policy: 'login',
    limit: 2,
    remaining: 0,
    retry_after: 60,
    message: 'Rate limit exceeded for policy "login": retry in 60 seconds.',
  })
  // a Decision serialises to its fields (the getters), durations in ms
  const fields = {
    allowed: false,
    limit: 2,
    remaining: 0,
    resetAfter: 59_500,
    retryAfter: 59_500,
    delay: 0,
    policy: 'login',
    source: 'memory',
    shard: null,
    layer: null,
    shadowDenied: false,
  }
  assert.deepEqual(JSON.parse(JSON.stringify(denied)), fields)
  assert.deepEqual(denied.toJSON(), fields)
  for (const name of Object.keys(fields)) assert.equal(denied[name], fields[name], name)
  // structuredClone (postMessage to a worker, caches) keeps every field too: they are own
  // properties (it was {} while they were getters of a native class)
  assert.deepEqual(structuredClone(denied), { ...fields, limitIndex: null, quotas: [] })
  assert.deepEqual(Object.keys(denied), [...Object.keys(fields), 'limitIndex', 'quotas'])
  // the clone is plain data; the original still renders through the core
  assert.equal(denied.headers()['Retry-After'], '60')
})

test('leaky bucket: delay in ms', async () => {
  const clock = new ManualClock(T0)
  const limiter = Limiter.fromJson(config, { clock })
  const first = await limiter.check('s', { policy: 'shaper' })
  const second = await limiter.check('s', { policy: 'shaper' })
  assert.equal(first.delay, 0)
  assert.equal(second.delay, 100)
})

test('peek, reset, acquire/release on the memory engine', async () => {
  const limiter = Limiter.fromJson({
    policies: {
      login: config.policies.login,
      jobs: { algorithm: 'concurrency', max: 1, lease_ttl: '10s' },
    },
  }, { clock: new ManualClock(T0) }) // (one window for the check and the peek after it)
  await limiter.check('k', { policy: 'login', cost: 2 })
  assert.equal((await limiter.peek('k', { policy: 'login' })).allowed, false)
  await limiter.reset('k', { policy: 'login' })
  assert.equal((await limiter.peek('k', 'login')).remaining, 2)
  const { decision, lease } = await limiter.acquire('t', { policy: 'jobs' })
  assert.equal(decision.allowed, true)
  assert.equal((await limiter.acquire('t', { policy: 'jobs' })).lease, null)
  assert.equal(await limiter.release(lease), true)
  assert.equal(await limiter.release(lease), false)
})

test('core errors reject with their subclass, code and the core message', async () => {
  const limiter = Limiter.fromJson(config)
  await assert.rejects(limiter.check('', { policy: 'login' }), (e) => {
    assert.ok(e instanceof sl.InvalidArgumentError)
    assert.equal(e.code, 'ERR_SHARDLIMIT_INVALID_ARGUMENT')
    assert.match(e.message, /`key`: must not be empty/)
    return true
  })
  await assert.rejects(limiter.check('k', { policy: 'login', cost: 0 }), { code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT' })
  await assert.rejects(limiter.check('x'.repeat(1025), 'login'), { code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT' })
  await assert.rejects(limiter.check('k', { policy: 'nope' }), (e) => {
    assert.ok(e instanceof sl.UnknownPolicyError)
    assert.ok(e instanceof sl.InvalidArgumentError)
    assert.equal(e.code, 'ERR_SHARDLIMIT_UNKNOWN_POLICY')
    assert.equal(e.message, 'unknown policy `nope`')
    return true
  })
})

test('bad configs throw ConfigError naming the field; missing files IoError', () => {
  assert.throws(
    () => Limiter.fromJson({ policies: { login: { algorithm: 'fixed_window', limit: 5, window: 'abc' } } }),
    (e) => e instanceof sl.ConfigError && e.code === 'ERR_SHARDLIMIT_CONFIG' && e.message.startsWith('policies.login.window:')
  )
  assert.throws(() => Limiter.fromJson('{not json'), { code: 'ERR_SHARDLIMIT_CONFIG' })
  assert.throws(() => Limiter.fromJson('{"shards":[{"name":"a","url":"http://x"}]}'), /shards\[0\]\.url/)
  assert.throws(() => Limiter.fromConfigFile('/nonexistent/shardlimit.json'), (e) => e instanceof sl.IoError && e.code === 'ERR_SHARDLIMIT_IO')
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'shardlimit-node-'))
  const file = path.join(dir, 'limits.json')
  fs.writeFileSync(file, JSON.stringify(config))
  assert.deepEqual(Limiter.fromConfigFile(file).policies, ['login', 'shaper'])
  assert.deepEqual(Limiter.fromConfig(file).policies, ['login', 'shaper']) // the earlier name
  fs.writeFileSync(file, '{"policies":{"a":{"algorithm":"magic"}}}')
  assert.throws(() => Limiter.fromConfigFile(file), (e) => e instanceof sl.ConfigError && e.message.includes('policies.a.algorithm'))
  fs.rmSync(dir, { recursive: true })
})

test('bad argument types: TypeError (or RangeError for impossible numbers)', async () => {
  const limiter = Limiter.fromJson(config)
  const typeErr = { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE' }
  await assert.rejects(limiter.check(42, { policy: 'login' }), typeErr)
  await assert.rejects(limiter.check('k'), typeErr)
  await assert.rejects(limiter.check('k', {}), typeErr)
  await assert.rejects(limiter.check('k', { policy: 7 }), typeErr)
  await assert.rejects(limiter.check('k', { policy: 'login', cost: '1' }), typeErr)
  await assert.rejects(limiter.check('k', { policy: 'login', cost: 1.5 }), { name: 'RangeError' })
  await assert.rejects(limiter.check('k', { policy: 'login', cost: -1 }), { name: 'RangeError' })
  await assert.rejects(limiter.peek(null, 'login'), typeErr)
  await assert.rejects(limiter.acquire('k', { policy: 'login', units: {} }), typeErr)
  await assert.rejects(limiter.release('lease'), typeErr)
  await assert.rejects(limiter.release({ key: 'k', policy: 'p', id: 1, units: 1 }), typeErr)
  await assert.rejects(limiter.reset(['k'], 'login'), typeErr)
  assert.throws(() => Limiter.fromJson(42), TypeError)
  assert.throws(() => Limiter.fromConfigFile(undefined), TypeError)
  assert.throws(() => Limiter.memory({ clock: Date }), TypeError)
  assert.throws(() => new Limiter({}), TypeError)
  assert.throws(() => limiter.route(1), TypeError)
  assert.throws(() => new ManualClock(-5), { code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT' })
})

test('a panic in the addon is an InternalError, and the process lives on', async () => {
  const { native } = require('../binding.js')
  assert.throws(() => native.panicForTest('boom'), (e) => {
    assert.ok(e instanceof sl.InternalError)
    assert.equal(e.code, 'ERR_SHARDLIMIT_INTERNAL')
    assert.match(e.message, /panic: boom/)
    return true
  })
  assert.equal((await Limiter.fromJson(config).check('after-panic', 'login')).allowed, true)
})

test('one version: package.json, the core, the crate', () => {
  const pkg = require('../package.json')
  assert.equal(pkg.version, sl.coreVersion())
  const cargo = fs.readFileSync(path.join(__dirname, '..', '..', '..', 'Cargo.toml'), 'utf8')
  assert.match(cargo, new RegExp(`\\[workspace\\.package\\][^\\[]*version = "${pkg.version.replace(/\./g, '\\.')}"`))
})

test('ESM: import works and is the same module', async () => {
  const esm = await import('shardlimit')
  assert.equal(esm.Limiter, Limiter)
  assert.equal(esm.default.Limiter, Limiter)
  assert.equal(esm.ERROR_CODES.ERR_SHARDLIMIT_CONFIG, sl.ConfigError)
})

test('with_clock is per limiter: two limiters, two clocks', async () => {
  const c1 = new ManualClock(T0)
  const c2 = new ManualClock(T0 + 59_000_000)
  assert.equal(c2.nowUs, T0 + 59_000_000)
  const l1 = Limiter.fromJson(config, { clock: c1 })
  const l2 = Limiter.fromJson(config, { clock: c2 })
  assert.equal((await l1.check('k', 'login')).resetAfter, 60_000)
  assert.equal((await l2.check('k', 'login')).resetAfter, 1_000)
})
