package io.shardlimit;

/** Reloads a limiter whenever its configuration file changes, until closed. */
public final class ConfigWatcher implements AutoCloseable {
    private long handle;

    ConfigWatcher(long handle) {
        this.handle = handle;
    }

    @Override
    public synchronized void close() {
        long h = handle;
        handle = 0;
        Native.unwatch(h);
    }
}
