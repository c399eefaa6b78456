module github.com/shardlimit/shardlimit/bindings/go/leaktest

go 1.22

require github.com/shardlimit/shardlimit/bindings/go v0.0.0

require go.uber.org/goleak v1.3.0

replace github.com/shardlimit/shardlimit/bindings/go => ../
