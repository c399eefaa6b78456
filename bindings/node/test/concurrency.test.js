'use strict'
// Concurrency policies in the middlewares, over real HTTP and a real
// Redis: a request holds a lease while it is in flight and gives it back when its response
// ends, also when the handler throws and when the client goes away, in Express and
// Fastify; the Redis lease count is back to zero after each test. And checkAll refuses a
// concurrency layer (it would take units under no lease).

const test = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const express = require('express')
const Fastify = require('fastify')
const sl = require('..')
const { Limiter, expressMiddleware, fastifyHook } = sl
const { startRedis } = require('./support/redis.js')

let redis
test.before(async () => {
  redis = await startRedis()
})
test.after(() => redis.stop())

let prefix = 0
const POLICIES = {
  slots: { algorithm: 'concurrency', max: 2, lease_ttl: '30s' },
  api: { algorithm: 'fixed_window', limit: 100, window: '1h' },
}
const limiterFor = () => Limiter.fromJson(redis.config(POLICIES, { key_prefix: `cc${++prefix}:` }))

/** Units held on key `c` (the core's own count from Redis). */
const held = async (limiter) => 2 - (await limiter.peek('c', { policy: 'slots' })).remaining

/** Waits (bounded) until `limiter` holds `n` units: a lease goes back after the response. */
async function heldBecomes(limiter, n) {
  const end = Date.now() + 5000
  while ((await held(limiter)) !== n) {
    assert.ok(Date.now() < end, `still ${await held(limiter)} units held, expected ${n}`)
    await new Promise((r) => setTimeout(r, 5))
  }
}

function request(port, path, { signal } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, agent: false, signal }, (res) => {
      res.resume()
      res.on('end', () => resolve(res.statusCode))
    })
    req.on('error', reject)
    req.end()
  })
}

/** A gate each slow request waits on, and a count of the requests that reached it. */
function gates() {
  const g = { arrived: 0, waiters: [], open: null }
  g.opened = new Promise((r) => (g.open = r))
  g.reached = (n) => {
    if (g.arrived >= n) return Promise.resolve()
    return new Promise((r) => g.waiters.push([n, r]))
  }
  g.arrive = () => {
    g.arrived++
    for (const [n, r] of g.waiters) if (g.arrived >= n) r()
  }
  return g
}

async function scenario(t, port, limiter, g) {
  // two in flight hold both slots: the third is refused, a fourth after them is admitted
  const slow = [request(port, '/slow'), request(port, '/slow')]
  await g.reached(2)
  assert.equal(await held(limiter), 2)
  assert.equal(await request(port, '/ok'), 429)
  g.open()
  assert.deepEqual(await Promise.all(slow), [200, 200])
  await heldBecomes(limiter, 0)
  assert.equal(await request(port, '/ok'), 200)
  await heldBecomes(limiter, 0)
  // a handler that throws gives its lease back (more than max of them)
  for (let i = 0; i < 3; i++) assert.equal(await request(port, '/boom'), 500)
  await heldBecomes(limiter, 0)
  // a client that goes away mid-request frees its slot (more than max of them)
  for (let i = 0; i < 3; i++) {
    const ac = new AbortController()
    const before = g.arrived
    const aborted = request(port, '/hang', { signal: ac.signal }).catch((e) => e.name)
    await g.reached(before + 1)
    assert.equal(await held(limiter), 1)
    ac.abort()
    assert.equal(await aborted, 'AbortError')
    await heldBecomes(limiter, 0)
  }
}

test('Express: two in flight, a third 429, then admitted; throw and abort give the lease back', async (t) => {
  const limiter = limiterFor()
  const g = gates()
  const app = express()
  app.use(expressMiddleware(limiter, { policy: 'slots', key: () => 'c' }))
  app.get('/ok', (req, res) => res.send('ok'))
  app.get('/slow', (req, res) => {
    g.arrive()
    g.opened.then(() => res.send('late'))
  })
  app.get('/hang', () => g.arrive())
  app.get('/boom', () => {
    throw new Error('boom')
  })
  app.use((err, req, res, _next) => res.status(500).send(err.message))
  const server = http.createServer(app)
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  t.after(() => {
    server.closeAllConnections()
    return new Promise((r) => server.close(r))
  })
  await scenario(t, server.address().port, limiter, g)
})

test('Fastify: two in flight, a third 429, then admitted; throw and abort give the lease back', async (t) => {
  const limiter = limiterFor()
  const g = gates()
  const app = Fastify()
  app.addHook('onRequest', fastifyHook(limiter, { policy: 'slots', key: () => 'c' }))
  app.get('/ok', async () => 'ok')
  app.get('/slow', async () => {
    g.arrive()
    await g.opened
    return 'late'
  })
  app.get('/hang', () => {
    g.arrive()
    return new Promise(() => {})
  })
  app.get('/boom', async () => {
    throw new Error('boom')
  })
  await app.listen({ port: 0, host: '127.0.0.1' })
  t.after(() => {
    app.server.closeAllConnections()
    return app.close()
  })
  await scenario(t, app.server.address().port, limiter, g)
})

test('Express: a reload that makes the policy a concurrency limit is followed from the next request', async (t) => {
  const kp = `cc${++prefix}:`
  const limiter = Limiter.fromJson(redis.config(POLICIES, { key_prefix: kp }))
  const g = gates()
  const app = express()
  app.use(expressMiddleware(limiter, { policy: 'api', key: () => 'c' }))
  app.get('/ok', (req, res) => res.send('ok'))
  app.get('/slow', (req, res) => {
    g.arrive()
    g.opened.then(() => res.send('late'))
  })
  const server = http.createServer(app)
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  t.after(() => {
    server.closeAllConnections()
    return new Promise((r) => server.close(r))
  })
  const port = server.address().port
  assert.equal(await request(port, '/ok'), 200)
  const before = limiter.configGeneration
  limiter.reload(redis.config({ ...POLICIES, api: { algorithm: 'concurrency', max: 1, lease_ttl: '30s' } }, { key_prefix: kp }))
  assert.equal(limiter.configGeneration, before + 1)
  // one request in flight holds the one slot (a check of it would be an error: a 500)
  const slow = request(port, '/slow')
  await g.reached(1)
  assert.equal(1 - (await limiter.peek('c', { policy: 'api' })).remaining, 1)
  assert.equal(await request(port, '/ok'), 429)
  g.open()
  assert.equal(await slow, 200)
  const end = Date.now() + 5000
  while ((await limiter.peek('c', { policy: 'api' })).remaining !== 1) {
    assert.ok(Date.now() < end, 'the lease was not given back')
    await new Promise((r) => setTimeout(r, 5))
  }
  assert.equal(await request(port, '/ok'), 200)
})

test('checkAll refuses a concurrency layer, naming it and the remedy; nothing is taken', async () => {
  const limiter = limiterFor()
  await assert.rejects(
    limiter.checkAll([
      { key: 'c', policy: 'api' },
      { key: 'c', policy: 'slots' },
    ]),
    (e) => {
      assert.equal(e.code, 'ERR_SHARDLIMIT_INVALID_ARGUMENT')
      assert.ok(e instanceof sl.InvalidArgumentError)
      assert.match(e.message, /layers\[1\].*policy "slots" is a concurrency policy: acquire\(\) it and release the lease/)
      return true
    }
  )
  assert.equal(await held(limiter), 0)
  assert.equal((await limiter.peek('c', { policy: 'api' })).remaining, 100)
})
