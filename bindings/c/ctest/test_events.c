/* The configuration in force, events (shardlimit_subscribe) and config watching
 * (shardlimit_watch_config), and the shadow flag of ad-hoc policies. Included by
 * test_shardlimit.c (one program: its redis-server, CHECK macros and fixtures). */

#include <fcntl.h>
#include <sys/stat.h>

/* Takes the next event within 10 s; CHECKs that one came. */
static int next_event(shardlimit_subscription *sub, shardlimit_event *ev) {
  shardlimit_error *err = NULL;
  bool got = false;
  CHECK_RC(shardlimit_subscription_next(sub, 10 * 1000 * 1000, &got, ev, &err), SHARDLIMIT_OK,
           err);
  CHECK(got);
  return got;
}

/* Replaces `path` with `text` at the modification time `secs`, so that a watcher sees a
 * change whatever the file system's time resolution, and sees it once, whole: the file is
 * written and dated aside, then renamed over `path`. */
static void write_at(const char *path, const char *text, time_t secs) {
  char tmp[256];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs(text, f);
  fclose(f);
  struct timespec ts[2] = {{secs, 0}, {secs, 0}};
  CHECK(utimensat(AT_FDCWD, tmp, ts, 0) == 0);
  CHECK(rename(tmp, path) == 0);
}

static void *wait_closed(void *arg) {
  shardlimit_error *err = NULL;
  shardlimit_event ev;
  bool got = false;
  shardlimit_result rc = shardlimit_subscription_next(arg, UINT64_MAX, &got, &ev, &err);
  shardlimit_error_free(err);
  return (void *)(intptr_t)rc;
}

static void test_events(void) {
  shardlimit_error *err = NULL;
  shardlimit_limiter *l = NULL;
  char cfg[640];
  snprintf(cfg, sizeof cfg,
           "{\"shards\":[{\"name\":\"only\",\"url\":\"redis://127.0.0.1:%d\"}],"
           "\"key_prefix\":\"cevents:\",\"timeout_ms\":5000,\"policies\":{"
           "\"ev\":{\"algorithm\":\"fixed_window\",\"limit\":4,\"window\":\"1h\","
           "\"near_limit\":0.5}}}",
           redis_port);
  CHECK_RC(shardlimit_limiter_new_json(cfg, strlen(cfg), NULL, &l, &err), SHARDLIMIT_OK, err);

  /* config: the policies in force, never the shard URLs */
  shardlimit_string c = {0};
  CHECK_RC(shardlimit_config_json(l, &c, &err), SHARDLIMIT_OK, err);
  CHECK(c.ptr && strstr(c.ptr, "\"engine\":\"redis\"") && strstr(c.ptr, "\"shards\":[\"only\"]") &&
        strstr(c.ptr, "\"name\":\"ev\"") && strstr(c.ptr, "\"limit\":4") &&
        !strstr(c.ptr, "redis://"));
  shardlimit_string_free(&c);
  CHECK_RC(shardlimit_config_json(l, NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);

  shardlimit_subscription *sub = NULL, *small = NULL;
  CHECK_RC(shardlimit_subscribe(l, 0, &sub, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_subscribe(l, 1, &small, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_subscribe(l, SHARDLIMIT_MAX_EVENT_CAPACITY + 1, &small, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_subscribe(l, 0, NULL, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_subscribe(NULL, 0, &small, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);

  /* nothing happened yet: no event within 1 ms */
  shardlimit_event ev;
  bool got = true;
  CHECK_RC(shardlimit_subscription_next(sub, 1000, &got, &ev, &err), SHARDLIMIT_OK, err);
  CHECK(!got);

  shardlimit_policy *p = NULL;
  CHECK_RC(shardlimit_limiter_policy(l, S("ev"), &p, &err), SHARDLIMIT_OK, err);
  shardlimit_decision d;
  for (int i = 0; i < 5; i++)
    CHECK_RC(shardlimit_check(l, S("k1"), p, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed);
  /* the second check crossed half of the limit; the fifth was denied */
  if (next_event(sub, &ev)) {
    CHECK(ev.kind == SHARDLIMIT_EVENT_NEAR_LIMIT);
    CHECK(str_eq(shardlimit_event_kind_name(ev.kind), "near_limit"));
    CHECK(ev.policy_len == 2 && strcmp(ev.policy, "ev") == 0);
    CHECK(ev.key_len == 2 && strcmp(ev.key, "k1") == 0);
    CHECK(ev.limit == 4 && ev.remaining == 2 && !ev.has_decision);
  }
  if (next_event(sub, &ev)) {
    CHECK(ev.kind == SHARDLIMIT_EVENT_DENIED && strcmp(ev.key, "k1") == 0);
    CHECK(ev.has_decision && !ev.decision.allowed && ev.decision.limit == 4);
    CHECK(ev.has_retry_after && ev.retry_after_us > 0 && ev.limit == 4 && ev.remaining == 0);
  }
  /* a block */
  CHECK_RC(shardlimit_block(l, S("k2"), 0, S("abuse"), &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_check(l, S("k2"), p, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && d.source == SHARDLIMIT_SOURCE_BLOCK);
  if (next_event(sub, &ev)) {
    CHECK(ev.kind == SHARDLIMIT_EVENT_BLOCKED && strcmp(ev.key, "k2") == 0 && !ev.auto_block);
  }
  /* the small queue kept its first event and counted the other two */
  CHECK(shardlimit_subscription_dropped(small) == 2);
  CHECK(shardlimit_subscription_dropped(sub) == 0);
  if (next_event(small, &ev)) CHECK(ev.kind == SHARDLIMIT_EVENT_NEAR_LIMIT);
  CHECK_RC(shardlimit_subscription_next(small, 0, &got, &ev, &err), SHARDLIMIT_OK, err);
  CHECK(!got);

  /* a freed subscription wakes its waiter with CLOSED, and gets nothing more */
  pthread_t t;
  CHECK(pthread_create(&t, NULL, wait_closed, small) == 0);
  struct timespec pause = {0, 20 * 1000 * 1000}; /* let it wait; its result holds either way */
  nanosleep(&pause, NULL);
  shardlimit_subscription_free(small);
  void *rc = NULL;
  pthread_join(t, &rc);
  CHECK((intptr_t)rc == SHARDLIMIT_ERR_CLOSED);
  CHECK_RC(shardlimit_subscription_next(small, 0, &got, &ev, &err), SHARDLIMIT_ERR_CLOSED, err);
  shardlimit_subscription_free(small); /* a second free is a no-op */

  /* an ad-hoc policy in shadow */
  shardlimit_limit one = {SHARDLIMIT_ALGORITHM_FIXED_WINDOW, 1, 3600000, 0, 0};
  shardlimit_policy *adhoc = NULL, *shadow = NULL;
  CHECK_RC(shardlimit_policy_new(S("adhoc"), &one, &adhoc, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_policy_with_shadow(adhoc, true, &shadow, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_policy_with_shadow(NULL, true, &shadow, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  for (int i = 0; i < 2; i++)
    CHECK_RC(shardlimit_check(l, S("k3"), shadow, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.allowed && d.shadow_denied);
  /* its first check used the whole limit: past the default near_limit (0.8) */
  CHECK(next_event(sub, &ev) && ev.kind == SHARDLIMIT_EVENT_NEAR_LIMIT);
  if (next_event(sub, &ev)) {
    CHECK(ev.kind == SHARDLIMIT_EVENT_SHADOW_DENIED && strcmp(ev.policy, "adhoc") == 0);
    CHECK(ev.has_decision && ev.decision.shadow_denied);
  }
  /* the original stays enforcing */
  CHECK_RC(shardlimit_check(l, S("k3"), adhoc, 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(!d.allowed && !d.shadow_denied);
  CHECK(next_event(sub, &ev) && ev.kind == SHARDLIMIT_EVENT_DENIED);
  shardlimit_limit conc = {SHARDLIMIT_ALGORITHM_CONCURRENCY, 1, 1000, 0, 0};
  shardlimit_policy *cp = NULL, *cs = NULL;
  CHECK_RC(shardlimit_policy_new(S("conc"), &conc, &cp, &err), SHARDLIMIT_OK, err);
  CHECK_RC(shardlimit_policy_with_shadow(cp, true, &cs, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT,
           err);
  shardlimit_policy_free(cp);
  shardlimit_policy_free(adhoc);
  shardlimit_policy_free(shadow);
  shardlimit_policy_free(p);

  /* a freed limiter closes its subscriptions once the queued events are taken */
  CHECK_RC(shardlimit_reload(l, cfg, strlen(cfg), &err), SHARDLIMIT_OK, err);
  shardlimit_limiter_free(l);
  if (next_event(sub, &ev)) CHECK(ev.kind == SHARDLIMIT_EVENT_RELOADED && ev.detail_len == 0);
  CHECK_RC(shardlimit_subscription_next(sub, 10 * 1000 * 1000, &got, &ev, &err),
           SHARDLIMIT_ERR_CLOSED, err);
  shardlimit_subscription_free(sub);
}

static void test_watch_config(void) {
  shardlimit_error *err = NULL;
  char path[] = "/tmp/shardlimit-watch-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd < 0) return;
  close(fd);
  char cfg[640];
  const char *fmt = "{\"shards\":[{\"name\":\"only\",\"url\":\"redis://127.0.0.1:%d\"}],"
                    "\"key_prefix\":\"cwatch:\",\"policies\":{"
                    "\"w\":{\"algorithm\":\"fixed_window\",\"limit\":%d,\"window\":\"1h\"}}}";
  snprintf(cfg, sizeof cfg, fmt, redis_port, 2);
  write_at(path, cfg, 1000000);
  shardlimit_limiter *l = NULL;
  CHECK_RC(shardlimit_limiter_new_file(path, strlen(path), NULL, &l, &err), SHARDLIMIT_OK, err);
  shardlimit_subscription *sub = NULL;
  CHECK_RC(shardlimit_subscribe(l, 0, &sub, &err), SHARDLIMIT_OK, err);
  shardlimit_watcher *w = NULL;
  CHECK_RC(shardlimit_watch_config(l, path, strlen(path), 0, &w, &err),
           SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_watch_config(l, NULL, 0, 5, &w, &err), SHARDLIMIT_ERR_INVALID_ARGUMENT, err);
  CHECK_RC(shardlimit_watch_config(l, path, strlen(path), 5, &w, &err), SHARDLIMIT_OK, err);
  shardlimit_decision d;
  CHECK_RC(shardlimit_check_named(l, S("k"), S("w"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.limit == 2);

  snprintf(cfg, sizeof cfg, fmt, redis_port, 7);
  write_at(path, cfg, 2000000);
  shardlimit_event ev;
  if (next_event(sub, &ev)) {
    CHECK(ev.kind == SHARDLIMIT_EVENT_RELOADED && !ev.engine_changed);
    CHECK(strcmp(ev.detail, "w") == 0);
  }
  /* the event comes after the swap: the next check has the new limit */
  CHECK_RC(shardlimit_check_named(l, S("k"), S("w"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.limit == 7);

  write_at(path, "{ not json", 3000000);
  if (next_event(sub, &ev)) {
    CHECK(ev.kind == SHARDLIMIT_EVENT_RELOAD_REJECTED && ev.error_code == SHARDLIMIT_ERR_CONFIG);
    CHECK(ev.detail_len > 0 && ev.detail[ev.detail_len] == '\0');
  }
  CHECK_RC(shardlimit_check_named(l, S("k"), S("w"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.limit == 7);

  /* freed, the watcher reloads nothing more */
  shardlimit_watcher_free(w);
  shardlimit_watcher_free(w);
  snprintf(cfg, sizeof cfg, fmt, redis_port, 9);
  write_at(path, cfg, 4000000);
  bool got = true;
  CHECK_RC(shardlimit_subscription_next(sub, 50 * 1000, &got, &ev, &err), SHARDLIMIT_OK, err);
  CHECK(!got);
  CHECK_RC(shardlimit_check_named(l, S("k"), S("w"), 1, &d, &err), SHARDLIMIT_OK, err);
  CHECK(d.limit == 7);
  shardlimit_subscription_free(sub);
  shardlimit_limiter_free(l);
  unlink(path);
}
