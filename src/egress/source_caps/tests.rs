//! Unit tests of [`super`].

use super::*;

fn cfg() -> Admission {
    Admission {
        unidentified_per_source: 3,
        unidentified_total: 5,
        accepts_per_second_per_source: 1000.0,
        accept_burst_per_source: 1000,
        first_byte: Duration::from_secs(1),
        auth_failures_per_second_per_source: 0.001,
        auth_failure_burst: 2,
        ..crate::config::defaults::ADMISSION
    }
}

/// Connections that have sent bytes (silent ones are closed for room first).
fn talking(s: UnidentifiedSlot) -> UnidentifiedSlot {
    s.spoke();
    s
}

async fn closed(s: &UnidentifiedSlot) -> bool {
    tokio::time::timeout(Duration::from_millis(200), s.evicted())
        .await
        .is_ok()
}

#[tokio::test]
async fn the_pool_is_shared_fairly_and_the_cap_per_source_holds() {
    let a = Admissions::new(cfg());
    let x: IpAddr = "10.0.0.1".parse().unwrap();
    let y: IpAddr = "10.0.0.2".parse().unwrap();
    let held: Vec<_> = (0..3).map(|_| talking(a.accept(x).unwrap())).collect();
    assert_eq!(a.accept(x).unwrap_err(), Capped::PerSource);
    let _y1 = talking(a.accept(y).unwrap());
    let _y2 = talking(a.accept(y).unwrap());
    // 5 in total: the pool is full. y holds 2 of it, x 3: y's next takes x's oldest.
    let _y3 = talking(a.accept(y).unwrap());
    assert!(
        closed(&held[0]).await,
        "the heavier address gives up its oldest"
    );
    assert!(!closed(&held[1]).await);
    // Now y holds 3 (its own cap) and x 2.
    assert_eq!(a.accept(y).unwrap_err(), Capped::PerSource);
    // A third address takes from the heaviest (y, 3 > 0 + 1).
    let z = a.accept("10.0.0.3".parse().unwrap()).unwrap();
    drop(z);
    drop(held);
}

/// One address whose connections speak but never identify cannot lock out others, however
/// many addresses it uses; and an address that identified lately takes nothing from the
/// pool (so identifying once from each address fills nothing either).
#[tokio::test]
async fn talkers_that_never_identify_cannot_lock_out_a_new_address() {
    let a = Admissions::new(Admission {
        unidentified_per_source: 10,
        unidentified_total: 10,
        ..cfg()
    });
    let talkers: Vec<IpAddr> = (1..=10)
        .map(|i| format!("10.9.0.{i}").parse().unwrap())
        .collect();
    let held: Vec<_> = talkers
        .iter()
        .map(|ip| talking(a.accept(*ip).unwrap()))
        .collect();
    // Ten addresses, one talker each: the pool is full, and a newcomer still gets in.
    let newcomer: IpAddr = "10.0.0.8".parse().unwrap();
    let _n = talking(a.accept(newcomer).unwrap());
    assert!(
        closed(&held[0]).await,
        "the oldest talker is closed for room"
    );
    // An address that identified lately is bounded by its own cap only.
    let known: IpAddr = "10.0.0.7".parse().unwrap();
    a.identified(known);
    let mine: Vec<_> = (0..10).map(|_| talking(a.accept(known).unwrap())).collect();
    assert_eq!(a.accept(known).unwrap_err(), Capped::PerSource);
    for s in &held[1..] {
        assert!(!closed(s).await, "its connections took no one's place");
    }
    drop(mine);
}

#[test]
fn accept_rate_is_per_source() {
    let a = Admissions::new(Admission {
        accepts_per_second_per_source: 0.001,
        accept_burst_per_source: 2,
        ..cfg()
    });
    let x: IpAddr = "10.0.0.1".parse().unwrap();
    drop(a.accept(x).unwrap());
    drop(a.accept(x).unwrap());
    assert!(matches!(a.accept(x), Err(Capped::Rate(_))));
    assert!(a.accept("10.0.0.9".parse().unwrap()).is_ok());
}

#[test]
fn failed_authentications_block_their_source_only() {
    let a = Admissions::new(cfg());
    let x: IpAddr = "10.0.0.1".parse().unwrap();
    assert_eq!(a.auth_blocked(x), None);
    a.auth_failed(x);
    assert_eq!(a.auth_blocked(x), None);
    a.auth_failed(x);
    assert!(a
        .auth_blocked(x)
        .is_some_and(|d| d > Duration::from_secs(100)));
    assert_eq!(a.auth_blocked("10.0.0.2".parse().unwrap()), None);
}

#[test]
fn the_table_forgets_idle_sources() {
    let mut m = HashMap::new();
    let a = Admissions::new(cfg());
    m.insert("10.0.0.1".parse().unwrap(), a.fresh(0));
    let mut busy = a.fresh(0);
    busy.slots.insert(1, Arc::default());
    m.insert("10.0.0.2".parse().unwrap(), busy);
    forget_idle(&mut m, 0);
    assert_eq!(m.len(), 1);
}

#[tokio::test]
async fn a_full_pool_closes_its_oldest_silent_connection_first() {
    let a = Admissions::new(Admission {
        unidentified_per_source: 10,
        unidentified_total: 10,
        ..cfg()
    });
    let attacker: IpAddr = "10.0.0.66".parse().unwrap();
    let stranger: IpAddr = "10.0.0.8".parse().unwrap();
    let held: Vec<_> = (0..9)
        .map(|_| talking(a.accept(attacker).unwrap()))
        .collect();
    let silent = a.accept(attacker).unwrap();
    let newcomer = a.accept(stranger).unwrap();
    assert!(closed(&silent).await, "the silent one goes first");
    assert!(!closed(&held[0]).await);
    // Places given back are counted once, evicted or not.
    drop(silent);
    drop(held);
    drop(newcomer);
    let all: Vec<_> = (0..10).map(|_| a.accept(stranger).unwrap()).collect();
    assert_eq!(all.len(), 10);
}
