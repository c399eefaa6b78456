'use strict'
// The middleware end to end: real Express, plain node:http (Connect-style) and Fastify
// servers on 127.0.0.1, a real Redis, real HTTP requests.

const test = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const express = require('express')
const Fastify = require('fastify')
const { Limiter, ManualClock, expressMiddleware, fastifyHook, fastifyPlugin } = require('..')
const { startRedis } = require('./support/redis.js')

const T0 = 1_800_000_000_000_000
let redis
test.before(async () => {
  redis = await startRedis()
})
test.after(() => redis.stop())

function limiterFor(policies) {
  const clock = new ManualClock(T0 + 20_000_000) // 40 s left in the minute window
  return Limiter.fromJson(redis.config(policies), { clock })
}

function listen(server) {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server.address().port)))
}

function close(server) {
  return new Promise((resolve) => server.close(resolve))
}

async function get(port, path, headers = {}) {
  const res = await fetch(`http://127.0.0.1:${port}${path}`, { headers })
  const text = await res.text()
  return { status: res.status, headers: res.headers, text }
}

test('Express: headers on every response, 429 with the JSON body when denied', async (t) => {
  const limiter = limiterFor({ api: { algorithm: 'fixed_window', limit: 3, window: '1m' } })
  const app = express()
  app.use(expressMiddleware(limiter, { policy: 'api', key: (req) => req.get('x-user') || null }))
  app.get('/hello', (req, res) => res.json({ hello: 'world', remaining: req.rateLimit.remaining }))
  app.use((err, req, res, _next) => res.status(500).json({ code: err.code }))
  const server = http.createServer(app)
  const port = await listen(server)
  t.after(() => close(server))

  for (const remaining of [2, 1, 0]) {
    const before = Date.now()
    const r = await get(port, '/hello', { 'x-user': 'alice' })
    const after = Date.now()
    assert.equal(r.status, 200)
    assert.deepEqual(JSON.parse(r.text), { hello: 'world', remaining })
    assert.equal(r.headers.get('x-ratelimit-limit'), '3')
    assert.equal(r.headers.get('x-ratelimit-remaining'), String(remaining))
    // a Unix timestamp: 40 s left in the window
    const reset = Number(r.headers.get('x-ratelimit-reset'))
    assert.ok(reset >= Math.ceil((before + 40_000) / 1000) && reset <= Math.ceil((after + 40_000) / 1000), `${reset}`)
    assert.equal(r.headers.get('ratelimit-policy'), '"api";q=3;w=60')
    assert.equal(r.headers.get('ratelimit'), `"api";r=${remaining};t=40`)
    assert.equal(r.headers.get('retry-after'), null)
  }
  const denied = await get(port, '/hello', { 'x-user': 'alice' })
  assert.equal(denied.status, 429)
  assert.match(denied.headers.get('content-type'), /^application\/json/)
  assert.equal(denied.headers.get('retry-after'), '40')
  assert.equal(denied.headers.get('x-ratelimit-remaining'), '0')
  assert.deepEqual(JSON.parse(denied.text), {
    error: 'rate_limited',
    policy: 'api',
    limit: 3,
    remaining: 0,
    retry_after: 40,
    message: 'Rate limit exceeded for policy "api": retry in 40 seconds.',
  })
  // another key has its own budget; a request mapped to no key is not limited
  assert.equal((await get(port, '/hello', { 'x-user': 'bob' })).status, 200)
  const anonymous = await get(port, '/hello')
  assert.equal(anonymous.status, 500, 'req.rateLimit is unset, so the route throws')
})

test('Express: the key function picks the policy, cost weighs the request', async (t) => {
  const limiter = limiterFor({
    cheap: { algorithm: 'token_bucket', capacity: 10, refill_per_sec: 0.01 },
    costly: { algorithm: 'token_bucket', capacity: 10, refill_per_sec: 0.01 },
  })
  const app = express()
  app.use(
    expressMiddleware(limiter, {
      key: (req) => ({ key: `ip:${req.socket.remoteAddress}`, policy: req.path === '/export' ? 'costly' : 'cheap' }),
      cost: (req) => (req.path === '/export' ? 6 : 1),
    })
  )
  app.get('/export', (req, res) => res.send('ok'))
  app.use((err, req, res, _next) => res.status(500).json({ code: err.code }))
  const server = http.createServer(app)
  const port = await listen(server)
  t.after(() => close(server))
  assert.equal((await get(port, '/export')).status, 200)
  const second = await get(port, '/export')
  assert.equal(second.status, 429)
  assert.equal(second.headers.get('x-ratelimit-remaining'), '4')
})

test('Express: a misconfigured policy fails when the middleware is built, not on every request', () => {
  const limiter = limiterFor({})
  assert.throws(() => expressMiddleware(limiter, { policy: 'missing', key: () => 'k' }), (e) => {
    assert.equal(e.code, 'ERR_SHARDLIMIT_UNKNOWN_POLICY')
    return true
  })
})

test('Connect-style: plain node:http with the default key (the client IP)', async (t) => {
  const limiter = limiterFor({ api: { algorithm: 'sliding_log', limit: 1, window: '1m' } })
  const mw = expressMiddleware(limiter, { policy: 'api' })
  const server = http.createServer((req, res) =>
    mw(req, res, (err) => {
      res.statusCode = err ? 500 : 200
      res.end(err ? String(err.code) : `ok ${req.rateLimit.policy}`)
    })
  )
  const port = await listen(server)
  t.after(() => close(server))
  const ok = await get(port, '/')
  assert.equal(ok.status, 200)
  assert.equal(ok.text, 'ok api')
  const denied = await get(port, '/')
  assert.equal(denied.status, 429)
  assert.equal(JSON.parse(denied.text).policy, 'api')
  // the key was the loopback peer address
  assert.equal((await limiter.peek('127.0.0.1', 'api')).allowed, false)
})

test('Fastify: the hook and the plugin set headers and answer 429', async (t) => {
  const limiter = limiterFor({ api: { algorithm: 'fixed_window', limit: 1, window: '1m' } })
  const app = Fastify()
  app.addHook('onRequest', fastifyHook(limiter, { policy: 'api', key: (req) => req.headers['x-user'] }))
  app.get('/', async () => ({ ok: true }))
  await app.listen({ port: 0, host: '127.0.0.1' })
  t.after(() => app.close())
  const port = app.server.address().port
  const ok = await get(port, '/', { 'x-user': 'f1' })
  assert.equal(ok.status, 200)
  assert.equal(ok.headers.get('x-ratelimit-remaining'), '0')
  const denied = await get(port, '/', { 'x-user': 'f1' })
  assert.equal(denied.status, 429)
  assert.equal(denied.headers.get('retry-after'), '40')
  assert.equal(JSON.parse(denied.text).error, 'rate_limited')

  const app2 = Fastify()
  await app2.register(fastifyPlugin, { limiter, policy: 'api', key: (req) => `p:${req.headers['x-user']}` })
  app2.get('/', async () => ({ ok: true }))
  await app2.listen({ port: 0, host: '127.0.0.1' })
  t.after(() => app2.close())
  const port2 = app2.server.address().port
  assert.equal((await get(port2, '/', { 'x-user': 'f2' })).status, 200)
  assert.equal((await get(port2, '/', { 'x-user': 'f2' })).status, 429)
})

test('middleware options are type-checked', () => {
  const limiter = Limiter.memory()
  assert.throws(() => expressMiddleware({}), TypeError)
  assert.throws(() => expressMiddleware(limiter, { policy: 5 }), TypeError)
  assert.throws(() => expressMiddleware(limiter, { key: 'ip' }), TypeError)
  assert.throws(() => fastifyHook(limiter, { trustedProxies: '10.0.0.0/8' }), TypeError)
})

test("an admitted decision's headers, rendered without a call into the core, equal the core's", async () => {
  const { renderHeaders } = require('../middleware.js')
  const clock = new ManualClock(T0 + 123_456)
  const limiter = Limiter.fromJson(
    {
      policies: {
        fw: { algorithm: 'fixed_window', limit: 50, window: '1m' },
        sw: { algorithm: 'sliding_window', limit: 40, window: '90s' },
        tb: { algorithm: 'token_bucket', capacity: 30, refill_per_sec: 0.7 },
        sl: { algorithm: 'sliding_log', limit: 20, window: '7s' },
        'odd.name-1': { algorithm: 'fixed_window', limit: 9, window: '1500ms' },
      },
    },
    { clock }
  )
  // the core's headers as the middleware shows them: X-RateLimit-Reset as a Unix time
  const expected = (d, o, nowMs) => {
    const out = {}
    for (const [name, value] of Object.entries(d.headers())) {
      if (name.startsWith('X-')) {
        if (o.legacyHeaders) out[name] = name === 'X-RateLimit-Reset' ? String(Math.ceil((nowMs + d.resetAfter) / 1000)) : value
      } else if (name !== 'Retry-After' && o.standardHeaders) out[name] = value
    }
    return out
  }
  let compared = 0
  try {
    for (let step = 0; step < 12; step++) {
      clock.advanceUs(333_333 + step * 1_000_001)
      for (const policy of limiter.policies) {
        const d = await limiter.check(`k${step % 3}`, { policy, cost: 1 + (step % 2) })
        assert.equal(d.allowed, true)
        for (const o of [
          { legacyHeaders: true, standardHeaders: true },
          { legacyHeaders: false, standardHeaders: true },
          { legacyHeaders: true, standardHeaders: false },
        ]) {
          const nowMs = 1_900_000_000_123 + step
          assert.deepEqual(renderHeaders(d, o, nowMs), expected(d, o, nowMs), `${policy}, step ${step}`)
          assert.deepEqual(Object.keys(renderHeaders(d, o, nowMs)), Object.keys(expected(d, o, nowMs)), 'the core order')
          compared++
        }
      }
    }
  } finally {
    limiter.close()
  }
  assert.equal(compared, 12 * 5 * 3)
})
