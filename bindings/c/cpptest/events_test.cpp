// GoogleTest suite of the C++ wrapper's config, events and config watching against a real
// redis-server started on a free 127.0.0.1 port for the suite and stopped after it.
#include <shardlimit.hpp>
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

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

using namespace std::chrono_literals;

shardlimit::Event next_event(const shardlimit::Subscription& s) {
  auto e = s.next(10s);
  if (!e) throw std::runtime_error("no event within 10 s");
  return *e;
}

// Replaces `path` with `text` at the modification time `secs`: a change the watcher sees
// whatever the file system's time resolution, and once, whole (written and dated aside,
// then renamed over `path`).
void write_at(const std::string& path, const std::string& text, time_t secs) {
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  timespec ts[2] = {{secs, 0}, {secs, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, tmp.c_str(), ts, 0), 0);
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
}
}  // namespace

TEST_F(Redis, EventsOfANearLimitCrossingADenialAndABlock) {
  auto l = shardlimit::Limiter::from_json(
      config(R"("ev":{"algorithm":"fixed_window","limit":4,"window":"1h","near_limit":0.5})"));
  std::string c = l.config();
  EXPECT_NE(c.find(R"("name":"ev")"), std::string::npos) << c;
  EXPECT_EQ(c.find("redis://"), std::string::npos) << c;
  auto sub = l.subscribe();
  EXPECT_FALSE(sub.next(1ms).has_value());
  for (int i = 0; i < 5; i++) l.check("k1", "ev");
  auto e = next_event(sub);
  EXPECT_EQ(e.kind(), SHARDLIMIT_EVENT_NEAR_LIMIT);
  EXPECT_EQ(e.kind_name(), "near_limit");
  EXPECT_EQ(e.policy(), "ev");
  EXPECT_EQ(e.key(), "k1");
  EXPECT_EQ(e.limit(), 4u);
  EXPECT_EQ(e.remaining(), 2u);
  e = next_event(sub);
  EXPECT_EQ(e.kind(), SHARDLIMIT_EVENT_DENIED);
  ASSERT_TRUE(e.decision().has_value());
  EXPECT_FALSE(e.decision()->allowed());
  EXPECT_TRUE(e.retry_after().has_value());
  l.block("k2", 60s, "abuse");
  EXPECT_FALSE(l.check("k2", "ev").allowed());
  e = next_event(sub);
  EXPECT_EQ(e.kind(), SHARDLIMIT_EVENT_BLOCKED);
  EXPECT_EQ(e.key(), "k2");
  EXPECT_FALSE(e.auto_block());
  EXPECT_EQ(sub.dropped(), 0u);

  // an ad-hoc policy in shadow
  auto adhoc = shardlimit::Policy::make(
      "adhoc", shardlimit_limit{SHARDLIMIT_ALGORITHM_FIXED_WINDOW, 1, 3600000, 0, 0});
  auto shadow = adhoc.with_shadow();
  l.check("k3", shadow);
  auto d = l.check("k3", shadow);
  EXPECT_TRUE(d.allowed());
  EXPECT_TRUE(d.shadow_denied());
  EXPECT_EQ(next_event(sub).kind(), SHARDLIMIT_EVENT_NEAR_LIMIT);  // the default 0.8
  EXPECT_EQ(next_event(sub).kind(), SHARDLIMIT_EVENT_SHADOW_DENIED);
  EXPECT_FALSE(l.check("k3", adhoc).allowed());
  auto conc = shardlimit::Policy::make(
      "conc", shardlimit_limit{SHARDLIMIT_ALGORITHM_CONCURRENCY, 1, 1000, 0, 0});
  EXPECT_THROW(conc.with_shadow(), shardlimit::Error);

  // close() wakes a thread waiting without limit
  std::thread waiter([&] {
    try {
      for (;;) sub.next();
    } catch (const shardlimit::Error& err) {
      EXPECT_EQ(err.code(), SHARDLIMIT_ERR_CLOSED);
    }
  });
  sub.close();
  waiter.join();
}

TEST_F(Redis, WatchConfigReloadsAndTheNextCheckUsesTheNewLimit) {
  char dir[] = "/tmp/shardlimit-cpp-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string path = std::string(dir) + "/shardlimit.json";
  auto policy = [](int limit) {
    return config(R"("w":{"algorithm":"fixed_window","limit":)" + std::to_string(limit) +
                  R"(,"window":"1h"})");
  };
  write_at(path, policy(2), 1000000);
  auto l = shardlimit::Limiter::from_config_file(path);
  auto sub = l.subscribe();
  EXPECT_THROW(l.watch_config(path, 0ms), shardlimit::Error);
  {
    auto watcher = l.watch_config(path, 5ms);
    EXPECT_EQ(l.check("k", "w").limit(), 2u);
    write_at(path, policy(7), 2000000);
    auto e = next_event(sub);
    EXPECT_EQ(e.kind(), SHARDLIMIT_EVENT_RELOADED);
    EXPECT_EQ(e.detail(), "w");
    EXPECT_EQ(l.check("k", "w").limit(), 7u);
    write_at(path, "{ not json", 3000000);
    e = next_event(sub);
    EXPECT_EQ(e.kind(), SHARDLIMIT_EVENT_RELOAD_REJECTED);
    EXPECT_EQ(e.error_code(), SHARDLIMIT_ERR_CONFIG);
    EXPECT_FALSE(e.detail().empty());
  }
  // the watcher is gone: a change is no reload (10 of its intervals)
  write_at(path, policy(9), 4000000);
  EXPECT_FALSE(sub.next(50ms).has_value());
  EXPECT_EQ(l.check("k", "w").limit(), 7u);
  std::remove(path.c_str());
  rmdir(dir);
}
