//go:build !shardlimit_dynamic

package shardlimit

// The default: libshardlimit.a and the system libraries it needs (pkg-config module
// shardlimit-static of the SDK), so the program runs without libshardlimit.so.
// A file of its own rather than a conditional #cgo line in shardlimit.go: the go
// command's build cache tells packages apart by their files, not by which #cgo lines a
// build tag enabled, so the two link modes must differ in their files.

// #cgo pkg-config: shardlimit-static
import "C"
