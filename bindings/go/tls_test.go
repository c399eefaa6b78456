package shardlimit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startTLSRedis starts a redis-server that also listens for TLS on a second free port and
// requires a client certificate signed by a CA made for the test (tests/tls/gen-certs.sh).
// It returns the TLS port and the certificate directory; both go away when the test ends.
func startTLSRedis(t *testing.T) (int, string) {
	t.Helper()
	certs := t.TempDir()
	gen := repoPath(t, "tests/tls/gen-certs.sh")
	if out, err := exec.Command("sh", gen, certs).CombinedOutput(); err != nil {
		t.Fatalf("gen-certs.sh: %v\n%s", err, out)
	}
	port, tlsPort := freePort(t), freePort(t)
	cmd := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", certs,
		"--tls-port", fmt.Sprint(tlsPort), "--tls-auth-clients", "yes",
		"--tls-cert-file", filepath.Join(certs, "server.crt"),
		"--tls-key-file", filepath.Join(certs, "server.key"),
		"--tls-ca-cert-file", filepath.Join(certs, "ca.crt"))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("redis-server must be installed: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// readiness, not a race: the plain port answers once every listener is bound
	deadline := time.Now().Add(10 * time.Second)
	for !ping(port) {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not start on port %d", port)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return tlsPort, certs
}

func tlsConfig(port int, tls string) string {
	return fmt.Sprintf(`{"timeout_ms": 2000,
		"shards": [{"name": "s0", "url": "rediss://127.0.0.1:%d", "tls": %s}],
		"policies": {
		  "strict": {"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "error"},
		  "closed": {"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "closed"}}}`,
		port, tls)
}

func TestDecisionsOverTLS(t *testing.T) {
	port, certs := startTLSRedis(t)
	path := func(name string) string { return filepath.Join(certs, name) }
	ctx := context.Background()

	lim, err := NewFromJSON(tlsConfig(port, fmt.Sprintf(`{"ca_file": %q, "cert_file": %q, "key_file": %q}`,
		path("ca.crt"), path("client.crt"), path("client.key"))))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	d, err := lim.Check(ctx, "tls-user", "strict", 1)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.Source != SourceRedis || d.Remaining != 4 {
		t.Fatalf("verified mTLS: %+v", d)
	}

	// a wrong CA, and no client certificate: ErrConnection, and on_error decides
	for _, ca := range []string{"other-ca.crt", "ca.crt"} {
		l, err := NewFromJSON(tlsConfig(port, fmt.Sprintf(`{"ca_file": %q}`, path(ca))))
		if err != nil {
			t.Fatal(err)
		}
		_, err = l.Check(ctx, "k", "strict", 1)
		if !errors.Is(err, ErrConnection) || !strings.Contains(err.Error(), "shard `s0`") {
			t.Fatalf("%s: want a connection error, got %v", ca, err)
		}
		d, err := l.Check(ctx, "k", "closed", 1)
		if err != nil || d.Allowed || d.Source != SourceFallback {
			t.Fatalf("%s: on_error closed: %+v, %v", ca, d, err)
		}
		_ = l.Close()
	}
}
