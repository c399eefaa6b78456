/* The core's rate-limited warning lines: a callback (shardlimit_set_log_callback) and a
 * log subscription (shardlimit_subscribe_logs). Included by test_shardlimit.c (one
 * program: its CHECK macros and fixtures). */

struct log_seen {
  pthread_mutex_t mu;
  int fallback_lines;
  int circuit_lines;
  uint64_t last_suppressed;
  int last_allowed;
  int last_has_allowed;
  uint32_t last_code;
  char last_message[1024];
};

static void on_log(void *user, const shardlimit_log_record *r) {
  struct log_seen *s = user;
  pthread_mutex_lock(&s->mu);
  if (str_eq(r->reason, "fallback") && str_eq(r->subject, "api")) {
    s->fallback_lines++;
    s->last_suppressed = r->suppressed;
    s->last_allowed = r->allowed;
    s->last_has_allowed = r->has_allowed;
    s->last_code = r->error_code;
    size_t n = r->message.len < sizeof s->last_message - 1 ? r->message.len
                                                            : sizeof s->last_message - 1;
    memcpy(s->last_message, r->message.ptr, n);
    s->last_message[n] = 0;
  } else if (str_eq(r->reason, "circuit_opened") && str_eq(r->subject, "dead")) {
    s->circuit_lines++;
  }
  CHECK(r->level == SHARDLIMIT_LOG_WARN && str_eq(r->target, "shardlimit"));
  pthread_mutex_unlock(&s->mu);
}

static void test_logging(void) {
  shardlimit_error *err = NULL;
  shardlimit_clock *clk = NULL;
  shardlimit_limiter *l = NULL;
  shardlimit_log_subscription *sub = NULL;
  shardlimit_decision d;
  char cfg[640];
  /* nothing listens on the port: every check falls back (on_error open) */
  snprintf(cfg, sizeof cfg,
           "{\"shards\":[{\"name\":\"dead\",\"url\":\"redis://127.0.0.1:%d\"}],"
           "\"timeout_ms\":300,\"policies\":{\"api\":{\"rate\":\"10/minute\",\"on_error\":\"open\"}}}",
           free_port());
  CHECK_RC(shardlimit_clock_new(1700000000000000ull, &clk, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), clk, &l, &err), SHARDLIMIT_OK, err);
  struct log_seen seen;
  memset(&seen, 0, sizeof seen);
  pthread_mutex_init(&seen.mu, NULL);
  CHECK_RC(shardlimit_set_log_callback(l, on_log, &seen, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_subscribe_logs(l, 0, &sub, &err), SHARDLIMIT_OK, err);

  for (int i = 0; i < 1000; i++) {
    CHECK_RC(shardlimit_check_named(l, S("k"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
    CHECK(d.allowed && d.source == SHARDLIMIT_SOURCE_FALLBACK);
  }
  /* blocking checks log on the caller's thread: the lines are in by now */
  pthread_mutex_lock(&seen.mu);
  CHECK(seen.fallback_lines == 1);
  CHECK(seen.circuit_lines == 1);
  CHECK(seen.last_suppressed == 0 && seen.last_has_allowed && seen.last_allowed);
  CHECK(shardlimit_result_is_backend((shardlimit_result)seen.last_code));
  CHECK(strstr(seen.last_message, "policy `api` fell back to on_error and allowed") != NULL);
  pthread_mutex_unlock(&seen.mu);

  /* the interval (10 s) later on the limiter's clock: a line with the 999 suppressed */
  CHECK_RC(shardlimit_clock_advance_us(clk, 10 * 1000 * 1000, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_check_named(l, S("k"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
  pthread_mutex_lock(&seen.mu);
  CHECK(seen.fallback_lines == 2 && seen.last_suppressed == 999);
  CHECK(strstr(seen.last_message, "(999 more since the last line") != NULL);
  pthread_mutex_unlock(&seen.mu);

  /* the subscription saw the same lines, in order */
  shardlimit_log_line line;
  int fallbacks = 0, circuits = 0;
  uint64_t suppressed[2] = {42, 42};
  for (;;) {
    bool got = false;
    CHECK_RC(shardlimit_log_subscription_next(sub, 0, &got, &line, &err), SHARDLIMIT_OK, err);
    if (!got) break;
    if (strcmp(line.reason, "fallback") == 0) {
      CHECK(strcmp(line.subject, "api") == 0 && line.subject_len == 3 && line.has_allowed &&
            line.allowed && !line.truncated && line.message_len == strlen(line.message));
      if (fallbacks < 2) suppressed[fallbacks] = line.suppressed;
      fallbacks++;
    } else if (strcmp(line.reason, "circuit_opened") == 0) {
      CHECK(strcmp(line.subject, "dead") == 0 && !line.has_allowed);
      circuits++;
    }
  }
  CHECK(fallbacks == 2 && circuits == 1 && suppressed[0] == 0 && suppressed[1] == 999);
  CHECK(shardlimit_log_subscription_dropped(sub) == 0);

  /* a removed callback is not called again; bad arguments are errors, not crashes */
  CHECK_RC(shardlimit_set_log_callback(l, NULL, NULL, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_clock_advance_us(clk, 10 * 1000 * 1000, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_check_named(l, S("k"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(seen.fallback_lines == 2);
  CHECK(shardlimit_set_log_callback(NULL, on_log, &seen, &err) == SHARDLIMIT_ERR_INVALID_ARGUMENT);
  shardlimit_error_free(err);
  err = NULL;
  shardlimit_log_subscription *big = NULL;
  CHECK(shardlimit_subscribe_logs(l, SHARDLIMIT_MAX_LOG_CAPACITY + 1, &big, &err) ==
        SHARDLIMIT_ERR_INVALID_ARGUMENT);
  CHECK(big == NULL);
  shardlimit_error_free(err);
  err = NULL;

  /* the limiter gone: the subscription gives what it holds, then CLOSED. The limiter's
   * threads may still be winding down when free returns, so each call waits (bounded, 10 s)
   * for a line or the close rather than asking with a timeout of 0, which raced with
   * them; a subscription that never closes still fails here, by OK without a line. */
  shardlimit_limiter_free(l);
  bool got = false;
  for (;;) {
    shardlimit_result rc =
        shardlimit_log_subscription_next(sub, 10 * 1000 * 1000, &got, &line, &err);
    shardlimit_error_free(err);
    err = NULL;
    if (rc != SHARDLIMIT_OK) {
      CHECK(rc == SHARDLIMIT_ERR_CLOSED);
      break;
    }
    CHECK(got);
    if (!got) break;
  }
  shardlimit_log_subscription_free(sub);
  shardlimit_log_subscription_free(sub); /* a second free is a no-op */
  shardlimit_clock_free(clk);
  pthread_mutex_destroy(&seen.mu);
}

/* Runs `n` checks of "api" on a fresh limiter whose only shard is dead (each one a
 * fallback: one warning line, then suppressed) with stderr sent to a file, and returns
 * what was written there (caller frees). `silence` sets a NULL log callback first. */
static char *stderr_of_fallbacks(int silence) {
  shardlimit_error *err = NULL;
  shardlimit_limiter *l = NULL;
  shardlimit_decision d;
  char cfg[640];
  snprintf(cfg, sizeof cfg,
           "{\"shards\":[{\"name\":\"dead\",\"url\":\"redis://127.0.0.1:%d\"}],"
           "\"timeout_ms\":300,\"policies\":{\"api\":{\"rate\":\"10/minute\",\"on_error\":\"open\"}}}",
           free_port());
  char path[] = "/tmp/shardlimit-stderr-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  CHECK(dup2(fd, 2) == 2);
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &l, &err), SHARDLIMIT_OK, err);
  if (silence) CHECK_RC(shardlimit_set_log_callback(l, NULL, NULL, &err), SHARDLIMIT_OK, err);
  for (int i = 0; i < 3; i++)
    CHECK_RC(shardlimit_check_named(l, S("k"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
  /* blocking checks log on this thread: the lines are written by now */
  shardlimit_limiter_free(l);
  fflush(stderr);
  CHECK(dup2(saved, 2) == 2);
  close(saved);
  char *text = calloc(1, 8192);
  CHECK(pread(fd, text, 8191, 0) >= 0);
  close(fd);
  unlink(path);
  return text;
}

/* With no callback set, a limiter writes its warning lines to stderr (as the CLI does);
 * a NULL callback or SHARDLIMIT_LOG=off in the environment silences that. */
static void test_default_log_to_stderr(void) {
  char *text = stderr_of_fallbacks(0);
  CHECK(strstr(text, "warn: shardlimit: policy `api` fell back to on_error and allowed") != NULL);
  CHECK(strstr(text, "warn: shardlimit: circuit of shard `dead` opened") != NULL);
  /* rate-limited: one fallback line for three fallbacks */
  char *first = strstr(text, "fell back");
  CHECK(first != NULL && strstr(first + 1, "fell back") == NULL);
  free(text);

  text = stderr_of_fallbacks(1);
  CHECK(strstr(text, "shardlimit:") == NULL);
  free(text);

  CHECK(setenv("SHARDLIMIT_LOG", "off", 1) == 0);
  text = stderr_of_fallbacks(0);
  CHECK(unsetenv("SHARDLIMIT_LOG") == 0);
  CHECK(strstr(text, "shardlimit:") == NULL);
  free(text);
}

/* A notify callback counting its calls: the host's "wake the event loop". */
static atomic_int notified;
static void on_notify(void *user) {
  CHECK(user == &notified);
  atomic_fetch_add(&notified, 1);
}

/* A subscription notifies when it goes from empty to holding something and when it
 * closes, not once per entry: a host drains it with _next(0) from its event loop. */
static void test_subscription_notify(void) {
  shardlimit_error *err = NULL;
  shardlimit_limiter *l = NULL;
  shardlimit_subscription *sub = NULL;
  shardlimit_decision d;
  const char *cfg = "{\"policies\":{\"api\":{\"algorithm\":\"fixed_window\",\"limit\":1,\"window\":\"1h\"}}}";
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &l, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_subscribe(l, 0, &sub, &err), SHARDLIMIT_OK, err);
  atomic_store(&notified, 0);
  CHECK(shardlimit_subscription_set_notify(sub, NULL, &notified, &err) ==
        SHARDLIMIT_ERR_INVALID_ARGUMENT);
  shardlimit_error_free(err);
  err = NULL;
  CHECK_RC(shardlimit_subscription_set_notify(sub, on_notify, &notified, &err), SHARDLIMIT_OK, err);
  CHECK(atomic_load(&notified) == 0); /* nothing queued yet */
  CHECK(shardlimit_subscription_set_notify(sub, on_notify, &notified, &err) ==
        SHARDLIMIT_ERR_INVALID_ARGUMENT); /* once */
  shardlimit_error_free(err);
  err = NULL;
  /* a near_limit event, then two denials: one notification while nobody drains */
  for (int i = 0; i < 3; i++)
    CHECK_RC(shardlimit_check_named(l, S("k"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(atomic_load(&notified) == 1);
  shardlimit_event ev;
  int events = 0;
  for (;;) {
    bool got = false;
    CHECK_RC(shardlimit_subscription_next(sub, 0, &got, &ev, &err), SHARDLIMIT_OK, err);
    if (!got) break;
    events++;
  }
  CHECK(events == 3);
  /* drained: the next event notifies again */
  CHECK_RC(shardlimit_check_named(l, S("k"), S("api"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(atomic_load(&notified) == 2);

  /* a log subscription too, and a callback set on a non-empty queue is called at once */
  shardlimit_log_subscription *logs = NULL;
  CHECK_RC(shardlimit_subscribe_logs(l, 0, &logs, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_log_subscription_set_notify(logs, on_notify, &notified, &err),
           SHARDLIMIT_OK, err);
  CHECK(atomic_load(&notified) == 2);

  /* the limiter gone: both subscriptions close, and say so */
  shardlimit_limiter_free(l);
  CHECK(atomic_load(&notified) == 4);
  bool got = false;
  CHECK(shardlimit_subscription_next(sub, 0, &got, &ev, &err) == SHARDLIMIT_OK && got);
  shardlimit_subscription_free(sub);
  shardlimit_log_subscription_free(logs);
  /* freed: never called again */
  CHECK(atomic_load(&notified) == 4);
}

/* The number of reloads in force, for hosts that derive something from the config. */
static void test_config_generation(void) {
  shardlimit_error *err = NULL;
  shardlimit_limiter *l = NULL;
  uint64_t g = 42;
  const char *a = "{\"policies\":{\"api\":{\"algorithm\":\"fixed_window\",\"limit\":1,\"window\":\"1h\"}}}";
  const char *b = "{\"policies\":{\"api\":{\"algorithm\":\"concurrency\",\"max\":1,\"lease_ttl\":\"30s\"}}}";
  CHECK_RC(shardlimit_limiter_new_json(a, strlen(a), NULL, &l, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_config_generation(l, &g, &err), SHARDLIMIT_OK, err);
  CHECK(g == 0);
  CHECK_RC(shardlimit_reload(l, b, strlen(b), &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_config_generation(l, &g, &err), SHARDLIMIT_OK, err);
  CHECK(g == 1);
  CHECK(shardlimit_reload(l, "{", 1, &err) == SHARDLIMIT_ERR_CONFIG);
  shardlimit_error_free(err);
  err = NULL;
  CHECK_RC(shardlimit_config_generation(l, &g, &err), SHARDLIMIT_OK, err);
  CHECK(g == 1);
  CHECK(shardlimit_config_generation(l, NULL, &err) == SHARDLIMIT_ERR_INVALID_ARGUMENT);
  shardlimit_error_free(err);
  err = NULL;
  shardlimit_limiter_free(l);
  CHECK(shardlimit_config_generation(l, &g, &err) == SHARDLIMIT_ERR_CLOSED);
  shardlimit_error_free(err);
}
