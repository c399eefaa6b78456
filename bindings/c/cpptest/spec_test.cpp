// The C++ wrapper against the shared contracts: spec/operations.json (every operation of
// the core not marked not_in for cpp is a Limiter member under its snake_case name),
// spec/errors.json (codes, names, backend flags, hierarchy) and tests/vectors/keys.json.
// The decision vectors are replayed by vectors_test.cpp.
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
    OP("from_config_file", L::from_config_file("x")),
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
    OP("metrics", l->metrics()),
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
    OP("config_generation", l->config_generation()),
    OP("subscribe", l->subscribe()),
    OP("set_log_sink", (l->on_log(nullptr), 0)),
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
  EXPECT_NE(limiter.metrics().find("policy=\"api\""), std::string::npos);
  EXPECT_NE(limiter.metrics_snapshot().find("\"policy\":\"api\""), std::string::npos);
  EXPECT_TRUE(limiter.memory_keys().has_value());
  EXPECT_THROW(limiter.route("k"), shardlimit::Error);
  limiter.reload(R"({"policies":{"api":{"algorithm":"fixed_window","limit":9,"window":"1s"}}})");
  limiter.set_scale(1.0);
  EXPECT_EQ(limiter.check("k3", "api").limit(), 9u);
}

}  // namespace
