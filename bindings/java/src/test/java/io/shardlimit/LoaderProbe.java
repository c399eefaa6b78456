package io.shardlimit;

/** Loads the library in a JVM of its own (LoaderTest): prints where from, or the error. */
public final class LoaderProbe {
    private LoaderProbe() {}

    public static void main(String[] args) {
        try {
            System.out.println("allowed=" + Limiter.memory().checkAsync("k", "p").handle((d, e) -> e == null).join());
            System.out.println("loaded=" + NativeLoader.loadedFrom());
        } catch (Throwable t) {
            System.out.println("error=" + t);
            System.exit(3);
        }
    }
}
