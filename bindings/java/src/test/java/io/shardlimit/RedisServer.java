package io.shardlimit;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A real redis-server on a free 127.0.0.1 port for one test class, stopped by close().
 * Readiness is read from the server's own log line, not guessed with a sleep; a port found
 * free but taken before the server binds it makes the server exit, and it starts again on
 * another port.
 */
final class RedisServer implements AutoCloseable {
    final int port;
    private final Process process;
    private final Path dir;

    private RedisServer(int port, Process process, Path dir) {
        this.port = port;
        this.process = process;
        this.dir = dir;
    }

    static RedisServer start() throws IOException, InterruptedException {
        for (int attempt = 0; attempt < 10; attempt++) {
            int port;
            try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getByName("127.0.0.1"))) {
                port = s.getLocalPort();
            }
            Path dir = Files.createTempDirectory("shardlimit-java-redis-");
            List<String> cmd = new ArrayList<>(List.of("redis-server", "--port", String.valueOf(port), "--bind",
                    "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir.toString()));
            Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
            BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
            StringBuilder log = new StringBuilder();
            String line;
            boolean ready = false;
            while ((line = r.readLine()) != null) {
                log.append(line).append('\n');
                if (line.contains("Ready to accept connections")) {
                    ready = true;
                    break;
                }
            }
            if (ready) {
                // keep draining the log so the server never blocks on a full pipe
                Thread drain = new Thread(() -> {
                    try {
                        while (r.readLine() != null) {
                            // discard
                        }
                    } catch (IOException e) {
                        // the server is gone
                    }
                }, "redis-log");
                drain.setDaemon(true);
                drain.start();
                return new RedisServer(port, p, dir);
            }
            p.waitFor(5, TimeUnit.SECONDS);
            deleteTree(dir);
            if (!log.toString().contains("Address already in use")) {
                throw new IOException("redis-server exited before it was ready:\n" + log);
            }
        }
        throw new IOException("no free port for redis-server after 10 tries");
    }

    String url() {
        return "redis://127.0.0.1:" + port;
    }

    /** A config of these policies (JSON text of the `policies` object) on this server. */
    String config(String policiesJson, String extra) {
        return "{\"shards\":[{\"name\":\"s0\",\"url\":\"" + url() + "\"}],\"on_error\":\"error\",\"timeout_ms\":2000,"
                + "\"policies\":" + policiesJson + (extra == null || extra.isEmpty() ? "" : "," + extra) + "}";
    }

    /** Runs redis-cli against this server. */
    String cli(String... args) throws IOException, InterruptedException {
        List<String> cmd = new ArrayList<>(List.of("redis-cli", "-h", "127.0.0.1", "-p", String.valueOf(port)));
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).trim();
        p.waitFor(10, TimeUnit.SECONDS);
        return out;
    }

    @Override
    public void close() throws IOException, InterruptedException {
        process.destroy();
        if (!process.waitFor(5, TimeUnit.SECONDS)) {
            process.destroyForcibly();
            process.waitFor();
        }
        deleteTree(dir);
    }

    private static void deleteTree(Path dir) throws IOException {
        if (!Files.exists(dir)) {
            return;
        }
        try (var s = Files.walk(dir)) {
            s.sorted(java.util.Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
        }
    }
}
