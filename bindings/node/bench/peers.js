'use strict'
// One library, one run, for scripts/bench-peers.sh (which alternates the libraries and
// pins this process to one CPU):
//   node bench/peers.js --lib shardlimit|rlf --redis redis://127.0.0.1:PORT [--redis-pid PID]
//        [--total 200000] [--concurrency 64] [--sequential 20000] [--spin-wait 100us]
//        [--transport host|thread]
// The policy: a fixed window of 10^9 per hour over 1000 keys (every request admitted, one
// script call per check in both libraries). Prints one JSON line: decisions/s at
// `concurrency` requests in flight, p50/p99 of sequential requests, and the CPU per
// decision of this process (every thread, /proc/self/stat) and of redis-server
// (/proc/PID/stat) during the concurrent phase, and how many of shardlimit's decisions did
// not come from Redis (`fallbacks`: the run fails if any did). Peers come from $BENCH_PEERS (the scratch
// directory they were installed in), never from bindings/node/node_modules.

const fs = require('node:fs')
const path = require('node:path')
const { createRequire } = require('node:module')
// the peers of bench/peers.lock, as scripts/bench-peers.sh installed them
const peer = process.env.BENCH_PEERS ? createRequire(path.join(process.env.BENCH_PEERS, 'package.json')) : require
const { performance } = require('node:perf_hooks')

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? process.argv[i + 1] : dflt
}
const LIB = arg('lib', 'shardlimit')
const URL = arg('redis')
const REDIS_PID = arg('redis-pid', null)
const TOTAL = Number(arg('total', 200_000))
const CONCURRENCY = Number(arg('concurrency', 64))
const SEQUENTIAL = Number(arg('sequential', 20_000))
const SPIN_WAIT = arg('spin-wait', null)
// shardlimit's transport: the default (the host transport on this plain-TCP shard),
// 'host' (this event loop) or 'thread' (the limiter's I/O thread)
const TRANSPORT = arg('transport', 'default')
const KEYS = 1000
// shardlimit decisions whose source was not Redis: scripts/bench-peers.sh fails the run
let fallbacks = 0
const LIMIT = 1_000_000_000
if (!URL) throw new Error('--redis URL is required')

/** CPU time (µs) of the process whose /proc stat file this is (every thread). */
function cpuOf(file) {
  const stat = fs.readFileSync(file, 'utf8')
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  return ((Number(f[11]) + Number(f[12])) * 1e6) / 100 // USER_HZ = 100
}
const cpuNow = () => ({
  self: cpuOf('/proc/self/stat'),
  redis: REDIS_PID ? cpuOf(`/proc/${REDIS_PID}/stat`) : 0,
})

function shardlimit() {
  // the package under test: $SHARDLIMIT_NODE_PACKAGE (the release artifact), else this tree
  const pkg = process.env.SHARDLIMIT_NODE_PACKAGE || path.join(__dirname, '..')
  const { Limiter } = require(pkg)
  const limiter = Limiter.fromJson({
    timeout_ms: 1000,
    ...(SPIN_WAIT === null ? {} : { spin_wait: SPIN_WAIT }),
    shards: [{ name: 'bench', url: URL }],
    policies: { api: { algorithm: 'fixed_window', limit: LIMIT, window: '1h' } },
  }, { transport: TRANSPORT })
  const opts = { policy: 'api' }
  return {
    version: `shardlimit ${require(path.join(pkg, 'package.json')).version}`,
    // a decision that did not come from Redis (a fallback) is counted, not measured
    check: async (key) => {
      const d = await limiter.check(key, opts)
      if (d.source !== 'redis') fallbacks++
      return d.allowed
    },
    close: () => {},
  }
}

function rlf() {
  const Redis = peer('ioredis')
  const { RateLimiterRedis } = peer('rate-limiter-flexible')
  const client = new Redis(URL)
  const limiter = new RateLimiterRedis({ storeClient: client, keyPrefix: 'rlf', points: LIMIT, duration: 3600 })
  return {
    version: `rate-limiter-flexible ${peer('rate-limiter-flexible/package.json').version} + ioredis ${peer('ioredis/package.json').version}`,
    // consume() rejects when denied: never here (the limit is 10^9)
    check: async (key) => (await limiter.consume(key, 1)).remainingPoints >= 0,
    close: () => client.disconnect(),
  }
}

async function main() {
  const lib = LIB === 'shardlimit' ? shardlimit() : LIB === 'rlf' ? rlf() : null
  if (!lib) throw new Error(`--lib must be shardlimit or rlf, got ${LIB}`)
  let made = 0
  for (let i = 0; i < 2000; i++, made++) await lib.check(`warm:${i % KEYS}`) // connections, scripts, JIT

  let next = 0
  let admitted = 0
  const worker = async () => {
    while (next < TOTAL) {
      const i = next++
      if (await lib.check(`user:${i % KEYS}`)) admitted++
    }
  }
  const c0 = cpuNow()
  const t0 = performance.now()
  await Promise.all(Array.from({ length: CONCURRENCY }, worker))
  const secs = (performance.now() - t0) / 1000
  const c1 = cpuNow()
  made += TOTAL
  if (admitted !== TOTAL) throw new Error(`${LIB}: ${TOTAL - admitted} requests denied`)

  const samples = new Float64Array(SEQUENTIAL)
  for (let i = 0; i < SEQUENTIAL; i++) {
    const s = performance.now()
    await lib.check(`seq:${i % KEYS}`)
    samples[i] = performance.now() - s
  }
  made += SEQUENTIAL
  samples.sort()
  const q = (p) => samples[Math.min(SEQUENTIAL - 1, Math.floor(p * SEQUENTIAL))] * 1000
  lib.close()
  console.log(
    JSON.stringify({
      lib: LIB,
      transport: LIB === 'shardlimit' ? TRANSPORT : null,
      version: lib.version,
      node: process.version,
      decisions_per_sec: TOTAL / secs,
      p50_us: q(0.5),
      p99_us: q(0.99),
      client_cpu_us: (c1.self - c0.self) / TOTAL,
      redis_cpu_us: REDIS_PID ? (c1.redis - c0.redis) / TOTAL : null,
      decisions: made,
      fallbacks,
    })
  )
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
