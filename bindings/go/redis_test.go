package shardlimit

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// redisServer is a real redis-server on a free 127.0.0.1 port, owned by one test suite.
type redisServer struct {
	cmd  *exec.Cmd
	Port int
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// rawRedis sends request (a whole command in RESP, CRLF included) to redis-server on
// port, connecting within 1 s, and returns the connection (the caller closes it), with
// everything on it due within d, and a reader of the reply.
func rawRedis(port int, d time.Duration, request string) (net.Conn, *bufio.Reader, error) {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return nil, nil, err
	}
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte(request)); err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, bufio.NewReader(c), nil
}

func ping(port int) bool {
	c, r, err := rawRedis(port, time.Second, "PING\r\n")
	if err != nil {
		return false
	}
	defer c.Close()
	line, err := r.ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// serverPID is the process_id of the server answering on port (0 when none answers).
func serverPID(port int) int {
	c, r, err := rawRedis(port, time.Second, "INFO server\r\n")
	if err != nil {
		return 0
	}
	defer c.Close()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return 0
		}
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			var pid int
			if _, err := fmt.Sscan(strings.TrimSpace(v), &pid); err != nil {
				return 0
			}
			return pid
		}
	}
}

// startRedis starts redis-server and stops it when the test (or benchmark) ends. A port
// found free may be taken before the server binds it (the kernel hands a released port
// out again, and other test binaries run at the same time): the server then exits, and
// starts again on another port. It is ready when its own process answers.
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	for try := 0; try < 10; try++ {
		port := freePort(t)
		cmd := exec.Command(serverBinary(), "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", os.TempDir())
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatalf("redis-server must be installed: %v", err)
		}
		exited := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(exited)
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-exited
		})
		// readiness, not a race: poll until it answers, for at most 10 s
		deadline := time.Now().Add(10 * time.Second)
		for serverPID(port) != cmd.Process.Pid {
			select {
			case <-exited:
			default:
				if time.Now().After(deadline) {
					t.Fatalf("redis-server did not start on port %d", port)
				}
				time.Sleep(20 * time.Millisecond)
				continue
			}
			break
		}
		select {
		case <-exited: // it could not listen on the port: another one
		default:
			return &redisServer{cmd: cmd, Port: port}
		}
	}
	t.Fatal("no free port for redis-server after 10 tries")
	return nil
}

// config is a one-shard config on s with the given policies (a JSON object body).
func (s *redisServer) config(policies string) string {
	return fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":2000,"policies":{%s}}`,
		s.Port, policies)
}

// inRepository reports whether this package is the bindings/go of a shardlimit
// repository checkout (not the module as `go get` unpacks it into the module cache, which
// holds bindings/go only).
func inRepository() bool {
	for _, f := range []string{"../../core/Cargo.toml", "../../spec/operations.json", "../../bindings/go/go.mod"} {
		if _, err := os.Stat(f); err != nil {
			return false
		}
	}
	return true
}

// repoPath is rel, a path from the repository's root, as this package's tests reach it:
// the shared vectors, the spec tables, the TLS test CA script. Outside a repository
// checkout the test is skipped, saying what it needs; inside one, a missing file is the
// test's failure.
func repoPath(t testing.TB, rel string) string {
	t.Helper()
	if !inRepository() {
		t.Skipf("needs %s of the shardlimit repository, which the Go module does not hold", rel)
	}
	return filepath.Join("..", "..", filepath.FromSlash(rel))
}

// serverBinary is the server the tests start: $SHARDLIMIT_REDIS_SERVER when set (a
// valkey-server: scripts/test-valkey.sh), else redis-server.
func serverBinary() string {
	if s := os.Getenv("SHARDLIMIT_REDIS_SERVER"); s != "" {
		return s
	}
	return "redis-server"
}
