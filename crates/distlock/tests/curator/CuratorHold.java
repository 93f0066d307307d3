import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryOneTime;

/**
 * Takes one lock with Apache Curator's own recipes and holds it until told to let go: the
 * other side of distlock's ZooKeeper interop tests (crates/distlock/tests/zookeeper.rs).
 *
 * <pre>
 * usage: CuratorHold CONNECT MODE PATH TIMEOUT_MS
 *   MODE: read | write (InterProcessReadWriteLock), mutex (InterProcessMutex),
 *         sem:N (one lease of InterProcessSemaphoreV2 with N leases)
 * stdout, one line each: "connected", then "acquired" or "busy" (not acquired within
 * TIMEOUT_MS); after "acquired" it reads one line from stdin, releases, prints "released".
 * </pre>
 */
public class CuratorHold {
    public static void main(String[] args) throws Exception {
        String connect = args[0], mode = args[1], path = args[2];
        long timeout = Long.parseLong(args[3]);
        try (CuratorFramework client =
                CuratorFrameworkFactory.newClient(connect, 30_000, 10_000, new RetryOneTime(100))) {
            client.start();
            if (!client.blockUntilConnected(60, TimeUnit.SECONDS)) {
                say("no connection");
                System.exit(2);
            }
            say("connected");
            Lease lease = null;
            InterProcessLock lock = null;
            boolean acquired;
            if (mode.startsWith("sem:")) {
                int leases = Integer.parseInt(mode.substring(4));
                InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, leases);
                lease = semaphore.acquire(timeout, TimeUnit.MILLISECONDS);
                acquired = lease != null;
            } else {
                InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, path);
                lock = switch (mode) {
                    case "read" -> rw.readLock();
                    case "write" -> rw.writeLock();
                    case "mutex" -> new InterProcessMutex(client, path);
                    default -> throw new IllegalArgumentException("unknown mode " + mode);
                };
                acquired = lock.acquire(timeout, TimeUnit.MILLISECONDS);
            }
            say(acquired ? "acquired" : "busy");
            if (!acquired) {
                return;
            }
            new BufferedReader(new InputStreamReader(System.in)).readLine();
            if (lease != null) {
                lease.close();
            } else {
                lock.release();
            }
            say("released");
        }
    }

    private static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }
}
