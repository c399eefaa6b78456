package shardlimit

// The completion callback of started C calls (shardlimit_*_start). A file of its own:
// a file with //export may only declare, not define, C functions in its preamble.

/*
#include "shardlimit.h"
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// shardlimitGoComplete runs once per started call, on the library's I/O thread (or on the
// goroutine that started or cancelled it): it wakes the goroutine waiting for the call.
// user is the cgo.Handle of that goroutine's channel, which has room for this one send.
//
//export shardlimitGoComplete
func shardlimitGoComplete(user unsafe.Pointer, _ *C.shardlimit_pending) {
	h := cgo.Handle(uintptr(user))
	h.Value().(chan struct{}) <- struct{}{}
	h.Delete()
}
