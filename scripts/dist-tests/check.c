/* Install test of the C SDK through pkg-config (scripts/test-dist.sh, test-platforms.sh):
 * check PORT VERSION. on_error "error": a failing Redis fails the check, never a fallback. */
#include <shardlimit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  if (strcmp(SHARDLIMIT_VERSION, argv[2]) != 0 || strcmp(shardlimit_version().ptr, argv[2]) != 0) {
    fprintf(stderr, "version %s / %s, expected %s\n", SHARDLIMIT_VERSION, shardlimit_version().ptr, argv[2]);
    return 1;
  }
  char config[512];
  int n = snprintf(config, sizeof config,
                   "{\"shards\":[{\"name\":\"a\",\"url\":\"redis://127.0.0.1:%s\"}],\"timeout_ms\":2000,"
                   "\"policies\":{\"p\":{\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"1h\","
                   "\"on_error\":\"error\"}}}",
                   argv[1]);
  shardlimit_limiter *lim = NULL;
  shardlimit_error *err = NULL;
  if (shardlimit_limiter_new_json(config, (size_t)n, NULL, &lim, &err) != SHARDLIMIT_OK) {
    fprintf(stderr, "new: %s\n", shardlimit_error_message(err).ptr);
    return 1;
  }
  int admitted = 0;
  for (int i = 0; i < 8; i++) {
    shardlimit_decision d;
    if (shardlimit_check_named(lim, "user:c", 6, "p", 1, 1, &d, &err) != SHARDLIMIT_OK) {
      fprintf(stderr, "check: %s\n", shardlimit_error_message(err).ptr);
      return 1;
    }
    if (!d.has_shard || d.shard != 0 || d.allowed != (i < 5)) {
      fprintf(stderr, "check %d: allowed=%d has_shard=%d\n", i, d.allowed, d.has_shard);
      return 1;
    }
    admitted += d.allowed;
  }
  shardlimit_limiter_free(lim);
  printf("c: admitted %d of 8 (limit 5)\n", admitted);
  return 0;
}
