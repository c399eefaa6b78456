package example;

import io.shardlimit.Decision;
import io.shardlimit.Limiter;
import io.shardlimit.NativeLoader;
import io.shardlimit.ShardlimitException;

/** Checks a limit in memory and, given a Redis URL, on Redis; prints what it saw. */
public final class Main {
    public static void main(String[] args) {
        String policies = "{\"api\":{\"algorithm\":\"fixed_window\",\"limit\":2,\"window\":\"1m\"}}";
        try (Limiter l = Limiter.fromJson("{\"policies\":" + policies + "}")) {
            l.check("k", "api");
            l.check("k", "api");
            Decision d = l.check("k", "api");
            System.out.println("memory: allowed=" + d.allowed() + " source=" + d.source() + " retry-after="
                    + d.headers().get("Retry-After"));
        }
        if (args.length > 0) {
            String cfg = "{\"shards\":[{\"name\":\"s0\",\"url\":\"" + args[0] + "\"}],\"on_error\":\"error\","
                    + "\"policies\":" + policies + "}";
            try (Limiter l = Limiter.fromJson(cfg)) {
                Decision d = l.checkAsync("k", "api").join();
                System.out.println("redis: allowed=" + d.allowed() + " source=" + d.source() + " remaining="
                        + d.remaining());
            }
        }
        try (Limiter l = Limiter.memory()) {
            l.check("k", "missing");
        } catch (ShardlimitException.UnknownPolicy e) {
            System.out.println("error: " + e.kind());
        }
        System.out.println("loaded from: " + NativeLoader.loadedFrom());
    }
}
