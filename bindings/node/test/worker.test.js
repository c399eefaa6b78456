'use strict'
// The addon in worker_threads: it loads in each worker, decides on Redis there, maps errors
// to the worker's own classes, and a worker that exits with calls in flight does not take
// the process down.

const test = require('node:test')
const assert = require('node:assert/strict')
const { Worker } = require('node:worker_threads')
const path = require('node:path')
const { Limiter, ManualClock } = require('..')
const { startRedis } = require('./support/redis.js')

const pkg = path.join(__dirname, '..')
const T0 = 1_800_000_000_000_000

function runWorker(source, workerData) {
  return new Promise((resolve, reject) => {
    const w = new Worker(source, { eval: true, workerData: { pkg, ...workerData } })
    let result
    w.on('message', (m) => (result = m))
    w.on('error', reject)
    w.on('exit', (code) => (code === 0 ? resolve(result) : reject(new Error(`worker exited with ${code}`))))
  })
}

test('workers share one Redis budget with the main thread', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  const config = redis.config({ api: { algorithm: 'fixed_window', limit: 50, window: '1h' } })
  const source = `
    const { parentPort, workerData } = require('node:worker_threads')
    const { Limiter, ManualClock, UnknownPolicyError } = require(workerData.pkg)
    ;(async () => {
      const limiter = Limiter.fromJson(workerData.config, { clock: new ManualClock(workerData.t0) })
      const ds = await Promise.all(Array.from({ length: 20 }, () => limiter.check('shared', { policy: 'api' })))
      let err
      try { await limiter.check('shared', { policy: 'nope' }) } catch (e) { err = e }
      parentPort.postMessage({
        allowed: ds.filter((d) => d.allowed).length,
        errIsClass: err instanceof UnknownPolicyError,
        code: err && err.code,
      })
    })()
  `
  const results = await Promise.all([1, 2, 3].map(() => runWorker(source, { config, t0: T0 })))
  const main = Limiter.fromJson(config, { clock: new ManualClock(T0) })
  const mainDecisions = await Promise.all(Array.from({ length: 20 }, () => main.check('shared', { policy: 'api' })))
  const total = results.reduce((n, r) => n + r.allowed, 0) + mainDecisions.filter((d) => d.allowed).length
  assert.equal(total, 50, 'exactly the limit across 3 workers and the main thread (80 checks)')
  for (const r of results) {
    assert.equal(r.errIsClass, true)
    assert.equal(r.code, 'ERR_SHARDLIMIT_UNKNOWN_POLICY')
  }
})

test('a worker terminated with calls in flight leaves the process healthy', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  const config = redis.config({ api: { algorithm: 'sliding_log', limit: 1000, window: '1h' } })
  const source = `
    const { parentPort, workerData } = require('node:worker_threads')
    const { Limiter } = require(workerData.pkg)
    const limiter = Limiter.fromJson(workerData.config)
    for (let i = 0; i < 200; i++) limiter.check('k' + (i % 7), { policy: 'api' })
    parentPort.postMessage('started')
    process.exit(0)
  `
  for (let i = 0; i < 5; i++) assert.equal(await runWorker(source, { config }), 'started')
  const d = await Limiter.fromJson(config).check('after', { policy: 'api' })
  assert.equal(d.allowed, true)
})

test('memory limiters work in a worker', async () => {
  const out = await runWorker(
    `
    const { parentPort, workerData } = require('node:worker_threads')
    const { Limiter } = require(workerData.pkg)
    const l = Limiter.fromJson({ policies: { p: { algorithm: 'fixed_window', limit: 1, window: '1m' } } })
    Promise.all([l.check('a', 'p'), l.check('a', 'p')]).then((ds) => parentPort.postMessage(ds.map((d) => d.allowed)))
  `,
    {}
  )
  assert.deepEqual(out, [true, false])
})
