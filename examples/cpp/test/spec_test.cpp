// The C++ wrapper against the shared contracts: spec/operations.json (every operation of
// the core not marked not_in for cpp is a Limiter member under its snake_case name),
// spec/errors.json (codes, names, backend flags, hierarchy) and tests/vectors/keys.json.
#include <shardlimit.hpp>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
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
    OP("block", (l->block("k", std::chrono::milliseconds(0), ""), 0)),
    OP("unblock", l->unblock("k")),
    OP("blocked", l->blocked("k")),
};
#undef OP
// Operations of the core the C++ wrapper does not offer yet (the C ABI lacks them).
const std::set<std::string> kMissing = {"config", "subscribe", "watch_config"};

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

/// The object that follows "key": in `text` (brace-matched), e.g. a case's policy.
std::string object_at(const std::string& text, const std::string& key) {
  size_t at = text.find("\"" + key + "\": {");
  if (at == std::string::npos) return "";
  at = text.find('{', at);
  int depth = 0;
  for (size_t i = at; i < text.size(); i++) {
    if (text[i] == '{') depth++;
    if (text[i] == '}' && --depth == 0) return text.substr(at, i - at + 1);
  }
  return "";
}

/// Replays every case of tests/vectors/algorithms.json on a fresh limiter from
/// `config(policy, case index)` on a manual clock; an unknown op fails the test.
template <class Config>
void replay_vectors(Config config) {
  auto cases = objects(read("tests/vectors/algorithms.json"), "cases");
  ASSERT_GT(cases.size(), 5u);
  size_t steps = 0;
  for (size_t i = 0; i < cases.size(); i++) {
    const std::string& c = cases[i];
    std::string name = field(c, "name");
    shardlimit::Clock clock(0);
    auto limiter = L::from_json(config(object_at(c, "policy"), i), &clock);
    auto policy = limiter.policy("p");
    std::map<std::string, shardlimit::Lease> leases;
    auto list = objects(c, "steps");
    for (size_t j = 0; j < list.size(); j++, steps++) {
      const std::string& st = list[j];
      std::string op = field(st, "op"), where = name + ", step " + std::to_string(j);
      clock.set_us(std::stoull(field(st, "t_us")));
      if (op == "check") {
        auto [d, lease] = limiter.acquire(field(st, "key"), policy, std::stoull(field(st, "cost")));
        std::string as = field(st, "lease_as");
        if (!as.empty() && lease) leases.emplace(as, std::move(*lease));
        std::string e = object_at(st, "expect");
        EXPECT_EQ(d.allowed(), field(e, "allowed") == "true") << where;
        EXPECT_EQ(d.remaining(), std::stoull(field(e, "remaining"))) << where;
        EXPECT_EQ(static_cast<uint64_t>(d.reset_after().count()),
                  std::stoull(field(e, "reset_after_us")))
            << where;
        std::string retry = field(e, "retry_after_us");
        if (retry == "null") {
          EXPECT_FALSE(d.retry_after().has_value()) << where;
        } else {
          ASSERT_TRUE(d.retry_after().has_value()) << where;
          EXPECT_EQ(static_cast<uint64_t>(d.retry_after()->count()), std::stoull(retry)) << where;
        }
        EXPECT_EQ(static_cast<uint64_t>(d.delay().count()), std::stoull(field(e, "delay_us")))
            << where;
      } else if (op == "release") {
        auto it = leases.find(field(st, "lease"));
        ASSERT_NE(it, leases.end()) << where;
        EXPECT_EQ(limiter.release(it->second), field(st, "expect_released") == "true") << where;
      } else {
        FAIL() << where << ": unknown op " << op << ": teach this replay the op";
      }
    }
  }
  EXPECT_GT(steps, 30u);
}

TEST(Vectors, InMemoryOnAManualClock) {
  replay_vectors([](const std::string& policy, size_t) {
    return R"({"policies":{"p":)" + policy + "}}";
  });
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
  replay_vectors([&](const std::string& policy, size_t i) {
    // a fresh key space per case
    return R"({"shards":[{"name":"s0","url":"redis://127.0.0.1:)" + port +
           R"("}],"timeout_ms":2000,"key_prefix":"vec)" + std::to_string(i) +
           R"(","policies":{"p":)" + policy + "}}";
  });
}

}  // namespace
