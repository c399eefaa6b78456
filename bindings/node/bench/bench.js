'use strict'
// shardlimit vs rate-limiter-flexible (+ ioredis) on the same Redis, in one run.
//   node bench/bench.js [--total 200000] [--concurrency 64] [--sequential 20000]
// Starts its own redis-server on a free 127.0.0.1 port (or uses $BENCH_REDIS_URL), runs
// the same policy on both (fixed window, limit high enough that every request is
// admitted, 1000 keys), and prints decisions/s at N concurrent requests and the p50/p99
// latency of sequential requests, plus the CPU each decision costs the event-loop thread,
// shardlimit's I/O thread and redis-server (from /proc). A benchmark, not a test: numbers depend on the machine.

const fs = require('node:fs')
const { performance } = require('node:perf_hooks')
const Redis = require('ioredis')
const { RateLimiterRedis } = require('rate-limiter-flexible')
const { Limiter } = require('..')
const { startRedis } = require('../test/support/redis.js')

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? Number(process.argv[i + 1]) : dflt
}
const TOTAL = arg('total', 200_000)
const CONCURRENCY = arg('concurrency', 64)
const SEQUENTIAL = arg('sequential', 20_000)
const KEYS = 1000
const LIMIT = 1_000_000_000

/** CPU time (µs) used by the thread or process whose /proc stat file this is. */
function statCpu(file) {
  const stat = fs.readFileSync(file, 'utf8')
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  return ((Number(f[11]) + Number(f[12])) * 1e6) / 100 // USER_HZ = 100
}

/**
 * CPU time (µs) used so far by this process's threads, by thread name, and by the bench's
 * own redis-server under the name `redis` (Linux only).
 */
function threadCpu() {
  const out = {}
  try {
    for (const tid of fs.readdirSync('/proc/self/task')) {
      const file = `/proc/self/task/${tid}/stat`
      const stat = fs.readFileSync(file, 'utf8')
      const name = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'))
      out[name] = (out[name] || 0) + statCpu(file)
    }
    if (redisPid) out.redis = statCpu(`/proc/${redisPid}/stat`)
  } catch {}
  return out
}
let redisPid = null

async function throughput(name, check) {
  let next = 0
  let admitted = 0
  const worker = async () => {
    while (next < TOTAL) {
      const i = next++
      if (await check(`user:${i % KEYS}`)) admitted++
    }
  }
  const cpu0 = threadCpu()
  const t0 = performance.now()
  await Promise.all(Array.from({ length: CONCURRENCY }, worker))
  const secs = (performance.now() - t0) / 1000
  const cpu1 = threadCpu()
  if (admitted !== TOTAL) throw new Error(`${name}: ${TOTAL - admitted} requests denied`)
  const perDecision = (thread) => ((cpu1[thread] || 0) - (cpu0[thread] || 0)) / TOTAL
  return {
    rate: TOTAL / secs,
    mainCpu: perDecision('node'),
    ioCpu: perDecision('shardlimit-io'),
    redisCpu: perDecision('redis'),
  }
}

async function latency(check) {
  const samples = new Float64Array(SEQUENTIAL)
  for (let i = 0; i < SEQUENTIAL; i++) {
    const t0 = performance.now()
    await check(`seq:${i % KEYS}`)
    samples[i] = performance.now() - t0
  }
  samples.sort()
  const q = (p) => samples[Math.min(SEQUENTIAL - 1, Math.floor(p * SEQUENTIAL))] * 1000
  return { p50: q(0.5), p99: q(0.99) }
}

async function measure(name, check) {
  for (let i = 0; i < 2000; i++) await check(`warm:${i % KEYS}`) // connections, scripts, JIT
  const tp = await throughput(name, check)
  const lat = await latency(check)
  return { name, ...tp, ...lat }
}

async function main() {
  const own = process.env.BENCH_REDIS_URL ? null : await startRedis()
  const url = process.env.BENCH_REDIS_URL || own.url
  redisPid = own ? own.pid : null
  const ioredis = new Redis(url, { enableAutoPipelining: false })
  try {
    const limiter = Limiter.fromJson({
      timeout_ms: 1000,
      shards: [{ name: 'bench', url }],
      policies: { api: { algorithm: 'fixed_window', limit: LIMIT, window: '1h' } },
    })
    const rlf = new RateLimiterRedis({ storeClient: ioredis, keyPrefix: 'rlf', points: LIMIT, duration: 3600 })

    const sl = await measure('shardlimit', async (key) => (await limiter.check(key, { policy: 'api' })).allowed)
    await ioredis.flushall()
    const flex = await measure('rate-limiter-flexible + ioredis', async (key) => {
      const r = await rlf.consume(key, 1) // rejects when denied; never here
      return r.remainingPoints >= 0
    })

    console.log(`node ${process.version}, ${TOTAL} decisions at concurrency ${CONCURRENCY}, ${SEQUENTIAL} sequential`)
    console.log(`CPU per decision at concurrency ${CONCURRENCY}, µs: the event-loop thread, shardlimit's I/O thread, redis-server`)
    console.log('library                              decisions/s   p50 µs   p99 µs   event loop   I/O thread   redis')
    for (const r of [sl, flex]) {
      console.log(
        `${r.name.padEnd(36)} ${r.rate.toFixed(0).padStart(11)} ${r.p50.toFixed(1).padStart(8)} ${r.p99.toFixed(1).padStart(8)} ${r.mainCpu.toFixed(1).padStart(12)} ${r.ioCpu.toFixed(1).padStart(12)} ${own ? r.redisCpu.toFixed(1).padStart(7) : '      -'}`
      )
    }
    console.log(
      `shardlimit / rate-limiter-flexible: throughput ×${(sl.rate / flex.rate).toFixed(2)}, p50 ×${(sl.p50 / flex.p50).toFixed(2)}`
    )
  } finally {
    ioredis.disconnect()
    if (own) await own.stop()
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
