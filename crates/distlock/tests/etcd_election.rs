//! Elections on etcd in the layout of etcd's `concurrency.Election`, against the real
//! `etcdctl elect` (Debian `etcd-client`): a leader elected by `etcdctl` is distlock's leader
//! too and keeps distlock's candidates waiting, and `etcdctl elect -l` names distlock's leader.

mod common {
    pub mod etcd;
}

use std::time::Duration;

use common::etcd::*;
use distlock::{Owner, RegistryOptions};

/// Named `etcd::…`, so that `-E 'test(/etcd/)'` selects them all.
mod etcd {
    use super::*;

    /// A candidate's key is `<prefix>/<name>/<lease id hex>` and its value the bare
    /// description, while the key's mutex keeps its own value format.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn election_key_holds_the_bare_description() {
        let (server, p) = shared_server();
        let reg = registry(&server.url(), &p, RegistryOptions::default()).await;
        let election = reg.election("jobs").unwrap();
        let leading = election
            .campaign(Owner::new("web;1 %x").unwrap())
            .await
            .unwrap();
        let dir = format!("{p}/jobs/");
        let kvs = server_keys(&server, &dir);
        assert_eq!(kvs.len(), 1, "{kvs:?}");
        assert_eq!(kvs[0].key, format!("{dir}{:x}", kvs[0].lease));
        assert_eq!(kvs[0].value, "web;1 %x");
        let leader = election.leader().await.unwrap().expect("a leader");
        assert_eq!(leader.description, "web;1 %x");
        assert_eq!(leader.term, leading.term());
        let listed = backend(&server.url()).await.list(&p).await.unwrap();
        let jobs = listed.iter().find(|l| l.key == "jobs").expect("listed");
        assert_eq!(jobs.info.owners, ["web;1 %x"]);
        leading.resign().await.unwrap();
        assert!(server_keys(&server, &dir).is_empty(), "resigned: key gone");
        assert!(election.leader().await.unwrap().is_none());
    }

    /// `etcdctl elect` leads: distlock names its proposal as the leader and its campaign
    /// waits; once `etcdctl` resigns, distlock leads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcdctl_elect_leads_and_distlock_waits() {
        let (server, p) = shared_server();
        let reg = registry(&server.url(), &p, RegistryOptions::default()).await;
        let name = format!("{p}/jobs");
        let ctl = CtlLock::spawn_args(&server.endpoint(), &["elect", &name, "someid"]);
        let key = ctl
            .line(Duration::from_secs(10))
            .expect("etcdctl elect leads");
        assert!(key.starts_with(&format!("{name}/")), "{key}");
        let election = reg.election("jobs").unwrap();
        let leader = election.leader().await.unwrap().expect("etcdctl leads");
        assert_eq!(leader.description, "someid");

        let campaign = {
            let election = election.clone();
            tokio::spawn(async move { election.campaign(Owner::new("dl-1").unwrap()).await })
        };
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(!campaign.is_finished(), "distlock leads beside etcdctl");
        assert_eq!(
            election.leader().await.unwrap().unwrap().description,
            "someid"
        );
        ctl.signal(libc::SIGINT);
        let leading = tokio::time::timeout(Duration::from_secs(15), campaign)
            .await
            .expect("distlock leads after etcdctl")
            .unwrap()
            .unwrap();
        assert!(leading.term() >> 10 > leader.term >> 10);
        assert_eq!(
            election.leader().await.unwrap().unwrap().description,
            "dl-1"
        );
        let _ = ctl.wait(Duration::from_secs(5));
        leading.resign().await.unwrap();
    }

    /// distlock leads: `etcdctl elect -l` prints distlock's description as the leader's
    /// value, and an `etcdctl elect` candidate waits until distlock resigns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn distlock_leads_and_etcdctl_sees_it() {
        let (server, p) = shared_server();
        let reg = registry(&server.url(), &p, RegistryOptions::default()).await;
        let election = reg.election("jobs").unwrap();
        let leading = election
            .campaign(Owner::new("dl-leader").unwrap())
            .await
            .unwrap();
        let name = format!("{p}/jobs");

        let observer = CtlLock::spawn_args(&server.endpoint(), &["elect", "-l", &name]);
        let key = observer
            .line(Duration::from_secs(10))
            .expect("etcdctl sees a leader");
        assert!(key.starts_with(&format!("{name}/")), "{key}");
        let value = observer.line(Duration::from_secs(5)).expect("its value");
        assert_eq!(value, "dl-leader");
        drop(observer);

        let ctl = CtlLock::spawn_args(&server.endpoint(), &["elect", &name, "someid"]);
        assert_eq!(
            ctl.line(Duration::from_millis(700)),
            None,
            "etcdctl leads beside distlock"
        );
        leading.resign().await.unwrap();
        let key = ctl
            .line(Duration::from_secs(10))
            .expect("etcdctl leads after distlock");
        assert!(key.starts_with(&format!("{name}/")), "{key}");
        let leader = election.leader().await.unwrap().expect("etcdctl leads");
        assert_eq!(leader.description, "someid");
        ctl.signal(libc::SIGINT);
        let _ = ctl.wait(Duration::from_secs(5));
    }
}
