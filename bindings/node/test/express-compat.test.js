'use strict'
// What express-rate-limit users expect of the middleware: Express's `trust proxy`, a limit
// and a plan per request, several limits on one route at once, `statusCode` and `message`,
// and a client's header that can never make a request fail. Real Express on 127.0.0.1 and
// a real Redis (`on_error: error`: every decision here is Redis's).

const test = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const express = require('express')
const Fastify = require('fastify')
const { Limiter, ManualClock, expressMiddleware, fastifyHook } = require('..')
const { startRedis } = require('./support/redis.js')

let redis
test.before(async () => {
  redis = await startRedis()
})
test.after(() => redis.stop())

// The limiter's clock is fixed 20 s into a minute (every window here is a minute or more):
// a test's checks never straddle a window boundary that Redis's own clock could put
// between them.
const T0 = 1_800_000_000_000_000

function limiterFor(policies, extra = {}) {
  const cfg = JSON.parse(JSON.stringify(redis.config(policies)))
  Object.assign(cfg, { on_error: 'error' }, extra)
  return Limiter.fromJson(cfg, { clock: new ManualClock(T0 + 20_000_000) })
}

async function serve(t, app) {
  const server = http.createServer(app)
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => new Promise((resolve) => server.close(resolve)))
  return server.address().port
}

async function get(port, path, headers = {}) {
  const res = await fetch(`http://127.0.0.1:${port}${path}`, { headers })
  return { status: res.status, headers: res.headers, text: await res.text() }
}

/** A loopback port nothing listens on (a shard that is down). */
async function deadPort() {
  const dead = http.createServer()
  await new Promise((resolve) => dead.listen(0, '127.0.0.1', resolve))
  const port = dead.address().port
  await new Promise((resolve) => dead.close(resolve))
  return port
}

function appWith(mw) {
  const app = express()
  app.use(mw)
  app.get('/', (req, res) => res.send('ok'))
  app.use((err, req, res, _next) => res.status(500).json({ code: err.code, message: err.message }))
  return app
}

test("Express 'trust proxy': each client behind the proxy has its own budget (req.ip)", async (t) => {
  const limiter = limiterFor({ ip: { algorithm: 'sliding_log', limit: 2, window: '1m' } })
  t.after(() => limiter.close())
  const app = appWith(expressMiddleware(limiter, { policy: 'ip', warmUpMs: 0 }))
  app.set('trust proxy', 'loopback')
  const port = await serve(t, app)
  for (const client of ['203.0.113.1', '203.0.113.2']) {
    for (let i = 0; i < 2; i++) {
      assert.equal((await get(port, '/', { 'x-forwarded-for': client })).status, 200, client)
    }
  }
  assert.equal((await get(port, '/', { 'x-forwarded-for': '203.0.113.1' })).status, 429)
  // the proxy's own budget was never touched
  const d = await limiter.peek('127.0.0.1', { policy: 'ip' })
  assert.equal(d.remaining, 2)

  // without 'trust proxy' the header is not believed: one budget for the peer
  const plain = appWith(expressMiddleware(limiter, { policy: 'ip', warmUpMs: 0 }))
  const port2 = await serve(t, plain)
  await limiter.reset('127.0.0.1', { policy: 'ip' })
  assert.equal((await get(port2, '/', { 'x-forwarded-for': '198.51.100.1' })).status, 200)
  assert.equal((await get(port2, '/', { 'x-forwarded-for': '198.51.100.2' })).status, 200)
  assert.equal((await get(port2, '/', { 'x-forwarded-for': '198.51.100.3' })).status, 429)
})

test('limit: (req) => n and plan: (req) => name give each tenant its own limit', async (t) => {
  const limiter = limiterFor(
    { api: { algorithm: 'fixed_window', limit: 1, window: '1m' } },
    { plans: { pro: { api: { algorithm: 'fixed_window', limit: 3, window: '1m' } } } }
  )
  t.after(() => limiter.close())
  const tenant = (req) => req.get('x-tenant')
  const byLimit = appWith(
    expressMiddleware(limiter, { key: tenant, limit: (req) => (req.get('x-plan') === 'pro' ? 3 : 1), windowMs: 60_000, warmUpMs: 0 })
  )
  const port = await serve(t, byLimit)
  const statuses = async (p, h, n) => {
    const out = []
    for (let i = 0; i < n; i++) out.push((await get(p, '/', h)).status)
    return out
  }
  assert.deepEqual(await statuses(port, { 'x-tenant': 'free1' }, 2), [200, 429])
  assert.deepEqual(await statuses(port, { 'x-tenant': 'pro1', 'x-plan': 'pro' }, 4), [200, 200, 200, 429])

  const byPlan = appWith(
    expressMiddleware(limiter, { policy: 'api', key: tenant, plan: (req) => req.get('x-plan'), warmUpMs: 0 })
  )
  const port2 = await serve(t, byPlan)
  assert.deepEqual(await statuses(port2, { 'x-tenant': 'free2' }, 2), [200, 429])
  assert.deepEqual(await statuses(port2, { 'x-tenant': 'pro2', 'x-plan': 'pro' }, 4), [200, 200, 200, 429])
})

test('a key function returning layers checks them atomically: a denial consumes nothing', async (t) => {
  const limiter = limiterFor({
    ip: { algorithm: 'fixed_window', limit: 3, window: '1m' },
    user: { algorithm: 'fixed_window', limit: 1, window: '1m' },
  })
  t.after(() => limiter.close())
  const app = appWith(
    expressMiddleware(limiter, {
      key: (req) => [
        { key: 'ip:1', policy: 'ip' },
        { key: `user:${req.get('x-user')}`, policy: 'user' },
      ],
      warmUpMs: 0,
    })
  )
  const port = await serve(t, app)
  assert.equal((await get(port, '/', { 'x-user': 'a' })).status, 200)
  const denied = await get(port, '/', { 'x-user': 'a' })
  assert.equal(denied.status, 429)
  assert.equal(JSON.parse(denied.text).policy, 'user')
  // the denied request took nothing from the IP layer
  assert.equal((await limiter.peek('ip:1', { policy: 'ip' })).remaining, 2)
  assert.equal((await get(port, '/', { 'x-user': 'b' })).status, 200)
  assert.equal((await limiter.peek('ip:1', { policy: 'ip' })).remaining, 1)
})

test('statusCode and message answer a request over its limit (Express and Fastify)', async (t) => {
  const limiter = limiterFor({ one: { algorithm: 'fixed_window', limit: 1, window: '1m' } })
  t.after(() => limiter.close())
  const cases = [
    [{ statusCode: 503, message: 'Too many, slow down' }, 503, 'text/plain', 'Too many, slow down'],
    [{ message: { error: 'slow_down' } }, 429, 'application/json', '{"error":"slow_down"}'],
    [{ message: async (req) => ({ who: req.headers['x-user'] }) }, 429, 'application/json', '{"who":"u3"}'],
  ]
  let i = 0
  for (const [opts, status, type, text] of cases) {
    const user = `u${++i}`
    const port = await serve(t, appWith(expressMiddleware(limiter, { policy: 'one', key: (req) => req.get('x-user'), warmUpMs: 0, ...opts })))
    assert.equal((await get(port, '/', { 'x-user': user })).status, 200)
    const r = await get(port, '/', { 'x-user': user })
    assert.equal(r.status, status)
    assert.ok(r.headers.get('content-type').startsWith(type), r.headers.get('content-type'))
    assert.equal(r.text, text)
    assert.ok(r.headers.get('retry-after'))
  }
  assert.throws(() => expressMiddleware(limiter, { policy: 'one', statusCode: 200 }), /statusCode/)
  assert.throws(() => expressMiddleware(limiter, { policy: 'one', message: 5 }), /message/)

  const app = Fastify()
  app.get('/', { onRequest: fastifyHook(limiter, { policy: 'one', key: () => 'fy', statusCode: 418, message: 'teapot', warmUpMs: 0 }) }, async () => 'ok')
  await app.ready()
  t.after(() => app.close())
  assert.equal((await app.inject({ url: '/' })).statusCode, 200)
  const r = await app.inject({ url: '/' })
  assert.equal(r.statusCode, 418)
  assert.equal(r.body, 'teapot')
})

test('a key longer than 1,024 bytes from a client header is hashed, never a 500', async (t) => {
  const limiter = limiterFor({ api: { algorithm: 'fixed_window', limit: 1, window: '1m' } })
  t.after(() => limiter.close())
  const app = appWith(expressMiddleware(limiter, { policy: 'api', key: (req) => `key:${req.get('x-api-key')}`, warmUpMs: 0 }))
  const port = await serve(t, app)
  const long = 'k'.repeat(4000)
  assert.equal((await get(port, '/', { 'x-api-key': long })).status, 200)
  assert.equal((await get(port, '/', { 'x-api-key': long })).status, 429) // the same client, the same budget
  assert.equal((await get(port, '/', { 'x-api-key': `${long}x` })).status, 200) // another client
  const hashed = `sha256:${require('node:crypto').createHash('sha256').update(`key:${long}`).digest('hex')}`
  assert.equal((await limiter.peek(hashed, { policy: 'api' })).remaining, 0)
  // multi-byte: 400 characters of 3 bytes are over the bound too
  assert.equal((await get(port, '/', { 'x-api-key': encodeURIComponent('€'.repeat(400)) })).status, 200)
})

test('on_error local: a denial by this process share is a 429 with its own headers, not a 503', async (t) => {
  const port = await deadPort()
  const limiter = Limiter.fromJson({
    timeout_ms: 200,
    on_error: 'local',
    instances: 1,
    shards: [{ name: 's0', url: `redis://127.0.0.1:${port}` }],
    policies: { api: { algorithm: 'fixed_window', limit: 2, window: '1m' } },
  }, { clock: new ManualClock(T0 + 20_000_000) })
  t.after(() => limiter.close())
  const app = appWith(expressMiddleware(limiter, { policy: 'api', key: () => 'u', warmUpMs: 0 }))
  const p = await serve(t, app)
  for (const left of ['1', '0']) {
    const r = await get(p, '/')
    assert.equal(r.status, 200)
    assert.equal(r.headers.get('x-ratelimit-remaining'), left)
  }
  const r = await get(p, '/')
  assert.equal(r.status, 429)
  const retry = Number(r.headers.get('retry-after'))
  assert.ok(retry >= 1 && retry <= 60, `${retry}`)
  assert.equal(r.headers.get('x-ratelimit-remaining'), '0')
  assert.equal(r.headers.get('x-ratelimit-status'), null)
  assert.equal(JSON.parse(r.text).error, 'rate_limited')
})

test('on_error local in a layered check: a denial by that layer is a 429 as for one limit, not a 503', async (t) => {
  const port = await deadPort()
  const limiter = Limiter.fromJson({
    timeout_ms: 200,
    instances: 1,
    shards: [{ name: 's0', url: `redis://127.0.0.1:${port}` }],
    policies: {
      ip: { algorithm: 'fixed_window', limit: 2, window: '1m', on_error: 'local' },
      tenant: { algorithm: 'fixed_window', limit: 100, window: '1m', on_error: 'local' },
    },
  }, { clock: new ManualClock(T0 + 20_000_000) })
  t.after(() => limiter.close())
  const layers = () => [{ key: 'ip:1', policy: 'ip' }, { key: 'tenant:a', policy: 'tenant' }]
  const direct = await limiter.checkAll(layers())
  assert.equal(direct.source, 'local_fallback')
  const app = appWith(expressMiddleware(limiter, { key: layers, warmUpMs: 0 }))
  const p = await serve(t, app)
  assert.equal((await get(p, '/')).status, 200)
  const r = await get(p, '/')
  assert.equal(r.status, 429)
  const retry = Number(r.headers.get('retry-after'))
  assert.ok(retry >= 1 && retry <= 60, `${retry}`)
  assert.equal(r.headers.get('x-ratelimit-limit'), '2')
  assert.equal(JSON.parse(r.text).error, 'rate_limited')
})

test("standardHeaders: 'draft-6' | 'draft-7' | 'draft-8' as express-rate-limit offers them", async (t) => {
  const limiter = limiterFor({ api: { algorithm: 'fixed_window', limit: 3, window: '1m' } })
  t.after(() => limiter.close())
  const at = async (opts, user) => {
    const port = await serve(t, appWith(expressMiddleware(limiter, { policy: 'api', key: () => user, warmUpMs: 0, legacyHeaders: false, ...opts })))
    return (await get(port, '/')).headers
  }
  const h6 = await at({ standardHeaders: 'draft-6' }, 'd6')
  assert.equal(h6.get('ratelimit-policy'), '3;w=60')
  assert.equal(h6.get('ratelimit-limit'), '3')
  assert.equal(h6.get('ratelimit-remaining'), '2')
  const reset = Number(h6.get('ratelimit-reset'))
  assert.ok(reset >= 1 && reset <= 60, `${reset}`)
  assert.equal(h6.get('ratelimit'), null)
  const h7 = await at({ standardHeaders: 'draft-7' }, 'd7')
  assert.equal(h7.get('ratelimit-policy'), '3;w=60')
  assert.match(h7.get('ratelimit'), /^limit=3, remaining=2, reset=\d+$/)
  assert.equal(h7.get('ratelimit-limit'), null)
  for (const std of ['draft-8', true, undefined]) {
    const h8 = await at({ standardHeaders: std }, `d8-${std}`)
    assert.equal(h8.get('ratelimit-policy'), '"api";q=3;w=60')
    assert.match(h8.get('ratelimit'), /^"api";r=2;t=\d+$/)
  }
  assert.equal((await at({ standardHeaders: false }, 'none')).get('ratelimit-policy'), null)
  assert.throws(() => expressMiddleware(limiter, { policy: 'api', standardHeaders: 'draft-9' }), /draft-6/)
  // a denial keeps Retry-After with the earlier drafts too
  const port = await serve(t, appWith(expressMiddleware(limiter, { policy: 'api', key: () => 'den', warmUpMs: 0, standardHeaders: 'draft-7' })))
  for (let i = 0; i < 3; i++) await get(port, '/')
  const denied = await get(port, '/')
  assert.equal(denied.status, 429)
  assert.match(denied.headers.get('ratelimit'), /^limit=3, remaining=0, reset=\d+$/)
  assert.ok(Number(denied.headers.get('retry-after')) >= 1)
})
