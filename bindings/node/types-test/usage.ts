// Compiled (never run) by `tsc --noEmit -p types-test`: the public surface as a
// TypeScript user sees it through the package's own "exports".
import express from 'express'
import Fastify from 'fastify'
import shardlimit, {
  Limiter,
  ManualClock,
  Decision,
  ShardlimitError,
  ConfigError,
  UnknownPolicyError,
  TrustedProxies,
  clientIp,
  expressMiddleware,
  fastifyHook,
  type Lease,
  type Reservation,
  type ErrorCode,
  type RateLimitBody,
  Limit,
  fastifyPlugin,
  type MetricsSnapshot,
  type ShardlimitEvent,
  type LogRecord,
  type Override,
  type OverridePage,
  type DecisionJson,
  type Quota,
  type PolicyInfo,
} from 'shardlimit'
// types req.rateLimit on Node's IncomingMessage (needs @types/node, like Express does)
import type {} from 'shardlimit/http'

export async function usage(): Promise<void> {
  const limiter: Limiter = Limiter.fromConfig('shard-config.json')
  const fromText = Limiter.fromJson('{"policies":{}}', { clock: new ManualClock(0) })
  const hosted: Limiter = Limiter.fromJson('{"policies":{}}', { transport: 'host' })
  const carried: 'host' | 'thread' = hosted.transport
  void carried
  hosted.close()
  Limiter.fromJson('{"policies":{}}', { transport: 'thread' }).close()
  const fromObject = Limiter.fromJson({ policies: { api: { algorithm: 'fixed_window', limit: 5, window: '1m' } } })
  // the README's rate strings as policies
  const fromRates = Limiter.fromJson({ policies: { a: '5/minute', b: '10/second; 1000/day' } })
  void fromRates
  const memory = Limiter.memory()
  const d: Decision = await limiter.check('user:42', { policy: 'api', cost: 2 })
  const allowed: boolean = d.allowed
  const retry: number | null = d.retryAfter
  const n: number = d.limit + d.remaining + d.resetAfter + d.delay
  const source: 'redis' | 'memory' | 'local' | 'fallback' | 'block' | 'local_fallback' = d.source
  const headers: Record<string, string> = d.headers()
  const body: RateLimitBody = d.body()
  const shorthand = await fromText.check('k', 'api')
  const peeked = await fromObject.peek('k', { policy: 'api' })
  const { decision, lease } = await memory.acquire('job', { policy: 'jobs', units: 1 })
  if (lease !== null) {
    const l: Lease = lease
    const released: boolean = await memory.release(l)
    void released
  }
  const charged: Decision = await limiter.charge('user:42', { policy: 'api', cost: 500 })
  const refunded: Decision = await limiter.refund('user:42', 'api')
  const reserved = await limiter.reserve('user:42', { policy: 'api', cost: 100 })
  if (reserved.reservation !== null) {
    const r: Reservation = reserved.reservation
    const settled: Decision = await limiter.settle(r, 42)
    void settled
  }
  void charged
  void refunded
  await limiter.reset('user:42', { policy: 'api' })
  const layered: Decision = await limiter.checkAll([
    { key: 'ip:1.2.3.4', policy: 'ip' },
    { key: 'tenant:7', policy: 'tenant', cost: 2 },
  ])
  const layer: number | null = layered.layer
  await limiter.block('ip:6.6.6.6', { ttl: 60_000, reason: 'abuse' })
  const info = await limiter.blocked('ip:6.6.6.6')
  const left: number | null = info ? info.remaining : null
  const was: boolean = await limiter.unblock('ip:6.6.6.6')
  const ov: Override = await limiter.setOverride('tenant:7', 'tenant', '100/minute', { ttl: 60_000 })
  await limiter.setOverride('tenant:7', 'tenant', { capacity: 10, refill_per_sec: 1 })
  const got: Override | null = await limiter.getOverride('tenant:7', 'tenant')
  const page: OverridePage = await limiter.listOverrides('tenant', { cursor: null, limit: 100 })
  const gone: boolean = await limiter.deleteOverride('tenant:7', 'tenant')
  void [ov.remainingMs, got, page.cursor, gone]
  const ip: string = clientIp('10.0.0.1:443', '203.0.113.9', ['10.0.0.0/8'])
  const proxies = new TrustedProxies(['10.0.0.0/8'])
  const report = limiter.reload({ policies: {} })
  const added: string[] = report.policiesAdded
  void [added, layer, left, was, ip, proxies.clientIp('10.0.0.1', null), limiter.metrics(), limiter.scale]
  try {
    await limiter.check('user:42', { policy: 'nope' })
  } catch (e) {
    if (e instanceof UnknownPolicyError) {
      const code: ErrorCode = e.code
      void code
    } else if (e instanceof ShardlimitError && e.isBackend) {
      void e.kind
    } else if (e instanceof ConfigError) {
      void e.message
    }
  }
  void [allowed, retry, n, source, headers, body, shorthand, peeked, decision, shardlimit.coreVersion()]

  const app = express()
  app.use(expressMiddleware(limiter, { policy: 'api', key: (req) => req.get('x-api-key') ?? null }))
  app.use(expressMiddleware(limiter, { key: (req) => ({ key: req.ip ?? 'unknown', policy: 'ip', cost: 1 }) }))
  // a limit per request, a plan per request, the answer's status and body, layers
  app.use(expressMiddleware<express.Request, express.Response>(limiter, { limit: (req) => (req.get('x-plan') === 'pro' ? 1000 : 100), windowMs: 60_000 }))
  app.use(expressMiddleware<express.Request, express.Response>(limiter, { policy: 'api', plan: (req) => req.get('x-plan'), statusCode: 503, message: { error: 'slow down' } }))
  app.use(expressMiddleware(limiter, { policy: 'api', message: (req) => `slow down ${req.headers['x-user']}` }))
  app.use(expressMiddleware(limiter, { key: (req) => [{ key: `ip:${req.ip}`, policy: 'ip' }, { key: 'tenant:1', policy: 'api', cost: 2 }] }))
  app.get('/', (req, res) => {
    res.json({ remaining: req.rateLimit?.remaining })
  })
  const hook = fastifyHook(limiter, { policy: 'api' })
  void hook

  // route-level limits, ad-hoc limits, handlers, header options
  const login = expressMiddleware<express.Request, express.Response>(limiter, {
    limit: 5,
    windowMs: 60_000,
    name: 'login',
    keyGenerator: (req) => req.ip ?? null,
    skip: (req) => req.get('x-internal') === '1',
    handler: (_req, res, _next, decision) => res.status(429).json({ wait: decision.retryAfter }),
    unavailableHandler: (_req, res) => res.status(503).end(),
    unavailableRetryAfter: 5,
    standardHeaders: true,
    legacyHeaders: false,
    retryAfter: 'date',
    delay: 'wait',
    maxDelayMs: 2000,
  })
  app.post('/login', login, (_req, res) => res.end())
  const burst = new Limit({ algorithm: 'token_bucket', capacity: 10, refill_per_sec: 1 }, { name: 'burst' })
  const adhoc: Decision = await limiter.check('k', { limit: burst, cost: 2 })
  const json: DecisionJson = adhoc.toJSON()
  // multi-limit policies, rate strings and plans
  const rated = new Limit('10/second; 1000/day')
  const multi: Decision = await limiter.check('k', { limit: rated })
  const index: number | null = multi.limitIndex
  const windows: number[] = multi.quotas.map((q: Quota) => q.windowMs)
  const planned: Decision = await limiter.check('k', { policy: 'api', plan: 'pro', cost: 1 })
  await limiter.peek('k', { policy: 'api', plan: 'pro' })
  await limiter.check('k', { limit: { limits: ['5/second', { algorithm: 'token_bucket', rate: '100/minute' }] } })
  const proInfo: PolicyInfo = limiter.planPolicy('pro', 'api')
  const limitCount: number = proInfo.limits?.length ?? 1
  void [index, windows, planned, limitCount, json.limitIndex, json.quotas]
  const m: MetricsSnapshot = limiter.metricsSnapshot()
  limiter.subscribe((e: ShardlimitEvent) => void e.kind)
  limiter.setLogSink((line: string, r: LogRecord) => void (line.length + r.suppressed))
  Limiter.fromJson('{}', { logger: null }).setLogSink({ warn: (line: string) => void line })
  const shadowed: boolean = (await limiter.check('k', { policy: 'api', shadow: true })).shadowDenied
  const shadowReport = await limiter.shadowReport('api', { top: 10 })
  const topKey: string | undefined = shadowReport.keys[0]?.key
  const shadowTotal: number = shadowReport.total + m.policies[0].shadowDenied + m.policies[0].nearLimit
  void [shadowed, topKey, shadowTotal]
  const watcher = limiter.watchConfig('shard-config.json', { intervalMs: 500 })
  watcher.close()
  const fromEnv = Limiter.fromEnv()
  const algorithm: string = fromEnv.policy('api').algorithm
  const keys: number | null = fromEnv.memoryKeys
  void [json, m, algorithm, keys, fromEnv.config.policies, fastifyPlugin]
  fromEnv.close()

  // Fastify: the hook and the plugin as Fastify's own types take them
  const fastify = Fastify()
  fastify.addHook('onRequest', fastifyHook(limiter, { policy: 'api', handler: (_request, reply) => reply.code(429).send('slow') }))
  await fastify.register(fastifyPlugin, { limiter, policy: 'api', global: false })
  fastify.get('/health', { config: { rateLimit: false } }, async () => 'up')
}

// @ts-expect-error: the key must be a string
void Limiter.memory().check(42, { policy: 'api' })
// @ts-expect-error: a policy is required
void Limiter.memory().check('k', { cost: 1 })
// @ts-expect-error: shadow is a boolean
void Limiter.memory().check('k', { policy: 'api', shadow: 'yes' })
// @ts-expect-error: limiters come from the factories
new Limiter()
