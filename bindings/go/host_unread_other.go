//go:build !linux

package shardlimit

// socketUnread cannot ask the socket here: the reader's own flag (hostShard.reading) is
// what tells a silent shard from a busy process.
func socketUnread(fd uintptr) (int, error) { return 0, errNoUnread }
