'use strict'
// An Express app under Node `cluster` with 4 workers sharing one port, each with its own
// limiter on the same Redis (test/cluster.test.js). The primary prints `ready <port>` when
// every worker listens. Config: env SHARDLIMIT_TEST_CONFIG (JSON), SHARDLIMIT_TEST_T0 (µs).

const cluster = require('node:cluster')
const http = require('node:http')

const WORKERS = 4

if (cluster.isPrimary) {
  let listening = 0
  let port = null
  cluster.on('listening', (_w, address) => {
    port = address.port
    if (++listening === WORKERS) process.stdout.write(`ready ${port}\n`)
  })
  cluster.on('exit', (w, code, signal) => {
    if (!process.exitCode && code !== 0 && signal !== 'SIGTERM') {
      process.stderr.write(`worker ${w.process.pid} died: ${code ?? signal}\n`)
      process.exit(1)
    }
  })
  for (let i = 0; i < WORKERS; i++) cluster.fork()
  process.on('SIGTERM', () => {
    for (const id in cluster.workers) cluster.workers[id].kill('SIGTERM')
    process.exit(0)
  })
} else {
  const express = require('express')
  const { Limiter, ManualClock, expressMiddleware } = require('../..')
  const limiter = Limiter.fromJson(process.env.SHARDLIMIT_TEST_CONFIG, {
    clock: new ManualClock(Number(process.env.SHARDLIMIT_TEST_T0)),
  })
  const app = express()
  app.use(expressMiddleware(limiter, { policy: 'api', key: () => 'everyone' }))
  app.get('/', (req, res) => {
    res.setHeader('x-worker', String(process.pid))
    res.send('ok')
  })
  // port 0 in a cluster worker: the primary picks one port for all of them
  http.createServer(app).listen(Number(process.env.SHARDLIMIT_TEST_PORT || 0), '127.0.0.1')
  process.on('SIGTERM', () => process.exit(0))
}
