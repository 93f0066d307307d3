use super::kinds::is_direct_child;
use super::queue::class_of;
use std::time::Duration;

#[test]
fn session_classes() {
    let min = Duration::from_secs(2);
    assert_eq!(class_of(Duration::from_millis(300), min), 2);
    assert_eq!(class_of(Duration::from_secs(2), min), 3);
    assert_eq!(class_of(Duration::from_secs(30), min), 45);
    assert_eq!(class_of(Duration::from_millis(10), Duration::ZERO), 1);
}

#[test]
fn only_direct_children_contend() {
    let dir = b"lock/a/";
    assert!(is_direct_child(dir, b"lock/a/1f"));
    assert!(!is_direct_child(dir, b"lock/a/b/2f"));
    assert!(!is_direct_child(dir, b"lock/a/"));
    assert!(!is_direct_child(dir, b"lock/ab"));
}
