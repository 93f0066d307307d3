//! `distlock status` and `distlock demo`.

mod common;

use common::*;

#[test]
fn status_reports_free_and_held() {
    let home = Home::new();
    let out = home.run(&["status", "s"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(out.stdout.contains("free"), "{out:?}");

    let out = home.run(&["status", "s", "--json"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    let json = out.stdout.trim();
    assert_eq!(json_field(json, "held"), "false", "{json}");

    let (holder, fence) = home.hold(&[], "s", &["--lease", "5s"]);
    let out = home.run(&["status", "s", "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let json = out.stdout.trim();
    assert!(
        json.starts_with('{') && json.ends_with('}') && !json.contains('\n'),
        "{json}"
    );
    assert_eq!(json_field(json, "key"), "\"s\"");
    assert_eq!(json_field(json, "held"), "true");
    assert_eq!(
        json_field(json, "fence"),
        fence.to_string(),
        "same fence as DISTLOCK_FENCE"
    );
    assert_eq!(json_field(json, "backend"), "\"sqlite\"");
    let remaining: u64 = json_field(json, "remaining_ms")
        .parse()
        .expect("remaining_ms");
    assert!(remaining > 0 && remaining <= 5000, "{json}");

    let out = home.run(&["status", "s"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("held") && out.stdout.contains(&fence.to_string()),
        "{out:?}"
    );
    drop(holder);
}

#[test]
fn status_json_escapes_the_key() {
    let home = Home::new();
    let out = home.run(&["--backend", "memory://", "status", "a\"b\\c\nd", "--json"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(out.stdout.starts_with(r#"{"key":"a\"b\\c\nd","#), "{out:?}");
}

/// The `(+X.XXs)` offsets and fences of the demo's acquisition lines.
fn demo_acquisitions(stdout: &str) -> Vec<(f64, u64)> {
    stdout
        .lines()
        .filter(|l| l.starts_with("worker ") && l.contains(" acquired lock "))
        .map(|l| {
            let start = l.find("(+").expect("offset") + 2;
            let end = start + l[start..].find("s)").expect("offset end");
            let offset: f64 = l[start..end].parse().expect("offset number");
            let fence: u64 = l.rsplit(' ').next().unwrap().parse().expect("fence");
            (offset, fence)
        })
        .collect()
}

#[test]
fn demo_acquisitions_come_hold_apart() {
    let home = Home::new();
    let out = home.run(&["demo", "--workers", "3", "--hold", "300ms"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let acquisitions = demo_acquisitions(&out.stdout);
    assert_eq!(acquisitions.len(), 3, "{out:?}");
    for pair in acquisitions.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(
            gap >= 0.25,
            "gap {gap:.3}s is shorter than the hold: {}",
            out.stdout
        );
        assert!(pair[1].1 > pair[0].1, "fences increase: {}", out.stdout);
    }
    assert!(
        out.stdout.contains("gaps between consecutive acquisitions"),
        "{out:?}"
    );
}

#[test]
fn demo_on_the_memory_backend() {
    let home = Home::new();
    let out = home.run(&[
        "--backend",
        "memory://",
        "demo",
        "--workers",
        "4",
        "--hold",
        "100ms",
        "--key",
        "m",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let acquisitions = demo_acquisitions(&out.stdout);
    assert_eq!(acquisitions.len(), 4, "{out:?}");
    for pair in acquisitions.windows(2) {
        assert!(pair[1].0 - pair[0].0 >= 0.08, "{}", out.stdout);
    }
}
