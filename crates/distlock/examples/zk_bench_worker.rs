//! One measuring process for `bench/zookeeper` (run through `bench/zookeeper/run.sh`): the
//! worker protocol of `../shared/bench/other-backends/worker.py`, with distlock's ZooKeeper
//! backend in place of kazoo.
//!
//! 1. connect, warm up (private key, not measured), print `{"ev":"ready",...}`;
//! 2. read one line `start <CLOCK_MONOTONIC ns>` from stdin, wait until then;
//! 3. loop for `--duration` seconds, keeping timestamps in memory;
//! 4. print `{"ev":"result",...}` and exit 0.
//!
//! Modes: `baseline` (`--op read|write`: `get_data` / `set_data` of `/bench/rtt` through the
//! same client library), `S1` (lock + release back to back), `S2` (lock, read a counter file,
//! write value + 1, release). Locks live under `/bench/locks` (Curator layout:
//! `/bench/locks/<key>/_c_<uuid>-lock-<seq>`). Timestamps are CLOCK_MONOTONIC nanoseconds, the
//! clock of Python's `time.monotonic_ns()`, comparable across processes.

use std::io::{BufRead, Write};
use std::time::Duration;

use distlock::backends::zookeeper::ZooKeeperBackend;
use distlock::{LockRegistry, RegistryOptions};

struct Args {
    hosts: String,
    mode: String,
    op: String,
    key: String,
    duration: f64,
    proc_id: u32,
    counter_file: String,
    warmup: u32,
}

fn parse_args() -> Args {
    let mut a = Args {
        hosts: String::new(),
        mode: String::new(),
        op: "write".into(),
        key: "bench-key".into(),
        duration: 5.0,
        proc_id: 0,
        counter_file: String::new(),
        warmup: 50,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < argv.len() {
        let v = argv[i + 1].clone();
        match argv[i].as_str() {
            // {"hosts": "127.0.0.1:PORT"}
            "--params" => {
                a.hosts = v
                    .split("\"hosts\"")
                    .nth(1)
                    .and_then(|r| r.split('"').nth(1))
                    .expect("--params has hosts")
                    .to_owned()
            }
            "--mode" => a.mode = v,
            "--op" => a.op = v,
            "--key" => a.key = v,
            "--duration" => a.duration = v.parse().expect("--duration"),
            "--proc-id" => a.proc_id = v.parse().expect("--proc-id"),
            "--counter-file" => a.counter_file = v,
            "--warmup" => a.warmup = v.parse().expect("--warmup"),
            _ => {} // --backend, --recipe, --variant
        }
        i += 2;
    }
    a
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn cpu_s() -> f64 {
    // SAFETY: getrusage writes into the struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn wait_for_start() -> u64 {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("stdin");
    let mut parts = line.split_whitespace();
    let start_at = match (parts.next(), parts.next()) {
        (Some("start"), Some(ns)) => ns.parse().unwrap_or_else(|_| mono_ns()),
        _ => mono_ns(),
    };
    loop {
        let now = mono_ns();
        if now >= start_at {
            return now;
        }
        let rem = start_at - now;
        if rem > 2_000_000 {
            std::thread::sleep(Duration::from_nanos(rem - 1_000_000));
        }
    }
}

fn read_counter(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .expect("counter")
        .trim()
        .parse()
        .unwrap_or(0)
}

fn write_counter(path: &str, v: u64) {
    std::fs::write(path, v.to_string()).expect("counter");
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

async fn run(a: Args) {
    let url = format!("zk://{}/bench/locks", a.hosts);
    let backend = ZooKeeperBackend::connect(&url).await.expect("connect");
    let client = backend.client().await.expect("client");
    let client_name = "distlock 0.1.0 (zookeeper-client 0.11)";
    let pid = std::process::id();
    let mut out = std::io::stdout().lock();
    let ready = |out: &mut std::io::StdoutLock| {
        writeln!(
            out,
            "{{\"ev\":\"ready\",\"ready_ns\":{},\"pid\":{pid},\"client\":{}}}",
            mono_ns(),
            json_str(client_name)
        )
        .unwrap();
        out.flush().unwrap();
    };

    if a.mode == "baseline" {
        let write = a.op == "write";
        let op = || async {
            if write {
                client.set_data("/bench/rtt", b"x", None).await.map(|_| ())
            } else {
                client.get_data("/bench/rtt").await.map(|_| ())
            }
        };
        for _ in 0..a.warmup * 10 {
            op().await.expect("warm-up op");
        }
        ready(&mut out);
        let start = wait_for_start();
        let end = start + (a.duration * 1e9) as u64;
        let cpu0 = cpu_s();
        let mut lat = Vec::with_capacity(100_000);
        let mut now = start;
        while now < end {
            op().await.expect("op");
            let t = mono_ns();
            lat.push(t - now);
            now = t;
        }
        let cpu = cpu_s() - cpu0;
        let lats: Vec<String> = lat.iter().map(u64::to_string).collect();
        writeln!(
            out,
            "{{\"ev\":\"result\",\"lat_ns\":[{}],\"ops\":{},\"start_ns\":{start},\"finished_ns\":{now},\
             \"cpu_s\":{cpu:.4},\"errors\":0,\"first_error\":null,\"proc_id\":{},\"pid\":{pid},\
             \"extra\":{{}},\"round_trips\":null}}",
            lats.join(","),
            lat.len(),
            a.proc_id
        )
        .unwrap();
        out.flush().unwrap();
        return;
    }

    let registry =
        LockRegistry::with_options(backend, RegistryOptions::default()).expect("registry");
    let lock = registry.obtain(&a.key).expect("key");
    let warm = registry
        .obtain(&format!("{}:warmup:{}", a.key, a.proc_id))
        .expect("key");
    for _ in 0..a.warmup {
        warm.lock()
            .await
            .expect("warm-up lock")
            .release()
            .await
            .expect("warm-up release");
    }
    ready(&mut out);
    let s2 = a.mode == "S2";
    let start = wait_for_start();
    let end = start + (a.duration * 1e9) as u64;
    let cpu0 = cpu_s();
    let mut cycles: Vec<[u64; 4]> = Vec::with_capacity(50_000);
    let (mut errors, mut first_error) = (0u64, None::<String>);
    loop {
        let t0 = mono_ns();
        if t0 >= end {
            break;
        }
        let guard = match lock.lock().await {
            Ok(g) => g,
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("acquire: {e}"));
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
        };
        let t1 = mono_ns();
        if s2 {
            let v = read_counter(&a.counter_file);
            write_counter(&a.counter_file, v + 1);
        }
        let t2 = mono_ns();
        if let Err(e) = guard.release().await {
            errors += 1;
            first_error.get_or_insert_with(|| format!("release: {e}"));
        }
        let t3 = mono_ns();
        cycles.push([t0, t1, t2, t3]);
    }
    let cpu = cpu_s() - cpu0;
    let cyc: Vec<String> = cycles
        .iter()
        .map(|c| format!("[{},{},{},{}]", c[0], c[1], c[2], c[3]))
        .collect();
    writeln!(
        out,
        "{{\"ev\":\"result\",\"cycles\":[{}],\"start_ns\":{start},\"end_ns\":{end},\"finished_ns\":{},\
         \"cpu_s\":{cpu:.4},\"errors\":{errors},\"first_error\":{},\"proc_id\":{},\"pid\":{pid},\
         \"extra\":{{}},\"round_trips\":2}}",
        cyc.join(","),
        mono_ns(),
        first_error.as_deref().map_or("null".to_owned(), json_str),
        a.proc_id
    )
    .unwrap();
    out.flush().unwrap();
}

fn main() {
    let args = parse_args();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(args));
}
