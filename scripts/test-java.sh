#!/usr/bin/env bash
# The JVM binding's tests, on the jar of dist/java (`make dist`; scripts/dist-java.sh builds it
# when missing):
#   1. the JUnit 5 suite (Maven + Surefire) with the dist jar's natives/ on the class path, so
#      the library is loaded as a user's JVM loads it (extracted by NativeLoader), against
#      real redis-server processes the tests start on 127.0.0.1; on Java 17 and on the newest
#      JDK of /usr/lib/jvm (Temurin 25 here). As root, a tmpfs mounted noexec checks the
#      loader's noexec error.
#   2. the install test: the dist jar and POM installed into an empty local Maven repository,
#      and bindings/java/consumer-test built against it with no Rust on PATH, then run (in
#      memory and on Redis) on both JDKs; the Spring Boot starter installed beside it, and a
#      Boot project naming only the starter resolved (it must get the library and Boot's
#      auto-configuration).
# Maven resolves plugins and JUnit into ~/.m2 on the first run (about a minute); later runs
# need no network. Took 3 min 8 s on the shared 2-core machine (load 12-16), about a minute
# of it the suite on the second JDK: SHARDLIMIT_JAVA_SUITE_JDKS=first runs the suite on Java
# 17 only (the install test still runs on both JDKs).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/lib.sh
ensure_redis
command -v javac >/dev/null 2>&1 || apt_install openjdk-17-jdk-headless
command -v mvn >/dev/null 2>&1 || apt_install maven

version=$(workspace_version)
DIST=${DIST_DIR:-$root/dist}
jar="$DIST/java/shardlimit-$version.jar"
[ -f "$jar" ] || scripts/dist-java.sh
work="$(target_dir)/test-java"
rm -rf "$work"
mkdir -p "$work/natives"
(cd "$work/natives" && unzip -q "$jar" 'natives/*' && mv natives/* . && rmdir natives)

# the JDKs: the default (17) and the newest other one, if any
jdks=("$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")")
newest=""
for j in /usr/lib/jvm/*/; do
  [ -x "$j/bin/javac" ] || continue
  v=$("$j/bin/java" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
  if [ -z "$newest" ] || [ "${v%%.*}" -gt "${newest_v%%.*}" ]; then newest=${j%/}; newest_v=$v; fi
done
[ -n "$newest" ] && [ "$(readlink -f "$newest")" != "$(readlink -f "${jdks[0]}")" ] && jdks+=("$newest")

noexec=""
cleanup() {
  if [ -n "$noexec" ]; then umount "$noexec" 2>/dev/null || true; rmdir "$noexec" 2>/dev/null || true; fi
}
trap cleanup EXIT
if [ "$(id -u)" = 0 ]; then
  d=$(mktemp -d /tmp/shardlimit-noexec-XXXXXX)
  if mount -t tmpfs -o noexec,size=16m tmpfs "$d" 2>/dev/null; then noexec=$d; else rmdir "$d"; fi
fi

suite_jdks=("${jdks[@]}")
[ "${SHARDLIMIT_JAVA_SUITE_JDKS:-all}" = first ] && suite_jdks=("${jdks[0]}")
for jdk in "${suite_jdks[@]}"; do
  echo "test-java: mvn test on $("$jdk/bin/java" -version 2>&1 | head -1)"
  JAVA_HOME="$jdk" mvn -B -f bindings/java/pom.xml test \
    -Dshardlimit.natives.dir="$work/natives" -Dshardlimit.build.dir="$work/build" \
    -Dshardlimit.test.noexec.dir="$noexec" 2>&1 | grep -E "Tests run:|FAIL|ERROR|BUILD" || true
  grep -q 'errors="0" skipped="[0-9]*" failures="0"' "$work"/build/surefire-reports/TEST-io.shardlimit.VectorsTest.xml ||
    { echo "test-java: the JUnit suite failed on $jdk" >&2; exit 1; }
  for f in "$work"/build/surefire-reports/TEST-*.xml; do
    grep -q 'errors="0" skipped="[0-9]*" failures="0"' "$f" || { echo "test-java: failures in $f" >&2; exit 1; }
  done
done

echo "test-java: the install test (an empty local repository, no Rust on PATH)"
repo="$work/repo"
mkdir -p "$repo"
# plugins come from the Maven cache, read as a remote repository: nothing else is there
# (the suites never install io.shardlimit into ~/.m2)
[ ! -e "$HOME/.m2/repository/io/shardlimit" ] || { echo "test-java: ~/.m2 holds io.shardlimit: remove it" >&2; exit 1; }
cat >"$work/settings.xml" <<XML
<settings><mirrors><mirror><id>cache</id><mirrorOf>*</mirrorOf>
<url>file://$HOME/.m2/repository</url></mirror></mirrors></settings>
XML
mvn -B -q org.apache.maven.plugins:maven-install-plugin:3.1.4:help >/dev/null # into the cache (first run)
mvn -B -q -s "$work/settings.xml" -Dmaven.repo.local="$repo" \
  org.apache.maven.plugins:maven-install-plugin:3.1.4:install-file \
  -Dfile="$jar" -DpomFile="$DIST/java/shardlimit-$version.pom" \
  -Dsources="$DIST/java/shardlimit-$version-sources.jar" -Djavadoc="$DIST/java/shardlimit-$version-javadoc.jar"
[ -f "$repo/io/shardlimit/shardlimit/$version/shardlimit-$version.jar" ] || { echo "test-java: install-file installed nothing" >&2; exit 1; }
starter="$DIST/java/shardlimit-spring-boot-starter-$version"
mvn -B -q -s "$work/settings.xml" -Dmaven.repo.local="$repo" \
  org.apache.maven.plugins:maven-install-plugin:3.1.4:install-file \
  -Dfile="$starter.jar" -DpomFile="$starter.pom" -Dsources="$starter-sources.jar" -Djavadoc="$starter-javadoc.jar"
# the starter brings the library and Spring Boot's auto-configuration to a Boot project (its
# versions from Boot's BOM, as spring-boot-starter-parent manages them) that names only the starter
mkdir -p "$work/starter-consumer"
cat >"$work/starter-consumer/pom.xml" <<XML
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>example</groupId><artifactId>starter-consumer</artifactId><version>1</version>
<dependencyManagement><dependencies><dependency><groupId>org.springframework.boot</groupId>
<artifactId>spring-boot-dependencies</artifactId><version>3.5.7</version><type>pom</type><scope>import</scope>
</dependency></dependencies></dependencyManagement>
<dependencies><dependency><groupId>io.shardlimit</groupId><artifactId>shardlimit-spring-boot-starter</artifactId>
<version>$version</version></dependency></dependencies></project>
XML
(cd "$work/starter-consumer" && PATH=/usr/bin:/bin mvn -B -q -s "$work/settings.xml" -Dmaven.repo.local="$repo" \
  org.apache.maven.plugins:maven-dependency-plugin:2.8:build-classpath -Dmdep.outputFile=cp.txt)
starter_cp=$(tr ':' '\n' <"$work/starter-consumer/cp.txt")
for want in "io/shardlimit/shardlimit/$version/shardlimit-$version.jar" spring-boot-autoconfigure-; do
  grep -q "$want" <<<"$starter_cp" ||
    { echo "test-java: a project naming shardlimit-spring-boot-starter lacks $want; its class path:" >&2; echo "$starter_cp" >&2; exit 1; }
done
echo "test-java: shardlimit-spring-boot-starter brings $(grep -c . <<<"$starter_cp") jars, shardlimit-$version.jar and spring-boot-autoconfigure among them"
cp -r bindings/java/consumer-test "$work/consumer"
redis_dir="$work/redis"; mkdir -p "$redis_dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$redis_dir" >"$redis_dir/log" 2>&1 &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null || true; cleanup' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
for jdk in "${jdks[@]}"; do
  redis-cli -p "$port" FLUSHALL >/dev/null # the consumer's counts start from nothing on each JDK
  (
    cd "$work/consumer"
    export PATH=/usr/bin:/bin JAVA_HOME="$jdk"
    ! command -v cargo >/dev/null 2>&1 || { echo "test-java: cargo is on PATH" >&2; exit 1; }
    rm -rf target
    mvn -B -q -s "$work/settings.xml" -Dmaven.repo.local="$repo" -Dshardlimit.version="$version" package -DskipTests
    out=$("$jdk/bin/java" --enable-native-access=ALL-UNNAMED -Djava.io.tmpdir="$work" \
      -cp "target/classes:$repo/io/shardlimit/shardlimit/$version/shardlimit-$version.jar" \
      example.Main "redis://127.0.0.1:$port")
    echo "$out" | sed 's/^/  /'
    echo "$out" | grep -q "memory: allowed=false source=memory retry-after=" &&
      echo "$out" | grep -q "redis: allowed=true source=redis remaining=1" &&
      echo "$out" | grep -q "error: unknown_policy" &&
      echo "$out" | grep -q "loaded from: $work/shardlimit-" ||
      { echo "test-java: the consumer did not run as expected on $jdk" >&2; exit 1; }
  )
done
echo "test-java: passed on ${#jdks[@]} JDKs"
