package mqtest;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import org.apache.rocketmq.tools.command.MQAdminStartup;

/**
 * Several {@code mqadmin} commands in one JVM (one JVM per command costs seconds each on a small machine).
 *
 * Usage: {@code MqadminBatch CMD ARGS... ";;" CMD ARGS... ";;" ...}. Before each command it prints
 * {"event":"command","index":i,"args":[...]}; the command's own output follows as mqadmin prints it; then
 * {"event":"command.end","index":i}. Ends with {"event":"done","ok":true} and exits.
 */
public final class MqadminBatch {
    private MqadminBatch() {}

    public static void main(String[] args) {
        List<List<String>> commands = new ArrayList<>();
        List<String> current = new ArrayList<>();
        for (String arg : args) {
            if (arg.equals(";;")) {
                commands.add(current);
                current = new ArrayList<>();
            } else {
                current.add(arg);
            }
        }
        if (!current.isEmpty()) {
            commands.add(current);
        }
        for (int i = 0; i < commands.size(); i++) {
            List<String> command = commands.get(i);
            Events.emit("command", "index", i, "args", command);
            try {
                MQAdminStartup.main0(command.toArray(new String[0]), null);
            } catch (Throwable t) {
                Events.error(String.valueOf(command), t);
            }
            System.out.println();
            Events.emit("command.end", "index", i);
        }
        Events.emit("done", "ok", true, "commands", Arrays.asList(args).size());
        System.exit(0);
    }
}
