package io.shardlimit;

/**
 * An error of shardlimit. Each kind of the core's error table ({@code spec/errors.json}) is a
 * subclass with a stable {@link #kind()} name and {@link #code()}; the kinds whose cause is a
 * Redis shard ({@code backend} in the table) extend {@link Backend}.
 */
public class ShardlimitException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final String kind;
    private final int code;

    ShardlimitException(String kind, int code, String message) {
        super(message);
        this.kind = kind;
        this.code = code;
    }

    /** The stable snake_case name of the kind ({@code config}, {@code timeout}, ...). */
    public String kind() {
        return kind;
    }

    /** The stable numeric code of the kind (the C binding's result code). */
    public int code() {
        return code;
    }

    static ShardlimitException of(int code, String message) {
        return switch (code) {
            case 1 -> new Config(message);
            case 2 -> new InvalidArgument(message);
            case 3 -> new Connection(message);
            case 4 -> new Timeout(message);
            case 5 -> new Script(message);
            case 7 -> new UnknownPolicy(message);
            case 8 -> new Io(message);
            case 10 -> new Unavailable(message);
            case 11 -> new Overloaded(message);
            default -> new Internal(message);
        };
    }

    /** The configuration is invalid: a field is missing, malformed or out of range. */
    public static class Config extends ShardlimitException {
        private static final long serialVersionUID = 1L;
        public Config(String message) { super("config", 1, message); }
    }

    /** An argument of a call is invalid (empty key, zero cost, ...). */
    public static class InvalidArgument extends ShardlimitException {
        private static final long serialVersionUID = 1L;
        public InvalidArgument(String message) { this("invalid_argument", 2, message); }
        InvalidArgument(String kind, int code, String message) { super(kind, code, message); }
    }

    /** A named policy does not exist in the configuration. */
    public static class UnknownPolicy extends InvalidArgument {
        private static final long serialVersionUID = 1L;
        public UnknownPolicy(String message) { super("unknown_policy", 7, message); }
    }

    /** Reading a file (a configuration) failed. */
    public static class Io extends ShardlimitException {
        private static final long serialVersionUID = 1L;
        public Io(String message) { super("io", 8, message); }
    }

    /** A bug in shardlimit: an invariant was broken (please report it). */
    public static class Internal extends ShardlimitException {
        private static final long serialVersionUID = 1L;
        public Internal(String message) { super("internal", 9, message); }
    }

    /**
     * More checks wait for a shard's connection in this process than its queue holds
     * ({@code max_queue}); the check was neither admitted nor sent to {@code on_error}.
     */
    public static class Overloaded extends ShardlimitException {
        private static final long serialVersionUID = 1L;
        public Overloaded(String message) { super("overloaded", 11, message); }
    }

    /** An error of a Redis shard (the kinds marked {@code backend} in the error table). */
    public abstract static class Backend extends ShardlimitException {
        private static final long serialVersionUID = 1L;
        Backend(String kind, int code, String message) { super(kind, code, message); }
    }

    /** A Redis shard could not be reached or the connection broke. */
    public static class Connection extends Backend {
        private static final long serialVersionUID = 1L;
        public Connection(String message) { super("connection", 3, message); }
    }

    /** A Redis shard did not answer within the deadline. */
    public static class Timeout extends Backend {
        private static final long serialVersionUID = 1L;
        public Timeout(String message) { super("timeout", 4, message); }
    }

    /** Redis answered with an error, or with a reply shardlimit does not trust. */
    public static class Script extends Backend {
        private static final long serialVersionUID = 1L;
        public Script(String message) { super("script", 5, message); }
    }

    /** A shard's circuit is open after repeated failures. */
    public static class Unavailable extends Backend {
        private static final long serialVersionUID = 1L;
        public Unavailable(String message) { super("unavailable", 10, message); }
    }
}
