'use strict'
// Test support: the shapes of load under which the limit must hold exactly while Redis is
// healthy (many concurrent checks in one process, many HTTP connections through the
// Express middleware). Each returns what was admitted and how many decisions fell back:
// with the default on_error (open), a fallback is an admission Redis did not grant.

const http = require('node:http')
const express = require('express')
const { Limiter, expressMiddleware } = require('../..')

let prefix = 0
/** A limiter of `limit` per hour on `redis`, with the default timeout and on_error. */
function limiterOn(redis, limit, transport) {
  const config = {
    shards: [{ name: 's0', url: redis.url }],
    key_prefix: `load${process.pid}-${++prefix}-${Date.now()}:`,
    policies: { hourly: { algorithm: 'fixed_window', limit, window: '1h' } },
  }
  return Limiter.fromJson(config, transport === 'default' ? {} : { transport })
}

/** `n` checks of one key, all started in one turn of the event loop. */
async function concurrentChecks(redis, { transport, n, limit }) {
  const limiter = limiterOn(redis, limit, transport)
  try {
    const ps = []
    for (let i = 0; i < n; i++) ps.push(limiter.check('one-key', 'hourly'))
    const ds = await Promise.allSettled(ps)
    return tally(ds.map((r) => (r.status === 'fulfilled' ? r.value : r.reason)))
  } finally {
    limiter.close()
  }
}

function tally(results) {
  let admitted = 0
  let fallbacks = 0
  let errors = 0
  const kinds = {}
  for (const r of results) {
    if (r instanceof Error) {
      errors++
      kinds[r.kind || r.name] = (kinds[r.kind || r.name] || 0) + 1
      continue
    }
    if (r.allowed) admitted++
    if (r.source !== 'redis') fallbacks++
  }
  return { admitted, fallbacks, errors, kinds, total: results.length }
}

/**
 * An Express route limited to `limit` per hour for every caller, hit `requests` times over
 * `connections` keep-alive connections of this process.
 */
async function expressRoute(redis, { transport, connections, requests, limit }) {
  const limiter = limiterOn(redis, limit, transport)
  const app = express()
  let fallbacks = 0
  const mw = expressMiddleware(limiter, { policy: 'hourly', key: () => 'everyone' })
  app.get('/r', (req, res, next) =>
    mw(req, res, (err) => {
      if (req.rateLimit !== undefined && req.rateLimit.source !== 'redis') fallbacks++
      next(err)
    })
  , (req, res) => res.send('ok'))
  const server = http.createServer(app)
  server.keepAliveTimeout = 60_000
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  const { port } = server.address()
  const agent = new http.Agent({ keepAlive: true, maxSockets: connections })
  const statuses = {}
  let next = 0
  const one = () =>
    new Promise((resolve, reject) => {
      const req = http.get({ host: '127.0.0.1', port, path: '/r', agent }, (res) => {
        res.resume()
        res.on('end', () => resolve(res.statusCode))
      })
      req.on('error', reject)
    })
  const worker = async () => {
    while (next < requests) {
      next++
      const s = await one()
      statuses[s] = (statuses[s] || 0) + 1
    }
  }
  try {
    await Promise.all(Array.from({ length: connections }, worker))
  } finally {
    agent.destroy()
    await new Promise((r) => server.close(r))
    limiter.close()
  }
  return { admitted: statuses[200] || 0, fallbacks, statuses, total: requests }
}

module.exports = { concurrentChecks, expressRoute }
