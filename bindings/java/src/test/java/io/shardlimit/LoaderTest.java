package io.shardlimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/** The native loader, in JVMs of their own (a library loads once per JVM). */
class LoaderTest {
    record Run(int code, String out) {}

    static Run probe(String... props) throws IOException, InterruptedException {
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        cmd.add("--enable-native-access=ALL-UNNAMED");
        cmd.add("-cp");
        cmd.add(System.getProperty("java.class.path"));
        for (String p : props) {
            cmd.add("-D" + p);
        }
        cmd.add("io.shardlimit.LoaderProbe");
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertTrue(p.waitFor(60, TimeUnit.SECONDS));
        return new Run(p.exitValue(), out);
    }

    static boolean jarHasNatives() {
        return LoaderTest.class.getResource("/natives/" + NativeLoader.platform() + "/"
                + System.mapLibraryName("shardlimit_jni")) != null;
    }

    @Test
    void aMissingExplicitPathIsNamed() throws Exception {
        Run r = probe("shardlimit.native.path=/nonexistent/libshardlimit_jni.so");
        assertEquals(3, r.code(), r.out());
        assertTrue(r.out().contains("shardlimit.native.path=/nonexistent/libshardlimit_jni.so is not a file"), r.out());
    }

    @Test
    void theLibraryIsExtractedUnderItsHashAndReused() throws Exception {
        Assumptions.assumeTrue(jarHasNatives(), "no natives/ on the class path (the dev loop loads a path)");
        Path dir = Files.createTempDirectory("shardlimit-loader-");
        try {
            for (int i = 0; i < 2; i++) {
                Run r = probe("shardlimit.native.path=", "shardlimit.native.dir=" + dir);
                assertEquals(0, r.code(), r.out());
                assertTrue(r.out().contains("allowed=true"), r.out());
                assertTrue(r.out().contains("loaded=" + dir + "/shardlimit-"), r.out());
            }
            try (var s = Files.list(dir)) {
                assertEquals(1, s.count(), "one copy, reused by the second JVM");
            }
        } finally {
            try (var s = Files.list(dir)) {
                for (Path f : s.toList()) {
                    Files.delete(f);
                }
            }
            Files.delete(dir);
        }
    }

    /** A folder mounted noexec (scripts/test-java.sh mounts one when it may): the error says so. */
    @Test
    void aNoexecFolderIsNamedInTheError() throws Exception {
        String dir = System.getProperty("shardlimit.test.noexec.dir", "");
        Assumptions.assumeTrue(!dir.isEmpty() && jarHasNatives(), "no noexec folder to try (needs a tmpfs mount)");
        Run r = probe("shardlimit.native.path=", "shardlimit.native.dir=" + dir);
        assertEquals(3, r.code(), r.out());
        assertTrue(r.out().contains("noexec"), r.out());
        assertTrue(r.out().contains("shardlimit.native.dir"), r.out());
    }
}
