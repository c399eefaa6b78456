import io.shardlimit.Decision;
import io.shardlimit.Limiter;
import java.lang.management.ManagementFactory;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A bounded throughput probe (not part of the suite): `n` async checks with `inFlight` at once
 * on `keys` keys of one Redis, after a warm-up; prints decisions/s and client CPU µs per
 * decision. Usage: java -cp <jar>:. Bench redis://127.0.0.1:PORT keys n inFlight
 */
public final class Bench {
    public static void main(String[] a) throws Exception {
        String url = a[0];
        int keys = Integer.parseInt(a[1]);
        int n = Integer.parseInt(a[2]);
        int inFlight = Integer.parseInt(a[3]);
        String cfg = "{\"shards\":[{\"name\":\"s0\",\"url\":\"" + url + "\"}],\"on_error\":\"error\","
                + "\"policies\":{\"p\":{\"algorithm\":\"sliding_window\",\"limit\":1000000000,\"window\":\"1m\"}}}";
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        try (Limiter l = Limiter.fromJson(cfg)) {
            for (int round = 0; round < 2; round++) {
                Semaphore s = new Semaphore(inFlight);
                AtomicLong redis = new AtomicLong();
                long cpu0 = os.getProcessCpuTime();
                long t0 = System.nanoTime();
                CompletableFuture<?>[] all = new CompletableFuture<?>[n];
                for (int i = 0; i < n; i++) {
                    s.acquire();
                    all[i] = l.checkAsync("k" + (i % keys), "p").whenComplete((d, e) -> {
                        if (d != null && d.source().equals("redis")) {
                            redis.incrementAndGet();
                        }
                        s.release();
                    });
                }
                CompletableFuture.allOf(all).join();
                double secs = (System.nanoTime() - t0) / 1e9;
                double cpuUs = (os.getProcessCpuTime() - cpu0) / 1e3 / n;
                System.out.printf("%s: %d keys, %d in flight: %.0f decisions/s, %.1f us client CPU/decision, %d from redis%n",
                        round == 0 ? "warm-up" : "measured", keys, inFlight, n / secs, cpuUs, redis.get());
            }
        }
    }
}
