/*
 * The C test of libshardlimit: calls every function in include/shardlimit.h, success and
 * error paths, against a redis-server it starts on a free 127.0.0.1 port. Built with
 * -Wall -Wextra -Werror and run under valgrind by scripts/test-c.sh.
 *
 * Time is injected with a shardlimit_clock, so every number asserted below is exact.
 */
#define _POSIX_C_SOURCE 200809L

#include "shardlimit.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failures = 0;

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
      failures++;                                                                    \
    }                                                                                \
  } while (0)

/* Checks that `rc` is `want`; on an error prints it and frees it. */
#define CHECK_RC(rc, want, err)                                                      \
  do {                                                                               \
    shardlimit_result rc_ = (rc);                                                    \
    if (rc_ != (shardlimit_result)(want)) {                                          \
      fprintf(stderr, "%s:%d: got %s, want %s: %s\n", __FILE__, __LINE__,            \
              shardlimit_result_name(rc_).ptr, shardlimit_result_name(want).ptr,     \
              (err) ? shardlimit_error_message(err).ptr : "(no error object)");      \
      failures++;                                                                    \
    }                                                                                \
    shardlimit_error_free(err);                                                      \
    (err) = NULL;                                                                    \
  } while (0)

#define S(lit) (lit), (sizeof(lit) - 1)

/* ---------------------------------------------------------------- redis-server */

static pid_t redis_pid = -1;
static int redis_port = 0;

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    perror("free_port");
    exit(2);
  }
  close(fd);
  return ntohs(a.sin_port);
}

/* True when something answers PING with +PONG on 127.0.0.1:port. */
static int redis_ping(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  char buf[16] = {0};
  int ok = 0;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)port);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      write(fd, "PING\r\n", 6) == 6 && read(fd, buf, sizeof buf - 1) > 0) {
    ok = strncmp(buf, "+PONG", 5) == 0;
  }
  if (fd >= 0) close(fd);
  return ok;
}

static void start_redis(void) {
  char port[16];
  redis_port = free_port();
  snprintf(port, sizeof port, "%d", redis_port);
  redis_pid = fork();
  if (redis_pid == 0) {
    if (!freopen("/dev/null", "w", stdout)) _exit(126); /* redis logs to stdout */
    execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", "--dir", "/tmp", (char *)NULL);
    perror("exec redis-server");
    _exit(127);
  }
  for (int i = 0; i < 500; i++) { /* up to 10 s: readiness, not a race */
    if (redis_ping(redis_port)) return;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "redis-server did not start on port %d\n", redis_port);
  kill(redis_pid, SIGKILL);
  exit(2);
}

static void stop_redis(void) {
  if (redis_pid > 0) {
    kill(redis_pid, SIGTERM);
    waitpid(redis_pid, NULL, 0);
    redis_pid = -1;
  }
}

/* ---------------------------------------------------------------- fixtures */

/* 2023-11-14T22:13:22.5Z: 2.5 s into a 10 s window, so retry_after is exactly 7.5 s. */
#define T0 1700000002500000ULL

static char config[2048];
static shardlimit_clock *clock_ = NULL;
static shardlimit_limiter *lim = NULL;

static int str_eq(shardlimit_str s, const char *want) {
  return s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0 && s.ptr[s.len] == '\0';
}

static void test_static_functions(void) {
  shardlimit_str v = shardlimit_version();
  CHECK(str_eq(v, SHARDLIMIT_VERSION));
  CHECK(str_eq(shardlimit_result_name(SHARDLIMIT_OK), "ok"));
  CHECK(str_eq(shardlimit_result_name(SHARDLIMIT_ERR_CONFIG), "config"));
  CHECK(str_eq(shardlimit_result_name(SHARDLIMIT_ERR_INVALID_ARGUMENT), "invalid_argument"));
  CHECK(str_eq(shardlimit_result_name(SHARDLIMIT_ERR_TIMEOUT), "timeout"));
  CHECK(str_eq(shardlimit_result_name(SHARDLIMIT_ERR_UNKNOWN_POLICY), "unknown_policy"));
  CHECK(str_eq(shardlimit_result_name(SHARDLIMIT_ERR_INTERNAL), "internal"));
  CHECK(str_eq(shardlimit_result_name(SHARDLIMIT_ERR_UNAVAILABLE), "unavailable"));
  CHECK(shardlimit_result_is_backend(SHARDLIMIT_ERR_UNAVAILABLE));
  CHECK(str_eq(shardlimit_result_name(SHARDLIMIT_ERR_OVERLOADED), "overloaded"));
  CHECK(!shardlimit_result_is_backend(SHARDLIMIT_ERR_OVERLOADED));
  CHECK(str_eq(shardlimit_result_name(12345), "unknown"));
  CHECK(str_eq(shardlimit_source_name(SHARDLIMIT_SOURCE_REDIS), "redis"));
  CHECK(str_eq(shardlimit_source_name(SHARDLIMIT_SOURCE_FALLBACK), "fallback"));
  CHECK(str_eq(shardlimit_source_name(SHARDLIMIT_SOURCE_BLOCK), "block"));
  CHECK(str_eq(shardlimit_source_name(0), "unknown"));
  CHECK(shardlimit_result_is_backend(SHARDLIMIT_ERR_CONNECTION));
  CHECK(shardlimit_result_is_backend(SHARDLIMIT_ERR_TIMEOUT));
  CHECK(shardlimit_result_is_backend(SHARDLIMIT_ERR_SCRIPT));
  CHECK(!shardlimit_result_is_backend(SHARDLIMIT_ERR_CONFIG));
  CHECK(!shardlimit_result_is_backend(SHARDLIMIT_OK));
  /* every _free(NULL) is a no-op */
  shardlimit_error_free(NULL);
  shardlimit_string_free(NULL);
  shardlimit_clock_free(NULL);
  shardlimit_limiter_free(NULL);
  shardlimit_policy_free(NULL);
  shardlimit_lease_free(NULL);
  shardlimit_headers_free(NULL);
  /* accessors on NULL are harmless */
  CHECK(shardlimit_error_code(NULL) == SHARDLIMIT_ERR_INVALID_ARGUMENT);
  CHECK(str_eq(shardlimit_error_message(NULL), ""));
  CHECK(str_eq(shardlimit_policy_name(NULL), ""));
  CHECK(shardlimit_headers_len(NULL) == 0);
}

static void test_clock(void) {
  shardlimit_error *err = NULL;
  CHECK_RC(shardlimit_clock_new(T0, &clock_, &err), SHARDLIMIT_OK, err);
  CHECK(clock_ != NULL);
  CHECK_RC(shardlimit_clock_new(T0, NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_clock_set_us(NULL, 1, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_clock_advance_us(NULL, 1, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  /* a freed clock is CLOSED, even once a new clock exists (handles are never reused) */
  shardlimit_clock *other = NULL;
  CHECK_RC(shardlimit_clock_new(0, &other, &err), SHARDLIMIT_OK, err);
  shardlimit_clock_free(other);
  shardlimit_clock_free(other); /* double free: no-op */
  shardlimit_clock *next = NULL;
  CHECK_RC(shardlimit_clock_new(0, &next, &err), SHARDLIMIT_OK, err);
  CHECK(next != other);
  CHECK_RC(shardlimit_clock_set_us(other, 1, &err), SHARDLIMIT_ERR_CLOSED, err);
  CHECK(str_eq(shardlimit_result_name(SHARDLIMIT_ERR_CLOSED), "closed"));
  shardlimit_clock_free(next);
}

static void test_limiter_constructors(void) {
  shardlimit_error *err = NULL;
  shardlimit_limiter *l = (shardlimit_limiter *)&err; /* sentinel: must stay untouched */
  shardlimit_limiter *const sentinel = l;

  CHECK_RC(shardlimit_limiter_new_json(config, strlen(config), clock_, &lim, &err), SHARDLIMIT_OK,
           err);
  CHECK(lim != NULL);

  /* bad JSON, a bad field, non-UTF-8, NULL with a length, NULL out */
  const char *bad = "{\"policies\":{\"a\":{\"algorithm\":\"fixed_window\",\"limit\":5,"
                    "\"window\":\"abc\"}}}";
  CHECK(shardlimit_limiter_new_json(bad, strlen(bad), NULL, &l, &err) == SHARDLIMIT_ERR_CONFIG);
  CHECK(err != NULL && shardlimit_error_code(err) == SHARDLIMIT_ERR_CONFIG);
  CHECK(err != NULL && strstr(shardlimit_error_message(err).ptr, "policies.a.window") != NULL);
  shardlimit_error_free(err);
  err = NULL;
  CHECK_RC(shardlimit_limiter_new_json(S("{"), NULL, &l, &err), SHARDLIMIT_ERR_CONFIG, err);
  CHECK_RC(shardlimit_limiter_new_json(S("\xff"), NULL, &l, &err), SHARDLIMIT_ERR_CONFIG, err);
  CHECK_RC(shardlimit_limiter_new_json(NULL, 3, NULL, &l, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  CHECK_RC(shardlimit_limiter_new_json(S("{}"), NULL, NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  /* an error is reported with err == NULL too, just without details */
  CHECK(shardlimit_limiter_new_json(S("{"), NULL, &l, NULL) == SHARDLIMIT_ERR_CONFIG);
  CHECK(l == sentinel);

  /* from a file */
  char path[] = "/tmp/shardlimit-ctest-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  CHECK(write(fd, config, strlen(config)) == (ssize_t)strlen(config));
  close(fd);
  shardlimit_limiter *from_file = NULL;
  CHECK_RC(shardlimit_limiter_new_file(path, strlen(path), NULL, &from_file, &err), SHARDLIMIT_OK,
           err);
  CHECK(from_file != NULL);
  shardlimit_limiter_free(from_file);
  unlink(path);
  CHECK_RC(shardlimit_limiter_new_file(path, strlen(path), NULL, &l, &err), SHARDLIMIT_ERR_IO, err);
  CHECK_RC(shardlimit_limiter_new_file(NULL, 0, NULL, &l, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  /* a length that runs past the string's NUL */
  CHECK_RC(shardlimit_limiter_new_file(path, strlen(path) + 1, NULL, &l, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);

  /* memory */
  shardlimit_limiter *mem = NULL;
  CHECK_RC(shardlimit_limiter_new_memory(NULL, &mem, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_limiter_new_memory(NULL, NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  shardlimit_limiter_free(mem);

  /* from the environment */
  shardlimit_limiter *env = NULL;
  setenv("SHARDLIMIT_CONFIG", config, 1);
  CHECK_RC(shardlimit_limiter_new_env(NULL, &env, &err), SHARDLIMIT_OK, err);
  shardlimit_policy *p = NULL;
  CHECK_RC(shardlimit_limiter_policy(env, S("api"), &p, &err), SHARDLIMIT_OK, err);
  shardlimit_policy_free(p);
  shardlimit_limiter_free(env);
  setenv("SHARDLIMIT_CONFIG", "{\"shards\":[]}", 1);
  CHECK_RC(shardlimit_limiter_new_env(NULL, &l, &err), SHARDLIMIT_ERR_CONFIG, err);
  unsetenv("SHARDLIMIT_CONFIG");

  /* a freed clock cannot be attached */
  shardlimit_clock *gone = NULL;
  CHECK_RC(shardlimit_clock_new(0, &gone, &err), SHARDLIMIT_OK, err);
  shardlimit_clock_free(gone);
  CHECK_RC(shardlimit_limiter_new_memory(gone, &l, &err), SHARDLIMIT_ERR_CLOSED, err);
  CHECK(l == sentinel);
}

static void test_policies(void) {
  shardlimit_error *err = NULL;
  shardlimit_policy *p = NULL;
  CHECK_RC(shardlimit_limiter_policy(lim, S("api"), &p, &err), SHARDLIMIT_OK, err);
  CHECK(str_eq(shardlimit_policy_name(p), "api"));
  shardlimit_policy_free(p);
  shardlimit_policy_free(p); /* double free: no-op */
  CHECK(str_eq(shardlimit_policy_name(p), ""));

  CHECK_RC(shardlimit_limiter_policy(lim, S("nope"), &p, &err), SHARDLIMIT_ERR_UNKNOWN_POLICY, err);
  CHECK_RC(shardlimit_limiter_policy(NULL, S("api"), &p, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  CHECK_RC(shardlimit_limiter_policy(lim, S("api"), NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);

  shardlimit_limit l = {SHARDLIMIT_ALGORITHM_SLIDING_LOG, 2, 1000, 0.0, SHARDLIMIT_ON_ERROR_OPEN};
  CHECK_RC(shardlimit_policy_new(S("adhoc"), &l, &p, &err), SHARDLIMIT_OK, err);
  CHECK(str_eq(shardlimit_policy_name(p), "adhoc"));
  shardlimit_policy_free(p);

  shardlimit_policy *untouched = NULL;
  l.period_ms = 0;
  CHECK_RC(shardlimit_policy_new(S("adhoc"), &l, &untouched, &err), SHARDLIMIT_ERR_CONFIG, err);
  l.period_ms = 1000;
  l.algorithm = 77;
  CHECK_RC(shardlimit_policy_new(S("adhoc"), &l, &untouched, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  l.algorithm = SHARDLIMIT_ALGORITHM_FIXED_WINDOW;
  l.on_error = 9;
  CHECK_RC(shardlimit_policy_new(S("adhoc"), &l, &untouched, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  l.on_error = SHARDLIMIT_ON_ERROR_DEFAULT;
  CHECK_RC(shardlimit_policy_new(S("bad name"), &l, &untouched, &err), SHARDLIMIT_ERR_CONFIG, err);
  CHECK_RC(shardlimit_policy_new(S("adhoc"), NULL, &untouched, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK(untouched == NULL);
}

/* Multi-limit policies, plans and rate strings on Redis: one call decides every limit, the
 * decision carries them, and the headers rendered from the struct are the core's. */
static void test_multi_limit(void) {
  char cfg[512];
  snprintf(cfg, sizeof cfg,
           "{\"shards\":[{\"name\":\"only\",\"url\":\"redis://127.0.0.1:%d\"}],"
           "\"timeout_ms\":2000,\"key_prefix\":\"multi:\",\"policies\":{\"api\":\"2/hour; 3/day\"},"
           "\"plans\":{\"pro\":{\"api\":\"10/hour; 100/day\"}}}",
           redis_port);
  shardlimit_error *err = NULL;
  shardlimit_limiter *l = NULL;
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &l, &err), SHARDLIMIT_OK, err);
  if (!l) return;
  shardlimit_decision d;
  CHECK_RC(shardlimit_check_named(l, S("u"), S("api"), 2, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.has_limit_index && d.limit_index == 0 && d.quota_count == 2);
  CHECK(d.quotas[1].limit == 3 && d.quotas[1].window_us == 86400000000ULL);
  shardlimit_headers *h = NULL;
  CHECK_RC(shardlimit_decision_headers(&d, &h, &err), SHARDLIMIT_OK, err);
  shardlimit_str name, value;
  CHECK_RC(shardlimit_headers_get(h, 3, &name, &value, &err), SHARDLIMIT_OK, err);
  CHECK(str_eq(name, "RateLimit-Policy"));
  CHECK(str_eq(value, "\"api\";q=2;w=3600, \"api#1\";q=3;w=86400"));
  shardlimit_headers_free(h);
  CHECK_RC(shardlimit_check_named(l, S("u"), S("api"), 2, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && d.limit_index == 0); /* the hour denies; the day keeps its budget */

  shardlimit_policy *pro = NULL;
  CHECK_RC(shardlimit_plan_policy(l, S("pro"), S("api"), &pro, &err), SHARDLIMIT_OK, err);
  CHECK(str_eq(shardlimit_policy_name(pro), "api"));
  CHECK_RC(shardlimit_check(l, S("u"), pro, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.limit == 10 && d.remaining == 7);
  shardlimit_policy_free(pro);
  shardlimit_policy *untouched = NULL;
  CHECK_RC(shardlimit_plan_policy(l, S("gold"), S("api"), &untouched, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_plan_policy(l, S("pro"), S("nope"), &untouched, &err),
           SHARDLIMIT_ERR_UNKNOWN_POLICY, err);

  shardlimit_policy *burst = NULL;
  CHECK_RC(shardlimit_policy_new_rate(NULL, 0, S("1/hour; 5/day"), SHARDLIMIT_ALGORITHM_FIXED_WINDOW,
                                      &burst, &err),
           SHARDLIMIT_OK, err);
  CHECK(str_eq(shardlimit_policy_name(burst), "fixed_window-1-3600000ms--fixed_window-5-86400000ms"));
  CHECK_RC(shardlimit_check(l, S("a"), burst, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed);
  CHECK_RC(shardlimit_check(l, S("a"), burst, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && d.has_limit_index && d.limit_index == 0);
  shardlimit_policy_free(burst);
  shardlimit_policy *login = NULL;
  CHECK_RC(shardlimit_policy_new_rate(S("login"), S("5/minute"), SHARDLIMIT_ALGORITHM_SLIDING_LOG,
                                      &login, &err),
           SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_check(l, S("a"), login, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 4 && !d.has_limit_index && d.quota_count == 0);
  shardlimit_policy_free(login);
  CHECK_RC(shardlimit_policy_new_rate(NULL, 0, S("5/fortnight"), SHARDLIMIT_ALGORITHM_FIXED_WINDOW,
                                      &untouched, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK(untouched == NULL);
  shardlimit_limiter_free(l);
}

/* Exact admission of a fixed window on Redis, with exact timing from the injected clock. */
static void test_check_and_render(void) {
  shardlimit_error *err = NULL;
  shardlimit_decision d;
  for (int i = 0; i < 5; i++) {
    CHECK_RC(shardlimit_check_named(lim, S("user:1"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
    CHECK(d.allowed);
    CHECK(d.limit == 5);
    CHECK(d.remaining == (uint64_t)(4 - i));
    CHECK(d.source == SHARDLIMIT_SOURCE_REDIS);
    CHECK(d.has_shard && d.shard == 0);
    CHECK(!d.has_retry_after);
  }
  CHECK_RC(shardlimit_check_named(lim, S("user:1"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed);
  CHECK(d.remaining == 0);
  CHECK(d.has_retry_after && d.retry_after_us == 7500000);
  CHECK(d.reset_after_us == 7500000);
  CHECK(d.window_us == 10000000);
  CHECK(d.policy_len == 3 && strcmp(d.policy, "api") == 0);

  /* headers */
  shardlimit_headers *h = NULL;
  CHECK_RC(shardlimit_decision_headers(&d, &h, &err), SHARDLIMIT_OK, err);
  const char *want[][2] = {{"X-RateLimit-Limit", "5"},
                           {"X-RateLimit-Remaining", "0"},
                           {"X-RateLimit-Reset", "8"},
                           {"RateLimit-Policy", "\"api\";q=5;w=10"},
                           {"RateLimit", "\"api\";r=0;t=8"},
                           {"Retry-After", "8"}};
  CHECK(shardlimit_headers_len(h) == 6);
  for (size_t i = 0; i < 6; i++) {
    shardlimit_str name, value;
    CHECK_RC(shardlimit_headers_get(h, i, &name, &value, &err), SHARDLIMIT_OK, err);
    CHECK(str_eq(name, want[i][0]));
    CHECK(str_eq(value, want[i][1]));
  }
  shardlimit_str name = {NULL, 0}, value = {NULL, 0};
  CHECK_RC(shardlimit_headers_get(h, 6, &name, &value, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_headers_get(h, 0, NULL, &value, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK(name.ptr == NULL && value.ptr == NULL);
  shardlimit_headers_free(h);
  shardlimit_headers_free(h); /* double free: no-op */
  CHECK(shardlimit_headers_len(h) == 0);
  CHECK_RC(shardlimit_headers_get(h, 0, &name, &value, &err), SHARDLIMIT_ERR_CLOSED, err);
  CHECK_RC(shardlimit_decision_headers(NULL, &h, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_decision_headers(&d, NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);

  /* body and JSON */
  shardlimit_string body = {NULL, 0};
  CHECK_RC(shardlimit_decision_body(&d, &body, &err), SHARDLIMIT_OK, err);
  CHECK(body.ptr != NULL && strlen(body.ptr) == body.len);
  CHECK(body.ptr != NULL && strstr(body.ptr, "\"error\":\"rate_limited\"") != NULL);
  CHECK(body.ptr != NULL && strstr(body.ptr, "\"retry_after\":8") != NULL);
  shardlimit_string_free(&body);
  CHECK(body.ptr == NULL && body.len == 0);
  shardlimit_string_free(&body); /* again: no-op */

  shardlimit_string js = {NULL, 0};
  CHECK_RC(shardlimit_decision_to_json(&d, &js, &err), SHARDLIMIT_OK, err);
  CHECK(js.ptr != NULL && strstr(js.ptr, "\"retry_after_ms\":7500.0") != NULL);
  CHECK(js.ptr != NULL && strstr(js.ptr, "\"source\":\"redis\"") != NULL);
  shardlimit_string_free(&js);
  shardlimit_decision bad = d;
  bad.source = 99;
  CHECK_RC(shardlimit_decision_body(&bad, &js, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  bad = d;
  bad.policy_len = 4096;
  CHECK_RC(shardlimit_decision_to_json(&bad, &js, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_decision_to_json(&d, NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK(js.ptr == NULL);

  /* the next window: the clock moves 7.5 s */
  CHECK_RC(shardlimit_clock_advance_us(clock_, 7500000, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_check_named(lim, S("user:1"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 4);
  CHECK_RC(shardlimit_clock_set_us(clock_, T0, &err), SHARDLIMIT_OK, err);

  /* a cost that can never fit: denied without retry_after */
  CHECK_RC(shardlimit_check_named(lim, S("user:2"), S("api"), 6, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && !d.has_retry_after);
}

static void test_check_errors(void) {
  shardlimit_error *err = NULL;
  shardlimit_decision d;
  memset(&d, 0, sizeof d);
  d.limit = 4242; /* must survive every failed call */
  shardlimit_policy *p = NULL;
  CHECK_RC(shardlimit_limiter_policy(lim, S("api"), &p, &err), SHARDLIMIT_OK, err);

  CHECK_RC(shardlimit_check_named(lim, S("k"), S("nope"), 1, &d, &err),
           SHARDLIMIT_ERR_UNKNOWN_POLICY, err);
  CHECK_RC(shardlimit_check_named(lim, S(""), S("api"), 1, &d, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_check_named(lim, S("k"), S("api"), 0, &d, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_check_named(lim, S("\xc3\x28"), S("api"), 1, &d, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  /* a length larger than the string: the NUL inside is caught */
  CHECK_RC(shardlimit_check_named(lim, "k", 2, S("api"), 1, &d, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_check_named(lim, NULL, 1, S("api"), 1, &d, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_check_named(lim, "k", (size_t)-1, S("api"), 1, &d, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_check_named(NULL, S("k"), S("api"), 1, &d, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_check_named(lim, S("k"), S("api"), 1, NULL, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_check(lim, S("k"), NULL, 1, &d, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_check(lim, S("k"), p, 0, &d, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_peek(lim, S(""), p, &d, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_peek(lim, S("k"), p, NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_reset(lim, S(""), p, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_reset(NULL, S("k"), p, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  /* the message names the argument */
  CHECK(shardlimit_check_named(lim, S(""), S("api"), 1, &d, &err) != SHARDLIMIT_OK);
  CHECK(err != NULL && strstr(shardlimit_error_message(err).ptr, "key") != NULL);
  shardlimit_error_free(err);
  err = NULL;
  CHECK(d.limit == 4242);

  /* a policy used after it was freed */
  shardlimit_policy_free(p);
  CHECK_RC(shardlimit_check(lim, S("k"), p, 1, &d, &err), SHARDLIMIT_ERR_CLOSED, err);
  CHECK(d.limit == 4242);
}

static void test_peek_reset_check(void) {
  shardlimit_error *err = NULL;
  shardlimit_decision d;
  shardlimit_policy *tb = NULL;
  /* connections and scripts at start-up, within the connect's own timeout */
  CHECK_RC(shardlimit_connect(lim, 2000, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_connect(lim, 0, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_connect(NULL, 2000, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_limiter_policy(lim, S("tb"), &tb, &err), SHARDLIMIT_OK, err);
  for (int i = 0; i < 3; i++) {
    CHECK_RC(shardlimit_check(lim, S("bucket"), tb, 1, &d, &err), SHARDLIMIT_OK, err);
    CHECK(d.allowed);
  }
  CHECK_RC(shardlimit_check(lim, S("bucket"), tb, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && d.has_retry_after && d.retry_after_us == 1000000);
  CHECK_RC(shardlimit_peek(lim, S("bucket"), tb, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && d.remaining == 0);
  CHECK_RC(shardlimit_reset(lim, S("bucket"), tb, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_peek(lim, S("bucket"), tb, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 3);
  shardlimit_policy_free(tb);
}

static void test_leases(void) {
  shardlimit_error *err = NULL;
  shardlimit_decision d;
  shardlimit_policy *conc = NULL;
  shardlimit_lease *a = NULL, *b = NULL, *c = (shardlimit_lease *)&d;
  bool released = false;
  CHECK_RC(shardlimit_limiter_policy(lim, S("conc"), &conc, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_acquire(lim, S("job"), conc, 1, &d, &a, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && a != NULL && d.remaining == 1);
  CHECK_RC(shardlimit_acquire(lim, S("job"), conc, 1, &d, &b, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && b != NULL && d.remaining == 0);
  CHECK_RC(shardlimit_acquire(lim, S("job"), conc, 1, &d, &c, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && c == NULL);
  CHECK_RC(shardlimit_release(lim, a, &released, &err), SHARDLIMIT_OK, err);
  CHECK(released);
  CHECK_RC(shardlimit_release(lim, a, &released, &err), SHARDLIMIT_OK, err);
  CHECK(!released);
  CHECK_RC(shardlimit_acquire(lim, S("job"), conc, 1, &d, &c, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && c != NULL);
  CHECK_RC(shardlimit_release(lim, b, NULL, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_release(lim, c, &released, &err), SHARDLIMIT_OK, err);
  CHECK(released);
  CHECK_RC(shardlimit_acquire(lim, S("job"), conc, 1, &d, NULL, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_acquire(lim, S("job"), conc, 0, &d, &b, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_release(lim, NULL, &released, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  shardlimit_lease_free(a);
  shardlimit_lease_free(b);
  shardlimit_lease_free(c);
  shardlimit_lease_free(c); /* double free: no-op */
  CHECK_RC(shardlimit_release(lim, c, &released, &err), SHARDLIMIT_ERR_CLOSED, err);
  shardlimit_policy_free(conc);
}

/* Charge into debt, refund, reserve and settle (blocking and started). */
static void test_settle(void) {
  shardlimit_error *err = NULL;
  shardlimit_decision d;
  shardlimit_reservation r, none;
  shardlimit_policy *tok = NULL, *conc = NULL;
  CHECK_RC(shardlimit_limiter_policy(lim, S("tokens"), &tok, &err), SHARDLIMIT_OK, err);
  /* a charge never denies: the key goes into debt and the next check is denied */
  CHECK_RC(shardlimit_charge(lim, S("llm"), tok, 14, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 0 && !d.has_retry_after);
  CHECK(d.source == SHARDLIMIT_SOURCE_REDIS);
  CHECK_RC(shardlimit_check(lim, S("llm"), tok, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && d.has_retry_after);
  /* a refund never goes above the limit */
  CHECK_RC(shardlimit_refund(lim, S("llm"), tok, 99, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 10);
  /* reserve 8, use 3: 5 go back */
  CHECK_RC(shardlimit_reserve(lim, S("llm"), tok, 8, &d, &r, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 2 && r.reserved && r.units == 8);
  CHECK_RC(shardlimit_settle(lim, S("llm"), tok, &r, 3, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 7);
  /* a denied reserve reserves nothing, and there is nothing to settle */
  CHECK_RC(shardlimit_reserve(lim, S("llm"), tok, 11, &d, &none, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && !none.reserved);
  CHECK_RC(shardlimit_settle(lim, S("llm"), tok, &none, 1, &d, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_settle(lim, S("llm"), tok, NULL, 1, &d, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_charge(lim, S("llm"), tok, 0, &d, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  CHECK_RC(shardlimit_reserve(lim, S("llm"), tok, 1, &d, NULL, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_limiter_policy(lim, S("conc"), &conc, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_charge(lim, S("llm"), conc, 1, &d, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  /* the started forms */
  shardlimit_pending *p = NULL;
  CHECK_RC(shardlimit_reserve_start(lim, S("llm"), tok, 2, NULL, NULL, &p, &err), SHARDLIMIT_OK,
           err);
  CHECK(shardlimit_pending_wait(p, 10 * 1000 * 1000));
  CHECK_RC(shardlimit_pending_decision(p, &d, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_pending_reserved(p, &d, &r, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 5 && r.reserved && r.units == 2);
  shardlimit_pending_free(p);
  CHECK_RC(shardlimit_settle_start(lim, S("llm"), tok, &r, 6, NULL, NULL, &p, &err),
           SHARDLIMIT_OK, err);
  CHECK(shardlimit_pending_wait(p, 10 * 1000 * 1000));
  CHECK_RC(shardlimit_pending_decision(p, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 1); /* 4 more than reserved were charged */
  shardlimit_pending_free(p);
  CHECK_RC(shardlimit_charge_start(lim, S("llm"), tok, 3, NULL, NULL, &p, &err), SHARDLIMIT_OK,
           err);
  CHECK(shardlimit_pending_wait(p, 10 * 1000 * 1000));
  CHECK_RC(shardlimit_pending_decision(p, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 0);
  shardlimit_pending_free(p);
  CHECK_RC(shardlimit_refund_start(lim, S("llm"), tok, 4, NULL, NULL, &p, &err), SHARDLIMIT_OK,
           err);
  CHECK(shardlimit_pending_wait(p, 10 * 1000 * 1000));
  CHECK_RC(shardlimit_pending_decision(p, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 2); /* 12 used, 4 back */
  shardlimit_pending_free(p);
  shardlimit_policy_free(conc);
  shardlimit_policy_free(tok);
}

/* Exact admission from many threads sharing one handle. */
#define THREADS 8
#define PER_THREAD 40
static void *hammer(void *arg) {
  long allowed = 0;
  (void)arg;
  for (int i = 0; i < PER_THREAD; i++) {
    shardlimit_decision d;
    shardlimit_error *err = NULL;
    if (shardlimit_check_named(lim, S("threads"), S("burst"), 1, &d, &err) != SHARDLIMIT_OK) {
      fprintf(stderr, "thread check failed: %s\n", shardlimit_error_message(err).ptr);
      shardlimit_error_free(err);
      return (void *)-1L;
    }
    allowed += d.allowed;
  }
  return (void *)allowed;
}

static void test_threads(void) {
  pthread_t t[THREADS];
  long total = 0;
  for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, hammer, NULL) == 0);
  for (int i = 0; i < THREADS; i++) {
    void *r = NULL;
    pthread_join(t[i], &r);
    CHECK((long)r >= 0);
    total += (long)r;
  }
  CHECK(total == 100); /* the burst policy admits exactly 100 in its window */
}

/* The limiter keeps working in a forked child (its runtime is re-created there). */
static void test_fork(void) {
  shardlimit_error *err = NULL;
  shardlimit_decision d;
  int fds[2];
  CHECK_RC(shardlimit_check_named(lim, S("fork"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(pipe(fds) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    char ok = 'n';
    shardlimit_decision cd;
    if (shardlimit_check_named(lim, S("fork"), S("api"), 1, &cd, NULL) == SHARDLIMIT_OK &&
        cd.allowed && cd.remaining == 3)
      ok = 'y';
    if (write(fds[1], &ok, 1) != 1) _exit(3);
    _exit(0);
  }
  char got = 0;
  close(fds[1]);
  CHECK(read(fds[0], &got, 1) == 1);
  close(fds[0]);
  CHECK(got == 'y');
  waitpid(pid, NULL, 0);
  /* and the parent still works, seeing the child's unit */
  CHECK_RC(shardlimit_check_named(lim, S("fork"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 2);
}

/* A shard nobody listens on: with on_error "error" the backend error comes back; with
 * "closed" the core denies with a fallback decision. Never a hang beyond the deadline. */
static void test_dead_shard(void) {
  char cfg[640];
  shardlimit_limiter *dead = NULL;
  shardlimit_error *err = NULL;
  shardlimit_decision d;
  snprintf(cfg, sizeof cfg,
           "{\"shards\":[{\"name\":\"dead\",\"url\":\"redis://127.0.0.1:%d\"}],"
           "\"timeout_ms\":300,\"policies\":{"
           "\"strict\":{\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"1s\",\"on_error\":\"error\"},"
           "\"closed\":{\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"1s\",\"on_error\":\"closed\"}}}",
           free_port());
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &dead, &err), SHARDLIMIT_OK, err);
  d.limit = 4242;
  shardlimit_result rc = shardlimit_check_named(dead, S("k"), S("strict"), 1, &d, &err);
  CHECK(shardlimit_result_is_backend(rc));
  CHECK(err != NULL && shardlimit_error_code(err) == rc);
  CHECK(err != NULL && strstr(shardlimit_error_message(err).ptr, "dead") != NULL);
  CHECK(d.limit == 4242);
  shardlimit_error_free(err);
  err = NULL;
  CHECK_RC(shardlimit_check_named(dead, S("k"), S("closed"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && d.source == SHARDLIMIT_SOURCE_FALLBACK);
  shardlimit_limiter_free(dead);
}

/* Layered checks: allowed only if every layer allows; a denial consumes nothing. */
static void test_check_all(void) {
  shardlimit_error *err = NULL;
  shardlimit_decision d;
  shardlimit_policy *api = NULL;
  CHECK_RC(shardlimit_limiter_policy(lim, S("api"), &api, &err), SHARDLIMIT_OK, err);
  /* tenant:7 has 1 of 5 left, ip:7 has 5 */
  CHECK_RC(shardlimit_check_named(lim, S("tenant:7"), S("api"), 4, &d, &err), SHARDLIMIT_OK, err);
  shardlimit_layer layers[2] = {
      {"ip:7", 4, NULL, "api", 3, 1},  /* by name */
      {"tenant:7", 8, api, NULL, 0, 1} /* by policy object */
  };
  CHECK_RC(shardlimit_check_all(lim, layers, 2, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.has_layer && d.layer == 1 && d.remaining == 0);
  CHECK_RC(shardlimit_check_all(lim, layers, 2, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && d.has_layer && d.layer == 1 && d.has_retry_after);
  /* the denied layered check took nothing from ip:7 (5 - 1 = 4 left, so 3 after this) */
  CHECK_RC(shardlimit_check_named(lim, S("ip:7"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 3 && !d.has_layer);

  d.limit = 4242;
  CHECK_RC(shardlimit_check_all(lim, layers, 0, &d, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_check_all(lim, NULL, 2, &d, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_check_all(lim, layers, 100000, &d, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  CHECK_RC(shardlimit_check_all(lim, layers, 2, NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  layers[0].policy_name = "nope";
  layers[0].policy_name_len = 4;
  CHECK_RC(shardlimit_check_all(lim, layers, 2, &d, &err), SHARDLIMIT_ERR_UNKNOWN_POLICY, err);
  layers[0].key_len = 0;
  layers[0].policy_name = "api";
  layers[0].policy_name_len = 3;
  CHECK_RC(shardlimit_check_all(lim, layers, 2, &d, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK(d.limit == 4242);
  shardlimit_policy_free(api);
}

/* The block list, shared by every limiter on the shards. */
static void test_block_list(void) {
  shardlimit_error *err = NULL;
  shardlimit_decision d;
  shardlimit_block_info info;
  bool was = true;
  CHECK_RC(shardlimit_blocked(lim, S("mallory"), &info, &err), SHARDLIMIT_OK, err);
  CHECK(!info.blocked && !info.permanent && info.reason.ptr == NULL);
  shardlimit_string_free(&info.reason);
  CHECK_RC(shardlimit_block(lim, S("mallory"), 60000, S("credential stuffing"), &err),
           SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_check_named(lim, S("mallory"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && d.source == SHARDLIMIT_SOURCE_BLOCK);
  CHECK_RC(shardlimit_blocked(lim, S("mallory"), &info, &err), SHARDLIMIT_OK, err);
  CHECK(info.blocked && !info.permanent);
  CHECK(info.remaining_us > 0 && info.remaining_us <= 60000000);
  CHECK(info.reason.ptr != NULL && strcmp(info.reason.ptr, "credential stuffing") == 0);
  shardlimit_string_free(&info.reason);
  CHECK_RC(shardlimit_unblock(lim, S("mallory"), &was, &err), SHARDLIMIT_OK, err);
  CHECK(was);
  CHECK_RC(shardlimit_unblock(lim, S("mallory"), &was, &err), SHARDLIMIT_OK, err);
  CHECK(!was);
  CHECK_RC(shardlimit_unblock(lim, S("mallory"), NULL, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_check_named(lim, S("mallory"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed);
  /* permanent, with no reason */
  CHECK_RC(shardlimit_block(lim, S("eve"), 0, NULL, 0, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_blocked(lim, S("eve"), &info, &err), SHARDLIMIT_OK, err);
  CHECK(info.blocked && info.permanent && info.reason.ptr != NULL && info.reason.len == 0);
  shardlimit_string_free(&info.reason);
  CHECK_RC(shardlimit_unblock(lim, S("eve"), NULL, &err), SHARDLIMIT_OK, err);
  /* errors */
  CHECK_RC(shardlimit_block(lim, S(""), 0, NULL, 0, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_block(lim, S("k"), 0, "x", 5000, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_block(NULL, S("k"), 0, NULL, 0, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_unblock(lim, S(""), NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_blocked(lim, S("k"), NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
}

/* Live overrides: what one limiter (process) sets, another's next check uses. */
static void test_overrides(void) {
  char cfg[1024];
  snprintf(cfg, sizeof cfg,
           "{\"shards\":[{\"name\":\"only\",\"url\":\"redis://127.0.0.1:%d\"}],"
           "\"timeout_ms\":2000,\"policies\":{"
           "\"ov\":{\"algorithm\":\"fixed_window\",\"limit\":3,\"window\":\"1h\","
           "\"overrides\":true}}}",
           redis_port);
  shardlimit_error *err = NULL;
  shardlimit_limiter *a = NULL, *b = NULL;
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &a, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &b, &err), SHARDLIMIT_OK, err);
  shardlimit_decision d;
  CHECK_RC(shardlimit_check_named(b, S("acme"), S("ov"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.limit == 3);
  shardlimit_string json = {NULL, 0};
  /* the same window: the same counter, the new limit */
  CHECK_RC(shardlimit_set_override(a, S("acme"), S("ov"), S("100/hour"), 3600000, &json, &err),
           SHARDLIMIT_OK, err);
  CHECK(json.ptr != NULL && strstr(json.ptr, "\"limit\":100") != NULL);
  shardlimit_string_free(&json);
  CHECK_RC(shardlimit_check_named(b, S("acme"), S("ov"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.limit == 100 && d.remaining == 98);
  bool found = false;
  CHECK_RC(shardlimit_get_override(b, S("acme"), S("ov"), &found, &json, &err), SHARDLIMIT_OK, err);
  CHECK(found && json.ptr != NULL && strstr(json.ptr, "\"key\":\"acme\"") != NULL);
  shardlimit_string_free(&json);
  CHECK_RC(shardlimit_get_override(b, S("nobody"), S("ov"), &found, &json, &err), SHARDLIMIT_OK,
           err);
  CHECK(!found && json.ptr == NULL);
  CHECK_RC(shardlimit_list_overrides(b, S("ov"), NULL, 0, 10, &json, &err), SHARDLIMIT_OK, err);
  CHECK(json.ptr != NULL && strstr(json.ptr, "\"cursor\":null") != NULL);
  shardlimit_string_free(&json);
  bool deleted = false;
  CHECK_RC(shardlimit_delete_override(a, S("acme"), S("ov"), &deleted, &err), SHARDLIMIT_OK, err);
  CHECK(deleted);
  CHECK_RC(shardlimit_check_named(b, S("acme"), S("ov"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.limit == 3);
  /* errors */
  CHECK_RC(shardlimit_set_override(a, S("acme"), S("ov"), S("gold"), 0, NULL, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_set_override(a, S("acme"), S("nope"), S("5/minute"), 0, NULL, &err),
           SHARDLIMIT_ERR_UNKNOWN_POLICY, err);
  CHECK_RC(shardlimit_get_override(a, S("acme"), S("ov"), NULL, &json, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_list_overrides(a, S("ov"), NULL, 0, 0, &json, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  shardlimit_limiter_free(a);
  shardlimit_limiter_free(b);
}

static void test_client_ip(void) {
  shardlimit_error *err = NULL;
  shardlimit_string ip = {NULL, 0};
  shardlimit_str trusted[2] = {{"10.0.0.0/8", 10}, {"192.168.1.1", 11}};
  /* a trusted proxy: the rightmost untrusted X-Forwarded-For entry is the client */
  CHECK_RC(shardlimit_client_ip(S("10.1.2.3:443"), S("203.0.113.9, 198.51.100.7, 192.168.1.1"),
                                trusted, 2, &ip, &err),
           SHARDLIMIT_OK, err);
  CHECK(ip.ptr != NULL && strcmp(ip.ptr, "198.51.100.7") == 0 && ip.len == 12);
  shardlimit_string_free(&ip);
  /* an untrusted peer is the client whatever the header says; no header at all */
  CHECK_RC(shardlimit_client_ip(S("203.0.113.5"), S("1.1.1.1"), trusted, 2, &ip, &err),
           SHARDLIMIT_OK, err);
  CHECK(ip.ptr != NULL && strcmp(ip.ptr, "203.0.113.5") == 0);
  shardlimit_string_free(&ip);
  CHECK_RC(shardlimit_client_ip(S("[::1]:80"), NULL, 0, NULL, 0, &ip, &err), SHARDLIMIT_OK, err);
  CHECK(ip.ptr != NULL && strcmp(ip.ptr, "::1") == 0);
  shardlimit_string_free(&ip);
  /* the client's key: an IPv6 client by its /64, an IPv4-mapped one as IPv4 */
  CHECK_RC(shardlimit_client_ip_key(S("[2001:db8:1:2::5]:80"), NULL, 0, NULL, 0, 64, &ip, &err),
           SHARDLIMIT_OK, err);
  CHECK(ip.ptr != NULL && strcmp(ip.ptr, "2001:db8:1:2::/64") == 0);
  shardlimit_string_free(&ip);
  CHECK_RC(shardlimit_client_ip_key(S("::ffff:198.51.100.7"), NULL, 0, NULL, 0, 64, &ip, &err),
           SHARDLIMIT_OK, err);
  CHECK(ip.ptr != NULL && strcmp(ip.ptr, "198.51.100.7") == 0);
  shardlimit_string_free(&ip);
  CHECK_RC(shardlimit_client_ip_key(S("2001:db8::1"), NULL, 0, NULL, 0, 0, &ip, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  /* errors */
  CHECK_RC(shardlimit_client_ip(S("not-an-ip"), NULL, 0, NULL, 0, &ip, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  shardlimit_str bad[1] = {{"10.0.0.0/99", 11}};
  CHECK_RC(shardlimit_client_ip(S("10.0.0.1"), NULL, 0, bad, 1, &ip, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_client_ip(S("10.0.0.1"), NULL, 0, NULL, 1, &ip, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_client_ip(S("10.0.0.1"), NULL, 0, NULL, 0, NULL, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK(ip.ptr == NULL);
}

static void test_freed_limiter(void) {
  shardlimit_error *err = NULL;
  shardlimit_decision d;
  shardlimit_limiter *l = NULL;
  CHECK_RC(shardlimit_limiter_new_json(config, strlen(config), NULL, &l, &err), SHARDLIMIT_OK, err);
  shardlimit_limiter_free(l);
  shardlimit_limiter_free(l); /* double free: no-op */
  CHECK(shardlimit_check_named(l, S("k"), S("api"), 1, &d, &err) == SHARDLIMIT_ERR_CLOSED);
  CHECK(err != NULL && shardlimit_error_code(err) == SHARDLIMIT_ERR_CLOSED);
  CHECK(err != NULL && strstr(shardlimit_error_message(err).ptr, "was freed") != NULL);
  shardlimit_error_free(err);
  shardlimit_error_free(err); /* double free: no-op */
}

/* Closing a limiter while threads check through it, and creating its successor at once
 * (a config reload): every call returns a decision of the closed limiter (burst: limit
 * 100) or CLOSED, never one of the successor (limit 9). */
static shardlimit_limiter *closing;
static atomic_int closing_calls;

static void *check_until_closed(void *arg) {
  (void)arg;
  long decided = 0;
  for (int closed = 0; closed < 20;) {
    shardlimit_error *err = NULL;
    shardlimit_decision d;
    shardlimit_result rc = shardlimit_check_named(closing, S("closing"), S("burst"), 1, &d, &err);
    if (rc == SHARDLIMIT_OK) {
      if (closed > 0 || d.limit != 100) return (void *)-1L;
      decided++;
      atomic_fetch_add(&closing_calls, 1);
    } else {
      int ok = rc == SHARDLIMIT_ERR_CLOSED && shardlimit_error_code(err) == SHARDLIMIT_ERR_CLOSED;
      shardlimit_error_free(err);
      if (!ok) return (void *)-1L;
      closed++;
    }
  }
  return (void *)decided;
}

static void test_close_while_checking(void) {
  shardlimit_error *err = NULL;
  char next_config[sizeof config];
  snprintf(next_config, sizeof next_config,
           "{\"shards\":[{\"name\":\"only\",\"url\":\"redis://127.0.0.1:%d\"}],"
           "\"timeout_ms\":2000,\"policies\":{"
           "\"burst\":{\"algorithm\":\"fixed_window\",\"limit\":9,\"window\":\"60s\"}}}",
           redis_port);
  CHECK_RC(shardlimit_limiter_new_json(config, strlen(config), NULL, &closing, &err), SHARDLIMIT_OK,
           err);
  atomic_store(&closing_calls, 0);
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    CHECK(pthread_create(&t[i], NULL, check_until_closed, NULL) == 0);
  while (atomic_load(&closing_calls) < THREADS * 3) sched_yield();
  shardlimit_limiter_free(closing);
  shardlimit_limiter *next = NULL;
  CHECK_RC(shardlimit_limiter_new_json(next_config, strlen(next_config), NULL, &next, &err),
           SHARDLIMIT_OK, err);
  for (int i = 0; i < THREADS; i++) {
    void *r = NULL;
    pthread_join(t[i], &r);
    CHECK((long)r >= 0);
  }
  shardlimit_decision d;
  CHECK_RC(shardlimit_check_named(next, S("closing"), S("burst"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.limit == 9);
  shardlimit_limiter_free(next);
}

/* ---------------------------------------------------------------- started calls */

/* What a completion callback saw. */
struct seen {
  atomic_int calls;
  atomic_int code;
};

static void on_done(void *user, shardlimit_pending *p) {
  struct seen *s = user;
  shardlimit_decision d;
  atomic_store(&s->code, (int)shardlimit_pending_decision(p, &d, NULL));
  atomic_fetch_add(&s->calls, 1);
}

static void test_started_calls(void) {
  shardlimit_error *err = NULL;
  shardlimit_limiter *l = NULL;
  char cfg[512];
  snprintf(cfg, sizeof cfg,
           "{\"shards\":[{\"name\":\"only\",\"url\":\"redis://127.0.0.1:%d\"}],"
           "\"timeout_ms\":10000,\"policies\":{\"api\":{\"algorithm\":\"fixed_window\","
           "\"limit\":5,\"window\":\"1h\",\"on_error\":\"error\"}}}",
           redis_port);
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &l, &err), SHARDLIMIT_OK, err);
  /* Redis answers: wait on the handle (no callback) */
  shardlimit_pending *p = NULL;
  CHECK_RC(shardlimit_check_named_start(l, S("started"), S("api"), 1, NULL, NULL, &p, &err),
           SHARDLIMIT_OK, err);
  CHECK(shardlimit_pending_wait(p, 10 * 1000 * 1000));
  shardlimit_decision d;
  CHECK_RC(shardlimit_pending_decision(p, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.remaining == 4 && d.source == SHARDLIMIT_SOURCE_REDIS);
  shardlimit_pending_free(p);
  shardlimit_pending_free(p); /* a second free is a no-op */
  /* Redis stopped: in flight until cancelled; the callback runs once, inside cancel */
  CHECK(kill(redis_pid, SIGSTOP) == 0);
  struct seen s;
  atomic_init(&s.calls, 0);
  atomic_init(&s.code, -1);
  CHECK_RC(shardlimit_check_named_start(l, S("started"), S("api"), 1, on_done, &s, &p, &err),
           SHARDLIMIT_OK, err);
  CHECK(!shardlimit_pending_wait(p, 20 * 1000));
  CHECK(!shardlimit_pending_poll(p));
  CHECK(atomic_load(&s.calls) == 0);
  CHECK(shardlimit_pending_cancel(p));
  CHECK(atomic_load(&s.calls) == 1);
  CHECK(atomic_load(&s.code) == SHARDLIMIT_ERR_CANCELLED);
  CHECK_RC(shardlimit_pending_decision(p, &d, &err), SHARDLIMIT_ERR_CANCELLED, err);
  CHECK(!shardlimit_pending_cancel(p));
  shardlimit_pending_free(p);
  CHECK(atomic_load(&s.calls) == 1);
  /* freeing a call in flight cancels it */
  atomic_store(&s.calls, 0);
  CHECK_RC(shardlimit_check_named_start(l, S("started"), S("api"), 1, on_done, &s, &p, &err),
           SHARDLIMIT_OK, err);
  shardlimit_pending_free(p);
  CHECK(atomic_load(&s.calls) == 1);
  CHECK(kill(redis_pid, SIGCONT) == 0);
  shardlimit_limiter_free(l);
}

/* Shadow mode: a policy in shadow and the per-call option (blocking and started) allow
 * a would-be denial with shadow_denied, headers that do not say limited, and counts that
 * shardlimit_shadow_report() reads back from Redis. */
static void test_shadow(void) {
  shardlimit_error *err = NULL;
  shardlimit_limiter *l = NULL;
  char cfg[640];
  snprintf(cfg, sizeof cfg,
           "{\"shards\":[{\"name\":\"only\",\"url\":\"redis://127.0.0.1:%d\"}],"
           "\"key_prefix\":\"cshadow:\",\"timeout_ms\":5000,\"policies\":{"
           "\"new\":{\"algorithm\":\"fixed_window\",\"limit\":1,\"window\":\"1h\",\"shadow\":true},"
           "\"old\":{\"algorithm\":\"fixed_window\",\"limit\":1,\"window\":\"1h\"}}}",
           redis_port);
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &l, &err), SHARDLIMIT_OK, err);
  shardlimit_policy *np = NULL, *op = NULL;
  CHECK_RC(shardlimit_limiter_policy(l, S("new"), &np, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_limiter_policy(l, S("old"), &op, &err), SHARDLIMIT_OK, err);
  shardlimit_decision d;
  CHECK_RC(shardlimit_check(l, S("u1"), np, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && !d.shadow_denied);
  for (int i = 0; i < 2; i++) {
    CHECK_RC(shardlimit_check(l, S("u1"), np, 1, &d, &err), SHARDLIMIT_OK, err);
    CHECK(d.allowed && d.shadow_denied && !d.has_retry_after && d.remaining == 0);
  }
  shardlimit_headers *h = NULL;
  CHECK_RC(shardlimit_decision_headers(&d, &h, &err), SHARDLIMIT_OK, err);
  CHECK(shardlimit_headers_len(h) == 2); /* limit and policy only: no Retry-After */
  shardlimit_headers_free(h);
  /* per call, on an enforcing policy */
  CHECK_RC(shardlimit_check(l, S("u2"), op, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_check(l, S("u2"), op, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && !d.shadow_denied);
  CHECK_RC(shardlimit_check_shadow(l, S("u2"), op, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.shadow_denied);
  shardlimit_pending *p = NULL;
  CHECK_RC(shardlimit_check_shadow_start(l, S("u2"), op, 1, NULL, NULL, &p, &err), SHARDLIMIT_OK,
           err);
  CHECK(shardlimit_pending_wait(p, 10 * 1000 * 1000));
  CHECK_RC(shardlimit_pending_decision(p, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.shadow_denied);
  shardlimit_pending_free(p);
  /* the counts, from Redis */
  shardlimit_string r = {0};
  CHECK_RC(shardlimit_shadow_report(l, S("new"), 0, &r, &err), SHARDLIMIT_OK, err);
  CHECK(r.ptr && strstr(r.ptr, "\"total\":2") && strstr(r.ptr, "{\"count\":2,\"key\":\"u1\"}"));
  if (r.ptr && !strstr(r.ptr, "\"total\":2")) fprintf(stderr, "report: %s\n", r.ptr);
  shardlimit_string_free(&r);
  CHECK_RC(shardlimit_shadow_report(l, S("old"), 1, &r, &err), SHARDLIMIT_OK, err);
  CHECK(r.ptr && strstr(r.ptr, "\"total\":2") && strstr(r.ptr, "\"u2\""));
  shardlimit_string_free(&r);
  CHECK_RC(shardlimit_shadow_report(l, S("a:b"), 0, &r, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  CHECK_RC(shardlimit_shadow_report(l, S("new"), 0, NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  shardlimit_string m = {0};
  CHECK_RC(shardlimit_metrics(l, &m, &err), SHARDLIMIT_OK, err);
  CHECK(m.ptr && strstr(m.ptr, "\"shadow_denied\":2"));
  shardlimit_string_free(&m);
  shardlimit_policy_free(np);
  shardlimit_policy_free(op);
  shardlimit_limiter_free(l);
}

/* The started forms of the override calls and the shadow report: the same answers as
 * the blocking forms, read with shardlimit_pending_string(); against a stopped Redis they
 * stay in flight until cancelled (the callback runs once, inside cancel). */
static void on_text(void *user, shardlimit_pending *p) {
  struct seen *s = user;
  shardlimit_string t = {NULL, 0};
  atomic_store(&s->code, (int)shardlimit_pending_string(p, NULL, &t, NULL));
  shardlimit_string_free(&t);
  atomic_fetch_add(&s->calls, 1);
}

static void test_started_text_calls(void) {
  char cfg[768];
  snprintf(cfg, sizeof cfg,
           "{\"shards\":[{\"name\":\"only\",\"url\":\"redis://127.0.0.1:%d\"}],"
           "\"key_prefix\":\"ctext:\",\"timeout_ms\":10000,\"policies\":{"
           "\"ov\":{\"algorithm\":\"fixed_window\",\"limit\":3,\"window\":\"1h\","
           "\"overrides\":true},"
           "\"sh\":{\"algorithm\":\"fixed_window\",\"limit\":1,\"window\":\"1h\",\"shadow\":true}}}",
           redis_port);
  shardlimit_error *err = NULL;
  shardlimit_limiter *l = NULL;
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &l, &err), SHARDLIMIT_OK, err);
  shardlimit_pending *p = NULL;
  shardlimit_string json = {NULL, 0};
  bool found = false, b = false;
  const uint64_t wait_us = 10 * 1000 * 1000;
  /* set */
  CHECK_RC(shardlimit_set_override_start(l, S("acme"), S("ov"), S("100/hour"), 3600000, NULL,
                                         NULL, &p, &err),
           SHARDLIMIT_OK, err);
  CHECK(shardlimit_pending_wait(p, wait_us));
  CHECK_RC(shardlimit_pending_string(p, &found, &json, &err), SHARDLIMIT_OK, err);
  CHECK(found && json.ptr != NULL && strstr(json.ptr, "\"limit\":100") != NULL);
  shardlimit_string_free(&json);
  /* another kind of reader is refused, naming the right one */
  CHECK_RC(shardlimit_pending_bool(p, &b, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  shardlimit_pending_free(p);
  shardlimit_decision d;
  CHECK_RC(shardlimit_check_named(l, S("acme"), S("ov"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.limit == 100);
  /* get: found, then a key without one */
  CHECK_RC(shardlimit_get_override_start(l, S("acme"), S("ov"), NULL, NULL, &p, &err),
           SHARDLIMIT_OK, err);
  CHECK(shardlimit_pending_wait(p, wait_us));
  CHECK_RC(shardlimit_pending_string(p, &found, &json, &err), SHARDLIMIT_OK, err);
  CHECK(found && json.ptr != NULL && strstr(json.ptr, "\"key\":\"acme\"") != NULL);
  shardlimit_string_free(&json);
  shardlimit_pending_free(p);
  CHECK_RC(shardlimit_get_override_start(l, S("nobody"), S("ov"), NULL, NULL, &p, &err),
           SHARDLIMIT_OK, err);
  CHECK(shardlimit_pending_wait(p, wait_us));
  found = true;
  CHECK_RC(shardlimit_pending_string(p, &found, &json, &err), SHARDLIMIT_OK, err);
  CHECK(!found && json.ptr == NULL);
  shardlimit_pending_free(p);
  /* list */
  CHECK_RC(shardlimit_list_overrides_start(l, S("ov"), NULL, 0, 10, NULL, NULL, &p, &err),
           SHARDLIMIT_OK, err);
  CHECK(shardlimit_pending_wait(p, wait_us));
  CHECK_RC(shardlimit_pending_string(p, NULL, &json, &err), SHARDLIMIT_OK, err);
  CHECK(json.ptr != NULL && strstr(json.ptr, "\"acme\"") && strstr(json.ptr, "\"cursor\":null"));
  shardlimit_string_free(&json);
  shardlimit_pending_free(p);
  /* delete: true, then false */
  for (int i = 0; i < 2; i++) {
    CHECK_RC(shardlimit_delete_override_start(l, S("acme"), S("ov"), NULL, NULL, &p, &err),
             SHARDLIMIT_OK, err);
    CHECK(shardlimit_pending_wait(p, wait_us));
    CHECK_RC(shardlimit_pending_bool(p, &b, &err), SHARDLIMIT_OK, err);
    CHECK(b == (i == 0));
    shardlimit_pending_free(p);
  }
  /* the shadow report */
  for (int i = 0; i < 3; i++)
    CHECK_RC(shardlimit_check_named(l, S("u1"), S("sh"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_shadow_report_start(l, S("sh"), 0, NULL, NULL, &p, &err), SHARDLIMIT_OK,
           err);
  CHECK(shardlimit_pending_wait(p, wait_us));
  CHECK_RC(shardlimit_pending_string(p, &found, &json, &err), SHARDLIMIT_OK, err);
  CHECK(found && json.ptr && strstr(json.ptr, "\"total\":2") && strstr(json.ptr, "\"u1\""));
  shardlimit_string_free(&json);
  shardlimit_pending_free(p);
  /* arguments are checked by the start: no pending is made */
  p = NULL;
  CHECK_RC(shardlimit_set_override_start(l, S("acme"), S("ov"), S("10/minute"), 0, NULL, NULL,
                                         NULL, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK(p == NULL);
  CHECK_RC(shardlimit_pending_string(NULL, NULL, &json, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  /* the call's own error comes through the pending */
  CHECK_RC(shardlimit_shadow_report_start(l, S("a:b"), 0, NULL, NULL, &p, &err), SHARDLIMIT_OK,
           err);
  CHECK(shardlimit_pending_wait(p, wait_us));
  CHECK_RC(shardlimit_pending_string(p, NULL, &json, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  shardlimit_pending_free(p);
  CHECK_RC(shardlimit_get_override_start(l, S("acme"), S("nope"), NULL, NULL, &p, &err),
           SHARDLIMIT_OK, err);
  CHECK(shardlimit_pending_wait(p, wait_us));
  CHECK_RC(shardlimit_pending_string(p, NULL, &json, &err), SHARDLIMIT_ERR_UNKNOWN_POLICY, err);
  shardlimit_pending_free(p);
  /* Redis stopped: each stays in flight until cancelled */
  CHECK(kill(redis_pid, SIGSTOP) == 0);
  struct seen s;
  atomic_init(&s.calls, 0);
  atomic_init(&s.code, -1);
  CHECK_RC(shardlimit_set_override_start(l, S("acme"), S("ov"), S("10/minute"), 0, on_text, &s,
                                         &p, &err),
           SHARDLIMIT_OK, err);
  CHECK(!shardlimit_pending_wait(p, 20 * 1000));
  CHECK(atomic_load(&s.calls) == 0);
  CHECK(shardlimit_pending_cancel(p));
  CHECK(atomic_load(&s.calls) == 1 && atomic_load(&s.code) == SHARDLIMIT_ERR_CANCELLED);
  shardlimit_pending_free(p);
  atomic_store(&s.calls, 0);
  CHECK_RC(shardlimit_shadow_report_start(l, S("sh"), 0, on_text, &s, &p, &err), SHARDLIMIT_OK,
           err);
  CHECK(!shardlimit_pending_wait(p, 20 * 1000));
  shardlimit_pending_free(p); /* freeing a call in flight cancels it */
  CHECK(atomic_load(&s.calls) == 1 && atomic_load(&s.code) == SHARDLIMIT_ERR_CANCELLED);
  CHECK(kill(redis_pid, SIGCONT) == 0);
  shardlimit_limiter_free(l);
}

/* ---------------------------------------------------------------- shared contracts */

/* A whole file of the repository (the test runs from its root, or $SHARDLIMIT_ROOT), or
 * NULL. The caller frees it. */
static char *read_file(const char *rel) {
  char path[1024];
  const char *root = getenv("SHARDLIMIT_ROOT");
  snprintf(path, sizeof path, "%s/%s", root ? root : ".", rel);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  if (buf) buf[n] = 0;
  fclose(f);
  return buf;
}

/* The next {...} object at the top level of the array that *at is inside (the generated
 * spec files hold no braces inside strings): [*start, *end) and *at past it; 0 at the
 * array's end. */
static int next_object(const char **at, const char **start, const char **end) {
  int depth = 0;
  for (const char *c = *at; *c; c++) {
    if (*c == ']' && depth == 0) return 0;
    if (*c == '{' && depth++ == 0) *start = c;
    if (*c == '}' && --depth == 0) {
      *end = c + 1;
      *at = c + 1;
      return 1;
    }
  }
  return 0;
}

/* The value of "key" in the object [start, end): a string's contents or a bare value,
 * copied into out (empty when absent). */
static void field(const char *start, const char *end, const char *key, char *out, size_t cap) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  out[0] = 0;
  const char *f = strstr(start, pat);
  if (!f || f >= end) return;
  f += strlen(pat);
  int quoted = *f == '"';
  if (quoted) f++;
  size_t n = 0;
  while (f < end && n + 1 < cap && (quoted ? *f != '"' : (*f != ',' && *f != '\n' && *f != '}')))
    out[n++] = *f++;
  out[n] = 0;
}

/* Every operation of spec/operations.json not marked not_in "c" is a function of the C
 * ABI: shardlimit_<op>, or the alias given here (constructors and the policy lookup). The
 * table holds the functions themselves, so a name that does not exist does not link. */
struct op {
  const char *name;
  const char *symbol;
  void (*fn)(void);
};
#define OP(n) {#n, "shardlimit_" #n, (void (*)(void))shardlimit_##n}
#define ALIAS(n, f) {n, #f, (void (*)(void))f}
static const struct op c_ops[] = {
    ALIAS("memory", shardlimit_limiter_new_memory),
    ALIAS("new", shardlimit_limiter_new_json),
    ALIAS("from_config_file", shardlimit_limiter_new_file),
    ALIAS("from_env", shardlimit_limiter_new_env),
    ALIAS("with_clock", shardlimit_clock_new),
    ALIAS("policy", shardlimit_limiter_policy),
    ALIAS("set_log_sink", shardlimit_set_log_callback),
    OP(is_redis), OP(memory_keys), OP(route), OP(reload), OP(reload_from_file), OP(set_scale),
    OP(scale), OP(observe_health), OP(metrics), OP(check), OP(peek), OP(acquire), OP(release),
    OP(reset), OP(check_all), OP(block), OP(unblock), OP(blocked), OP(connect),
    OP(check_shadow), OP(shadow_report),
    OP(charge), OP(refund), OP(reserve), OP(settle),
    OP(plan_policy),
    OP(set_override), OP(get_override), OP(list_overrides), OP(delete_override),
    ALIAS("config", shardlimit_config_json), OP(subscribe), OP(watch_config),
    OP(config_generation),
};
#undef OP
#undef ALIAS
/* Operations of the core the C ABI does not offer yet (before the NULL that ends the list). */
static const char *c_missing[] = {NULL};

static int in_list(const char *name, const char **list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(list[i], name) == 0) return 1;
  return 0;
}

static void test_operations_spec(void) {
  char *text = read_file("spec/operations.json");
  CHECK(text != NULL);
  if (!text) return;
  const char *at = strstr(text, "\"operations\"");
  CHECK(at != NULL);
  if (!at) {
    free(text);
    return;
  }
  at = strchr(at, '[') + 1;
  const char *start, *end;
  size_t seen = 0, missing_seen = 0, nops = sizeof c_ops / sizeof c_ops[0];
  size_t nmissing = sizeof c_missing / sizeof c_missing[0] - 1;
  while (next_object(&at, &start, &end)) {
    char name[128], excluded[8];
    field(start, end, "name", name, sizeof name);
    field(start, end, "c", excluded, sizeof excluded);
    int has = 0;
    for (size_t i = 0; i < nops; i++)
      if (strcmp(c_ops[i].name, name) == 0) has = 1, seen++;
    if (excluded[0]) {
      if (has) fprintf(stderr, "%s is marked not_in c but the ABI has it\n", name), failures++;
    } else if (in_list(name, c_missing, nmissing)) {
      missing_seen++;
      if (has) fprintf(stderr, "%s is listed missing but present\n", name), failures++;
    } else if (!has) {
      fprintf(stderr, "the C ABI lacks the operation %s (shardlimit_%s)\n", name, name);
      failures++;
    }
  }
  CHECK(seen == nops);              /* every table entry is an operation of the spec */
  CHECK(missing_seen == nmissing);  /* and so is every missing one */
  for (size_t i = 0; i < nops; i++) CHECK(c_ops[i].fn != NULL);
  free(text);
}

/* spec/errors.json's codes, names, backend flags and hierarchy are the ABI's. */
static void test_errors_spec(void) {
  char *text = read_file("spec/errors.json");
  CHECK(text != NULL);
  if (!text) return;
  const char *kinds = strstr(text, "\"kinds\"");
  CHECK(kinds != NULL);
  if (!kinds) {
    free(text);
    return;
  }
  char names[32][64];
  unsigned codes[32];
  size_t n = 0;
  const char *at = strchr(kinds, '[') + 1, *start, *end;
  while (n < 32 && next_object(&at, &start, &end)) {
    char code[16];
    field(start, end, "name", names[n], sizeof names[n]);
    field(start, end, "code", code, sizeof code);
    codes[n++] = (unsigned)strtoul(code, NULL, 10);
  }
  CHECK(n >= 9);
  at = strchr(kinds, '[') + 1;
  for (size_t i = 0; next_object(&at, &start, &end); i++) {
    char backend[8], parent[64];
    field(start, end, "backend", backend, sizeof backend);
    field(start, end, "parent", parent, sizeof parent);
    CHECK(str_eq(shardlimit_result_name(codes[i]), names[i]));
    CHECK(shardlimit_result_is_backend(codes[i]) == (strcmp(backend, "true") == 0));
    unsigned want = 0;
    for (size_t j = 0; j < n; j++)
      if (strcmp(names[j], parent) == 0) want = codes[j];
    CHECK(strcmp(parent, "null") == 0 || want != 0);
    if (shardlimit_result_parent(codes[i]) != want)
      fprintf(stderr, "%s: parent %u, spec %s\n", names[i], shardlimit_result_parent(codes[i]),
              parent),
          failures++;
  }
  const char *retired = strstr(text, "\"retired\"");
  CHECK(retired != NULL);
  if (retired) {
    at = strchr(retired, '[') + 1;
    while (next_object(&at, &start, &end)) {
      char code[16];
      field(start, end, "code", code, sizeof code);
      CHECK(str_eq(shardlimit_result_name((uint32_t)strtoul(code, NULL, 10)), "unknown"));
    }
  }
  free(text);
}

/* ---------------------------------------------------------------- a small JSON reader */

/* A parsed JSON value of the vectors. Every value keeps its source text [s, e) (the
 * policies object goes into a config as written); strings are decoded into `str`. */
enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
typedef struct jv {
  int type;
  const char *s, *e;
  int b;
  char *str;        /* J_STR: decoded, NUL-terminated */
  size_t n;         /* J_ARR, J_OBJ: number of items */
  char **keys;      /* J_OBJ: decoded keys */
  struct jv *items; /* J_ARR, J_OBJ */
} jv;

static void jv_free(jv *v) {
  for (size_t i = 0; i < v->n; i++) {
    jv_free(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->str);
  memset(v, 0, sizeof *v);
}

static void j_ws(const char **p, const char *end) {
  while (*p < end && (**p == ' ' || **p == '\n' || **p == '\r' || **p == '\t')) (*p)++;
}

/* A JSON string at *p (on its opening quote), decoded into a new NUL-terminated buffer;
 * NULL on bad input. */
static char *j_string(const char **p, const char *end) {
  if (*p >= end || **p != '"') return NULL;
  (*p)++;
  size_t cap = 16, n = 0;
  char *out = malloc(cap);
  while (out && *p < end && **p != '"') {
    if (n + 5 > cap) {
      char *grown = realloc(out, cap *= 2);
      if (!grown) break;
      out = grown;
    }
    unsigned char c = (unsigned char)*(*p)++;
    if (c < 0x20) break;
    if (c != '\\') {
      out[n++] = (char)c;
      continue;
    }
    if (*p >= end) break;
    c = (unsigned char)*(*p)++;
    switch (c) {
      case '"': case '\\': case '/': out[n++] = (char)c; continue;
      case 'b': out[n++] = '\b'; continue;
      case 'f': out[n++] = '\f'; continue;
      case 'n': out[n++] = '\n'; continue;
      case 'r': out[n++] = '\r'; continue;
      case 't': out[n++] = '\t'; continue;
      case 'u': break;
      default: goto bad;
    }
    if (end - *p < 4) goto bad;
    char hex[5] = {(*p)[0], (*p)[1], (*p)[2], (*p)[3], 0}, *hend;
    unsigned long u = strtoul(hex, &hend, 16);
    if (hend != hex + 4 || (u >= 0xd800 && u < 0xe000) || u == 0) goto bad; /* no pairs, NUL */
    *p += 4;
    if (u < 0x80) {
      out[n++] = (char)u;
    } else if (u < 0x800) {
      out[n++] = (char)(0xc0 | (u >> 6));
      out[n++] = (char)(0x80 | (u & 0x3f));
    } else {
      out[n++] = (char)(0xe0 | (u >> 12));
      out[n++] = (char)(0x80 | ((u >> 6) & 0x3f));
      out[n++] = (char)(0x80 | (u & 0x3f));
    }
  }
  if (out && *p < end && **p == '"') {
    (*p)++;
    out[n] = 0;
    return out;
  }
bad:
  free(out);
  return NULL;
}

/* Parses one value at *p into *v; 0 (and nothing to free) on bad input. */
static int j_value(const char **p, const char *end, jv *v, int depth) {
  memset(v, 0, sizeof *v);
  j_ws(p, end);
  if (*p >= end || depth > 32) return 0;
  v->s = *p;
  char c = **p;
  if (c == '{' || c == '[') {
    int obj = c == '{';
    v->type = obj ? J_OBJ : J_ARR;
    (*p)++;
    j_ws(p, end);
    if (*p < end && **p == (obj ? '}' : ']')) {
      (*p)++;
      v->e = *p;
      return 1;
    }
    for (;;) {
      char *key = NULL;
      if (obj) {
        j_ws(p, end);
        key = j_string(p, end);
        j_ws(p, end);
        if (!key || *p >= end || **p != ':') {
          free(key);
          goto bad;
        }
        (*p)++;
      }
      jv *items = realloc(v->items, (v->n + 1) * sizeof *items);
      char **keys = obj ? realloc(v->keys, (v->n + 1) * sizeof *keys) : NULL;
      if (items) v->items = items;
      if (keys) v->keys = keys;
      if (!items || (obj && !keys) || !j_value(p, end, &v->items[v->n], depth + 1)) {
        free(key);
        goto bad;
      }
      if (obj) v->keys[v->n] = key;
      v->n++;
      j_ws(p, end);
      if (*p < end && **p == ',') {
        (*p)++;
        continue;
      }
      if (*p < end && **p == (obj ? '}' : ']')) {
        (*p)++;
        v->e = *p;
        return 1;
      }
      goto bad;
    }
  }
  if (c == '"') {
    v->type = J_STR;
    v->str = j_string(p, end);
    v->e = *p;
    return v->str != NULL;
  }
  if (end - *p >= 4 && memcmp(*p, "null", 4) == 0) return *p += 4, v->e = *p, v->type = J_NULL, 1;
  if (end - *p >= 4 && memcmp(*p, "true", 4) == 0)
    return *p += 4, v->e = *p, v->type = J_BOOL, v->b = 1, 1;
  if (end - *p >= 5 && memcmp(*p, "false", 5) == 0) return *p += 5, v->e = *p, v->type = J_BOOL, 1;
  if (c == '-' || (c >= '0' && c <= '9')) {
    while (*p < end && strchr("-+.eE0123456789", **p)) (*p)++;
    v->type = J_NUM;
    v->e = *p;
    return 1;
  }
bad:
  jv_free(v);
  return 0;
}

/* The member `key` of an object, or NULL. */
static const jv *jget(const jv *o, const char *key) {
  if (!o || o->type != J_OBJ) return NULL;
  for (size_t i = 0; i < o->n; i++)
    if (strcmp(o->keys[i], key) == 0) return &o->items[i];
  return NULL;
}

/* A member that must be a string ("" and a failure otherwise). */
static const char *jstr(const jv *o, const char *key, const char *where) {
  const jv *v = jget(o, key);
  if (v && v->type == J_STR) return v->str;
  fprintf(stderr, "%s: \"%s\" is not a string\n", where, key);
  failures++;
  return "";
}

/* A value that must be a whole number >= 0. */
static int j_u64(const jv *v, uint64_t *out) {
  if (!v || v->type != J_NUM || v->s[0] == '-') return 0;
  char buf[32], *bend;
  size_t len = (size_t)(v->e - v->s);
  if (len == 0 || len >= sizeof buf) return 0;
  memcpy(buf, v->s, len);
  buf[len] = 0;
  errno = 0;
  unsigned long long n = strtoull(buf, &bend, 10);
  if (*bend || errno) return 0;
  *out = n;
  return 1;
}

static uint64_t ju64(const jv *o, const char *key, const char *where) {
  uint64_t n = 0;
  if (!j_u64(jget(o, key), &n)) {
    fprintf(stderr, "%s: \"%s\" is not a whole number\n", where, key);
    failures++;
  }
  return n;
}

/* ---------------------------------------------------------------- vector replay */

/* Whether two parsed values are the same JSON: numbers by their text, strings decoded,
 * objects by their keys in any order, arrays in order. */
static int jv_same(const jv *a, const jv *b) {
  if (!a || !b || a->type != b->type) return 0;
  switch (a->type) {
    case J_NULL: return 1;
    case J_BOOL: return a->b == b->b;
    case J_NUM: return a->e - a->s == b->e - b->s && memcmp(a->s, b->s, (size_t)(a->e - a->s)) == 0;
    case J_STR: return strcmp(a->str, b->str) == 0;
    case J_ARR:
      if (a->n != b->n) return 0;
      for (size_t i = 0; i < a->n; i++)
        if (!jv_same(&a->items[i], &b->items[i])) return 0;
      return 1;
    default:
      if (a->n != b->n) return 0;
      for (size_t i = 0; i < a->n; i++)
        if (!jv_same(&a->items[i], jget(b, a->keys[i]))) return 0;
      return 1;
  }
}

/* The decision files of tests/vectors, every one replayed in full (format: the `format`
 * list at the top of algorithms.json and of each file that adds ops). */
static const char *const vector_files[] = {"algorithms.json", "plans.json", "precision.json",
                                           "settle.json",     "shadow.json", "overrides.json"};
/* The other files of tests/vectors and the test of this file that replays each; files no
 * C test replays would go into vector_skipped with the reason (none today). */
static const char *const vector_other[][2] = {
    {"keys.json", "test_key_vectors (the key rule, bytes as they are)"},
    {"routing.json", "test_routing_vectors (every case among 1 to 16 shards)"},
};
static const char *const vector_skipped[][2] = {{NULL, NULL}};
#define NFILES(a) (sizeof(a) / sizeof((a)[0]))

/* Every op of every file; the replay fails when one is never seen, or an unknown one is. */
static const char *const vector_ops[] = {
    "check",  "peek",   "acquire", "release", "reset",         "check_all",    "batch",
    "charge", "refund", "reserve", "settle",  "shadow_report", "set_override", "delete_override"};
#define NOPS (sizeof vector_ops / sizeof vector_ops[0])

/* One case of the vectors being replayed: its limiter, and the leases and reservations
 * kept by name (names, keys and policies borrowed from the parsed file). */
#define VEC_LEASES 32
struct vec_replay {
  shardlimit_limiter *l;
  uint32_t source; /* the source every decision must have: memory or redis */
  const char *names[VEC_LEASES];
  shardlimit_lease *leases[VEC_LEASES];
  int nleases;
  const char *rnames[VEC_LEASES], *rkeys[VEC_LEASES], *rpolicies[VEC_LEASES];
  const jv *rsteps[VEC_LEASES]; /* the reserve step (its plan, if any, settles it too) */
  shardlimit_reservation reservations[VEC_LEASES];
  int nreservations;
};

/* The RateLimit-Policy header d renders, into buf ("" when none). */
static void vec_rate_limit_policy(const shardlimit_decision *d, char *buf, size_t cap) {
  shardlimit_error *err = NULL;
  shardlimit_headers *h = NULL;
  buf[0] = 0;
  CHECK_RC(shardlimit_decision_headers(d, &h, &err), SHARDLIMIT_OK, err);
  for (size_t i = 0; h && i < shardlimit_headers_len(h); i++) {
    shardlimit_str name, value;
    CHECK_RC(shardlimit_headers_get(h, i, &name, &value, &err), SHARDLIMIT_OK, err);
    if (name.len == 16 && memcmp(name.ptr, "RateLimit-Policy", 16) == 0)
      snprintf(buf, cap, "%.*s", (int)value.len, value.ptr);
  }
  shardlimit_headers_free(h);
}

/* Compares every field of `expect` with d; prints both on a difference. An expectation has
 * the 8 fields of a decision, plus limit_index and rate_limit_policy for a multi-limit
 * policy (plans.json) and "shadow_denied": true for a shadow denial (shadow.json). */
static void vec_compare(const char *where, const jv *expect, const shardlimit_decision *d,
                        uint32_t source) {
  static const char *const fields[] = {"allowed", "limit", "remaining", "reset_after_us",
                                       "retry_after_us", "delay_us", "policy", "layer"};
  const size_t nfields = sizeof fields / sizeof fields[0];
  const jv *limit_index = jget(expect, "limit_index"), *rlp = jget(expect, "rate_limit_policy"),
           *shadow = jget(expect, "shadow_denied");
  size_t want_n = nfields + (limit_index ? 2 : 0) + (shadow ? 1 : 0);
  int same = expect && expect->type == J_OBJ && expect->n == want_n && !limit_index == !rlp &&
             (!rlp || rlp->type == J_STR) && (!shadow || (shadow->type == J_BOOL && shadow->b));
  for (size_t i = 0; same && i < nfields; i++) same = jget(expect, fields[i]) != NULL;
  if (!same) {
    fprintf(stderr, "%s: expect is not the %zu fields of a decision (with limit_index and "
            "rate_limit_policy, \"shadow_denied\": true)\n", where, nfields);
    failures++;
    return;
  }
  const jv *allowed = jget(expect, "allowed"), *retry = jget(expect, "retry_after_us"),
           *policy = jget(expect, "policy"), *layer = jget(expect, "layer");
  uint64_t limit = 0, remaining = 0, reset = 0, retry_us = 0, delay = 0, layer_ix = 0, li = 0;
  int ok = allowed->type == J_BOOL && j_u64(jget(expect, "limit"), &limit) &&
           j_u64(jget(expect, "remaining"), &remaining) &&
           j_u64(jget(expect, "reset_after_us"), &reset) &&
           j_u64(jget(expect, "delay_us"), &delay) && policy->type == J_STR &&
           (retry->type == J_NULL || j_u64(retry, &retry_us)) &&
           (layer->type == J_NULL || j_u64(layer, &layer_ix)) &&
           (!limit_index || j_u64(limit_index, &li));
  if (!ok) {
    fprintf(stderr, "%s: a field of expect has the wrong type: %.*s\n", where,
            (int)(expect->e - expect->s), expect->s);
    failures++;
    return;
  }
  char header[512] = "";
  if (d->has_limit_index) vec_rate_limit_policy(d, header, sizeof header);
  same = d->allowed == (bool)allowed->b && d->limit == limit && d->remaining == remaining &&
         d->reset_after_us == reset && d->delay_us == delay &&
         (retry->type == J_NULL ? !d->has_retry_after
                                : d->has_retry_after && d->retry_after_us == retry_us) &&
         d->policy_len == strlen(policy->str) && strcmp(d->policy, policy->str) == 0 &&
         (layer->type == J_NULL ? !d->has_layer : d->has_layer && d->layer == layer_ix) &&
         (limit_index ? d->has_limit_index && d->limit_index == li &&
                            strcmp(header, rlp->str) == 0
                      : !d->has_limit_index) &&
         d->shadow_denied == (shadow != NULL) && d->source == source;
  if (!same) {
    char rs[24] = "null", ls[24] = "null", lis[24] = "null";
    if (d->has_retry_after) snprintf(rs, sizeof rs, "%llu", (unsigned long long)d->retry_after_us);
    if (d->has_layer) snprintf(ls, sizeof ls, "%u", d->layer);
    if (d->has_limit_index) snprintf(lis, sizeof lis, "%u", d->limit_index);
    fprintf(stderr,
            "%s: got {\"allowed\": %s, \"limit\": %llu, \"remaining\": %llu, "
            "\"reset_after_us\": %llu, \"retry_after_us\": %s, \"delay_us\": %llu, "
            "\"policy\": \"%s\", \"layer\": %s, \"limit_index\": %s, \"rate_limit_policy\": "
            "\"%s\", \"shadow_denied\": %s} from %s; want %.*s from %s\n",
            where, d->allowed ? "true" : "false", (unsigned long long)d->limit,
            (unsigned long long)d->remaining, (unsigned long long)d->reset_after_us, rs,
            (unsigned long long)d->delay_us, d->policy, ls, lis, header,
            d->shadow_denied ? "true" : "false", shardlimit_source_name(d->source).ptr,
            (int)(expect->e - expect->s), expect->s, shardlimit_source_name(source).ptr);
    failures++;
  }
}

/* The step's policy: by name, or as the step's plan has it (plans.json). NULL (a failure
 * printed) when there is none. The caller frees it. */
static shardlimit_policy *vec_policy(struct vec_replay *r, const jv *it, const char *name,
                                     const char *where) {
  shardlimit_error *err = NULL;
  shardlimit_policy *pol = NULL;
  const jv *plan = jget(it, "plan");
  shardlimit_result rc =
      plan ? shardlimit_plan_policy(r->l, plan->type == J_STR ? plan->str : "",
                                    plan->type == J_STR ? strlen(plan->str) : 0, name,
                                    strlen(name), &pol, &err)
           : shardlimit_limiter_policy(r->l, name, strlen(name), &pol, &err);
  if (rc != SHARDLIMIT_OK) {
    fprintf(stderr, "%s: policy %s: %s: %s\n", where, name, shardlimit_result_name(rc).ptr,
            err ? shardlimit_error_message(err).ptr : "(no error object)");
    failures++;
    shardlimit_error_free(err);
    return NULL;
  }
  return pol;
}

/* Prints a failed call; 1 when rc is OK. */
static int vec_ok(shardlimit_result rc, shardlimit_error *err, const char *where) {
  if (rc == SHARDLIMIT_OK) return 1;
  fprintf(stderr, "%s: %s: %s\n", where, shardlimit_result_name(rc).ptr,
          err ? shardlimit_error_message(err).ptr : "(no error object)");
  failures++;
  shardlimit_error_free(err);
  return 0;
}

/* A check (in shadow mode with "shadow": true), peek or acquire: a step, or an item of a
 * batch. */
static void vec_call(struct vec_replay *r, const jv *it, const char *where) {
  const char *op = jstr(it, "op", where), *key = jstr(it, "key", where),
             *name = jstr(it, "policy", where);
  const jv *shadow = jget(it, "shadow");
  shardlimit_error *err = NULL;
  shardlimit_decision d;
  shardlimit_lease *lease = NULL;
  shardlimit_policy *pol = vec_policy(r, it, name, where);
  if (!pol) return;
  shardlimit_result rc;
  if (strcmp(op, "check") == 0 && shadow && shadow->type == J_BOOL && shadow->b)
    rc = shardlimit_check_shadow(r->l, key, strlen(key), pol, ju64(it, "cost", where), &d, &err);
  else if (strcmp(op, "check") == 0)
    rc = shardlimit_check(r->l, key, strlen(key), pol, ju64(it, "cost", where), &d, &err);
  else if (strcmp(op, "peek") == 0)
    rc = shardlimit_peek(r->l, key, strlen(key), pol, &d, &err);
  else if (strcmp(op, "acquire") == 0)
    rc = shardlimit_acquire(r->l, key, strlen(key), pol, ju64(it, "units", where), &d, &lease,
                            &err);
  else {
    fprintf(stderr, "%s: op \"%s\" cannot be a batch item\n", where, op);
    failures++;
    shardlimit_policy_free(pol);
    return;
  }
  shardlimit_policy_free(pol);
  if (!vec_ok(rc, err, where)) return;
  vec_compare(where, jget(it, "expect"), &d, r->source);
  const jv *lease_as = jget(it, "lease_as");
  if (!lease_as) {
    shardlimit_lease_free(lease); /* never released: it expires after lease_ttl */
    return;
  }
  if (lease_as->type != J_STR || !lease || r->nleases == VEC_LEASES) {
    fprintf(stderr, "%s: no lease to keep as %.*s\n", where, (int)(lease_as->e - lease_as->s),
            lease_as->s);
    failures++;
    shardlimit_lease_free(lease);
    return;
  }
  r->names[r->nleases] = lease_as->str;
  r->leases[r->nleases++] = lease;
}

/* settle.json's ops: charge, refund, reserve (keeping the reservation under reserve_as)
 * and settle (of a reservation kept by name, with the key and policy of its reserve). */
static void vec_settle_op(struct vec_replay *r, const jv *s, const char *op, const char *where) {
  shardlimit_error *err = NULL;
  shardlimit_decision d;
  shardlimit_result rc;
  if (strcmp(op, "settle") == 0) {
    const char *name = jstr(s, "reservation", where);
    int i = r->nreservations - 1;
    while (i >= 0 && strcmp(r->rnames[i], name) != 0) i--;
    if (i < 0) {
      fprintf(stderr, "%s: no reservation \"%s\" was kept\n", where, name);
      failures++;
      return;
    }
    shardlimit_policy *pol = vec_policy(r, r->rsteps[i], r->rpolicies[i], where);
    if (!pol) return;
    rc = shardlimit_settle(r->l, r->rkeys[i], strlen(r->rkeys[i]), pol, &r->reservations[i],
                           ju64(s, "actual", where), &d, &err);
    shardlimit_policy_free(pol);
  } else {
    const char *key = jstr(s, "key", where), *name = jstr(s, "policy", where);
    uint64_t cost = ju64(s, "cost", where);
    shardlimit_reservation res;
    memset(&res, 0, sizeof res);
    shardlimit_policy *pol = vec_policy(r, s, name, where);
    if (!pol) return;
    if (strcmp(op, "charge") == 0)
      rc = shardlimit_charge(r->l, key, strlen(key), pol, cost, &d, &err);
    else if (strcmp(op, "refund") == 0)
      rc = shardlimit_refund(r->l, key, strlen(key), pol, cost, &d, &err);
    else
      rc = shardlimit_reserve(r->l, key, strlen(key), pol, cost, &d, &res, &err);
    shardlimit_policy_free(pol);
    const jv *as = jget(s, "reserve_as");
    if (rc == SHARDLIMIT_OK && as) {
      if (as->type != J_STR || !res.reserved || r->nreservations == VEC_LEASES) {
        fprintf(stderr, "%s: no reservation to keep as %.*s\n", where, (int)(as->e - as->s),
                as->s);
        failures++;
      } else {
        r->rnames[r->nreservations] = as->str;
        r->rkeys[r->nreservations] = key;
        r->rpolicies[r->nreservations] = name;
        r->rsteps[r->nreservations] = s;
        r->reservations[r->nreservations++] = res;
      }
    }
  }
  if (vec_ok(rc, err, where)) vec_compare(where, jget(s, "expect"), &d, r->source);
}

/* shadow.json's shadow_report and overrides.json's set_override and delete_override. */
static void vec_admin_op(struct vec_replay *r, const jv *s, const char *op, const char *where) {
  shardlimit_error *err = NULL;
  const char *name = jstr(s, "policy", where);
  if (strcmp(op, "shadow_report") == 0) {
    uint64_t top = 0;
    if (jget(s, "top")) top = ju64(s, "top", where);
    shardlimit_string out = {NULL, 0};
    if (!vec_ok(shardlimit_shadow_report(r->l, name, strlen(name), (size_t)top, &out, &err), err,
                where))
      return;
    const char *p = out.ptr;
    jv got;
    int parsed = j_value(&p, out.ptr + out.len, &got, 0);
    const jv *want = jget(s, "expect_report");
    if (!parsed || !jv_same(&got, want)) {
      fprintf(stderr, "%s: report %.*s, want %.*s\n", where, (int)out.len, out.ptr,
              want ? (int)(want->e - want->s) : 0, want ? want->s : "");
      failures++;
    }
    if (parsed) jv_free(&got);
    shardlimit_string_free(&out);
    return;
  }
  const char *key = jstr(s, "key", where);
  if (strcmp(op, "set_override") == 0) {
    const char *limit = jstr(s, "limit", where);
    uint64_t ttl_ms = 0;
    if (jget(s, "ttl_ms")) ttl_ms = ju64(s, "ttl_ms", where);
    vec_ok(shardlimit_set_override(r->l, key, strlen(key), name, strlen(name), limit,
                                   strlen(limit), ttl_ms, NULL, &err),
           err, where);
    return;
  }
  const jv *want = jget(s, "expect_deleted");
  bool deleted = false;
  if (!vec_ok(shardlimit_delete_override(r->l, key, strlen(key), name, strlen(name), &deleted,
                                         &err),
              err, where))
    return;
  if (!want || want->type != J_BOOL || deleted != (bool)want->b) {
    fprintf(stderr, "%s: deleted %d, want %s\n", where, deleted,
            want && want->type == J_BOOL ? (want->b ? "true" : "false") : "(no expect_deleted)");
    failures++;
  }
}

static void vec_step(struct vec_replay *r, const jv *s, const char *where) {
  const char *op = jstr(s, "op", where);
  shardlimit_error *err = NULL;
  if (strcmp(op, "check") == 0 || strcmp(op, "peek") == 0 || strcmp(op, "acquire") == 0) {
    vec_call(r, s, where);
  } else if (strcmp(op, "batch") == 0) {
    /* one after another, in order, at the step's t_us: calls made concurrently would have
     * no order, and the items' decisions depend on it */
    const jv *items = jget(s, "items");
    if (!items || items->type != J_ARR || items->n == 0) {
      fprintf(stderr, "%s: a batch without items\n", where);
      failures++;
      return;
    }
    for (size_t j = 0; j < items->n; j++) {
      char at[400];
      snprintf(at, sizeof at, "%s, item %zu", where, j);
      if (jget(&items->items[j], "t_us")) {
        fprintf(stderr, "%s: a batch item has no t_us of its own\n", at);
        failures++;
      }
      vec_call(r, &items->items[j], at);
    }
  } else if (strcmp(op, "release") == 0) {
    const char *name = jstr(s, "lease", where);
    const jv *want = jget(s, "expect_released");
    shardlimit_lease *held = NULL;
    for (int i = 0; i < r->nleases; i++)
      if (strcmp(r->names[i], name) == 0) held = r->leases[i];
    if (!held || !want || want->type != J_BOOL) {
      fprintf(stderr, "%s: no lease \"%s\" or no expect_released\n", where, name);
      failures++;
      return;
    }
    bool was = false;
    CHECK_RC(shardlimit_release(r->l, held, &was, &err), SHARDLIMIT_OK, err);
    if (was != (bool)want->b) {
      fprintf(stderr, "%s: released %d, want %d\n", where, was, want->b);
      failures++;
    }
  } else if (strcmp(op, "reset") == 0) {
    const char *key = jstr(s, "key", where), *name = jstr(s, "policy", where);
    shardlimit_policy *pol = vec_policy(r, s, name, where);
    if (pol) CHECK_RC(shardlimit_reset(r->l, key, strlen(key), pol, &err), SHARDLIMIT_OK, err);
    shardlimit_policy_free(pol);
  } else if (strcmp(op, "check_all") == 0) {
    const jv *layers = jget(s, "layers");
    shardlimit_layer ls[64];
    if (!layers || layers->type != J_ARR || layers->n == 0 || layers->n > 64) {
      fprintf(stderr, "%s: no layers\n", where);
      failures++;
      return;
    }
    for (size_t i = 0; i < layers->n; i++) {
      const jv *la = &layers->items[i];
      const char *key = jstr(la, "key", where), *name = jstr(la, "policy", where);
      ls[i] = (shardlimit_layer){.key = key, .key_len = strlen(key), .policy = NULL,
                                 .policy_name = name, .policy_name_len = strlen(name),
                                 .cost = ju64(la, "cost", where)};
    }
    shardlimit_decision d;
    if (vec_ok(shardlimit_check_all(r->l, ls, layers->n, &d, &err), err, where))
      vec_compare(where, jget(s, "expect"), &d, r->source);
  } else if (strcmp(op, "charge") == 0 || strcmp(op, "refund") == 0 ||
             strcmp(op, "reserve") == 0 || strcmp(op, "settle") == 0) {
    vec_settle_op(r, s, op, where);
  } else if (strcmp(op, "shadow_report") == 0 || strcmp(op, "set_override") == 0 ||
             strcmp(op, "delete_override") == 0) {
    vec_admin_op(r, s, op, where);
  } else {
    fprintf(stderr, "%s: unknown op \"%s\": teach this replay the op\n", where, op);
    failures++;
  }
}

/* Appends `,"name":<raw text>` of a case's member (plans, default_algorithm) to cfg. */
static void vec_member(char *cfg, size_t cap, const jv *c, const char *name) {
  const jv *v = jget(c, name);
  size_t len = strlen(cfg);
  if (v) snprintf(cfg + len, cap - len, ",\"%s\":%.*s", name, (int)(v->e - v->s), v->s);
}

/* Replays every case and every step of tests/vectors/<file> (format: the list at the top of
 * algorithms.json, and the file's own) on a fresh limiter with a manual clock set to each
 * step's t_us: in memory or on the suite's redis-server (a key prefix of its own per case).
 * An unknown op fails loudly. Returns the steps replayed; marks the ops seen. */
static size_t replay_vector_file(const char *file, int on_redis, int *op_seen) {
  char rel[128];
  snprintf(rel, sizeof rel, "tests/vectors/%s", file);
  char *text = read_file(rel);
  CHECK(text != NULL);
  if (!text) return 0;
  const char *p = text;
  jv doc;
  int parsed = j_value(&p, text + strlen(text), &doc, 0);
  CHECK(parsed);
  if (!parsed) {
    fprintf(stderr, "%s: not JSON that the test's reader takes\n", file);
    free(text);
    return 0;
  }
  const jv *cases = jget(&doc, "cases");
  CHECK(cases != NULL && cases->type == J_ARR && cases->n > 0);
  size_t steps = 0, total = 0;
  static size_t prefix = 0;
  for (size_t ci = 0; cases && ci < cases->n; ci++) {
    const jv *c = &cases->items[ci];
    const char *name = jstr(c, "name", file);
    const jv *policies = jget(c, "policies"), *case_steps = jget(c, "steps");
    if (!policies || policies->type != J_OBJ || !case_steps || case_steps->type != J_ARR) {
      fprintf(stderr, "%s: case %zu: no policies or steps\n", file, ci);
      failures++;
      continue;
    }
    total += case_steps->n;
    size_t cap = (size_t)(c->e - c->s) + 256;
    char *cfg = malloc(cap);
    if (!cfg) abort();
    if (on_redis)
      snprintf(cfg, cap,
               "{\"shards\":[{\"name\":\"s0\",\"url\":\"redis://127.0.0.1:%d\"}],"
               "\"timeout_ms\":2000,\"key_prefix\":\"cvec%zu:\",\"policies\":%.*s",
               redis_port, prefix++, (int)(policies->e - policies->s), policies->s);
    else
      snprintf(cfg, cap, "{\"policies\":%.*s", (int)(policies->e - policies->s), policies->s);
    vec_member(cfg, cap, c, "plans");
    vec_member(cfg, cap, c, "default_algorithm");
    strncat(cfg, "}", cap - strlen(cfg) - 1);
    shardlimit_error *err = NULL;
    shardlimit_clock *clk = NULL;
    struct vec_replay r;
    memset(&r, 0, sizeof r);
    r.source = on_redis ? SHARDLIMIT_SOURCE_REDIS : SHARDLIMIT_SOURCE_MEMORY;
    CHECK_RC(shardlimit_clock_new(0, &clk, &err), SHARDLIMIT_OK, err);
    CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), clk, &r.l, &err), SHARDLIMIT_OK, err);
    free(cfg);
    for (size_t si = 0; r.l && si < case_steps->n; si++) {
      const jv *s = &case_steps->items[si];
      char where[320];
      const char *op = jstr(s, "op", name);
      snprintf(where, sizeof where, "vectors (%s) %s: %s, step %zu (%s)",
               on_redis ? "redis" : "memory", file, name, si, op);
      size_t k = 0;
      while (k < NOPS && strcmp(op, vector_ops[k]) != 0) k++;
      if (k < NOPS) op_seen[k] = 1;
      CHECK_RC(shardlimit_clock_set_us(clk, ju64(s, "t_us", where), &err), SHARDLIMIT_OK, err);
      vec_step(&r, s, where);
      steps++;
    }
    for (int i = 0; i < r.nleases; i++) shardlimit_lease_free(r.leases[i]);
    shardlimit_limiter_free(r.l);
    shardlimit_clock_free(clk);
  }
  if (steps != total) fprintf(stderr, "%s: replayed %zu steps of %zu\n", file, steps, total);
  CHECK(steps == total);
  jv_free(&doc);
  free(text);
  return steps;
}

/* Every decision file, in memory or on Redis; every op of vector_ops must be seen. */
static void replay_vectors(int on_redis) {
  int op_seen[NOPS] = {0};
  size_t steps = 0;
  for (size_t f = 0; f < NFILES(vector_files); f++)
    steps += replay_vector_file(vector_files[f], on_redis, op_seen);
  CHECK(steps > 300);
  for (size_t k = 0; k < NOPS; k++)
    if (!op_seen[k]) fprintf(stderr, "the vectors lack the op %s\n", vector_ops[k]), failures++;
}

/* Whether `file` is a decision file, another file replayed by a test here, or skipped with
 * a reason. */
static int vector_file_known(const char *file) {
  for (size_t i = 0; i < NFILES(vector_files); i++)
    if (strcmp(file, vector_files[i]) == 0) return 1;
  for (size_t i = 0; i < NFILES(vector_other); i++)
    if (strcmp(file, vector_other[i][0]) == 0) return 1;
  for (size_t i = 0; i < NFILES(vector_skipped); i++)
    if (vector_skipped[i][0] && strcmp(file, vector_skipped[i][0]) == 0)
      return vector_skipped[i][1] && vector_skipped[i][1][0];
  return 0;
}

/* A new file in tests/vectors fails here until a C test replays it or it is skipped with a
 * reason, so that no vector file is silently ignored by the C binding. */
static void test_vector_files(void) {
  char path[1024];
  const char *root = getenv("SHARDLIMIT_ROOT");
  snprintf(path, sizeof path, "%s/tests/vectors", root ? root : ".");
  DIR *dir = opendir(path);
  CHECK(dir != NULL);
  if (!dir) return;
  size_t seen = 0;
  for (struct dirent *e; (e = readdir(dir)) != NULL;) {
    size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 5, ".json") != 0) continue;
    seen++;
    if (!vector_file_known(e->d_name)) {
      fprintf(stderr, "tests/vectors/%s is neither replayed by the C test nor skipped with a "
              "reason\n", e->d_name);
      failures++;
    }
  }
  closedir(dir);
  /* every listed file is there */
  CHECK(seen == NFILES(vector_files) + NFILES(vector_other));
  char *readme = read_file("tests/vectors/README.md");
  CHECK(readme != NULL); /* the step formats of every file */
  free(readme);
}

/* The routing contract (tests/vectors/routing.json): every case's shard among 1 to 16
 * shards, as shardlimit_route() reports it (shard names s0, s1, ...). */
static void test_routing_vectors(void) {
  char *text = read_file("tests/vectors/routing.json");
  CHECK(text != NULL);
  if (!text) return;
  const char *p = text;
  jv doc;
  int parsed = j_value(&p, text + strlen(text), &doc, 0);
  CHECK(parsed);
  const jv *cases = parsed ? jget(&doc, "cases") : NULL;
  CHECK(cases != NULL && cases->type == J_ARR && cases->n > 0);
  for (uint32_t n = 1; cases && n <= 16; n++) {
    char cfg[2048] = "{\"policies\":{},\"shards\":[";
    for (uint32_t i = 0; i < n; i++) {
      size_t len = strlen(cfg);
      snprintf(cfg + len, sizeof cfg - len, "%s{\"name\":\"s%u\",\"url\":\"redis://127.0.0.1:%d\"}",
               i ? "," : "", i, redis_port);
    }
    strncat(cfg, "]}", sizeof cfg - strlen(cfg) - 1);
    shardlimit_error *err = NULL;
    shardlimit_limiter *l = NULL;
    CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &l, &err), SHARDLIMIT_OK, err);
    for (size_t ci = 0; l && ci < cases->n; ci++) {
      const jv *c = &cases->items[ci], *shard_for = jget(c, "shard_for");
      const char *key = jstr(c, "key", "routing case");
      uint64_t want = 0;
      if (!shard_for || shard_for->type != J_ARR || shard_for->n < n ||
          !j_u64(&shard_for->items[n - 1], &want)) {
        fprintf(stderr, "routing case %zu: no shard_for[%u]\n", ci, n - 1);
        failures++;
        continue;
      }
      uint32_t idx = 0;
      shardlimit_string sname = {NULL, 0};
      char want_name[16];
      snprintf(want_name, sizeof want_name, "s%llu", (unsigned long long)want);
      shardlimit_result rc = shardlimit_route(l, key, strlen(key), &idx, &sname, &err);
      if (rc != SHARDLIMIT_OK || idx != want || !sname.ptr || strcmp(sname.ptr, want_name) != 0) {
        fprintf(stderr, "routing: key \"%s\" among %u shards: %u %s (%s), want %llu\n", key, n, idx,
                sname.ptr ? sname.ptr : "-", shardlimit_result_name(rc).ptr,
                (unsigned long long)want);
        failures++;
      }
      shardlimit_string_free(&sname);
      shardlimit_error_free(err);
      err = NULL;
    }
    shardlimit_limiter_free(l);
  }
  if (parsed) jv_free(&doc);
  free(text);
}

/* The one key rule (tests/vectors/keys.json): every key, as the bytes the hex gives (so
 * invalid UTF-8 and NUL are passed as they are), is accepted or is an INVALID_ARGUMENT
 * naming `key`. */
static void test_key_vectors(void) {
  char *text = read_file("tests/vectors/keys.json");
  CHECK(text != NULL);
  if (!text) return;
  const char *p = text;
  jv doc;
  int parsed = j_value(&p, text + strlen(text), &doc, 0);
  CHECK(parsed);
  const jv *cases = parsed ? jget(&doc, "cases") : NULL;
  CHECK(cases != NULL && cases->type == J_ARR && cases->n >= 10);
  shardlimit_error *err = NULL;
  shardlimit_limiter *l = NULL;
  shardlimit_policy *pol = NULL;
  const char *cfg = "{\"policies\":{\"p\":{\"algorithm\":\"fixed_window\",\"limit\":10,"
                    "\"window\":\"60s\"}}}";
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &l, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_limiter_policy(l, S("p"), &pol, &err), SHARDLIMIT_OK, err);
  for (size_t ci = 0; pol && cases && ci < cases->n; ci++) {
    const jv *c = &cases->items[ci], *accepted = jget(c, "accepted");
    const char *name = jstr(c, "name", "key case"), *hex = jstr(c, "hex", name);
    size_t n = strlen(hex) / 2;
    char *key = malloc(n + 1);
    if (!key) abort();
    for (size_t i = 0; i < n; i++) {
      unsigned int byte = 0;
      char two[3] = {hex[2 * i], hex[2 * i + 1], 0};
      sscanf(two, "%2x", &byte);
      key[i] = (char)byte;
    }
    shardlimit_decision d;
    shardlimit_result rc = shardlimit_check(l, key, n, pol, 1, &d, &err);
    int want = accepted && accepted->type == J_BOOL && accepted->b;
    int ok = want ? rc == SHARDLIMIT_OK
                  : rc == SHARDLIMIT_ERR_INVALID_ARGUMENT && err &&
                        strstr(shardlimit_error_message(err).ptr, "`key`") != NULL;
    if (!ok) {
      fprintf(stderr, "keys.json %s: %s (%s), want %s\n", name, shardlimit_result_name(rc).ptr,
              err ? shardlimit_error_message(err).ptr : "", want ? "accepted" : "rejected");
      failures++;
    }
    shardlimit_error_free(err);
    err = NULL;
    free(key);
  }
  shardlimit_policy_free(pol);
  shardlimit_limiter_free(l);
  if (parsed) jv_free(&doc);
  free(text);
}

/* precision.json's offsets (the per-key window offset function) through decisions: at a
 * multiple of the window, a per_key fixed window of window_us resets for the key in exactly
 * offset_us (a whole window when the offset is 0), in memory and on Redis. */
static void test_window_offset_vectors(void) {
  char *text = read_file("tests/vectors/precision.json");
  CHECK(text != NULL);
  if (!text) return;
  const char *p = text;
  jv doc;
  int parsed = j_value(&p, text + strlen(text), &doc, 0);
  CHECK(parsed);
  const jv *offsets = parsed ? jget(&doc, "offsets") : NULL;
  CHECK(offsets != NULL && offsets->type == J_ARR && offsets->n >= 64);
  for (int on_redis = 0; offsets && on_redis < 2; on_redis++) {
    /* one policy per window, named w<window_us> */
    size_t cap = 256 + offsets->n * 160, len;
    char *cfg = malloc(cap);
    if (!cfg) abort();
    if (on_redis)
      snprintf(cfg, cap,
               "{\"shards\":[{\"name\":\"s0\",\"url\":\"redis://127.0.0.1:%d\"}],"
               "\"timeout_ms\":2000,\"key_prefix\":\"coffsets:\",\"policies\":{",
               redis_port);
    else
      snprintf(cfg, cap, "{\"policies\":{");
    for (size_t i = 0; i < offsets->n; i++) {
      uint64_t w = ju64(&offsets->items[i], "window_us", "offsets"), before = 0;
      size_t j = 0;
      while (j < i && (!j_u64(jget(&offsets->items[j], "window_us"), &before) || before != w)) j++;
      if (j < i) continue; /* a window seen before */
      len = strlen(cfg);
      snprintf(cfg + len, cap - len,
               "%s\"w%llu\":{\"algorithm\":\"fixed_window\",\"limit\":1,\"window\":\"%lluus\","
               "\"window_offset\":\"per_key\"}",
               cfg[len - 1] == '{' ? "" : ",", (unsigned long long)w, (unsigned long long)w);
    }
    strncat(cfg, "}}", cap - strlen(cfg) - 1);
    shardlimit_error *err = NULL;
    shardlimit_clock *clk = NULL;
    shardlimit_limiter *l = NULL;
    CHECK_RC(shardlimit_clock_new(0, &clk, &err), SHARDLIMIT_OK, err);
    CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), clk, &l, &err), SHARDLIMIT_OK, err);
    free(cfg);
    for (size_t i = 0; l && i < offsets->n; i++) {
      const jv *o = &offsets->items[i];
      const char *key = jstr(o, "key", "offsets");
      uint64_t w = ju64(o, "window_us", "offsets"), offset = ju64(o, "offset_us", "offsets");
      char name[32];
      snprintf(name, sizeof name, "w%llu", (unsigned long long)w);
      /* the first multiple of the window after 1.7e15 µs */
      CHECK_RC(shardlimit_clock_set_us(clk, (1700000000000000ull / w + 1) * w, &err),
               SHARDLIMIT_OK, err);
      shardlimit_policy *pol = NULL;
      shardlimit_decision d;
      CHECK_RC(shardlimit_limiter_policy(l, name, strlen(name), &pol, &err), SHARDLIMIT_OK, err);
      if (pol && vec_ok(shardlimit_check(l, key, strlen(key), pol, 1, &d, &err), err, "offsets") &&
          (!d.allowed || d.reset_after_us != (offset ? offset : w))) {
        fprintf(stderr, "offsets (%s): \"%s\" in a window of %llu us resets in %llu us, want %llu\n",
                on_redis ? "redis" : "memory", key, (unsigned long long)w,
                (unsigned long long)d.reset_after_us, (unsigned long long)(offset ? offset : w));
        failures++;
      }
      shardlimit_policy_free(pol);
    }
    shardlimit_limiter_free(l);
    shardlimit_clock_free(clk);
  }
  if (parsed) jv_free(&doc);
  free(text);
}

#include "test_events.c"
#include "test_logging.c"
#include "test_host.c"

int main(void) {
  start_redis();
  snprintf(config, sizeof config,
           "{\"shards\":[{\"name\":\"only\",\"url\":\"redis://127.0.0.1:%d\"}],"
           "\"timeout_ms\":2000,\"policies\":{"
           "\"api\":{\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"10s\"},"
           "\"burst\":{\"algorithm\":\"fixed_window\",\"limit\":100,\"window\":\"60s\"},"
           "\"tb\":{\"algorithm\":\"token_bucket\",\"capacity\":3,\"refill_per_sec\":1},"
           "\"conc\":{\"algorithm\":\"concurrency\",\"max\":2,\"lease_ttl\":\"30s\"},"
           "\"tokens\":{\"algorithm\":\"fixed_window\",\"limit\":10,\"window\":\"1h\"}}}",
           redis_port);

  test_static_functions();
  test_clock();
  test_limiter_constructors();
  test_policies();
  test_check_and_render();
  test_multi_limit();
  test_check_errors();
  test_peek_reset_check();
  test_leases();
  test_settle();
  test_threads();
  test_fork();
  test_dead_shard();
  test_check_all();
  test_block_list();
  test_overrides();
  test_client_ip();
  test_freed_limiter();
  test_close_while_checking();
  test_started_calls();
  test_shadow();
  test_started_text_calls();
  test_host_transport();
  test_events();
  test_logging();
  test_default_log_to_stderr();
  test_subscription_notify();
  test_config_generation();
  test_watch_config();
  test_operations_spec();
  test_errors_spec();
  test_vector_files();
  test_key_vectors();
  test_routing_vectors();
  test_window_offset_vectors();
  replay_vectors(0);
  replay_vectors(1);

  shardlimit_limiter_free(lim);
  shardlimit_clock_free(clock_);
  stop_redis();
  if (failures) {
    fprintf(stderr, "C test: %d check(s) failed\n", failures);
    return 1;
  }
  printf("C test: all checks passed (shardlimit %s)\n", shardlimit_version().ptr);
  return 0;
}
