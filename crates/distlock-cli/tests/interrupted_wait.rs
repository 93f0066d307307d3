//! A `distlock run` interrupted while it waits leaves no trace on the key: whatever its last
//! attempt did is given back before the process exits, so the key is free for others as soon
//! as the holder releases it.

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

#[test]
fn an_interrupted_wait_leaves_the_key_free_once_the_holder_releases() {
    let home = Home::new();
    let (holder, _) = home.hold(&[], "w", &[]);
    // Its debug log says when it waits (its signal handlers are installed by then).
    let log_path = home.path("waiter.log");
    let mut waiter = home
        .cmd(&["-v", "run", "--key", "w", "--wait", "60s", "--", "true"])
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let _kill = scopeguard_kill(&waiter);
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        eventually(TIMEOUT, || log().contains("acquiring")),
        "the waiter never started waiting: {}",
        log()
    );
    let pid = Pid::from_raw(i32::try_from(waiter.id()).unwrap());
    kill(pid, Signal::SIGINT).expect("kill(2) on our own child");
    let mut status = None;
    assert!(
        eventually(TIMEOUT, || {
            status = waiter.try_wait().unwrap();
            status.is_some()
        }),
        "the waiter ignored SIGINT"
    );
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(128 + Signal::SIGINT as i32),
        "{}",
        log()
    );
    stop_holder(holder);
    let next = home.run(&["run", "--key", "w", "--no-wait", "--", "true"]);
    assert_eq!(next.code, Some(0), "the key is free: {next:?}");
    assert!(next.elapsed < Duration::from_secs(10), "{next:?}");
}
