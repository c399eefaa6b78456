'use strict'
// An Express service rate limited by shardlimit's Express middleware.
//
//   (cd examples/node && npm install) && SHARDLIMIT_CONFIG=shard-config.json node examples/node/app.js --port 3001 --policy api
//
// The config comes from $SHARDLIMIT_CONFIG (a path or inline JSON); without it the in-memory
// engine runs a demo policy (5 requests per 10 s, sliding window). Requests are limited per
// client IP (X-Forwarded-For is believed only from $SHARDLIMIT_TRUSTED_PROXIES, comma-separated
// CIDRs); GET /health is not limited. Every limited response carries the X-RateLimit-*,
// RateLimit and RateLimit-Policy headers; a denied request gets 429, Retry-After and the JSON
// body, and never reaches the route. Port 0 picks a free port; the first line printed is
// "listening on http://127.0.0.1:PORT ...".
const http = require('node:http')
const { parseArgs } = require('node:util')
const express = require('express')
const { Limiter, expressMiddleware } = require('shardlimit')

function createApp(limiter, policy, trustedProxies = []) {
  const app = express()
  app.get('/health', (req, res) => res.json({ ok: true })) // before the limiter: not limited
  app.use(expressMiddleware(limiter, { policy, trustedProxies }))
  app.get('/', (req, res) => res.json({ hello: 'world' }))
  app.get('/hello/:name', (req, res) => res.json({ hello: req.params.name }))
  // a limiter error (e.g. on_error "error" and a shard down) answers 503 with a JSON body
  app.use((err, req, res, _next) => res.status(503).json({ error: 'unavailable', code: err.code }))
  return app
}

function main() {
  const { values } = parseArgs({
    options: {
      port: { type: 'string', default: process.env.PORT || '3001' },
      policy: { type: 'string', default: process.env.SHARDLIMIT_POLICY || 'api' },
    },
  })
  const trusted = (process.env.SHARDLIMIT_TRUSTED_PROXIES || '').split(',').map((s) => s.trim()).filter(Boolean)
  const source = process.env.SHARDLIMIT_CONFIG
  let limiter
  let policy = values.policy
  if (source) {
    limiter = source.trim().startsWith('{') ? Limiter.fromJson(source) : Limiter.fromConfigFile(source)
  } else {
    limiter = Limiter.fromJson({ policies: { demo: { algorithm: 'sliding_window', limit: 5, window: '10s' } } })
    policy = 'demo'
  }
  const engine = limiter.isRedis ? 'redis' : source ? 'in-memory' : 'in-memory (no config: 5 per 10 s)'
  // an unknown policy fails at startup, not per request
  limiter.peek('startup', { policy }).then(() => {
    const server = http.createServer(createApp(limiter, policy, trusted))
    server.listen(Number(values.port), '127.0.0.1', () => {
      console.log(`listening on http://127.0.0.1:${server.address().port} engine=${engine} policy=${policy}`)
    })
    process.on('SIGTERM', () => server.close(() => process.exit(0)))
  }, (err) => {
    console.error(`app.js: ${err.message}`)
    process.exit(2)
  })
}

module.exports = { createApp }
if (require.main === module) main()
