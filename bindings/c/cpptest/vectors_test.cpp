// Every file of tests/vectors through the C++ wrapper: the decision files replayed step by
// step (format: the `format` list at the top of algorithms.json and of each file that adds
// ops), every case on a fresh limiter with a manual clock set to each step's t_us, in
// memory and on a real redis-server; keys.json and routing.json; and a census that fails
// when a file of tests/vectors is neither replayed here nor skipped with a reason.
#include <shardlimit.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#ifndef SHARDLIMIT_ROOT
#error "SHARDLIMIT_ROOT (the repository root) must be defined"
#endif

namespace {

using L = shardlimit::Limiter;

std::string read(const std::string& rel) {
  std::ifstream f(std::string(SHARDLIMIT_ROOT) + "/" + rel);
  if (!f) throw std::runtime_error("cannot read " + rel);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
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

/// A JSON string literal of s.
std::string json_quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

/// One canonical text of a value: objects with their keys sorted, so that two values
/// compare equal exactly when they are the same JSON.
std::string canon(const Json& v) {
  switch (v.type) {
    case Json::Str: return json_quoted(v.str);
    case Json::Arr: {
      std::string out = "[";
      for (size_t i = 0; i < v.items.size(); i++) out += (i ? ", " : "") + canon(v.items[i]);
      return out + "]";
    }
    case Json::Obj: {
      std::vector<size_t> order(v.keys.size());
      for (size_t i = 0; i < order.size(); i++) order[i] = i;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v.keys[a] < v.keys[b]; });
      std::string out = "{";
      for (size_t i = 0; i < order.size(); i++)
        out += (i ? ", " : "") + json_quoted(v.keys[order[i]]) + ": " + canon(v.items[order[i]]);
      return out + "}";
    }
    default: return v.text;
  }
}

/// A decision as the vectors write it: durations in whole µs, retry_after_us null when
/// absent, layer null but for check_all; limit_index and rate_limit_policy for a
/// multi-limit policy (plans.json), "shadow_denied": true for a shadow denial.
std::string observed(const shardlimit::Decision& d) {
  auto opt = [](auto o) { return o ? std::to_string(static_cast<uint64_t>(*o)) : "null"; };
  auto retry = d.retry_after();
  std::string out = std::string("{\"allowed\": ") + (d.allowed() ? "true" : "false") +
                    ", \"limit\": " + std::to_string(d.limit()) +
                    ", \"remaining\": " + std::to_string(d.remaining()) +
                    ", \"reset_after_us\": " + std::to_string(d.reset_after().count()) +
                    ", \"retry_after_us\": " +
                    (retry ? std::to_string(retry->count()) : std::string("null")) +
                    ", \"delay_us\": " + std::to_string(d.delay().count()) +
                    ", \"policy\": " + json_quoted(std::string(d.policy())) +
                    ", \"layer\": " + opt(d.layer());
  if (auto li = d.limit_index()) {
    std::string header;
    for (const auto& [name, value] : d.headers())
      if (name == "RateLimit-Policy") header = value;
    out += ", \"limit_index\": " + std::to_string(*li) + ", \"rate_limit_policy\": " + json_quoted(header);
  }
  if (d.shadow_denied()) out += ", \"shadow_denied\": true";
  return canon(Json::parse(out + "}"));
}

/// The expectation in the same form, after checking that it is a decision: the 8 fields,
/// limit_index with rate_limit_policy, shadow_denied only when true.
std::string expected(const Json& e) {
  static const std::vector<std::string> fields = {"allowed",        "limit",    "remaining",
                                                  "reset_after_us", "retry_after_us",
                                                  "delay_us",       "policy",   "layer"};
  const Json* li = e.get("limit_index");
  const Json* shadow = e.get("shadow_denied");
  size_t n = fields.size() + (li ? 2 : 0) + (shadow ? 1 : 0);
  bool ok = e.type == Json::Obj && e.keys.size() == n && (!li || e.get("rate_limit_policy")) &&
            (!shadow || (shadow->type == Json::Bool && shadow->b));
  for (const auto& f : fields) ok = ok && e.get(f);
  if (!ok) throw std::runtime_error("expect is not a decision's fields: " + e.text);
  return canon(e);
}

/// The decision files, replayed in full; the other files and the test replaying each;
/// the files skipped, with the reason (none today).
const std::vector<std::string> kDecisionFiles = {"algorithms.json", "plans.json",
                                                 "precision.json",  "settle.json",
                                                 "shadow.json",     "overrides.json"};
const std::map<std::string, std::string> kOtherFiles = {
    {"keys.json", "Spec.KeyVectors (spec_test.cpp)"},
    {"routing.json", "Vectors.Routing"},
};
const std::map<std::string, std::string> kSkippedFiles = {};
const std::set<std::string> kOps = {"check",  "peek",   "acquire", "release",       "reset",
                                    "check_all", "batch", "charge", "refund",       "reserve",
                                    "settle", "shadow_report", "set_override", "delete_override"};

/// One case being replayed: its limiter, the leases and reservations kept by name.
struct Replay {
  L limiter;
  shardlimit_source source;
  std::map<std::string, shardlimit::Lease> leases;
  /// each reservation with its reserve step (whose policy, or plan, settles it)
  std::map<std::string, std::pair<shardlimit::Reservation, const Json*>> reservations;

  void decided(const Json& it, const shardlimit::Decision& d,
               std::optional<shardlimit::Lease> lease, const std::string& where) {
    EXPECT_EQ(d.source(), source) << where << ": decided by " << d.source_name();
    EXPECT_EQ(observed(d), expected(it.at("expect"))) << where;
    if (const Json* as = it.get("lease_as")) {
      ASSERT_TRUE(as->type == Json::Str && lease.has_value()) << where << ": no lease to keep";
      leases.insert_or_assign(as->str, std::move(*lease));
    }  // else a lease is never released: it expires after lease_ttl
  }

  /// The item's policy: by name, or as its plan has it (plans.json).
  shardlimit::Policy policy(const Json& it) const {
    if (const Json* plan = it.get("plan")) return limiter.plan_policy(plan->str, it.s("policy"));
    return limiter.policy(it.s("policy"));
  }

  /// A check (a shadow check with "shadow": true), peek or acquire: a step or a batch item.
  void call(const Json& it, const std::string& where) {
    const std::string& op = it.s("op");
    const std::string& key = it.s("key");
    auto p = policy(it);
    const Json* shadow = it.get("shadow");
    if (op == "check" && shadow && shadow->type == Json::Bool && shadow->b) {
      decided(it, limiter.check_shadow(key, p, it.u64("cost")), std::nullopt, where);
    } else if (op == "check") {
      decided(it, limiter.check(key, p, it.u64("cost")), std::nullopt, where);
    } else if (op == "peek") {
      decided(it, limiter.peek(key, p), std::nullopt, where);
    } else if (op == "acquire") {
      auto [d, lease] = limiter.acquire(key, p, it.u64("units"));
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
      limiter.reset(s.s("key"), policy(s));
    } else if (op == "check_all") {
      std::vector<shardlimit::Layer> layers;
      for (const auto& la : s.at("layers").items)
        layers.push_back({la.s("key"), la.s("policy"), la.u64("cost")});
      ASSERT_FALSE(layers.empty()) << where << ": no layers";
      decided(s, limiter.check_all(layers), std::nullopt, where);
    } else if (op == "charge") {
      decided(s, limiter.charge(s.s("key"), policy(s), s.u64("cost")), std::nullopt, where);
    } else if (op == "refund") {
      decided(s, limiter.refund(s.s("key"), policy(s), s.u64("cost")), std::nullopt, where);
    } else if (op == "reserve") {
      auto [d, r] = limiter.reserve(s.s("key"), policy(s), s.u64("cost"));
      decided(s, d, std::nullopt, where);
      if (const Json* as = s.get("reserve_as")) {
        ASSERT_TRUE(as->type == Json::Str && r.has_value()) << where << ": no reservation to keep";
        reservations.insert_or_assign(as->str, std::make_pair(*r, &s));
      }
    } else if (op == "settle") {
      auto held = reservations.find(s.s("reservation"));
      ASSERT_NE(held, reservations.end()) << where << ": no reservation " << s.s("reservation");
      auto p = policy(*held->second.second);
      decided(s, limiter.settle(p, held->second.first, s.u64("actual")), std::nullopt, where);
    } else if (op == "shadow_report") {
      const Json* top = s.get("top");
      std::string got = limiter.shadow_report(s.s("policy"), top ? top->u64() : 0);
      EXPECT_EQ(canon(Json::parse(got)), canon(s.at("expect_report"))) << where;
    } else if (op == "set_override") {
      const Json* ttl = s.get("ttl_ms");
      limiter.set_override(s.s("key"), s.s("policy"), s.s("limit"),
                           std::chrono::milliseconds(ttl ? ttl->u64() : 0));
    } else if (op == "delete_override") {
      const Json& want = s.at("expect_deleted");
      ASSERT_EQ(want.type, Json::Bool) << where;
      EXPECT_EQ(limiter.delete_override(s.s("key"), s.s("policy")), want.b) << where;
    } else {
      FAIL() << where << ": unknown op \"" << op << "\": teach this replay the op";
    }
  }
};

/// Replays every case and every step of every decision file on a fresh limiter from
/// `config(the case's config members, case number)` on a manual clock set to each step's
/// t_us; every decision must come from `source`. An unknown op fails.
template <class Config>
void replay_vectors(Config config, shardlimit_source source) {
  size_t steps = 0, total = 0, n = 0;
  std::set<std::string> ops;
  for (const auto& file : kDecisionFiles) {
    Json doc = Json::parse(read("tests/vectors/" + file));
    const Json& cases = doc.at("cases");
    ASSERT_FALSE(cases.items.empty()) << file;
    for (const Json& c : cases.items) {
      const Json& policies = c.at("policies");
      ASSERT_EQ(policies.type, Json::Obj) << c.s("name");
      // the config's members beside its policies (plans.json: plans, default_algorithm)
      std::string members = "\"policies\":" + policies.text;
      for (const char* extra : {"plans", "default_algorithm"})
        if (const Json* v = c.get(extra)) members += std::string(",\"") + extra + "\":" + v->text;
      shardlimit::Clock clock(0);
      Replay r{L::from_json(config(members, n++), &clock), source, {}, {}};
      const auto& list = c.at("steps").items;
      total += list.size();
      for (size_t j = 0; j < list.size(); j++, steps++) {
        const Json& st = list[j];
        std::string where =
            file + ": " + c.s("name") + ", step " + std::to_string(j) + " (" + st.s("op") + ")";
        ops.insert(st.s("op"));
        clock.set_us(st.u64("t_us"));
        try {
          r.step(st, where);
        } catch (const std::exception& e) {
          FAIL() << where << ": " << e.what();
        }
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
  EXPECT_EQ(steps, total);
  EXPECT_GT(total, 300u);
  EXPECT_EQ(ops, kOps);
}

/// A redis-server on a free loopback port for one test, stopped at its end.
struct RedisServer {
  std::string port;
  pid_t pid = -1;
  RedisServer() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    socklen_t len = sizeof a;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("no free port");
    close(fd);
    port = std::to_string(ntohs(a.sin_port));
    pid = fork();
    if (pid == 0) {
      if (!freopen("/dev/null", "w", stdout)) _exit(126);
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", "/tmp", static_cast<char*>(nullptr));
      _exit(127);
    }
    bool up = false;
    for (int i = 0; i < 500 && !up; i++) {  // readiness: the port accepts, for at most 10 s
      int c = socket(AF_INET, SOCK_STREAM, 0);
      up = connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      close(c);
      if (!up) usleep(20 * 1000);
    }
    if (!up) {
      stop();
      throw std::runtime_error("redis-server did not start");
    }
  }
  ~RedisServer() { stop(); }
  void stop() {
    if (pid > 0) kill(pid, SIGTERM), waitpid(pid, nullptr, 0);
    pid = -1;
  }
  std::string shard(const std::string& name) const {
    return R"({"name":")" + name + R"(","url":"redis://127.0.0.1:)" + port + R"("})";
  }
};

TEST(Vectors, EveryFileIsReplayedOrSkipped) {
  std::set<std::string> present, known(kDecisionFiles.begin(), kDecisionFiles.end());
  DIR* dir = opendir((std::string(SHARDLIMIT_ROOT) + "/tests/vectors").c_str());
  ASSERT_NE(dir, nullptr);
  while (dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) present.insert(name);
  }
  closedir(dir);
  for (const auto& [f, test] : kOtherFiles) known.insert(f);
  for (const auto& [f, why] : kSkippedFiles) {
    EXPECT_FALSE(why.empty()) << f << " is skipped without a reason";
    known.insert(f);
  }
  for (const auto& f : present)
    EXPECT_TRUE(known.count(f)) << "tests/vectors/" << f
                                << " is neither replayed by the C++ tests nor skipped with a reason";
  for (const auto& f : known) EXPECT_TRUE(present.count(f)) << f << " is listed but not there";
  EXPECT_NO_THROW(read("tests/vectors/README.md")) << "the step formats of every file";
}

TEST(Vectors, InMemoryOnAManualClock) {
  replay_vectors([](const std::string& members, size_t) { return "{" + members + "}"; },
                 SHARDLIMIT_SOURCE_MEMORY);
}

TEST(Vectors, OnRedisOnAManualClock) {
  RedisServer redis;
  replay_vectors([&](const std::string& members, size_t i) {
    // a fresh key space per case
    return R"({"shards":[)" + redis.shard("s0") + R"(],"timeout_ms":2000,"key_prefix":"vec)" +
           std::to_string(i) + R"(:",)" + members + "}";
  }, SHARDLIMIT_SOURCE_REDIS);
}

/// The routing contract (tests/vectors/routing.json): every case's shard among 1 to 16
/// shards, as route() reports it (shard names s0, s1, ...).
TEST(Vectors, Routing) {
  RedisServer redis;
  Json doc = Json::parse(read("tests/vectors/routing.json"));
  const auto& cases = doc.at("cases").items;
  ASSERT_FALSE(cases.empty());
  for (size_t n = 1; n <= 16; n++) {
    std::string shards;
    for (size_t i = 0; i < n; i++) shards += (i ? "," : "") + redis.shard("s" + std::to_string(i));
    auto limiter = L::from_json(R"({"policies":{},"shards":[)" + shards + "]}");
    for (const Json& c : cases) {
      uint64_t want = c.at("shard_for").items.at(n - 1).u64();
      auto [index, name] = limiter.route(c.s("key"));
      EXPECT_EQ(index, want) << c.s("key") << " among " << n << " shards";
      EXPECT_EQ(name, "s" + std::to_string(want)) << c.s("key") << " among " << n << " shards";
    }
  }
}

/// precision.json's offsets (the per-key window offset function) through decisions: at a
/// multiple of the window, a per_key fixed window of window_us resets for the key in
/// exactly offset_us (a whole window when the offset is 0), on both engines.
TEST(Vectors, WindowOffsets) {
  RedisServer redis;
  Json doc = Json::parse(read("tests/vectors/precision.json"));
  const auto& offsets = doc.at("offsets").items;
  ASSERT_GE(offsets.size(), 64u);
  std::set<uint64_t> windows;
  for (const Json& o : offsets) windows.insert(o.u64("window_us"));
  std::string policies;
  for (uint64_t w : windows)
    policies += (policies.empty() ? "" : ",") + std::string("\"w") + std::to_string(w) +
                R"(":{"algorithm":"fixed_window","limit":1,"window":")" + std::to_string(w) +
                R"(us","window_offset":"per_key"})";
  for (const std::string& cfg :
       {R"({"policies":{)" + policies + "}}",
        R"({"shards":[)" + redis.shard("s0") +
            R"(],"timeout_ms":2000,"key_prefix":"offsets:","policies":{)" + policies + "}}"}) {
    shardlimit::Clock clock(0);
    auto limiter = L::from_json(cfg, &clock);
    for (const Json& o : offsets) {
      uint64_t w = o.u64("window_us"), offset = o.u64("offset_us");
      clock.set_us((1700000000000000ull / w + 1) * w);  // the first multiple of w after 1.7e15
      auto d = limiter.check(o.s("key"), "w" + std::to_string(w));
      EXPECT_TRUE(d.allowed()) << o.text;
      EXPECT_EQ(static_cast<uint64_t>(d.reset_after().count()), offset ? offset : w) << o.text;
    }
  }
}

}  // namespace
