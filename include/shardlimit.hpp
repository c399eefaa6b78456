// shardlimit.hpp: a small header-only C++17 RAII wrapper over the shardlimit C ABI
// (shardlimit.h). Handles are std::unique_ptr with the matching _free function; failures
// are shardlimit::Error exceptions carrying the stable result code. Every method is
// thread-safe (the C library is); a Limiter can be shared by reference across threads.
// The blocking calls (check, ...) wait on the calling thread; check_async returns a
// shardlimit::Pending at once, whose std::future completes on the library's I/O thread.
#pragma once

#include <shardlimit.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardlimit {

/// A failed call: `code()` is the stable shardlimit_result, `what()` the message.
class Error : public std::runtime_error {
 public:
  Error(shardlimit_result code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  shardlimit_result code() const noexcept { return code_; }
  /// The code's stable name ("config", "timeout", ...).
  std::string_view name() const noexcept {
    shardlimit_str s = shardlimit_result_name(code_);
    return {s.ptr, s.len};
  }
  /// True when Redis failed (connection, timeout, script, unavailable) rather than the
  /// caller.
  bool is_backend() const noexcept { return shardlimit_result_is_backend(code_); }
  /// True when the error is of `kind` or of a special case of it (the hierarchy of
  /// spec/errors.json: an UNKNOWN_POLICY error is an INVALID_ARGUMENT).
  bool is(shardlimit_result kind) const noexcept {
    uint32_t c = code_;
    for (int depth = 0; c != 0 && depth < 8; depth++, c = shardlimit_result_parent(c))
      if (c == static_cast<uint32_t>(kind)) return true;
    return false;
  }

 private:
  shardlimit_result code_;
};

namespace detail {
/// Throws for a failed call, taking ownership of (and freeing) its error object.
/// `err` is taken by reference on purpose: in `check(shardlimit_x(..., &err), err)` the
/// argument order is unspecified, so it must be read here, after the call wrote it.
inline void check(shardlimit_result rc, shardlimit_error*& err) {
  if (rc == SHARDLIMIT_OK) return;
  std::unique_ptr<shardlimit_error, decltype(&shardlimit_error_free)> owned(err,
                                                                           &shardlimit_error_free);
  err = nullptr;
  shardlimit_str m = shardlimit_error_message(owned.get());
  std::string message = m.len ? std::string(m.ptr, m.len)
                              : std::string(shardlimit_result_name(rc).ptr);
  throw Error(rc, message);
}
template <auto Free>
struct Deleter {
  template <class T>
  void operator()(T* p) const noexcept { Free(p); }
};
using LimiterPtr = std::unique_ptr<shardlimit_limiter, Deleter<&shardlimit_limiter_free>>;
using PolicyPtr = std::unique_ptr<shardlimit_policy, Deleter<&shardlimit_policy_free>>;
using LeasePtr = std::unique_ptr<shardlimit_lease, Deleter<&shardlimit_lease_free>>;
using HeadersPtr = std::unique_ptr<shardlimit_headers, Deleter<&shardlimit_headers_free>>;
/// The text of an owned string, which is freed.
inline std::string take(shardlimit_string& s) {
  std::string out = s.ptr ? std::string(s.ptr, s.len) : std::string();
  shardlimit_string_free(&s);
  return out;
}
}  // namespace detail

/// The outcome of one check (a copy of the plain C struct; nothing to free).
class Decision {
 public:
  explicit Decision(const shardlimit_decision& d) : d_(d) {}
  bool allowed() const noexcept { return d_.allowed; }
  uint64_t limit() const noexcept { return d_.limit; }
  uint64_t remaining() const noexcept { return d_.remaining; }
  std::chrono::microseconds reset_after() const noexcept {
    return std::chrono::microseconds(d_.reset_after_us);
  }
  /// Empty when allowed, and when the cost can never fit.
  std::optional<std::chrono::microseconds> retry_after() const noexcept {
    if (!d_.has_retry_after) return std::nullopt;
    return std::chrono::microseconds(d_.retry_after_us);
  }
  std::chrono::microseconds delay() const noexcept { return std::chrono::microseconds(d_.delay_us); }
  std::string_view policy() const noexcept { return {d_.policy, d_.policy_len}; }
  shardlimit_source source() const noexcept { return static_cast<shardlimit_source>(d_.source); }
  std::string_view source_name() const noexcept {
    shardlimit_str s = shardlimit_source_name(d_.source);
    return {s.ptr, s.len};
  }
  std::optional<uint32_t> shard() const noexcept {
    return d_.has_shard ? std::optional<uint32_t>(d_.shard) : std::nullopt;
  }
  /// For check_all: the index of the layer this decision describes.
  std::optional<uint32_t> layer() const noexcept {
    return d_.has_layer ? std::optional<uint32_t>(d_.layer) : std::nullopt;
  }
  /// A multi-limit policy: the index of the limit this decision describes (the one that
  /// denied, or the tightest when all allowed).
  std::optional<uint32_t> limit_index() const noexcept {
    return d_.has_limit_index ? std::optional<uint32_t>(d_.limit_index) : std::nullopt;
  }
  /// A multi-limit policy: every limit in force, in order (what RateLimit-Policy lists);
  /// empty for a policy of one limit.
  std::vector<shardlimit_quota> quotas() const {
    return std::vector<shardlimit_quota>(d_.quotas, d_.quotas + d_.quota_count);
  }
  /// Shadow mode: the limit would have denied, but the policy (or the call, check_shadow)
  /// is in shadow, so it was allowed and consumed nothing.
  bool shadow_denied() const noexcept { return d_.shadow_denied; }
  const shardlimit_decision& raw() const noexcept { return d_; }

  /// The rate-limit response headers, rendered by the core, in a stable order
  /// (`X-RateLimit-Reset` the Unix time of the reset, as in every language).
  std::vector<std::pair<std::string, std::string>> headers() const {
    shardlimit_headers* h = nullptr;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_decision_headers(&d_, &h, &err), err);
    detail::HeadersPtr owned(h);
    std::vector<std::pair<std::string, std::string>> out;
    size_t n = shardlimit_headers_len(h);
    out.reserve(n);
    for (size_t i = 0; i < n; i++) {
      shardlimit_str name, value;
      detail::check(shardlimit_headers_get(h, i, &name, &value, &err), err);
      out.emplace_back(std::string(name.ptr, name.len), std::string(value.ptr, value.len));
    }
    return out;
  }
  /// The JSON body of a 429 response.
  std::string body() const { return render(&shardlimit_decision_body); }
  /// The decision as JSON (durations in milliseconds).
  std::string to_json() const { return render(&shardlimit_decision_to_json); }

 private:
  template <class F>
  std::string render(F f) const {
    shardlimit_string s{nullptr, 0};
    shardlimit_error* err = nullptr;
    detail::check(f(&d_, &s, &err), err);
    std::string out(s.ptr, s.len);
    shardlimit_string_free(&s);
    return out;
  }
  shardlimit_decision d_;
};

template <class T>
class Pending;
namespace detail {
template <class T, class Read, class Start>
Pending<T> start(Start start, Read read);
}  // namespace detail

/// A call in flight, from Limiter::check_async: its result comes through a std::future,
/// set on the library's I/O thread (or at once, on the in-memory engine). Dropping a
/// Pending does not cancel the call; cancel() does. Movable; thread-safe.
template <class T>
class Pending {
 public:
  /// The result; blocks until the call completes. Throws shardlimit::Error when the call
  /// failed (code SHARDLIMIT_ERR_CANCELLED after cancel()).
  T get() { return future_.get(); }
  /// The future itself, for wait_for / wait_until.
  std::future<T>& future() noexcept { return future_; }
  /// Cancels the call if it has not completed: the future then holds an Error with code
  /// SHARDLIMIT_ERR_CANCELLED. True when it cancelled, false when the call had completed.
  /// A check sent before the cancel may still have been counted by Redis.
  bool cancel() noexcept { return shardlimit_pending_cancel(p_); }

 private:
  template <class U, class Read, class Start>
  friend Pending<U> detail::start(Start start, Read read);
  Pending(shardlimit_pending* p, std::future<T> f) : p_(p), future_(std::move(f)) {}
  // the C handle, freed by the completion callback: a never-reused token, so cancel()
  // after completion is harmless
  shardlimit_pending* p_;
  std::future<T> future_;
};

namespace detail {
/// The state of one started call: the promise its callback fulfils with `Read(pending)`.
template <class T, class Read>
struct Completion {
  std::promise<T> promise;
  Read read;
  /// shardlimit_callback: runs once, on the I/O thread; never throws into C.
  static void callback(void* user, shardlimit_pending* p) noexcept {
    std::unique_ptr<Completion> self(static_cast<Completion*>(user));
    try {
      self->promise.set_value(self->read(p));
    } catch (...) {
      try {
        self->promise.set_exception(std::current_exception());
      } catch (...) {
      }
    }
    shardlimit_pending_free(p);
  }
};

/// Starts a call with `start(callback, user, &pending, &err)`; its result is `read(pending)`.
template <class T, class Read, class Start>
Pending<T> start(Start start, Read read) {
  auto* c = new Completion<T, Read>{std::promise<T>(), std::move(read)};
  std::future<T> f = c->promise.get_future();
  shardlimit_pending* p = nullptr;
  shardlimit_error* err = nullptr;
  shardlimit_result rc = start(&Completion<T, Read>::callback, static_cast<void*>(c), &p, &err);
  if (rc != SHARDLIMIT_OK) {
    delete c;  // no pending: the callback never runs
    check(rc, err);
  }
  return Pending<T>(p, std::move(f));
}

inline Decision pending_decision(shardlimit_pending* p);
/// The JSON answer of a started override call or shadow report, if there is one.
inline std::optional<std::string> pending_optional_text(shardlimit_pending* p) {
  bool found = false;
  shardlimit_string s{nullptr, 0};
  shardlimit_error* err = nullptr;
  check(shardlimit_pending_string(p, &found, &s, &err), err);
  std::string text = take(s);
  if (!found) return std::nullopt;
  return text;
}
inline std::string pending_text(shardlimit_pending* p) {
  return pending_optional_text(p).value_or(std::string());
}
inline bool pending_bool(shardlimit_pending* p) {
  bool b = false;
  shardlimit_error* err = nullptr;
  check(shardlimit_pending_bool(p, &b, &err), err);
  return b;
}
}  // namespace detail

/// A manual clock for deterministic tests: limiters made with it read time from it.
class Clock {
 public:
  explicit Clock(uint64_t start_us) {
    shardlimit_clock* c = nullptr;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_clock_new(start_us, &c, &err), err);
    c_.reset(c);
  }
  void set_us(uint64_t now_us) const {
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_clock_set_us(c_.get(), now_us, &err), err);
  }
  void advance(std::chrono::microseconds d) const {
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_clock_advance_us(c_.get(), static_cast<uint64_t>(d.count()), &err),
                  err);
  }
  const shardlimit_clock* get() const noexcept { return c_.get(); }

 private:
  std::unique_ptr<shardlimit_clock, detail::Deleter<&shardlimit_clock_free>> c_;
};

/// A policy: from Limiter::policy (by name) or Policy::make (ad hoc).
class Policy {
 public:
  static Policy make(std::string_view name, const shardlimit_limit& limit) {
    shardlimit_policy* p = nullptr;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_policy_new(name.data(), name.size(), &limit, &p, &err), err);
    return Policy(p);
  }
  /// A policy of a rate string ("5/minute", "10/second; 1000/day": several limits are
  /// checked together), each limit of `algorithm`; an empty `name` names it after its
  /// limits. A bad string throws an Error (INVALID_ARGUMENT) quoting the bad part.
  static Policy from_rate(std::string_view rate,
                          shardlimit_algorithm algorithm = SHARDLIMIT_ALGORITHM_FIXED_WINDOW,
                          std::string_view name = {}) {
    shardlimit_policy* p = nullptr;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_policy_new_rate(name.data(), name.size(), rate.data(), rate.size(),
                                             static_cast<uint32_t>(algorithm), &p, &err),
                  err);
    return Policy(p);
  }
  std::string_view name() const noexcept {
    shardlimit_str s = shardlimit_policy_name(p_.get());
    return {s.ptr, s.len};
  }
  const shardlimit_policy* get() const noexcept { return p_.get(); }
  /// A copy of this policy in shadow mode (or enforcing, with false): a check its limit
  /// would deny is allowed (Decision::shadow_denied), consumes nothing and is reported.
  /// A concurrency policy throws an Error (INVALID_ARGUMENT).
  Policy with_shadow(bool shadow = true) const {
    shardlimit_policy* p = nullptr;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_policy_with_shadow(p_.get(), shadow, &p, &err), err);
    return Policy(p);
  }

 private:
  friend class Limiter;
  explicit Policy(shardlimit_policy* p) : p_(p) {}
  detail::PolicyPtr p_;
};

/// A held concurrency lease. Destroying it frees the object but does not release the
/// lease (it expires after the policy's TTL); call Limiter::release for that.
class Lease {
 public:
  const shardlimit_lease* get() const noexcept { return l_.get(); }

 private:
  friend class Limiter;
  explicit Lease(shardlimit_lease* l) : l_(l) {}
  detail::LeasePtr l_;
};

/// Units reserved by Limiter::reserve, to settle once with Limiter::settle (with the same
/// policy) when the actual cost is known. Plain data: copy it freely.
struct Reservation {
  std::string key;
  /// Units reserved.
  uint64_t units = 0;
  /// When they were recorded (µs on the engine's clock): where the unused part goes back.
  uint64_t at_us = 0;
};

/// One layer of Limiter::check_all: `cost` units of the named policy for `key`.
struct Layer {
  std::string_view key;
  std::string_view policy;
  uint64_t cost = 1;
};

/// A key's block-list entry.
struct BlockInfo {
  std::string reason;
  /// Empty for a permanent block.
  std::optional<std::chrono::microseconds> remaining;
};

/// One event of a limiter (a copy of the plain C struct; nothing to free). Fields a kind
/// does not use are empty or zero.
class Event {
 public:
  explicit Event(const shardlimit_event& e) : e_(e) {}
  shardlimit_event_kind kind() const noexcept { return static_cast<shardlimit_event_kind>(e_.kind); }
  /// "denied", "blocked", "fallback", "circuit", "shadow_denied", "near_limit", "reloaded",
  /// "reload_rejected", as every binding spells it.
  std::string_view kind_name() const noexcept {
    shardlimit_str s = shardlimit_event_kind_name(e_.kind);
    return {s.ptr, s.len};
  }
  std::string_view policy() const noexcept { return {e_.policy, e_.policy_len}; }
  std::string_view key() const noexcept { return {e_.key, e_.key_len}; }
  uint64_t limit() const noexcept { return e_.limit; }
  uint64_t remaining() const noexcept { return e_.remaining; }
  /// Denied: when the check could pass; blocked: when the block expires.
  std::optional<std::chrono::microseconds> retry_after() const noexcept {
    if (!e_.has_retry_after) return std::nullopt;
    return std::chrono::microseconds(e_.retry_after_us);
  }
  /// Blocked: the denial put the key on the block list itself.
  bool auto_block() const noexcept { return e_.auto_block; }
  /// Fallback: whether on_error allowed the request.
  bool allowed() const noexcept { return e_.allowed; }
  bool circuit_open() const noexcept { return e_.circuit_open; }
  /// Reloaded: new connections were made.
  bool engine_changed() const noexcept { return e_.engine_changed; }
  /// Fallback, reload_rejected: the error's code.
  shardlimit_result error_code() const noexcept { return static_cast<shardlimit_result>(e_.error_code); }
  /// Denied, shadow_denied: the check's decision.
  std::optional<Decision> decision() const {
    if (!e_.has_decision) return std::nullopt;
    return Decision(e_.decision);
  }
  /// The error message (fallback, reload_rejected), the shard (circuit), the policies
  /// that changed, comma-separated (reloaded).
  std::string_view detail() const noexcept { return {e_.detail, e_.detail_len}; }
  const shardlimit_event& raw() const noexcept { return e_; }

 private:
  shardlimit_event e_;
};

/// A subscription to a limiter's events (Limiter::subscribe): a bounded queue in the
/// library; when it is full, later events are dropped and counted. Move-only; thread-safe;
/// frees its handle on destruction.
class Subscription {
 public:
  /// The next event, waiting up to `timeout`; empty when none came in time. Throws an
  /// Error with SHARDLIMIT_ERR_CLOSED once the subscription is closed or its limiter is
  /// gone (after the events still queued).
  std::optional<Event> next(std::chrono::microseconds timeout) const {
    return next_us(timeout.count() < 0 ? 0 : static_cast<uint64_t>(timeout.count()));
  }
  /// The next event, waiting as long as it takes (until close()). Inside a completion
  /// callback, where the library never waits, it throws INVALID_ARGUMENT instead.
  Event next() const {
    auto e = next_us(UINT64_MAX);
    if (!e) throw Error(SHARDLIMIT_ERR_INVALID_ARGUMENT, "Subscription::next() cannot wait here");
    return *e;
  }
  /// Events dropped because the queue was full.
  uint64_t dropped() const noexcept { return shardlimit_subscription_dropped(s_.get()); }
  /// Ends the subscription now: a thread waiting in next() wakes with CLOSED. Safe from
  /// any thread while another waits (the object itself must outlive both).
  void close() const noexcept { shardlimit_subscription_free(s_.get()); }
  const shardlimit_subscription* get() const noexcept { return s_.get(); }

 private:
  friend class Limiter;
  explicit Subscription(shardlimit_subscription* s) : s_(s) {}
  std::optional<Event> next_us(uint64_t us) const {
    shardlimit_event e;
    bool got = false;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_subscription_next(s_.get(), us, &got, &e, &err), err);
    if (!got) return std::nullopt;
    return Event(e);
  }
  std::unique_ptr<shardlimit_subscription, detail::Deleter<&shardlimit_subscription_free>> s_;
};

/// Reloads a limiter when its config file changes (Limiter::watch_config), until it is
/// destroyed (the destructor returns once no reload can start). Move-only.
class ConfigWatcher {
 public:
  const shardlimit_watcher* get() const noexcept { return w_.get(); }

 private:
  friend class Limiter;
  explicit ConfigWatcher(shardlimit_watcher* w) : w_(w) {}
  std::unique_ptr<shardlimit_watcher, detail::Deleter<&shardlimit_watcher_free>> w_;
};

/// A rate limiter. Move-only; thread-safe; frees its handle on destruction.
/// One warning line of the core (`Limiter::on_log`): a fallback to on_error, a circuit
/// opened, a failed handoff or refund, a rejected watched config.
struct LogRecord {
  bool error = false;     ///< true for a rejected config, else a warning
  std::string reason;     ///< "fallback", "circuit_opened", "handoff_failed", ...
  std::string subject;    ///< the policy, shard or config file
  shardlimit_result error_code = SHARDLIMIT_OK;
  std::string error_message;
  std::optional<bool> allowed;  ///< a fallback: whether on_error allowed the check
  uint64_t suppressed = 0;      ///< lines of this reason and subject not written since the last
  std::string message;          ///< the whole line
};

namespace detail {
using LogFn = std::function<void(const LogRecord&)>;
inline void log_trampoline(void* user, const shardlimit_log_record* r) {
  try {
    LogRecord rec;
    rec.error = r->level == SHARDLIMIT_LOG_ERROR;
    rec.reason.assign(r->reason.ptr, r->reason.len);
    rec.subject.assign(r->subject.ptr, r->subject.len);
    rec.error_code = static_cast<shardlimit_result>(r->error_code);
    rec.error_message.assign(r->error.ptr, r->error.len);
    if (r->has_allowed) rec.allowed = r->allowed;
    rec.suppressed = r->suppressed;
    rec.message.assign(r->message.ptr, r->message.len);
    (*static_cast<LogFn*>(user))(rec);
  } catch (...) {
    // nothing may unwind into the library
  }
}
/// The std::function of Limiter::on_log, unregistered before it is destroyed.
struct LogHook {
  shardlimit_limiter* h = nullptr;
  std::unique_ptr<LogFn> f;
  LogHook() = default;
  LogHook(LogHook&& o) noexcept : h(o.h), f(std::move(o.f)) {}
  LogHook& operator=(LogHook&& o) noexcept {
    if (this != &o) {
      reset();
      h = o.h;
      f = std::move(o.f);
    }
    return *this;
  }
  ~LogHook() { reset(); }
  void reset() noexcept {
    if (f && h) shardlimit_set_log_callback(h, nullptr, nullptr, nullptr);
    f.reset();
  }
};
}  // namespace detail

class Limiter {
 public:
  /// From a JSON config (the format of shard-config.json); `clock` for tests.
  static Limiter from_json(std::string_view json, const Clock* clock = nullptr) {
    return make([&](shardlimit_limiter** out, shardlimit_error** err) {
      return shardlimit_limiter_new_json(json.data(), json.size(), clock_of(clock), out, err);
    });
  }
  /// From a JSON config file (the name of spec/names.json in every language).
  static Limiter from_config_file(std::string_view path, const Clock* clock = nullptr) {
    return make([&](shardlimit_limiter** out, shardlimit_error** err) {
      return shardlimit_limiter_new_file(path.data(), path.size(), clock_of(clock), out, err);
    });
  }
  /// The same as from_config_file (its earlier name, kept for existing code).
  static Limiter from_file(std::string_view path, const Clock* clock = nullptr) {
    return from_config_file(path, clock);
  }
  /// From $SHARDLIMIT_CONFIG (a path or inline JSON); in memory when it is unset.
  static Limiter from_env(const Clock* clock = nullptr) {
    return make([&](shardlimit_limiter** out, shardlimit_error** err) {
      return shardlimit_limiter_new_env(clock_of(clock), out, err);
    });
  }
  /// The in-memory engine (no Redis), for ad-hoc policies; on `clock` in tests.
  static Limiter memory(const Clock* clock = nullptr) {
    return make([&](shardlimit_limiter** out, shardlimit_error** err) {
      return shardlimit_limiter_new_memory(clock_of(clock), out, err);
    });
  }

  /// Whether decisions run on Redis (else in memory).
  bool is_redis() const noexcept { return shardlimit_is_redis(h_.get()); }
  /// How many keys the in-memory engine holds; empty on Redis.
  std::optional<size_t> memory_keys() const {
    bool has = false;
    size_t n = 0;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_memory_keys(h_.get(), &has, &n, &err), err);
    return has ? std::optional<size_t>(n) : std::nullopt;
  }
  /// The shard `key` routes to: (index, name). Throws on the in-memory engine.
  std::pair<uint32_t, std::string> route(std::string_view key) const {
    uint32_t i = 0;
    shardlimit_string name{nullptr, 0};
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_route(h_.get(), key.data(), key.size(), &i, &name, &err), err);
    std::string n(name.ptr, name.len);
    shardlimit_string_free(&name);
    return {i, n};
  }
  /// Applies a new JSON config; a bad one throws and the old one stays in force.
  void reload(std::string_view json) const {
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_reload(h_.get(), json.data(), json.size(), &err), err);
  }
  void reload_from_file(std::string_view path) const {
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_reload_from_file(h_.get(), path.data(), path.size(), &err), err);
  }
  /// Scales the limits of `policies` (every policy when empty) by `factor` in (0, 1].
  void set_scale(double factor, const std::vector<std::string>& policies = {}) const {
    std::vector<shardlimit_str> names;
    for (const auto& p : policies) names.push_back({p.data(), p.size()});
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_set_scale(h_.get(), factor, names.data(), names.size(), &err), err);
  }
  /// The global scale factor in force.
  double scale() const noexcept { return shardlimit_scale(h_.get()); }
  /// Installs the core's latency hook (full limits up to `target`, then target/signal,
  /// never below `min_factor`) that observe_health feeds.
  void set_latency_scale(std::chrono::microseconds target, double min_factor) const {
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_set_latency_scale(h_.get(), static_cast<uint64_t>(target.count()),
                                               min_factor, &err),
                  err);
  }
  /// Feeds a health signal (seconds) through the scale hook; returns the factor in force.
  double observe_health(double signal) const {
    double f = 0;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_observe_health(h_.get(), signal, &f, &err), err);
    return f;
  }
  /// The counters in the Prometheus text format: metrics() is this text in every language
  /// (spec/names.json).
  std::string metrics() const { return text(&shardlimit_metrics_prometheus); }
  /// The counters as JSON (see shardlimit_metrics).
  std::string metrics_snapshot() const { return text(&shardlimit_metrics); }
  /// The same as metrics() (its earlier name, kept for existing code).
  std::string metrics_prometheus() const { return metrics(); }

  /// Checks `cost` units of the named policy for `key`. Denied is not an exception.
  Decision check(std::string_view key, std::string_view policy, uint64_t cost = 1) const {
    shardlimit_decision d;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_check_named(h_.get(), key.data(), key.size(), policy.data(),
                                         policy.size(), cost, &d, &err),
                  err);
    return Decision(d);
  }
  Decision check(std::string_view key, const Policy& policy, uint64_t cost = 1) const {
    shardlimit_decision d;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_check(h_.get(), key.data(), key.size(), policy.get(), cost, &d, &err),
                  err);
    return Decision(d);
  }
  /// check() without blocking: returns at once; the decision comes through the Pending's
  /// future, which waits without a thread of the caller's and can be cancelled. The key
  /// and policy name are copied.
  Pending<Decision> check_async(std::string_view key, std::string_view policy,
                                uint64_t cost = 1) const {
    return detail::start<Decision>(
        [&](shardlimit_callback cb, void* user, shardlimit_pending** out, shardlimit_error** err) {
          return shardlimit_check_named_start(h_.get(), key.data(), key.size(), policy.data(),
                                              policy.size(), cost, cb, user, out, err);
        },
        &detail::pending_decision);
  }
  Pending<Decision> check_async(std::string_view key, const Policy& policy,
                                uint64_t cost = 1) const {
    return detail::start<Decision>(
        [&](shardlimit_callback cb, void* user, shardlimit_pending** out, shardlimit_error** err) {
          return shardlimit_check_start(h_.get(), key.data(), key.size(), policy.get(), cost, cb,
                                        user, out, err);
        },
        &detail::pending_decision);
  }
  /// check() in shadow mode for this one call: a would-be denial is allowed
  /// (Decision::shadow_denied), consumes nothing and is counted for shadow_report().
  Decision check_shadow(std::string_view key, const Policy& policy, uint64_t cost = 1) const {
    shardlimit_decision d;
    shardlimit_error* err = nullptr;
    detail::check(
        shardlimit_check_shadow(h_.get(), key.data(), key.size(), policy.get(), cost, &d, &err),
        err);
    return Decision(d);
  }
  /// The shadow-mode denials of the named policy by key, summed over every shard, as JSON
  /// (see shardlimit_shadow_report); `top` > 0 keeps that many keys.
  std::string shadow_report(std::string_view policy, size_t top = 0) const {
    shardlimit_string s{nullptr, 0};
    shardlimit_error* err = nullptr;
    detail::check(
        shardlimit_shadow_report(h_.get(), policy.data(), policy.size(), top, &s, &err), err);
    std::string out(s.ptr, s.len);
    shardlimit_string_free(&s);
    return out;
  }
  /// The named policy of the config.
  Policy policy(std::string_view name) const {
    shardlimit_policy* p = nullptr;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_limiter_policy(h_.get(), name.data(), name.size(), &p, &err), err);
    return Policy(p);
  }
  /// The named policy as plan `plan` of the config has it (the plan's limits under the
  /// policy's name, or the policy itself); check under a plan with check(key, policy).
  Policy plan_policy(std::string_view plan, std::string_view name) const {
    shardlimit_policy* p = nullptr;
    shardlimit_error* err = nullptr;
    detail::check(
        shardlimit_plan_policy(h_.get(), plan.data(), plan.size(), name.data(), name.size(), &p, &err),
        err);
    return Policy(p);
  }
  /// The state of `key` without consuming.
  Decision peek(std::string_view key, const Policy& policy) const {
    shardlimit_decision d;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_peek(h_.get(), key.data(), key.size(), policy.get(), &d, &err), err);
    return Decision(d);
  }
  /// Forgets `key`'s state: its full budget is back.
  /// Connects to every shard and loads the scripts within `timeout` (its own budget, not a
  /// call's deadline), so that the first calls after start-up do not spend their deadline
  /// connecting; throws the shard's error when one does not answer in time.
  void connect(std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) const {
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_connect(h_.get(), static_cast<uint64_t>(timeout.count()), &err), err);
  }
  void reset(std::string_view key, const Policy& policy) const {
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_reset(h_.get(), key.data(), key.size(), policy.get(), &err), err);
  }
  /// Acquires `units` of a concurrency policy. The lease is set when Redis granted the
  /// units; it is empty when denied and also when a fallback allowed the call
  /// (`decision.allowed()` with source FALLBACK: nothing is held). Branch on the decision.
  std::pair<Decision, std::optional<Lease>> acquire(std::string_view key, const Policy& policy,
                                                    uint64_t units = 1) const {
    shardlimit_decision d;
    shardlimit_lease* lease = nullptr;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_acquire(h_.get(), key.data(), key.size(), policy.get(), units, &d,
                                     &lease, &err),
                  err);
    std::optional<Lease> l;
    if (lease) l.emplace(Lease(lease));
    return {Decision(d), std::move(l)};
  }
  /// A layered check: allowed only if every layer allows; a denial consumes nothing.
  Decision check_all(const std::vector<Layer>& layers) const {
    std::vector<shardlimit_layer> c;
    c.reserve(layers.size());
    for (const auto& l : layers)
      c.push_back({l.key.data(), l.key.size(), nullptr, l.policy.data(), l.policy.size(), l.cost});
    shardlimit_decision d;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_check_all(h_.get(), c.data(), c.size(), &d, &err), err);
    return Decision(d);
  }
  /// Blocks `key` for `ttl` (zero: until unblocked).
  void block(std::string_view key, std::chrono::milliseconds ttl, std::string_view reason) const {
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_block(h_.get(), key.data(), key.size(),
                                   static_cast<uint64_t>(ttl.count()), reason.data(), reason.size(),
                                   &err),
                  err);
  }
  /// Unblocks `key`; true when it was blocked.
  bool unblock(std::string_view key) const {
    bool was = false;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_unblock(h_.get(), key.data(), key.size(), &was, &err), err);
    return was;
  }
  /// `key`'s block-list entry, if it is blocked.
  std::optional<BlockInfo> blocked(std::string_view key) const {
    shardlimit_block_info info;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_blocked(h_.get(), key.data(), key.size(), &info, &err), err);
    std::optional<BlockInfo> out;
    if (info.blocked) {
      out = BlockInfo{std::string(info.reason.ptr, info.reason.len),
                      info.permanent ? std::nullopt
                                     : std::optional(std::chrono::microseconds(info.remaining_us))};
    }
    shardlimit_string_free(&info.reason);
    return out;
  }
  /// Consumes `cost` units without ever denying: the key may go into debt (capped at one
  /// limit) and later checks are denied until it is repaid. Always allowed; remaining() is
  /// 0 in debt.
  Decision charge(std::string_view key, const Policy& policy, uint64_t cost = 1) const {
    shardlimit_decision d;
    shardlimit_error* err = nullptr;
    detail::check(
        shardlimit_charge(h_.get(), key.data(), key.size(), policy.get(), cost, &d, &err), err);
    return Decision(d);
  }
  /// Gives `cost` units back, never above the limit.
  Decision refund(std::string_view key, const Policy& policy, uint64_t cost = 1) const {
    shardlimit_decision d;
    shardlimit_error* err = nullptr;
    detail::check(
        shardlimit_refund(h_.get(), key.data(), key.size(), policy.get(), cost, &d, &err), err);
    return Decision(d);
  }
  /// A check of an estimated cost; the reservation is set when allowed.
  std::pair<Decision, std::optional<Reservation>> reserve(std::string_view key,
                                                          const Policy& policy,
                                                          uint64_t estimate = 1) const {
    shardlimit_decision d;
    shardlimit_reservation r;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_reserve(h_.get(), key.data(), key.size(), policy.get(), estimate, &d,
                                     &r, &err),
                  err);
    std::optional<Reservation> out;
    if (r.reserved) out = Reservation{std::string(key), r.units, r.at_us};
    return {Decision(d), std::move(out)};
  }
  /// Settles a reservation at its `actual` cost (0 gives it all back): the unused part goes
  /// back to the window that admitted it, the excess is charged. Once per reservation.
  Decision settle(const Policy& policy, const Reservation& reservation, uint64_t actual) const {
    shardlimit_reservation r{true, reservation.units, reservation.at_us};
    shardlimit_decision d;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_settle(h_.get(), reservation.key.data(), reservation.key.size(),
                                    policy.get(), &r, actual, &d, &err),
                  err);
    return Decision(d);
  }
  /// Sets `key`'s live override of `policy` (a config policy with `"overrides": true`) to
  /// `limit`: a rate string ("100/minute") or a limit object in JSON as in a config
  /// policy; for `ttl` (zero: until deleted). Every process's next check of the key is
  /// decided by it. Returns the override as JSON:
  /// `{"key", "policy", "limit": {...}, "remaining_ms": n | null}`.
  std::string set_override(std::string_view key, std::string_view policy, std::string_view limit,
                           std::chrono::milliseconds ttl = std::chrono::milliseconds(0)) const {
    shardlimit_string out{nullptr, 0};
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_set_override(h_.get(), key.data(), key.size(), policy.data(),
                                          policy.size(), limit.data(), limit.size(),
                                          static_cast<uint64_t>(ttl.count()), &out, &err),
                  err);
    return detail::take(out);
  }
  /// `key`'s override of `policy` as JSON (the shape `set_override` returns), if any.
  std::optional<std::string> get_override(std::string_view key, std::string_view policy) const {
    bool found = false;
    shardlimit_string out{nullptr, 0};
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_get_override(h_.get(), key.data(), key.size(), policy.data(),
                                          policy.size(), &found, &out, &err),
                  err);
    std::string json = detail::take(out);
    if (!found) return std::nullopt;
    return json;
  }
  /// One page of `policy`'s overrides as JSON, `{"overrides": [...], "cursor": "..." |
  /// null}`: pass the cursor back (empty for the first page) for the next.
  std::string list_overrides(std::string_view policy, std::string_view cursor = {},
                             size_t limit = 1000) const {
    shardlimit_string out{nullptr, 0};
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_list_overrides(h_.get(), policy.data(), policy.size(),
                                            cursor.data(), cursor.size(), limit, &out, &err),
                  err);
    return detail::take(out);
  }
  /// Deletes `key`'s override of `policy`; true when it had one.
  bool delete_override(std::string_view key, std::string_view policy) const {
    bool deleted = false;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_delete_override(h_.get(), key.data(), key.size(), policy.data(),
                                             policy.size(), &deleted, &err),
                  err);
    return deleted;
  }
  /// set_override() without blocking (like check_async): the override's JSON comes
  /// through the Pending's future; the arguments are copied.
  Pending<std::string> set_override_async(
      std::string_view key, std::string_view policy, std::string_view limit,
      std::chrono::milliseconds ttl = std::chrono::milliseconds(0)) const {
    return detail::start<std::string>(
        [&](shardlimit_callback cb, void* user, shardlimit_pending** out, shardlimit_error** err) {
          return shardlimit_set_override_start(h_.get(), key.data(), key.size(), policy.data(),
                                               policy.size(), limit.data(), limit.size(),
                                               static_cast<uint64_t>(ttl.count()), cb, user, out,
                                               err);
        },
        &detail::pending_text);
  }
  /// get_override() without blocking (like check_async).
  Pending<std::optional<std::string>> get_override_async(std::string_view key,
                                                         std::string_view policy) const {
    return detail::start<std::optional<std::string>>(
        [&](shardlimit_callback cb, void* user, shardlimit_pending** out, shardlimit_error** err) {
          return shardlimit_get_override_start(h_.get(), key.data(), key.size(), policy.data(),
                                               policy.size(), cb, user, out, err);
        },
        &detail::pending_optional_text);
  }
  /// list_overrides() without blocking (like check_async).
  Pending<std::string> list_overrides_async(std::string_view policy, std::string_view cursor = {},
                                            size_t limit = 1000) const {
    return detail::start<std::string>(
        [&](shardlimit_callback cb, void* user, shardlimit_pending** out, shardlimit_error** err) {
          return shardlimit_list_overrides_start(h_.get(), policy.data(), policy.size(),
                                                 cursor.data(), cursor.size(), limit, cb, user,
                                                 out, err);
        },
        &detail::pending_text);
  }
  /// delete_override() without blocking (like check_async).
  Pending<bool> delete_override_async(std::string_view key, std::string_view policy) const {
    return detail::start<bool>(
        [&](shardlimit_callback cb, void* user, shardlimit_pending** out, shardlimit_error** err) {
          return shardlimit_delete_override_start(h_.get(), key.data(), key.size(), policy.data(),
                                                  policy.size(), cb, user, out, err);
        },
        &detail::pending_bool);
  }
  /// shadow_report() without blocking (like check_async).
  Pending<std::string> shadow_report_async(std::string_view policy, size_t top = 0) const {
    return detail::start<std::string>(
        [&](shardlimit_callback cb, void* user, shardlimit_pending** out, shardlimit_error** err) {
          return shardlimit_shadow_report_start(h_.get(), policy.data(), policy.size(), top, cb,
                                                user, out, err);
        },
        &detail::pending_text);
  }
  /// Gives a lease back; false when it was no longer held.
  /// How many reloads the limiter has applied (0 when it was made): read it per request
  /// and re-derive what you derived from config() when it changed.
  uint64_t config_generation() const {
    uint64_t g = 0;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_config_generation(h_.get(), &g, &err), err);
    return g;
  }
  /// The configuration in force (after the last reload) as JSON: engine, shard names
  /// (never URLs), key_prefix, timeout_ms, on_error, instances and the policies (see
  /// shardlimit_config_json).
  std::string config() const {
    return text([&](const shardlimit_limiter* h, shardlimit_string* s, shardlimit_error** err) {
      return shardlimit_config_json(h, s, err);
    });
  }
  /// Calls `f` for each of the core's warning lines (every fallback to on_error, a circuit
  /// opened, a rejected config; at most one per reason and policy or shard per the
  /// config's log_interval, with the count suppressed since the last), on the thread that
  /// logged (a caller's or the I/O thread): keep it short and thread-safe, and do not call
  /// the limiter from it. Until it is called, the lines go to stderr (the C library's
  /// default, as the CLI writes them; SHARDLIMIT_LOG=off in the environment when the
  /// limiter is made turns that off); `f` replaces that, and an empty `f` silences both.
  /// Exceptions from `f` are swallowed. Not to be called from two threads at once.
  void on_log(detail::LogFn f) const {
    auto next = f ? std::make_unique<detail::LogFn>(std::move(f)) : nullptr;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_set_log_callback(h_.get(), next ? &detail::log_trampoline : nullptr,
                                              next.get(), &err),
                  err);
    // the one replaced is not running any more (shardlimit_set_log_callback)
    log_.f = std::move(next);
    log_.h = h_.get();
  }
  /// Subscribes to the limiter's events (denials, blocks, fallbacks, circuit changes,
  /// shadow denials, near-limit crossings, reloads) from now on; `capacity` events wait
  /// in the library (0: 1024) before later ones are dropped.
  Subscription subscribe(size_t capacity = 0) const {
    shardlimit_subscription* s = nullptr;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_subscribe(h_.get(), capacity, &s, &err), err);
    return Subscription(s);
  }
  /// Reloads whenever the config file at `path` changes (checked every `every`); each
  /// reload is a SHARDLIMIT_EVENT_RELOADED event (wait for it on a subscription), a bad
  /// file a SHARDLIMIT_EVENT_RELOAD_REJECTED one. Watches until the watcher is destroyed.
  ConfigWatcher watch_config(std::string_view path,
                             std::chrono::milliseconds every = std::chrono::milliseconds(1000)) const {
    shardlimit_watcher* w = nullptr;
    shardlimit_error* err = nullptr;
    uint64_t ms = every.count() < 0 ? 0 : static_cast<uint64_t>(every.count());
    detail::check(shardlimit_watch_config(h_.get(), path.data(), path.size(), ms, &w, &err), err);
    return ConfigWatcher(w);
  }
  bool release(const Lease& lease) const {
    bool released = false;
    shardlimit_error* err = nullptr;
    detail::check(shardlimit_release(h_.get(), lease.get(), &released, &err), err);
    return released;
  }

 private:
  template <class F>
  static Limiter make(F f) {
    shardlimit_limiter* h = nullptr;
    shardlimit_error* err = nullptr;
    detail::check(f(&h, &err), err);
    return Limiter(h);
  }
  static const shardlimit_clock* clock_of(const Clock* c) noexcept {
    return c ? c->get() : nullptr;
  }
  template <class F>
  std::string text(F f) const {
    shardlimit_string s{nullptr, 0};
    shardlimit_error* err = nullptr;
    detail::check(f(h_.get(), &s, &err), err);
    std::string out(s.ptr, s.len);
    shardlimit_string_free(&s);
    return out;
  }
  explicit Limiter(shardlimit_limiter* h) : h_(h) {}
  detail::LimiterPtr h_;
  // after h_: destroyed first, while the handle is still live
  mutable detail::LogHook log_;
};

inline Decision detail::pending_decision(shardlimit_pending* p) {
  shardlimit_decision d;
  shardlimit_error* err = nullptr;
  detail::check(shardlimit_pending_decision(p, &d, &err), err);
  return Decision(d);
}

/// The client's IP for rate limiting (see shardlimit_client_ip): `xff` is the raw
/// X-Forwarded-For header, empty when absent; `trusted` the proxies' CIDRs.
inline std::string client_ip(std::string_view peer, std::string_view xff,
                             const std::vector<std::string>& trusted = {}) {
  std::vector<shardlimit_str> t;
  for (const auto& c : trusted) t.push_back({c.data(), c.size()});
  shardlimit_string out{nullptr, 0};
  shardlimit_error* err = nullptr;
  detail::check(shardlimit_client_ip(peer.data(), peer.size(), xff.empty() ? nullptr : xff.data(),
                                     xff.size(), t.data(), t.size(), &out, &err),
                err);
  std::string ip(out.ptr, out.len);
  shardlimit_string_free(&out);
  return ip;
}

/// The client's rate-limit key (see shardlimit_client_ip_key): IPv4 as the address, IPv6 as
/// its network of `ipv6_prefix` bits (64 by default, as in every binding).
inline std::string client_ip_key(std::string_view peer, std::string_view xff,
                                 const std::vector<std::string>& trusted = {},
                                 uint8_t ipv6_prefix = 64) {
  std::vector<shardlimit_str> t;
  for (const auto& c : trusted) t.push_back({c.data(), c.size()});
  shardlimit_string out{nullptr, 0};
  shardlimit_error* err = nullptr;
  detail::check(shardlimit_client_ip_key(peer.data(), peer.size(),
                                         xff.empty() ? nullptr : xff.data(), xff.size(),
                                         t.data(), t.size(), ipv6_prefix, &out, &err),
                err);
  std::string key(out.ptr, out.len);
  shardlimit_string_free(&out);
  return key;
}

/// The version of the linked library.
inline std::string_view version() noexcept {
  shardlimit_str s = shardlimit_version();
  return {s.ptr, s.len};
}

}  // namespace shardlimit
