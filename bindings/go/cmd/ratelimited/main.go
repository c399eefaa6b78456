// Command ratelimited is a tiny HTTP service limited by shardlimit:
//
//	SHARDLIMIT_CONFIG=../../shard-config.json go run ./cmd/ratelimited -policy api -addr 127.0.0.1:8080
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"

	shardlimit "github.com/shardlimit/shardlimit/bindings/go"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	policy := flag.String("policy", "api", "policy name in $SHARDLIMIT_CONFIG")
	flag.Parse()

	limiter, err := shardlimit.NewFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	defer limiter.Close()

	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})
	// connects to every shard before serving: the first requests are decided by Redis, and
	// a shard that does not answer stops the start-up with its name
	limit, err := shardlimit.NewMiddleware(context.Background(), shardlimit.MiddlewareOptions{Limiter: limiter, Policy: *policy})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/", limit(hello))
	log.Printf("listening on %s (shardlimit %s)", *addr, shardlimit.Version())
	log.Fatal(http.ListenAndServe(*addr, nil))
}
