'use strict'
// Smoke test of examples/node/app.js: a real redis-server and the real service (its own
// process), each on a free 127.0.0.1 port, and real HTTP requests over loopback.

const test = require('node:test')
const assert = require('node:assert/strict')
const { spawn } = require('node:child_process')
const fs = require('node:fs')
const net = require('node:net')
const os = require('node:os')
const path = require('node:path')
const readline = require('node:readline')

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.on('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

/** Starts a process; resolves once a stdout line matches `ready` (at most 20 s). */
function startUntil(cmd, args, env, ready, what) {
  const child = spawn(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'] })
  let log = ''
  child.stderr.on('data', (d) => (log += d))
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill()
      reject(new Error(`${what} did not start in 20 s:\n${log}`))
    }, 20_000)
    const onExit = (code) => {
      clearTimeout(timer)
      reject(new Error(`${what} exited with ${code}:\n${log}`))
    }
    child.once('exit', onExit)
    readline.createInterface({ input: child.stdout }).on('line', (line) => {
      log += line + '\n'
      const m = line.match(ready)
      if (m) {
        clearTimeout(timer)
        child.off('exit', onExit)
        resolve({ child, match: m })
      }
    })
  })
}

function stop(child) {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve()
    child.once('exit', () => resolve())
    child.kill('SIGTERM')
  })
}

let redis, service, base
test.before(async () => {
  const redisPort = await freePort()
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'shardlimit-example-node-'))
  redis = (await startUntil(
    'redis-server',
    ['--port', String(redisPort), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
    process.env,
    /Ready to accept connections/,
    'redis-server'
  )).child
  const config = {
    shards: [{ name: 's0', url: `redis://127.0.0.1:${redisPort}` }],
    timeout_ms: 2000,
    // sliding_log: exact, and no window boundary can fall inside the test
    policies: { api: { algorithm: 'sliding_log', limit: 3, window: '1h' } },
  }
  const started = await startUntil(
    process.execPath,
    [path.join(__dirname, '..', 'app.js'), '--port', '0', '--policy', 'api'],
    { ...process.env, SHARDLIMIT_CONFIG: JSON.stringify(config) },
    /^listening on (http:\/\/127\.0\.0\.1:\d+) engine=redis policy=api$/,
    'examples/node/app.js'
  )
  service = started.child
  base = started.match[1]
})
test.after(async () => {
  if (service) await stop(service)
  if (redis) await stop(redis)
})

test('200s, then 429 with the rate-limit headers and the JSON body', async () => {
  for (const remaining of [2, 1, 0]) {
    const r = await fetch(`${base}/hello/alice`)
    assert.equal(r.status, 200)
    assert.deepEqual(await r.json(), { hello: 'alice' })
    assert.equal(r.headers.get('x-ratelimit-limit'), '3')
    assert.equal(r.headers.get('x-ratelimit-remaining'), String(remaining))
    assert.ok(Number(r.headers.get('x-ratelimit-reset')) > 0)
    assert.equal(r.headers.get('ratelimit-policy'), '"api";q=3;w=3600')
    assert.match(r.headers.get('ratelimit'), new RegExp(`^"api";r=${remaining};t=\\d+$`))
    assert.equal(r.headers.get('retry-after'), null)
  }
  for (let i = 0; i < 2; i++) {
    const r = await fetch(`${base}/`)
    assert.equal(r.status, 429)
    assert.match(r.headers.get('content-type'), /^application\/json/)
    assert.equal(r.headers.get('x-ratelimit-remaining'), '0')
    const retry = Number(r.headers.get('retry-after'))
    assert.ok(retry > 0 && retry <= 3600, `Retry-After ${retry}`)
    const body = await r.json()
    assert.equal(body.error, 'rate_limited')
    assert.equal(body.policy, 'api')
    assert.equal(body.limit, 3)
    assert.equal(body.remaining, 0)
    assert.ok(body.retry_after > 0)
  }
  // not limited, and not counted
  const h = await fetch(`${base}/health`)
  assert.equal(h.status, 200)
  assert.equal(h.headers.get('x-ratelimit-limit'), null)
})
