// The Node worker of `make demo` (see examples/demo/README.md): sends a fixed number of
// checks over a shared set of (policy, key) pairs and prints one JSON line with what was
// admitted; the Rust, Python and Go workers do exactly the same.
//
//   node examples/demo/worker.mjs --config CONFIG.json [--requests 2400] [--concurrency 16]
//       [--keys 8] [--policies billing,demo_daily,demo_burst] [--instance 2] [--barrier]
//
// Check j goes to pair (j + 7 * instance) % pairs.length, pairs being every policy x keys
// user:0..keys. --barrier waits for standard input to close before sending (the demo starts
// every worker, then releases them together). Progress goes to stderr as `progress DONE/TOTAL`.
import { readFileSync } from 'node:fs'
import { parseArgs } from 'node:util'
import { Limiter } from '../../bindings/node/index.mjs'

const { values: o } = parseArgs({
  options: {
    config: { type: 'string' },
    requests: { type: 'string', default: '2400' },
    concurrency: { type: 'string', default: '16' },
    keys: { type: 'string', default: '8' },
    policies: { type: 'string', default: 'billing,demo_daily,demo_burst' },
    instance: { type: 'string', default: '2' },
    barrier: { type: 'boolean', default: false },
  },
})
if (!o.config) {
  console.error('worker.mjs: --config is required')
  process.exit(2)
}
const requests = Number(o.requests)
const concurrency = Number(o.concurrency)
const instance = Number(o.instance)
const pairs = []
for (const p of o.policies.split(',')) for (let k = 0; k < Number(o.keys); k++) pairs.push([p, `user:${k}`])

const limiter = Limiter.fromConfig(o.config)
// an unknown policy fails now; the peek also opens the shard connections
for (const p of o.policies.split(',')) await limiter.peek('demo:unused', { policy: p })
console.error('ready')
if (o.barrier) {
  process.stdin.resume()
  await new Promise((resolve) => process.stdin.on('end', resolve))
}

const perKey = Object.fromEntries(pairs.map(([p, k]) => [`${p}/${k}`, 0]))
const tally = { allowed: 0, denied: 0, fallback: 0, errors: 0 }
const step = Math.max(1, Math.floor(requests / 20))
let next = 0
let done = 0
async function caller() {
  while (next < requests) {
    const j = next++
    const [policy, key] = pairs[(j + 7 * instance) % pairs.length]
    try {
      const d = await limiter.check(key, { policy })
      if (d.source === 'fallback' || d.source === 'local_fallback') tally.fallback++
      else if (d.allowed) {
        tally.allowed++
        perKey[`${policy}/${key}`]++
      } else tally.denied++
    } catch (e) {
      if (tally.errors++ === 0) console.error(`node worker: ${e.message}`)
    }
    if (++done % step === 0) console.error(`progress ${done}/${requests}`)
  }
}
const started = performance.now()
await Promise.all(Array.from({ length: concurrency }, caller))
const engine = 'shards' in JSON.parse(readFileSync(o.config, 'utf8')) ? 'redis' : 'memory'
console.log(JSON.stringify({
  language: 'node',
  instance,
  engine,
  sent: requests,
  ...tally,
  elapsed_ms: Math.round(performance.now() - started),
  per_key: perKey,
}))
