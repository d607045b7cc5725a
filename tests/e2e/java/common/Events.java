package mqtest;

import java.util.Collection;
import java.util.Map;

/**
 * JSON-lines output shared by the Java drivers in tests/e2e/java: one object per line on stdout, read by
 * pytest's JsonLineReader. Every line has an "event" key; a driver ends with exactly one "done" event.
 */
public final class Events {
    private Events() {}

    /** Print {"event": event, k1: v1, ...}; values may be strings, numbers, booleans, null, lists or maps. */
    public static synchronized void emit(String event, Object... keyValues) {
        if (keyValues.length % 2 != 0) {
            throw new IllegalArgumentException("keyValues must come in pairs");
        }
        StringBuilder out = new StringBuilder(128).append("{\"event\":").append(quote(event));
        for (int i = 0; i < keyValues.length; i += 2) {
            out.append(',').append(quote(String.valueOf(keyValues[i]))).append(':');
            value(out, keyValues[i + 1]);
        }
        System.out.println(out.append('}'));
        System.out.flush();
    }

    /** Print an "error" event for an exception (class, message, and the first cause). */
    public static void error(String where, Throwable t) {
        Throwable cause = t.getCause();
        emit("error", "where", where, "type", t.getClass().getName(), "message", String.valueOf(t.getMessage()),
             "cause", cause == null ? null : cause.getClass().getName() + ": " + cause.getMessage());
    }

    private static void value(StringBuilder out, Object v) {
        if (v == null) {
            out.append("null");
        } else if (v instanceof Number || v instanceof Boolean) {
            out.append(v);
        } else if (v instanceof Map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!first) out.append(',');
                first = false;
                out.append(quote(String.valueOf(e.getKey()))).append(':');
                value(out, e.getValue());
            }
            out.append('}');
        } else if (v instanceof Collection) {
            out.append('[');
            boolean first = true;
            for (Object o : (Collection<?>) v) {
                if (!first) out.append(',');
                first = false;
                value(out, o);
            }
            out.append(']');
        } else {
            out.append(quote(v.toString()));
        }
    }

    static String quote(String s) {
        StringBuilder out = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                case '\n': out.append("\\n"); break;
                case '\r': out.append("\\r"); break;
                case '\t': out.append("\\t"); break;
                default:
                    if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
                    else out.append(c);
            }
        }
        return out.append('"').toString();
    }
}
