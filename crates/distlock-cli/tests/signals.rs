//! Signals to `distlock run`: forwarded to CMD, and giving up a wait.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

#[test]
fn sigterm_is_forwarded_and_the_lock_released() {
    let home = Home::new();
    let (holder, _) = home.hold(&[], "t", &[]);
    let child_pid = read_pid(&home, "t");
    assert!(process_exists(child_pid));
    holder.signal(Signal::SIGTERM);
    let out = holder.wait(Duration::from_secs(5));
    assert_eq!(
        out.code,
        Some(128 + Signal::SIGTERM as i32),
        "the command died of SIGTERM: {out:?}"
    );
    assert!(!process_exists(child_pid), "the command is gone");

    let next = home.run(&["run", "--key", "t", "--no-wait", "--", "true"]);
    assert_eq!(next.code, Some(0), "the lock was released: {next:?}");
    assert!(next.elapsed < Duration::from_secs(3), "{next:?}");
}

#[test]
fn sigint_reaches_the_command_which_decides_the_exit_code() {
    let home = Home::new();
    let marker = home.path("int-ready");
    let mut proc = Proc::spawn(&mut home.cmd(&[
        "run",
        "--key",
        "i",
        "--",
        "sh",
        "-c",
        r#"trap 'exit 42' INT; touch "$1"; while :; do sleep 0.05; done"#,
        "sh",
        marker.to_str().unwrap(),
    ]));
    wait_for_file(&marker, &mut proc);
    proc.signal(Signal::SIGINT);
    let out = proc.wait(Duration::from_secs(5));
    assert_eq!(out.code, Some(42), "{out:?}");
    let next = home.run(&["run", "--key", "i", "--no-wait", "--", "true"]);
    assert_eq!(next.code, Some(0), "released: {next:?}");
}

#[test]
fn a_signal_while_waiting_gives_up_without_taking_the_lock() {
    let home = Home::new();
    let (holder, _) = home.hold(&[], "q", &[]);
    // Its debug log says when it has started waiting (signal handlers are installed by then).
    let log_path = home.path("waiter.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut waiter = home
        .cmd(&["-v", "run", "--key", "q", "--", "echo", "ran"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while !std::fs::read_to_string(&log_path)
        .unwrap_or_default()
        .contains("acquiring")
    {
        assert!(
            waiter.try_wait().unwrap().is_none(),
            "the waiter ended early"
        );
        assert!(
            Instant::now() < deadline,
            "the waiter never started waiting"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    let pid = i32::try_from(waiter.id()).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGINT).expect("kill(2) on our own child");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = waiter.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(5) {
            let _ = waiter.kill();
            panic!("the waiter ignored SIGINT");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(
        status.code(),
        Some(128 + Signal::SIGINT as i32),
        "{status:?}"
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("interrupted"), "{log}");
    let status = home.run(&["status", "q"]);
    assert_eq!(status.code, Some(0), "the holder still holds: {status:?}");
    drop(holder);
}
