package mqtest;

import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

/**
 * Java remoting client scenarios, the same source for rocketmq-client 4.9.x and 5.x.
 *
 * Usage: {@code Remoting NAMESRV RUN_ID TIMEOUT_S SCENARIO...}. The scenarios run concurrently, each with its
 * own clients (own instance names) and names ({@code <label>_<RUN_ID>}); every event carries "scenario".
 * Each scenario ends with "scenario.done" {ok}; the run ends with "done" {ok} and exits. The scenarios live in
 * {@link ProduceScenarios}, {@link ConsumeScenarios} and {@link TransactionScenarios}.
 */
public final class Remoting {
    private Remoting() {}

    interface Scenario {
        void run(Kit kit) throws Exception;
    }

    static final Map<String, Scenario> SCENARIOS = new LinkedHashMap<>();

    static {
        SCENARIOS.put("send", ProduceScenarios::send);
        SCENARIOS.put("tag-filter", ConsumeScenarios::tagFilter);
        SCENARIOS.put("sql-filter", ConsumeScenarios::sqlFilter);
        SCENARIOS.put("orderly", ConsumeScenarios::orderly);
        SCENARIOS.put("orderly-sql", ConsumeScenarios::orderlySql);
        SCENARIOS.put("broadcast", ConsumeScenarios::broadcast);
        SCENARIOS.put("lite-subscribe", ConsumeScenarios::liteSubscribe);
        SCENARIOS.put("lite-assign", ConsumeScenarios::liteAssign);
        SCENARIOS.put("delay", ProduceScenarios::delay);
        SCENARIOS.put("retry-dlq", ConsumeScenarios::retryDlq);
        SCENARIOS.put("transaction", TransactionScenarios::transaction);
        SCENARIOS.put("query", ProduceScenarios::query);
        SCENARIOS.put("unsupported", ProduceScenarios::unsupported);
        SCENARIOS.put("admin-fixture", ProduceScenarios::adminFixture);
        SCENARIOS.put("orderly-hold", ConsumeScenarios::orderlyHold);
        SCENARIOS.put("orderly-resume", ConsumeScenarios::orderlyResume);
        SCENARIOS.put("tx-orphan", TransactionScenarios::txOrphan);
        SCENARIOS.put("tx-adopt", TransactionScenarios::txAdopt);
    }

    public static void main(String[] args) throws Exception {
        String namesrv = args[0], runId = args[1];
        long timeoutMillis = Long.parseLong(args[2]) * 1000L;
        List<String> names = Arrays.asList(args).subList(3, args.length);
        ExecutorService pool = Executors.newCachedThreadPool();
        Map<String, Future<Boolean>> running = new LinkedHashMap<>();
        for (String name : names) {
            Scenario scenario = SCENARIOS.get(name);
            Kit kit = new Kit(namesrv, runId, name, timeoutMillis);
            running.put(name, pool.submit(() -> runOne(kit, scenario)));
        }
        boolean ok = true;
        for (Map.Entry<String, Future<Boolean>> e : running.entrySet()) {
            try {
                ok &= e.getValue().get(timeoutMillis + 30_000, TimeUnit.MILLISECONDS);
            } catch (Exception ex) {
                Events.error(e.getKey(), ex);
                ok = false;
            }
        }
        Events.emit("done", "ok", ok);
        System.exit(0);
    }

    private static boolean runOne(Kit kit, Scenario scenario) {
        if (scenario == null) {
            kit.emit("scenario.done", "ok", false, "reason", "unknown scenario");
            return false;
        }
        try {
            scenario.run(kit);
            kit.emit("scenario.done", "ok", true);
            return true;
        } catch (Throwable t) {
            Events.error(kit.scenario, t);
            kit.emit("scenario.done", "ok", false, "reason", String.valueOf(t));
            return false;
        }
    }
}
