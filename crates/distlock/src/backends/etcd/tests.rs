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

mod fate {
    use super::super::options::{ORPHAN_GRACE, WAITER_IDLE};
    use super::super::state::{Entry, Fate, Phase};
    use std::time::Duration;
    use tokio::time::Instant;

    fn entry(phase: Phase, touched: Instant) -> Entry {
        Entry {
            phase,
            touched: Some(touched),
            ..Entry::default()
        }
    }

    #[test]
    fn a_hold_goes_when_its_lease_ends_unrenewed() {
        let t0 = Instant::now();
        let mut e = entry(Phase::Held, t0);
        e.deadline = Some(t0 + Duration::from_secs(2));
        assert_eq!(e.fate(false, t0), Fate::Keep(e.deadline));
        assert_eq!(e.fate(true, t0 + Duration::from_secs(2)), Fate::Delete);
    }

    #[test]
    fn a_waiter_goes_once_unsubscribed_and_idle() {
        let t0 = Instant::now();
        let e = entry(Phase::Queued, t0);
        let late = t0 + WAITER_IDLE;
        assert_eq!(e.fate(true, late), Fate::Keep(None));
        assert_eq!(e.fate(false, t0), Fate::Keep(Some(late)));
        assert_eq!(e.fate(false, late), Fate::Delete);
    }

    #[test]
    fn a_failed_attempt_nobody_came_back_to_goes_after_the_grace() {
        let t0 = Instant::now();
        let mut e = entry(Phase::Queued, t0);
        e.failed_at = Some(t0);
        assert_eq!(e.fate(false, t0), Fate::Keep(Some(t0 + ORPHAN_GRACE)));
        assert_eq!(e.fate(false, t0 + ORPHAN_GRACE), Fate::Delete);
        assert_eq!(e.fate(true, t0 + ORPHAN_GRACE), Fate::Keep(None));
        // A later call since the failure: the registry knows the key.
        e.touched = Some(t0 + Duration::from_secs(1));
        let idle = t0 + Duration::from_secs(1) + WAITER_IDLE;
        assert_eq!(e.fate(false, t0 + ORPHAN_GRACE), Fate::Keep(Some(idle)));
    }

    #[test]
    fn a_lost_create_is_deleted_and_an_idle_empty_slot_forgotten() {
        let t0 = Instant::now();
        let mut e = entry(Phase::New, t0);
        assert_eq!(e.fate(false, t0), Fate::Keep(Some(t0 + WAITER_IDLE)));
        assert_eq!(e.fate(false, t0 + WAITER_IDLE), Fate::Forget);
        assert_eq!(e.fate(true, t0 + WAITER_IDLE), Fate::Keep(None));
        e.maybe_created = true;
        assert_eq!(e.fate(true, t0 + WAITER_IDLE), Fate::Delete);
        let zombie = entry(Phase::Zombie, t0);
        assert_eq!(zombie.fate(false, t0 + WAITER_IDLE), Fate::Keep(None));
    }
}
