package shardlimit

import (
	"syscall"
	"unsafe"
)

// socketUnread is how many bytes the socket fd holds (FIONREAD).
func socketUnread(fd uintptr) (int, error) {
	var v int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&v))); e != 0 {
		return 0, e
	}
	return int(v), nil
}
