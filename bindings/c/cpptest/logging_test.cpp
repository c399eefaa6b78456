// GoogleTest of Limiter::on_log: the core's rate-limited warning lines, as a std::function,
// against a port nothing listens on (every check falls back to on_error), on a manual clock.
#include <shardlimit.hpp>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <chrono>
#include <mutex>
#include <string>
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

TEST(Logging, AThousandFallbacksAreOneLineThenTheNextCarriesTheCount) {
  shardlimit::Clock clock(1700000000000000ull);
  std::string cfg = "{\"timeout_ms\":300,\"shards\":[{\"name\":\"dead\",\"url\":\"redis://127.0.0.1:" +
                    std::to_string(free_port()) +
                    "\"}],\"policies\":{\"api\":{\"rate\":\"10/minute\",\"on_error\":\"open\"}}}";
  auto l = shardlimit::Limiter::from_json(cfg, &clock);
  std::mutex mu;
  std::vector<shardlimit::LogRecord> lines;
  l.on_log([&](const shardlimit::LogRecord& r) {
    std::lock_guard<std::mutex> g(mu);
    lines.push_back(r);
  });
  auto fallbacks = [&] {
    std::lock_guard<std::mutex> g(mu);
    std::vector<shardlimit::LogRecord> out;
    for (auto& r : lines)
      if (r.reason == "fallback" && r.subject == "api") out.push_back(r);
    return out;
  };
  for (int i = 0; i < 1000; i++) ASSERT_TRUE(l.check("k", "api").allowed());
  // blocking checks log on the caller's thread: the lines are in by now
  auto f = fallbacks();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].suppressed, 0u);
  EXPECT_EQ(f[0].allowed, std::optional<bool>(true));
  EXPECT_FALSE(f[0].error);
  EXPECT_TRUE(shardlimit_result_is_backend(f[0].error_code));
  EXPECT_NE(f[0].message.find("policy `api` fell back to on_error and allowed"), std::string::npos);
  clock.advance(std::chrono::seconds(10));
  l.check("k", "api");
  f = fallbacks();
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[1].suppressed, 999u);
  // removed: no more lines, and a moved limiter keeps its callback
  l.on_log(nullptr);
  clock.advance(std::chrono::seconds(10));
  l.check("k", "api");
  EXPECT_EQ(fallbacks().size(), 2u);
  int moved_lines = 0;
  l.on_log([&](const shardlimit::LogRecord&) { moved_lines++; });
  auto m = std::move(l);
  clock.advance(std::chrono::seconds(10));
  m.check("k", "api");
  EXPECT_EQ(moved_lines, 1);
}

// With no on_log, the lines go to stderr (the C library's default); on_log(nullptr)
// silences them.
TEST(Logging, WithoutACallbackTheLinesGoToStderr) {
  std::string cfg = "{\"timeout_ms\":300,\"shards\":[{\"name\":\"dead\",\"url\":\"redis://127.0.0.1:" +
                    std::to_string(free_port()) +
                    "\"}],\"policies\":{\"api\":{\"rate\":\"10/minute\",\"on_error\":\"open\"}}}";
  testing::internal::CaptureStderr();
  {
    auto l = shardlimit::Limiter::from_json(cfg);
    // blocking checks log on this thread: written by the time they return
    for (int i = 0; i < 3; i++) ASSERT_TRUE(l.check("k", "api").allowed());
  }
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("warn: shardlimit: policy `api` fell back to on_error and allowed"),
            std::string::npos)
      << out;
  // rate-limited: one fallback line for three fallbacks
  EXPECT_EQ(out.find("fell back"), out.rfind("fell back")) << out;

  testing::internal::CaptureStderr();
  {
    auto l = shardlimit::Limiter::from_json(cfg);
    l.on_log(nullptr);
    ASSERT_TRUE(l.check("k", "api").allowed());
  }
  out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.find("shardlimit:"), std::string::npos) << out;
}

}  // namespace
