'use strict'
// The middleware as HTTP clients see it: real Express and Fastify apps on 127.0.0.1, real
// Redis, real requests. Route-level limits, skip, custom handlers, one header set, header
// options, a leaky bucket's delay, concurrency leases given back when the response ends,
// and outages (SIGSTOP on the Redis process) answered 503, never 429.

const test = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const express = require('express')
const Fastify = require('fastify')
const sl = require('..')
const { Limiter, ManualClock, expressMiddleware, fastifyHook, fastifyPlugin } = sl
const { startRedis } = require('./support/redis.js')

const T0 = 1_800_000_000_000_000
let redis
test.before(async () => {
  redis = await startRedis()
})
test.after(() => redis.stop())

let prefix = 0
/** A limiter on the shared Redis with its own key prefix, its clock 40 s before a minute ends. */
function limiterFor(policies, extra = {}) {
  const clock = new ManualClock(T0 + 20_000_000)
  return Limiter.fromJson(redis.config(policies, { key_prefix: `t${++prefix}:`, ...extra }), { clock })
}

async function serveExpress(t, build) {
  const app = express()
  build(app)
  const server = http.createServer(app)
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  t.after(() => new Promise((r) => server.close(r)))
  return server.address().port
}

async function serveFastify(t, build) {
  const app = Fastify()
  await build(app)
  await app.listen({ port: 0, host: '127.0.0.1' })
  t.after(() => app.close())
  return app.server.address().port
}

/** One request on a fresh connection; `raw` keeps every header line (to count duplicates). */
function request(port, path, { method = 'GET', headers = {}, signal } = {}) {
  return new Promise((resolve, reject) => {
    const started = Date.now()
    const req = http.request({ host: '127.0.0.1', port, path, method, headers, agent: false, signal }, (res) => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (d) => (text += d))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, raw: res.rawHeaders, text, ms: Date.now() - started }))
    })
    req.on('error', reject)
    req.end()
  })
}

const statuses = async (port, path, n, opts) => {
  const out = []
  for (let i = 0; i < n; i++) out.push((await request(port, path, opts)).status)
  return out
}

/** How many times a header appears in a response (case-insensitive). */
const count = (r, name) => r.raw.filter((v, i) => i % 2 === 0 && v.toLowerCase() === name.toLowerCase()).length

test('Express per-route: an ad-hoc limit on one route, keyGenerator, skip, other routes untouched', async (t) => {
  const limiter = limiterFor({})
  const login = expressMiddleware(limiter, {
    limit: 2,
    windowMs: 60_000,
    name: 'login',
    keyGenerator: (req) => `user:${req.get('x-user')}`,
    skip: (req) => req.get('x-internal') === '1',
  })
  const port = await serveExpress(t, (app) => {
    app.post('/login', login, (req, res) => res.json(req.rateLimit ? { policy: req.rateLimit.policy, remaining: req.rateLimit.remaining } : { skipped: true }))
    app.get('/other', (req, res) => res.send('other'))
  })
  const alice = { method: 'POST', headers: { 'x-user': 'alice' } }
  const first = await request(port, '/login', alice)
  assert.deepEqual(JSON.parse(first.text), { policy: 'login', remaining: 1 })
  assert.equal(first.headers['ratelimit-policy'], '"login";q=2;w=60')
  assert.deepEqual([200, ...(await statuses(port, '/login', 2, alice))], [200, 200, 429])
  assert.equal((await request(port, '/login', { method: 'POST', headers: { 'x-user': 'bob' } })).status, 200)
  // skipped: not limited, no headers
  const internal = await request(port, '/login', { method: 'POST', headers: { 'x-user': 'alice', 'x-internal': '1' } })
  assert.deepEqual([internal.status, JSON.parse(internal.text)], [200, { skipped: true }])
  assert.equal(internal.headers['x-ratelimit-limit'], undefined)
  const other = await request(port, '/other')
  assert.equal(other.status, 200)
  assert.equal(other.headers['x-ratelimit-limit'], undefined)
})

test('Express and Fastify: async keyGenerator, skip and cost', async (t) => {
  const limiter = limiterFor({ api: { algorithm: 'fixed_window', limit: 3, window: '1m' } })
  const opts = {
    policy: 'api',
    keyGenerator: async (req) => `async:${req.headers['x-user']}`,
    skip: async (req) => req.headers['x-user'] === 'root',
    cost: async () => 2,
  }
  const port = await serveExpress(t, (app) => {
    app.get('/', expressMiddleware(limiter, opts), (req, res) => res.send(String(req.rateLimit ? req.rateLimit.remaining : 'skipped')))
  })
  const fport = await serveFastify(t, async (app) => {
    app.get('/', { onRequest: fastifyHook(limiter, { ...opts, keyGenerator: async (req) => `fasync:${req.headers['x-user']}` }) }, async (request) =>
      String(request.rateLimit ? request.rateLimit.remaining : 'skipped')
    )
  })
  for (const p of [port, fport]) {
    const a = await request(p, '/', { headers: { 'x-user': 'u' } })
    assert.deepEqual([a.status, a.text], [200, '1'])
    assert.equal((await request(p, '/', { headers: { 'x-user': 'u' } })).status, 429)
    const root = await request(p, '/', { headers: { 'x-user': 'root' } })
    assert.deepEqual([root.status, root.text], [200, 'skipped'])
  }
})

test('Express: two limiters on one route, one set of headers (the tightest)', async (t) => {
  const limiter = limiterFor({ api: { algorithm: 'fixed_window', limit: 10, window: '1m' } })
  const port = await serveExpress(t, (app) => {
    app.use(expressMiddleware(limiter, { policy: 'api', key: () => 'k' }))
    app.get('/strict', expressMiddleware(limiter, { limit: 2, name: 'strict', key: () => 'k' }), (req, res) => res.send(req.rateLimit.policy))
    app.get('/loose', (req, res) => res.send(req.rateLimit.policy))
  })
  const r = await request(port, '/strict')
  assert.equal(r.text, 'strict')
  for (const h of ['x-ratelimit-limit', 'x-ratelimit-remaining', 'x-ratelimit-reset', 'ratelimit', 'ratelimit-policy']) {
    assert.equal(count(r, h), 1, h)
  }
  assert.equal(r.headers['x-ratelimit-limit'], '2')
  assert.equal(r.headers['ratelimit'], '"strict";r=1;t=40')
  const loose = await request(port, '/loose')
  assert.equal(loose.text, 'api')
  assert.equal(loose.headers['x-ratelimit-limit'], '10')
  await request(port, '/strict')
  const denied = await request(port, '/strict')
  assert.equal(denied.status, 429)
  assert.equal(count(denied, 'retry-after'), 1)
  assert.equal(denied.headers['ratelimit-policy'], '"strict";q=2;w=60')
})

test('headers: X-RateLimit-Reset is a Unix timestamp, RateLimit keeps delta seconds; which set; Retry-After as a date', async (t) => {
  const limiter = limiterFor({ api: { algorithm: 'fixed_window', limit: 1, window: '1m' } })
  const port = await serveExpress(t, (app) => {
    app.get('/both', expressMiddleware(limiter, { policy: 'api', key: () => 'both' }), (req, res) => res.send('ok'))
    app.get('/ietf', expressMiddleware(limiter, { policy: 'api', key: () => 'ietf', legacyHeaders: false, retryAfter: 'date' }), (req, res) => res.send('ok'))
    app.get('/legacy', expressMiddleware(limiter, { policy: 'api', key: () => 'legacy', standardHeaders: false }), (req, res) => res.send('ok'))
  })
  const before = Date.now()
  const r = await request(port, '/both')
  const after = Date.now()
  // 40 s left in the window (the limiter's clock)
  const reset = Number(r.headers['x-ratelimit-reset'])
  assert.ok(reset >= Math.ceil((before + 40_000) / 1000) && reset <= Math.ceil((after + 40_000) / 1000), `${reset}`)
  assert.equal(r.headers['ratelimit'], '"api";r=0;t=40')
  const ietf = await request(port, '/ietf')
  assert.equal(ietf.headers['x-ratelimit-limit'], undefined)
  assert.equal(ietf.headers['ratelimit'], '"api";r=0;t=40')
  const ietfDenied = await request(port, '/ietf')
  assert.equal(ietfDenied.status, 429)
  const date = Date.parse(ietfDenied.headers['retry-after'])
  assert.ok(ietfDenied.headers['retry-after'].endsWith(' GMT'), ietfDenied.headers['retry-after'])
  assert.ok(Math.abs(date - (Date.now() + 40_000)) < 2000, ietfDenied.headers['retry-after'])
  const legacy = await request(port, '/legacy')
  assert.equal(legacy.headers['ratelimit'], undefined)
  assert.equal(legacy.headers['ratelimit-policy'], undefined)
  assert.equal(legacy.headers['x-ratelimit-remaining'], '0')
  assert.equal((await request(port, '/legacy')).headers['retry-after'], '40')
})

test('Express: a custom 429 handler answers, the headers are set once', async (t) => {
  const limiter = limiterFor({ api: { algorithm: 'fixed_window', limit: 1, window: '1m' } })
  const port = await serveExpress(t, (app) => {
    app.use(
      expressMiddleware(limiter, {
        policy: 'api',
        key: () => 'h',
        handler: (req, res, next, decision) => res.status(429).json({ mine: true, retryInMs: decision.retryAfter }),
      })
    )
    app.get('/', (req, res) => res.send('ok'))
  })
  const port2 = await serveExpress(t, (app) => {
    app.get(
      '/throws',
      expressMiddleware(limiter, {
        policy: 'api',
        key: () => 'h2',
        handler: () => {
          throw new Error('handler failed')
        },
      }),
      (req, res) => res.send('ok')
    )
    app.use((err, req, res, _next) => res.status(500).send(err.message))
  })
  assert.deepEqual(await statuses(port2, '/throws', 2), [200, 500])
  assert.equal((await request(port, '/')).status, 200)
  const r = await request(port, '/')
  assert.equal(r.status, 429)
  assert.deepEqual(JSON.parse(r.text), { mine: true, retryInMs: 40_000 })
  assert.equal(count(r, 'x-ratelimit-remaining'), 1)
  assert.equal(r.headers['retry-after'], '40')
})

for (const transport of ['thread', 'host']) {
  test(`leaky bucket (${transport} transport): the request is held for its delay, or answered 429 when the caller prefers not to wait`, async (t) => {
    // 10 per second: each queued request waits 100 ms more; the clock stands still, so the
    // delays are exactly 0, 100, ..., 400 and the sixth does not fit. Every decision must
    // come from Redis (on_error: error): a check that fell back would be a 503, never the
    // 200 or 429 asserted here (on a loaded machine, the default on_error: open once
    // answered 200 where the 429 was due).
    const clock = new ManualClock(T0 + 20_000_000)
    const limiter = Limiter.fromJson(
      redis.config(
        { shaper: { algorithm: 'leaky_bucket', capacity: 5, leak_per_sec: 10 } },
        { key_prefix: `t${++prefix}:`, on_error: 'error' }
      ),
      { clock, transport }
    )
    t.after(() => limiter.close())
    const sources = []
    const port = await serveExpress(t, (app) => {
      const reply = (req, res) => res.json({ delay: req.rateLimit.delay })
      const mw = (key, opts = {}) => {
        const inner = expressMiddleware(limiter, { policy: 'shaper', key: () => key, ...opts })
        return (req, res, next) => inner(req, res, (err) => {
          if (req.rateLimit !== undefined) sources.push(req.rateLimit.source)
          next(err)
        })
      }
      app.get('/wait', mw('wait'), reply)
      app.get('/reject', mw('reject', { delay: 'reject' }), reply)
      app.get('/bounded', mw('bounded', { maxDelayMs: 150 }), reply)
    })
    const rs = await Promise.all([0, 1, 2, 3, 4, 5].map(() => request(port, '/wait')))
    assert.deepEqual(rs.map((r) => r.status).sort(), [200, 200, 200, 200, 200, 429], rs.map((r) => r.text).join(' | '))
    const served = rs.filter((r) => r.status === 200).map((r) => ({ delay: JSON.parse(r.text).delay, ms: r.ms }))
    assert.deepEqual(served.map((s) => s.delay).sort((a, b) => a - b), [0, 100, 200, 300, 400])
    for (const s of served) assert.ok(s.ms >= s.delay - 1, `held ${s.ms} ms for a delay of ${s.delay} ms`)
    // delay: 'reject': the first is served at once, the next (delay 100 ms) is a 429
    const first = await request(port, '/reject')
    assert.deepEqual(JSON.parse(first.text), { delay: 0 })
    const second = await request(port, '/reject')
    assert.equal(second.status, 429, second.text)
    assert.equal(second.headers['retry-after'], '1')
    assert.match(JSON.parse(second.text).message, /would wait 100 ms/)
    // maxDelayMs: 150: delays of 0 and 100 ms are waited, 200 ms is a 429
    assert.deepEqual(await statuses(port, '/bounded', 3), [200, 200, 429])
    // the admitted requests' decisions came from Redis
    assert.ok(sources.length >= 8, `${sources.length} admitted requests seen`)
    for (const s of sources) assert.equal(s, 'redis')
  })
}

test('concurrency: the lease is given back when the response ends, on error and on client abort', async (t) => {
  const limiter = limiterFor({ slots: { algorithm: 'concurrency', max: 2, lease_ttl: '30s' } })
  let releaseSlow
  let slowArrived
  const port = await serveExpress(t, (app) => {
    app.use(expressMiddleware(limiter, { policy: 'slots', key: () => 'c' }))
    app.get('/ok', (req, res) => res.send('ok'))
    app.get('/boom', () => {
      throw new Error('boom')
    })
    app.get('/slow', (req, res) => {
      slowArrived()
      new Promise((r) => (releaseSlow = r)).then(() => res.send('late'))
    })
    app.use((err, req, res, _next) => res.status(500).send(err.message))
  })
  // the defect: 200 200 429 429 429 (leases never given back)
  assert.deepEqual(await statuses(port, '/ok', 5), [200, 200, 200, 200, 200])
  assert.deepEqual(await statuses(port, '/boom', 3), [500, 500, 500])
  const held = () => limiter.peek('c', 'slots').then((d) => d.remaining)
  // a client that goes away mid-request frees its slot
  const ac = new AbortController()
  const arrived = new Promise((r) => (slowArrived = r))
  const aborted = request(port, '/slow', { signal: ac.signal }).catch((e) => e.name)
  await arrived
  assert.equal(await held(), 1)
  ac.abort()
  assert.equal(await aborted, 'AbortError')
  const end = Date.now() + 5000
  while ((await held()) !== 2) {
    assert.ok(Date.now() < end, 'the aborted request still holds its lease')
    await new Promise((r) => setTimeout(r, 10))
  }
  releaseSlow()
  assert.deepEqual(await statuses(port, '/ok', 3), [200, 200, 200])
})

test('mistakes surface when the middleware is built', () => {
  const limiter = limiterFor({ api: { algorithm: 'fixed_window', limit: 1, window: '1m' } })
  assert.throws(() => expressMiddleware(limiter, { policy: 'missing' }), (e) => e instanceof sl.UnknownPolicyError)
  assert.throws(() => fastifyHook(limiter, { policy: 'missing' }), sl.UnknownPolicyError)
  assert.throws(() => expressMiddleware(limiter, { limit: 0 }), sl.ConfigError)
  assert.throws(() => expressMiddleware(limiter, { policy: 'api', limit: 5 }), TypeError)
  assert.throws(() => expressMiddleware(limiter, {}), TypeError)
  assert.throws(() => expressMiddleware(limiter, { policy: 'api', skipFailedRequests: 1 }), TypeError)
  assert.throws(() => expressMiddleware(limiter, { policy: 'api', retryAfter: 'hours' }), TypeError)
  assert.throws(() => expressMiddleware(limiter, { policy: 'api', key: () => 'k', keyGenerator: () => 'k' }), TypeError)
})

test('Fastify plugin: routes limited, /health (rateLimit: false) and 404s not; route options override', async (t) => {
  const limiter = limiterFor({ api: { algorithm: 'fixed_window', limit: 2, window: '1m' } })
  const port = await serveFastify(t, async (app) => {
    await app.register(fastifyPlugin, { limiter, policy: 'api', keyGenerator: () => 'f' })
    app.get('/', async (request) => ({ remaining: request.rateLimit.remaining }))
    app.get('/health', { config: { rateLimit: false } }, async () => 'up')
    app.get('/strict', { config: { rateLimit: { limit: 1, name: 'strict' } } }, async (request) => request.rateLimit.policy)
  })
  assert.deepEqual(await statuses(port, '/health', 4), [200, 200, 200, 200])
  assert.equal((await request(port, '/health')).headers['x-ratelimit-limit'], undefined)
  const notFound = await statuses(port, '/nope', 4)
  assert.deepEqual(notFound, [404, 404, 404, 404])
  assert.equal((await request(port, '/nope')).headers['x-ratelimit-limit'], undefined)
  assert.deepEqual(await statuses(port, '/', 3), [200, 200, 429])
  const strict = await request(port, '/strict')
  assert.equal(strict.text, 'strict')
  assert.equal(strict.headers['ratelimit-policy'], '"strict";q=1;w=60')
  assert.equal((await request(port, '/strict')).status, 429)
})

test('Fastify plugin with global: false limits only the routes that ask', async (t) => {
  const limiter = limiterFor({ api: { algorithm: 'fixed_window', limit: 1, window: '1m' } })
  const port = await serveFastify(t, async (app) => {
    await app.register(fastifyPlugin, { limiter, global: false, policy: 'api', key: () => 'g' })
    app.get('/free', async () => 'free')
    app.get('/limited', { config: { rateLimit: {} } }, async () => 'limited')
  })
  assert.deepEqual(await statuses(port, '/free', 3), [200, 200, 200])
  assert.deepEqual(await statuses(port, '/limited', 2), [200, 429])
})

test('Fastify: route-level hook, custom handler, leaky delay and a concurrency lease', async (t) => {
  const limiter = limiterFor({
    shaper: { algorithm: 'leaky_bucket', capacity: 2, leak_per_sec: 10 },
    slots: { algorithm: 'concurrency', max: 1, lease_ttl: '30s' },
  })
  const port = await serveFastify(t, async (app) => {
    app.get(
      '/shaped',
      { onRequest: fastifyHook(limiter, { policy: 'shaper', key: () => 's', handler: (request, reply, d) => reply.code(429).send({ custom: d.policy }) }) },
      async (request) => ({ delay: request.rateLimit.delay })
    )
    app.get('/slot', { onRequest: fastifyHook(limiter, { policy: 'slots', key: () => 's' }) }, async () => 'ok')
  })
  const rs = await Promise.all([0, 1, 2].map(() => request(port, '/shaped')))
  const served = rs.filter((r) => r.status === 200).map((r) => ({ delay: JSON.parse(r.text).delay, ms: r.ms }))
  assert.deepEqual(served.map((s) => s.delay).sort((a, b) => a - b), [0, 100])
  for (const s of served) assert.ok(s.ms >= s.delay - 1, `held ${s.ms} ms for ${s.delay} ms`)
  assert.deepEqual(JSON.parse(rs.find((r) => r.status === 429).text), { custom: 'shaper' })
  assert.deepEqual(await statuses(port, '/slot', 4), [200, 200, 200, 200])
})

test('outage: a fallback that denies is 503 with Retry-After; on_error: error reaches the error handlers', async (t) => {
  const own = await startRedis()
  t.after(async () => {
    process.kill(own.pid, 'SIGCONT')
    await own.stop()
  })
  const policies = {
    closed: { algorithm: 'fixed_window', limit: 5, window: '1m', on_error: 'closed' },
    error: { algorithm: 'fixed_window', limit: 5, window: '1m', on_error: 'error' },
  }
  const limiter = Limiter.fromJson(own.config(policies, { timeout_ms: 100 }))
  let handled = null
  const port = await serveExpress(t, (app) => {
    app.get('/closed', expressMiddleware(limiter, { policy: 'closed', key: () => 'o' }), (req, res) => res.send('ok'))
    app.get('/closed7', expressMiddleware(limiter, { policy: 'closed', key: () => 'o', unavailableRetryAfter: 7 }), (req, res) => res.send('ok'))
    app.get(
      '/custom',
      expressMiddleware(limiter, { policy: 'closed', key: () => 'o', unavailableHandler: (req, res, next, d) => res.status(503).send(`down:${d.source}`) }),
      (req, res) => res.send('ok')
    )
    app.get('/error', expressMiddleware(limiter, { policy: 'error', key: () => 'o' }), (req, res) => res.send('ok'))
    app.use((err, req, res, _next) => {
      handled = err
      res.status(502).json({ code: err.code, backend: err.isBackend })
    })
  })
  const fport = await serveFastify(t, async (app) => {
    await app.register(fastifyPlugin, { limiter, policy: 'error', key: () => 'o' })
    app.setErrorHandler((err, request, reply) => reply.code(502).send({ fastify: true, backend: err.isBackend }))
    app.get('/', async () => 'ok')
  })
  assert.equal((await request(port, '/closed')).status, 200)
  process.kill(own.pid, 'SIGSTOP')
  const r = await request(port, '/closed')
  assert.equal(r.status, 503)
  assert.equal(r.headers['retry-after'], '1')
  assert.equal(r.headers['x-ratelimit-status'], 'unmeasured')
  assert.equal(r.headers['x-ratelimit-remaining'], undefined)
  const body = JSON.parse(r.text)
  assert.equal(body.error, 'rate_limit_unavailable')
  assert.match(body.message, /could not be checked/)
  assert.equal((await request(port, '/closed7')).headers['retry-after'], '7')
  const custom = await request(port, '/custom')
  assert.deepEqual([custom.status, custom.text], [503, 'down:fallback'])
  const e = await request(port, '/error')
  assert.equal(e.status, 502)
  assert.equal(JSON.parse(e.text).backend, true)
  assert.ok(handled instanceof sl.ShardlimitError && handled.isBackend, String(handled))
  const f = await request(fport, '/')
  assert.equal(f.status, 502)
  assert.deepEqual(JSON.parse(f.text), { fastify: true, backend: true })
  process.kill(own.pid, 'SIGCONT')
  limiter.close()
})

test('start-up: the first middleware connects the limiter before traffic; a shard that does not answer is a warning', async (t) => {
  const own = await startRedis()
  const frozen = await startRedis()
  t.after(async () => {
    process.kill(frozen.pid, 'SIGCONT')
    await frozen.stop()
    await own.stop()
  })
  const clients = async (r) => Number(/connected_clients:(\d+)/.exec(await r.command('INFO', 'clients'))[1])
  const scripts = async (r) => Number(/number_of_cached_scripts:(\d+)/.exec(await r.command('INFO', 'memory'))[1])
  const policies = { p: { algorithm: 'fixed_window', limit: 5, window: '1m' } }
  const limiter = Limiter.fromJson(own.config(policies))
  t.after(() => limiter.close())
  assert.equal(await scripts(own), 0)
  const before = await clients(own)
  // Fastify: the plugin's connect ends before the server is ready (no request made)
  const app = Fastify()
  await app.register(fastifyPlugin, { limiter, policy: 'p', key: () => 'k' })
  app.get('/', async () => 'ok')
  await app.ready()
  t.after(() => app.close())
  assert.ok((await clients(own)) > before, 'connections made at start-up')
  assert.ok((await scripts(own)) > 0, 'scripts loaded at start-up')

  process.kill(frozen.pid, 'SIGSTOP')
  const stuck = Limiter.fromJson(frozen.config(policies, { timeout_ms: 50 }))
  t.after(() => stuck.close())
  const warned = new Promise((resolve) => process.once('warning', resolve))
  expressMiddleware(stuck, { policy: 'p', key: () => 'k', warmUpMs: 200 })
  const w = await warned
  assert.equal(w.name, 'ShardlimitWarning')
  assert.match(w.message, /warm-up incomplete.*200 ms/)
  assert.throws(() => expressMiddleware(stuck, { policy: 'p', warmUpMs: -1 }), /warmUpMs/)
})
