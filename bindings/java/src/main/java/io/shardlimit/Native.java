package io.shardlimit;

import java.util.concurrent.Executor;

/**
 * The JNI entry points of the native library ({@code libshardlimit_jni}), and the three
 * methods the library calls back: {@link #deliver}, {@link #event} and {@link #error}.
 * Keys, names and paths cross as UTF-8 {@code byte[]}.
 */
final class Native {
    static {
        NativeLoader.load();
    }

    private Native() {}

    // construction (a handle of 0 means an exception is pending)
    static native long memory(long clock);

    static native long fromJson(byte[] json, long clock);

    static native long fromConfigFile(byte[] path, long clock);

    static native long fromEnv(long clock);

    static native void free(long handle);

    static native long clockNew(long startUs);

    /** Sets ({@code advance} false) or advances the clock; {@code -1}: read only. Returns the time. */
    static native long clockSet(long clock, long us, boolean advance);

    static native void clockFree(long clock);

    // calls that complete a Call
    static final int CHECK = 0, PEEK = 1, SHADOW = 2, CHARGE = 3, REFUND = 4, RESET = 5;

    static native void check(long h, byte[] key, byte[] policy, byte[] plan, long n, int mode, Call<?> call);

    static native void checkAll(long h, byte[][] keys, byte[][] policies, long[] costs, Call<?> call);

    static native void acquire(long h, byte[] key, byte[] policy, long units, Call<?> call);

    static native void release(long h, byte[] key, byte[] policy, byte[] id, long units, Call<?> call);

    static native void reserve(long h, byte[] key, byte[] policy, long estimate, Call<?> call);

    static native void settle(long h, byte[] key, byte[] policy, long units, long atUs, long actual, Call<?> call);

    static final int BLOCK = 0, UNBLOCK = 1, BLOCKED = 2;

    static native void blockList(long h, int op, byte[] key, byte[] reason, long ttlUs, Call<?> call);

    static final int SET_OVERRIDE = 0, GET_OVERRIDE = 1, DELETE_OVERRIDE = 2, LIST_OVERRIDES = 3, SHADOW_REPORT = 4;

    static native void admin(long h, int op, byte[] key, byte[] policy, byte[] limit, long n, Call<?> call);

    static native void connect(long h, long timeoutUs, Call<?> call);

    // synchronous
    static final int INFO_CONFIG = 0, INFO_POLICY = 1, INFO_PLAN_POLICY = 2, INFO_ROUTE = 3, INFO_METRICS = 4,
            INFO_METRICS_SNAPSHOT = 5, INFO_STATE = 6;

    static native String info(long h, int what, byte[] a, byte[] b);

    static native String reload(long h, byte[] arg, boolean file);

    static native long watchConfig(long h, byte[] path, long everyUs);

    static native void unwatch(long watcher);

    static native double scale(long h, double factor, byte[][] policies, boolean observe);

    static native void latencyScale(long h, long targetMicros, double minFactor);

    static native void subscribe(long h, Object sink);

    static native void setLogSink(long h, Object sink);

    static native Object render(boolean allowed, long limit, long remaining, long resetAfterUs, long retryAfterUs,
            String policy, int source, boolean shadowDenied, int limitIndex, long[] quotas, long windowUs,
            boolean body);

    static native String clientIpKey(byte[] peer, byte[] xff, byte[][] trusted, int ipv6Prefix);

    static native String errorKinds();

    static native void panicForTest();

    // called by the library ------------------------------------------------------------

    /** Completes a call: on the calling thread when {@code inline}, else from an I/O thread. */
    static void deliver(Call<?> call, Object value, int code, String message, boolean inline) {
        call.deliver(value, code, message, inline);
    }

    /** An event or log line for a sink, from whatever thread the core emitted it on. */
    static void event(Object sink, String kind, String json) {
        ((Sink) sink).offer(kind, json);
    }

    /** The exception of a core error kind. */
    static RuntimeException error(int code, String message) {
        return ShardlimitException.of(code, message);
    }

    /** Where events and log lines go: a bounded queue drained on an executor. */
    static final class Sink {
        static final int MAX_PENDING = 1024;
        private final java.util.concurrent.atomic.AtomicInteger pending = new java.util.concurrent.atomic.AtomicInteger();
        private final java.util.concurrent.atomic.AtomicLong dropped = new java.util.concurrent.atomic.AtomicLong();
        private final java.util.function.BiConsumer<String, String> target;
        private final java.util.function.Supplier<Executor> executor;

        Sink(java.util.function.Supplier<Executor> executor, java.util.function.BiConsumer<String, String> target) {
            this.executor = executor;
            this.target = target;
        }

        void offer(String kind, String json) {
            if (pending.incrementAndGet() > MAX_PENDING) {
                pending.decrementAndGet();
                dropped.incrementAndGet();
                return;
            }
            try {
                executor.get().execute(() -> {
                    pending.decrementAndGet();
                    try {
                        target.accept(kind, json);
                    } catch (RuntimeException e) {
                        // a listener's failure is its own; the limiter goes on
                    }
                });
            } catch (RuntimeException e) {
                pending.decrementAndGet();
                dropped.incrementAndGet();
            }
        }

        long dropped() {
            return dropped.get();
        }
    }
}
