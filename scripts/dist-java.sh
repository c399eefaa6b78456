#!/usr/bin/env bash
# dist/java: the Maven artifact io.shardlimit:shardlimit:<version> as Maven Central takes it
# (scripts/dist.sh calls this with the library it built; it can run alone):
#   shardlimit-<v>.jar          the classes, and natives/linux-x86_64/libshardlimit_jni.so
#   shardlimit-<v>-sources.jar  shardlimit-<v>-javadoc.jar  (Central requires both)
#   shardlimit-<v>.pom          bindings/java/pom.xml (name, description, url, licenses,
#                               developers, scm: Central's required metadata)
#   shardlimit-spring-boot-starter-<v>.{jar,pom} (+ -sources, -javadoc jars): the starter
#                               Spring's naming convention expects, from
#                               bindings/java/spring-boot-starter/pom.xml: dependencies only
#                               (shardlimit and spring-boot-starter); its jar holds no code
#   and a .md5 and .sha1 of each (signing, .asc, is the release's step: RELEASING.md).
#
# Usage: scripts/dist-java.sh [path/to/libshardlimit_jni.so [FOLDER=LIBRARY...]]
# FOLDER=LIBRARY: another platform's library into natives/FOLDER/ as well (make dist-all
# passes linux-aarch64, osx-aarch64 and osx-x86_64 from its builds).
# Without a path, the library is built here (`cargo build --profile dist -p shardlimit-java`,
# for this machine's glibc; dist.sh passes its zigbuild for glibc 2.28 instead).
# Needs a JDK >= 17 and Maven (installed from Debian when missing); Maven resolves the
# build's plugins into ~/.m2 on the first run, and works from there after.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/lib.sh

ensure_java() {
  command -v javac >/dev/null 2>&1 || apt_install openjdk-17-jdk-headless
  command -v mvn >/dev/null 2>&1 || apt_install maven
}
ensure_java

version=$(workspace_version)
lib=${1:-}
if [ -z "$lib" ]; then
  ensure_rust
  echo "dist-java: cargo build --profile dist -p shardlimit-java"
  cargo build --quiet --locked --profile dist -p shardlimit-java
  lib="$(target_dir)/dist/libshardlimit_jni.so"
fi
[ -f "$lib" ] || { echo "dist-java: no library at $lib" >&2; exit 1; }
grep -q "<version>$version</version>" bindings/java/pom.xml ||
  { echo "dist-java: bindings/java/pom.xml's version is not the workspace's $version" >&2; exit 1; }

DIST=${DIST_DIR:-$root/dist}
out="$DIST/java"
stage="$(target_dir)/dist-java"
rm -rf "$out" "$stage"
mkdir -p "$out" "$stage/natives/linux-x86_64"
cp "$lib" "$stage/natives/linux-x86_64/libshardlimit_jni.so"
for extra in "${@:2}"; do
  [ -f "${extra#*=}" ] || { echo "dist-java: no library at ${extra#*=} (for ${extra%%=*})" >&2; exit 1; }
  mkdir -p "$stage/natives/${extra%%=*}"
  cp "${extra#*=}" "$stage/natives/${extra%%=*}/"
done

echo "dist-java: mvn package (jar with natives/ $(cd "$stage/natives" && echo *))"
mvn -B -q -f bindings/java/pom.xml package -DskipTests \
  -Dshardlimit.natives.dir="$stage/natives" -Dshardlimit.build.dir="$stage/build"
name="shardlimit-$version"
cp "$stage/build/$name.jar" "$out/$name.jar"
# (the listing read whole first: `grep -q` leaving a pipe early fails it under pipefail)
listing=$(jar --list --file "$out/$name.jar")
for native in $(cd "$stage" && ls natives/*/*); do
  if ! grep -qx "$native" <<<"$listing"; then
    echo "dist-java: the jar has no $native; it holds:" >&2
    echo "$listing" >&2
    ls -lR "$stage/natives" "$stage/build/classes" >&2 || true
    exit 1
  fi
done
cp bindings/java/pom.xml "$out/$name.pom"

echo "dist-java: sources and javadoc jars"
jar --create --file "$out/$name-sources.jar" -C bindings/java/src/main/java .
# the optional APIs the Servlet filter and the Spring Boot integration compile against
mvn -B -q -f bindings/java/pom.xml dependency:build-classpath -Dmdep.includeScope=compile \
  -Dmdep.outputFile="$stage/classpath.txt" -Dshardlimit.build.dir="$stage/build"
javadoc -quiet -Xdoclint:none --release 17 -encoding UTF-8 -d "$stage/javadoc" \
  -sourcepath bindings/java/src/main/java -classpath "$(cat "$stage/classpath.txt")" -subpackages io.shardlimit \
  >"$stage/javadoc.log" 2>&1 || { cat "$stage/javadoc.log" >&2; exit 1; }
jar --create --file "$out/$name-javadoc.jar" -C "$stage/javadoc" .

echo "dist-java: the Spring Boot starter (dependencies only)"
starter_pom=bindings/java/spring-boot-starter/pom.xml
[ "$(grep -c "<version>$version</version>" "$starter_pom")" = 2 ] ||
  { echo "dist-java: $starter_pom's own version and its shardlimit dependency's must be the workspace's $version" >&2; exit 1; }
sname="shardlimit-spring-boot-starter-$version"
meta="$stage/starter/META-INF/maven/io.shardlimit/shardlimit-spring-boot-starter"
mkdir -p "$meta" "$stage/starter-docs"
cp "$starter_pom" "$meta/pom.xml"
printf 'Manifest-Version: 1.0\nAutomatic-Module-Name: io.shardlimit.spring.boot.starter\n' >"$stage/starter.mf"
jar --create --file "$out/$sname.jar" --manifest "$stage/starter.mf" -C "$stage/starter" .
cat >"$stage/starter-docs/README.txt" <<TXT
shardlimit-spring-boot-starter $version has no code of its own: it depends on
io.shardlimit:shardlimit $version, whose package io.shardlimit.spring holds the
auto-configuration, @RateLimit, the Actuator health indicator and the Micrometer metrics
(see that artifact's sources and javadoc), and on spring-boot-starter.
TXT
jar --create --file "$out/$sname-sources.jar" -C "$stage/starter-docs" .
jar --create --file "$out/$sname-javadoc.jar" -C "$stage/starter-docs" .
cp "$starter_pom" "$out/$sname.pom"

for f in "$out"/*.jar "$out"/*.pom; do
  md5sum "$f" | cut -d' ' -f1 >"$f.md5"
  sha1sum "$f" | cut -d' ' -f1 >"$f.sha1"
done
echo "dist-java: $(cd "$out" && ls *.jar *.pom | tr '\n' ' ')"
