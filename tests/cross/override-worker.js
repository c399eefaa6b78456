'use strict'
// The Node worker of the cross-language override test (scripts/test-overrides.sh,
// tests/cross/overrides.py): one long-lived limiter that checks KEY under POLICY each time
// a line `check` arrives on standard input, printing the decision as one JSON line. The
// Rust and Go workers do exactly the same.
//
//   node tests/cross/override-worker.js CONFIG.json POLICY KEY
// (the addon: SHARDLIMIT_NATIVE_LIBRARY, as the demo loads it)

const readline = require('node:readline')
const path = require('node:path')
const { Limiter } = require(path.join(__dirname, '..', '..', 'bindings', 'node'))

const [config, policy, key] = process.argv.slice(2)
if (!config || !policy || !key) {
  console.error('usage: override-worker.js CONFIG.json POLICY KEY')
  process.exit(2)
}
const limiter = Limiter.fromConfig(config)
const lines = readline.createInterface({ input: process.stdin })
// one check at a time, in the order the lines came
let chain = Promise.resolve()
lines.on('line', (line) => {
  if (line.trim() !== 'check') return
  chain = chain.then(async () => {
    let out
    try {
      const d = await limiter.check(key, policy)
      out = { lang: 'node', allowed: d.allowed, limit: d.limit, remaining: d.remaining, policy: d.policy, source: d.source }
    } catch (e) {
      out = { lang: 'node', error: String(e) }
    }
    process.stdout.write(JSON.stringify(out) + '\n')
  })
})
lines.on('close', () => chain.then(() => process.exit(0)))
