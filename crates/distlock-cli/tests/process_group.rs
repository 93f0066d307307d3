//! A lost lock, and CMD's process group (issue 9): stopped as a whole, with the terminal.

mod common;

use std::io::Read;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use distlock_testkit::redis::RedisServer;
use nix::sys::signal::Signal;

// ioctl(fd, TIOCSCTTY, steal): makes the terminal on `fd` the caller's controlling terminal.
// nix names no wrapper for it; its macro makes one.
nix::ioctl_write_int_bad!(tiocsctty, nix::libc::TIOCSCTTY);

#[test]
fn lost_lock_terminates_the_command_and_exits_76() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let home = Home::new();
    let (holder, _) = home.hold(&["--backend", &url], "lost", &["--lease", "300ms"]);
    let child_pid = read_pid(&home, "lost");
    assert_eq!(server.cli(&["DEL", "lock:lost"]).unwrap(), "1");
    let deleted = Instant::now();
    let out = holder.wait(Duration::from_secs(10));
    assert_eq!(out.code, Some(76), "{out:?}");
    // SIGTERM ends `sleep` at once, well before the 5 s grace period.
    assert!(deleted.elapsed() < Duration::from_secs(4), "{out:?}");
    assert!(one_stderr_line(&out).contains("lost"), "{out:?}");
    assert!(!process_exists(child_pid), "the command was stopped");
}

#[test]
fn lost_lock_kills_a_command_that_ignores_sigterm() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let home = Home::new();
    let marker = home.path("stubborn");
    let mut proc = Proc::spawn(
        home.cmd(&[
            "--backend",
            &url,
            "run",
            "--key",
            "stubborn",
            "--lease",
            "300ms",
            "--",
            "sh",
            "-c",
            r#"trap '' TERM; touch "$1"; while :; do sleep 0.05; done"#,
            "sh",
            marker.to_str().unwrap(),
        ])
        .env("DISTLOCK_KILL_GRACE", "700ms"),
    );
    wait_for_file(&marker, &mut proc);
    assert_eq!(server.cli(&["DEL", "lock:stubborn"]).unwrap(), "1");
    let deleted = Instant::now();
    let out = proc.wait(Duration::from_secs(10));
    assert_eq!(out.code, Some(76), "{out:?}");
    let took = deleted.elapsed();
    assert!(
        took >= Duration::from_millis(700),
        "SIGKILL only after the grace period: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

// ---------------------------------------------------------------------------------------------
// CMD's process group (issue 9)

/// CMD writes its pid and that of a background job, then waits for the job.
const SH_WITH_A_BACKGROUND_JOB: &str =
    r#"sleep 1000 & echo "$$ $!" > "$1.tmp"; mv "$1.tmp" "$1"; wait"#;

/// Starts distlock with `args` and `script` as CMD (which writes its pids in a file named by
/// its first argument, as [`SH_WITH_A_BACKGROUND_JOB`] does), with `DISTLOCK_KILL_GRACE` set
/// to `grace` if given; returns once CMD wrote its pids, with the processes of its group.
fn start_group(
    home: &Home,
    args: &[&str],
    script: &str,
    grace: Option<&str>,
) -> (Proc, KillOnDrop) {
    let pids = home.path("pids");
    let mut all = args.to_vec();
    all.extend(["--", "sh", "-c", script, "sh", pids.to_str().unwrap()]);
    let mut cmd = home.cmd(&all);
    if let Some(grace) = grace {
        cmd.env("DISTLOCK_KILL_GRACE", grace);
    }
    let mut proc = Proc::spawn(&mut cmd);
    wait_for_file(&pids, &mut proc);
    (proc, KillOnDrop(read_pids(&pids)))
}

#[test]
fn a_lost_lock_stops_the_commands_whole_process_group() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let home = Home::new();
    let (proc, group) = start_group(
        &home,
        &["--backend", &url, "run", "--key", "grp", "--lease", "1s"],
        SH_WITH_A_BACKGROUND_JOB,
        None,
    );
    assert!(group.0.iter().all(|&p| running(p)), "{:?}", group.0);
    assert_eq!(server.cli(&["DEL", "lock:grp"]).unwrap(), "1");
    let out = proc.wait(TIMEOUT);
    assert_eq!(out.code, Some(76), "{out:?}");
    // distlock reaps the whole group before it exits: not even a zombie is left.
    let alive: Vec<_> = group.0.iter().filter(|&&p| process_exists(p)).collect();
    assert!(
        alive.is_empty(),
        "still there after exit 76: {alive:?} {out:?}"
    );
}

#[test]
fn killing_distlock_kills_the_commands_whole_process_group() {
    let home = Home::new();
    let (proc, group) = start_group(
        &home,
        &["run", "--key", "die"],
        SH_WITH_A_BACKGROUND_JOB,
        None,
    );
    assert_eq!(group.0.len(), 2);
    proc.signal(Signal::SIGKILL);
    let out = proc.wait(TIMEOUT);
    assert_eq!(out.code, None, "killed: {out:?}");
    // The watcher acts on end-of-file at once; the bound only absorbs a loaded machine.
    let gone = eventually(Duration::from_secs(10), || {
        group.0.iter().all(|&p| !running(p))
    });
    assert!(gone, "CMD's group outlived distlock: {:?}", group.0);
}

/// Renewals stall (a partition between distlock and Redis): the group must be gone, SIGKILL
/// included, when the lock can be taken again on the server. No clock race: the check happens
/// at the moment a second client's `SET NX` succeeds. With a 5 s lease the margin is 500 ms
/// and the 500 ms grace fits: SIGTERM at 1 s left, SIGKILL at 500 ms left.
#[test]
fn failing_renewals_stop_the_group_before_the_lease_ends_on_the_server() {
    use distlock_testkit::proxy::FaultProxy;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = RedisServer::start().expect("redis-server");
    let proxy = rt.block_on(FaultProxy::start(server.addr())).unwrap();
    let url = format!("redis://{}", proxy.addr());
    let home = Home::new();
    // Everything in the group ignores SIGTERM: only SIGKILL ends it.
    let (proc, group) = start_group(
        &home,
        &["--backend", &url, "run", "--key", "ov", "--lease", "5s"],
        &format!("trap '' TERM; {SH_WITH_A_BACKGROUND_JOB}"),
        Some("500ms"),
    );
    assert_eq!(server.cli(&["EXISTS", "lock:ov"]).unwrap(), "1");
    proxy.pause();
    let started = Instant::now();
    loop {
        let taken = server
            .cli(&["SET", "lock:ov", "next-holder", "NX", "PX", "60000"])
            .unwrap();
        if taken == "OK" {
            break;
        }
        assert!(started.elapsed() < TIMEOUT, "the lease never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
    let alive: Vec<_> = group.0.iter().filter(|&&p| process_exists(p)).collect();
    proxy.cut();
    let out = proc.wait(TIMEOUT);
    assert!(
        alive.is_empty(),
        "processes of the first holder's group alive when the next holder got the lock: \
         {alive:?} {out:?}"
    );
    assert_eq!(out.code, Some(76), "{out:?}");
    assert!(
        one_stderr_line(&out).contains("about to be lost"),
        "{out:?}"
    );
    drop(proxy);
}

#[test]
fn a_terminal_ctrl_c_reaches_the_command_once_and_it_can_read_the_terminal() {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let home = Home::new();
    let dir = home.dir.path().to_str().unwrap().to_owned();
    let script = r#"
        n=0
        trap 'n=$((n+1)); echo $n > "$1/ints"' INT
        cat /proc/$$/stat > "$1/stat"
        touch "$1/ready"
        while [ ! -e "$1/go" ]; do sleep 0.05; done
        read line
        echo "line=$line ints=$n" > "$1/out.tmp"; mv "$1/out.tmp" "$1/out"
    "#;
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let mut cmd = home.cmd(&["run", "--key", "tty", "--", "sh", "-c", script, "sh", &dir]);
    cmd.stdin(Stdio::from(pty.slave.try_clone().unwrap()))
        .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
        .stderr(Stdio::from(pty.slave.try_clone().unwrap()));
    // SAFETY: setsid and ioctl are async-signal-safe; the terminal becomes distlock's
    // controlling terminal, with distlock's group in the foreground, as in an interactive shell.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()?;
            tiocsctty(0, 0)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn distlock");
    drop(cmd);
    drop(pty.slave);
    let mut master = std::fs::File::from(pty.master);
    let mut reader = master.try_clone().unwrap();
    let echoed = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = reader.read_to_end(&mut all); // ends with EIO once every slave fd is closed
        String::from_utf8_lossy(&all).into_owned()
    });
    let _guard = scopeguard_kill(&child);
    let wait_for = |name: &str, child: &mut Child| {
        let path = home.path(name);
        let ok = eventually(TIMEOUT, || {
            path.exists() || child.try_wait().ok().flatten().is_some()
        });
        assert!(ok && path.exists(), "no {name}");
    };
    wait_for("ready", &mut child);
    master.write_all(&[0x03]).unwrap(); // Ctrl-C
    wait_for("ints", &mut child);
    // A second delivery (distlock forwarding what the terminal already sent) would come at once.
    std::thread::sleep(Duration::from_millis(500));
    // Ctrl-Z stops CMD's group; distlock follows it (here, as the leader of an orphaned group,
    // the kernel continues it at once, as POSIX says) and continues CMD: nothing stays stuck.
    master.write_all(&[0x1a]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(home.path("go"), "").unwrap();
    master.write_all(b"hello\n").unwrap();
    let finished = eventually(TIMEOUT, || child.try_wait().ok().flatten().is_some());
    if !finished {
        let _ = child.kill();
        let _ = child.wait();
        panic!("CMD did not finish: stopped (SIGTTIN on its read, or Ctrl-Z not followed)?");
    }
    let status = child.wait().unwrap();
    drop(master);
    let out = std::fs::read_to_string(home.path("out")).unwrap_or_default();
    let terminal = echoed.join().unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{out:?} {terminal:?}");
    assert_eq!(out.trim(), "line=hello ints=1", "terminal: {terminal:?}");

    // Why exactly once: CMD leads a process group of its own, and that group, not distlock's,
    // is the terminal's foreground group (so the terminal signals CMD and never distlock).
    let stat = std::fs::read_to_string(home.path("stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let (pgrp, tpgid): (i64, i64) = (fields[2].parse().unwrap(), fields[5].parse().unwrap());
    let sh: i64 = stat.split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(pgrp, sh, "CMD leads its own group: {stat}");
    assert_ne!(pgrp, i64::from(child.id()), "not distlock's group: {stat}");
    assert_eq!(tpgid, pgrp, "CMD's group has the terminal: {stat}");
}
