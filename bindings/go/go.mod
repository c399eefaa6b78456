module github.com/shardlimit/shardlimit/bindings/go

go 1.22
