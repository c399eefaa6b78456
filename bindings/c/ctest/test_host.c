/* The host transport (shardlimit_host_*): checks whose bytes this test moves itself over
 * a plain blocking socket to the test's redis-server. Included by test_shardlimit.c (one
 * program: its redis-server, CHECK macros and fixtures). */

#include <poll.h>

static int host_connect(const char *host, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  CHECK(inet_pton(AF_INET, host, &a.sin_addr) == 1);
  CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
  return fd;
}

/* Writes everything the host transport has for shard 0 to fd. */
static void host_flush(shardlimit_host *h, int fd) {
  uint8_t buf[64]; /* small on purpose: the rest stays for the next call */
  for (;;) {
    size_t n = 0;
    shardlimit_error *err = NULL;
    CHECK_RC(shardlimit_host_transmit(h, 0, buf, sizeof buf, &n, &err), SHARDLIMIT_OK, err);
    if (n == 0) return;
    CHECK(write(fd, buf, n) == (ssize_t)n);
  }
}

/* Reads from fd and feeds the host transport until `want` completions came (within 5 s). */
static size_t host_read(shardlimit_host *h, int fd, shardlimit_host_completion *out,
                        size_t want) {
  size_t got = 0;
  while (got < want) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) break;
    uint8_t buf[7]; /* a few bytes at a time: replies split anywhere */
    ssize_t r = read(fd, buf, sizeof buf);
    if (r <= 0) break;
    size_t n = 0;
    shardlimit_error *err = NULL;
    /* room for one completion per call: the rest waits in _completions */
    CHECK_RC(shardlimit_host_input(h, 0, buf, (size_t)r, out + got, 1, &n, &err),
             SHARDLIMIT_OK, err);
    got += n;
    while (got < want) {
      CHECK_RC(shardlimit_host_completions(h, out + got, 1, &n, &err), SHARDLIMIT_OK, err);
      if (n == 0) break;
      got += n;
    }
  }
  return got;
}

static void test_host_transport(void) {
  char cfg[1024];
  snprintf(cfg, sizeof cfg,
           "{\"shards\":[{\"name\":\"only\",\"url\":\"redis://127.0.0.1:%d\"}],"
           "\"timeout_ms\":300,\"policies\":{"
           "\"hapi\":{\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"60s\","
           "\"on_error\":\"open\"},"
           "\"hstrict\":{\"algorithm\":\"token_bucket\",\"capacity\":3,\"refill_per_sec\":1,"
           "\"on_error\":\"error\"},"
           "\"hmulti\":\"5/minute; 50/hour\"}}",
           redis_port);
  shardlimit_error *err = NULL;
  shardlimit_limiter *l = NULL;
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &l, &err), SHARDLIMIT_OK, err);
  shardlimit_host *h = NULL;
  CHECK_RC(shardlimit_host_new(l, &h, &err), SHARDLIMIT_OK, err);
  CHECK(shardlimit_host_shard_count(h) == 1);

  shardlimit_string addr = {0};
  uint16_t port = 0;
  uint64_t connect_us = 0;
  CHECK_RC(shardlimit_host_address(h, 0, &addr, &port, &connect_us, &err), SHARDLIMIT_OK, err);
  CHECK(port == redis_port && connect_us == 300000 && addr.len > 0);
  CHECK_RC(shardlimit_host_address(h, 1, &addr, &port, &connect_us, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);

  uint32_t step = 0;
  uint64_t id = 0;
  size_t shard = 9;
  shardlimit_decision d;

  /* nobody connects yet: a check on a shard whose circuit is closed asks for a connect and
   * waits for it (PENDING on that shard: the host connects a shard it finds a check pending
   * on), whatever its on_error; none falls back because no socket is open yet */
  uint64_t first[2];
  CHECK_RC(shardlimit_host_check(h, S("h:key"), S("hapi"), 1, &step, &first[0], &shard, &d,
                                 &err),
           SHARDLIMIT_OK, err);
  CHECK(step == SHARDLIMIT_HOST_PENDING && shard == 0);
  CHECK_RC(shardlimit_host_check(h, S("h:key"), S("hstrict"), 1, &step, &first[1], &shard, &d,
                                 &err),
           SHARDLIMIT_OK, err);
  CHECK(step == SHARDLIMIT_HOST_PENDING && shard == 0);

  /* bad input: an error naming it */
  CHECK_RC(shardlimit_host_check(h, S("h:key"), S("nope"), 1, &step, &id, &shard, &d, &err),
           SHARDLIMIT_ERR_UNKNOWN_POLICY, err);
  CHECK_RC(shardlimit_host_check(h, "", 0, S("hapi"), 1, &step, &id, &shard, &d, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_host_check(h, S("h:key"), S("hapi"), 1, NULL, &id, &shard, &d, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_host_connecting(h, 3, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_host_check((shardlimit_host *)l, S("h:key"), S("hapi"), 1, &step, &id,
                                 &shard, &d, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);

  /* a multi-limit policy needs the limiter's own path */
  CHECK_RC(shardlimit_host_check(h, S("h:key"), S("hmulti"), 1, &step, &id, &shard, &d, &err),
           SHARDLIMIT_OK, err);
  CHECK(step == SHARDLIMIT_HOST_DELEGATE);

  /* connect: the two waiting checks and seven more in one burst, written together */
  CHECK_RC(shardlimit_host_connecting(h, 0, &err), SHARDLIMIT_OK, err);
  int fd = host_connect(addr.ptr, port);
  CHECK_RC(shardlimit_host_connected(h, 0, &err), SHARDLIMIT_OK, err);
  uint64_t ids[7];
  for (int i = 0; i < 7; i++) {
    CHECK_RC(shardlimit_host_check(h, S("h:burst"), S("hapi"), 1, &step, &ids[i], &shard, &d,
                                   &err),
             SHARDLIMIT_OK, err);
    CHECK(step == SHARDLIMIT_HOST_PENDING && shard == 0);
  }
  CHECK(shardlimit_host_in_flight(h) == 9);
  bool has = false;
  uint64_t in_us = 0;
  host_flush(h, fd);
  /* written: the shard's silence is what a deadline measures now */
  CHECK_RC(shardlimit_host_next_deadline_us(h, &has, &in_us, &err), SHARDLIMIT_OK, err);
  CHECK(has && in_us <= 300000);
  shardlimit_host_completion c[10];
  CHECK(host_read(h, fd, c, 9) == 9);
  int burst = 0, early = 0;
  for (int i = 0; i < 9; i++) {
    CHECK(c[i].result == SHARDLIMIT_OK && c[i].error == NULL);
    CHECK(c[i].decision.source == SHARDLIMIT_SOURCE_REDIS && c[i].decision.has_shard);
    if (c[i].id == first[0] || c[i].id == first[1]) {
      CHECK(c[i].decision.allowed);
      early++;
      continue;
    }
    /* the burst's checks are answered in the order they were made */
    CHECK(burst < 7 && c[i].id == ids[burst]);
    CHECK(c[i].decision.allowed == (burst < 5));
    CHECK(c[i].decision.remaining == (uint64_t)(burst < 5 ? 4 - burst : 0));
    burst++;
  }
  CHECK(early == 2 && burst == 7);
  CHECK(shardlimit_host_in_flight(h) == 0);
  CHECK_RC(shardlimit_host_next_deadline_us(h, &has, &in_us, &err), SHARDLIMIT_OK, err);
  CHECK(!has);
  /* the same Redis state as the limiter's own path */
  CHECK_RC(shardlimit_check_named(l, S("h:burst"), S("hapi"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && d.remaining == 0);

  /* a reply nobody asked for: the connection is not trusted any more */
  size_t n = 9;
  CHECK(!shardlimit_host_is_down(h, 0));
  CHECK_RC(shardlimit_host_input(h, 0, (const uint8_t *)":1\r\n", 4, c, 8, &n, &err),
           SHARDLIMIT_OK, err);
  CHECK(n == 0 && shardlimit_host_is_down(h, 0));
  close(fd);
  CHECK_RC(shardlimit_host_closed(h, 0, S("test closed it"), c, 8, &n, &err), SHARDLIMIT_OK,
           err);
  CHECK(n == 0);

  /* reconnect; a check whose reply is not read by its deadline fails by its on_error */
  CHECK_RC(shardlimit_host_connecting(h, 0, &err), SHARDLIMIT_OK, err);
  fd = host_connect(addr.ptr, port);
  CHECK_RC(shardlimit_host_connected(h, 0, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_host_check(h, S("h:late"), S("hstrict"), 1, &step, &id, &shard, &d, &err),
           SHARDLIMIT_OK, err);
  CHECK(step == SHARDLIMIT_HOST_PENDING);
  host_flush(h, fd);
  CHECK_RC(shardlimit_host_next_deadline_us(h, &has, &in_us, &err), SHARDLIMIT_OK, err);
  CHECK(has && in_us <= 300000);
  struct timespec ts = {0, (long)(in_us + 1000) * 1000};
  nanosleep(&ts, NULL);
  CHECK_RC(shardlimit_host_timeout(h, c, 8, &n, &err), SHARDLIMIT_OK, err);
  CHECK(n == 1 && c[0].id == id && c[0].result == SHARDLIMIT_ERR_TIMEOUT && c[0].error);
  if (n == 1 && c[0].error) {
    CHECK(shardlimit_error_code(c[0].error) == SHARDLIMIT_ERR_TIMEOUT);
    shardlimit_error_free(c[0].error);
  }
  /* the late reply would be trusted no more: the connection is down */
  CHECK(shardlimit_host_is_down(h, 0));
  close(fd);

  /* a check in flight when the socket closes fails by its policy's on_error */
  CHECK_RC(shardlimit_host_closed(h, 0, S("gone"), c, 8, &n, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_host_connecting(h, 0, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_host_check(h, S("h:key"), S("hapi"), 1, &step, &id, &shard, &d, &err),
           SHARDLIMIT_OK, err);
  CHECK(step == SHARDLIMIT_HOST_PENDING);
  CHECK_RC(shardlimit_host_closed(h, 0, S("refused"), c, 8, &n, &err), SHARDLIMIT_OK, err);
  CHECK(n == 1 && c[0].id == id && c[0].result == SHARDLIMIT_OK && c[0].decision.allowed &&
        c[0].decision.source == SHARDLIMIT_SOURCE_FALLBACK);

  shardlimit_string_free(&addr);
  shardlimit_host_free(h);
  CHECK_RC(shardlimit_host_check(h, S("h:key"), S("hapi"), 1, &step, &id, &shard, &d, &err),
           SHARDLIMIT_ERR_CLOSED, err);
  shardlimit_host_free(h); /* twice: a no-op */
  shardlimit_limiter_free(l);
}
