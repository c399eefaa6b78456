package shardlimit

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
)

// rawRead reads what the socket holds into buf, waiting on Go's network poller while it
// holds nothing. reading is set before the read syscall and left set when bytes were
// taken (the caller clears it once they are handed to the library), so the deadline timer
// never takes a shard for silent while its reply is between the socket and the library.
func rawRead(raw syscall.RawConn, buf []byte, reading *atomic.Bool) (int, error) {
	var n int
	var rerr error
	err := raw.Read(func(fd uintptr) bool {
		if h := hostReadHook.Load(); h != nil {
			(*h)(hookBeforeRead)
		}
		reading.Store(true)
		for {
			n, rerr = syscall.Read(int(fd), buf)
			if rerr != syscall.EINTR {
				break
			}
		}
		if rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK {
			reading.Store(false)
			return false // wait for the poller
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: rerr}
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// hostReadHook, set by tests only, is called by a shard's reader at hookBeforeRead (the
// poller said the socket is readable; nothing taken from it yet) and hookBeforeInput (bytes
// taken, not handed to the library yet): a test holds the reader there to put a deadline
// timer between a reply's arrival and its reading, as a process short of CPU does.
var hostReadHook atomic.Pointer[func(stage int)]

const (
	hookBeforeRead = iota
	hookBeforeInput
)

// errNoUnread: the socket cannot say how many bytes it holds.
var errNoUnread = errors.New("no FIONREAD")

// unread reports whether conn's socket holds bytes not read yet.
func unread(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	if raw.Control(func(fd uintptr) { n, _ = socketUnread(fd) }) != nil {
		return false
	}
	return n > 0
}
