'use strict'
// skipSuccessfulRequests / skipFailedRequests (express-rate-limit's options) in Express and
// Fastify: each request reserves its units atomically and a request that does not count
// gets them back, to the window that admitted them, once its response finishes.

const test = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const express = require('express')
const Fastify = require('fastify')
const { Limiter, expressMiddleware, fastifyHook } = require('..')
const { startRedis } = require('./support/redis.js')

let redis
test.before(async () => {
  redis = await startRedis()
})
test.after(() => redis.stop())

const POLICIES = { login: { algorithm: 'fixed_window', limit: 3, window: '1h' } }

async function status(port, path) {
  const res = await fetch(`http://127.0.0.1:${port}${path}`, { headers: { 'x-user': 'u' } })
  await res.text()
  return res.status
}

test('Express: skipSuccessfulRequests counts only failed logins', async (t) => {
  const limiter = Limiter.fromJson(redis.config(POLICIES))
  const app = express()
  const seen = []
  app.use(expressMiddleware(limiter, { policy: 'login', key: (req) => req.get('x-user'), skipSuccessfulRequests: true }))
  app.get('/login', (req, res) => {
    seen.push(req)
    res.status(req.query.pw === 'right' ? 200 : 401).end()
  })
  const server = http.createServer(app)
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => new Promise((resolve) => server.close(resolve)))
  const port = server.address().port
  for (let i = 0; i < 6; i++) {
    assert.equal(await status(port, '/login?pw=right'), 200)
    assert.equal(await seen.at(-1).rateLimitSettled, true, 'a success is given back')
  }
  assert.equal((await limiter.peek('u', 'login')).remaining, 3)
  for (let i = 0; i < 3; i++) {
    assert.equal(await status(port, '/login?pw=wrong'), 401)
    assert.equal(await seen.at(-1).rateLimitSettled, false, 'a failure counts')
  }
  assert.equal(await status(port, '/login?pw=right'), 429)
  assert.equal((await limiter.peek('u', 'login')).remaining, 0)
})

test('Fastify: skipFailedRequests counts only successes, with an ad-hoc limit', async (t) => {
  const limiter = Limiter.fromJson(redis.config({}))
  const app = Fastify()
  app.addHook('onRequest', fastifyHook(limiter, { limit: 2, windowMs: 3_600_000, name: 'adhoc', key: (req) => req.headers['x-user'], skipFailedRequests: true }))
  const seen = []
  app.get('/', async (request, reply) => {
    seen.push(request.raw)
    reply.code(request.query.ok === '1' ? 200 : 500)
    return 'x'
  })
  await app.listen({ port: 0, host: '127.0.0.1' })
  t.after(() => app.close())
  const port = app.server.address().port
  for (let i = 0; i < 4; i++) {
    assert.equal(await status(port, '/?ok=0'), 500)
    assert.equal(await seen.at(-1).rateLimitSettled, true)
  }
  assert.equal(await status(port, '/?ok=1'), 200)
  assert.equal(await seen.at(-1).rateLimitSettled, false)
  assert.equal(await status(port, '/?ok=1'), 200)
  await seen.at(-1).rateLimitSettled
  assert.equal(await status(port, '/?ok=0'), 429)
})

test('the skip options are type-checked and refused on a concurrency limit', () => {
  const limiter = Limiter.fromJson({ policies: { c: { algorithm: 'concurrency', max: 1, lease_ttl: '1s' }, f: { algorithm: 'fixed_window', limit: 1, window: '1s' } } })
  assert.throws(() => expressMiddleware(limiter, { policy: 'f', skipFailedRequests: 'yes' }), TypeError)
  assert.throws(() => expressMiddleware(limiter, { policy: 'f', skipFailedRequests: true, requestWasSuccessful: 1 }), TypeError)
  assert.throws(() => expressMiddleware(limiter, { policy: 'c', skipSuccessfulRequests: true }), /concurrency/)
})
