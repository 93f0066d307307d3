//! Elections on ZooKeeper in the layout of Curator's `LeaderLatch`, against real Curator
//! (Debian's Curator 5.4 on the JDK, `tests/curator/CuratorLatch.java`): a Curator
//! participant that leads is distlock's leader too and keeps distlock's candidates waiting,
//! and Curator's `getLeader()` names distlock's leader.

mod common {
    pub mod curator;
    pub mod zookeeper;
}

use std::time::Duration;

use common::curator::{Curator, JVM_LIMIT};
use common::zookeeper::*;
use distlock::backends::zookeeper::zookeeper_client;
use distlock::{Owner, RegistryOptions};
use tokio::time::timeout;

/// The names and data of the `latch-` nodes under `path`, in sequence order.
async fn latch_nodes(client: &zookeeper_client::Client, path: &str) -> Vec<(String, String)> {
    let mut names: Vec<String> = client
        .list_children(path)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.contains("-latch-"))
        .collect();
    names.sort_by_key(|n| n.rsplit('-').next().unwrap_or_default().to_owned());
    let mut out = Vec::new();
    for n in names {
        if let Ok((data, _)) = client.get_data(&format!("{path}/{n}")).await {
            out.push((n, String::from_utf8_lossy(&data).into_owned()));
        }
    }
    out
}

/// `_c_<8-4-4-4-12 hex>-latch-<10 digits>`: Curator's protected `LeaderLatch` node.
fn is_latch_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("_c_") else {
        return false;
    };
    let (uuid, tail) = rest.split_at(36.min(rest.len()));
    uuid.split('-').map(str::len).eq([8, 4, 4, 4, 12])
        && tail
            .strip_prefix("-latch-")
            .is_some_and(|s| s.len() == 10 && s.bytes().all(|b| b.is_ascii_digit()))
}

/// Named `zookeeper::…`, so that `-E 'test(/zookeeper/)'` selects them all.
mod zookeeper {
    use super::*;

    /// Curator's participant leads: distlock names it, its campaign waits (with a latch node
    /// of its own holding its description) and leads once Curator leaves.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn curator_leads_and_distlock_waits() {
        let server = shared();
        let r = root();
        let b = backend(&format!("{}{r}", server.url())).await;
        let reg = registry(&b, RegistryOptions::default());
        let path = format!("{r}/jobs");
        let mut curator = Curator::latch(&server.connect_string(), &path, "curator-1").await;
        assert_eq!(curator.line(JVM_LIMIT).await, "leading");
        let election = reg.election("jobs").unwrap();
        let leader = election.leader().await.unwrap().expect("Curator leads");
        assert_eq!(leader.description, "curator-1");

        let campaign = {
            let election = election.clone();
            tokio::spawn(async move { election.campaign(Owner::new("dl-1").unwrap()).await })
        };
        let client = b.client().await.unwrap();
        let started = tokio::time::Instant::now();
        while latch_nodes(&client, &path).await.len() < 2 {
            assert!(started.elapsed() < JVM_LIMIT, "our candidate's node");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let nodes = latch_nodes(&client, &path).await;
        assert!(nodes.iter().all(|(n, _)| is_latch_name(n)), "{nodes:?}");
        assert_eq!(nodes[0].1, "curator-1");
        assert_eq!(nodes[1].1, "dl-1", "a waiting candidate's data is its id");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!campaign.is_finished(), "distlock leads beside Curator");
        assert_eq!(curator.leader().await, "curator-1");

        curator.close().await;
        let leading = timeout(JVM_LIMIT, campaign)
            .await
            .expect("distlock leads after Curator")
            .unwrap()
            .unwrap();
        let now = election.leader().await.unwrap().expect("distlock leads");
        assert_eq!(now.description, "dl-1");
        assert!(leading.term() >> 10 > leader.term >> 10);
        leading.resign().await.unwrap();
        assert!(latch_nodes(&client, &path).await.is_empty());
        assert!(election.leader().await.unwrap().is_none());
    }

    /// distlock leads: Curator's `getLeader()` reads distlock's description, its participant
    /// waits, and leads once distlock resigns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn distlock_leads_and_curator_sees_it() {
        let server = shared();
        let r = root();
        let b = backend(&format!("{}{r}", server.url())).await;
        let reg = registry(&b, RegistryOptions::default());
        let path = format!("{r}/jobs");
        let election = reg.election("jobs").unwrap();
        let leading = election
            .campaign(Owner::new("dl-leader").unwrap())
            .await
            .unwrap();
        let client = b.client().await.unwrap();
        let nodes = latch_nodes(&client, &path).await;
        assert_eq!(nodes.len(), 1, "{nodes:?}");
        assert!(is_latch_name(&nodes[0].0), "{nodes:?}");
        assert_eq!(
            nodes[0].1, "dl-leader",
            "the node's data: the bare description"
        );

        let mut curator = Curator::latch(&server.connect_string(), &path, "curator-2").await;
        assert_eq!(curator.leader().await, "dl-leader");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(curator.waiting(), "Curator leads beside distlock");

        leading.resign().await.unwrap();
        assert_eq!(curator.line(JVM_LIMIT).await, "leading");
        let now = election.leader().await.unwrap().expect("Curator leads");
        assert_eq!(now.description, "curator-2");
        assert_eq!(curator.leader().await, "curator-2");
        curator.close().await;
    }

    /// As in Curator, an election and the key's mutex are different recipes on one node:
    /// they ignore each other, and `inspect` of each sees only its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn election_and_mutex_of_a_key_ignore_each_other() {
        let server = shared();
        let r = root();
        let b = backend(&format!("{}{r}", server.url())).await;
        let reg = registry(&b, RegistryOptions::default());
        let guard = reg.obtain("jobs").unwrap().lock().await.unwrap();
        let election = reg.election("jobs").unwrap();
        assert!(election.leader().await.unwrap().is_none());
        let leading = election
            .campaign_for(Owner::new("dl-1").unwrap(), Duration::from_secs(2))
            .await
            .expect("the key's mutex does not hold the election");
        let info = reg
            .obtain("jobs")
            .unwrap()
            .inspect()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info.holders, Some(1));
        assert_eq!(info.waiters, Some(0), "the candidate is no mutex waiter");
        guard.release().await.unwrap();
        assert!(reg
            .obtain("jobs")
            .unwrap()
            .inspect()
            .await
            .unwrap()
            .is_none());
        assert_eq!(
            election.leader().await.unwrap().unwrap().description,
            "dl-1"
        );
        let listed = distlock::Backend::list(&*b, "lock").await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].key, "jobs");
        assert_eq!(listed[0].info.owners, ["dl-1"]);
        leading.resign().await.unwrap();
    }
}
