# The two commands a newcomer needs:
#   make demo   - the main job: limits enforced across local Redis shards
#   make test   - every test (installs redis-server and the tools each suite needs)
.PHONY: demo test build bench fmt lint

demo:
	bash scripts/demo.sh

test:
	bash scripts/test.sh

build:
	cargo build --release -p shardlimit-cli

bench:
	bash scripts/bench-redis.sh

fmt:
	cargo fmt --all

lint:
	cargo clippy --workspace --all-targets -- -D warnings
