package io.shardlimit;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Map;

/** Where the repository's shared files are (spec/, tests/vectors). */
final class Vectors {
    private Vectors() {}

    static Path root() {
        String r = System.getProperty("shardlimit.root");
        return (r == null || r.isEmpty() ? Paths.get("../..") : Paths.get(r)).toAbsolutePath().normalize();
    }

    static Map<String, Object> read(String relative) throws IOException {
        return Json.object(Files.readString(root().resolve(relative)));
    }
}
