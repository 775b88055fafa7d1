//! Data-plane threads (`listen.threads`): N threads, each driving a single-threaded tokio
//! runtime of its own and accepting on a socket of its own for every TCP data-plane listener
//! (one `SO_REUSEPORT` group per address: the kernel spreads the connections over the
//! sockets by address and port). A connection is accepted, admitted, relayed and closed by
//! the thread that accepted it: no task of it is stolen by another worker, and no worker
//! wakes another to run it (the way nginx, Envoy and g3proxy run their workers). What is
//! shared (policy, quotas, the audit trail, kept upstream connections) is shared as it is
//! between the workers of the main runtime. Everything else — the admin listener, DNS, the
//! control plane — stays on the main runtime, and the audit writer on its own thread.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Socket, Type};
use tokio::runtime::Handle;

/// A data-plane listener's sockets: one, or with `listen.threads` one per data-plane thread.
pub(super) type Group = Vec<std::net::TcpListener>;

/// `n` listening sockets on `addr`, one `SO_REUSEPORT` group (`n` = 0: one socket, no
/// group), each with `SO_REUSEADDR` and a backlog of 1024, as tokio binds. For a group the
/// address is first bound by a plain socket, so a port that anyone holds (another
/// egress-proxy's group included) is refused as taken rather than silently shared; with port
/// 0 the group takes the port the kernel chose. `tproxy`: `IP_TRANSPARENT` is set before
/// `bind` (for TPROXY'd connections, which keep their original destination as the local
/// address), and no plain socket can take the address first.
pub(super) fn bind_group(addr: SocketAddr, n: usize, tproxy: bool) -> io::Result<Group> {
    let one = |at: SocketAddr| -> io::Result<std::net::TcpListener> {
        let socket = Socket::new(Domain::for_address(at), Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(n > 0)?;
        if tproxy {
            crate::listen::orig_dst::set_transparent(&socket, at.is_ipv6())?;
        }
        socket.set_nonblocking(true)?;
        socket.bind(&at.into())?;
        socket.listen(1024)?;
        Ok(socket.into())
    };
    let at = match (n, tproxy) {
        (0, _) | (_, true) => addr,
        _ => std::net::TcpListener::bind(addr)?.local_addr()?,
    };
    let first = one(at)?;
    let at = first.local_addr()?;
    let mut group = vec![first];
    for _ in 1..n {
        group.push(one(at)?);
    }
    Ok(group)
}

/// Start `n` data-plane threads; their runtimes' handles, to spawn accept loops on. A thread
/// runs as long as the process: its tasks end with the phase like every other task.
pub(super) fn start(n: usize) -> io::Result<Vec<Handle>> {
    (0..n)
        .map(|i| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = rt.handle().clone();
            std::thread::Builder::new()
                .name(format!("egress-data-{i}"))
                .spawn(move || rt.block_on(keep_a_timer()))?;
            Ok(handle)
        })
        .collect()
}

/// What a data-plane thread's runtime runs besides its tasks: a tick every second. tokio's
/// timer wakes its driver (an `eventfd` write, then one more `epoll_wait`) whenever a timer
/// is set earlier than the driver's next planned wake, and a driver that parked with no
/// timer at all plans none: each connection's first-byte and header timeouts would then pay
/// that wake. A timer always set within the next second keeps the plan nearer than theirs.
async fn keep_a_timer() {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
    }
}
