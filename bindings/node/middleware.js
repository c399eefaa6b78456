'use strict'
// HTTP middleware: Express / Connect (plain `http` works too) and a Fastify hook.
// Each request is mapped to (key, policy, cost); the core decides; the decision's
// headers are set on every response, and a denied request gets 429 with the core's JSON
// body. No limiting logic lives here.

const { native } = require('./binding.js')

function ipOf(req, proxies) {
  const peer = (req.socket && req.socket.remoteAddress) || ''
  // the core's trusted-proxy rule: X-Forwarded-For is believed only from trusted hops
  const xff = req.headers && req.headers['x-forwarded-for']
  // IPv6 clients by their network (the core's client key), so a /64 is one client
  return proxies.clientKey(peer, Array.isArray(xff) ? xff.join(',') : xff || null)
}

function compile(limiter, options) {
  if (!limiter || typeof limiter.check !== 'function') {
    throw new TypeError('The "limiter" argument must be a shardlimit Limiter')
  }
  const opts = options || {}
  if (typeof opts !== 'object') throw new TypeError('The "options" argument must be an object')
  const { policy, key, cost, trustedProxies, ipv6Prefix } = opts
  if (policy !== undefined && typeof policy !== 'string') {
    throw new TypeError('The "options.policy" argument must be of type string')
  }
  if (key !== undefined && typeof key !== 'function') {
    throw new TypeError('The "options.key" argument must be a function (req) => key')
  }
  if (cost !== undefined && typeof cost !== 'function' && typeof cost !== 'number') {
    throw new TypeError('The "options.cost" argument must be a number or a function (req) => number')
  }
  if (trustedProxies !== undefined && !Array.isArray(trustedProxies)) {
    throw new TypeError('The "options.trustedProxies" argument must be an array of CIDR strings')
  }
  if (ipv6Prefix !== undefined && !Number.isInteger(ipv6Prefix)) {
    throw new TypeError('The "options.ipv6Prefix" argument must be an integer from 1 to 128')
  }
  // parsed once; a bad prefix fails here
  const proxies = new native.TrustedProxies(trustedProxies || [], ipv6Prefix === undefined ? null : ipv6Prefix)
  /** (req) → { key, policy, cost } | null (null: not limited). */
  return function resolve(req) {
    const k = key ? key(req) : ipOf(req, proxies)
    if (k === null || k === undefined || k === false) return null
    const spec = typeof k === 'object' ? { ...k } : { key: k }
    if (spec.policy === undefined) spec.policy = policy
    if (spec.policy === undefined) {
      throw new TypeError('shardlimit middleware: no policy (set options.policy or return { key, policy })')
    }
    if (spec.cost === undefined) spec.cost = typeof cost === 'function' ? cost(req) : cost === undefined ? 1 : cost
    return spec
  }
}

/**
 * Express / Connect middleware. `options`: `policy`, `key(req)` (default: the client IP),
 * `cost` (number or `(req) => number`), `trustedProxies` (CIDRs whose X-Forwarded-For is
 * believed). The decision is stored on `req.rateLimit`.
 */
function expressMiddleware(limiter, options) {
  const resolve = compile(limiter, options)
  return function shardlimitMiddleware(req, res, next) {
    let spec
    try {
      spec = resolve(req)
    } catch (e) {
      next(e)
      return
    }
    if (spec === null) {
      next()
      return
    }
    limiter.check(spec.key, spec).then(
      (decision) => {
        req.rateLimit = decision
        const headers = decision.headers()
        for (const name in headers) res.setHeader(name, headers[name])
        if (decision.allowed) {
          next()
          return
        }
        res.statusCode = 429
        res.setHeader('Content-Type', 'application/json; charset=utf-8')
        res.end(JSON.stringify(decision.body()))
      },
      (err) => next(err)
    )
  }
}

/**
 * A Fastify `onRequest` hook with the same options:
 * `fastify.addHook('onRequest', fastifyHook(limiter, { policy: 'api' }))`.
 */
function fastifyHook(limiter, options) {
  const resolve = compile(limiter, options)
  return async function shardlimitHook(request, reply) {
    const spec = resolve(request.raw || request)
    if (spec === null) return
    const decision = await limiter.check(spec.key, spec)
    request.rateLimit = decision
    reply.headers(decision.headers())
    if (!decision.allowed) {
      reply.code(429).type('application/json; charset=utf-8').send(decision.body())
      return reply
    }
  }
}

/**
 * A Fastify plugin: `fastify.register(fastifyPlugin, { limiter, policy: 'api' })`.
 * It applies to the whole instance (it skips Fastify's encapsulation).
 */
function fastifyPlugin(fastify, opts, done) {
  const { limiter, ...rest } = opts || {}
  fastify.addHook('onRequest', fastifyHook(limiter, rest))
  done()
}
fastifyPlugin[Symbol.for('skip-override')] = true
fastifyPlugin[Symbol.for('fastify.display-name')] = 'shardlimit'

module.exports = { expressMiddleware, fastifyHook, fastifyPlugin }
