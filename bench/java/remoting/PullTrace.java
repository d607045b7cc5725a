package mqbench;

import java.io.IOException;
import java.io.PrintWriter;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.remoting.protocol.header.PullMessageRequestHeader;

/**
 * An RPC hook on the consumer's remoting client that times every PULL_MESSAGE (code 11) as the client sees
 * it: "sent" when the client writes the request (before-request hook, in the pulling thread) and "answered"
 * when its callback starts (after-response hook, in the callback executor), with the queue, the offset
 * asked for, the answer's code, body length and nextBeginOffset. {@link #write} writes one line per event
 * ({@code ns kind queue offset opaque code bodyBytes nextBeginOffset}) and, apart, the first FOUND answer
 * whole: its header fields and its body bytes, to compare answers across servers.
 */
final class PullTrace implements RPCHook {
    private static final int PULL_MESSAGE = 11;
    private final List<String> lines = new ArrayList<>();
    private RemotingCommand sample;

    @Override
    public void doBeforeRequest(String remoteAddr, RemotingCommand request) {
        if (request.getCode() == PULL_MESSAGE) {
            record("sent", request, null);
        }
    }

    @Override
    public void doAfterResponse(String remoteAddr, RemotingCommand request, RemotingCommand response) {
        if (request.getCode() == PULL_MESSAGE) {
            record("answered", request, response);
        }
    }

    private void record(String kind, RemotingCommand request, RemotingCommand response) {
        long now = System.nanoTime();
        int queue = -1;
        long offset = -1;
        if (request.readCustomHeader() instanceof PullMessageRequestHeader) {
            PullMessageRequestHeader header = (PullMessageRequestHeader) request.readCustomHeader();
            queue = header.getQueueId();
            offset = header.getQueueOffset();
        }
        int code = response == null ? -1 : response.getCode();
        int body = response == null || response.getBody() == null ? 0 : response.getBody().length;
        String next = response == null || response.getExtFields() == null ? "-"
            : String.valueOf(response.getExtFields().get("nextBeginOffset"));
        synchronized (this) {
            lines.add(now + " " + kind + " " + queue + " " + offset + " " + request.getOpaque() + " " + code + " "
                + body + " " + next);
            if (response != null && code == 0 && body > 0 && sample == null) {
                sample = response;
            }
        }
    }

    /** The events into {@code path}; the first FOUND answer into {@code path}.header and {@code path}.body. */
    synchronized void write(Path path) throws IOException {
        try (PrintWriter out = new PrintWriter(Files.newBufferedWriter(path))) {
            for (String line : lines) {
                out.println(line);
            }
        }
        if (sample != null) {
            Map<String, String> ext = new TreeMap<>(sample.getExtFields() == null ? Map.of() : sample.getExtFields());
            String header = "code=" + sample.getCode() + "\nversion=" + sample.getVersion() + "\nflag=" + sample.getFlag()
                + "\nlanguage=" + sample.getLanguage() + "\nremark=" + sample.getRemark() + "\nserializeType="
                + sample.getSerializeTypeCurrentRPC() + "\next=" + ext + "\n";
            Files.writeString(Path.of(path + ".header"), header);
            Files.write(Path.of(path + ".body"), sample.getBody());
        }
    }
}
