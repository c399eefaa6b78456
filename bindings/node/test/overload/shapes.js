'use strict'
// The Node shapes of scripts/test-overload.sh (run while it keeps every CPU busy): 20,000
// concurrent checks of one key in this process and an Express route hit 20,000 times over
// 200 connections, on the thread and the host transport, against a healthy Redis with the
// default timeout and on_error (open). Each must admit exactly its limit with no
// fallback. Prints one line per shape; exits 1 when any is off.
//
//   node test/overload/shapes.js            (from bindings/node)

const { startRedis } = require('../support/redis.js')
const { concurrentChecks, expressRoute } = require('../support/load.js')

async function main() {
  const redis = await startRedis()
  let failed = 0
  const report = (what, limit, r) => {
    const ok = r.admitted === limit && r.fallbacks === 0 && (r.errors || 0) === 0
    if (!ok) failed++
    console.log(`${ok ? 'ok  ' : 'FAIL'} node ${what}: admitted ${r.admitted} of limit ${limit}, fallbacks ${r.fallbacks}, ${JSON.stringify(r.statuses || r.kinds || {})}`)
  }
  try {
    for (const transport of ['thread', 'host']) {
      const t0 = Date.now()
      report(`20,000 concurrent check, ${transport} transport`, 100, await concurrentChecks(redis, { transport, n: 20_000, limit: 100 }))
      const t1 = Date.now()
      report(`Express 200 connections x 20,000 requests, ${transport} transport`, 100,
        await expressRoute(redis, { transport, connections: 200, requests: 20_000, limit: 100 }))
      console.log(`     (${t1 - t0} ms, ${Date.now() - t1} ms)`)
    }
  } finally {
    await redis.stop()
  }
  process.exit(failed === 0 ? 0 : 1)
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
