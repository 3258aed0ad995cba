//! The decision state replicas share through a PostgreSQL journal (`ring0_journal::shared`):
//! a rate bucket limits calls spread over replicas as one, and an approval remembered on one
//! replica is honoured on another until it lapses. Each test runs in a schema of its own in
//! the database `RING0_TEST_POSTGRES_URL` names (skipped, with the reason, without one).

mod common;

use futures::executor::block_on;
use ring0_journal::{Journal, JournalError, PostgresJournal, PostgresOptions, RateTaken};
use std::time::Duration;

fn replicas() -> Option<(PostgresJournal, PostgresJournal)> {
    let url = common::fresh_postgres_schema()?;
    let open = || {
        let options = PostgresOptions {
            pool_connections: 4,
            ..PostgresOptions::default()
        };
        PostgresJournal::open(&url, options).unwrap()
    };
    Some((open(), open()))
}

#[test]
fn a_rate_bucket_taken_from_on_two_replicas_allows_its_burst_once() {
    let Some((a, b)) = replicas() else { return };
    let (a, b) = (a.shared_state().unwrap(), b.shared_state().unwrap());
    // 3 per hour: a burst of 3, then one cell every 20 minutes.
    let interval = Duration::from_secs(20 * 60);
    let takes: Vec<RateTaken> = std::thread::scope(|s| {
        let spread: Vec<_> = (0..8)
            .map(|i| {
                let on = if i % 2 == 0 { a.clone() } else { b.clone() };
                s.spawn(move || block_on(on.rate_take("[\"principal\",\"alice\"]", 3, interval)))
            })
            .collect();
        spread
            .into_iter()
            .map(|t| t.join().unwrap().unwrap())
            .collect()
    });
    let allowed = takes.iter().filter(|t| **t == RateTaken::Allowed).count();
    assert_eq!(allowed, 3, "{takes:?}");
    for taken in takes.iter().filter(|t| **t != RateTaken::Allowed) {
        let RateTaken::Refused { retry_after } = taken else {
            unreachable!()
        };
        assert!(
            *retry_after > Duration::from_secs(60) && *retry_after <= interval,
            "{retry_after:?}"
        );
    }
    // Another principal's bucket is its own.
    assert_eq!(
        block_on(b.rate_take("[\"principal\",\"bob\"]", 3, interval)).unwrap(),
        RateTaken::Allowed
    );
}

#[test]
fn an_approval_remembered_on_one_replica_is_honoured_on_another_until_it_lapses() {
    let Some((a, b)) = replicas() else { return };
    let (a, b) = (a.shared_state().unwrap(), b.shared_state().unwrap());
    let key = "[\"alice\",\"s1\",\"fx__append\",\"sha256:x\"]";
    assert_eq!(block_on(b.approval_remembered(key)).unwrap(), None);
    block_on(a.approval_remember(key, "ap_1", None)).unwrap();
    assert_eq!(
        block_on(b.approval_remembered(key)).unwrap().as_deref(),
        Some("ap_1")
    );
    // Another session of the same principal has none.
    let other = "[\"alice\",\"s2\",\"fx__append\",\"sha256:x\"]";
    assert_eq!(block_on(b.approval_remembered(other)).unwrap(), None);
    // One remembered for a moment lapses.
    block_on(a.approval_remember(other, "ap_2", Some(Duration::from_micros(1)))).unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while block_on(b.approval_remembered(other)).unwrap().is_some() {
        assert!(std::time::Instant::now() < until, "never lapsed");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_oversized_key_is_refused_as_invalid() {
    let Some((a, _)) = replicas() else { return };
    let a = a.shared_state().unwrap();
    let key = "k".repeat(ring0_journal::shared::SHARED_KEY_BYTES_MAX + 1);
    assert!(matches!(
        block_on(a.rate_take(&key, 1, Duration::from_secs(1))),
        Err(JournalError::Invalid(_))
    ));
    assert!(matches!(
        block_on(a.approval_remembered(&key)),
        Err(JournalError::Invalid(_))
    ));
}

#[test]
fn a_backend_no_other_process_shares_offers_no_shared_state() {
    assert!(ring0_journal::MemoryJournal::new().shared_state().is_none());
}

#[test]
fn pins_published_by_replicas_are_listed_once_each_in_the_order_published() {
    use ring0_journal::shared::PinApproval;
    let Some((a, b)) = replicas() else { return };
    let (a, b) = (a.shared_state().unwrap(), b.shared_state().unwrap());
    let pin = |p: &str| PinApproval {
        upstream: "fx".into(),
        kind: "tool".into(),
        name: "send_mail".into(),
        pin: p.into(),
    };
    block_on(a.pins_publish(&[pin("sha256:1")])).unwrap();
    // The same approval published again (by another replica) keeps its place.
    block_on(b.pins_publish(&[pin("sha256:1")])).unwrap();
    block_on(b.pins_publish(&[pin("sha256:2")])).unwrap();
    let all = block_on(a.pins_since(0)).unwrap();
    let pins: Vec<&str> = all.iter().map(|(_, p)| p.pin.as_str()).collect();
    assert_eq!(pins, ["sha256:1", "sha256:2"]);
    assert!(all[0].0 < all[1].0);
    assert!(block_on(a.pins_since(all[1].0)).unwrap().is_empty());
}
