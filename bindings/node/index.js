'use strict'
// The JavaScript surface of shardlimit. Everything that decides lives in the Rust core;
// this file checks argument *types* (TypeError/RangeError), maps the core's error kinds to
// Error subclasses, and wraps the native limiter in an idiomatic class.

const { native, platformTag } = require('./binding.js')
const { NativeLimiter, NativeLimit, ManualClock, TrustedProxies } = native
const { HostTransport } = require('./host.js')

// ---------------------------------------------------------------------------------------
// Errors: one subclass per core ErrorKind, with a stable `code`. The table is checked
// against spec/errors.json (names, parents, backend kinds) by test/errors.test.js.

class ShardlimitError extends Error {
  constructor(message, kind) {
    super(message)
    this.name = new.target.name
    /** The stable snake_case kind name of the core (`config`, `timeout`, ...). */
    this.kind = kind || 'internal'
    /** The stable `ERR_SHARDLIMIT_*` code. */
    this.code = codeOf(this.kind)
  }
  /** True when the backend (Redis) failed rather than the caller. */
  get isBackend() {
    return BACKEND_KINDS.has(this.kind)
  }
}
const BACKEND_KINDS = new Set(['connection', 'timeout', 'script', 'unavailable'])
class ConfigError extends ShardlimitError {}
class InvalidArgumentError extends ShardlimitError {}
class UnknownPolicyError extends InvalidArgumentError {}
class ConnectionError extends ShardlimitError {}
class TimeoutError extends ShardlimitError {}
class ScriptError extends ShardlimitError {}
class IoError extends ShardlimitError {}
class InternalError extends ShardlimitError {}
class UnavailableError extends ShardlimitError {}
class OverloadedError extends ShardlimitError {}

function codeOf(kind) {
  return `ERR_SHARDLIMIT_${String(kind).toUpperCase()}`
}

/** Core ErrorKind name → class. */
const ERROR_CLASSES = Object.freeze({
  config: ConfigError,
  invalid_argument: InvalidArgumentError,
  connection: ConnectionError,
  timeout: TimeoutError,
  script: ScriptError,
  unknown_policy: UnknownPolicyError,
  io: IoError,
  internal: InternalError,
  unavailable: UnavailableError,
  overloaded: OverloadedError,
})

/** `ERR_SHARDLIMIT_*` code → class, for every kind of the core. */
const ERROR_CODES = Object.freeze(
  Object.fromEntries(Object.entries(ERROR_CLASSES).map(([kind, cls]) => [codeOf(kind), cls]))
)

// The addon builds every core error through this factory (per environment: the main
// thread and each worker load this file, and so register their own).
native.setErrorFactory((kind, message) => {
  const Cls = ERROR_CLASSES[kind] || ShardlimitError
  return new Cls(message, kind)
})

// ---------------------------------------------------------------------------------------
// Argument checks: types only; the core validates values (empty key, zero cost, ...).

function typeName(v) {
  if (v === null) return 'null'
  if (Array.isArray(v)) return 'an array'
  return typeof v
}

// The reservations reserve() handed out, each with the values it was made of and whether
// it was settled: settle() takes only these, once, as Python's and Go's Reservation do. A
// plain object would let anyone give units back to any key, and settling one reservation
// again would give its units back again.
const issued = new WeakMap()

/** Registers the reservation of a reserve() result (frozen: its fields are what it settles). */
function issue(r) {
  const v = r.reservation
  if (v !== null && typeof v === 'object') {
    issued.set(Object.freeze(v), { key: v.key, policy: v.policy, units: v.units, atUs: v.atUs, settled: false })
  }
  return r
}

function argError(name, expected, got) {
  const e = new TypeError(`The "${name}" argument must be ${expected}. Received ${typeName(got)}`)
  e.code = 'ERR_INVALID_ARG_TYPE'
  return e
}

function checkString(name, v) {
  if (typeof v !== 'string') throw argError(name, 'of type string', v)
}

function checkUnits(name, v) {
  if (typeof v !== 'number') throw argError(name, 'of type number', v)
  if (!Number.isSafeInteger(v) || v < 0) {
    const e = new RangeError(`The "${name}" argument must be a non-negative integer. Received ${v}`)
    e.code = 'ERR_OUT_OF_RANGE'
    throw e
  }
}

/** `opts` of a call: a policy name, or `{ policy, cost }`. */
function policyOf(opts, method) {
  if (typeof opts === 'string') return opts
  if (opts === null || typeof opts !== 'object') {
    throw argError(`${method} options`, 'a policy name or an object { policy }', opts)
  }
  checkString('options.policy', opts.policy)
  return opts.policy
}

/** The plan of `opts` (`{ policy, plan }`), or null. */
function planOf(opts) {
  if (typeof opts === 'string' || opts.plan === undefined) return null
  checkString('options.plan', opts.plan)
  return opts.plan
}

/** The ad-hoc limit of `opts` (`{ limit: Limit | spec }`), or null for a named policy. */
function adhocOf(opts) {
  if (opts === null || typeof opts !== 'object' || opts.limit === undefined) return null
  if (opts.policy !== undefined) throw argError('options', 'either { policy } or { limit }, not both', opts)
  return opts.limit instanceof Limit ? opts.limit : new Limit(opts.limit)
}

function countOf(opts, field) {
  if (typeof opts === 'string' || opts[field] === undefined) return 1
  checkUnits(`options.${field}`, opts[field])
  return opts[field]
}

function clockOf(options) {
  if (options === undefined || options === null) return undefined
  if (typeof options !== 'object') throw argError('options', 'an object', options)
  const { clock } = options
  if (clock === undefined || clock === null) return undefined
  if (!(clock instanceof ManualClock)) throw argError('options.clock', 'a ManualClock', clock)
  return clock
}

// ---------------------------------------------------------------------------------------
// The limiter.

const kNative = Symbol('shardlimit.native')
const kHost = Symbol('shardlimit.host')

/**
 * `options.transport`: 'host' (a check's bytes move on this event loop: host.js), 'thread'
 * (the limiter's I/O thread), or 'default': the host transport wherever it can serve the
 * shards (standalone Redis over plain TCP), else the I/O thread without an error. Measured
 * pinned to one CPU (docs/notes/2026-12-03-nodehost.md), the host transport took about
 * half the client CPU per decision with 64 checks in flight and no more added CPU per
 * Express request than the I/O thread. Only `check` of a named policy uses it.
 */
function withTransport(limiter, options) {
  const transport = options === undefined || options === null ? undefined : options.transport
  if (transport === 'thread') return limiter
  const explicit = transport === 'host'
  if (!explicit && transport !== undefined && transport !== 'default') {
    throw argError('options.transport', "'default', 'thread' or 'host'", transport)
  }
  if (!explicit && !limiter.isRedis) return limiter // (in memory: nothing to carry)
  let checks
  try {
    checks = new native.NativeHostChecks(limiter[kNative])
  } catch (e) {
    // the default over shards the host transport cannot serve (TLS, Sentinel, Cluster,
    // Unix sockets): the I/O thread; only an explicit 'host' is refused there
    if (!explicit && e instanceof ConfigError) return limiter
    limiter.close()
    throw e
  }
  limiter[kHost] = new HostTransport(checks)
  return limiter
}

// The core's warning lines (a fallback to on_error, a circuit opened, a rejected config; at
// most one per reason and policy or shard per log_interval): `options.logger` is a
// function (line, record), an object with warn/error methods (console, pino, winston:
// called as logger.warn(line, record)), or null to drop them; console.warn by default.
function withLogger(limiter, options) {
  const logger = options && 'logger' in options ? options.logger : (line) => console.warn(line)
  limiter.setLogSink(logger)
  return limiter
}

class Limiter {
  /** Use `Limiter.fromConfigFile`, `Limiter.fromJson` or `Limiter.memory`. */
  constructor(handle) {
    if (!(handle instanceof NativeLimiter)) {
      throw new TypeError('Use Limiter.fromConfigFile(path), Limiter.fromJson(text) or Limiter.memory()')
    }
    this[kNative] = handle
  }

  /** Loads a JSON config file (Redis shards and named policies): spec/names.json's name. */
  static fromConfigFile(path, options) {
    checkString('path', path)
    return withTransport(withLogger(new Limiter(NativeLimiter.fromConfig(path, clockOf(options))), options), options)
  }

  /** The same as `fromConfigFile` (its earlier name, kept for existing code). */
  static fromConfig(path, options) {
    return Limiter.fromConfigFile(path, options)
  }

  /** Parses a JSON config (a string, or an object that is serialized first). */
  static fromJson(config, options) {
    let text = config
    if (config !== null && typeof config === 'object' && !Array.isArray(config)) {
      text = JSON.stringify(config)
    }
    checkString('config', text)
    return withTransport(withLogger(new Limiter(NativeLimiter.fromJson(text, clockOf(options))), options), options)
  }

  /** An in-memory limiter with no named policies (use fromJson without shards for policies). */
  static memory(options) {
    return withLogger(new Limiter(NativeLimiter.memory(clockOf(options))), options)
  }

  /** True when Redis shards decide, false for the in-memory engine. */
  get isRedis() {
    return this[kNative].isRedis
  }

  /**
   * Which transport carries `check` of a named policy: 'host' (this event loop) or
   * 'thread' (the limiter's I/O thread; also every in-memory limiter's answer).
   */
  get transport() {
    return this[kHost] !== undefined ? 'host' : 'thread'
  }

  /** The names of the configured policies. */
  get policies() {
    return this[kNative].policies
  }

  /**
   * The policy `policy` as plan `plan` of the config has it (a `PolicyInfo`): the plan's
   * limits under the policy's name, or the policy itself when the plan does not list it.
   * Check under a plan with `check(key, { policy, plan })`.
   */
  planPolicy(plan, policy) {
    checkString('plan', plan)
    checkString('policy', policy)
    return this[kNative].planPolicyInfo(plan, policy)
  }

  /** The shard `key` routes to (`{ index, name }`), or null on the in-memory engine. */
  route(key) {
    checkString('key', key)
    return this[kNative].route(key)
  }

  /**
   * Checks `cost` units (default 1) of a policy for `key` (`{ policy }` or an ad-hoc
   * `{ limit }`). Resolves to a Decision. `{ shadow: true }`: shadow mode for this call
   * (a would-be denial is allowed, with `decision.shadowDenied`, and consumes nothing).
   */
  check(key, opts) {
    try {
      checkString('key', key)
      if (typeof opts === 'object' && opts !== null && opts.shadow !== undefined && opts.shadow !== false) {
        return this.#checkShadow(key, opts)
      }
      const adhoc = adhocOf(opts)
      if (adhoc !== null) return this[kNative].checkLimit(key, adhoc[kNative], countOf(opts, 'cost'))
      const policy = policyOf(opts, 'check')
      const plan = planOf(opts)
      if (plan !== null) return this[kNative].checkPlan(key, plan, policy, countOf(opts, 'cost'))
      const host = this[kHost]
      if (host !== undefined) {
        const p = host.check(key, policy, countOf(opts, 'cost'))
        if (p !== null) return p
      }
      return this[kNative].check(key, policy, countOf(opts, 'cost'))
    } catch (e) {
      return Promise.reject(e)
    }
  }

  #checkShadow(key, opts) {
    if (opts.shadow !== true) throw argError('options.shadow', 'a boolean', opts.shadow)
    const adhoc = adhocOf(opts)
    if (adhoc !== null) return this[kNative].checkLimitShadow(key, adhoc[kNative], countOf(opts, 'cost'))
    return this[kNative].checkShadow(key, policyOf(opts, 'check'), countOf(opts, 'cost'))
  }

  /**
   * The shadow-mode denials of a policy by key, summed over every shard (in memory: this
   * process's counts): `{ policy, total, untracked, keys: [{ key, count }] }`, most first;
   * `{ top }` keeps that many keys.
   */
  shadowReport(policy, opts) {
    try {
      checkString('policy', policy)
      let top
      if (opts !== undefined && opts !== null) {
        if (typeof opts !== 'object') throw argError('options', 'an object { top }', opts)
        if (opts.top !== undefined) {
          checkUnits('options.top', opts.top)
          top = opts.top
        }
      }
      return this[kNative].shadowReport(policy, top)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /** The state of `key` without consuming: would one unit pass now, and how many remain. */
  peek(key, opts) {
    try {
      checkString('key', key)
      const adhoc = adhocOf(opts)
      if (adhoc !== null) return this[kNative].peekLimit(key, adhoc[kNative])
      const policy = policyOf(opts, 'peek')
      const plan = planOf(opts)
      if (plan !== null) return this[kNative].peekPlan(key, plan, policy)
      return this[kNative].peek(key, policy)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /** Acquires `units` (default 1) of a concurrency policy: `{ decision, lease }`. */
  acquire(key, opts) {
    try {
      checkString('key', key)
      const adhoc = adhocOf(opts)
      if (adhoc !== null) return this[kNative].acquireLimit(key, adhoc[kNative], countOf(opts, 'units'))
      const policy = policyOf(opts, 'acquire')
      return this[kNative].acquire(key, policy, countOf(opts, 'units'))
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /**
   * Releases a lease from `acquire` (pass `{ limit }` for a lease of an ad-hoc limit).
   * Resolves to false when it was no longer held.
   */
  release(lease, opts) {
    try {
      if (lease === null || typeof lease !== 'object') throw argError('lease', 'a lease object', lease)
      checkString('lease.key', lease.key)
      checkString('lease.policy', lease.policy)
      checkString('lease.id', lease.id)
      checkUnits('lease.units', lease.units)
      const plain = { key: lease.key, policy: lease.policy, id: lease.id, units: lease.units }
      const adhoc = adhocOf(opts)
      if (adhoc !== null) return this[kNative].releaseLimit(plain, adhoc[kNative])
      return this[kNative].release(plain)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /**
   * Consumes `cost` units (default 1) of a named policy without ever denying: the key may
   * go into debt (capped at one limit) and later checks are denied until it is repaid.
   * Resolves to a Decision that is always allowed (`remaining` 0 in debt).
   */
  charge(key, opts) {
    return this.#named('charge', key, opts, (policy, cost) => this[kNative].charge(key, policy, cost))
  }

  /** Gives `cost` units (default 1) of a named policy back to `key`, never above its limit. */
  refund(key, opts) {
    return this.#named('refund', key, opts, (policy, cost) => this[kNative].refund(key, policy, cost))
  }

  /**
   * A check of an estimated `cost` (default 1) of a policy (`{ policy }` or an ad-hoc
   * `{ limit }`) that can be settled later: resolves to `{ decision, reservation }`,
   * `reservation` null when denied.
   */
  reserve(key, opts) {
    try {
      checkString('key', key)
      const adhoc = adhocOf(opts)
      const reserved = adhoc !== null
        ? this[kNative].reserveLimit(key, adhoc[kNative], countOf(opts, 'cost'))
        : this[kNative].reserve(key, policyOf(opts, 'reserve'), countOf(opts, 'cost'))
      return reserved.then(issue)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /**
   * Settles a reservation at its `actual` cost (0 gives it all back): the unused part goes
   * back to the window that admitted it, the excess is charged. Once per reservation.
   * Pass `{ limit }` for a reservation of an ad-hoc limit.
   */
  settle(reservation, actual, opts) {
    try {
      const held = reservation !== null && typeof reservation === 'object' ? issued.get(reservation) : undefined
      if (held === undefined) {
        throw argError('reservation', 'a reservation returned by reserve() (a copy or an object literal is refused: its fields could give units back to any key)', reservation)
      }
      checkUnits('actual', actual)
      const adhoc = adhocOf(opts)
      if (held.settled) throw new InvalidArgumentError('invalid argument `reservation`: was settled already', 'invalid_argument')
      held.settled = true
      const plain = { key: held.key, policy: held.policy, units: held.units, atUs: held.atUs }
      const settled = adhoc !== null ? this[kNative].settleLimit(plain, adhoc[kNative], actual) : this[kNative].settle(plain, actual)
      return settled.catch((e) => {
        // refused before anything was sent: it may be settled again (after a backend
        // failure it may have been applied, and a second settle would give back twice)
        if (!(e instanceof ShardlimitError && e.isBackend)) held.settled = false
        throw e
      })
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /** A call of a named policy (`'name'` or `{ policy, cost }`); ad-hoc limits are refused. */
  #named(method, key, opts, call) {
    try {
      checkString('key', key)
      if (opts !== null && typeof opts === 'object' && opts.limit !== undefined) throw argError(`${method} options`, 'a named policy ({ policy }): ad-hoc limits are not supported here', opts)
      return call(policyOf(opts, method), countOf(opts, 'cost'))
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /**
   * Connects to every shard and loads the scripts within `timeoutMs` (default 5000; its
   * own budget, not a call's deadline), so that the first checks after start-up do not
   * spend their deadline on a TCP connect. Rejects with the shard's error when one does not
   * answer in time; resolves at once in memory.
   */
  connect(options) {
    try {
      const timeoutMs = options && options.timeoutMs !== undefined ? options.timeoutMs : 5000
      if (typeof timeoutMs !== 'number') throw argError('timeoutMs', 'a number of milliseconds', timeoutMs)
      return this[kNative].connect(timeoutMs)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /** Forgets `key`'s state under a policy: its full budget is back. */
  reset(key, opts) {
    try {
      checkString('key', key)
      return this[kNative].reset(key, policyOf(opts, 'reset'))
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /**
   * A layered check: `[{ key, policy, cost? }, ...]` (IP, API key, tenant, global...).
   * Allowed only if every layer allows; when any denies, no layer consumes.
   */
  checkAll(layers) {
    try {
      if (!Array.isArray(layers)) throw argError('layers', 'an array of { key, policy, cost? }', layers)
      const specs = layers.map((l, i) => {
        if (l === null || typeof l !== 'object') throw argError(`layers[${i}]`, 'an object { key, policy, cost? }', l)
        checkString(`layers[${i}].key`, l.key)
        checkString(`layers[${i}].policy`, l.policy)
        if (l.cost !== undefined) checkUnits(`layers[${i}].cost`, l.cost)
        return { key: l.key, policy: l.policy, cost: l.cost }
      })
      return this[kNative].checkAll(specs)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /** Blocks `key` for every limiter sharing the shards: `{ ttl?: ms, reason?: string }`. */
  block(key, opts) {
    try {
      checkString('key', key)
      const o = opts === undefined ? {} : opts
      if (o === null || typeof o !== 'object') throw argError('options', 'an object { ttl?, reason? }', o)
      if (o.ttl !== undefined && o.ttl !== null && typeof o.ttl !== 'number') throw argError('options.ttl', 'a number of milliseconds', o.ttl)
      if (o.reason !== undefined) checkString('options.reason', o.reason)
      return this[kNative].block(key, o.ttl === undefined ? null : o.ttl, o.reason === undefined ? '' : o.reason)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /** Removes `key` from the block list; resolves to true when it was blocked. */
  unblock(key) {
    try {
      checkString('key', key)
      return this[kNative].unblock(key)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /** The block entry of `key` (`{ reason, remaining: ms | null }`) or null. */
  blocked(key) {
    try {
      checkString('key', key)
      return this[kNative].blocked(key)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /**
   * Sets `key`'s live override of `policy` (a config policy with `"overrides": true`) to
   * `limit`: a rate string (`'100/minute'`) or a limit object as in a config policy
   * (an object, or its JSON text); `{ ttl?: ms }` (default: until deleted). Every
   * process's next check of the key, in any language, is decided by it.
   */
  setOverride(key, policy, limit, opts) {
    try {
      checkString('key', key)
      checkString('policy', policy)
      let text = limit
      if (limit !== null && typeof limit === 'object' && !Array.isArray(limit)) text = JSON.stringify(limit)
      else if (typeof limit !== 'string') throw argError('limit', 'a rate string or a limit object', limit)
      const o = opts === undefined ? {} : opts
      if (o === null || typeof o !== 'object') throw argError('options', 'an object { ttl? }', o)
      if (o.ttl !== undefined && o.ttl !== null && typeof o.ttl !== 'number') throw argError('options.ttl', 'a number of milliseconds', o.ttl)
      return this[kNative].setOverride(key, policy, text, o.ttl === undefined ? null : o.ttl)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /** `key`'s override of `policy` (`{ key, policy, limit, remainingMs }`) or null. */
  getOverride(key, policy) {
    try {
      checkString('key', key)
      checkString('policy', policy)
      return this[kNative].getOverride(key, policy)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /** One page of `policy`'s overrides: `{ cursor?: string | null, limit?: number }` → `{ overrides, cursor }`. */
  listOverrides(policy, opts) {
    try {
      checkString('policy', policy)
      const o = opts === undefined ? {} : opts
      if (o === null || typeof o !== 'object') throw argError('options', 'an object { cursor?, limit? }', o)
      if (o.cursor !== undefined && o.cursor !== null) checkString('options.cursor', o.cursor)
      const limit = o.limit === undefined ? 1000 : o.limit
      if (!Number.isInteger(limit) || limit < 1 || limit > 10000) throw argError('options.limit', 'an integer from 1 to 10000', limit)
      return this[kNative].listOverrides(policy, o.cursor === undefined ? null : o.cursor, limit)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /** Deletes `key`'s override of `policy`; resolves to true when it had one. */
  deleteOverride(key, policy) {
    try {
      checkString('key', key)
      checkString('policy', policy)
      return this[kNative].deleteOverride(key, policy)
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /** Scales limits by `factor` (0 < factor <= 1): every policy, or the named ones. */
  setScale(factor, policies) {
    if (typeof factor !== 'number') throw argError('factor', 'of type number', factor)
    const names = policies === undefined ? [] : policies
    if (!Array.isArray(names) || names.some((n) => typeof n !== 'string')) throw argError('policies', 'an array of strings', policies)
    this[kNative].setScale(factor, names)
  }

  /** The global scale factor in force. */
  get scale() {
    return this[kNative].scale
  }

  /** Installs the latency scale hook: full limits up to `targetMs`, less above, never below `minFactor`. */
  setLatencyScale(targetMs, minFactor) {
    if (typeof targetMs !== 'number') throw argError('targetMs', 'of type number', targetMs)
    if (typeof minFactor !== 'number') throw argError('minFactor', 'of type number', minFactor)
    this[kNative].setLatencyScale(targetMs, minFactor)
  }

  /** Feeds the observed latency (ms) to the latency scale hook; returns the factor in force. */
  observeHealth(latencyMs) {
    if (typeof latencyMs !== 'number') throw argError('latencyMs', 'of type number', latencyMs)
    return this[kNative].observeHealth(latencyMs)
  }

  /** Applies a new config (JSON text or object); in-flight calls finish on the old one. */
  reload(config) {
    let text = config
    if (config !== null && typeof config === 'object' && !Array.isArray(config)) text = JSON.stringify(config)
    checkString('config', text)
    return this[kNative].reload(text)
  }

  /** Reads and applies a config file; a bad file leaves the old config in force. */
  reloadFromFile(path) {
    checkString('path', path)
    return this[kNative].reloadFromFile(path)
  }

  /** Counters per policy and the Redis latency histogram, Prometheus text format. */
  metrics() {
    return this[kNative].metricsPrometheus()
  }

  /** The same counters as an object (`MetricsSnapshot`). */
  metricsSnapshot() {
    return this[kNative].metricsSnapshot()
  }

  /** `$SHARDLIMIT_CONFIG` (a path or inline JSON); the in-memory engine when unset. */
  static fromEnv(options) {
    return withLogger(new Limiter(NativeLimiter.fromEnv(clockOf(options))), options)
  }

  /**
   * How many reloads are in force (0 at first, one more per `reload`, `reloadFromFile` or
   * watched-file reload): a cheap test of whether something derived from the config must
   * be derived again (the middleware re-reads its policy's algorithm when it moves).
   */
  get configGeneration() {
    return this[kNative].configGeneration
  }

  /** Keys held by the in-memory engine (its memory is bounded); null on Redis. */
  get memoryKeys() {
    return this[kNative].memoryKeys
  }

  /** A configured policy (`PolicyInfo`). Throws UnknownPolicyError for an unknown name. */
  policy(name) {
    checkString('name', name)
    return this[kNative].policyInfo(name)
  }

  /** The configuration in force (`ConfigInfo`; shard URLs are left out: they may hold passwords). */
  get config() {
    return this[kNative].configInfo()
  }

  /**
   * Where the core's warning lines go: a function `(line, record)`, an object with
   * `warn`/`error` methods (called `logger.warn(line, record)`), or null to drop them.
   * Runs on the event loop.
   */
  setLogSink(logger) {
    if (logger === null || logger === undefined) {
      this[kNative].setLogSink(null)
      return
    }
    let write
    if (typeof logger === 'function') {
      write = (r) => logger(r.message, r)
    } else if (typeof logger === 'object' && typeof logger.warn === 'function') {
      write = (r) => (r.level === 'error' && typeof logger.error === 'function' ? logger.error(r.message, r) : logger.warn(r.message, r))
    } else {
      throw argError('logger', 'a function (line, record) => void, an object with warn(), or null', logger)
    }
    this[kNative].setLogSink(write)
  }

  /**
   * Calls `listener(event)` for each event of the core: `denied`, `blocked`, `fallback`,
   * `circuit`. The listener runs on the event loop; a listener that throws is reported
   * on `process` as an uncaught exception, as any callback's would be.
   */
  subscribe(listener) {
    if (typeof listener !== 'function') throw argError('listener', 'a function (event) => void', listener)
    this[kNative].subscribe(listener)
  }

  /**
   * Reloads whenever the config file at `path` changes (checked every `intervalMs`,
   * default 1000). A bad file is ignored: the old config stays. Returns a watcher;
   * `watcher.close()` stops it.
   */
  watchConfig(path, options) {
    checkString('path', path)
    const o = options === undefined ? {} : options
    if (o === null || typeof o !== 'object') throw argError('options', 'an object { intervalMs? }', o)
    const every = o.intervalMs === undefined ? 1000 : o.intervalMs
    if (typeof every !== 'number' || !(every >= 1)) throw argError('options.intervalMs', 'a number of milliseconds >= 1', every)
    const w = this[kNative].watchConfig(path, every)
    return { close: () => w.close() }
  }

  /**
   * Lets go of the Redis connections and the I/O thread (once the calls in flight have
   * finished). Every later call throws an InvalidArgumentError. Idempotent.
   */
  close() {
    const handle = this[kNative]
    if (handle === CLOSED) return
    this[kNative] = CLOSED
    if (this[kHost] !== undefined) {
      this[kHost].close()
      this[kHost] = undefined
    }
    handle.close()
  }
}

function closedError() {
  return new InvalidArgumentError('limiter: this Limiter is closed (close() was called)', 'invalid_argument')
}
// what a closed Limiter holds instead of its native handle: any use throws
const CLOSED = new Proxy(
  {},
  {
    get() {
      throw closedError()
    },
  }
)

/**
 * An ad-hoc limit, validated once: `{ algorithm, limit, window, ... }` as a policy of the
 * config file, named `options.name` in headers, bodies, metrics and Redis keys (the
 * limit's parameters when unnamed). Two limits of one name share their counters.
 */
class Limit {
  constructor(spec, options) {
    if (typeof spec !== 'string' && (spec === null || typeof spec !== 'object' || Array.isArray(spec))) {
      throw argError('limit', 'a rate string ("10/second; 1000/day") or an object { algorithm, ... }', spec)
    }
    const o = options === undefined ? {} : options
    if (o === null || typeof o !== 'object') throw argError('options', 'an object { name? }', o)
    if (o.name !== undefined) checkString('options.name', o.name)
    this[kNative] = new NativeLimit(JSON.stringify(spec), o.name === undefined ? null : o.name)
    const info = this[kNative].info()
    /** The policy name decisions of this limit carry. */
    this.name = info.name
    /** The algorithm (`fixed_window`, ..., `concurrency`). */
    this.algorithm = info.algorithm
    Object.freeze(this)
  }
  /** The limit as a `PolicyInfo`. */
  info() {
    return this[kNative].info()
  }
}

// ---------------------------------------------------------------------------------------
// Decisions: plain data with the core's rendering. The addon makes each one with a single
// call of this constructor (src/decision.rs), so its fields are own properties:
// structuredClone, JSON.stringify and spreading see them, and reading one costs no call
// into the addon. headers() and body() hand the fields back to the core, which renders them.

const SOURCES = ['redis', 'memory', 'local', 'fallback', 'block', 'local_fallback'] // src/decision.rs's order
// the window (ms) RateLimit-Policy names (a registered symbol: middleware.js reads it too)
const kWindow = Symbol.for('shardlimit.window')

class Decision {
  /** Made by the addon: the result of check() and the other calls that decide. */
  constructor(allowed, limit, remaining, resetAfter, retryAfter, delay, policy, source, shard, layer, shadowDenied, limitIndex, quotas, windowMs) {
    this.allowed = allowed
    this.limit = limit
    this.remaining = remaining
    this.resetAfter = resetAfter
    this.retryAfter = retryAfter
    this.delay = delay
    this.policy = policy
    this.source = SOURCES[source]
    this.shard = shard
    this.layer = layer
    this.shadowDenied = shadowDenied
    this.limitIndex = limitIndex
    this.quotas = quotas === null ? [] : quotas
    this[kWindow] = windowMs
  }
  /** The standard rate-limit response headers, in the core's order. */
  headers() {
    return native.decisionHeaders(this, this[kWindow])
  }
  /** The JSON body of a 429 response. */
  body() {
    return native.decisionBody(this, this[kWindow])
  }
  /** The decision as the core's JSON has it (durations in ms; limitIndex and quotas for multi-limit policies only). */
  toJSON() {
    const json = {
      allowed: this.allowed,
      limit: this.limit,
      remaining: this.remaining,
      resetAfter: this.resetAfter,
      retryAfter: this.retryAfter,
      delay: this.delay,
      policy: this.policy,
      source: this.source,
      shard: this.shard,
      layer: this.layer,
      shadowDenied: this.shadowDenied,
    }
    if (this.limitIndex !== null) {
      // multi-limit policies only, as in the core's JSON
      json.limitIndex = this.limitIndex
      json.quotas = this.quotas
    }
    return json
  }
}
native.setDecisionClass(Decision)

/** The client address behind proxies, by the core's trusted-proxy rule. */
function clientIp(peer, xForwardedFor, trustedProxies) {
  checkString('peer', peer)
  if (xForwardedFor !== undefined && xForwardedFor !== null) checkString('xForwardedFor', xForwardedFor)
  const list = trustedProxies === undefined ? [] : trustedProxies
  if (!Array.isArray(list) || list.some((c) => typeof c !== 'string')) throw argError('trustedProxies', 'an array of CIDR strings', trustedProxies)
  return native.clientIp(peer, xForwardedFor == null ? null : xForwardedFor, list)
}

/** The rate-limit key of a client address: IPv4 as itself, IPv6 as its /ipv6Prefix network. */
function ipKey(ip, ipv6Prefix) {
  checkString('ip', ip)
  if (ipv6Prefix !== undefined && !Number.isInteger(ipv6Prefix)) throw argError('ipv6Prefix', 'an integer from 1 to 128', ipv6Prefix)
  return native.ipKey(ip, ipv6Prefix === undefined ? null : ipv6Prefix)
}

const middleware = require('./middleware.js')

module.exports = {
  Limiter,
  Limit,
  Decision,
  ManualClock,
  ShardlimitError,
  ConfigError,
  InvalidArgumentError,
  UnknownPolicyError,
  ConnectionError,
  TimeoutError,
  ScriptError,
  IoError,
  InternalError,
  UnavailableError,
  OverloadedError,
  ERROR_CLASSES,
  ERROR_CODES,
  TrustedProxies,
  clientIp,
  ipKey,
  errorKinds: native.errorKinds,
  coreVersion: native.coreVersion,
  platformTag,
  expressMiddleware: middleware.expressMiddleware,
  fastifyHook: middleware.fastifyHook,
  fastifyPlugin: middleware.fastifyPlugin,
}
