'use strict'
// Exact under load, Redis healthy: 20,000 checks of one key started at once in this
// process, and an Express route hit over 200 connections, admit exactly the limit on
// both transports, with the default timeout (50 ms) and on_error (open). The time a check
// waits in this process (the event loop working through 20,000 calls, the batch queue)
// is not Redis being slow: none of them may fall back. (scripts/test-overload.sh runs
// the same shapes with every CPU made busy.)

const test = require('node:test')
const assert = require('node:assert/strict')
const { startRedis } = require('./support/redis.js')
const { concurrentChecks, expressRoute } = require('./support/load.js')

let redis
test.before(async () => {
  redis = await startRedis()
})
test.after(() => redis.stop())

for (const transport of ['thread', 'host']) {
  test(`20,000 concurrent checks of one key admit exactly the limit (${transport} transport)`, async () => {
    const r = await concurrentChecks(redis, { transport, n: 20_000, limit: 1000 })
    assert.deepEqual(
      { admitted: r.admitted, fallbacks: r.fallbacks, errors: r.errors },
      { admitted: 1000, fallbacks: 0, errors: 0 },
      JSON.stringify(r)
    )
  })

  test(`an Express route over 200 connections admits exactly the limit (${transport} transport)`, async () => {
    const r = await expressRoute(redis, { transport, connections: 200, requests: 4000, limit: 100 })
    assert.deepEqual(
      { admitted: r.admitted, fallbacks: r.fallbacks, other: r.total - (r.statuses[200] || 0) - (r.statuses[429] || 0) },
      { admitted: 100, fallbacks: 0, other: 0 },
      JSON.stringify(r)
    )
  })
}
