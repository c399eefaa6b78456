package io.shardlimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.junit.jupiter.api.Test;

/** The operations and error tables of spec/ checked against the Java API. */
class SpecTest {
    /** Each operation of spec/operations.json and the public methods of Limiter that offer it. */
    static final Map<String, List<String>> OPERATIONS = Map.ofEntries(
            Map.entry("memory", List.of("memory")),
            Map.entry("new", List.of("fromJson")),
            Map.entry("from_config_file", List.of("fromConfigFile")),
            Map.entry("from_env", List.of("fromEnv")),
            Map.entry("with_clock", List.of("fromJson(String,ManualClock)", "memory(ManualClock)")),
            Map.entry("config", List.of("config")),
            Map.entry("config_generation", List.of("configGeneration")),
            Map.entry("is_redis", List.of("isRedis")),
            Map.entry("memory_keys", List.of("memoryKeys")),
            Map.entry("policy", List.of("policy")),
            Map.entry("plan_policy", List.of("planPolicy")),
            Map.entry("route", List.of("route")),
            Map.entry("subscribe", List.of("subscribe")),
            Map.entry("set_log_sink", List.of("setLogSink")),
            Map.entry("reload", List.of("reload")),
            Map.entry("reload_from_file", List.of("reloadFromFile")),
            Map.entry("watch_config", List.of("watchConfig")),
            Map.entry("set_scale", List.of("setScale")),
            Map.entry("scale", List.of("scale")),
            Map.entry("observe_health", List.of("observeHealth(Duration)", "observeHealth(double)", "setLatencyScale")),
            Map.entry("metrics", List.of("metrics", "metricsSnapshot")),
            Map.entry("connect", List.of("connect", "connectAsync")),
            Map.entry("check", List.of("check", "checkAsync", "checkPlan", "checkPlanAsync")),
            Map.entry("peek", List.of("peek", "peekAsync", "peekPlan")),
            Map.entry("acquire", List.of("acquire", "acquireAsync")),
            Map.entry("release", List.of("release", "releaseAsync")),
            Map.entry("reset", List.of("reset", "resetAsync")),
            Map.entry("check_all", List.of("checkAll", "checkAllAsync")),
            Map.entry("check_shadow", List.of("checkShadow", "checkShadowAsync")),
            Map.entry("shadow_report", List.of("shadowReport", "shadowReportAsync")),
            Map.entry("block", List.of("block", "blockAsync")),
            Map.entry("unblock", List.of("unblock", "unblockAsync")),
            Map.entry("blocked", List.of("blocked", "blockedAsync")),
            Map.entry("set_override", List.of("setOverride", "setOverrideAsync")),
            Map.entry("get_override", List.of("getOverride", "getOverrideAsync")),
            Map.entry("list_overrides", List.of("listOverrides", "listOverridesAsync")),
            Map.entry("delete_override", List.of("deleteOverride", "deleteOverrideAsync")),
            Map.entry("charge", List.of("charge", "chargeAsync")),
            Map.entry("refund", List.of("refund", "refundAsync")),
            Map.entry("reserve", List.of("reserve", "reserveAsync")),
            Map.entry("settle", List.of("settle", "settleAsync")));

    static boolean offers(String spec) {
        int paren = spec.indexOf('(');
        String name = paren < 0 ? spec : spec.substring(0, paren);
        for (Method m : Limiter.class.getMethods()) {
            if (!m.getName().equals(name) || !Modifier.isPublic(m.getModifiers())) {
                continue;
            }
            if (paren < 0) {
                return true;
            }
            String types = String.join(",", Arrays.stream(m.getParameterTypes()).map(Class::getSimpleName).toList());
            if (spec.substring(paren + 1, spec.length() - 1).equals(types)) {
                return true;
            }
        }
        return false;
    }

    @Test
    void everyOperationOfTheSpecIsOfferedOrListedWithAReason() throws Exception {
        Map<String, Object> spec = Vectors.read("spec/operations.json");
        assertTrue(((List<?>) spec.get("languages")).contains("java"), "spec/operations.json's languages lack java");
        Set<String> seen = new TreeSet<>();
        Set<String> notInJava = new TreeSet<>();
        for (Map<String, Object> op : VectorsTest.list(spec.get("operations"))) {
            String name = (String) op.get("name");
            seen.add(name);
            // an operation Java does not offer is marked so in the spec, with its reason
            Object reason = ((Map<?, ?>) op.get("not_in")).get("java");
            if (reason != null) {
                assertFalse(OPERATIONS.containsKey(name), name + " is marked not_in java but listed here");
                assertFalse(((String) reason).isEmpty(), name + ": not_in java gives no reason");
                notInJava.add(name);
                continue;
            }
            List<String> methods = OPERATIONS.get(name);
            assertTrue(methods != null, "spec operation " + name + " has no Java method");
            for (String m : methods) {
                assertTrue(offers(m), name + ": Limiter." + m + " is missing");
            }
        }
        Set<String> listed = new TreeSet<>(OPERATIONS.keySet());
        listed.addAll(notInJava);
        assertEquals(seen, listed, "an operation listed here that the spec no longer has");
    }

    @Test
    void theExceptionHierarchyFollowsTheErrorTable() throws Exception {
        Map<String, Object> spec = Vectors.read("spec/errors.json");
        Set<String> fromSpec = new HashSet<>();
        for (Map<String, Object> k : VectorsTest.list(spec.get("kinds"))) {
            String name = (String) k.get("name");
            int code = ((Number) k.get("code")).intValue();
            fromSpec.add(name + "=" + code);
            ShardlimitException e = ShardlimitException.of(code, "m");
            assertEquals(name, e.kind());
            assertEquals(code, e.code());
            assertEquals(k.get("backend"), e instanceof ShardlimitException.Backend, name + " backend");
            Object parent = k.get("parent");
            if (parent != null) {
                ShardlimitException p = ShardlimitException.of(VectorsTest.list(spec.get("kinds")).stream()
                        .filter(x -> parent.equals(x.get("name"))).mapToInt(x -> ((Number) x.get("code")).intValue())
                        .findFirst().orElseThrow(), "m");
                assertTrue(p.getClass().isInstance(e), name + " extends " + parent);
            }
            // the class is named after the kind
            String simple = e.getClass().getSimpleName().toLowerCase();
            assertEquals(name.replace("_", ""), simple, name);
        }
        // the native library's kinds are the table's
        Set<String> fromLibrary = new HashSet<>();
        for (Map<String, Object> k : VectorsTest.list(Json.object(Native.errorKinds()).get("kinds"))) {
            fromLibrary.add(k.get("name") + "=" + ((Number) k.get("code")).intValue());
        }
        assertEquals(fromSpec, fromLibrary);
    }

    @Test
    void theNamesOfSpecNamesJson() throws Exception {
        Map<String, Object> names = Vectors.read("spec/names.json");
        assertTrue(offers("fromConfigFile"));
        assertTrue(offers("metrics"));
        assertTrue(offers("metricsSnapshot"));
        @SuppressWarnings("unchecked")
        List<String> kinds = (List<String>) names.get("event_kinds");
        assertTrue(kinds.contains("denied"));
        // an event carries its kind as Event.kind() and as its first field "kind"
        assertTrue(Arrays.stream(Results.Event.class.getRecordComponents()).anyMatch(c -> c.getName().equals("kind")));
    }

    @Test
    void theVersionIsTheWorkspaceVersion() throws Exception {
        String cargo = java.nio.file.Files.readString(Vectors.root().resolve("Cargo.toml"));
        var m = java.util.regex.Pattern.compile("(?s)\\[workspace\\.package\\].*?\\nversion = \"([^\"]+)\"").matcher(cargo);
        assertTrue(m.find());
        assertEquals(m.group(1), Limiter.coreVersion());
        String pom = java.nio.file.Files.readString(Vectors.root().resolve("bindings/java/pom.xml"));
        assertTrue(pom.contains("<version>" + m.group(1) + "</version>"), "pom.xml's version");
    }
}
