// Install test of the C++ header and the CMake package (scripts/test-dist.sh): check PORT
#include <shardlimit.hpp>

#include <iostream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::string config = std::string(R"({"shards":[{"name":"a","url":"redis://127.0.0.1:)") + argv[1] +
                       R"("}],"timeout_ms":2000,"policies":{"p":{"algorithm":"fixed_window","limit":5,"window":"1h"}}})";
  auto limiter = shardlimit::Limiter::from_json(config);
  int admitted = 0;
  for (int i = 0; i < 8; i++) {
    auto d = limiter.check("user:cpp", "p");
    if (d.allowed() != (i < 5) || d.shard() != std::optional<uint32_t>(0)) {
      std::cerr << "check " << i << ": allowed=" << d.allowed() << "\n";
      return 1;
    }
    admitted += d.allowed();
  }
  std::cout << "c++: admitted " << admitted << " of 8 (limit 5)\n";
  return 0;
}
