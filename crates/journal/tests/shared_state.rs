//! The decision state replicas share through a PostgreSQL journal (`ring0_journal::shared`):
//! a rate bucket limits calls spread over replicas as one, an approval remembered on one
//! replica is honoured on another until it lapses, and a conversation's loaded tools are
//! listed by every replica within their bounds. Each test runs in a schema of its own in the
//! database `RING0_TEST_POSTGRES_URL` names (skipped, with the reason, without one).

mod common;

use futures::executor::block_on;
use ring0_journal::shared::{
    LOADED_NAME_BYTES_MAX, LOADED_NAMES_MAX, LOADED_SET_IDLE_MS, LOADED_SETS_MAX, LoadedAdded,
    LoadedFits,
};
use ring0_journal::{Journal, JournalError, PostgresJournal, PostgresOptions, RateTaken};
use std::time::Duration;

fn replicas() -> Option<(PostgresJournal, PostgresJournal)> {
    replicas_at().map(|(a, b, _)| (a, b))
}

/// Two replicas, and the URL of their schema.
fn replicas_at() -> Option<(PostgresJournal, PostgresJournal, String)> {
    let url = common::fresh_postgres_schema()?;
    let open = || {
        let options = PostgresOptions {
            pool_connections: 4,
            ..PostgresOptions::default()
        };
        PostgresJournal::open(&url, options).unwrap()
    };
    Some((open(), open(), url))
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

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|n| n.to_string()).collect()
}

/// Every name fits.
fn roomy() -> LoadedFits {
    Box::new(|_, _| true)
}

#[test]
fn tools_loaded_through_one_replica_are_listed_by_another_in_load_order() {
    let Some((a, b)) = replicas() else { return };
    let (a, b) = (a.shared_state().unwrap(), b.shared_state().unwrap());
    assert!(
        block_on(b.loaded_names("alice", "conv-1"))
            .unwrap()
            .is_empty()
    );
    let first = block_on(a.loaded_add("alice", "conv-1", &names(&["wx__forecast"]), 128, roomy()));
    assert_eq!(first.unwrap().added, [LoadedAdded::Added]);
    let second = block_on(b.loaded_add(
        "alice",
        "conv-1",
        &names(&["wx__alerts", "wx__forecast"]),
        128,
        roomy(),
    ))
    .unwrap();
    assert_eq!(second.added, [LoadedAdded::Added, LoadedAdded::Present]);
    assert_eq!(second.names, ["wx__forecast", "wx__alerts"]);
    assert_eq!(
        block_on(a.loaded_names("alice", "conv-1")).unwrap(),
        ["wx__forecast", "wx__alerts"]
    );
    assert!(
        block_on(a.loaded_names("alice", "conv-2"))
            .unwrap()
            .is_empty()
    );
    assert!(
        block_on(a.loaded_names("bob", "conv-1"))
            .unwrap()
            .is_empty(),
        "never across principals"
    );
}

#[test]
fn two_loads_through_two_replicas_cannot_both_squeeze_past_the_budget() {
    let Some((a, b)) = replicas() else { return };
    let (a, b) = (a.shared_state().unwrap(), b.shared_state().unwrap());
    // A budget of one loaded tool, decided slowly: every load overlaps the others.
    let answers: Vec<LoadedAdded> = std::thread::scope(|s| {
        let loads: Vec<_> = (0..6)
            .map(|i| {
                let on = if i % 2 == 0 { a.clone() } else { b.clone() };
                s.spawn(move || {
                    let fits: LoadedFits = Box::new(|held, _| {
                        std::thread::sleep(Duration::from_millis(50));
                        held.is_empty()
                    });
                    let name = format!("t{i}");
                    block_on(on.loaded_add("alice", "conv", &[name], 128, fits))
                })
            })
            .collect();
        loads
            .into_iter()
            .flat_map(|t| t.join().unwrap().unwrap().added)
            .collect()
    });
    let added = answers.iter().filter(|a| **a == LoadedAdded::Added).count();
    assert_eq!(added, 1, "{answers:?}");
    assert_eq!(block_on(a.loaded_names("alice", "conv")).unwrap().len(), 1);
}

#[test]
fn a_loaded_set_holds_at_most_its_names_and_refuses_requests_beyond_its_bounds() {
    let Some((a, _)) = replicas() else { return };
    let a = a.shared_state().unwrap();
    let five = names(&["t1", "t2", "t3", "t4", "t5"]);
    let out = block_on(a.loaded_add("alice", "conv", &five, 3, roomy())).unwrap();
    use LoadedAdded::{Added, OverLimit};
    assert_eq!(out.added, [Added, Added, Added, OverLimit, OverLimit]);
    assert_eq!(out.names, ["t1", "t2", "t3"]);
    let too_many = LOADED_NAMES_MAX + 1;
    assert!(matches!(
        block_on(a.loaded_add("alice", "conv", &five, too_many, roomy())),
        Err(JournalError::Invalid(_))
    ));
    let long = vec!["t".repeat(LOADED_NAME_BYTES_MAX + 1)];
    assert!(matches!(
        block_on(a.loaded_add("alice", "conv", &long, 3, roomy())),
        Err(JournalError::Invalid(_))
    ));
    let key = "k".repeat(ring0_journal::shared::SHARED_KEY_BYTES_MAX + 1);
    assert!(matches!(
        block_on(a.loaded_names("alice", &key)),
        Err(JournalError::Invalid(_))
    ));
    assert_eq!(block_on(a.loaded_names("alice", "conv")).unwrap().len(), 3);
}

#[test]
fn an_idle_loaded_set_is_forgotten_and_starts_again_empty() {
    let Some((a, b, url)) = replicas_at() else {
        return;
    };
    let (a, b) = (a.shared_state().unwrap(), b.shared_state().unwrap());
    block_on(a.loaded_add("alice", "conv", &names(&["t1"]), 128, roomy())).unwrap();
    // Last used longer ago than the idle expiry.
    let idle_us = (LOADED_SET_IDLE_MS + 1_000) * 1_000;
    common::admin(
        &url,
        &format!("UPDATE loaded_tool_sets SET used_us = used_us - {idle_us}"),
    );
    assert!(
        block_on(b.loaded_names("alice", "conv"))
            .unwrap()
            .is_empty()
    );
    let out = block_on(b.loaded_add("alice", "conv", &names(&["t2"]), 128, roomy())).unwrap();
    assert_eq!(out.names, ["t2"], "the lapsed names are gone");
}

#[test]
fn a_new_loaded_set_beyond_the_bound_forgets_the_least_recently_used() {
    let Some((a, _, url)) = replicas_at() else {
        return;
    };
    let a = a.shared_state().unwrap();
    block_on(a.loaded_add("alice", "oldest", &names(&["t1"]), 128, roomy())).unwrap();
    // The rest of the bound, used after the oldest and before the next.
    common::admin(
        &url,
        &format!(
            "UPDATE loaded_tool_sets SET used_us = used_us - 10000000;
             INSERT INTO loaded_tool_sets (principal, scope, names, used_us)
             SELECT 'bob', 'conv-' || n, ARRAY['t1'],
                    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint - 1000000 + n
             FROM generate_series(1, {}) AS n;",
            LOADED_SETS_MAX - 1
        ),
    );
    block_on(a.loaded_add("carol", "conv", &names(&["t1"]), 128, roomy())).unwrap();
    assert!(
        block_on(a.loaded_names("alice", "oldest"))
            .unwrap()
            .is_empty()
    );
    assert_eq!(block_on(a.loaded_names("carol", "conv")).unwrap(), ["t1"]);
    assert_eq!(block_on(a.loaded_names("bob", "conv-1")).unwrap(), ["t1"]);
}
