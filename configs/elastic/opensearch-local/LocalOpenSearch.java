import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.node.Node;
import org.opensearch.transport.Netty4Plugin;

/**
 * A single-node OpenSearch on 127.0.0.1, from the server jar and the netty4 transport alone: enough
 * to PUT an index template, bulk-index and search. Not a production node (no security manager, no
 * modules but the core mappers, which include unsigned_long since 2.8).
 * Args: home directory (data and logs go under it), HTTP port.
 */
public final class LocalOpenSearch {
    private static final class LocalNode extends Node {
        LocalNode(Settings s) {
            super(new Environment(s, null), List.of(Netty4Plugin.class), true);
        }
    }

    public static void main(String[] args) throws Exception {
        Path home = Path.of(args[0]).toAbsolutePath();
        Files.createDirectories(home.resolve("config"));
        Settings s = Settings.builder()
            .put("path.home", home.toString())
            .put("path.data", home.resolve("data").toString())
            .put("path.logs", home.resolve("logs").toString())
            .put("cluster.name", "storeguard-check")
            .put("node.name", "storeguard-check")
            .put("discovery.type", "single-node")
            .put("network.host", "127.0.0.1")
            .put("http.port", args[1])
            .put("transport.port", "19300-19399")
            .put("cluster.routing.allocation.disk.threshold_enabled", false)
            .build();
        Node node = new LocalNode(s);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
            } catch (Exception e) {
                // exiting anyway
            }
        }, "opensearch-shutdown"));
        node.start();
        System.out.println("local opensearch listening on 127.0.0.1:" + args[1]);
        Thread.currentThread().join();
    }
}
