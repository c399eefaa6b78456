'use strict'
// HTTP middleware: Express / Connect (plain `http` works too) and Fastify (a hook, a
// plugin, route options). Each request is mapped to (key, policy or ad-hoc limit, cost);
// the core decides. This file only maps a decision to HTTP: which headers, which status
// (429 for a limit, 503 when the limit could not be checked), holding a request for a
// leaky bucket's delay, and giving a concurrency lease back when the response ends.

const { createHash } = require('node:crypto')
const { native } = require('./binding.js')

const kShown = Symbol('shardlimit.shown') // the decision whose headers a response carries
const kWindow = Symbol.for('shardlimit.window') // a Decision's window in ms (index.js)

function typeError(message) {
  const e = new TypeError(message)
  e.code = 'ERR_INVALID_ARG_TYPE'
  return e
}

/** Whether `req`'s Express app trusts proxies (`app.set('trust proxy', ...)`): then `req.ip` is its client. */
function expressTrustsProxy(req) {
  const app = req.app
  if (!app || typeof app.get !== 'function') return false
  const setting = app.get('trust proxy')
  return setting !== undefined && setting !== false && setting !== 0 && typeof req.ip === 'string' && req.ip !== ''
}

function ipOf(req, proxies, kKey, ownProxies) {
  // no trustedProxies of our own and an Express app that trusts proxies: its req.ip is the
  // client (as express-rate-limit keys), else every client behind the proxy would share
  // the proxy's budget
  if (!ownProxies && expressTrustsProxy(req)) return proxies.clientKey(req.ip, null)
  const socket = req.socket
  // the core's trusted-proxy rule: X-Forwarded-For is believed only from trusted hops
  const xff = req.headers && req.headers['x-forwarded-for']
  if (xff === undefined && socket) {
    // without the header the key is the peer's alone: one call into the core per
    // connection (keep-alive), not per request; kKey is this middleware's own
    const known = socket[kKey]
    if (known !== undefined) return known
    // IPv6 clients by their network (the core's client key), so a /64 is one client
    return (socket[kKey] = proxies.clientKey(socket.remoteAddress || '', null))
  }
  const peer = (socket && socket.remoteAddress) || ''
  return proxies.clientKey(peer, Array.isArray(xff) ? xff.join(',') : xff || null)
}

/**
 * The response headers of `decision` under the header options: `X-RateLimit-*` (legacy,
 * the core's values: `X-RateLimit-Reset` a Unix timestamp, as GitHub and
 * express-rate-limit send it), the IETF `RateLimit` / `RateLimit-Policy` fields (delta
 * seconds), and
 * `Retry-After` in seconds or as an HTTP date. `retryAfterSecs` overrides the decision's.
 * (Every request of a limited route comes here: the core's header names are told apart
 * by their first letters, not by regular expressions.)
 */
function renderHeaders(decision, o, nowMs, retryAfterSecs) {
  const draft = o.draft || 'draft-8'
  if (decision.allowed && retryAfterSecs === undefined && draft === 'draft-8') {
    const fast = admittedHeaders(decision, o, nowMs)
    if (fast !== null) return fast
  }
  const out = {}
  const core = decision.headers()
  let coreRetry
  for (const name in core) {
    const value = core[name]
    const c = name.charCodeAt(0)
    if (c === 88 /* X-RateLimit-* */) {
      if (!o.legacyHeaders) continue
      out[name] = value
    } else if (name === 'Retry-After') {
      coreRetry = value // below
    } else if (c === 82 /* RateLimit, RateLimit-Policy */) {
      if (o.standardHeaders && draft === 'draft-8') out[name] = value
    } else {
      out[name] = value
    }
  }
  if (o.standardHeaders && draft !== 'draft-8') Object.assign(out, olderDraft(decision, draft))
  let retry = retryAfterSecs
  if (retry === undefined && coreRetry !== undefined) retry = Number(coreRetry)
  if (retry !== undefined && retry !== null && !decision.allowed) {
    out['Retry-After'] = o.retryAfter === 'date' ? new Date(nowMs + retry * 1000).toUTCString() : String(retry)
  }
  return out
}

/**
 * The IETF fields of the earlier drafts express-rate-limit also offers (its
 * `standardHeaders: 'draft-6' | 'draft-7'`), from the decision the core made: draft-6
 * `RateLimit-Limit`, `-Remaining`, `-Reset` (delta seconds) and `RateLimit-Policy: 100;w=60`;
 * draft-7 `RateLimit: limit=100, remaining=50, reset=30` and the same policy. A decision
 * that did not measure the limit (a fallback) or is shadow-denied shows only its limit.
 */
function olderDraft(decision, draft) {
  const windowSecs = Math.max(1, Math.ceil((decision[kWindow] || 0) / 1000))
  const out = { 'RateLimit-Policy': `${decision.limit};w=${windowSecs}` }
  const measured = decision.source !== 'fallback' && !decision.shadowDenied
  const reset = Math.ceil(decision.resetAfter / 1000)
  if (draft === 'draft-6') {
    out['RateLimit-Limit'] = String(decision.limit)
    if (measured) {
      out['RateLimit-Remaining'] = String(decision.remaining)
      out['RateLimit-Reset'] = String(reset)
    }
  } else {
    out.RateLimit = measured ? `limit=${decision.limit}, remaining=${decision.remaining}, reset=${reset}` : `limit=${decision.limit}`
  }
  return out
}

// What the core renders the same for every admitted decision of one limit: its
// `X-RateLimit-Limit` and `RateLimit-Policy` values and the start of its `RateLimit` value
// (`"api";r=`), by policy, limit and window. Bounded: cleared when full.
const statics = new Map()
const STATICS_MAX = 1024

/**
 * The headers of an admitted, measured, single-limit decision (every request a limited
 * route lets through) without a call into the core per request: the core renders the
 * first decision of each limit (`decision.headers()`), and later ones differ only in the
 * integers `remaining` and the reset, put in the places the core's own rendering showed.
 * null for any other decision (denied, shadow, multi-limit, the fallback's): the core
 * renders those. test/middleware.test.js holds both renderings equal.
 */
function admittedHeaders(decision, o, nowMs) {
  if (decision.shadowDenied || decision.limitIndex !== null || decision.source === 'fallback') return null
  let t = lastStatic
  // (a route's decisions are of one limit: the last one's rendering, without a lookup)
  if (t === null || t.policyName !== decision.policy || t.limitValue !== decision.limit || t.windowMs !== decision[kWindow]) {
    t = staticsOf(decision)
    if (t === null) return null
    lastStatic = t
  }
  const out = {}
  const remaining = String(decision.remaining)
  if (o.legacyHeaders) {
    out['X-RateLimit-Limit'] = t.limit
    out['X-RateLimit-Remaining'] = remaining
    // the core's X-RateLimit-Reset: the Unix time of the reset, whole seconds rounded up
    out['X-RateLimit-Reset'] = String(Math.ceil((nowMs + decision.resetAfter) / 1000))
  }
  if (o.standardHeaders) {
    out['RateLimit-Policy'] = t.policy
    // the core's delta seconds: whole microseconds rounded up (resetAfter is ms with 3 decimals)
    out.RateLimit = `${t.item}${remaining};t=${Math.ceil(decision.resetAfter / 1000)}`
  }
  return out
}

let lastStatic = null // the statics of the last admitted decision rendered

/** What the core renders the same for every admitted decision of `decision`'s limit, or null. */
function staticsOf(decision) {
  const id = `${decision.policy}\0${decision.limit}\0${decision[kWindow]}`
  let t = statics.get(id)
  if (t === undefined) {
    const core = decision.headers()
    const rl = core.RateLimit
    const at = rl === undefined ? -1 : rl.lastIndexOf(';r=')
    if (at < 0 || core['X-RateLimit-Limit'] === undefined || core['RateLimit-Policy'] === undefined) return null
    if (statics.size >= STATICS_MAX) statics.clear()
    t = {
      policyName: decision.policy,
      limitValue: decision.limit,
      windowMs: decision[kWindow],
      limit: core['X-RateLimit-Limit'],
      policy: core['RateLimit-Policy'],
      item: rl.slice(0, at + 3),
    }
    statics.set(id, t)
  }
  return t
}

/** Whether `next` should replace `shown` as the decision a response reports: the tightest. */
function tighter(next, shown) {
  if (!shown) return true
  if (shown.allowed !== next.allowed) return !next.allowed
  return next.remaining < shown.remaining
}

/** The core's bound on a key's length (bytes). */
const MAX_KEY_BYTES = 1024

/**
 * A key as the core takes it: one longer than 1,024 bytes (a client's header, say) becomes
 * `sha256:<hex>` of it, so that no client input can make a request fail with a 500. Keys
 * of that length are distinct by their hash alone.
 */
function boundKey(key) {
  if (typeof key !== 'string' || key.length * 3 <= MAX_KEY_BYTES || Buffer.byteLength(key) <= MAX_KEY_BYTES) return key
  return `sha256:${createHash('sha256').update(key).digest('hex')}`
}

function checkFn(name, v, what) {
  if (v !== undefined && typeof v !== 'function') throw typeError(`The "options.${name}" argument must be a function ${what}`)
}

/**
 * Validates the options once, when the middleware is built: a bad option, an unknown
 * policy or an invalid ad-hoc limit fails here, not on every request.
 */
function compile(limiter, options) {
  if (!limiter || typeof limiter.check !== 'function' || typeof limiter.policy !== 'function') {
    throw typeError('The "limiter" argument must be a shardlimit Limiter')
  }
  const opts = options === undefined ? {} : options
  if (opts === null || typeof opts !== 'object') throw typeError('The "options" argument must be an object')
  const { policy, cost, trustedProxies, ipv6Prefix, skip, handler, unavailableHandler } = opts
  const key = opts.keyGenerator !== undefined ? opts.keyGenerator : opts.key
  if (opts.keyGenerator !== undefined && opts.key !== undefined) throw typeError('Use "options.key" or "options.keyGenerator", not both')
  if (policy !== undefined && typeof policy !== 'string') throw typeError('The "options.policy" argument must be of type string')
  checkFn('key', key, '(req) => key')
  checkFn('skip', skip, '(req, res) => boolean')
  checkFn('handler', handler, '(req, res, next, decision)')
  checkFn('unavailableHandler', unavailableHandler, '(req, res, next, decision)')
  if (cost !== undefined && typeof cost !== 'function' && typeof cost !== 'number') {
    throw typeError('The "options.cost" argument must be a number or a function (req) => number')
  }
  if (trustedProxies !== undefined && !Array.isArray(trustedProxies)) {
    throw typeError('The "options.trustedProxies" argument must be an array of CIDR strings')
  }
  if (ipv6Prefix !== undefined && !Number.isInteger(ipv6Prefix)) {
    throw typeError('The "options.ipv6Prefix" argument must be an integer from 1 to 128')
  }
  if (opts.legacyHeaders !== undefined && typeof opts.legacyHeaders !== 'boolean') {
    throw typeError('The "options.legacyHeaders" argument must be a boolean')
  }
  // express-rate-limit's choice of draft; true is the core's fields (draft-8)
  const drafts = ['draft-6', 'draft-7', 'draft-8']
  const std = opts.standardHeaders
  if (std !== undefined && typeof std !== 'boolean' && !drafts.includes(std)) {
    throw typeError('The "options.standardHeaders" argument must be a boolean, "draft-6", "draft-7" or "draft-8"')
  }
  if (opts.retryAfter !== undefined && opts.retryAfter !== 'seconds' && opts.retryAfter !== 'date') {
    throw typeError('The "options.retryAfter" argument must be "seconds" or "date"')
  }
  if (opts.delay !== undefined && opts.delay !== 'wait' && opts.delay !== 'reject') {
    throw typeError('The "options.delay" argument must be "wait" or "reject"')
  }
  const maxDelayMs = opts.maxDelayMs === undefined ? Infinity : opts.maxDelayMs
  if (typeof maxDelayMs !== 'number' || !(maxDelayMs >= 0)) throw typeError('The "options.maxDelayMs" argument must be a non-negative number')
  const unavailableRetryAfter = opts.unavailableRetryAfter
  if (unavailableRetryAfter !== undefined && !(Number.isInteger(unavailableRetryAfter) && unavailableRetryAfter >= 0)) {
    throw typeError('The "options.unavailableRetryAfter" argument must be a whole number of seconds')
  }
  for (const b of ['skipSuccessfulRequests', 'skipFailedRequests']) {
    if (opts[b] !== undefined && typeof opts[b] !== 'boolean') throw typeError(`The "options.${b}" argument must be a boolean`)
  }
  checkFn('requestWasSuccessful', opts.requestWasSuccessful, '(req, res) => boolean')
  const giveBack = opts.skipSuccessfulRequests || opts.skipFailedRequests
    ? {
        successful: opts.skipSuccessfulRequests === true,
        failed: opts.skipFailedRequests === true,
        wasSuccessful: opts.requestWasSuccessful || ((req, res) => res.statusCode < 400),
      }
    : null

  const warmUpMs = opts.warmUpMs === undefined ? 5000 : opts.warmUpMs
  if (typeof warmUpMs !== 'number' || !(warmUpMs >= 0)) throw typeError('The "options.warmUpMs" argument must be a non-negative number of milliseconds')

  // parsed once; a bad CIDR or prefix fails here
  const proxies = new native.TrustedProxies(trustedProxies || [], ipv6Prefix === undefined ? null : ipv6Prefix)
  const kKey = Symbol('shardlimit.clientKey') // a connection's key under these proxies

  // the answer to a request over its limit (express-rate-limit's `statusCode` and `message`)
  const statusCode = opts.statusCode === undefined ? 429 : opts.statusCode
  if (!Number.isInteger(statusCode) || statusCode < 400 || statusCode > 599) {
    throw typeError('The "options.statusCode" argument must be an HTTP status from 400 to 599')
  }
  const message = opts.message
  if (message !== undefined && message !== null && !['string', 'object', 'function'].includes(typeof message)) {
    throw typeError('The "options.message" argument must be a string, an object (sent as JSON) or a function (req, res) => either')
  }
  const plan = opts.plan
  if (plan !== undefined && typeof plan !== 'string' && typeof plan !== 'function') {
    throw typeError('The "options.plan" argument must be a plan name or a function (req) => plan name')
  }

  // the limit: a named policy (checked now), an ad-hoc limit, or one the key function names
  let limit = null // a Limit (ad-hoc)
  let limitFn = null // (req) => requests per windowMs
  let limitFor = null
  let algorithm = null
  if (opts.limit !== undefined) {
    if (policy !== undefined) throw typeError('Use "options.policy" or "options.limit", not both')
    const { Limit } = require('./index.js')
    if (typeof opts.limit === 'function') {
      // a limit per request (a tenant's plan): a fixed window of n per windowMs; one Limit
      // per n, made once (a bad n fails that request with the Limit's error)
      limitFn = opts.limit
      const windowMs = opts.windowMs === undefined ? 60_000 : opts.windowMs
      if (typeof windowMs !== 'number') throw typeError('The "options.windowMs" argument must be a number of milliseconds')
      const made = new Map()
      limitFor = (n) => {
        let l = made.get(n)
        if (l === undefined) {
          l = new Limit({ algorithm: 'fixed_window', limit: n, window: `${windowMs}ms` }, { name: opts.name })
          if (made.size >= 1024) made.clear()
          made.set(n, l)
        }
        return l
      }
      algorithm = 'fixed_window'
    } else if (opts.limit instanceof Limit) limit = opts.limit
    else if (typeof opts.limit === 'number') {
      const windowMs = opts.windowMs === undefined ? 60_000 : opts.windowMs
      if (typeof windowMs !== 'number') throw typeError('The "options.windowMs" argument must be a number of milliseconds')
      limit = new Limit({ algorithm: 'fixed_window', limit: opts.limit, window: `${windowMs}ms` }, { name: opts.name })
    } else limit = new Limit(opts.limit, { name: opts.name })
    if (limit) algorithm = limit.algorithm
  } else if (policy !== undefined) {
    algorithm = limiter.policy(policy).algorithm // an unknown policy throws here
  } else if (key === undefined) {
    throw typeError('shardlimit middleware: set options.policy, options.limit, or a key function that returns { key, policy }')
  }

  // a reload may change the policy's algorithm (to or from concurrency): read it again then
  let generation = limiter.configGeneration

  if (giveBack && algorithm === 'concurrency') {
    throw typeError('skipSuccessfulRequests / skipFailedRequests do not apply to a concurrency limit (its lease is given back when the response ends)')
  }

  /** A key function's array of layers: one atomic `checkAll` (every layer must allow). */
  function layersOf(list) {
    const layers = list.map((l, i) => {
      if (l === null || typeof l !== 'object' || typeof l.key !== 'string') {
        throw typeError(`layer ${i} of the key function's array must be { key, policy | limit, cost? }`)
      }
      const out = { ...l, key: boundKey(l.key) }
      if (out.policy === undefined && out.limit === undefined) {
        if (limit) out.limit = limit
        else out.policy = policy
      }
      return out
    })
    return { layers, algorithm: 'layered', cost: 1 }
  }

  return {
    limiter,
    policy,
    checkOne: { policy, cost: 1 }, // (never handed to user code)
    giveBack,
    statusCode,
    message,
    warm: warmUp(limiter, warmUpMs),
    skip,
    handler,
    unavailableHandler,
    unavailableRetryAfter,
    wait: opts.delay !== 'reject',
    maxDelayMs,
    headers: {
      standardHeaders: opts.standardHeaders !== false,
      draft: typeof std === 'string' ? std : 'draft-8',
      legacyHeaders: opts.legacyHeaders !== false,
      retryAfter: opts.retryAfter || 'seconds',
    },
    /** req → { key, policy?, limit?, cost, algorithm } | null (null: not limited). */
    /**
     * req → { key, policy?, limit?, cost, algorithm } | null (null: not limited), or a
     * Promise of it when the key or cost function returns one (no Promise otherwise: the
     * common case costs no extra turn of the microtask queue).
     */
    resolve(req) {
      const k = key ? key(req) : ipOf(req, proxies, kKey, trustedProxies !== undefined)
      return isThenable(k) ? k.then(specOf) : specOf(k)
      function specOf(k) {
        if (k === null || k === undefined || k === false) return null
        if (Array.isArray(k)) return layersOf(k)
        const spec = typeof k === 'object' ? { ...k } : { key: k }
        spec.key = boundKey(spec.key)
        if (spec.plan === undefined && plan !== undefined) {
          const p = typeof plan === 'function' ? plan(req) : plan
          if (p !== null && p !== undefined) spec.plan = p
        }
        if (spec.policy !== undefined && spec.policy !== policy) {
          spec.algorithm = limiter.policy(spec.policy).algorithm
        } else if (limitFn) {
          spec.limit = limitFor(limitFn(req))
          spec.algorithm = 'fixed_window'
        } else if (limit) {
          spec.limit = limit
          spec.algorithm = algorithm
        } else {
          spec.policy = policy
          const g = limiter.configGeneration
          if (g !== generation && policy !== undefined) {
            generation = g
            algorithm = limiter.policy(policy).algorithm
          }
          spec.algorithm = algorithm
        }
        if (spec.cost !== undefined) return spec
        const n = typeof cost === 'function' ? cost(req) : cost === undefined ? 1 : cost
        if (!isThenable(n)) {
          spec.cost = n
          return spec
        }
        return n.then((v) => {
          spec.cost = v
          return spec
        })
      }
    },
  }
}

const warmUps = new WeakMap() // limiter → its start-up connect, made once

/**
 * Connects the limiter to every shard once, when the first middleware is built (`warmUpMs`
 * of its own, default 5000; 0 skips it), so that the first requests do not spend their
 * per-call deadline on a TCP connect and fall back. Requests that arrive before it ends
 * wait for it; a failure is a process warning, and checks then go on as usual.
 */
function warmUp(limiter, ms) {
  let w = warmUps.get(limiter)
  if (w) return w
  w = { done: false, promise: null }
  const started = ms > 0 && typeof limiter.connect === 'function' ? limiter.connect({ timeoutMs: ms }) : Promise.resolve()
  w.promise = started.then(
    () => {
      w.done = true
    },
    (e) => {
      w.done = true
      process.emitWarning(`warm-up incomplete, the first checks may fall back: ${e.message}`, 'ShardlimitWarning')
    },
  )
  warmUps.set(limiter, w)
  return w
}

function isThenable(v) {
  return v !== null && typeof v === 'object' && typeof v.then === 'function'
}

/**
 * What to do with a request: a Promise of the core's answer (a Decision for a plain check,
 * `held(...)` for a concurrency lease or a reservation), or of null when the request is
 * not limited. A plain check's Promise is the check's own: no extra microtask turn.
 */
function decide(c, req, res) {
  try {
    if (c.skip) {
      const skipped = c.skip(req, res)
      if (isThenable(skipped)) return skipped.then((yes) => (yes ? null : afterSkip(c, req)))
      if (skipped) return Promise.resolve(null)
    }
    return afterSkip(c, req)
  } catch (e) {
    return Promise.reject(e)
  }
}

function afterSkip(c, req) {
  const spec = c.resolve(req)
  return isThenable(spec) ? spec.then((s) => run(c, s)) : run(c, spec)
}

function run(c, spec) {
  if (spec === null) return Promise.resolve(null)
  if (!c.warm.done) return c.warm.promise.then(() => run(c, spec))
  if (spec.layers) return c.limiter.checkAll(spec.layers)
  if (spec.algorithm === 'concurrency') {
    const target = spec.limit ? { limit: spec.limit } : { policy: spec.policy }
    return c.limiter.acquire(spec.key, { ...target, units: spec.cost }).then((r) => held(r.decision, r.lease ? { lease: r.lease, target } : null, null))
  }
  if (c.giveBack) {
    const target = spec.limit ? { limit: spec.limit } : { policy: spec.policy }
    // reserved atomically; given back when the response says it does not count
    return c.limiter.reserve(spec.key, { ...target, cost: spec.cost }).then((r) =>
      held(r.decision, null, r.reservation ? { reservation: r.reservation, target } : null)
    )
  }
  if (spec.limit) return c.limiter.check(spec.key, { limit: spec.limit, cost: spec.cost })
  if (spec.plan !== undefined) return c.limiter.check(spec.key, { policy: spec.policy, plan: spec.plan, cost: spec.cost })
  // (the middleware's own policy at cost 1, every request of a plain route: one options object)
  if (spec.cost === 1 && spec.policy === c.policy) return c.limiter.check(spec.key, c.checkOne)
  return c.limiter.check(spec.key, { policy: spec.policy, cost: spec.cost })
}

/** A decision with what the response must give back when it ends (a Decision has no `held`). */
function held(decision, lease, counted) {
  return { held: true, decision, lease, counted }
}

function statusOf(c, decision) {
  if (!decision.allowed) return decision.source === 'fallback' ? 503 : 429
  if (decision.delay > 0 && (!c.wait || decision.delay > c.maxDelayMs)) return 429
  return 200
}

/**
 * skipSuccessfulRequests / skipFailedRequests: once the response is finished (a closed
 * connection is a failed request), a request that does not count gets its reserved units
 * back, to the window that admitted them. Each reservation is settled once.
 */
function settleOnEnd(c, req, res, counted) {
  let done = false
  let settled
  // resolves once the request's units are given back (or kept): for tests and graceful
  // shutdowns that must not cut a give-back short
  req.rateLimitSettled = new Promise((resolve) => {
    settled = resolve
  })
  const settle = (finished) => {
    if (done) return
    done = true
    res.off('finish', onFinish)
    res.off('close', onClose)
    let ok = false
    if (finished) {
      try {
        ok = Boolean(c.giveBack.wasSuccessful(req, res))
      } catch (_) {
        ok = false
      }
    }
    if (ok ? !c.giveBack.successful : !c.giveBack.failed) return settled(false)
    const opts = counted.target.limit ? counted.target : undefined
    // if this fails (Redis down) the units stay counted: nothing more to do
    c.limiter.settle(counted.reservation, 0, opts).then(
      () => settled(true),
      () => settled(false)
    )
  }
  const onFinish = () => settle(true)
  const onClose = () => settle(res.writableFinished === true)
  res.once('finish', onFinish)
  res.once('close', onClose)
}

/**
 * Sets the headers of `decision` on a response (`holder[set](name, value)`, Express's
 * `res.setHeader` or Fastify's `reply.header`), once per response.
 */
function showHeaders(c, holder, decision, status, set, remove) {
  const prev = holder[kShown]
  if (prev !== undefined && !tighter(decision, prev.decision)) return false
  if (prev !== undefined) for (const name in prev.headers) holder[remove](name)
  const retry = status === 503 && c.unavailableRetryAfter !== undefined ? c.unavailableRetryAfter : undefined
  let headers = renderHeaders(decision, c.headers, Date.now(), retry)
  if (status === 429 && decision.allowed) {
    // a leaky bucket's delay the caller prefers not to wait: retry once it has passed
    headers = { ...headers, 'Retry-After': String(Math.ceil(decision.delay / 1000)) }
  }
  for (const name in headers) holder[set](name, headers[name])
  holder[kShown] = { decision, headers }
  return true
}

function bodyOf(decision, status) {
  const body = decision.body()
  if (status === 503) body.error = 'rate_limit_unavailable'
  else if (decision.allowed) {
    body.retry_after = Math.ceil(decision.delay / 1000)
    body.message = `Rate limit exceeded for policy "${decision.policy}": the request would wait ${Math.ceil(decision.delay)} ms.`
  }
  return body
}

/**
 * The `message` option as a body: a string as text, an object as JSON, a function's
 * result (or its Promise's) as either. A Promise of `{ type, text }`.
 */
function messageOf(c, req, res) {
  return Promise.resolve(typeof c.message === 'function' ? c.message(req, res) : c.message).then((m) =>
    typeof m === 'string'
      ? { type: 'text/plain; charset=utf-8', text: m }
      : { type: 'application/json; charset=utf-8', text: JSON.stringify(m) }
  )
}

/** Gives `lease` back once, when the response finishes or the connection closes. */
function releaseOnEnd(c, res, held) {
  let done = false
  const release = () => {
    if (done) return
    done = true
    res.off('finish', release)
    res.off('close', release)
    // the lease expires by itself if this fails (Redis down): nothing more to do
    c.limiter.release(held.lease, held.target).catch(() => {})
  }
  res.once('finish', release)
  res.once('close', release)
}

/**
 * Express / Connect middleware, global (`app.use`) or per route (`app.post('/login', mw,
 * handler)`). See `MiddlewareOptions` in index.d.ts. The decision is on `req.rateLimit`.
 */
function expressMiddleware(limiter, options) {
  const c = compile(limiter, options)
  return function shardlimitMiddleware(req, res, next) {
    decide(c, req, res).then(
      (answer) => {
        if (answer === null) return next()
        let decision = answer
        if (answer.held === true) {
          decision = answer.decision
          if (answer.lease) releaseOnEnd(c, res, answer.lease)
          if (answer.counted) settleOnEnd(c, req, res, answer.counted)
        }
        const status = statusOf(c, decision)
        if (showHeaders(c, res, decision, status, 'setHeader', 'removeHeader')) {
          req.rateLimit = decision
        }
        if (status === 200) {
          if (decision.delay > 0) return hold(req, res, decision.delay, next)
          return next()
        }
        const custom = status === 503 ? c.unavailableHandler : c.handler
        if (custom) {
          // a handler that throws (or rejects) goes to Express's error handling
          try {
            const out = custom(req, res, next, decision)
            if (out && typeof out.then === 'function') out.then(undefined, next)
          } catch (e) {
            next(e)
          }
          return
        }
        if (status === 429 && c.message !== undefined) {
          return messageOf(c, req, res).then((m) => {
            res.statusCode = c.statusCode
            res.setHeader('Content-Type', m.type)
            res.end(m.text)
          }, next)
        }
        res.statusCode = status === 429 ? c.statusCode : status
        res.setHeader('Content-Type', 'application/json; charset=utf-8')
        res.end(JSON.stringify(bodyOf(decision, status)))
      },
      next // (an error goes to Express's error handling)
    )
  }
}

/** Holds a request for a leaky bucket's delay; a client that goes away is not served. */
function hold(req, res, delayMs, next) {
  const timer = setTimeout(() => {
    res.off('close', abort)
    next()
  }, delayMs)
  const abort = () => clearTimeout(timer)
  res.once('close', abort)
}

/**
 * A Fastify `onRequest` hook: for `addHook('onRequest', ...)` or a route's `onRequest`
 * option. Not-found requests (no route) are not limited.
 */
function fastifyHook(limiter, options) {
  const c = compile(limiter, options)
  return fastifyHookOf(c)
}

function fastifyHookOf(c) {
  return async function shardlimitHook(request, reply) {
    if (request.is404) return
    const answer = await decide(c, request.raw || request, reply.raw || reply)
    if (answer === null) return
    let decision = answer
    if (answer.held === true) {
      decision = answer.decision
      if (answer.lease) releaseOnEnd(c, reply.raw, answer.lease)
      if (answer.counted) settleOnEnd(c, request.raw, reply.raw, answer.counted)
    }
    const status = statusOf(c, decision)
    if (showHeaders(c, reply, decision, status, 'header', 'removeHeader')) {
      request.rateLimit = decision
    }
    if (status === 200) {
      if (decision.delay > 0) {
        await new Promise((resolve) => {
          const timer = setTimeout(done, decision.delay)
          function done() {
            clearTimeout(timer)
            reply.raw.off('close', done)
            resolve()
          }
          reply.raw.once('close', done)
        })
        if (request.raw.destroyed) return reply.hijack() // the client went away
      }
      return
    }
    const custom = status === 503 ? c.unavailableHandler : c.handler
    if (custom) {
      await custom(request, reply, decision)
      return reply
    }
    if (status === 429 && c.message !== undefined) {
      const m = await messageOf(c, request, reply)
      reply.code(c.statusCode).type(m.type).send(m.text)
      return reply
    }
    reply.code(status === 429 ? c.statusCode : status).type('application/json; charset=utf-8').send(bodyOf(decision, status))
    return reply
  }
}

/**
 * A Fastify plugin: `fastify.register(fastifyPlugin, { limiter, policy: 'api' })`. It
 * limits the routes registered after it (not 404s): every route by default, or with
 * `global: false` only those whose `config.rateLimit` is set. A route's `config.rateLimit`
 * is `false` (not limited) or options that override the plugin's.
 */
function fastifyPlugin(fastify, opts, done) {
  try {
    const { limiter, global, ...defaults } = opts || {}
    if (global !== undefined && typeof global !== 'boolean') throw typeError('The "options.global" argument must be a boolean')
    const shared = global === false ? null : fastifyHookOf(compile(limiter, defaults))
    // the start-up connect ends before the server listens
    const ms = typeof defaults.warmUpMs === 'number' && defaults.warmUpMs >= 0 ? defaults.warmUpMs : 5000
    const warm = warmUp(limiter, ms)
    fastify.addHook('onReady', () => warm.promise)
    fastify.addHook('onRoute', (route) => {
      const own = route.config && route.config.rateLimit
      if (own === false) return
      let hook = shared
      if (own !== undefined && own !== null) {
        if (typeof own !== 'object') throw typeError(`route ${route.url}: config.rateLimit must be false or an object`)
        hook = fastifyHookOf(compile(limiter, overlay(defaults, own)))
      }
      if (!hook) return
      const existing = route.onRequest ? [].concat(route.onRequest) : []
      route.onRequest = [hook, ...existing]
    })
    done()
  } catch (e) {
    done(e)
  }
}
/** A route's options over the plugin's: a route's `limit` replaces the plugin's `policy` and vice versa. */
function overlay(defaults, own) {
  const merged = { ...defaults, ...own }
  if (own.limit !== undefined && own.policy === undefined) delete merged.policy
  if (own.policy !== undefined && own.limit === undefined) delete merged.limit
  if (own.key !== undefined && own.keyGenerator === undefined) delete merged.keyGenerator
  if (own.keyGenerator !== undefined && own.key === undefined) delete merged.key
  return merged
}

fastifyPlugin[Symbol.for('skip-override')] = true
fastifyPlugin[Symbol.for('fastify.display-name')] = 'shardlimit'

module.exports = { expressMiddleware, fastifyHook, fastifyPlugin, renderHeaders }
