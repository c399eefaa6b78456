package shardlimit

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
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

func ping(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// startRedis starts redis-server and stops it when the test (or benchmark) ends.
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	port := freePort(t)
	cmd := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", os.TempDir())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("redis-server must be installed: %v", err)
	}
	s := &redisServer{cmd: cmd, Port: port}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// readiness, not a race: poll until it answers, for at most 10 s
	deadline := time.Now().Add(10 * time.Second)
	for !ping(port) {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not start on port %d", port)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

// config is a one-shard config on s with the given policies (a JSON object body).
func (s *redisServer) config(policies string) string {
	return fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":2000,"policies":{%s}}`,
		s.Port, policies)
}
