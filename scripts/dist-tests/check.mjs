// Install test of the npm packages, ES module (scripts/test-dist.sh): node check.mjs PORT
import assert from 'node:assert/strict'
import { Limiter } from 'shardlimit'

const [port] = process.argv.slice(2)
const limiter = Limiter.fromJson({
  shards: [{ name: 'a', url: `redis://127.0.0.1:${port}` }],
  timeout_ms: 2000,
  policies: { p: { algorithm: 'fixed_window', limit: 5, window: '1h' } },
})
const allowed = []
for (let i = 0; i < 8; i++) {
  const d = await limiter.check('user:esm', { policy: 'p' })
  assert.equal(d.shard, 0, `decided by ${d.source}`)
  allowed.push(d.allowed)
}
assert.deepEqual(allowed, [true, true, true, true, true, false, false, false])
console.log(`node (import): admitted ${allowed.filter(Boolean).length} of 8 (limit 5)`)
