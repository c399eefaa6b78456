package io.shardlimit;

/** Loads the library in a JVM of its own (LoaderTest): prints where from, or the error. */
public final class LoaderProbe {
    private LoaderProbe() {}

    public static void main(String[] args) {
        try {
            String cfg = "{\"policies\":{\"p\":{\"algorithm\":\"fixed_window\",\"limit\":1,\"window\":\"1s\"}}}";
            try (Limiter l = Limiter.fromJson(cfg)) {
                System.out.println("allowed=" + l.check("k", "p").allowed());
            }
            System.out.println("loaded=" + NativeLoader.loadedFrom());
        } catch (Throwable t) {
            System.out.println("error=" + t);
            System.exit(3);
        }
    }
}
