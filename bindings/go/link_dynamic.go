//go:build shardlimit_dynamic

package shardlimit

// -tags shardlimit_dynamic: libshardlimit.so (pkg-config module shardlimit of the SDK);
// the program then needs libshardlimit.so.<major> at run time. See link_static.go.

// #cgo pkg-config: shardlimit
import "C"
