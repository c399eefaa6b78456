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
