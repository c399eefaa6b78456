# The commands a newcomer needs:
#   make demo   - the main job: limits enforced across local Redis shards
#   make test   - every test (installs redis-server and the tools each suite needs),
#                 including the install tests of the release artifacts (after make dist)
#   make test-fast - formatting, lints, unit tests and the tests that need no Redis, in a
#                 few minutes (see CONTRIBUTING.md); make test is what CI runs
#   make dist   - the release artifacts in dist/ (wheel + sdist, npm tarballs, C/C++ SDK,
#                 Go module proxy, Java jar + POM, .crate files), from one release build
#   make dist-all - make dist plus every other platform that builds here (linux arm64,
#                 musl, macOS): wheels, npm platform packages, C SDKs (RELEASING.md)
#   make bench  - shardlimit against the latest peers of each language (bench/peers.lock),
#                 written to docs/benchmarks.md (make bench-quick: one short round)
# Every script honours CARGO_TARGET_DIR.
.PHONY: demo test test-fast dist dist-all test-dist test-dist-all test-serve test-java build bench bench-quick bench-redis bench-redis-cost bench-serve bench-scale bench-java fmt lint

demo:
	bash scripts/demo.sh

test:
	bash scripts/test.sh

test-fast:
	bash scripts/test-fast.sh

dist:
	bash scripts/dist.sh

dist-all:
	bash scripts/dist-all.sh

# the install tests alone, on an existing dist/
test-dist:
	bash scripts/test-dist.sh

# what runs here of make dist-all's other platforms (arm64 under qemu, musl): RELEASING.md
test-dist-all:
	bash scripts/test-dist-all.sh

# shardlimit serve behind real Envoy, nginx and HAProxy (on dist/; SERVE_DEV=1: debug builds)
test-serve:
	bash scripts/test-serve.sh

# the Java package on dist/java: JUnit suites on Java 17 and the newest JDK, and the
# install test of the jar into an empty local Maven repository
test-java:
	bash scripts/test-java.sh

build:
	cargo build --release -p shardlimit-cli

bench:
	bash scripts/bench-peers.sh

bench-quick:
	bash scripts/bench-peers.sh --quick

# the CLI against redis-benchmark running shardlimit's own token bucket script
bench-redis:
	bash scripts/bench-redis.sh

# Redis's own time and instructions per decision, per algorithm: shardlimit's scripts
# against minimal single-purpose scripts and rate-limiter-flexible's commands
bench-redis-cost:
	bash scripts/bench-redis-cost.sh

# 1, 2, 4, 8 shards and Redis Cluster primaries: decisions/s, Redis time per decision, memory per key
bench-scale:
	bash scripts/bench-scale.sh --write docs/benchmarks.md

# shardlimit serve against Lyft's ratelimit, Envoy's rate limit service over gRPC, one Redis
bench-serve:
	bash scripts/bench-serve.sh

# the Java package against Bucket4j over Lettuce: the Java section of docs/benchmarks.md
bench-java:
	bash scripts/bench-java.sh

fmt:
	cargo fmt --all

lint:
	cargo clippy --workspace --all-targets -- -D warnings
