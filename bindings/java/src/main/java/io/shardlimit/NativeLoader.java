package io.shardlimit;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Locale;

/**
 * Loads the native library. In order:
 * <ol>
 *   <li>{@code -Dshardlimit.native.path=/path/to/libshardlimit_jni.so}: that file;</li>
 *   <li>else the library for this platform inside the jar, {@code natives/<os>-<arch>/}
 *       ({@code linux-x86_64}, {@code linux-aarch64}, {@code osx-aarch64}, {@code windows-x86_64}...),
 *       extracted into {@code -Dshardlimit.native.dir} (default: {@code java.io.tmpdir}) under a
 *       name carrying its SHA-256, so that two versions, or two JVMs, never overwrite each
 *       other's copy, and loaded from there.</li>
 * </ol>
 * A folder mounted {@code noexec} cannot hold a library the JVM can map: the error says so and
 * names the properties that avoid it.
 */
public final class NativeLoader {
    /** The system property naming the library file to load, skipping extraction. */
    public static final String PATH_PROPERTY = "shardlimit.native.path";
    /** The system property naming the folder to extract the library into. */
    public static final String DIR_PROPERTY = "shardlimit.native.dir";

    private static boolean loaded;
    private static String loadedFrom;

    private NativeLoader() {}

    /** The platform folder of this JVM: {@code <os>-<arch>}. */
    public static String platform() {
        String os = System.getProperty("os.name", "").toLowerCase(Locale.ROOT);
        String arch = System.getProperty("os.arch", "").toLowerCase(Locale.ROOT);
        String o = os.startsWith("linux") ? "linux"
                : os.startsWith("mac") || os.startsWith("darwin") ? "osx"
                : os.startsWith("windows") ? "windows"
                : os.replaceAll("[^a-z0-9]", "");
        String a = switch (arch) {
            case "amd64", "x86_64", "x64" -> "x86_64";
            case "aarch64", "arm64" -> "aarch64";
            default -> arch.replaceAll("[^a-z0-9_]", "");
        };
        return o + "-" + a;
    }

    /** Where the library was loaded from (null before). */
    public static synchronized String loadedFrom() {
        return loadedFrom;
    }

    /** Loads the library once (called by the binding's classes). */
    public static synchronized void load() {
        if (loaded) {
            return;
        }
        String explicit = System.getProperty(PATH_PROPERTY);
        if (explicit != null && !explicit.isEmpty()) {
            Path p = Paths.get(explicit).toAbsolutePath();
            if (!Files.isRegularFile(p)) {
                throw new UnsatisfiedLinkError("shardlimit: -D" + PATH_PROPERTY + "=" + explicit + " is not a file");
            }
            systemLoad(p);
            return;
        }
        String name = System.mapLibraryName("shardlimit_jni");
        String resource = "/natives/" + platform() + "/" + name;
        byte[] bytes;
        try (InputStream in = NativeLoader.class.getResourceAsStream(resource)) {
            if (in == null) {
                throw new UnsatisfiedLinkError("shardlimit: this jar has no native library for " + platform()
                        + " (no " + resource + "); build one (cargo build -p shardlimit-java) and pass -D"
                        + PATH_PROPERTY + "=<its path>");
            }
            bytes = in.readAllBytes();
        } catch (IOException e) {
            throw link("could not read " + resource + ": " + e, e);
        }
        Path dir = Paths.get(System.getProperty(DIR_PROPERTY, System.getProperty("java.io.tmpdir")));
        Path target = dir.resolve("shardlimit-" + sha256(bytes).substring(0, 16) + "-" + name);
        try {
            Files.createDirectories(dir);
            if (!Files.isRegularFile(target) || Files.size(target) != bytes.length
                    || !sha256(Files.readAllBytes(target)).equals(sha256(bytes))) {
                Path tmp = Files.createTempFile(dir, "shardlimit-", ".tmp");
                try {
                    Files.write(tmp, bytes);
                    try {
                        Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
                    } catch (AtomicMoveNotSupportedException e) {
                        Files.move(tmp, target, StandardCopyOption.REPLACE_EXISTING);
                    }
                } finally {
                    Files.deleteIfExists(tmp);
                }
            }
        } catch (IOException e) {
            throw link("could not extract the native library into " + dir + ": " + e + "; set -D" + DIR_PROPERTY
                    + "=<a writable folder> or -D" + PATH_PROPERTY + "=<the library>", e);
        }
        systemLoad(target);
    }

    private static void systemLoad(Path p) {
        try {
            System.load(p.toString());
        } catch (UnsatisfiedLinkError e) {
            String m = String.valueOf(e.getMessage());
            String why = m.contains("failed to map segment") || m.contains("Operation not permitted")
                    || m.contains("Permission denied")
                    ? " The folder " + p.getParent() + " is probably mounted noexec (a library in it cannot be"
                            + " mapped executable): set -D" + DIR_PROPERTY + "=<a folder on an exec mount> or -D"
                            + PATH_PROPERTY + "=<the library file>."
                    : "";
            UnsatisfiedLinkError err = new UnsatisfiedLinkError("shardlimit: could not load " + p + ": " + m + "." + why);
            err.initCause(e);
            throw err;
        }
        loaded = true;
        loadedFrom = p.toString();
    }

    private static UnsatisfiedLinkError link(String message, Throwable cause) {
        UnsatisfiedLinkError e = new UnsatisfiedLinkError("shardlimit: " + message);
        e.initCause(cause);
        return e;
    }

    private static String sha256(byte[] b) {
        try {
            StringBuilder s = new StringBuilder();
            for (byte x : MessageDigest.getInstance("SHA-256").digest(b)) {
                s.append(String.format("%02x", x));
            }
            return s.toString();
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }
}
