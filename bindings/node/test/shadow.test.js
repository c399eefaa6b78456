'use strict'
// Shadow mode and near-limit events from Node, on a real Redis: a policy in shadow and the
// per-call `{ shadow: true }` option, `shadowReport` reading the counts back from Redis,
// the events, and shadow end to end through Express and Fastify: a shadow-denied request
// goes through with no 429 and no header that says it is limited.

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

const POLICIES = {
  new: { algorithm: 'fixed_window', limit: 1, window: '1h', shadow: true },
  old: { algorithm: 'fixed_window', limit: 1, window: '1h' },
  plan: { algorithm: 'fixed_window', limit: 10, window: '1h', near_limit: 0.5 },
}
const LIMITED = ['retry-after', 'x-ratelimit-remaining', 'x-ratelimit-reset', 'ratelimit']

function fresh(prefix) {
  return Limiter.fromJson(redis.config(POLICIES, { key_prefix: `${prefix}:` }))
}

test('a policy in shadow, the { shadow: true } option and shadowReport', async () => {
  const l = fresh('api')
  const first = await l.check('u1', 'new')
  assert.equal(first.allowed && !first.shadowDenied, true)
  for (let i = 0; i < 2; i++) {
    const d = await l.check('u1', 'new')
    assert.equal(d.allowed, true)
    assert.equal(d.shadowDenied, true)
    assert.equal(d.retryAfter, null)
    assert.equal(d.toJSON().shadowDenied, true)
    for (const h of LIMITED) assert.equal(Object.keys(d.headers()).map((k) => k.toLowerCase()).includes(h), false, h)
  }
  assert.equal((await l.check('u2', 'old')).allowed, true)
  const enforced = await l.check('u2', { policy: 'old' })
  assert.equal(enforced.allowed || enforced.shadowDenied, false)
  const shadowed = await l.check('u2', { policy: 'old', shadow: true })
  assert.equal(shadowed.allowed && shadowed.shadowDenied, true)
  const adhoc = { limit: { algorithm: 'fixed_window', limit: 1, window: '1h' } }
  await l.check('u3', adhoc)
  assert.equal((await l.check('u3', { ...adhoc, shadow: true })).shadowDenied, true)
  assert.deepEqual(await l.shadowReport('new'), { policy: 'new', total: 2, untracked: 0, keys: [{ key: 'u1', count: 2 }] })
  const top = await l.shadowReport('old', { top: 1 })
  assert.deepEqual([top.total, top.keys], [1, [{ key: 'u2', count: 1 }]])
  // another limiter (another process) reads the same Redis counts
  assert.equal((await fresh('api').shadowReport('new')).total, 2)
  const m = l.metricsSnapshot().policies.find((p) => p.policy === 'new')
  assert.equal(m.shadowDenied, 2)
  assert.match(l.metrics(), /shardlimit_shadow_denied_total\{policy="new"\} 2/)
  await assert.rejects(l.shadowReport('a:b'), (e) => e.code === 'ERR_SHARDLIMIT_INVALID_ARGUMENT' || /policy/.test(e.message))
  await assert.rejects(l.check('u2', { policy: 'old', shadow: 'yes' }), TypeError)
})

test('events: shadow_denied and near_limit', async () => {
  const l = fresh('ev')
  const seen = []
  let wake
  const two = new Promise((resolve) => { wake = resolve })
  l.subscribe((e) => {
    seen.push(e)
    if (seen.length === 3) wake()
  })
  await l.check('k', 'new')
  await l.check('k', 'new')
  for (let i = 0; i < 6; i++) await l.check('p', 'plan')
  await Promise.race([two, new Promise((_, rej) => setTimeout(() => rej(new Error(`events: ${JSON.stringify(seen)}`)), 10_000).unref())])
  // "new" (limit 1) crosses its default near_limit of 0.8 on its first check
  assert.deepEqual(seen.map((e) => [e.kind, e.policy]), [['near_limit', 'new'], ['shadow_denied', 'new'], ['near_limit', 'plan']])
  assert.deepEqual([seen[1].key, seen[1].limit, seen[1].remaining], ['k', '1', '0'])
  assert.deepEqual([seen[2].key, seen[2].limit, seen[2].remaining], ['p', '10', '5'])
  assert.equal(l.metricsSnapshot().policies.find((p) => p.policy === 'plan').nearLimit, 1)
})

function listen(server) {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server.address().port)))
}

async function three(port) {
  const out = []
  for (let i = 0; i < 3; i++) {
    const res = await fetch(`http://127.0.0.1:${port}/`)
    await res.text()
    out.push(res)
  }
  return out
}

function goesThrough(responses) {
  assert.deepEqual(responses.map((r) => r.status), [200, 200, 200])
  assert.equal(responses[0].headers.get('x-ratelimit-remaining'), '0')
  for (const r of responses.slice(1)) {
    for (const h of LIMITED) assert.equal(r.headers.get(h), null, h)
    assert.equal(r.headers.get('x-ratelimit-limit'), '1')
  }
}

test('Express: a shadow-denied request goes through without limited headers', async (t) => {
  const l = fresh('express')
  const app = express()
  app.use(expressMiddleware(l, { policy: 'new', key: () => 'client' }))
  app.get('/', (req, res) => res.send('ok'))
  const server = http.createServer(app)
  const port = await listen(server)
  t.after(() => new Promise((resolve) => server.close(resolve)))
  goesThrough(await three(port))
  assert.equal((await l.shadowReport('new')).total, 2)
})

test('Fastify: a shadow-denied request goes through without limited headers', async (t) => {
  const l = fresh('fastify')
  const app = Fastify()
  app.addHook('onRequest', fastifyHook(l, { policy: 'new', key: () => 'client' }))
  app.get('/', async () => 'ok')
  await app.listen({ port: 0, host: '127.0.0.1' })
  t.after(() => app.close())
  goesThrough(await three(app.server.address().port))
  assert.equal((await l.shadowReport('new')).total, 2)
})
