//! Unit tests of the slot map.

use super::*;

fn bulk(s: &str) -> Reply {
    Reply::Bulk(Some(s.as_bytes().to_vec()))
}

fn node(host: &str, port: i64) -> Reply {
    Reply::Array(Some(vec![bulk(host), Reply::Int(port), bulk("id")]))
}

#[test]
fn slot_maps_are_parsed_with_their_replicas() {
    let reply = Reply::Array(Some(vec![
        Reply::Array(Some(vec![
            Reply::Int(0),
            Reply::Int(5460),
            node("127.0.0.1", 7000),
            node("127.0.0.1", 7003),
        ])),
        Reply::Array(Some(vec![
            Reply::Int(5461),
            Reply::Int(16383),
            node("", 7001),
        ])),
        Reply::Array(Some(vec![Reply::Int(9), Reply::Int(9), node("?", 7009)])),
    ]));
    let t = Topology::parse(&reply, "10.0.0.1:7001").unwrap();
    assert_eq!(t.masters.len(), 2);
    assert_eq!(t.masters[0].addr, "127.0.0.1:7000");
    assert_eq!(t.masters[0].replicas, ["127.0.0.1:7003"]);
    assert_eq!(
        t.masters[1].addr, "10.0.0.1:7001",
        "an empty host is the answering node's"
    );
    assert_eq!(t.slots[0], 0);
    assert_eq!(t.slots[5460], 0);
    assert_eq!(t.slots[16383], 1);
    assert_eq!(t.served(), SLOTS);
    let bad = Reply::Array(Some(vec![Reply::Array(Some(vec![
        Reply::Int(5),
        Reply::Int(16384),
        node("h", 1),
    ]))]));
    assert!(Topology::parse(&bad, "x:1").is_none());
    assert!(Topology::parse(&Reply::Int(1), "x:1").is_none());
}

#[test]
fn redirections_are_recognised() {
    let r = redirect(&Reply::Error("MOVED 3999 127.0.0.1:6381".into()), "a:1");
    assert!(matches!(r, Some(Redirect::Moved(3999, a)) if a == "127.0.0.1:6381"));
    let r = redirect(&Reply::Error("ASK 3999 :6381".into()), "10.1.1.1:7000");
    assert!(matches!(r, Some(Redirect::Ask(a)) if a == "10.1.1.1:6381"));
    let r = redirect(&Reply::Error("MOVED 1 [::1]:7000".into()), "a:1");
    assert!(matches!(r, Some(Redirect::Moved(1, a)) if a == "[::1]:7000"));
    assert!(matches!(
        redirect(&Reply::Error("TRYAGAIN Multiple keys".into()), "a:1"),
        Some(Redirect::TryAgain)
    ));
    assert!(redirect(&Reply::Error("MOVED 99999 h:1".into()), "a:1").is_none());
    assert!(redirect(&Reply::Error("ERR wrong".into()), "a:1").is_none());
    assert!(redirect(&Reply::Int(1), "a:1").is_none());
}

#[test]
fn commands_are_routed_by_their_key() {
    assert_eq!(command_key(&[b"SET", b"k", b"v"]), Some(b"k".as_slice()));
    assert_eq!(
        command_key(&[b"evalsha", b"sha", b"2", b"a", b"b", b"x"]),
        Some(b"a".as_slice())
    );
    assert_eq!(command_key(&[b"EVAL", b"body", b"0"]), None);
    assert_eq!(command_key(&[b"WAIT", b"1", b"100"]), None);
    assert_eq!(command_key(&[b"PING"]), None);
}
