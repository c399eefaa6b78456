// A minimal use of the wrapper: `shardlimit_demo CONFIG.json POLICY KEY [N]` checks KEY
// N times and prints each decision with its headers.
#include <shardlimit.hpp>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: " << argv[0] << " CONFIG.json POLICY KEY [N]\n";
    return 2;
  }
  int n = argc > 4 ? std::atoi(argv[4]) : 1;
  try {
    auto limiter = shardlimit::Limiter::from_config_file(argv[1]);
    for (int i = 0; i < n; i++) {
      auto d = limiter.check(argv[3], argv[2]);
      std::cout << (d.allowed() ? "allowed" : "denied") << " remaining=" << d.remaining() << "\n";
      for (const auto& [name, value] : d.headers()) std::cout << "  " << name << ": " << value << "\n";
      if (!d.allowed()) std::cout << "  body: " << d.body() << "\n";
    }
  } catch (const shardlimit::Error& e) {
    std::cerr << "shardlimit error (" << e.name() << "): " << e.what() << "\n";
    return 1;
  }
  return 0;
}
