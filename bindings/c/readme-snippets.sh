#!/usr/bin/env bash
# The ```c and ```cpp blocks of README.md and bindings/c/README.md, read from the files,
# compiled as written (their #include lines hoisted, the rest the body of main) with what
# the prose gives them (`path`, a `response`), linked to the SDK and run on the in-memory
# engine: a block that no longer compiles or fails at run time fails scripts/test-c.sh.
#
#   bindings/c/readme-snippets.sh WORKDIR LIBDIR    # with PKG_CONFIG_PATH naming the SDK
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$1
lib=$2
mkdir -p "$work/readme"
cd "$work/readme"
# shard-config.json of the blocks: the `api` policy they check, in memory
echo '{"policies": {"api": {"algorithm": "fixed_window", "limit": 5, "window": "1m"}}}' >shard-config.json
root=$OLDPWD
n=0
for readme in README.md bindings/c/README.md; do
  for lang in c cpp; do
    # every block of this language, NUL-separated
    while IFS= read -r -d '' block; do
      n=$((n + 1))
      includes=$(printf '%s\n' "$block" | grep -E '^#include' || true)
      body=$(printf '%s\n' "$block" | grep -vE '^#include' || true)
      if [ "$lang" = c ]; then
        src="snippet$n.c"
        printf '#include <stdio.h>\n#include <string.h>\n%s\n/* from %s */\nint main(void) {\n  const char *path = "shard-config.json";\n%s\n  return 0;\n}\n' \
          "$includes" "$readme" "$body" >"$src"
        cc -std=c11 -Wall -Werror $(pkg-config --cflags shardlimit) "$src" -o "snippet$n" \
          $(pkg-config --libs shardlimit) -Wl,-rpath,"$lib" -lpthread
      else
        src="snippet$n.cpp"
        printf '#include <string>\n%s\n// what the prose gives the block: the HTTP response it answers\nstruct { void set_header(const std::string&, const std::string&) {} void send(int, const std::string&) {} } response;\n// from %s\nint main() {\n%s\n  return 0;\n}\n' \
          "$includes" "$readme" "$body" >"$src"
        c++ -std=c++17 -Wall -Werror $(pkg-config --cflags shardlimit) "$src" -o "snippet$n" \
          $(pkg-config --libs shardlimit) -Wl,-rpath,"$lib" -lpthread
      fi
      ./"snippet$n" || { echo "the $lang block $n of $readme failed when run" >&2; exit 1; }
    done < <(awk -v lang="$lang" '
      $0 == "```" lang { inside = 1; text = ""; next }
      inside && /^```/ { inside = 0; printf "%s%c", text, 0; next }
      inside { text = text $0 "\n" }' "$root/$readme")
  done
done
# README.md: one C and one C++ block; bindings/c/README.md: the same two
[ "$n" -ge 4 ] || { echo "$n C/C++ blocks in the READMEs: they have at least 4" >&2; exit 1; }
echo "the READMEs' $n C and C++ blocks compile and run"
