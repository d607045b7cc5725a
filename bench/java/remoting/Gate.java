package mqbench;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;

/**
 * Starts another main class only when told to, so that several client JVMs begin their load together
 * (bench/cluster.py runs two at once; a JVM's start-up on a loaded machine takes seconds, and varies).
 *
 *   --file F --id I [--timeout 300] -- MAIN ARGS...
 *
 * Loads MAIN, creates F.I.ready, waits for F to exist (polled every 5 ms), then runs MAIN.main(ARGS) in
 * this thread. Prints nothing itself (the wrapped program's first line stays its own); exits with status
 * 3 if F does not appear within the timeout.
 */
public final class Gate {
    private Gate() {}

    public static void main(String[] args) throws Throwable {
        int split = java.util.Arrays.asList(args).indexOf("--");
        java.util.Map<String, String> o = Latencies.options(java.util.Arrays.copyOfRange(args, 0, split));
        String main = args[split + 1];
        String[] rest = java.util.Arrays.copyOfRange(args, split + 2, args.length);
        Path gate = Paths.get(o.get("file"));
        long deadline = System.nanoTime() + (long) (Double.parseDouble(o.getOrDefault("timeout", "300")) * 1e9);

        java.lang.reflect.Method entry = Class.forName(main).getMethod("main", String[].class);
        Files.createFile(Paths.get(gate + "." + o.get("id") + ".ready"));
        while (!Files.exists(gate)) {
            if (System.nanoTime() > deadline) {
                System.err.println("gate " + gate + " never opened");
                System.exit(3);
            }
            Thread.sleep(5);
        }
        try {
            entry.invoke(null, (Object) rest);
        } catch (java.lang.reflect.InvocationTargetException e) {
            throw e.getCause();
        }
    }
}
