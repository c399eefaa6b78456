'use strict'
// Load, unload and reload of the addon in worker_threads, in the order that crashed the
// process: the main thread never loads the addon; worker 1 loads it, decides
// and exits; worker 2 loads it again, decides and exits; then workers in parallel and in
// sequence, 12 cycles. It runs in a child process, so a crash (rc 139, SIGSEGV) fails the
// test with its exit status instead of taking the test runner down.

const test = require('node:test')
const assert = require('node:assert/strict')
const { spawn } = require('node:child_process')
const path = require('node:path')
const { startRedis } = require('./support/redis.js')

const pkg = path.join(__dirname, '..')

// The child's main thread: it starts workers and never requires the package itself.
const child = `
const { Worker } = require('node:worker_threads')
const { pkg, config } = JSON.parse(process.argv[1])
const source = \`
  const { parentPort, workerData } = require('node:worker_threads')
  const { Limiter } = require(workerData.pkg)
  ;(async () => {
    const redis = Limiter.fromJson(workerData.config)
    const memory = Limiter.fromJson({ policies: { p: { algorithm: 'fixed_window', limit: 1, window: '1m' } } })
    const d = await redis.check('reload', { policy: 'api' })
    const m = await Promise.all([memory.check('a', 'p'), memory.check('a', 'p')])
    parentPort.postMessage({ source: d.source, allowed: d.allowed, memory: m.map((x) => x.allowed) })
  })()
\`
function run() {
  return new Promise((resolve, reject) => {
    const w = new Worker(source, { eval: true, workerData: { pkg, config } })
    let out
    w.on('message', (m) => (out = m))
    w.on('error', reject)
    w.on('exit', (code) => (code === 0 && out ? resolve(out) : reject(new Error('worker exit ' + code))))
  })
}
;(async () => {
  if (Object.keys(require.cache).some((f) => f.endsWith('.node'))) throw new Error('main loaded the addon')
  const results = [await run(), await run()]
  for (let cycle = 0; cycle < 12; cycle++) {
    results.push(...(await Promise.all([run(), run(), run()])))
    results.push(await run())
  }
  if (Object.keys(require.cache).some((f) => f.endsWith('.node'))) throw new Error('main loaded the addon')
  process.stdout.write(JSON.stringify(results))
})().catch((e) => {
  console.error(e)
  process.exit(2)
})
`

test('the addon loads, unloads and reloads in workers the main thread never loaded it in', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  const config = redis.config({ api: { algorithm: 'fixed_window', limit: 1000, window: '1h' } })
  const arg = JSON.stringify({ pkg, config })
  const { code, signal, stdout, stderr } = await new Promise((resolve, reject) => {
    const p = spawn(process.execPath, ['-e', child, arg], { stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    p.stdout.on('data', (b) => (stdout += b))
    p.stderr.on('data', (b) => (stderr += b))
    const timer = setTimeout(() => p.kill('SIGKILL'), 60_000)
    p.on('error', reject)
    p.on('exit', (code, signal) => {
      clearTimeout(timer)
      resolve({ code, signal, stdout, stderr })
    })
  })
  assert.equal(signal, null, `the child died of ${signal}: ${stderr}`)
  assert.equal(code, 0, `the child exited with ${code}: ${stderr}`)
  const results = JSON.parse(stdout)
  assert.equal(results.length, 2 + 12 * 4)
  for (const r of results) assert.deepEqual(r, { source: 'redis', allowed: true, memory: [true, false] })
})
