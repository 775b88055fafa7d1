//! How much memory an idle tunnel's task holds, bounded per listener. A future is as large as
//! its largest state, so one inline `await` of a large future anywhere on a tunnel's path
//! (the flow judging once: +1.7 KiB an idle tunnel, `benches/idle_ab.sh`) grows every tunnel
//! of every sandbox. The sizes are read from the types, without running anything: a bound on
//! a size, not a timing, so deterministic.

use std::future::Future;

/// The size of what `f` returns, read from its type (`f` is never called).
fn output_size<A, B, C, D, F: Future>(_: fn(A, B, C, D) -> F) -> usize {
    std::mem::size_of::<F>()
}

/// [`output_size`] for five arguments.
fn output_size5<A, B, C, D, E, F: Future>(_: fn(A, B, C, D, E) -> F) -> usize {
    std::mem::size_of::<F>()
}

/// 3,112 bytes; 4,952 when the flow judging was awaited inline (fixed in `1b7bd81`), 3,592
/// as an `async fn` (its arguments held twice).
#[test]
fn a_connect_tunnels_task_stays_small() {
    let size = output_size(super::connect::tunnel_task);
    assert!(size <= 3200, "a CONNECT tunnel's task is {size} bytes");
}

/// 4,152 bytes; 5,968 with the admission and the proxy's own endpoint awaited inline.
#[test]
fn a_transparent_connections_task_stays_small() {
    let size = output_size5(super::transparent::serve);
    assert!(
        size <= 4250,
        "a transparent connection's task is {size} bytes"
    );
}

/// 4,136 bytes; 6,016 with the negotiation and the proxy's own endpoint awaited inline.
#[test]
fn a_socks5_connections_task_stays_small() {
    let size = output_size(super::socks5::serve);
    assert!(size <= 4250, "a SOCKS5 connection's task is {size} bytes");
}
