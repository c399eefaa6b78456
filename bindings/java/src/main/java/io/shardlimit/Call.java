package io.shardlimit;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.Executor;
import java.util.concurrent.ForkJoinPool;
import java.util.concurrent.RejectedExecutionException;
import java.util.function.Function;

/**
 * The future of one native call. The library completes it through {@link Native#deliver}:
 * from an I/O thread, the completion (and so every callback the caller attached) runs on the
 * limiter's executor, never on the I/O thread.
 */
final class Call<T> extends CompletableFuture<T> {
    private final Function<Object, T> convert;
    private final Executor executor;

    Call(Executor executor, Function<Object, T> convert) {
        this.executor = executor;
        this.convert = convert;
    }

    void deliver(Object value, int code, String message, boolean inline) {
        Runnable complete = () -> {
            if (code != 0) {
                completeExceptionally(ShardlimitException.of(code, message));
                return;
            }
            try {
                complete(convert.apply(value));
            } catch (RuntimeException | Error e) {
                completeExceptionally(e);
            }
        };
        if (inline) {
            complete.run();
            return;
        }
        try {
            executor.execute(complete);
        } catch (RejectedExecutionException e) {
            // the caller's executor is shut down: complete on the common pool rather than never
            ForkJoinPool.commonPool().execute(complete);
        }
    }

    /** The blocking form of a call: {@code join()}, with the call's own exception thrown. */
    static <T> T await(CompletableFuture<T> future) {
        try {
            return future.join();
        } catch (CompletionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof RuntimeException r) {
                throw r;
            }
            if (cause instanceof Error err) {
                throw err;
            }
            throw e;
        }
    }
}
