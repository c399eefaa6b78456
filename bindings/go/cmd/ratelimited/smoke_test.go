package main

// Smoke test of the ratelimited command: a real redis-server and the real command (this
// test binary re-executed as `ratelimited`), each on a free 127.0.0.1 port, and real HTTP
// requests over loopback.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain runs main() instead of the tests when re-executed by startService.
func TestMain(m *testing.M) {
	if os.Getenv("RATELIMITED_SMOKE_RUN_MAIN") == "1" {
		os.Args = append([]string{"ratelimited"}, strings.Fields(os.Getenv("RATELIMITED_SMOKE_ARGS"))...)
		main()
		return
	}
	os.Exit(m.Run())
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitFor polls until ready() or 20 s pass: a bounded wait for a server to accept.
func waitFor(t *testing.T, what string, exited <-chan error, ready func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ready() {
		select {
		case err := <-exited:
			t.Fatalf("%s exited before it was ready: %v", what, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not start in 20 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func start(t *testing.T, what string, cmd *exec.Cmd, ready func() bool) {
	t.Helper()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	waitFor(t, what, exited, ready)
}

func TestSmokeRatelimited(t *testing.T) {
	redisPort := freePort(t)
	start(t, "redis-server", exec.Command("redis-server", "--port", strconv.Itoa(redisPort),
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir()),
		func() bool {
			c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", redisPort), time.Second)
			if err != nil {
				return false
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte("PING\r\n"))
			line, err := bufio.NewReader(c).ReadString('\n')
			return err == nil && strings.HasPrefix(line, "+PONG")
		})

	// sliding_log: exact, and no window boundary can fall inside the test
	config := fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":2000,`+
		`"policies":{"api":{"algorithm":"sliding_log","limit":3,"window":"1h"}}}`, redisPort)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	svc := exec.Command(self)
	svc.Env = append(os.Environ(), "RATELIMITED_SMOKE_RUN_MAIN=1", "SHARDLIMIT_CONFIG="+config,
		"RATELIMITED_SMOKE_ARGS=-addr "+addr+" -policy api")
	start(t, "ratelimited", svc, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	client := &http.Client{Timeout: 5 * time.Second}
	get := func() (*http.Response, string) {
		t.Helper()
		res, err := client.Get("http://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res, string(body)
	}
	for _, remaining := range []int{2, 1, 0} {
		res, body := get()
		if res.StatusCode != 200 || body != "hello\n" {
			t.Fatalf("want 200 hello, got %d %q", res.StatusCode, body)
		}
		h := res.Header
		if h.Get("X-RateLimit-Limit") != "3" || h.Get("X-RateLimit-Remaining") != strconv.Itoa(remaining) {
			t.Fatalf("headers: %v", h)
		}
		if h.Get("RateLimit-Policy") != `"api";q=3;w=3600` ||
			!regexp.MustCompile(fmt.Sprintf(`^"api";r=%d;t=\d+$`, remaining)).MatchString(h.Get("RateLimit")) ||
			h.Get("Retry-After") != "" {
			t.Fatalf("headers: %v", h)
		}
	}
	for i := 0; i < 2; i++ {
		res, body := get()
		if res.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("want 429, got %d %q", res.StatusCode, body)
		}
		if !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("content type %q", res.Header.Get("Content-Type"))
		}
		if retry, err := strconv.Atoi(res.Header.Get("Retry-After")); err != nil || retry <= 0 || retry > 3600 {
			t.Fatalf("Retry-After %q", res.Header.Get("Retry-After"))
		}
		if res.Header.Get("X-RateLimit-Remaining") != "0" {
			t.Fatalf("headers: %v", res.Header)
		}
		var b struct {
			Error      string  `json:"error"`
			Policy     string  `json:"policy"`
			Limit      int     `json:"limit"`
			Remaining  int     `json:"remaining"`
			RetryAfter float64 `json:"retry_after"`
		}
		if err := json.Unmarshal([]byte(body), &b); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		if b.Error != "rate_limited" || b.Policy != "api" || b.Limit != 3 || b.Remaining != 0 || b.RetryAfter <= 0 {
			t.Fatalf("body %q", body)
		}
	}
}
