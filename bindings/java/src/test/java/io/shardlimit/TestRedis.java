package io.shardlimit;

/** RedisServer for tests of other packages. */
public final class TestRedis implements AutoCloseable {
    private final RedisServer server;

    private TestRedis(RedisServer server) {
        this.server = server;
    }

    public static TestRedis start() throws Exception {
        return new TestRedis(RedisServer.start());
    }

    public String config(String policiesJson, String extra) {
        return server.config(policiesJson, extra);
    }

    @Override
    public void close() throws Exception {
        server.close();
    }
}
