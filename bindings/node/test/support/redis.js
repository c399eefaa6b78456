'use strict'
// Test support: a real redis-server on a free 127.0.0.1 port, one per test file, stopped
// by stop(). Readiness is read from the server's own log line, not guessed with a sleep.
// SHARDLIMIT_REDIS_SERVER names another server binary to start instead (valkey-server:
// scripts/test-valkey.sh), as the core's and the Python binding's test support do.

const { spawn } = require('node:child_process')
const net = require('node:net')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const SERVER = process.env.SHARDLIMIT_REDIS_SERVER || 'redis-server'

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.unref()
    srv.on('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

// Starts redis-server on a free port and resolves once its own log says it is ready; a
// port found free may be taken before the server binds it (the kernel hands a released
// port out again): the server then exits, and starts again on another port.
async function spawnRedis(extraArgs) {
  const port = await freePort()
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'shardlimit-node-redis-'))
  const child = spawn(
    SERVER,
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, ...extraArgs],
    { stdio: ['ignore', 'pipe', 'inherit'] }
  )
  const ready = await new Promise((resolve, reject) => {
    let log = ''
    const onData = (chunk) => {
      log += chunk
      if (log.includes('Ready to accept connections')) {
        child.stdout.off('data', onData)
        child.stdout.resume()
        resolve(true)
      }
    }
    child.stdout.on('data', onData)
    child.once('error', reject)
    child.once('exit', (code) => {
      if (/Address already in use/i.test(log)) resolve(false)
      else reject(new Error(`${SERVER} exited with ${code} before it was ready:\n${log}`))
    })
  })
  if (!ready) fs.rmSync(dir, { recursive: true, force: true })
  return ready ? { port, dir, child } : null
}

async function startRedis(extraArgs = []) {
  let started = null
  for (let i = 0; i < 10 && !started; i++) started = await spawnRedis(extraArgs)
  if (!started) throw new Error(`no free port for ${SERVER} after 10 tries`)
  const { port, dir, child } = started
  const url = `redis://127.0.0.1:${port}`
  return {
    port,
    url,
    pid: child.pid,
    /** A config with this server as the only shard. */
    config(policies, extra = {}) {
      return { timeout_ms: 2000, shards: [{ name: 's0', url }], policies, ...extra }
    },
    /** Runs one Redis command (RESP over a fresh socket). */
    command(...args) {
      return new Promise((resolve, reject) => {
        const sock = net.connect(port, '127.0.0.1')
        let buf = ''
        sock.setEncoding('utf8')
        sock.on('data', (d) => {
          buf += d
          if (buf.endsWith('\r\n')) {
            sock.end()
            if (buf.startsWith('-')) reject(new Error(buf.trim()))
            else resolve(buf.trim())
          }
        })
        sock.on('error', reject)
        sock.write(`*${args.length}\r\n` + args.map((a) => `$${Buffer.byteLength(String(a))}\r\n${a}\r\n`).join(''))
      })
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child.once('exit', r))
        child.kill('SIGKILL')
        await exited
      }
      fs.rmSync(dir, { recursive: true, force: true })
    },
  }
}

module.exports = { startRedis, freePort, SERVER }
