// GoogleTest suite of the C++ wrapper against a real redis-server started on a free
// 127.0.0.1 port for the suite and stopped after it.
#include <shardlimit.hpp>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

namespace {

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  socklen_t len = sizeof a;
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("free_port");
  close(fd);
  return ntohs(a.sin_port);
}

bool ping(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  char buf[16] = {0};
  bool ok = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            write(fd, "PING\r\n", 6) == 6 && read(fd, buf, sizeof buf - 1) > 0 &&
            std::strncmp(buf, "+PONG", 5) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

class Redis : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    port_ = free_port();
    std::string port = std::to_string(port_);
    pid_ = fork();
    if (pid_ == 0) {
      if (!freopen("/dev/null", "w", stdout)) _exit(126);
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", "/tmp", static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 500 && !ping(port_); i++) usleep(20 * 1000);  // readiness, <= 10 s
    ASSERT_TRUE(ping(port_)) << "redis-server did not start";
  }
  static void TearDownTestSuite() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  static std::string config(const std::string& policies) {
    return R"({"shards":[{"name":"s0","url":"redis://127.0.0.1:)" + std::to_string(port_) +
           R"("}],"timeout_ms":2000,"policies":{)" + policies + "}}";
  }
  static inline pid_t pid_ = -1;
  static inline int port_ = 0;
};

TEST_F(Redis, ExactAdmissionFromManyThreads) {
  auto limiter = shardlimit::Limiter::from_json(
      config(R"("exact":{"algorithm":"sliding_log","limit":300,"window":"1h"})"));
  std::atomic<int> allowed{0}, denied{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; t++)
    threads.emplace_back([&] {
      for (int i = 0; i < 40; i++) {
        auto d = limiter.check("tenant:42", "exact");
        (d.allowed() ? allowed : denied)++;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(allowed.load(), 300);
  EXPECT_EQ(denied.load(), 16 * 40 - 300);
  auto d = limiter.check("tenant:42", "exact");
  EXPECT_FALSE(d.allowed());
  ASSERT_TRUE(d.retry_after().has_value());
  EXPECT_GT(d.retry_after()->count(), 0);
  EXPECT_EQ(d.source(), SHARDLIMIT_SOURCE_REDIS);
  EXPECT_EQ(d.source_name(), "redis");
  EXPECT_EQ(d.shard(), std::optional<uint32_t>(0));
  EXPECT_EQ(d.policy(), "exact");
}

TEST_F(Redis, HeadersAndBody) {
  auto limiter = shardlimit::Limiter::from_json(
      config(R"("api":{"algorithm":"fixed_window","limit":1,"window":"1h"})"));
  EXPECT_TRUE(limiter.check("k", "api").allowed());
  auto d = limiter.check("k", "api");
  ASSERT_FALSE(d.allowed());
  auto h = d.headers();
  ASSERT_EQ(h.size(), 6u);
  EXPECT_EQ(h[0], std::make_pair(std::string("X-RateLimit-Limit"), std::string("1")));
  EXPECT_EQ(h[3].second, "\"api\";q=1;w=3600");
  EXPECT_EQ(h[5].first, "Retry-After");
  EXPECT_NE(d.body().find("\"error\":\"rate_limited\""), std::string::npos);
  EXPECT_NE(d.to_json().find("\"allowed\":false"), std::string::npos);
}

// Multi-limit policies, plans and rate strings: the core decides in one call,
// the decision carries every limit, the headers are the core's.
TEST_F(Redis, MultiLimitPoliciesPlansAndRateStrings) {
  auto limiter = shardlimit::Limiter::from_json(
      config(R"("api":"2/hour; 3/day"},"plans":{"pro":{"api":"10/hour; 100/day"})"));
  auto d = limiter.check("u", "api", 2);
  ASSERT_TRUE(d.allowed());
  EXPECT_EQ(d.limit_index(), std::optional<uint32_t>(0));
  auto q = d.quotas();
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q[1].limit, 3u);
  EXPECT_EQ(q[1].window_us, 86400000000u);
  EXPECT_EQ(d.headers()[3].second, "\"api\";q=2;w=3600, \"api#1\";q=3;w=86400");
  d = limiter.check("u", "api", 2);  // the hour denies; nothing taken from the day
  EXPECT_FALSE(d.allowed());
  EXPECT_EQ(d.limit_index(), std::optional<uint32_t>(0));
  auto pro = limiter.plan_policy("pro", "api");
  EXPECT_EQ(pro.name(), "api");
  d = limiter.check("u", pro, 1);
  EXPECT_TRUE(d.allowed());
  EXPECT_EQ(d.remaining(), 7u);  // the same keys: 2 of the hour's 10 and 3 of the day's 100 used
  EXPECT_THROW(limiter.plan_policy("gold", "api"), shardlimit::Error);
  auto burst = shardlimit::Policy::from_rate("1/hour; 5/day");
  EXPECT_EQ(burst.name(), "fixed_window-1-3600000ms--fixed_window-5-86400000ms");
  EXPECT_TRUE(limiter.check("a", burst).allowed());
  d = limiter.check("a", burst);
  EXPECT_FALSE(d.allowed());
  EXPECT_EQ(d.limit_index(), std::optional<uint32_t>(0));
  auto one = shardlimit::Policy::from_rate("5/minute", SHARDLIMIT_ALGORITHM_SLIDING_LOG, "login");
  d = limiter.check("a", one);
  EXPECT_EQ(d.remaining(), 4u);
  EXPECT_FALSE(d.limit_index().has_value());
  EXPECT_TRUE(d.quotas().empty());
  EXPECT_THROW(shardlimit::Policy::from_rate("5/fortnight"), shardlimit::Error);
}

// Shadow mode: a policy in shadow and the per-call check_shadow allow a would-be denial,
// with shadow_denied and no Retry-After; shadow_report reads the counts back from Redis.
TEST_F(Redis, ShadowModeAndReport) {
  auto limiter = shardlimit::Limiter::from_json(config(
      R"("new":{"algorithm":"fixed_window","limit":1,"window":"1h","shadow":true},)"
      R"("old":{"algorithm":"fixed_window","limit":1,"window":"1h"})"));
  auto np = limiter.policy("new");
  auto op = limiter.policy("old");
  EXPECT_FALSE(limiter.check("cpp-u1", np).shadow_denied());
  for (int i = 0; i < 2; i++) {
    auto d = limiter.check("cpp-u1", np);
    EXPECT_TRUE(d.allowed() && d.shadow_denied());
    EXPECT_FALSE(d.retry_after().has_value());
    EXPECT_EQ(d.headers().size(), 2u);  // limit and policy: nothing that says limited
  }
  EXPECT_TRUE(limiter.check("cpp-u2", op).allowed());
  EXPECT_FALSE(limiter.check("cpp-u2", op).allowed());
  auto s = limiter.check_shadow("cpp-u2", op);
  EXPECT_TRUE(s.allowed() && s.shadow_denied());
  std::string r = limiter.shadow_report("new");
  EXPECT_NE(r.find("\"total\":2"), std::string::npos) << r;
  EXPECT_NE(r.find("{\"count\":2,\"key\":\"cpp-u1\"}"), std::string::npos) << r;
  EXPECT_NE(limiter.shadow_report("old", 1).find("\"cpp-u2\""), std::string::npos);
  EXPECT_THROW(limiter.shadow_report("a:b"), shardlimit::Error);
}

TEST_F(Redis, PoliciesPeekResetAndLeases) {
  auto limiter = shardlimit::Limiter::from_json(
      config(R"("tb":{"algorithm":"token_bucket","capacity":2,"refill_per_sec":0.001},)"
             R"("conc":{"algorithm":"concurrency","max":1,"lease_ttl":"30s"})"));
  auto tb = limiter.policy("tb");
  EXPECT_EQ(tb.name(), "tb");
  EXPECT_TRUE(limiter.check("b", tb).allowed());
  EXPECT_TRUE(limiter.check("b", tb).allowed());
  EXPECT_FALSE(limiter.check("b", tb).allowed());
  EXPECT_EQ(limiter.peek("b", tb).remaining(), 0u);
  limiter.reset("b", tb);
  EXPECT_EQ(limiter.peek("b", tb).remaining(), 2u);

  auto conc = limiter.policy("conc");
  auto [d1, lease] = limiter.acquire("job", conc);
  ASSERT_TRUE(d1.allowed());
  ASSERT_TRUE(lease.has_value());
  auto [d2, none] = limiter.acquire("job", conc);
  EXPECT_FALSE(d2.allowed());
  EXPECT_FALSE(none.has_value());
  EXPECT_TRUE(limiter.release(*lease));
  EXPECT_FALSE(limiter.release(*lease));
  EXPECT_TRUE(limiter.acquire("job", conc).first.allowed());

  shardlimit_limit l{SHARDLIMIT_ALGORITHM_FIXED_WINDOW, 1, 60000, 0.0, SHARDLIMIT_ON_ERROR_DEFAULT};
  auto adhoc = shardlimit::Policy::make("adhoc", l);
  EXPECT_TRUE(limiter.check("x", adhoc).allowed());
  EXPECT_FALSE(limiter.check("x", adhoc).allowed());
}

TEST_F(Redis, ChargeRefundReserveSettle) {
  auto limiter = shardlimit::Limiter::from_json(
      config(R"("tokens":{"algorithm":"fixed_window","limit":10,"window":"1h"},)"
             R"("conc":{"algorithm":"concurrency","max":1,"lease_ttl":"30s"})"));
  auto tokens = limiter.policy("tokens");
  auto d = limiter.charge("llm", tokens, 14);
  EXPECT_TRUE(d.allowed());
  EXPECT_EQ(d.remaining(), 0u);
  EXPECT_FALSE(limiter.check("llm", tokens).allowed());
  EXPECT_EQ(limiter.refund("llm", tokens, 99).remaining(), 10u);
  auto [reserved, r] = limiter.reserve("llm", tokens, 8);
  ASSERT_TRUE(reserved.allowed());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->units, 8u);
  EXPECT_EQ(limiter.settle(tokens, *r, 3).remaining(), 7u);
  auto [denied, none] = limiter.reserve("llm", tokens, 11);
  EXPECT_FALSE(denied.allowed());
  EXPECT_FALSE(none.has_value());
  auto conc = limiter.policy("conc");
  try {
    limiter.charge("llm", conc);
    ADD_FAILURE() << "a concurrency policy must be refused";
  } catch (const shardlimit::Error& e) {
    EXPECT_EQ(e.code(), SHARDLIMIT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("acquire and release"), std::string::npos);
  }
}

TEST(Errors, AreExceptionsWithStableCodes) {
  try {
    shardlimit::Limiter::from_json(R"({"policies":{"a":{"algorithm":"fixed_window","limit":0,"window":"1s"}}})");
    FAIL() << "no exception";
  } catch (const shardlimit::Error& e) {
    EXPECT_EQ(e.code(), SHARDLIMIT_ERR_CONFIG);
    EXPECT_EQ(e.name(), "config");
    EXPECT_FALSE(e.is_backend());
    EXPECT_NE(std::string(e.what()).find("policies.a.limit"), std::string::npos);
  }
  EXPECT_THROW(shardlimit::Limiter::from_config_file("/nonexistent/config.json"), shardlimit::Error);
  auto mem = shardlimit::Limiter::memory();
  try {
    mem.check("k", "nope");
    FAIL() << "no exception";
  } catch (const shardlimit::Error& e) {
    EXPECT_EQ(e.code(), SHARDLIMIT_ERR_UNKNOWN_POLICY);
  }
  shardlimit_limit l{SHARDLIMIT_ALGORITHM_TOKEN_BUCKET, 10, 0, -1.0, 0};
  try {
    shardlimit::Policy::make("p", l);
    FAIL() << "no exception";
  } catch (const shardlimit::Error& e) {
    EXPECT_EQ(e.code(), SHARDLIMIT_ERR_CONFIG);
    EXPECT_NE(std::string(e.what()).find("refill_per_sec"), std::string::npos);
  }
  l.rate_per_sec = 1.0;
  auto p = shardlimit::Policy::make("p", l);
  EXPECT_THROW(mem.check("", p), shardlimit::Error);
  EXPECT_THROW(mem.check("k", p, 0), shardlimit::Error);
  EXPECT_TRUE(mem.check("k", p).allowed());
  EXPECT_EQ(shardlimit::version(), SHARDLIMIT_VERSION);
}

TEST(Errors, DeadShardFollowsOnError) {
  auto limiter = shardlimit::Limiter::from_json(
      R"({"shards":[{"name":"dead","url":"redis://127.0.0.1:)" + std::to_string(free_port()) +
      R"("}],"timeout_ms":300,"policies":{)"
      R"("strict":{"algorithm":"fixed_window","limit":5,"window":"1s","on_error":"error"},)"
      R"("closed":{"algorithm":"fixed_window","limit":5,"window":"1s","on_error":"closed"}}})");
  try {
    limiter.check("k", "strict");
    FAIL() << "no exception";
  } catch (const shardlimit::Error& e) {
    EXPECT_TRUE(e.is_backend()) << e.what();
    EXPECT_NE(std::string(e.what()).find("dead"), std::string::npos);
  }
  auto d = limiter.check("k", "closed");
  EXPECT_FALSE(d.allowed());
  EXPECT_EQ(d.source(), SHARDLIMIT_SOURCE_FALLBACK);
}

TEST_F(Redis, CheckAllAndBlockList) {
  auto limiter = shardlimit::Limiter::from_json(
      config(R"("ip":{"algorithm":"fixed_window","limit":10,"window":"1h"},)"
             R"("tenant":{"algorithm":"fixed_window","limit":1,"window":"1h"})"));
  std::vector<shardlimit::Layer> layers{{"ip:1", "ip", 1}, {"tenant:1", "tenant", 1}};
  EXPECT_TRUE(limiter.check_all(layers).allowed());
  auto d = limiter.check_all(layers);
  EXPECT_FALSE(d.allowed());
  EXPECT_EQ(d.layer(), std::optional<uint32_t>(1));
  EXPECT_EQ(limiter.check("ip:1", "ip").remaining(), 8u);  // the denial took nothing

  limiter.block("ip:9", std::chrono::minutes(1), "abuse");
  auto b = limiter.check("ip:9", "ip");
  EXPECT_FALSE(b.allowed());
  EXPECT_EQ(b.source(), SHARDLIMIT_SOURCE_BLOCK);
  auto info = limiter.blocked("ip:9");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->reason, "abuse");
  ASSERT_TRUE(info->remaining.has_value());
  EXPECT_LE(info->remaining->count(), 60000000);
  EXPECT_TRUE(limiter.unblock("ip:9"));
  EXPECT_FALSE(limiter.blocked("ip:9").has_value());
  EXPECT_TRUE(limiter.check("ip:9", "ip").allowed());
}

TEST_F(Redis, OverridesAreSeenOnTheNextCheck) {
  const std::string policies =
      R"("api":{"algorithm":"fixed_window","limit":3,"window":"1h","overrides":true},)"
      R"("plain":{"algorithm":"fixed_window","limit":3,"window":"1h"})";
  // two limiters: two processes sharing one Redis
  auto a = shardlimit::Limiter::from_json(config(policies));
  auto b = shardlimit::Limiter::from_json(config(policies));
  EXPECT_EQ(b.check("acme", "api").limit(), 3u);
  std::string set = a.set_override("acme", "api", "100/hour", std::chrono::hours(1));
  EXPECT_NE(set.find(R"("limit":100)"), std::string::npos) << set;
  auto d = b.check("acme", "api");
  EXPECT_EQ(d.limit(), 100u);
  EXPECT_EQ(d.remaining(), 98u);
  EXPECT_EQ(d.policy(), "api");
  auto got = b.get_override("acme", "api");
  ASSERT_TRUE(got.has_value());
  EXPECT_NE(got->find(R"("key":"acme")"), std::string::npos) << *got;
  EXPECT_FALSE(b.get_override("nobody", "api").has_value());
  std::string page = b.list_overrides("api");
  EXPECT_NE(page.find(R"("key":"acme")"), std::string::npos) << page;
  EXPECT_NE(page.find(R"("cursor":null)"), std::string::npos) << page;
  EXPECT_TRUE(a.delete_override("acme", "api"));
  EXPECT_FALSE(a.delete_override("acme", "api"));
  EXPECT_EQ(b.check("acme", "api").limit(), 3u);
  try {
    a.set_override("acme", "plain", "5/minute");
    FAIL() << "a policy without overrides took one";
  } catch (const shardlimit::Error& e) {
    EXPECT_EQ(e.code(), SHARDLIMIT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("overrides"), std::string::npos) << e.what();
  }
}

TEST(Async, InMemoryFutureIsReadyAtOnce) {
  auto limiter = shardlimit::Limiter::memory();
  shardlimit_limit l{};
  l.algorithm = SHARDLIMIT_ALGORITHM_FIXED_WINDOW;
  l.limit = 2;
  l.period_ms = 60000;
  auto policy = shardlimit::Policy::make("adhoc", l);
  for (int i = 0; i < 3; i++) {
    auto pending = limiter.check_async("k", policy);
    ASSERT_EQ(pending.future().wait_for(std::chrono::seconds(0)), std::future_status::ready);
    EXPECT_EQ(pending.get().allowed(), i < 2) << i;
    EXPECT_FALSE(pending.cancel());  // completed (and freed by its callback) already
  }
  try {
    limiter.check_async("k", "no-such-policy");
    FAIL() << "an unknown policy started a call";
  } catch (const shardlimit::Error& e) {
    EXPECT_EQ(e.code(), SHARDLIMIT_ERR_UNKNOWN_POLICY);
  }
}

TEST_F(Redis, AsyncCheckCompletesAndCancelsOnAStoppedRedis) {
  auto limiter = shardlimit::Limiter::from_json(
      R"({"shards":[{"name":"s0","url":"redis://127.0.0.1:)" + std::to_string(port_) +
      R"("}],"timeout_ms":10000,"policies":{"api":{"algorithm":"fixed_window","limit":5,"window":"1h","on_error":"error"}}})");
  auto d = limiter.check_async("async:1", "api").get();
  EXPECT_TRUE(d.allowed());
  EXPECT_EQ(d.source(), SHARDLIMIT_SOURCE_REDIS);
  EXPECT_EQ(d.remaining(), 4u);
  // stopped: the call stays in flight (deadline 10 s) until cancelled
  ASSERT_EQ(kill(pid_, SIGSTOP), 0);
  struct Resume {
    ~Resume() { kill(pid, SIGCONT); }
    pid_t pid;
  } resume{pid_};
  auto pending = limiter.check_async("async:1", "api");
  EXPECT_EQ(pending.future().wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(pending.cancel());
  EXPECT_FALSE(pending.cancel());
  ASSERT_EQ(pending.future().wait_for(std::chrono::seconds(0)), std::future_status::ready);
  try {
    pending.get();
    FAIL() << "a cancelled call gave a decision";
  } catch (const shardlimit::Error& e) {
    EXPECT_EQ(e.code(), SHARDLIMIT_ERR_CANCELLED);
    EXPECT_EQ(e.name(), "cancelled");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

// The override calls and the shadow report as futures: the same answers as the blocking
// forms; on a stopped Redis they stay in flight until cancelled.
TEST_F(Redis, AsyncOverridesAndShadowReport) {
  auto limiter = shardlimit::Limiter::from_json(
      R"({"shards":[{"name":"s0","url":"redis://127.0.0.1:)" + std::to_string(port_) +
      R"("}],"key_prefix":"cppasync:","timeout_ms":10000,"policies":{)"
      R"("api":{"algorithm":"fixed_window","limit":3,"window":"1h","overrides":true},)"
      R"("sh":{"algorithm":"fixed_window","limit":1,"window":"1h","shadow":true}}})");
  std::string set = limiter.set_override_async("acme", "api", "100/hour", std::chrono::hours(1)).get();
  EXPECT_NE(set.find(R"("limit":100)"), std::string::npos) << set;
  EXPECT_EQ(limiter.check("acme", "api").limit(), 100u);
  auto got = limiter.get_override_async("acme", "api").get();
  ASSERT_TRUE(got.has_value());
  EXPECT_NE(got->find(R"("key":"acme")"), std::string::npos) << *got;
  EXPECT_FALSE(limiter.get_override_async("nobody", "api").get().has_value());
  std::string page = limiter.list_overrides_async("api").get();
  EXPECT_NE(page.find(R"("cursor":null)"), std::string::npos) << page;
  EXPECT_TRUE(limiter.delete_override_async("acme", "api").get());
  EXPECT_FALSE(limiter.delete_override_async("acme", "api").get());
  for (int i = 0; i < 3; i++) limiter.check("u1", "sh");
  std::string report = limiter.shadow_report_async("sh").get();
  EXPECT_NE(report.find(R"("total":2)"), std::string::npos) << report;
  try {
    limiter.get_override_async("acme", "nope").get();
    FAIL() << "an unknown policy gave an answer";
  } catch (const shardlimit::Error& e) {
    EXPECT_EQ(e.code(), SHARDLIMIT_ERR_UNKNOWN_POLICY);
  }
  ASSERT_EQ(kill(pid_, SIGSTOP), 0);
  struct Resume {
    ~Resume() { kill(pid, SIGCONT); }
    pid_t pid;
  } resume{pid_};
  auto pending = limiter.set_override_async("acme", "api", "5/minute");
  EXPECT_EQ(pending.future().wait_for(std::chrono::milliseconds(20)), std::future_status::timeout);
  EXPECT_TRUE(pending.cancel());
  try {
    pending.get();
    FAIL() << "a cancelled call gave an answer";
  } catch (const shardlimit::Error& e) {
    EXPECT_EQ(e.code(), SHARDLIMIT_ERR_CANCELLED);
  }
}

TEST(ClientIp, TrustsOnlyConfiguredProxies) {
  EXPECT_EQ(shardlimit::client_ip("10.1.2.3:443", "203.0.113.9, 198.51.100.7", {"10.0.0.0/8"}),
            "198.51.100.7");
  EXPECT_EQ(shardlimit::client_ip("203.0.113.5", "1.1.1.1", {"10.0.0.0/8"}), "203.0.113.5");
  EXPECT_EQ(shardlimit::client_ip("[::1]:80", ""), "::1");
  EXPECT_THROW(shardlimit::client_ip("nope", ""), shardlimit::Error);
}

}  // namespace
