//! Leases on a shared store: one host at a time owns a session, every write carries the lease's
//! fencing token, and a host whose lease was taken over cannot write over the new holder's log.
//! Two `Store` handles on one database are two hosts (each is a holder of its own). Expiry is
//! the database's clock: the tests expire a lease by moving its expiry into the past, so no test
//! waits for a clock except the renewal test, which is about time passing.

mod common;

use std::time::{Duration, Instant};

use common::*;
use lineage_log::SessionId;
use lineage_store::{LeaseLoss, Store, StoreError, StoreOptions};
use lineage_testkit::postgres::postgres;

/// Makes every live lease in the database at `url` expire now, as if its holder had stopped
/// renewing it a lease's time ago.
fn expire_leases(url: &str) {
    postgres().psql(
        url,
        "UPDATE lineage_leases SET expires_at = now() - interval '1 second' WHERE holder IS NOT NULL",
    );
}

/// Two hosts on one new database, and a session the first one stored.
fn two_hosts() -> (String, Store, Store, lineage_log::SessionId) {
    let url = postgres().create_database();
    let a = Store::open(&url).unwrap();
    let b = Store::open(&url).unwrap();
    let (id, header) = fresh();
    a.import(header, &completed_turns(1)).unwrap();
    (url, a, b, id)
}

#[test]
fn a_session_owned_by_one_host_is_held_elsewhere_for_another_until_released() {
    let (_url, a, b, id) = two_hosts();
    assert_ne!(
        a.holder(),
        b.holder(),
        "each open store is a holder of its own"
    );

    let owner = a.own(id).unwrap();
    let first = owner.fence().expect("a shared store gives a fencing token");
    match b.own(id) {
        Err(StoreError::HeldElsewhere {
            session,
            holder,
            fence,
            expires_in_ms,
        }) => {
            assert_eq!((session, holder, fence), (id, a.holder(), first));
            assert!(expires_in_ms > 0);
        }
        other => panic!("expected HeldElsewhere, got {other:?}"),
    }
    let lease = b.lease(id).unwrap().expect("the lease is stored");
    assert!(lease.is_live() && lease.holder == Some(a.holder()) && lease.fence == first);

    drop(owner);
    let released = b.lease(id).unwrap().unwrap();
    assert_eq!((released.holder, released.fence), (None, first));
    let taken = b.own(id).expect("a released lease is free");
    assert!(
        taken.fence().unwrap() > first,
        "every owner gets a larger token"
    );
}

#[test]
fn a_host_whose_lease_was_taken_over_is_fenced_off_and_the_log_keeps_the_new_holders_turns() {
    let (url, a, b, id) = two_hosts();
    let len = a.info(id).unwrap().len;
    let a_owner = a.own(id).unwrap();
    a.append(id, &completed_turn(2, len, "a's, under its lease"))
        .unwrap();

    // A stops renewing (paused, say); its lease runs out and B takes the session over.
    expire_leases(&url);
    let b_owner = b.own(id).unwrap();
    assert!(b_owner.fence() > a_owner.fence());
    let at = b.info(id).unwrap().len;
    assert_eq!(at, len + 6, "the new holder reads what the last one wrote");
    let bs = completed_turn(3, at, "b's, after the takeover");
    b.append(id, &bs).unwrap();

    // A wakes up and writes where it thinks the log ends: refused by the token, not by its clock.
    match a.append(id, &completed_turn(3, at, "a's, too late")) {
        Err(StoreError::Fenced {
            session,
            fence,
            holder,
            current,
        }) => {
            assert_eq!(session, id);
            assert_eq!(fence, a_owner.fence());
            assert_eq!(holder, Some(b.holder()));
            assert_eq!(current, b_owner.fence());
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(b.read_from(id, at).unwrap(), bs, "nothing of A's late turn");
    assert_intact(&b.verify().unwrap());

    // Its owner going away releases nothing: the lease is B's.
    drop(a_owner);
    assert_eq!(b.lease(id).unwrap().unwrap().holder, Some(b.holder()));
}

#[test]
fn a_write_without_the_lease_is_refused_while_another_host_holds_it() {
    let (_url, a, b, id) = two_hosts();
    let len = a.info(id).unwrap().len;
    let owner = a.own(id).unwrap();
    b.load(id).unwrap();
    match b.append(id, &completed_turn(2, len, "b's, without a lease")) {
        Err(StoreError::Fenced {
            fence: None,
            holder,
            current,
            ..
        }) => assert_eq!((holder, current), (Some(a.holder()), owner.fence())),
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(a.info(id).unwrap().len, len, "nothing was written");
    // Once A lets go, B writes as anyone may write an unleased session.
    drop(owner);
    b.load(id).unwrap();
    b.append(id, &completed_turn(2, len, "b's")).unwrap();
    assert_eq!(a.info(id).unwrap().len, len + 6);
}

#[test]
fn a_torn_turn_is_repaired_only_by_the_host_that_holds_or_takes_the_lease() {
    let url = postgres().create_database();
    let a = Store::open(&url).unwrap();
    let b = Store::open(&url).unwrap();
    let (id, header) = fresh();
    a.import(header, &open_turn_log()).unwrap();
    let torn = a.info(id).unwrap().len;

    let owner = a.own(id).unwrap();
    // Another host reads the session as an inspection; it may not write the repair.
    let seen = b.inspect(id).unwrap();
    assert_eq!(seen.closers, 4);
    assert!(matches!(
        b.load(id),
        Err(StoreError::HeldElsewhere { holder, .. }) if holder == a.holder()
    ));
    assert_eq!(a.info(id).unwrap().len, torn, "no closers were written");

    // A stops renewing and its lease runs out: B takes the lease for the repair and lets it go.
    std::mem::forget(owner);
    expire_leases(&url);
    let loaded = b.load(id).unwrap();
    assert_eq!(loaded.closers, 4);
    assert_eq!(b.info(id).unwrap().len, torn + 4, "the closers are durable");
    let lease = b.lease(id).unwrap().unwrap();
    assert_eq!(lease.holder, None, "the repair's lease is released");
    assert_eq!(loaded.events, b.inspect(id).unwrap().events);
    assert_intact(&b.verify().unwrap());
}

#[test]
fn a_host_that_resumes_a_session_owns_it_and_repairs_it_under_its_lease() {
    let url = postgres().create_database();
    let a = Store::open(&url).unwrap();
    let (id, header) = fresh();
    a.import(header, &open_turn_log()).unwrap();
    let torn = a.info(id).unwrap().len;
    drop(a);

    let b = Store::open(&url).unwrap();
    let (owner, loaded) = b.own_and_load(id).unwrap();
    assert_eq!((loaded.closers, b.info(id).unwrap().len), (4, torn + 4));
    let lease = b.lease(id).unwrap().unwrap();
    assert_eq!(
        (lease.holder, Some(lease.fence)),
        (Some(b.holder()), owner.fence())
    );
    // It keeps writing under the lease.
    b.append(id, &completed_turn(3, torn + 4, "after the repair"))
        .unwrap();
}

#[test]
fn a_restarted_host_is_a_new_holder_and_waits_out_its_predecessors_lease() {
    let (url, a, _b, id) = two_hosts();
    let before = a.own(id).unwrap();
    // The process dies without releasing (its store is never closed).
    std::mem::forget(before);
    std::mem::forget(a);

    let again = Store::open(&url).unwrap();
    assert!(matches!(
        again.own(id),
        Err(StoreError::HeldElsewhere { .. })
    ));
    expire_leases(&url);
    let owner = again.own(id).unwrap();
    assert_eq!(owner.fence(), Some(2));
}

#[test]
fn closing_a_store_releases_its_leases() {
    let (_url, a, b, id) = two_hosts();
    let owner = a.own(id).unwrap();
    let fence = owner.fence();
    std::mem::forget(owner);
    a.close().unwrap();
    let lease = b.lease(id).unwrap().unwrap();
    assert_eq!((lease.holder, Some(lease.fence)), (None, fence));
    let _taken = b.own(id).expect("the closed host's lease is free");
}

#[test]
fn a_held_lease_is_renewed_while_its_owner_lives_and_a_lost_one_fails_the_pending_flushes() {
    let url = postgres().create_database();
    let ttl = Duration::from_millis(450);
    let short = StoreOptions {
        lease_ttl: ttl,
        // Admitted batches wait for a flush, so one is pending when the lease is lost.
        commit_window: Duration::from_secs(3600),
        ..StoreOptions::default()
    };
    let a = Store::open_with(&url, short).unwrap();
    let b = Store::open(&url).unwrap();
    let (id, header) = fresh();
    a.import(header, &completed_turns(1)).unwrap();
    let len = a.info(id).unwrap().len;
    let owner = a.own(id).unwrap();

    // Three lease times pass; the keeper renews it all along, so B never gets it.
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        assert!(matches!(b.own(id), Err(StoreError::HeldElsewhere { .. })));
        std::thread::sleep(ttl / 5);
    }

    // A's batch waits; meanwhile B takes the lease over (in one statement, as B's own would
    // once A's lease ran out: A's keeper, renewing every 150 ms, cannot slip in between).
    a.admit(id, &completed_turn(2, len, "a's")).unwrap();
    postgres().psql(
        &url,
        &format!(
            "UPDATE lineage_leases SET holder = '{}', fence = fence + 1, \
             expires_at = now() + interval '1 minute' WHERE session = '{id}'",
            b.holder()
        ),
    );
    let taken = owner.fence().map(|f| f + 1);
    match a.flush(id) {
        Err(StoreError::Fenced {
            fence,
            holder,
            current,
            ..
        }) => {
            assert_eq!(
                (fence, holder, current),
                (owner.fence(), Some(b.holder()), taken)
            );
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(b.info(id).unwrap().len, len);
    // The session is B's now: A's later writes are refused as fenced, not read as B's log.
    assert!(matches!(
        a.append(id, &completed_turn(2, len, "a's, again")),
        Err(StoreError::Fenced { .. })
    ));
}

#[test]
fn on_an_embedded_file_every_owner_is_the_only_writer_and_needs_no_lease() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lineage")).unwrap();
    let (id, header) = fresh();
    store.import(header, &open_turn_log()).unwrap();
    assert!(store.holder().is_nil());
    let (owner, loaded) = store.own_and_load(id).unwrap();
    assert_eq!((owner.fence(), loaded.closers), (None, 4));
    assert_eq!(store.lease(id).unwrap(), None);
    assert!(matches!(
        store.own(id),
        Err(StoreError::AlreadyOwned { .. })
    ));
}

#[test]
fn a_session_created_here_and_not_yet_written_stays_this_hosts_when_owned() {
    let url = postgres().create_database();
    let store = Store::open(&url).unwrap();
    let (id, header) = fresh();
    store.create(header).unwrap();
    let owner = store.own(id).unwrap();
    store.append(id, &completed_turns(1)).unwrap();
    assert_eq!(store.info(id).unwrap().len, 6);
    drop(owner);
}

#[test]
fn mail_is_posted_once_read_in_posting_order_and_taken_by_exactly_one_host() {
    let (_url, a, b, id) = two_hosts();
    let (other, header) = fresh();
    a.import(header, &completed_turns(1)).unwrap();
    let mail = |n: u8, recipient| lineage_store::Mail {
        id: uuid::Uuid::now_v7(),
        recipient,
        sender: other,
        body: vec![n; 3],
    };
    let (first, second, elsewhere) = (mail(1, id), mail(2, id), mail(3, other));
    for m in [&first, &second, &elsewhere] {
        assert!(b.post(m).unwrap());
    }
    assert!(
        !b.post(&first).unwrap(),
        "posting the same mail again posts nothing"
    );
    assert_eq!(
        a.mail_for(&[id]).unwrap(),
        vec![first.clone(), second.clone()]
    );

    // Two hosts race to take the same mail: each piece goes to exactly one of them.
    let ids = [first.id, second.id];
    let (took_a, took_b) = std::thread::scope(|s| {
        let ta = s.spawn(|| a.take_mail(&ids).unwrap());
        let tb = s.spawn(|| b.take_mail(&ids).unwrap());
        (ta.join().unwrap(), tb.join().unwrap())
    });
    let mut took: Vec<_> = took_a.into_iter().chain(took_b).collect();
    took.sort();
    assert_eq!(took, ids.to_vec());
    assert!(a.mail_for(&[id]).unwrap().is_empty());
    assert_eq!(a.mail_for(&[id, other]).unwrap(), vec![elsewhere.clone()]);

    // Mail a host claimed for delivery cannot be withdrawn; unclaimed mail can.
    let _kept = a.own(other).unwrap();
    let fence = a.lease(other).unwrap().expect("a's lease").fence;
    assert!(
        !a.claim_mail(elsewhere.id, fence + 1).unwrap(),
        "not in another tenure"
    );
    assert!(a.claim_mail(elsewhere.id, fence).unwrap());
    assert!(
        !b.claim_mail(elsewhere.id, fence).unwrap(),
        "the claimant holds the recipient"
    );
    assert!(!b.withdraw_mail(elsewhere.id).unwrap());
    let unclaimed = mail(4, id);
    assert!(b.post(&unclaimed).unwrap());
    assert!(b.withdraw_mail(unclaimed.id).unwrap());
    assert_eq!(a.mail_for(&[id, other]).unwrap(), vec![elsewhere]);
}

#[test]
fn an_embedded_file_has_no_mailbox() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lineage")).unwrap();
    let (id, _) = fresh();
    assert!(!store.is_shared());
    let mail = lineage_store::Mail {
        id: uuid::Uuid::now_v7(),
        recipient: id,
        sender: id,
        body: Vec::new(),
    };
    assert!(store.post(&mail).is_err());
    assert!(store.mail_for(&[id]).unwrap().is_empty());
}

#[test]
fn a_session_another_host_keeps_is_not_deleted_under_it() {
    let (_url, a, b, id) = two_hosts();
    let owner = a.own(id).unwrap();
    match b.delete(id, lineage_store::DeleteRule::Subtree) {
        Err(StoreError::HeldElsewhere {
            session, holder, ..
        }) => assert_eq!((session, holder), (id, a.holder())),
        other => panic!("expected HeldElsewhere, got {other:?}"),
    }
    assert!(b.info(id).is_ok(), "the session is still stored");
    drop(owner);
    b.delete(id, lineage_store::DeleteRule::Subtree).unwrap();
}

#[test]
fn a_lease_time_out_of_range_is_refused_when_the_store_opens() {
    let url = postgres().create_database();
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(99),
        Duration::from_secs(86_401),
    ] {
        let options = StoreOptions {
            lease_ttl: ttl,
            ..StoreOptions::default()
        };
        match Store::open_with(&url, options) {
            Err(StoreError::InvalidOption { field, .. }) => assert_eq!(field, "lease_ttl"),
            other => panic!("{ttl:?}: expected InvalidOption, got {other:?}"),
        }
    }
}

/// `url` with its port replaced by `port`: the same database through a proxy.
fn through(url: &str, port: u16) -> String {
    let (authority, database) = url.rsplit_once('/').expect("a database URL");
    let (host, _) = authority.rsplit_once(':').expect("a port");
    format!("{host}:{port}/{database}")
}

/// What a store's lease watcher heard, in order.
fn watch(store: &Store) -> std::sync::Arc<std::sync::Mutex<Vec<(SessionId, LeaseLoss, Instant)>>> {
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = heard.clone();
    store.watch_leases(move |session, loss| {
        sink.lock().unwrap().push((session, loss, Instant::now()));
    });
    heard
}

/// Polls `done` every 10 ms until it holds or `bound` passes; says whether it held.
fn within(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + bound;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_lease_taken_over_is_announced_once_to_the_watchers_by_the_keeper() {
    let url = postgres().create_database();
    let ttl = Duration::from_millis(300);
    let a = Store::open_with(
        &url,
        StoreOptions {
            lease_ttl: ttl,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let b = Store::open(&url).unwrap();
    let (id, header) = fresh();
    a.import(header, &completed_turns(1)).unwrap();
    let heard = watch(&a);
    let owner = a.own(id).unwrap();

    // A writes nothing; B takes the expired lease over. A's keeper finds it at its next renewal.
    expire_leases(&url);
    let taken = b.own(id).unwrap();
    assert!(
        within(ttl * 2, || !heard.lock().unwrap().is_empty()),
        "A's watcher hears of the takeover within a renewal period or two"
    );
    std::thread::sleep(ttl);
    let heard = heard.lock().unwrap().clone();
    assert_eq!(heard.len(), 1, "once per lost lease: {heard:?}");
    match &heard[0] {
        (session, LeaseLoss::TakenOver { lease: Some(lease) }, _) => {
            assert_eq!(*session, id);
            assert_eq!(
                (lease.holder, lease.fence),
                (Some(b.holder()), taken.fence().unwrap())
            );
        }
        other => panic!("expected a takeover, got {other:?}"),
    }
    assert!(matches!(
        a.append(id, &completed_turn(2, 6, "a's, too late")),
        Err(StoreError::Fenced { .. })
    ));
    drop(owner);
}

/// A host whose database stops answering (its connections left open and silent) gives its
/// leases up itself, `lease_ttl - lease_ttl / 5` after the start of its last renewal that
/// succeeded: before the database lets another host take them. Its pending flush is refused
/// saying so, its watcher hears why, and once the database answers again it owns sessions anew.
#[test]
fn a_host_whose_database_goes_silent_fences_itself_off_before_another_may_take_over() {
    use lineage_testkit::proxy::Proxy;
    let server = postgres();
    let url = server.create_database();
    let proxy = Proxy::start(server.port());
    let ttl = Duration::from_millis(600);
    let a = Store::open_with(
        through(&url, proxy.port()),
        StoreOptions {
            lease_ttl: ttl,
            commit_window: Duration::from_secs(3600),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let b = Store::open(&url).unwrap();
    let (id, header) = fresh();
    a.import(header, &completed_turns(1)).unwrap();
    let heard = watch(&a);
    let owner = a.own(id).unwrap();
    let fence = owner.fence().unwrap();
    a.admit(id, &completed_turn(2, 6, "a's, never answered"))
        .unwrap();

    proxy.stall();
    let stalled_at = Instant::now();
    // B asks all along; the database grants it only once A's lease expired.
    let b_owner = loop {
        match b.own(id) {
            Ok(owner) => break owner,
            Err(StoreError::HeldElsewhere { .. }) => std::thread::sleep(Duration::from_millis(5)),
            Err(other) => panic!("B's own failed: {other}"),
        }
        assert!(stalled_at.elapsed() < ttl * 5, "B never got the lease");
    };
    let b_got_it = Instant::now();
    let (session, loss, lost_at) = heard
        .lock()
        .unwrap()
        .first()
        .cloned()
        .expect("A's loss was announced");
    assert_eq!(session, id);
    assert!(
        matches!(loss, LeaseLoss::Lapsed { silent } if silent >= ttl - ttl / 5),
        "{loss:?}"
    );
    assert!(
        lost_at < b_got_it,
        "A fenced itself off {:?} after the stall, B got the lease {:?} after it",
        lost_at - stalled_at,
        b_got_it - stalled_at
    );
    // The pending flush is refused at once, naming the session and the silence.
    let refused_by = Instant::now();
    match a.flush(id) {
        Err(
            error @ StoreError::LeaseLapsed {
                session,
                fence: f,
                silent_ms,
            },
        ) => {
            assert_eq!((session, f), (id, fence));
            assert!(silent_ms >= millis(ttl - ttl / 5));
            let message = error.to_string();
            assert!(
                message.contains(&id.to_string()) && message.contains("did not answer"),
                "{message}"
            );
        }
        other => panic!("expected LeaseLapsed, got {other:?}"),
    }
    assert!(
        refused_by.elapsed() < ttl,
        "the refusal does not wait on the database"
    );
    assert!(matches!(
        a.admit(id, &completed_turn(2, 6, "later")),
        Err(StoreError::LeaseLapsed { .. })
    ));

    // The database answers again: A's late write is refused by B's lease, the log is B's, and A
    // owns the session anew once B lets go.
    proxy.heal();
    drop(b_owner);
    drop(owner);
    let again = within(ttl * 10, || a.own(id).map(drop).is_ok());
    assert!(again, "A owns the session again once the database answers");
    assert_eq!(
        b.info(id).unwrap().len,
        6,
        "nothing of A's stalled write is stored"
    );
    assert_eq!(heard.lock().unwrap().len(), 1, "one loss, announced once");
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap()
}

/// Every owner starts a tenure with a larger token, also when the same store takes the session
/// again while its own earlier lease is still live (its release never reached the database).
#[test]
fn owning_again_after_a_failed_release_raises_the_token() {
    use lineage_testkit::proxy::{Cut, Proxy};
    let server = postgres();
    let url = server.create_database();
    let proxy = Proxy::start(server.port());
    let a = Store::open(through(&url, proxy.port())).unwrap();
    let (id, header) = fresh();
    a.import(header, &completed_turns(1)).unwrap();
    let first = a.own(id).unwrap();
    let first_fence = first.fence().unwrap();

    // The release's parameters start with the session and the holder (16 bytes each, binary).
    let mut release = id.as_uuid().as_bytes().to_vec();
    release.extend_from_slice(&16u32.to_be_bytes());
    release.extend_from_slice(a.holder().as_bytes());
    proxy.cut_next(Cut::Before(release));
    drop(first);
    assert_eq!(proxy.cuts(), 1, "the release never reached the database");
    let lease = a.lease(id).unwrap().unwrap();
    assert!(lease.is_live() && lease.holder == Some(a.holder()) && lease.fence == first_fence);

    let second = a.own(id).unwrap();
    assert!(
        second.fence().unwrap() > first_fence,
        "a new tenure has a larger token: {:?} after {first_fence}",
        second.fence()
    );
}
