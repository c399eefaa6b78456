'use strict'
// Install test of the npm packages, CommonJS (scripts/test-dist.sh): node check.cjs PORT VERSION
const assert = require('node:assert/strict')
const { Limiter } = require('shardlimit')
const [port, version] = process.argv.slice(2)

async function main() {
  assert.equal(require('shardlimit/package.json').version, version)
  assert.match(require.resolve('shardlimit'), /node_modules/)
  const limiter = Limiter.fromJson({
    shards: [{ name: 'a', url: `redis://127.0.0.1:${port}` }],
    timeout_ms: 2000,
    policies: { p: { algorithm: 'fixed_window', limit: 5, window: '1h' } },
  })
  const allowed = []
  for (let i = 0; i < 8; i++) {
    const d = await limiter.check('user:cjs', { policy: 'p' })
    assert.equal(d.shard, 0, `decided by ${d.source}`)
    allowed.push(d.allowed)
  }
  assert.deepEqual(allowed, [true, true, true, true, true, false, false, false])
  console.log(`node (require): admitted ${allowed.filter(Boolean).length} of 8 (limit 5)`)
}
main().catch((e) => {
  console.error(e)
  process.exit(1)
})
