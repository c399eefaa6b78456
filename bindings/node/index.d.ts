// Types of the `shardlimit` package (checked by `tsc --noEmit -p types-test` and, with no
// `@types/node` at all, by `-p types-test/no-node`). Nothing here needs Node's own types:
// the middleware is typed against the few request/response members it uses.

/** The JSON body of a 429 response (`decision.body()`). */
export interface RateLimitBody {
  /** Always `rate_limited` (the middleware's 503 says `rate_limit_unavailable`). */
  error: 'rate_limited'
  /** The policy that decided. */
  policy: string
  /** The effective limit. */
  limit: number
  /** Units left; null when the limit could not be measured (a fallback). */
  remaining: number | null
  /** Whole seconds; null when the request can never fit (cost above the limit). */
  retry_after: number | null
  /** A sentence for people. */
  message: string
}

/** `decision.toJSON()` (what `JSON.stringify` writes): the decision's fields, durations in ms. */
export interface DecisionJson {
  /** See `Decision.allowed`. */
  allowed: boolean
  /** See `Decision.limit`. */
  limit: number
  /** See `Decision.remaining`. */
  remaining: number
  /** See `Decision.resetAfter` (ms). */
  resetAfter: number
  /** See `Decision.retryAfter` (ms). */
  retryAfter: number | null
  /** See `Decision.delay` (ms). */
  delay: number
  /** See `Decision.policy`. */
  policy: string
  /** See `Decision.source`. */
  source: DecisionSource
  /** See `Decision.shard`. */
  shard: number | null
  /** See `Decision.layer`. */
  layer: number | null
  /** See `Decision.shadowDenied`. */
  shadowDenied: boolean
  /** See `Decision.limitIndex` (multi-limit policies only). */
  limitIndex?: number
  /** See `Decision.quotas` (multi-limit policies only). */
  quotas?: Quota[]
}

/** One limit of a multi-limit policy as the headers describe it. */
export interface Quota {
  /** The effective limit (units per window, or bucket capacity). */
  limit: number
  /** The window it is measured over, in ms. */
  windowMs: number
}

/** Who decided: a Redis shard, the in-memory engine, local admission, the `on_error` fallback, the block list. */
/** `fallback`: `on_error: open`/`closed` decided, unmeasured (a denial is a 503); `local_fallback`: `on_error: local` decided with this process's share (a denial is a 429). */
export type DecisionSource = 'redis' | 'memory' | 'local' | 'fallback' | 'block' | 'local_fallback'

/**
 * The answer to a check (durations in milliseconds, with microsecond precision): plain data (own properties, so `structuredClone` and
 * `JSON.stringify` keep every field) with the core's rendering as methods.
 */
export declare class Decision {
  private constructor()
  /** Whether the request may proceed. A denied check consumed nothing. */
  readonly allowed: boolean
  /** The effective limit (units per window, bucket capacity, or max concurrent). */
  readonly limit: number
  /** Units still available after this check. */
  readonly remaining: number
  /** Milliseconds until the full budget is back with no further traffic. */
  readonly resetAfter: number
  /** Shadow mode: the limit would have denied, but the policy (or the call, `{ shadow: true }`) is in shadow, so it was allowed and consumed nothing. Its headers do not say limited. */
  readonly shadowDenied: boolean
  /** When denied: milliseconds until the same check could pass; null when allowed or when the cost can never fit. */
  readonly retryAfter: number | null
  /** Leaky bucket: milliseconds to wait before sending; 0 otherwise. */
  readonly delay: number
  /** The policy that decided. */
  readonly policy: string
  /** Who decided. */
  readonly source: DecisionSource
  /** The shard index that decided, when a Redis shard did. */
  readonly shard: number | null
  /** For a layered check: the index of the layer this decision describes. */
  readonly layer: number | null
  /** A multi-limit policy: the index of the limit this decision describes (the one that denied, or the tightest); null for a policy of one limit. */
  readonly limitIndex: number | null
  /** A multi-limit policy: every limit in force, in order (what `RateLimit-Policy` lists); empty for a policy of one limit. */
  readonly quotas: Quota[]
  /** `X-RateLimit-*`, `RateLimit`, `RateLimit-Policy` and (when denied) `Retry-After`. */
  headers(): Record<string, string>
  /** The JSON body of a 429 response. */
  body(): RateLimitBody
  /** The decision's fields as a plain object (what `JSON.stringify` writes). */
  toJSON(): DecisionJson
}

/** A clock that moves only when told to, for deterministic tests and replays. */
export declare class ManualClock {
  /** A clock reading `startUs` microseconds since the Unix epoch (default 0). */
  constructor(startUs?: number)
  /** Sets the time, in microseconds since the Unix epoch. */
  setUs(us: number): void
  /** Moves the time forward by `us` microseconds. */
  advanceUs(us: number): void
  /** The time, in microseconds since the Unix epoch. */
  get nowUs(): number
}

/** A held lease of a concurrency policy: plain data, safe to send to another worker. */
export interface Lease {
  /** The key the lease is held for. */
  key: string
  /** The policy (or ad-hoc limit) name. */
  policy: string
  /** The lease's unique id. */
  id: string
  /** Units held. */
  units: number
}

/** Units reserved by `reserve`, frozen: settle it once with `settle`, which takes only the object `reserve` returned (a copy or a literal is refused). */
export interface Reservation {
  /** The key the units were reserved for. */
  key: string
  /** The policy name. */
  policy: string
  /** Units reserved. */
  units: number
  /** When they were recorded (µs on the engine's clock): settle gives the unused part back to that window. */
  atUs: number
}

/** Options of `charge`, `refund` and `reserve`: a named policy and the units. */
export type ChargeOptions = {
  /** A policy name from the config. */
  policy: string
  /** Units (default 1): charged, given back, or the estimate reserved. */
  cost?: number
}

/** One warning line of the core (`logger` option, `setLogSink`). */
export interface LogRecord {
  /** `'warn'`, or `'error'` for a rejected config. */
  level: 'warn' | 'error'
  /** Always `'shardlimit'`. */
  target: string
  /** Why: `'fallback'`, `'circuit_opened'`, `'handoff_failed'`, `'config_rejected'` or `'refund_failed'`. */
  reason: string
  /** The policy, shard or config file; `'(other)'` past the library's bound of 1024. */
  subject: string
  /** The error kind behind the line (`'connection'`, `'timeout'`, ...). */
  errorKind: string
  /** The error's message. */
  error: string
  /** A fallback: whether `on_error` allowed the check; null otherwise. */
  allowed: boolean | null
  /** How many lines of this reason and subject were not written since the last one. */
  suppressed: number
  /** The whole line. */
  message: string
}

/** Where warning lines go: a function, an object with `warn` (and `error`), or null to drop them. */
export type Logger =
  | ((line: string, record: LogRecord) => void)
  | { warn(line: string, record: LogRecord): void; error?(line: string, record: LogRecord): void }
  | null

/** Options of the factories. */
export interface LimiterOptions {
  /**
   * The core's warning lines (every fallback to `on_error`, a circuit opened, a rejected
   * config; at most one per reason and policy or shard per `log_interval`): `console.warn`
   * by default; null drops them.
   */
  logger?: Logger
  /** Decide with this clock instead of Redis `TIME` / the monotonic clock (tests). */
  clock?: ManualClock
  /**
   * `'host'`: a check of a named policy moves its bytes on this event loop (one
   * `net.Socket` per shard) instead of the limiter's I/O thread; every other operation,
   * and checks of multi-limit, shadow, local-admission or override policies, keep the
   * I/O thread. Standalone Redis shards over plain TCP only (else a `ConfigError`).
   * `'default'` (the default): the host transport where it can serve the shards, else the
   * I/O thread. `'thread'`: every call on the I/O thread (`limiter.transport` says which
   * one a limiter uses).
   */
  transport?: 'default' | 'thread' | 'host'
}

/** A named policy of the config, or an ad-hoc limit: exactly one of the two. */
export type Target = { /** A policy name from the config. */ policy: string; limit?: never; /** Check the policy as this plan of the config has it (`check` and `peek`). */ plan?: string } | { /** An ad-hoc limit (a `Limit`, or its spec, validated on each call). */ limit: Limit | LimitSpec; policy?: never }

/** Options of `check`. */
export type CheckOptions = Target & {
  /** Units this request costs (default 1). */
  cost?: number
  /** Shadow mode for this call: a would-be denial is allowed (`decision.shadowDenied`), consumes nothing and is counted for `shadowReport`. */
  shadow?: boolean
}

/** Options of `acquire`. */
export type AcquireOptions = Target & {
  /** Units to hold (default 1). */
  units?: number
}

/** Options of `peek` and `reset`. */
export type PolicyOptions = Target

/** One layer of `checkAll`. */
export interface Layer {
  /** The key of this layer (`ip:1.2.3.4`, `tenant:7`). */
  key: string
  /** A policy name from the config. */
  policy: string
  /** Units (default 1). */
  cost?: number
}

/** Options of `block`. */
export interface BlockOptions {
  /** Milliseconds; omitted or null: until unblocked. */
  ttl?: number | null
  /** Why (shown by `blocked` and in events). */
  reason?: string
}

/** A block-list entry. */
export interface BlockInfo {
  /** Why the key was blocked. */
  reason: string
  /** Milliseconds left; null for a permanent block. */
  remaining: number | null
}

/** A key's live override of a policy (`setOverride`). */
export interface Override {
  /** The key it applies to. */
  key: string
  /** The policy it overrides (decisions keep its name). */
  policy: string
  /** The limit object as a config policy writes it; `setOverride` takes it back. */
  limit: Record<string, unknown>
  /** Milliseconds left; null for an override until deleted. */
  remainingMs: number | null
  /** Every limit, for an override of several (`limit` is then the first). */
  limits?: Array<Record<string, unknown>>
}

/** One page of `listOverrides`; `cursor` continues it (null: the last page). */
export interface OverridePage {
  /** About the number asked for (every shard's part, in shard order). */
  overrides: Override[]
  /** Pass it back for the next page; null on the last. */
  cursor: string | null
}

/** What a reload changed. */
export interface ReloadReport {
  /** The shards (or Cluster) changed: new connections. */
  engineChanged: boolean
  /** Keys whose shard moved carry their state over for `reshard_handoff`. */
  handoff: boolean
  /** Policies new in this config. */
  policiesAdded: string[]
  /** Policies gone. */
  policiesRemoved: string[]
  /** Policies whose limit or failure mode changed. */
  policiesChanged: string[]
}

/** Where a key routes. */
export interface ShardRoute {
  /** The shard's index in the config. */
  index: number
  /** The shard's name. */
  name: string
}

/** A policy as the core holds it (`limiter.policy(name)`, `limit.info()`). */
export interface PolicyInfo {
  /** The policy name (headers, bodies, metrics and Redis keys show it). */
  name: string
  /** The algorithm. */
  algorithm: 'fixed_window' | 'sliding_window' | 'sliding_log' | 'token_bucket' | 'leaky_bucket' | 'concurrency'
  /** The limit, capacity or max (before scaling). */
  max: number
  /** What a shard failure decides. */
  onError: 'open' | 'closed' | 'local' | 'error'
  /** The algorithm's parameters (`limit`/`windowMs`, `capacity`/`refillPerSec`, `capacity`/`leakPerSec`, `max`/`leaseTtlMs`). */
  params: Record<string, number>
  /** A multi-limit policy: every limit, in order (`algorithm` and `params` describe the first); absent for a policy of one limit. */
  limits?: Array<{ algorithm: PolicyInfo['algorithm']; params: Record<string, number> }>
}

/** The configuration in force (`limiter.config`), without shard URLs (they may hold passwords). */
export interface ConfigInfo {
  /** Who decides. */
  engine: 'redis' | 'memory'
  /** The shards' names, in order. */
  shards: string[]
  /** How many Cluster seed nodes, or null without a Cluster. */
  cluster: number | null
  /** The prefix of every Redis key. */
  keyPrefix: string
  /** The per-call deadline. */
  timeoutMs: number
  /** The default failure mode. */
  onError: 'open' | 'closed' | 'local' | 'error'
  /** How many instances share a `local` fallback's limit. */
  instances: number
  /** Every policy. */
  policies: PolicyInfo[]
}

/** One policy's counters. */
export interface PolicyMetrics {
  /** The policy (or ad-hoc limit) name. */
  policy: string
  /** Allowed decisions, whoever made them. */
  allowed: number
  /** Denied decisions, blocks and fallbacks included. */
  denied: number
  /** Decisions made by `on_error` because a shard failed. */
  fallback: number
  /** Denied by the block list. */
  blocked: number
  /** Admitted from a local batch without a Redis call. */
  localAdmitted: number
  /** Redis calls that failed or timed out. */
  redisErrors: number
  /** Checks a limit in shadow mode would have denied (allowed, and counted in `allowed`). */
  shadowDenied: number
  /** Allowed checks that crossed the policy's `near_limit` fraction. */
  nearLimit: number
}

/** `limiter.shadowReport(policy)`: a policy's shadow-mode denials, summed over every shard. */
export interface ShadowReport {
  /** The policy reported on. */
  policy: string
  /** Every shadow denial (listed keys, keys cut by `top`, and `untracked`). */
  total: number
  /** Denials of keys beyond the bound of 1000 keys per policy per shard. */
  untracked: number
  /** The most-denied keys first (ties by key). */
  keys: { /** The key. */ key: string; /** Its shadow denials. */ count: number }[]
}

/** `limiter.metricsSnapshot()`: everything a limiter counts. */
export interface MetricsSnapshot {
  /** Per policy. */
  policies: PolicyMetrics[]
  /** Redis call latency: counts per bucket (not cumulative; the last is above the last bound). */
  redisLatency: { /** Upper bounds (µs). */ bucketsUs: number[]; /** Counts per bucket. */ counts: number[]; /** Sum (µs). */ sumUs: number; /** Calls. */ count: number }
  /** Events not written to the Redis stream because its queue was full. */
  eventsDropped: number
}

/** An event of the core (`limiter.subscribe`): `kind` plus its fields, as strings (as in the events stream). */
export interface ShardlimitEvent {
  /** `denied`, `blocked` (met the block list, or `auto`: put on it), `fallback` (a shard failed), `circuit`, `shadow_denied` (a would-be denial allowed in shadow mode), `near_limit` (usage crossed the policy's `near_limit` fraction), `reloaded` (the config was reloaded: `policiesChanged` and the others, comma-separated), `reload_rejected` (a watched file's new config was refused: `path`, `error`). */
  kind: 'denied' | 'blocked' | 'fallback' | 'circuit' | 'shadow_denied' | 'near_limit' | 'reloaded' | 'reload_rejected'
  /** The policy (denied, blocked, fallback). */
  policy?: string
  /** The key (denied, blocked, fallback). */
  key?: string
  /** Every other field: `limit`, `retryAfterMs`, `auto`, `error`, `allowed`, `shard`, `state`. */
  [field: string]: string | undefined
}

/** A running `watchConfig`. */
export interface ConfigWatcher {
  /** Stops watching. */
  close(): void
}

/** An ad-hoc limit's spec: a policy object of the config format (`algorithm` and its parameters, or `rate`, or `limits`), or a rate string (`"10/second; 1000/day"`). */
export type LimitSpec = string | LimitObject

/** A policy object of the config format. */
export interface LimitObject {
  /** The algorithm (the config's `default_algorithm` with a `rate`). */
  algorithm?: PolicyInfo['algorithm']
  /** A rate string: `"100/minute"`, `"10/second; 1000/day"`. */
  rate?: string
  /** Several limits checked together: rate strings or objects. */
  limits?: Array<string | LimitObject>
  /** Every parameter of the config format: `limit`, `window`, `capacity`, `refill_per_sec`, `leak_per_sec`, `max`, `lease_ttl`, `on_error`, `window_offset` (`'none'` or `'per_key'`), ... */
  [field: string]: unknown
}

/** An ad-hoc limit, validated once (a bad one throws `ConfigError` naming the field). */
export declare class Limit {
  /** `name`: the policy name its decisions, headers, metrics and Redis keys carry (default: the limit's parameters). Two limits of one name share their counters. */
  constructor(spec: LimitSpec, options?: { name?: string })
  /** The policy name its decisions carry. */
  readonly name: string
  /** The algorithm. */
  readonly algorithm: PolicyInfo['algorithm']
  /** The limit as the core holds it. */
  info(): PolicyInfo
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
  /** PEM file of the client certificate's key. */
  key_file?: string
  /** INSECURE: accept any server certificate for any name. */
  insecure_skip_verify?: boolean
}

/** A shardlimit config object (see the repository's shard-config.json). */
export interface ShardlimitConfig {
  /** Redis shards (`redis://`, `rediss://`, `redis+sentinel://`). */
  shards?: Array<{ name: string; url: string; tls?: TlsConfig; sentinel_tls?: TlsConfig }>
  /** TLS of every TLS shard without its own. */
  tls?: TlsConfig
  /** The prefix of every Redis key (default `sl:`). */
  key_prefix?: string
  /** The per-call deadline (default 50 ms). */
  timeout_ms?: number | string
  /** What a shard failure decides (default `open`). */
  on_error?: 'open' | 'closed' | 'local' | 'error'
  /** How many instances share a `local` fallback's limit. */
  instances?: number
  /** Named policies: a spec object (`{ algorithm: 'fixed_window', limit: 5, window: '1m' }`) or a rate string (`'5/minute'`, `'10/second; 1000/day'`). */
  policies?: Record<string, string | Record<string, unknown>>
  /** Every other field of the config format. */
  [field: string]: unknown
}

/** A limiter: Redis shards (or the in-memory engine) and named policies. */
export declare class Limiter {
  private constructor()
  /** Loads a JSON config file (the name of spec/names.json in every language). Throws ConfigError / IoError. */
  static fromConfigFile(path: string, options?: LimiterOptions): Limiter
  /** The same as `fromConfigFile` (its earlier name, kept for existing code). */
  static fromConfig(path: string, options?: LimiterOptions): Limiter
  /** Parses a JSON config (text, or an object). Throws ConfigError. */
  static fromJson(config: string | ShardlimitConfig, options?: LimiterOptions): Limiter
  /** An in-memory limiter with no named policies. */
  static memory(options?: LimiterOptions): Limiter
  /** `$SHARDLIMIT_CONFIG` (a path, or inline JSON); the in-memory engine when unset. */
  static fromEnv(options?: LimiterOptions): Limiter
  /** True when Redis shards decide, false for the in-memory engine. */
  get isRedis(): boolean
  /**
   * Which transport carries `check` of a named policy: `'host'` (this event loop, the
   * default on standalone plain-TCP shards) or `'thread'` (the limiter's I/O thread: TLS,
   * Sentinel, Cluster and Unix-socket shards, every in-memory limiter, or `transport:
   * 'thread'`).
   */
  get transport(): 'host' | 'thread'
  /** The names of the configured policies. */
  get policies(): string[]
  /**
   * How many reloads are in force (0 at first, one more per reload): a cheap test of
   * whether something derived from the config must be derived again.
   */
  get configGeneration(): number
  /** Keys held by the in-memory engine; null on Redis. */
  get memoryKeys(): number | null
  /** The configuration in force. */
  get config(): ConfigInfo
  /** A configured policy. Throws UnknownPolicyError (an InvalidArgumentError). */
  policy(name: string): PolicyInfo
  /** The policy as plan `plan` of the config has it (its limits under the policy's name); check under a plan with `check(key, { policy, plan })`. */
  planPolicy(plan: string, policy: string): PolicyInfo
  /** The shard `key` routes to, or null on the in-memory engine. */
  route(key: string): ShardRoute | null
  /** Takes `cost` units for `key` (a policy name, `{ policy, cost }` or an ad-hoc `{ limit, cost }`); a denial consumes nothing. */
  check(key: string, options: CheckOptions | string): Promise<Decision>
  /** The decision a check of one unit would make now, consuming nothing. */
  peek(key: string, options: PolicyOptions | string): Promise<Decision>
  /** The shadow-mode denials of the policy named `policy` by key, summed over every shard (in memory: this process's counts); `{ top }` keeps that many keys. */
  shadowReport(policy: string, options?: { top?: number }): Promise<ShadowReport>
  /** Takes a lease of a concurrency policy; `lease` is null when denied. */
  acquire(key: string, options: AcquireOptions | string): Promise<{ decision: Decision; lease: Lease | null }>
  /** Gives a lease back (pass `{ limit }` for an ad-hoc limit's lease); false when it was no longer held. */
  release(lease: Lease, options?: Target): Promise<boolean>
  /** Consumes units without ever denying: the key may go into debt (capped at one limit) and later checks are denied until it is repaid. Always allowed; `remaining` is 0 in debt. */
  charge(key: string, options: ChargeOptions | string): Promise<Decision>
  /** Gives units back, never above the limit. */
  refund(key: string, options: ChargeOptions | string): Promise<Decision>
  /** A check of an estimated cost; `reservation` is null when denied. */
  reserve(key: string, options: CheckOptions | string): Promise<{ decision: Decision; reservation: Reservation | null }>
  /** Settles a reservation at its actual cost (0 gives it all back): the unused part goes back to the window that admitted it, the excess is charged. */
  settle(reservation: Reservation, actual: number, options?: Target): Promise<Decision>
  /** Connects to every shard and loads the scripts within `timeoutMs` (default 5000, its own budget), so that the first checks do not spend their deadline connecting; rejects with the shard's error when one does not answer. */
  connect(options?: { timeoutMs?: number }): Promise<void>
  /** Forgets `key`'s state under a policy. */
  reset(key: string, options: PolicyOptions | string): Promise<void>
  /** Allowed only if every layer allows; when any denies, no layer consumes. */
  checkAll(layers: Layer[]): Promise<Decision>
  /** Puts `key` on the block list (every limiter sharing the shards sees it). */
  block(key: string, options?: BlockOptions): Promise<void>
  /** Takes `key` off the block list; true when it was on it. */
  unblock(key: string): Promise<boolean>
  /** `key`'s block-list entry, or null. */
  blocked(key: string): Promise<BlockInfo | null>
  /** Sets `key`'s live override of `policy` (`"overrides": true` in its config) to a rate string or a limit object; every process's next check of the key uses it. */
  setOverride(key: string, policy: string, limit: string | Record<string, unknown>, options?: { ttl?: number | null }): Promise<Override>
  /** `key`'s override of `policy`, or null. */
  getOverride(key: string, policy: string): Promise<Override | null>
  /** One page of `policy`'s overrides on every shard (`limit` about 1 to 10000, default 1000). */
  listOverrides(policy: string, options?: { cursor?: string | null; limit?: number }): Promise<OverridePage>
  /** Deletes `key`'s override of `policy`; true when it had one. */
  deleteOverride(key: string, policy: string): Promise<boolean>
  /** Scales limits by `factor` (0 < factor <= 1): every policy, or the named ones. */
  setScale(factor: number, policies?: string[]): void
  /** The global scale factor in force. */
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
  /** The same counters as an object. */
  metricsSnapshot(): MetricsSnapshot
  /** Calls `listener` on the event loop for each event (denials, blocks, fallbacks, circuit changes). Never keeps the process alive. */
  subscribe(listener: (event: ShardlimitEvent) => void): void
  /** Where the core's warning lines go from now on (as the `logger` option); runs on the event loop. */
  setLogSink(logger: Logger | undefined): void
  /** Reloads whenever the file changes (checked every `intervalMs`, default 1000); a bad file is ignored. */
  watchConfig(path: string, options?: { intervalMs?: number }): ConfigWatcher
  /** Lets go of the connections and the I/O thread once calls in flight finish; later calls throw InvalidArgumentError. */
  close(): void
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

/** The core's error kinds (spec/errors.json). */
export type ErrorKindName =
  | 'config'
  | 'invalid_argument'
  | 'connection'
  | 'timeout'
  | 'script'
  | 'unknown_policy'
  | 'io'
  | 'internal'
  | 'unavailable'
  | 'overloaded'

/** The stable `err.code` of each kind. */
export type ErrorCode = `ERR_SHARDLIMIT_${Uppercase<ErrorKindName>}`

/** Every error of the core; branch on the subclass or on `code`. */
export declare class ShardlimitError extends Error {
  /** An error of `kind` (default `internal`); the addon builds these itself. */
  constructor(message: string, kind?: ErrorKindName)
  /** The core's kind name. */
  readonly kind: ErrorKindName
  /** `ERR_SHARDLIMIT_<KIND>`. */
  readonly code: ErrorCode
  /** True when Redis failed rather than the caller. */
  get isBackend(): boolean
}
/** The configuration is invalid (the message names the field). */
export declare class ConfigError extends ShardlimitError {}
/** An argument of a call is invalid (empty key, zero cost, a closed limiter...). */
export declare class InvalidArgumentError extends ShardlimitError {}
/** A named policy does not exist: a special case of an invalid argument. */
export declare class UnknownPolicyError extends InvalidArgumentError {}
/** A Redis shard could not be reached or the connection broke (backend). */
export declare class ConnectionError extends ShardlimitError {}
/** A Redis shard did not answer within the deadline (backend). */
export declare class TimeoutError extends ShardlimitError {}
/** Redis answered with an error, or with a reply shardlimit does not trust (backend). */
export declare class ScriptError extends ShardlimitError {}
/** Reading a file (a configuration) failed. */
export declare class IoError extends ShardlimitError {}
/** A bug in shardlimit (please report it). */
export declare class InternalError extends ShardlimitError {}
/** A shard's circuit breaker is open: it is skipped until it answers again (backend). */
export declare class UnavailableError extends ShardlimitError {}
/** More checks wait for a shard's connection in this process than its queue holds
 * (`max_queue`): refused, neither admitted nor sent to `on_error` (not a backend error). */
export declare class OverloadedError extends ShardlimitError {}

/** Kind name → class. */
export declare const ERROR_CLASSES: Readonly<Record<ErrorKindName, typeof ShardlimitError>>
/** `err.code` → class. */
export declare const ERROR_CODES: Readonly<Record<ErrorCode, typeof ShardlimitError>>
/** The core's error kinds with their numbers (the C result codes) and JS codes. */
export declare function errorKinds(): Array<{ name: string; number: number; code: string }>
/** The version of the core the addon was built from. */
export declare function coreVersion(): string
/** The napi-rs platform tag of this process (`linux-x64-gnu`, ...). */
export declare function platformTag(): string

/** The members of a Node `IncomingMessage` the middleware reads (no `@types/node` needed). */
export interface HttpRequestLike {
  /** Request headers (`x-forwarded-for` is read for the default key). */
  headers: Record<string, string | string[] | undefined>
  /** The peer (`remoteAddress`) is the default key. */
  socket?: { remoteAddress?: string } | null
  /** Express: the client address under the app's `trust proxy` setting, the default key when that setting is on and `trustedProxies` is not given. */
  ip?: string
  /** Express: the app, whose `trust proxy` setting is read. */
  app?: { get(name: string): unknown }
  /** Set by the middleware: the decision this response reports (the tightest of several limiters). */
  rateLimit?: Decision
}

/** The members of a Node `ServerResponse` the middleware uses. */
export interface HttpResponseLike {
  /** The response status. */
  statusCode: number
  /** Sets one header. */
  setHeader(name: string, value: string): unknown
  /** Removes one header. */
  removeHeader(name: string): unknown
  /** Ends the response. */
  end(body?: string): unknown
  /** `finish` and `close` end a concurrency lease. */
  once(event: 'finish' | 'close', listener: () => void): unknown
  /** Removes a listener. */
  off(event: 'finish' | 'close', listener: () => void): unknown
}

/** One layer of a layered check made by a key function's array. */
export interface RequestLayer {
  /** The layer's key (bounded as any key: longer than 1,024 bytes becomes `sha256:<hex>`). */
  key: string
  /** The layer's policy (default: the middleware's). */
  policy?: string
  /** The layer's ad-hoc limit instead of a policy. */
  limit?: Limit
  /** Units (default 1). */
  cost?: number
}

/**
 * What a request is limited as; null/undefined/false: not limited. An array is a layered
 * check: several limits on one request, atomically (`checkAll`: allowed only if every layer
 * allows; a denial consumes nothing). A key longer than 1,024 bytes is replaced by
 * `sha256:<hex>` of it, so a client's header can never make a request fail.
 */
export type RequestKey = string | { key: string; policy?: string; plan?: string; cost?: number } | RequestLayer[] | null | undefined | false

/** Options of every middleware (express-rate-limit's vocabulary where it fits). */
export interface MiddlewareOptions<Req = HttpRequestLike, Res = HttpResponseLike> {
  /** The policy (checked when the middleware is built: an unknown one throws UnknownPolicyError), unless `key` returns one. */
  policy?: string
  /** An ad-hoc limit instead of a policy: a number of requests per `windowMs` (fixed window), a function of the request giving that number (a limit per tenant), a `LimitSpec`, or a `Limit`. */
  limit?: number | ((req: Req) => number) | LimitSpec | Limit
  /** The plan of the config a request is checked under (`check(key, { policy, plan })`): a name, or a function of the request (null/undefined: the policy itself). */
  plan?: string | ((req: Req) => string | null | undefined)
  /** The status of a request over its limit (default 429). */
  statusCode?: number
  /** The body of a request over its limit instead of the core's JSON: a string (sent as text), an object (sent as JSON), or a function of (req, res) giving either (or a Promise of it). */
  message?: string | Record<string, unknown> | ((req: Req, res: Res) => string | Record<string, unknown> | Promise<string | Record<string, unknown>>)
  /** With a numeric `limit`: the window (default 60 000 ms). */
  windowMs?: number
  /** The name of an ad-hoc limit in headers, bodies, metrics and Redis keys; limits of one name share counters. */
  name?: string
  /** Maps a request to its key (default: the client IP); may return a Promise. */
  key?: (req: Req) => RequestKey | Promise<RequestKey>
  /** express-rate-limit's name for `key`. */
  keyGenerator?: (req: Req) => RequestKey | Promise<RequestKey>
  /** Units a request costs (default 1). */
  cost?: number | ((req: Req) => number | Promise<number>)
  /** True: the request is not limited (and gets no headers). */
  skip?: (req: Req, res: Res) => boolean | Promise<boolean>
  /** Answers a request over the limit (default: 429 and the core's JSON body). Headers are set already. */
  handler?: (req: Req, res: Res, next: (err?: unknown) => void, decision: Decision) => unknown
  /** Answers a request the fallback denied because the limit could not be checked (default: 503 and a JSON body). */
  unavailableHandler?: (req: Req, res: Res, next: (err?: unknown) => void, decision: Decision) => unknown
  /** `Retry-After` of a 503, in seconds (default: the decision's, 1 s for `on_error: closed`). */
  unavailableRetryAfter?: number
  /** The IETF fields (delta seconds): true or `'draft-8'` (the default) the core's `RateLimit-Policy: "api";q=100;w=60` and `RateLimit: "api";r=50;t=30`; `'draft-7'` `RateLimit: limit=100, remaining=50, reset=30`; `'draft-6'` `RateLimit-Limit`, `-Remaining`, `-Reset` (each with `RateLimit-Policy: 100;w=60`, as express-rate-limit sends them); false none. */
  standardHeaders?: boolean | 'draft-6' | 'draft-7' | 'draft-8'
  /** `X-RateLimit-Limit`, `-Remaining` and `-Reset` (a Unix timestamp, in seconds). Default true. */
  legacyHeaders?: boolean
  /** `Retry-After` as delta seconds (default) or an HTTP date. */
  retryAfter?: 'seconds' | 'date'
  /** A leaky bucket's delay: hold the request for it (`wait`, default) or answer 429 (`reject`). */
  delay?: 'wait' | 'reject'
  /** With `delay: 'wait'`: a longer delay is answered 429 (default: no bound). */
  maxDelayMs?: number
  /** The start-up connect to every shard, begun when the first middleware of a limiter is built (milliseconds of its own; default 5000, 0 skips it): requests that arrive before it ends wait for it, and a failure is a process warning. */
  warmUpMs?: number
  /** CIDRs of proxies whose X-Forwarded-For is believed (default: none, the peer address is the client; or, in an Express app with `trust proxy` set, `req.ip`). */
  trustedProxies?: string[]
  /** The default key keys IPv6 clients by their network of this many bits (1 to 128, default 64). */
  ipv6Prefix?: number
  /** Count only failed requests: each request reserves its units atomically, and a successful one gets them back when its response finishes (to the window that admitted them). Not for a concurrency limit. */
  skipSuccessfulRequests?: boolean
  /** Count only successful requests: a failed one (or one whose connection closed first) gets its reserved units back. */
  skipFailedRequests?: boolean
  /** Whether a finished request succeeded (default: `res.statusCode < 400`); Node's own req/res, also under Fastify. With either skip option, Node's `req.rateLimitSettled` is a Promise of whether the request's units were given back, settled once that is done. */
  requestWasSuccessful?: (req: HttpRequestLike, res: HttpResponseLike) => boolean
}

/**
 * Express / Connect middleware, global (`app.use(mw)`) or per route (`app.post('/login', mw, handler)`):
 * one set of headers on every limited response, 429 when denied, 503 when the limit could not be checked,
 * errors of `on_error: error` to `next(err)`. The decision is on `req.rateLimit`.
 */
export declare function expressMiddleware<Req extends HttpRequestLike = HttpRequestLike, Res extends HttpResponseLike = HttpResponseLike>(
  limiter: Limiter,
  options?: MiddlewareOptions<Req, Res>
): (req: Req, res: Res, next: (err?: unknown) => void) => void

/** The members of Fastify's request the hook uses. */
export interface FastifyLikeRequest {
  /** The Node request. */
  raw: HttpRequestLike & { destroyed?: boolean }
  /** Request headers. */
  headers: HttpRequestLike['headers']
  /** True for a request no route matched: not limited. */
  is404?: boolean
  /** Set by the hook. */
  rateLimit?: Decision
}
/** The members of Fastify's reply the hook uses. */
export interface FastifyLikeReply {
  /** The Node response. */
  raw: HttpResponseLike
  /** Sets one header. */
  header(name: string, value: string): unknown
  /** Removes one header. */
  removeHeader(name: string): unknown
  /** Sets the status. */
  code(status: number): FastifyLikeReply
  /** Sets the content type. */
  type(contentType: string): FastifyLikeReply
  /** Sends the body. */
  send(payload: unknown): unknown
  /** Takes the response over (a client that left while a leaky bucket held it). */
  hijack(): unknown
}

/** Fastify hook options: `handler`/`unavailableHandler` take `(request, reply, decision)`. */
export type FastifyOptions = Omit<MiddlewareOptions<HttpRequestLike, HttpResponseLike>, 'handler' | 'unavailableHandler'> & {
  /** Answers a request over the limit; must send the reply. */
  handler?: (request: FastifyLikeRequest, reply: FastifyLikeReply, decision: Decision) => unknown
  /** Answers a request the fallback denied; must send the reply. */
  unavailableHandler?: (request: FastifyLikeRequest, reply: FastifyLikeReply, decision: Decision) => unknown
}

/** A Fastify `onRequest` hook, for `addHook` or a route's `onRequest` option. 404s are not limited. */
export declare function fastifyHook(
  limiter: Limiter,
  options?: FastifyOptions
): (request: FastifyLikeRequest, reply: FastifyLikeReply) => Promise<unknown>

/**
 * A Fastify plugin: `fastify.register(fastifyPlugin, { limiter, policy })`. Limits the routes registered
 * after it (never 404s): all of them, or with `global: false` only those with `config.rateLimit`. A route's
 * `config: { rateLimit: false }` is not limited; `config: { rateLimit: { ...options } }` overrides the plugin's.
 */
export declare function fastifyPlugin(
  fastify: { addHook(name: 'onRoute', hook: (route: { url: string; config?: { rateLimit?: false | FastifyOptions }; onRequest?: unknown }) => void): unknown },
  options: FastifyOptions & { limiter: Limiter; global?: boolean },
  done: (err?: Error) => void
): void
