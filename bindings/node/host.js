'use strict'
// The host transport (`{ transport: 'host' }`): checks whose bytes move on this process's
// own event loop, one `net.Socket` per shard, instead of crossing to the limiter's I/O
// thread. The core's state machine (NativeHostChecks over `shardlimit::HostChecks`)
// builds the script calls, packs a tick's checks into one batch call, frames and checks
// every reply, keeps the deadlines and decides (on_error, metrics, events, circuits); this
// file only moves bytes: it connects (and reconnects with backoff, or at once when a check
// finds the shard's circuit closed), writes what `transmit` gives once per turn of the
// event loop (and every 16 checks), hands every chunk read to `onData`, and arms one timer
// for the next deadline.
//
// The write waits for `setImmediate`, not a microtask: an HTTP server makes one check per
// request, each in its own socket callback with the microtask queue drained in between, so
// a microtask flush wrote (and made Redis parse and answer) one batch per request. The
// check phase comes right after the poll phase that ran those callbacks: the requests that
// arrived together go out as one write and come back as one read.
//
// Reads go into one buffer this transport reuses (`onread`), handed to the machine by one
// call per read, which settles the checks it answers; a write follows a read only when the
// machine asks for one (the log-in done, NOSCRIPT).
//
// A deadline is a shard's silence, never this loop's business: the timer runs in the timers
// phase, before the poll phase reads the sockets, so on a busy loop it would fire with the
// replies it waits for already in the socket. It only schedules the deadline's handling for
// the check phase (`setImmediate`), after this turn's poll phase has handed every socket's
// bytes to `onData`; a shard that sent anything is not silent. A socket that still holds
// bytes then (FIONREAD) defers it once more.

const net = require('node:net')

const BACKOFF_MIN_MS = 20
// as the core's circuit probe (250 ms): a shard back from a restart is connected again
// within it, or sooner when a check comes once its circuit has closed
const BACKOFF_MAX_MS = 250
// Checks queued in one tick before they are written at once, without waiting for the end
// of the tick: Redis starts on them while this loop goes on deciding what follows (the
// settling of a reply and the checks its callers make next), so several batches are in
// flight per connection instead of one batch answered, then the next sent.
const PIPELINE_CHUNK = 16
// `onData`'s answer: the socket must be closed (bytes it cannot trust); the machine has
// bytes to write (the log-in's end released the checks that waited, or NOSCRIPT)
const READ_DOWN = 1
const READ_TRANSMIT = 2
// one read buffer per transport (a read is handed to the machine before the next)
const READ_BUFFER_BYTES = 64 * 1024

class HostTransport {
  constructor(native) {
    this.native = native
    this.sockets = []
    this.readBuffer = Buffer.allocUnsafe(READ_BUFFER_BYTES)
    this.backoff = []
    this.reconnectTimers = []
    this.flushScheduled = false
    this.unsent = 0 // checks queued since the last write
    this.timer = null
    this.deadlineDue = false // the timer fired; its handling waits for the check phase
    this.sleeping = 0 // shards waiting out a reconnect back-off
    this.closed = false // no more checks; the sockets stay until those in flight are answered
    this.gone = false // the sockets are closed
    this.flush = () => this.#flush()
    this.onTimer = () => this.#onTimer()
    this.onDeadline = () => this.#onDeadline()
    for (let shard = 0; shard < native.shardCount; shard++) {
      this.sockets.push(null)
      this.backoff.push(0)
      this.reconnectTimers.push(null)
      this.#connect(shard)
    }
  }

  /** A check's Promise, or null when the check needs the limiter's own path. */
  check(key, policy, cost) {
    const p = this.native.check(key, policy, cost)
    if (p === null) return p
    if (this.sleeping > 0) {
      // a check on a shard in back-off whose circuit is closed: it waits for a connect now
      const shard = this.native.wantedConnect
      if (shard !== null) this.#connectNow(shard)
    }
    if (++this.unsent >= PIPELINE_CHUNK) {
      this.#write() // (the flush already scheduled writes the rest)
    } else if (!this.flushScheduled) {
      this.flushScheduled = true
      // the rest of this turn's checks go out in one write per shard
      setImmediate(this.flush)
    }
    return p
  }

  #flush() {
    this.flushScheduled = false
    this.#write()
  }

  #write() {
    this.unsent = 0
    const native = this.native
    for (let shard = 0; shard < this.sockets.length; shard++) {
      const s = this.sockets[shard]
      if (s === null) continue
      const bytes = native.transmit(shard)
      if (bytes !== null) s.write(bytes)
    }
    this.#arm()
  }

  /** One timer for the earliest deadline, while anything waits. */
  #arm() {
    if (this.timer !== null || this.deadlineDue || this.gone) return
    const ms = this.native.nextDeadlineMs()
    if (ms === null) return
    this.timer = setTimeout(this.onTimer, Math.ceil(ms) + 1)
  }

  #onTimer() {
    this.timer = null
    // the replies already in the sockets are read first (this turn's poll phase)
    this.deadlineDue = true
    setImmediate(this.onDeadline)
  }

  #onDeadline() {
    this.deadlineDue = false
    if (this.gone) return
    for (const s of this.sockets) {
      const fd = s !== null && s._handle ? s._handle.fd : -1
      if (fd >= 0 && this.native.unread(fd) > 0) {
        // bytes wait in a socket still: the next poll phase reads them first
        this.deadlineDue = true
        setImmediate(this.onDeadline)
        return
      }
    }
    this.native.onTimer()
    for (let shard = 0; shard < this.sockets.length; shard++) {
      if (this.sockets[shard] !== null && this.native.isDown(shard)) this.#drop(shard)
    }
    if (this.#drained()) return
    this.#arm()
  }

  /** Closed, and nothing in flight any more: the sockets go. */
  #drained() {
    if (!this.closed || this.gone || this.native.inFlight > 0) return false
    this.#shut('the limiter was closed')
    return true
  }

  #connectNow(shard) {
    const t = this.reconnectTimers[shard]
    if (t === null) {
      // (the machine asked, but a connect is under way or the limiter is closed)
      if (this.sockets[shard] === null && !this.closed) this.#connect(shard)
      return
    }
    clearTimeout(t)
    this.#connect(shard) // (which counts it out of `sleeping`)
  }

  #connect(shard) {
    if (this.closed) return
    if (this.reconnectTimers[shard] !== null) {
      this.reconnectTimers[shard] = null
      this.sleeping--
    }
    const { host, port } = this.native.address(shard)
    this.native.connecting(shard)
    // the bytes read go straight to the machine from one buffer this transport reuses
    // (`onread`): no Buffer per read, no 'data' event through the stream's machinery
    const s = net.connect({
      host,
      port,
      noDelay: true,
      onread: { buffer: this.readBuffer, callback: (n) => this.#onRead(shard, s, n) },
    })
    // the limiter does not keep the process alive by itself; a check in flight does (its
    // deadline timer)
    s.unref()
    this.sockets[shard] = s
    s.on('connect', () => {
      if (this.sockets[shard] !== s) return
      this.native.connected(shard)
      this.#flush() // the log-in, and what waited for the connection
    })
    s.on('error', () => {}) // 'close' follows, with the reason in `hadError`
    s.on('close', (hadError) => {
      if (this.sockets[shard] !== s) return
      this.sockets[shard] = null
      this.native.onClosed(shard, hadError ? 'the connection to Redis failed' : 'the connection to Redis closed')
      if (!this.#drained()) this.#reconnectLater(shard)
    })
  }

  /** `n` bytes read from shard `shard` into `readBuffer` (the machine copies what it keeps). */
  #onRead(shard, s, n) {
    if (this.sockets[shard] !== s) return
    const got = this.native.onData(shard, this.readBuffer, n)
    if ((got & READ_DOWN) !== 0) {
      this.#drop(shard)
    } else if (this.#drained()) {
      // closed, and the last check in flight was answered
    } else {
      this.backoff[shard] = 0
      // the log-in done while checks wait, or NOSCRIPT (a check goes out again as EVAL):
      // only then a write; a plain reply writes nothing
      if ((got & READ_TRANSMIT) !== 0 && !this.flushScheduled) {
        this.flushScheduled = true
        setImmediate(this.flush)
      }
    }
  }

  /** The machine gave the connection up (bytes it cannot trust, a late reply). */
  #drop(shard) {
    const s = this.sockets[shard]
    this.sockets[shard] = null
    if (s !== null) s.destroy()
    if (!this.#drained()) this.#reconnectLater(shard)
  }

  #reconnectLater(shard) {
    if (this.closed || this.reconnectTimers[shard] !== null) return
    const b = Math.min(Math.max(this.backoff[shard] * 2, BACKOFF_MIN_MS), BACKOFF_MAX_MS)
    this.backoff[shard] = b
    // jittered down to half, as the core's own reconnects
    const t = setTimeout(() => this.#connect(shard), b / 2 + Math.random() * (b / 2))
    t.unref()
    this.reconnectTimers[shard] = t
    this.sleeping++
  }

  /**
   * No more checks; those in flight (and those of this turn not yet written) still go and
   * are answered, or fail at their deadline, as the I/O thread's calls do; then the
   * sockets close.
   */
  close() {
    if (this.closed) return
    this.closed = true
    if (this.native.inFlight > 0) {
      this.#arm()
      return
    }
    this.#shut('the limiter was closed')
  }

  #shut(why) {
    this.gone = true
    if (this.timer !== null) clearTimeout(this.timer)
    this.timer = null
    for (let shard = 0; shard < this.sockets.length; shard++) {
      const t = this.reconnectTimers[shard]
      if (t !== null) clearTimeout(t)
      this.reconnectTimers[shard] = null
      const s = this.sockets[shard]
      this.sockets[shard] = null
      if (s !== null) s.destroy()
      this.native.onClosed(shard, why)
    }
  }
}

module.exports = { HostTransport }
