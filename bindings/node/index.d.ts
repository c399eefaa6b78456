// Types of the `shardlimit` package (checked by `tsc --noEmit -p types-test`).

import type { IncomingMessage, ServerResponse } from 'node:http'

/** The JSON body of a 429 response (`decision.body()`). */
export interface RateLimitBody {
  error: 'rate_limited'
  policy: string
  limit: number
  remaining: number
  /** Whole seconds; null when the request can never fit (cost above the limit). */
  retry_after: number | null
  message: string
}

/** `decision.toJSON()`: the decision as the CLI prints it (durations in ms). */
export interface DecisionJson {
  allowed: boolean
  limit: number
  remaining: number
  reset_after_ms: number
  retry_after_ms: number | null
  delay_ms: number
  policy: string
  source: DecisionSource
  shard: number | null
  layer: number | null
}

export type DecisionSource = 'redis' | 'memory' | 'local' | 'fallback' | 'block'

/** The answer to a check. Durations are in milliseconds (with microsecond precision). */
export declare class Decision {
  private constructor()
  /** Whether the request may proceed. A denied check consumed nothing. */
  get allowed(): boolean
  /** The effective limit (units per window, bucket capacity, or max concurrent). */
  get limit(): number
  /** Units still available after this check. */
  get remaining(): number
  /** Milliseconds until the full budget is back with no further traffic. */
  get resetAfter(): number
  /** When denied: milliseconds until the same check could pass; null when allowed or when the cost can never fit. */
  get retryAfter(): number | null
  /** Leaky bucket: milliseconds to wait before sending; 0 otherwise. */
  get delay(): number
  /** The policy that decided. */
  get policy(): string
  /** Who decided. */
  get source(): DecisionSource
  /** The shard index that decided, when a Redis shard did. */
  get shard(): number | null
  /** For a layered check: the index of the layer this decision describes. */
  get layer(): number | null
  /** `X-RateLimit-*`, `RateLimit`, `RateLimit-Policy` and (when denied) `Retry-After`. */
  headers(): Record<string, string>
  /** The JSON body of a 429 response. */
  body(): RateLimitBody
  toJSON(): DecisionJson
}

/** A clock that moves only when told to, for deterministic tests and replays. */
export declare class ManualClock {
  /** A clock reading `startUs` microseconds since the Unix epoch (default 0). */
  constructor(startUs?: number)
  setUs(us: number): void
  advanceUs(us: number): void
  get nowUs(): number
}

/** A held lease of a concurrency policy: plain data, safe to send to another worker. */
export interface Lease {
  key: string
  policy: string
  id: string
  units: number
}

export interface LimiterOptions {
  /** Decide with this clock instead of Redis `TIME` / the monotonic clock (tests). */
  clock?: ManualClock
}

export interface CheckOptions {
  /** A policy name from the config. */
  policy: string
  /** Units this request costs (default 1). */
  cost?: number
}

export interface AcquireOptions {
  policy: string
  /** Units to hold (default 1). */
  units?: number
}

export interface PolicyOptions {
  policy: string
}

export interface Layer {
  key: string
  policy: string
  /** Units (default 1). */
  cost?: number
}

export interface BlockOptions {
  /** Milliseconds; omitted or null: until unblocked. */
  ttl?: number | null
  reason?: string
}

export interface BlockInfo {
  reason: string
  /** Milliseconds left; null for a permanent block. */
  remaining: number | null
}

export interface ReloadReport {
  engineChanged: boolean
  handoff: boolean
  policiesAdded: string[]
  policiesRemoved: string[]
  policiesChanged: string[]
}

export interface ShardRoute {
  index: number
  name: string
}

/**
 * TLS settings of a rediss:// shard, of `cluster`, or (top level) of every TLS shard without
 * its own. The server is verified against the built-in roots, or `ca_file` only when set.
 */
export interface TlsConfig {
  /** PEM file of the CAs to trust instead of the built-in roots. */
  ca_file?: string
  /** PEM file of a client certificate (mTLS); needs `key_file`. */
  cert_file?: string
  key_file?: string
  /** INSECURE: accept any server certificate for any name. */
  insecure_skip_verify?: boolean
}

/** A shardlimit config object (see the repository's shard-config.json). */
export interface ShardlimitConfig {
  shards?: Array<{ name: string; url: string; tls?: TlsConfig; sentinel_tls?: TlsConfig }>
  tls?: TlsConfig
  key_prefix?: string
  timeout_ms?: number | string
  on_error?: 'open' | 'closed' | 'local'
  instances?: number
  policies?: Record<string, Record<string, unknown>>
  [field: string]: unknown
}

export declare class Limiter {
  private constructor()
  /** Loads a JSON config file. Throws ConfigError / IoError. */
  static fromConfig(path: string, options?: LimiterOptions): Limiter
  /** Parses a JSON config (text, or an object). Throws ConfigError. */
  static fromJson(config: string | ShardlimitConfig, options?: LimiterOptions): Limiter
  /** An in-memory limiter with no named policies. */
  static memory(options?: LimiterOptions): Limiter
  get isRedis(): boolean
  get policies(): string[]
  route(key: string): ShardRoute | null
  check(key: string, options: CheckOptions | string): Promise<Decision>
  peek(key: string, options: PolicyOptions | string): Promise<Decision>
  acquire(key: string, options: AcquireOptions | string): Promise<{ decision: Decision; lease: Lease | null }>
  release(lease: Lease): Promise<boolean>
  reset(key: string, options: PolicyOptions | string): Promise<void>
  /** Allowed only if every layer allows; when any denies, no layer consumes. */
  checkAll(layers: Layer[]): Promise<Decision>
  block(key: string, options?: BlockOptions): Promise<void>
  unblock(key: string): Promise<boolean>
  blocked(key: string): Promise<BlockInfo | null>
  /** Scales limits by `factor` (0 < factor <= 1): every policy, or the named ones. */
  setScale(factor: number, policies?: string[]): void
  get scale(): number
  /** Full limits while the observed latency is at most `targetMs`, less above, never below `minFactor`. */
  setLatencyScale(targetMs: number, minFactor: number): void
  /** Feeds the observed latency (ms); returns the scale factor now in force. */
  observeHealth(latencyMs: number): number
  /** Applies a new config; in-flight calls finish on the old one. Throws ConfigError. */
  reload(config: string | ShardlimitConfig): ReloadReport
  /** Reads and applies a config file; a bad file leaves the old config in force. */
  reloadFromFile(path: string): ReloadReport
  /** Per-policy counters and the Redis latency histogram, Prometheus text format. */
  metrics(): string
}

/** Trusted proxy networks, parsed once. */
export declare class TrustedProxies {
  /** `ipv6Prefix` (1 to 128, default 64): the bits of an IPv6 client's address that make its key. */
  constructor(cidrs: string[], ipv6Prefix?: number | null)
  /** The client address: the peer unless it is a trusted proxy; then X-Forwarded-For from the right. */
  clientIp(peer: string, xForwardedFor?: string | null): string
  /** The client's rate-limit key: its address, IPv6 aggregated to the prefix (`2001:db8:1:2::/64`). */
  clientKey(peer: string, xForwardedFor?: string | null): string
}

/** The rate-limit key of a client address: IPv4 (also IPv4-mapped) as itself, IPv6 as its network. */
export declare function ipKey(ip: string, ipv6Prefix?: number): string

/** The client address behind proxies, by the core's trusted-proxy rule. */
export declare function clientIp(peer: string, xForwardedFor?: string | null, trustedProxies?: string[]): string

export type ErrorKindName =
  | 'config'
  | 'invalid_argument'
  | 'connection'
  | 'timeout'
  | 'script'
  | 'routing'
  | 'unknown_policy'
  | 'io'
  | 'internal'
  | 'unavailable'

export type ErrorCode = `ERR_SHARDLIMIT_${Uppercase<ErrorKindName>}`

export declare class ShardlimitError extends Error {
  constructor(message: string, kind?: ErrorKindName)
  readonly kind: ErrorKindName
  readonly code: ErrorCode
  /** True when Redis failed rather than the caller. */
  get isBackend(): boolean
}
export declare class ConfigError extends ShardlimitError {}
export declare class InvalidArgumentError extends ShardlimitError {}
export declare class UnknownPolicyError extends InvalidArgumentError {}
export declare class ConnectionError extends ShardlimitError {}
export declare class TimeoutError extends ShardlimitError {}
export declare class ScriptError extends ShardlimitError {}
export declare class RoutingError extends ShardlimitError {}
export declare class IoError extends ShardlimitError {}
export declare class InternalError extends ShardlimitError {}
/** A shard's circuit breaker is open: it is skipped until it answers again. */
export declare class UnavailableError extends ShardlimitError {}

export declare const ERROR_CLASSES: Readonly<Record<ErrorKindName, typeof ShardlimitError>>
export declare const ERROR_CODES: Readonly<Record<ErrorCode, typeof ShardlimitError>>
export declare function errorKinds(): Array<{ name: string; number: number; code: string }>
export declare function coreVersion(): string
export declare function platformTag(): string

/** What a request is limited as; null/undefined/false: not limited. */
export type RequestKey = string | { key: string; policy?: string; cost?: number } | null | undefined | false

export interface MiddlewareOptions<Req> {
  /** The policy, unless `key` returns one. */
  policy?: string
  /** Maps a request to its key (default: the client IP). */
  key?: (req: Req) => RequestKey
  /** Units a request costs (default 1). */
  cost?: number | ((req: Req) => number)
  /** CIDRs of proxies whose X-Forwarded-For is believed (default none: the peer address is the client). */
  trustedProxies?: string[]
  /** The default key keys IPv6 clients by their network of this many bits (1 to 128, default 64). */
  ipv6Prefix?: number
}

declare module 'node:http' {
  interface IncomingMessage {
    /** Set by the shardlimit middleware. */
    rateLimit?: Decision
  }
}

/** Express / Connect middleware: headers on every response, 429 + JSON body when denied. */
export declare function expressMiddleware<Req extends IncomingMessage = IncomingMessage>(
  limiter: Limiter,
  options?: MiddlewareOptions<Req>
): (req: Req, res: ServerResponse, next: (err?: unknown) => void) => void

/** Minimal shapes of Fastify's request and reply that the hook uses. */
export interface FastifyLikeRequest {
  raw: IncomingMessage
  headers: IncomingMessage['headers']
  rateLimit?: Decision
}
export interface FastifyLikeReply {
  headers(values: Record<string, string>): unknown
  code(status: number): FastifyLikeReply
  type(contentType: string): FastifyLikeReply
  send(payload: unknown): unknown
}

/** A Fastify `onRequest` hook. */
export declare function fastifyHook(
  limiter: Limiter,
  options?: MiddlewareOptions<IncomingMessage>
): (request: FastifyLikeRequest, reply: FastifyLikeReply) => Promise<unknown>

/** A Fastify plugin: `fastify.register(fastifyPlugin, { limiter, policy })`. */
export declare function fastifyPlugin(
  fastify: { addHook(name: 'onRequest', hook: ReturnType<typeof fastifyHook>): unknown },
  options: MiddlewareOptions<IncomingMessage> & { limiter: Limiter },
  done: (err?: Error) => void
): void
