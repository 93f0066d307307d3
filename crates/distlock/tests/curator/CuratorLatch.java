import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.retry.RetryOneTime;

/**
 * One participant of Apache Curator's LeaderLatch election: the other side of distlock's
 * ZooKeeper election interop tests (crates/distlock/tests/zookeeper_election.rs).
 *
 * <pre>
 * usage: CuratorLatch CONNECT PATH ID
 * stdout, one line each: "connected", then "leading" when it becomes the leader and
 * "not leading" when it stops being it. Commands on stdin, one a line:
 *   leader  prints "leader ID" with the id LeaderLatch.getLeader() reads ("leader " alone
 *           when nobody leads)
 *   close   leaves the election (LeaderLatch.close()), prints "closed" and exits
 * </pre>
 */
public class CuratorLatch {
    public static void main(String[] args) throws Exception {
        String connect = args[0], path = args[1], id = args[2];
        try (CuratorFramework client =
                CuratorFrameworkFactory.newClient(connect, 30_000, 10_000, new RetryOneTime(100))) {
            client.start();
            if (!client.blockUntilConnected(60, TimeUnit.SECONDS)) {
                say("no connection");
                System.exit(2);
            }
            say("connected");
            LeaderLatch latch = new LeaderLatch(client, path, id);
            latch.addListener(new LeaderLatchListener() {
                @Override
                public void isLeader() {
                    say("leading");
                }

                @Override
                public void notLeader() {
                    say("not leading");
                }
            });
            latch.start();
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
            String line;
            while ((line = in.readLine()) != null) {
                switch (line) {
                    case "leader" -> {
                        Participant p = latch.getLeader();
                        say("leader " + (p.isLeader() ? p.getId() : ""));
                    }
                    case "close" -> {
                        latch.close();
                        say("closed");
                        return;
                    }
                    default -> say("unknown command " + line);
                }
            }
            latch.close();
        }
    }

    private static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }
}
