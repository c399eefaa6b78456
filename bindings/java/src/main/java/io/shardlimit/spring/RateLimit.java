package io.shardlimit.spring;

import java.lang.annotation.Documented;
import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

/**
 * Limits a Spring MVC handler method (or every handler of a controller class): each request
 * takes {@link #cost()} units of {@link #policy()}, keyed by {@link #keyHeader()} when set and
 * present, else by the client address (behind {@code shardlimit.trusted-proxies}). A denial is
 * answered as by the Servlet filter: 429, or 503 when the limit could not be checked.
 */
@Documented
@Retention(RetentionPolicy.RUNTIME)
@Target({ElementType.METHOD, ElementType.TYPE})
public @interface RateLimit {
    /** The configured policy. */
    String policy();

    /** Units per request. */
    long cost() default 1;

    /** A request header to key by (e.g. {@code X-Api-Key}); empty: the client address. */
    String keyHeader() default "";
}
