'use strict'
// Under Node `cluster` (4 workers, one port, one limiter per worker, one Redis) the totals
// are exact: of 250 requests against a limit of 100, exactly 100 are admitted.

const test = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const path = require('node:path')
const { spawn } = require('node:child_process')
const { startRedis, freePort } = require('./support/redis.js')

function get(port) {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path: '/', agent: false }, (res) => {
        res.resume()
        res.on('end', () => resolve({ status: res.statusCode, worker: res.headers['x-worker'] }))
      })
      .on('error', reject)
  })
}

test('4 cluster workers enforce one limit exactly', { timeout: 60_000 }, async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  const port = await freePort()
  const config = redis.config({ api: { algorithm: 'fixed_window', limit: 100, window: '1m' } })
  const app = spawn(process.execPath, [path.join(__dirname, 'support', 'cluster-app.js')], {
    env: {
      ...process.env,
      SHARDLIMIT_TEST_CONFIG: JSON.stringify(config),
      SHARDLIMIT_TEST_T0: String(1_800_000_000_000_000),
      SHARDLIMIT_TEST_PORT: String(port),
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  const exited = new Promise((r) => app.once('exit', r))
  t.after(async () => {
    app.kill('SIGTERM')
    await exited
  })
  await new Promise((resolve, reject) => {
    let out = ''
    app.stdout.on('data', (d) => {
      out += d
      if (out.includes('ready')) resolve()
    })
    app.once('exit', (code) => reject(new Error(`cluster app exited (${code}) before it was ready`)))
  })
  const results = []
  for (let batch = 0; batch < 10; batch++) {
    results.push(...(await Promise.all(Array.from({ length: 25 }, () => get(port)))))
  }
  const admitted = results.filter((r) => r.status === 200)
  assert.equal(admitted.length, 100)
  assert.equal(results.filter((r) => r.status === 429).length, 150)
  const workers = new Set(admitted.map((r) => r.worker))
  assert.ok(workers.size >= 2, `served by ${workers.size} worker(s)`)
})
