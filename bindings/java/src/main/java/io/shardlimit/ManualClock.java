package io.shardlimit;

import java.lang.ref.Cleaner;

/** A clock that moves only when told to, for deterministic tests and replays (µs since the Unix epoch). */
public final class ManualClock {
    private static final Cleaner CLEANER = Cleaner.create();
    final long handle;

    public ManualClock(long startMicros) {
        long h = Native.clockNew(startMicros);
        this.handle = h;
        CLEANER.register(this, () -> Native.clockFree(h));
    }

    public ManualClock() {
        this(0);
    }

    public void setMicros(long us) {
        Native.clockSet(handle, us, false);
    }

    public void advanceMicros(long us) {
        Native.clockSet(handle, us, true);
    }

    public long nowMicros() {
        return Native.clockSet(handle, -1, false);
    }
}
