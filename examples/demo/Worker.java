// The Java worker of `make demo` (see examples/demo/README.md): sends a fixed number of checks
// over a shared set of (policy, key) pairs and prints one JSON line with what was admitted; the
// Rust, Python, Node and Go workers do exactly the same.
//
//   java -cp shardlimit.jar:CLASSES Worker --config CONFIG.json [--requests 2400]
//       [--concurrency 16] [--keys 8] [--policies billing,demo_daily,demo_burst] [--instance 4]
//       [--barrier]
//
// Check j goes to pair (j + 7 * instance) % pairs.length, pairs being every policy x keys
// user:0..keys. --barrier waits for standard input to close before sending (the demo starts
// every worker, then releases them together). Progress goes to stderr as `progress DONE/TOTAL`.
// The callers are platform threads making blocking checks (`check` waits on the decision's
// future; no thread is held by the library while Redis answers).

import io.shardlimit.Decision;
import io.shardlimit.Limiter;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLongArray;

public final class Worker {
    public static void main(String[] args) throws Exception {
        Map<String, String> o = new LinkedHashMap<>(Map.of("requests", "2400", "concurrency", "16", "keys", "8",
                "policies", "billing,demo_daily,demo_burst", "instance", "4"));
        boolean barrier = false;
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (a.equals("--barrier")) {
                barrier = true;
            } else if (a.startsWith("--") && i + 1 < args.length) {
                o.put(a.substring(2), args[++i]);
            } else {
                System.err.println("Worker: unexpected argument " + a);
                System.exit(2);
            }
        }
        if (!o.containsKey("config")) {
            System.err.println("Worker: --config is required");
            System.exit(2);
        }
        int requests = Integer.parseInt(o.get("requests"));
        int concurrency = Integer.parseInt(o.get("concurrency"));
        int instance = Integer.parseInt(o.get("instance"));
        String[] policies = o.get("policies").split(",");
        List<String[]> pairs = new ArrayList<>();
        for (String p : policies) {
            for (int k = 0; k < Integer.parseInt(o.get("keys")); k++) {
                pairs.add(new String[] {p, "user:" + k});
            }
        }

        try (Limiter limiter = Limiter.fromConfigFile(Path.of(o.get("config")))) {
            // an unknown policy fails now; the peek also opens the shard connections
            for (String p : policies) {
                limiter.peek("demo:unused", p);
            }
            System.err.println("ready");
            if (barrier) {
                while (System.in.read() >= 0) {
                    // until the demo closes our standard input
                }
            }

            AtomicLongArray perKey = new AtomicLongArray(pairs.size());
            AtomicLongArray tally = new AtomicLongArray(4); // allowed, denied, fallback, errors
            AtomicInteger next = new AtomicInteger();
            AtomicInteger done = new AtomicInteger();
            int step = Math.max(1, requests / 20);
            long started = System.nanoTime();
            List<Thread> callers = new ArrayList<>();
            for (int c = 0; c < concurrency; c++) {
                Thread t = new Thread(() -> {
                    for (int j; (j = next.getAndIncrement()) < requests; ) {
                        int pair = (j + 7 * instance) % pairs.size();
                        String[] pk = pairs.get(pair);
                        try {
                            Decision d = limiter.check(pk[1], pk[0]);
                            if (d.source().equals("fallback") || d.source().equals("local_fallback")) {
                                tally.incrementAndGet(2);
                            } else if (d.allowed()) {
                                tally.incrementAndGet(0);
                                perKey.incrementAndGet(pair);
                            } else {
                                tally.incrementAndGet(1);
                            }
                        } catch (RuntimeException e) {
                            if (tally.getAndIncrement(3) == 0) {
                                System.err.println("java worker: " + e.getMessage());
                            }
                        }
                        int n = done.incrementAndGet();
                        if (n % step == 0) {
                            System.err.println("progress " + n + "/" + requests);
                        }
                    }
                });
                t.start();
                callers.add(t);
            }
            for (Thread t : callers) {
                t.join();
            }
            long elapsedMs = Math.round((System.nanoTime() - started) / 1e6);

            StringBuilder keys = new StringBuilder();
            for (int i = 0; i < pairs.size(); i++) {
                keys.append(i == 0 ? "" : ",").append('"').append(pairs.get(i)[0]).append('/')
                        .append(pairs.get(i)[1]).append("\":").append(perKey.get(i));
            }
            System.out.printf("{\"language\":\"java\",\"instance\":%d,\"engine\":\"%s\",\"sent\":%d,\"allowed\":%d,"
                            + "\"denied\":%d,\"fallback\":%d,\"errors\":%d,\"elapsed_ms\":%d,\"per_key\":{%s}}%n",
                    instance, limiter.isRedis() ? "redis" : "memory", requests, tally.get(0), tally.get(1),
                    tally.get(2), tally.get(3), elapsedMs, keys);
        }
    }
}
