//! The page of `distlock serve` in a real browser: headless Chromium (Debian's `chromium`)
//! driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages ended
//! by NUL on descriptors 3 and 4), as a user would see it.
//!
//! With `DISTLOCK_SCREENSHOT=FILE` the demonstration test also saves a PNG of the page.

mod serve_support;

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use serve_support::*;

/// A headless Chromium with one page open, killed on drop.
struct Browser {
    child: Child,
    commands: File,
    replies: BufReader<File>,
    next_id: u64,
    session: String,
    _profile: tempfile::TempDir,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe2")
}

impl Browser {
    /// Starts Chromium and opens `url` in a 1280×800 page.
    fn open(url: &str) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let (their_in, our_out) = pipe();
        let (our_in, their_out) = pipe();
        let (fd_in, fd_out) = (their_in.as_raw_fd(), their_out.as_raw_fd());
        let mut command = Command::new("chromium");
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-pipe",
                "--window-size=1280,800",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only dup2, which is async-signal-safe, between fork and exec.
        unsafe {
            command.pre_exec(move || {
                for (from, to) in [(fd_in, 3), (fd_out, 4)] {
                    if nix::libc::dup2(from, to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("chromium (Debian package chromium)");
        drop((their_in, their_out));
        let mut browser = Browser {
            child,
            commands: File::from(our_out),
            replies: BufReader::new(File::from(our_in)),
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = browser.call("Target.createTarget", json!({"url": url}));
        let target = target["targetId"].as_str().expect("targetId").to_owned();
        let attached = browser.call(
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        );
        browser.session = attached["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_owned();
        browser
    }

    /// Sends one command (to the page once attached) and returns its result.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.commands.write_all(&bytes).expect("write to chromium");
        loop {
            let mut reply = Vec::new();
            let n = self
                .replies
                .read_until(0, &mut reply)
                .expect("read chromium");
            assert!(n > 0, "chromium closed the pipe");
            reply.pop();
            let reply: Value = serde_json::from_slice(&reply).expect("JSON from chromium");
            if reply["id"] == json!(id) {
                assert!(reply["error"].is_null(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }

    /// Evaluates `expression` every 50 ms until `done` accepts its value (at most `bound`).
    fn until(&mut self, bound: Duration, expression: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + bound;
        loop {
            let v = self.eval(expression);
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{expression} stayed {v}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn screenshot(&mut self, path: &str) {
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64_decode(shot["data"].as_str().expect("data"));
        std::fs::write(path, png).expect("write the screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &d)| n | u32::from(d) << (18 - 6 * i));
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

const BOUND: Duration = Duration::from_secs(20);

/// The countdown of `key`'s row in seconds, or null while the row is not there.
fn countdown(key: &str) -> String {
    format!(
        "(() => {{ const c = document.querySelector('tr[data-key=\"{key}\"] .countdown'); \
         return c && c.textContent ? parseFloat(c.textContent) : null; }})()"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_appears_on_the_page_and_its_countdown_moves() {
    let served = Served::start("memory://", &[]);
    let http = client();
    let (status, granted) = post(&http, &served, "page-key", json!({"lease_ms": 60000})).await;
    assert_eq!(status, 200, "{granted}");
    let url = served.url("/");
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut page = Browser::open(&url);
        let first = page.until(BOUND, &countdown("page-key"), Value::is_number);
        let first = first.as_f64().unwrap();
        assert!(first > 0.0 && first <= 60.0, "{first}");
        let fence =
            page.eval("document.querySelector('tr[data-key=\"page-key\"]').cells[3].textContent");
        assert_eq!(fence.as_str().unwrap(), granted["fence"].to_string());
        // The countdown moves: a later reading is lower.
        page.until(BOUND, &countdown("page-key"), |v| {
            v.as_f64().is_some_and(|s| s < first)
        });

        // A hold taken after the page loaded arrives through the event stream.
        let (status, _) = runtime.block_on(post(&http, &served, "later-key", json!({})));
        assert_eq!(status, 200);
        page.until(BOUND, &countdown("later-key"), Value::is_number);

        // The filter hides rows whose key does not match.
        page.eval(
            "(() => { const f = document.getElementById('filter'); f.value = 'later'; \
             f.dispatchEvent(new Event('input')); })()",
        );
        let hidden = page.eval(
            "[...document.querySelectorAll('#holds tr')].map(r => [r.dataset.key, r.hidden])",
        );
        assert_eq!(hidden, json!([["later-key", false], ["page-key", true]]));
    })
    .await
    .unwrap();
}

/// The text of the timeline's lines of `kind` for demonstration `demo`, oldest first.
fn demo_lines(kind: &str, demo: u64) -> String {
    format!(
        "[...document.querySelectorAll('#timeline li[data-kind=\"{kind}\"][data-demo=\"{demo}\"]')]\
         .reverse().map(li => li.textContent)"
    )
}

/// The seconds after `marker` in `line` (`... +1.234 s ...`).
fn seconds_after(line: &str, marker: &str) -> f64 {
    let rest = line
        .split(marker)
        .nth(1)
        .unwrap_or_else(|| panic!("no {marker:?} in {line:?}"));
    rest.split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("{line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demonstration_shows_the_workers_taking_the_lock_one_hold_apart() {
    const WORKERS: usize = 10;
    let hold = Duration::from_secs(1);
    let slack = distlock_testkit::timing::scheduling_slack().await;
    let served = Served::start("memory://", &[]);
    let http = client();
    // Some other holds, so that the page (and its screenshot) shows more than the demo.
    for (key, body) in [
        ("billing:invoice-7", json!({"lease_ms": 90_000})),
        ("reports/daily", json!({"lease_ms": 45_000, "shared": true})),
        ("reports/daily", json!({"lease_ms": 50_000, "shared": true})),
        ("exports", json!({"lease_ms": 60_000, "permits": 4})),
    ] {
        let (status, _) = post(&http, &served, key, body).await;
        assert_eq!(status, 200);
    }
    let url = served.url(&format!(
        "/?demo=1&key=demo&workers={WORKERS}&hold_ms={}",
        hold.as_millis()
    ));
    let acquisitions =
        "[...document.querySelectorAll('#timeline li[data-kind=\"acquired\"][data-demo=\"1\"]')]\
         .map(li => Number(li.dataset.at))";
    let most_waited = "Math.max(...[...document.querySelectorAll('#waiters tr')]\
                       .map(r => parseFloat(r.cells[2].textContent)))";
    let runtime = tokio::runtime::Handle::current();
    let (times, summary, second) = tokio::task::spawn_blocking(move || {
        let mut page = Browser::open(&url);
        // Midway: a holder, waiters, a countdown.
        page.until(BOUND, acquisitions, |v| {
            v.as_array().is_some_and(|a| a.len() >= 3)
        });
        let waiting = page.eval("document.querySelectorAll('#waiters tr').length");
        assert!(
            waiting.as_u64().is_some_and(|n| n >= 1),
            "waiters shown: {waiting}"
        );
        // A waiter shows how long it has waited, a time that grows (not a time left).
        let header = page.eval(
            "document.getElementById('waiters').closest('table').tHead.rows[0].cells[2].textContent",
        );
        assert_eq!(header, json!("waited"));
        let first = page.eval(most_waited).as_f64().expect("a waiter's time");
        page.until(BOUND, most_waited, |v| v.as_f64().is_some_and(|s| s > first));
        if let Ok(path) = std::env::var("DISTLOCK_SCREENSHOT") {
            page.screenshot(&path);
        }
        let bound = hold * u32::try_from(WORKERS).unwrap() + BOUND;
        let times = page.until(bound, acquisitions, |v| {
            v.as_array().is_some_and(|a| a.len() == WORKERS)
        });
        let summary = page.until(BOUND, &demo_lines("demo_ended", 1), |v| {
            v.as_array().is_some_and(|a| a.len() == 1)
        });
        // A second demonstration of the same key: its timeline is its own.
        let (status, started) = runtime.block_on(post_demo(
            &http,
            &served,
            json!({"key": "demo", "workers": 2, "hold_ms": 100}),
        ));
        assert_eq!(status, 202, "{started}");
        let demo = started["demo"].as_u64().unwrap();
        page.until(BOUND, &demo_lines("demo_ended", demo), |v| {
            v.as_array().is_some_and(|a| a.len() == 1)
        });
        (times, summary, page.eval(&demo_lines("acquired", demo)))
    })
    .await
    .unwrap();
    let mut times: Vec<u64> = times
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    times.sort_unstable();
    // Each worker holds for `hold`, so no gap is shorter; a gap longer than the hold is the
    // handoff, which takes no more than this machine's scheduling slack.
    let hold_ms = u64::try_from(hold.as_millis()).unwrap();
    let slack_ms = u64::try_from(slack.as_millis()).unwrap();
    for gap in times.windows(2).map(|w| w[1] - w[0]) {
        assert!(
            gap >= hold_ms && gap <= hold_ms + slack_ms,
            "gap {gap} ms, hold {hold_ms} ms, slack {slack_ms} ms: {times:?}"
        );
    }
    // The closing line, as the CLI's: the acquisitions and the shortest and longest gap.
    let summary = summary[0].as_str().unwrap();
    assert!(
        summary.contains("10 acquisitions, one at a time"),
        "{summary}"
    );
    let (min, max) = (
        seconds_after(summary, "min "),
        seconds_after(summary, "max "),
    );
    let (hold_s, slack_s) = (hold.as_secs_f64(), slack.as_secs_f64());
    assert!(
        min >= hold_s - 0.001 && min <= max && max <= hold_s + slack_s + 0.001,
        "{summary}"
    );
    // The second run's acquisitions are timed from its own start: the first one is not the
    // gap since the first run's last acquisition.
    let second: Vec<&str> = second
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(second.len(), 2, "{second:?}");
    let marker = " +";
    let first_at = seconds_after(second[0], marker);
    let next_at = seconds_after(second[1], marker);
    assert!(first_at <= slack_s, "{second:?}");
    assert!(next_at >= 0.1 - 0.001 && next_at >= first_at, "{second:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_thousand_locks_an_event_touches_one_row_not_the_table() {
    const LOCKS: usize = 1000;
    let served = Served::start("memory://", &[]);
    let http = client();
    let posts = (0..LOCKS).map(|i| {
        let (http, url) = (http.clone(), served.url(&format!("/v1/locks/bulk-{i:04}")));
        async move { http.post(url).send().await.map(|r| r.status().as_u16()) }
    });
    for status in futures_util::future::join_all(posts).await {
        assert_eq!(status.unwrap(), 200);
    }
    let url = served.url("/");
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut page = Browser::open(&url);
        page.until(
            BOUND,
            "document.querySelectorAll('#holds tr').length",
            |v| v.as_u64() == Some(LOCKS as u64),
        );
        // Watch the table's rows while one more lock is taken and the countdowns run.
        page.eval(
            "window.rowChanges = 0; new MutationObserver(ms => { for (const m of ms) \
             window.rowChanges += [...m.addedNodes, ...m.removedNodes]\
             .filter(n => n.nodeName === 'TR').length; })\
             .observe(document.getElementById('holds'), {childList: true, subtree: true});",
        );
        let (status, _) = runtime.block_on(post(&http, &served, "bulk-0500-late", json!({})));
        assert_eq!(status, 200);
        page.until(
            BOUND,
            "document.querySelectorAll('#holds tr').length",
            |v| v.as_u64() == Some(LOCKS as u64 + 1),
        );
        let first = page
            .eval(&countdown("bulk-0999"))
            .as_f64()
            .expect("countdown");
        page.until(BOUND, &countdown("bulk-0999"), |v| {
            v.as_f64().is_some_and(|s| s < first)
        });
        assert_eq!(
            page.eval("window.rowChanges"),
            json!(1),
            "one row added, none redrawn"
        );
        // The new row sits in key order.
        let after = page.eval(
            "document.querySelector('tr[data-key=\"bulk-0500-late\"]').previousSibling.dataset.key",
        );
        assert_eq!(after, json!("bulk-0500"));
    })
    .await
    .unwrap();
}

/// The kind cell of the first row of `key` in the table `body`, or null.
fn kind_cell(body: &str, key: &str) -> String {
    format!(
        "(() => {{ const r = document.querySelector('#{body} tr[data-key=\"{key}\"]'); \
         return r ? r.cells[1].textContent : null; }})()"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_kind_of_each_hold() {
    let served = Served::start("memory://", &[]);
    let http = client();
    for (key, body) in [
        ("kind-exclusive", json!({})),
        ("kind-shared", json!({"shared": true})),
        ("kind-shared", json!({"shared": true})),
        ("kind-permit", json!({"permits": 3})),
    ] {
        let (status, granted) = post(&http, &served, key, body).await;
        assert_eq!(status, 200, "{granted}");
    }
    let url = served.url("/");
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut page = Browser::open(&url);
        page.until(BOUND, &kind_cell("holds", "kind-permit"), Value::is_string);
        let kinds = page.eval(
            "[...document.querySelectorAll('#holds tr')].map(r => [r.dataset.key, r.cells[1].textContent])",
        );
        assert_eq!(
            kinds,
            json!([
                ["kind-exclusive", "exclusive"],
                ["kind-permit", "semaphore of 3"],
                ["kind-shared", "shared"],
                ["kind-shared", "shared"]
            ])
        );
        // A shared hold taken after the page loaded comes with its kind in the event.
        let (status, _) = runtime.block_on(post(
            &http,
            &served,
            "kind-later",
            json!({"shared": true}),
        ));
        assert_eq!(status, 200);
        let later = page.until(BOUND, &kind_cell("holds", "kind-later"), Value::is_string);
        assert_eq!(later, json!("shared"));
        let line = page.eval(
            "document.querySelector('#timeline li[data-kind=\"acquired\"][data-key=\"kind-later\"]').textContent",
        );
        assert!(line.as_str().unwrap().contains("shared"), "{line}");
        // memory:// lists every lock: no note, and nothing held elsewhere.
        assert_eq!(page.eval("document.getElementById('note').textContent"), json!(""));
        assert_eq!(page.eval("document.querySelectorAll('#others tr').length"), json!(0));
    })
    .await
    .unwrap();
}

/// A lock taken by `distlock run` on the same backend shows among the locks held elsewhere,
/// with its kind and owner, and goes when the CLI lets go. Needs a cross-process backend that lists its
/// locks and has read-write locks: the SQLite file, once the SQL backends have the kinds
/// (branch wip-kinds-sql).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_by_the_cli_shows_as_held_elsewhere_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_in(dir.path());
    let served = Served::start(&url, &[]);
    let http = client();
    let (status, mine) = post(&http, &served, "by-http", json!({"shared": true})).await;
    assert_eq!(status, 200, "{mine}");
    let reader = CliHolder::start(
        &url,
        dir.path(),
        "by-cli",
        &["--shared", "--owner", "cli reader"],
    );
    let page_url = served.url("/");
    tokio::task::spawn_blocking(move || {
        let mut page = Browser::open(&page_url);
        let kind = page.until(BOUND, &kind_cell("others", "by-cli"), Value::is_string);
        assert_eq!(kind, json!("shared"));
        let holders = page
            .eval("document.querySelector('#others tr[data-key=\"by-cli\"]').cells[2].textContent");
        assert_eq!(holders, json!("1 elsewhere (cli reader)"), "with its owner");
        assert_eq!(
            page.eval("document.querySelectorAll('#others tr[data-key=\"by-http\"]').length"),
            json!(0),
            "this service's own hold is not elsewhere"
        );
        assert_eq!(
            page.eval("document.getElementById('note').textContent"),
            json!("")
        );
        reader.stop();
        page.until(
            BOUND,
            "document.querySelectorAll('#others tr').length",
            |v| v == &json!(0),
        );
    })
    .await
    .unwrap();
}
