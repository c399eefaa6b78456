module example.invalid/shardlimit/examples/go

go 1.22
