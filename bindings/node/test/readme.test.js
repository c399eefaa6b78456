'use strict'
// The JavaScript blocks of the READMEs, read from the files and run as written against a
// real Redis: the top-level README's first check, bindings/node/README.md's Check, Express /
// Connect and Fastify blocks and docs/features.md's Node block. Names a block leaves to the reader
// (`app`, `res`, `req`, `isPro`, `planOf`, `upload`, `userId`, `work`, ...) are given; `require('shardlimit')` is this
// package; the config file the blocks load is written to a temporary working directory.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const express = require('express')
const { startRedis } = require('./support/redis.js')

const ROOT = path.join(__dirname, '..', '..', '..')
const POLICIES = {
  login: { algorithm: 'fixed_window', limit: 5, window: '1m', on_error: 'error' },
  api: { algorithm: 'token_bucket', capacity: 100, refill_per_sec: 10, on_error: 'error' },
  ip: { rate: '100/minute', on_error: 'error' },
  tenant: { rate: '100/minute', on_error: 'error' },
}

/** The first fenced `lang` block after `heading` in `file` (from the repository root). */
function block(file, heading, lang = 'js') {
  const text = fs.readFileSync(path.join(ROOT, file), 'utf8')
  const at = text.indexOf(heading)
  assert.ok(at >= 0, `${file} has no heading ${heading}`)
  const m = text.slice(at).match(new RegExp('```' + lang + '\\n([\\s\\S]*?)```'))
  assert.ok(m, `no ${lang} block after ${heading} in ${file}`)
  return m[1]
}

/** Runs `code` as the body of an async function whose free names are `names`' keys, and
 * closes the limiter it made once the test ends. */
async function run(t, code, names) {
  const req = (id) => (id === 'shardlimit' ? require('..') : require(id))
  const all = { require: req, ...names }
  const fn = new Function(...Object.keys(all), `return (async () => {\n${code}\nreturn limiter\n})()`)
  const limiter = await fn(...Object.values(all))
  t.after(() => limiter.close())
  return limiter
}

/** Writes the config file the blocks load. */
function writeConfig(policies) {
  fs.writeFileSync(path.join(dir, 'shard-config.json'), JSON.stringify(redis.config(policies)))
}

let redis
let cwd
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'shardlimit-node-readme-'))
test.before(async () => {
  redis = await startRedis()
  writeConfig(POLICIES)
  cwd = process.cwd()
  process.chdir(dir)
})
test.after(async () => {
  process.chdir(cwd)
  fs.rmSync(dir, { recursive: true, force: true })
  await redis.stop()
})

async function serve(t, app) {
  const server = app.listen(0, '127.0.0.1')
  await new Promise((r) => server.once('listening', r))
  t.after(() => new Promise((r) => server.close(r)))
  return `http://127.0.0.1:${server.address().port}`
}

test("the top-level README's Node first check", async (t) => {
  writeConfig({ api: { algorithm: 'fixed_window', limit: 1, window: '1h', on_error: 'error' } })
  t.after(() => writeConfig(POLICIES))
  const sent = []
  const res = {
    status(code) { sent.push(code); return this },
    set(headers) { sent.push(headers['Retry-After'] !== undefined); return this },
    json(body) { sent.push(body.error); return this },
  }
  const code = block('README.md', '## A first check, per language')
  await run(t, code, { res })
  assert.deepEqual(sent, [])
  // the second check of a 1-per-hour limit is denied, and answered 429 with the decision's
  // headers and body (the limit's decision comes from Redis: on_error "error")
  await run(t, code, { res })
  assert.deepEqual(sent, [429, true, 'rate_limited'])
})

/** Routes after a block's middlewares: what each request got. */
async function exercise(t, app) {
  app.all('/{*rest}', (req, res) => res.json({ remaining: req.rateLimit?.remaining ?? null }))
  const base = await serve(t, app)
  const get = async (p, init) => {
    const r = await fetch(base + p, init)
    return [r.status, r.headers.get('x-ratelimit-limit')]
  }
  return get
}

test("bindings/node/README.md's Express / Connect block", async (t) => {
  const app = express()
  const names = {
    app,
    isPro: (req) => req.get('x-plan') === 'pro',
    planOf: () => undefined,
    upload: (req, res) => res.json({ uploaded: true }),
  }
  await run(t, block('bindings/node/README.md', '### Express / Connect'), names)
  const get = await exercise(t, app)
  // the per-tenant ad-hoc limit by plan, and the layered upload route
  assert.deepEqual(await get('/v1/x', { headers: { 'x-tenant': 't1' } }), [200, '100'])
  assert.deepEqual(await get('/v1/x', { headers: { 'x-tenant': 't2', 'x-plan': 'pro' } }), [200, '100'])
  const [status] = await get('/upload', { method: 'POST', headers: { 'x-tenant': 't1' } })
  assert.equal(status, 200)
  // (the block's /login handler is a comment that never answers: not requested)
})

test("docs/features.md's Node block", async (t) => {
  const app = express()
  await run(t, block('docs/features.md', '## Node'), { app })
  const get = await exercise(t, app)
  const codes = []
  for (let i = 0; i < 3; i++) codes.push((await get('/other'))[0])
  assert.deepEqual(codes, [200, 200, 200])
  assert.equal((await get('/other'))[1], '100')
})

test("bindings/node/README.md's Check block", async (t) => {
  const policies = {
    ...POLICIES,
    api: { ...POLICIES.api, overrides: true },
    jobs: { algorithm: 'concurrency', max: 2, lease_ttl: '1m', on_error: 'error' },
    tokens: { algorithm: 'token_bucket', capacity: 10000, refill_per_sec: 100, on_error: 'error' },
  }
  fs.writeFileSync(path.join(dir, 'shard-config.json'),
    JSON.stringify(redis.config(policies, { plans: { pro: { api: '1000/minute' } } })))
  t.after(() => writeConfig(POLICIES))
  const worked = []
  const names = {
    userId: 42, key: 'k:1', ip: '203.0.113.9', tenant: 't1',
    work: async () => worked.push(true),
    log: () => {},
    newConfig: JSON.parse(fs.readFileSync(path.join(dir, 'shard-config.json'), 'utf8')),
    req: { socket: { remoteAddress: '10.0.0.5' }, headers: { 'x-forwarded-for': '198.51.100.7' } },
  }
  const limiter = await run(t, block('bindings/node/README.md', '### Check'), names)
  assert.deepEqual(worked, [true]) // the lease was taken, the work ran
  assert.throws(() => limiter.policy('api'), /closed/) // the block ends with limiter.close()
})

test("bindings/node/README.md's Fastify block", async (t) => {
  const Fastify = require('fastify')
  const app = Fastify()
  t.after(() => app.close())
  const { Limiter } = require('..')
  const limiter = Limiter.fromConfigFile('shard-config.json')
  t.after(() => limiter.close())
  const names = { app, limiter, handler: async () => 'ok', health: async () => 'ok' }
  const code = block('bindings/node/README.md', '### Fastify')
  const fn = new Function(...Object.keys(names), 'require', `return (async () => {\n${code}\n})()`)
  await fn(...Object.values(names), (id) => (id === 'shardlimit' ? require('..') : require(id)))
  await app.ready()
  const codes = []
  for (let i = 0; i < 6; i++) codes.push((await app.inject({ url: '/login' })).statusCode)
  assert.deepEqual(codes, [200, 200, 200, 200, 200, 429])
  const health = await app.inject({ url: '/health' })
  assert.equal(health.statusCode, 200)
  assert.equal(health.headers['x-ratelimit-limit'], undefined) // never limited
})
