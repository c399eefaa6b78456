'use strict'
// A trivial Express route for scripts/bench-peers.sh, with one limiter in front of it:
//   node bench/http.js --mode none|shardlimit|shardlimit-thread|rlf|erl --redis redis://127.0.0.1:PORT --port P
//        [--transport host|thread]   (shardlimit's transport; the default: the host transport)
// none: no limiter; shardlimit: its express middleware; shardlimit-thread: the same on the
// I/O thread (`transport: 'thread'`); rlf: rate-limiter-flexible's
// RateLimiterRedis (ioredis) in a middleware, as its README shows; erl: express-rate-limit
// with rate-limit-redis (ioredis). Every one by client IP, a fixed window of 10^9 per hour
// (never denied). Prints "ready" once listening. Peers come from $BENCH_PEERS (the scratch
// directory they were installed in), never from bindings/node/node_modules.

const path = require('node:path')
const { createRequire } = require('node:module')
// the peers of bench/peers.lock, as scripts/bench-peers.sh installed them
const peer = process.env.BENCH_PEERS ? createRequire(path.join(process.env.BENCH_PEERS, 'package.json')) : require

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? process.argv[i + 1] : dflt
}
const MODE = arg('mode', 'none')
const URL = arg('redis')
const PORT = Number(arg('port'))
const LIMIT = 1_000_000_000

const express = peer('express')
const app = express()
app.disable('x-powered-by')

if (MODE === 'shardlimit' || MODE === 'shardlimit-thread') {
  const pkg = process.env.SHARDLIMIT_NODE_PACKAGE || path.join(__dirname, '..')
  const { Limiter } = require(pkg)
  const { expressMiddleware } = require(path.join(pkg, 'middleware.js'))
  const limiter = Limiter.fromJson({
    timeout_ms: 1000,
    shards: [{ name: 'bench', url: URL }],
    // on_error closed: a fallback answers 503, which fails the run (only decisions that
    // came from Redis are measured; scripts/bench-peers.sh counts non-2xx)
    policies: { api: { algorithm: 'fixed_window', limit: LIMIT, window: '1h', on_error: 'closed' } },
  }, { transport: MODE === 'shardlimit-thread' ? 'thread' : arg('transport', 'default') })
  app.use(expressMiddleware(limiter, { policy: 'api' }))
} else if (MODE === 'rlf') {
  const Redis = peer('ioredis')
  const { RateLimiterRedis } = peer('rate-limiter-flexible')
  const limiter = new RateLimiterRedis({
    storeClient: new Redis(URL),
    keyPrefix: 'rlf',
    points: LIMIT,
    duration: 3600,
  })
  app.use((req, res, next) => {
    limiter
      .consume(req.ip)
      .then((r) => {
        res.setHeader('X-RateLimit-Limit', LIMIT)
        res.setHeader('X-RateLimit-Remaining', r.remainingPoints)
        next()
      })
      .catch(() => res.status(429).send('Too Many Requests'))
  })
} else if (MODE === 'erl') {
  const Redis = peer('ioredis')
  const { rateLimit } = peer('express-rate-limit')
  const { RedisStore } = peer('rate-limit-redis')
  const client = new Redis(URL)
  app.use(
    rateLimit({
      windowMs: 3600_000,
      limit: LIMIT,
      standardHeaders: 'draft-8',
      legacyHeaders: false,
      store: new RedisStore({ sendCommand: (...args) => client.call(...args) }),
    })
  )
} else if (MODE !== 'none') {
  throw new Error(`--mode must be none, shardlimit, shardlimit-thread, rlf or erl, got ${MODE}`)
}

app.get('/', (req, res) => res.send('ok'))
app.listen(PORT, '127.0.0.1', () => console.log('ready'))
