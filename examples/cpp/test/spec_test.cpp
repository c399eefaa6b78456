// The C++ wrapper against the shared contracts: spec/operations.json (every operation of
// the core not marked not_in for cpp is a Limiter member under its snake_case name),
// spec/errors.json (codes, names, backend flags, hierarchy), tests/vectors/keys.json and
// the decision vectors of tests/vectors/algorithms.json (every case and op, in memory and
// on a real Redis).
#include <shardlimit.hpp>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#ifndef SHARDLIMIT_ROOT
#error "SHARDLIMIT_ROOT (the repository root) must be defined"
#endif

namespace {

std::string read(const std::string& rel) {
  std::ifstream f(std::string(SHARDLIMIT_ROOT) + "/" + rel);
  if (!f) throw std::runtime_error("cannot read " + rel);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// The objects of the array `key` in a generated spec file: each {...} at the array's
/// top level, as text (the spec files hold no braces inside strings).
std::vector<std::string> objects(const std::string& text, const std::string& key) {
  std::vector<std::string> out;
  size_t at = text.find("\"" + key + "\"");
  if (at == std::string::npos) return out;
  at = text.find('[', at);
  int depth = 0;
  size_t start = 0;
  for (size_t i = at + 1; i < text.size(); i++) {
    char c = text[i];
    if (c == '{' && depth++ == 0) start = i;
    if (c == '}' && --depth == 0) out.push_back(text.substr(start, i - start + 1));
    if (c == ']' && depth == 0) break;
  }
  return out;
}

std::string field(const std::string& obj, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\": (\"([^\"]*)\"|[^,\\n}]+)");
  if (!std::regex_search(obj, m, re)) return "";
  return m[2].matched ? m[2].str() : m[1].str();
}

using L = shardlimit::Limiter;
// Each entry compiles only if the Limiter has the operation (the lambda is never called).
#define OP(name, body) \
  { name, [](const L* l) { (void)l; (void)(body); } }
const std::map<std::string, void (*)(const L*)> kOps = {
    OP("memory", L::memory()),
    OP("new", L::from_json("{}")),
    OP("from_config_file", L::from_file("x")),
    OP("from_env", L::from_env()),
    OP("with_clock", L::memory(static_cast<const shardlimit::Clock*>(nullptr))),
    OP("is_redis", l->is_redis()),
    OP("memory_keys", l->memory_keys()),
    OP("policy", l->policy("p")),
    OP("plan_policy", l->plan_policy("free", "p")),
    OP("route", l->route("k")),
    OP("reload", (l->reload("{}"), 0)),
    OP("reload_from_file", (l->reload_from_file("x"), 0)),
    OP("set_scale", (l->set_scale(1.0), 0)),
    OP("scale", l->scale()),
    OP("observe_health", l->observe_health(0.1)),
    OP("metrics", l->metrics_prometheus()),
    OP("connect", (l->connect(), 0)),
    OP("check", l->check("k", "p")),
    OP("peek", l->peek("k", l->policy("p"))),
    OP("acquire", l->acquire("k", l->policy("p"))),
    OP("release", l->release(*l->acquire("k", l->policy("p")).second)),
    OP("reset", (l->reset("k", l->policy("p")), 0)),
    OP("check_all", l->check_all({})),
    OP("check_shadow", l->check_shadow("k", l->policy("p"))),
    OP("shadow_report", l->shadow_report("p")),
    OP("set_override", l->set_override("k", "p", "5/minute")),
    OP("get_override", l->get_override("k", "p")),
    OP("list_overrides", l->list_overrides("p")),
    OP("delete_override", l->delete_override("k", "p")),
    OP("block", (l->block("k", std::chrono::milliseconds(0), ""), 0)),
    OP("unblock", l->unblock("k")),
    OP("blocked", l->blocked("k")),
    OP("charge", l->charge("k", l->policy("p"))),
    OP("refund", l->refund("k", l->policy("p"))),
    OP("reserve", l->reserve("k", l->policy("p"))),
    OP("settle", l->settle(l->policy("p"), *l->reserve("k", l->policy("p")).second, 1)),
    OP("config", l->config()),
    OP("subscribe", l->subscribe()),
    OP("watch_config", l->watch_config("x")),
};
#undef OP
// Operations of the core the C++ wrapper does not offer yet (the C ABI lacks them).
const std::set<std::string> kMissing = {};

TEST(Spec, EveryOperationOfTheCore) {
  auto ops = objects(read("spec/operations.json"), "operations");
  ASSERT_GT(ops.size(), 10u);
  std::set<std::string> spec;
  for (const auto& o : ops) {
    std::string name = field(o, "name");
    bool excluded = o.find("\"cpp\":") != std::string::npos;
    if (excluded) {
      EXPECT_EQ(kOps.count(name), 0u) << name << " is marked not_in cpp but the wrapper has it";
      continue;
    }
    spec.insert(name);
    EXPECT_TRUE(kOps.count(name) || kMissing.count(name))
        << "the C++ wrapper lacks the operation " << name;
  }
  for (const auto& [name, _] : kOps) EXPECT_TRUE(spec.count(name)) << name << " is not in the spec";
  for (const auto& name : kMissing) {
    EXPECT_TRUE(spec.count(name)) << name << " is listed missing but not in the spec";
    EXPECT_EQ(kOps.count(name), 0u) << name << " is listed missing but present";
  }
}

TEST(Spec, ErrorKindsAndHierarchy) {
  std::string text = read("spec/errors.json");
  auto kinds = objects(text, "kinds");
  ASSERT_GT(kinds.size(), 5u);
  std::map<std::string, uint32_t> code_of;
  for (const auto& k : kinds) code_of[field(k, "name")] = std::stoul(field(k, "code"));
  for (const auto& k : kinds) {
    std::string name = field(k, "name");
    uint32_t code = code_of[name];
    shardlimit_str n = shardlimit_result_name(code);
    EXPECT_EQ(std::string(n.ptr, n.len), name);
    EXPECT_EQ(shardlimit_result_is_backend(code), field(k, "backend") == "true") << name;
    shardlimit::Error e(static_cast<shardlimit_result>(code), "m");
    EXPECT_TRUE(e.is(static_cast<shardlimit_result>(code))) << name;
    std::string parent = field(k, "parent");
    if (parent == "null") {
      EXPECT_EQ(shardlimit_result_parent(code), 0u) << name;
    } else {
      ASSERT_TRUE(code_of.count(parent)) << parent;
      EXPECT_EQ(shardlimit_result_parent(code), code_of[parent]) << name;
      EXPECT_TRUE(e.is(static_cast<shardlimit_result>(code_of[parent]))) << name;
      shardlimit::Error p(static_cast<shardlimit_result>(code_of[parent]), "m");
      EXPECT_FALSE(p.is(static_cast<shardlimit_result>(code))) << parent << " is a " << name;
    }
  }
  for (const auto& r : objects(text, "retired")) {
    shardlimit_str n = shardlimit_result_name(std::stoul(field(r, "code")));
    EXPECT_EQ(std::string(n.ptr, n.len), "unknown") << field(r, "name");
  }
  // a real unknown policy is an invalid argument
  auto limiter = L::memory();
  try {
    limiter.check("k", "nope");
    FAIL();
  } catch (const shardlimit::Error& e) {
    EXPECT_TRUE(e.is(SHARDLIMIT_ERR_UNKNOWN_POLICY));
    EXPECT_TRUE(e.is(SHARDLIMIT_ERR_INVALID_ARGUMENT));
  }
}

TEST(Spec, KeyVectors) {
  auto cases = objects(read("tests/vectors/keys.json"), "cases");
  ASSERT_GT(cases.size(), 5u);
  shardlimit::Clock clock(1700000000000000ull);
  auto limiter = L::memory(&clock);
  shardlimit_limit l{};
  l.algorithm = SHARDLIMIT_ALGORITHM_FIXED_WINDOW;
  l.limit = 1000;
  l.period_ms = 3600000;
  auto policy = shardlimit::Policy::make("keys", l);
  for (const auto& c : cases) {
    std::string hex = field(c, "hex"), key;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
      key.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    bool accepted = field(c, "accepted") == "true";
    try {
      auto d = limiter.check(key, policy);
      EXPECT_TRUE(accepted && d.allowed()) << field(c, "name") << " was accepted";
    } catch (const shardlimit::Error& e) {
      EXPECT_FALSE(accepted) << field(c, "name") << ": " << e.what();
      EXPECT_TRUE(e.is(SHARDLIMIT_ERR_INVALID_ARGUMENT)) << field(c, "name");
      EXPECT_NE(std::string(e.what()).find("key"), std::string::npos) << e.what();
    }
  }
}

TEST(Spec, MemoryLimiterOnAManualClockScaleAndMetrics) {
  shardlimit::Clock clock(1700000000000000ull);
  auto limiter = L::from_json(
      R"({"policies":{"api":{"algorithm":"fixed_window","limit":4,"window":"1s"}}})", &clock);
  EXPECT_FALSE(limiter.is_redis());
  for (int i = 0; i < 5; i++) EXPECT_EQ(limiter.check("k", "api").allowed(), i < 4) << i;
  clock.advance(std::chrono::seconds(1));
  EXPECT_TRUE(limiter.check("k", "api").allowed());
  limiter.set_scale(0.5);
  EXPECT_EQ(limiter.scale(), 0.5);
  EXPECT_EQ(limiter.check("k2", "api").limit(), 2u);
  limiter.set_latency_scale(std::chrono::milliseconds(100), 0.1);
  EXPECT_DOUBLE_EQ(limiter.observe_health(0.4), 0.25);
  EXPECT_NE(limiter.metrics_prometheus().find("policy=\"api\""), std::string::npos);
  EXPECT_NE(limiter.metrics().find("\"policy\":\"api\""), std::string::npos);
  EXPECT_TRUE(limiter.memory_keys().has_value());
  EXPECT_THROW(limiter.route("k"), shardlimit::Error);
  limiter.reload(R"({"policies":{"api":{"algorithm":"fixed_window","limit":9,"window":"1s"}}})");
  limiter.set_scale(1.0);
  EXPECT_EQ(limiter.check("k3", "api").limit(), 9u);
}

/// A parsed JSON value of the vectors (a small reader: the vectors need more than the flat
/// spec files). Each value keeps its source text, so a case's policies go into a config
/// as written.
struct Json {
  enum Type { Null, Bool, Num, Str, Arr, Obj } type = Null;
  std::string text;  // the source text of the value
  bool b = false;
  std::string str;  // Str: decoded
  std::vector<Json> items;
  std::vector<std::string> keys;  // Obj: the keys of items, in order

  const Json* get(const std::string& key) const {
    for (size_t i = 0; type == Obj && i < keys.size(); i++)
      if (keys[i] == key) return &items[i];
    return nullptr;
  }
  /// The member `key`, which must be there.
  const Json& at(const std::string& key) const {
    const Json* v = get(key);
    if (!v) throw std::runtime_error("no \"" + key + "\" in " + text);
    return *v;
  }
  const std::string& s(const std::string& key) const {
    const Json& v = at(key);
    if (v.type != Str) throw std::runtime_error("\"" + key + "\" is not a string in " + text);
    return v.str;
  }
  /// A whole number >= 0.
  uint64_t u64() const {
    if (type != Num || text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
      throw std::runtime_error(text + " is not a whole number");
    return std::stoull(text);
  }
  uint64_t u64(const std::string& key) const { return at(key).u64(); }

  static Json parse(const std::string& src) {
    size_t at = 0;
    Json v = value(src, at, 0);
    ws(src, at);
    if (at != src.size()) fail(src, at);
    return v;
  }

 private:
  [[noreturn]] static void fail(const std::string& src, size_t at) {
    throw std::runtime_error("bad JSON at byte " + std::to_string(at) + ": " +
                             src.substr(at, 40));
  }
  static void ws(const std::string& src, size_t& at) {
    while (at < src.size() && std::strchr(" \t\r\n", src[at]) && src[at]) at++;
  }
  static std::string string(const std::string& src, size_t& at) {
    if (at >= src.size() || src[at] != '"') fail(src, at);
    std::string out;
    for (at++; at < src.size() && src[at] != '"'; at++) {
      char c = src[at];
      if (static_cast<unsigned char>(c) < 0x20) fail(src, at);
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (++at >= src.size()) fail(src, at);
      switch (src[at]) {
        case '"': case '\\': case '/': out.push_back(src[at]); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          if (at + 4 >= src.size()) fail(src, at);
          size_t used = 0;
          unsigned long u = std::stoul(src.substr(at + 1, 4), &used, 16);
          if (used != 4 || u == 0 || (u >= 0xd800 && u < 0xe000)) fail(src, at);
          at += 4;
          if (u < 0x80) {
            out.push_back(static_cast<char>(u));
          } else if (u < 0x800) {
            out.push_back(static_cast<char>(0xc0 | (u >> 6)));
            out.push_back(static_cast<char>(0x80 | (u & 0x3f)));
          } else {
            out.push_back(static_cast<char>(0xe0 | (u >> 12)));
            out.push_back(static_cast<char>(0x80 | ((u >> 6) & 0x3f)));
            out.push_back(static_cast<char>(0x80 | (u & 0x3f)));
          }
          break;
        }
        default: fail(src, at);
      }
    }
    if (at >= src.size()) fail(src, at);
    at++;
    return out;
  }
  static Json value(const std::string& src, size_t& at, int depth) {
    ws(src, at);
    if (at >= src.size() || depth > 32) fail(src, at);
    Json v;
    size_t start = at;
    char c = src[at];
    if (c == '{' || c == '[') {
      bool obj = c == '{';
      v.type = obj ? Obj : Arr;
      at++;
      ws(src, at);
      if (at < src.size() && src[at] == (obj ? '}' : ']')) {
        at++;
      } else {
        for (;;) {
          if (obj) {
            ws(src, at);
            v.keys.push_back(string(src, at));
            ws(src, at);
            if (at >= src.size() || src[at] != ':') fail(src, at);
            at++;
          }
          v.items.push_back(value(src, at, depth + 1));
          ws(src, at);
          if (at < src.size() && src[at] == ',') {
            at++;
            continue;
          }
          if (at < src.size() && src[at] == (obj ? '}' : ']')) {
            at++;
            break;
          }
          fail(src, at);
        }
      }
    } else if (c == '"') {
      v.type = Str;
      v.str = string(src, at);
    } else if (src.compare(at, 4, "null") == 0) {
      at += 4;
    } else if (src.compare(at, 4, "true") == 0) {
      v.type = Bool, v.b = true, at += 4;
    } else if (src.compare(at, 5, "false") == 0) {
      v.type = Bool, at += 5;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.type = Num;
      while (at < src.size() && std::strchr("-+.eE0123456789", src[at]) && src[at]) at++;
    } else {
      fail(src, at);
    }
    v.text = src.substr(start, at - start);
    return v;
  }
};

/// A decision as the vectors write it: durations in whole µs, retry_after_us null
/// ("null") when absent, layer null but for check_all; and who decided.
std::string observed(const shardlimit::Decision& d) {
  auto opt = [](auto o) { return o ? std::to_string(static_cast<uint64_t>(*o)) : "null"; };
  auto retry = d.retry_after();
  return std::string("{\"allowed\": ") + (d.allowed() ? "true" : "false") +
         ", \"limit\": " + std::to_string(d.limit()) +
         ", \"remaining\": " + std::to_string(d.remaining()) +
         ", \"reset_after_us\": " + std::to_string(d.reset_after().count()) +
         ", \"retry_after_us\": " +
         (retry ? std::to_string(retry->count()) : std::string("null")) +
         ", \"delay_us\": " + std::to_string(d.delay().count()) + ", \"policy\": \"" +
         std::string(d.policy()) + "\", \"layer\": " + opt(d.layer()) + "}";
}

/// The expectation in the same form, from every one of its fields (no more, no fewer).
std::string expected(const Json& e) {
  static const std::vector<std::string> fields = {"allowed",        "limit",    "remaining",
                                                  "reset_after_us", "retry_after_us",
                                                  "delay_us",       "policy",   "layer"};
  if (e.type != Json::Obj || e.keys.size() != fields.size())
    throw std::runtime_error("expect is not the 8 fields of a decision: " + e.text);
  const Json& allowed = e.at("allowed");
  if (allowed.type != Json::Bool) throw std::runtime_error("allowed is not a bool: " + e.text);
  auto opt = [](const Json& v) { return v.type == Json::Null ? "null" : std::to_string(v.u64()); };
  return std::string("{\"allowed\": ") + (allowed.b ? "true" : "false") +
         ", \"limit\": " + std::to_string(e.u64("limit")) +
         ", \"remaining\": " + std::to_string(e.u64("remaining")) +
         ", \"reset_after_us\": " + std::to_string(e.u64("reset_after_us")) +
         ", \"retry_after_us\": " + opt(e.at("retry_after_us")) +
         ", \"delay_us\": " + std::to_string(e.u64("delay_us")) + ", \"policy\": \"" +
         e.s("policy") + "\", \"layer\": " + opt(e.at("layer")) + "}";
}

/// One case being replayed: its limiter and the leases kept by name (lease_as).
struct Replay {
  L limiter;
  shardlimit_source source;
  std::map<std::string, shardlimit::Lease> leases;

  void decided(const Json& it, const shardlimit::Decision& d,
               std::optional<shardlimit::Lease> lease, const std::string& where) {
    EXPECT_EQ(d.source(), source) << where << ": decided by " << d.source_name();
    EXPECT_EQ(observed(d), expected(it.at("expect"))) << where;
    if (const Json* as = it.get("lease_as")) {
      ASSERT_TRUE(as->type == Json::Str && lease.has_value()) << where << ": no lease to keep";
      leases.insert_or_assign(as->str, std::move(*lease));
    }  // else a lease is never released: it expires after lease_ttl
  }

  /// A check, peek or acquire: a step or an item of a batch.
  void call(const Json& it, const std::string& where) {
    const std::string& op = it.s("op");
    const std::string& key = it.s("key");
    auto policy = limiter.policy(it.s("policy"));
    if (op == "check") {
      decided(it, limiter.check(key, policy, it.u64("cost")), std::nullopt, where);
    } else if (op == "peek") {
      decided(it, limiter.peek(key, policy), std::nullopt, where);
    } else if (op == "acquire") {
      auto [d, lease] = limiter.acquire(key, policy, it.u64("units"));
      decided(it, d, std::move(lease), where);
    } else {
      FAIL() << where << ": op \"" << op << "\" cannot be a batch item";
    }
  }

  void step(const Json& s, const std::string& where) {
    const std::string& op = s.s("op");
    if (op == "check" || op == "peek" || op == "acquire") {
      call(s, where);
    } else if (op == "batch") {
      // one after another, in order, at the step's t_us: calls made concurrently would
      // have no order, and the items' decisions depend on it
      const Json& items = s.at("items");
      ASSERT_TRUE(items.type == Json::Arr && !items.items.empty()) << where << ": no items";
      for (size_t j = 0; j < items.items.size(); j++) {
        std::string at = where + ", item " + std::to_string(j);
        EXPECT_EQ(items.items[j].get("t_us"), nullptr) << at << ": an item has no t_us of its own";
        call(items.items[j], at);
      }
    } else if (op == "release") {
      auto held = leases.find(s.s("lease"));
      ASSERT_NE(held, leases.end()) << where << ": no lease " << s.s("lease");
      const Json& want = s.at("expect_released");
      ASSERT_EQ(want.type, Json::Bool) << where;
      EXPECT_EQ(limiter.release(held->second), want.b) << where;
    } else if (op == "reset") {
      limiter.reset(s.s("key"), limiter.policy(s.s("policy")));
    } else if (op == "check_all") {
      std::vector<shardlimit::Layer> layers;
      for (const auto& la : s.at("layers").items)
        layers.push_back({la.s("key"), la.s("policy"), la.u64("cost")});
      ASSERT_FALSE(layers.empty()) << where << ": no layers";
      decided(s, limiter.check_all(layers), std::nullopt, where);
    } else {
      FAIL() << where << ": unknown op \"" << op << "\": teach this replay the op";
    }
  }
};

/// Replays every case and every step of tests/vectors/algorithms.json (format: the list
/// at its top) on a fresh limiter from `config(policies, case index)` on a manual clock
/// set to each step's t_us; every decision must come from `source`. An unknown op fails.
template <class Config>
void replay_vectors(Config config, shardlimit_source source) {
  Json doc = Json::parse(read("tests/vectors/algorithms.json"));
  const Json& cases = doc.at("cases");
  ASSERT_GT(cases.items.size(), 5u);
  size_t steps = 0, total = 0;
  std::set<std::string> ops;
  for (size_t i = 0; i < cases.items.size(); i++) {
    const Json& c = cases.items[i];
    const Json& policies = c.at("policies");
    ASSERT_EQ(policies.type, Json::Obj) << c.s("name");
    shardlimit::Clock clock(0);
    Replay r{L::from_json(config(policies.text, i), &clock), source, {}};
    const auto& list = c.at("steps").items;
    total += list.size();
    for (size_t j = 0; j < list.size(); j++, steps++) {
      const Json& st = list[j];
      std::string where = c.s("name") + ", step " + std::to_string(j) + " (" + st.s("op") + ")";
      ops.insert(st.s("op"));
      clock.set_us(st.u64("t_us"));
      r.step(st, where);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  EXPECT_EQ(steps, total);
  EXPECT_GT(total, 100u);
  EXPECT_EQ(ops, (std::set<std::string>{"check", "peek", "acquire", "release", "reset",
                                        "check_all", "batch"}));
}

TEST(Vectors, InMemoryOnAManualClock) {
  replay_vectors([](const std::string& policies, size_t) {
    return R"({"policies":)" + policies + "}";
  }, SHARDLIMIT_SOURCE_MEMORY);
}

TEST(Vectors, OnRedisOnAManualClock) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  socklen_t len = sizeof a;
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(fd);
  std::string port = std::to_string(ntohs(a.sin_port));
  pid_t pid = fork();
  if (pid == 0) {
    if (!freopen("/dev/null", "w", stdout)) _exit(126);
    execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--save",
           "", "--appendonly", "no", "--dir", "/tmp", static_cast<char*>(nullptr));
    _exit(127);
  }
  struct Stop {
    ~Stop() {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
    pid_t pid;
  } stop{pid};
  bool up = false;
  for (int i = 0; i < 500 && !up; i++) {  // readiness: the port accepts, for at most 10 s
    int c = socket(AF_INET, SOCK_STREAM, 0);
    up = connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    close(c);
    if (!up) usleep(20 * 1000);
  }
  ASSERT_TRUE(up) << "redis-server did not start";
  replay_vectors([&](const std::string& policies, size_t i) {
    // a fresh key space per case
    return R"({"shards":[{"name":"s0","url":"redis://127.0.0.1:)" + port +
           R"("}],"timeout_ms":2000,"key_prefix":"vec)" + std::to_string(i) +
           R"(:","policies":)" + policies + "}";
  }, SHARDLIMIT_SOURCE_REDIS);
}

}  // namespace
