//! Attribution by observation (DESIGN §4, "Attribution"): where the proxy shares a kernel
//! with the sandbox (the sidecar and the gateway kit), the peer socket of an accepted
//! connection is mapped to the process holding it — `inet_diag` for the socket's inode and
//! owner ([`sock_diag`]), then the process whose file table holds that inode ([`procfs`]).
//!
//! Two looks, which must agree (security review A06, A06b, A07: the holder when the proxy
//! looked used to decide, and was cached for the connection's life):
//! - the **first look** ([`Observer::first_look`]) when the connection is accepted, before any
//!   of its bytes is read: who holds the socket then — one process (its pid, start time and
//!   the file it runs), or none, or several;
//! - the **judging look** ([`Observer::observe`]) for every exchange and every request of a
//!   kept connection: the same process must hold it, alone, running the same file. A socket
//!   handed to another process, shared, or whose process ran another executable since the
//!   first look is unknown — which no scope admits.
//!
//! Bounded: for a sandbox whose decisions do not depend on the process, a request of a kept
//! connection is answered from a cache keyed by the socket's inode once the cached holder is
//! seen to still hold it (one `readlink`, one `stat`); for a scoped sandbox every judging look
//! searches every process (only a whole search shows a second holder). The holders of recent
//! connections are tried first; at most `attribution.lookups_per_second` searches are made —
//! past that a connection is marked unknown, never guessed. What cannot be seen is said: a
//! socket in another network namespace, a process in another PID namespace or gone.

mod procfs;
pub mod sock_diag;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::policy::process::Observed;

/// The most inodes kept; the cache is emptied when full.
const CACHE_MAX: usize = 4096;
/// How many recent holders are tried first.
const RECENT: usize = 8;
/// The most processes whose ancestry is kept.
const KNOWN_MAX: usize = 256;

/// Looks up the process at the other end of accepted connections.
pub struct Observer {
    diag: Mutex<Option<sock_diag::Diag>>,
    per_second: u32,
    state: Mutex<State>,
    /// When this observer was made (the budget's clock).
    epoch: Instant,
}

/// Who held a socket at a look: its one holder's pid, start time and the file it ran
/// (device, inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Its pid.
    pub pid: u32,
    /// Its start time (with the pid, what names it over time).
    pub start: u64,
    /// The file it runs: another after an `execve` of another file.
    pub exe: (u64, u64),
}

/// The first look at a connection: its socket, and its one holder then (none when no
/// process, or more than one, held it, or the look was not made).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    inode: u32,
    holder: Option<Identity>,
}

/// The client's socket as it sees itself — its address, and the address it connected to
/// (the listener's, or a redirected connection's original destination) — and the first look
/// at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// The client's address.
    pub client: SocketAddr,
    /// The address it connected to.
    pub dialed: SocketAddr,
    /// What was seen when the connection was accepted.
    pub first: Option<Look>,
}

/// One judging look kept for the next request of the same connection.
#[derive(Clone)]
struct Cached {
    observed: Observed,
    /// The holder named, and its descriptor: it must still hold the socket, the same process
    /// running the same file, for the entry to be used.
    holder: Option<(Identity, u32)>,
}

#[derive(Default)]
struct State {
    /// By socket inode: the last judging look.
    cache: HashMap<u32, Cached>,
    recent: Vec<u32>,
    /// Processes described before, by pid (their ancestry and cgroup are not read again).
    known: HashMap<u32, procfs::Known>,
    /// (second since `epoch`, lookups made in it).
    spent: (u64, u32),
}

/// Why nothing is named.
const OTHER_NETNS: &str =
    "the peer socket is not in the proxy's network namespace (another namespace, or closed)";
const NO_HOLDER: &str =
    "no process the proxy can see holds the socket (another PID namespace, or it exited)";
const BUDGET: &str = "attribution.lookups_per_second was spent";
const SHARED: &str = "more than one process holds the socket (inherited or passed)";
const DIAG_FAILED: &str = "the kernel's socket diagnostics failed";
const CHANGED: &str = "the socket changed hands, or its process ran another executable, since the connection was accepted";

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("per_second", &self.per_second)
            .finish()
    }
}

impl Observer {
    /// An observer making at most `per_second` lookups a second.
    pub fn new(per_second: u32) -> Self {
        Observer {
            diag: Mutex::new(None),
            per_second,
            state: Mutex::new(State::default()),
            epoch: Instant::now(),
        }
    }

    /// The first look at a connection just accepted from `client`, which it made to `dialed`
    /// (the listener's address; in transparent mode the original destination): its socket
    /// and its one holder, before any byte of it is read. `exhaustive` (while any sandbox
    /// decides by the process): every process is searched, so a socket already shared has no
    /// holder — and no later look can agree with it.
    pub fn first_look(
        &self,
        client: SocketAddr,
        dialed: SocketAddr,
        exhaustive: bool,
    ) -> Option<Look> {
        let found = self.socket(client, dialed).ok()??;
        let recent = self.spend()?;
        let holder = match exhaustive {
            false => procfs::holder(found.inode, &recent),
            true => match procfs::holders(found.inode).as_slice() {
                [one] => Some(*one),
                _ => None,
            },
        };
        let holder = holder.and_then(|(pid, fd)| procfs::identity(pid, fd, found.inode));
        Some(Look {
            inode: found.inode,
            holder,
        })
    }

    /// The process at the other end of a connection (`peer`), judged now: the holder of its
    /// socket, which must agree with the first look (the same process, alone, running the
    /// same file) — otherwise unknown.
    ///
    /// `exhaustive` (a sandbox with scoped entries or rules): every process is searched, and a
    /// socket more than one process holds (inherited across `fork`, or passed) is unknown — a
    /// process cannot hand its socket to one a scope admits and have it judged as that one's.
    /// Otherwise the search stops at the first holder, and a kept connection's next request
    /// reuses the last look while its holder still holds the socket.
    pub fn observe(&self, peer: &Peer, exhaustive: bool) -> Observed {
        let found = match self.socket(peer.client, peer.dialed) {
            Ok(Some(s)) => s,
            Ok(None) => return unknown(None, OTHER_NETNS),
            Err(why) => return unknown(None, why),
        };
        let cached = self
            .state
            .lock()
            .ok()
            .and_then(|st| st.cache.get(&found.inode).cloned());
        let still =
            |(id, fd): (Identity, u32)| procfs::identity(id.pid, fd, found.inode) == Some(id);
        if let Some(c) = cached.filter(|c| !exhaustive && c.holder.is_some_and(still)) {
            return c.observed;
        }
        let Some(recent) = self.spend() else {
            return unknown(Some(found.uid), BUDGET);
        };
        let (holder, shared) = match exhaustive {
            false => (procfs::holder(found.inode, &recent), false),
            true => match procfs::holders(found.inode).as_slice() {
                [one] => (Some(*one), false),
                many => (None, many.len() > 1),
            },
        };
        let described = holder.and_then(|(pid, fd)| {
            let known = self.state.lock().ok()?.known.get(&pid).cloned();
            procfs::describe(pid, fd, found.inode, found.uid, known.as_ref())
        });
        let agrees = |k: &procfs::Known| {
            peer.first
                .is_none_or(|f| f.inode == found.inode && f.holder == Some(k.identity()))
        };
        let observed = match (&described, shared) {
            (Some(k), _) if !agrees(k) => unknown(Some(found.uid), CHANGED),
            (Some(k), _) => Observed::Seen(Arc::new(k.seen.clone())),
            (None, true) => unknown(Some(found.uid), SHARED),
            (None, false) => unknown(Some(found.uid), NO_HOLDER),
        };
        let holder = described
            .as_ref()
            .zip(holder)
            .map(|(k, (_, fd))| (k.identity(), fd));
        if let Ok(mut st) = self.state.lock() {
            if let Some(k) = described {
                let pid = k.seen.pid;
                st.recent.retain(|p| *p != pid);
                st.recent.insert(0, pid);
                st.recent.truncate(RECENT);
                if st.known.len() >= KNOWN_MAX {
                    st.known.clear();
                }
                st.known.insert(pid, k);
            }
            if st.cache.len() >= CACHE_MAX {
                st.cache.clear();
            }
            let entry = Cached {
                observed: observed.clone(),
                holder,
            };
            st.cache.insert(found.inode, entry);
        }
        observed
    }

    /// Spend one search of `/proc` from this second's budget: the recent holders to try
    /// first, or `None` when the budget is spent.
    fn spend(&self) -> Option<Vec<u32>> {
        let mut st = self.state.lock().ok()?;
        let second = self.epoch.elapsed().as_secs();
        if st.spent.0 != second {
            st.spent = (second, 0);
        }
        if st.spent.1 >= self.per_second {
            return None;
        }
        st.spent.1 += 1;
        Some(st.recent.clone())
    }

    fn socket(
        &self,
        peer: SocketAddr,
        dialed: SocketAddr,
    ) -> Result<Option<sock_diag::PeerSocket>, &'static str> {
        let mut diag = self.diag.lock().map_err(|_| DIAG_FAILED)?;
        if diag.is_none() {
            *diag = Some(sock_diag::Diag::open().map_err(|_| DIAG_FAILED)?);
        }
        let d = diag.as_mut().ok_or(DIAG_FAILED)?;
        d.lookup(peer, dialed).map_err(|_| {
            // A socket in a bad state is opened afresh next time.
            *diag = None;
            DIAG_FAILED
        })
    }
}

fn unknown(uid: Option<u32>, why: &'static str) -> Observed {
    Observed::Unknown { uid, why }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// A connection a child shell makes is attributed to the shell (this process, whose own
    /// table is never searched, as its ancestor); one whose tuple no socket has is unknown;
    /// a spent budget says so.
    #[test]
    fn a_loopback_connection_is_attributed_to_its_process() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let dialed = listener.local_addr().unwrap();
        let script = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{}; read -t 10 <&3",
            dialed.port()
        );
        let mut child = std::process::Command::new("bash")
            .args(["-c", &script])
            .spawn()
            .unwrap();
        let (_accepted, client) = listener.accept().unwrap();
        let o = Observer::new(2);
        let bash = std::fs::read_link(format!("/proc/{}/exe", child.id())).unwrap();
        let me = std::fs::read_link("/proc/self/exe").unwrap();
        let first = o.first_look(client, dialed, true);
        assert!(first.is_some_and(|l| l.holder.is_some_and(|h| h.pid == child.id())));
        let peer = Peer {
            client,
            dialed,
            first,
        };
        match o.observe(&peer, true) {
            Observed::Seen(s) => {
                assert_eq!(&*s.exe, bash.to_str().unwrap());
                assert_eq!(s.pid, child.id());
                assert_eq!(&*s.ancestors[0], me.to_str().unwrap());
            }
            other => panic!("not seen: {other:?}"),
        }
        let client = TcpStream::connect(dialed).unwrap();
        // Cached while its holder holds it: the spent budget does not matter for the same
        // socket judged without scopes; with scopes every look searches, and the budget is spent.
        assert!(matches!(o.observe(&peer, false), Observed::Seen(_)));
        assert!(matches!(
            o.observe(&peer, true),
            Observed::Unknown { why: BUDGET, .. }
        ));
        // A first look that saw another holder (or none) never agrees.
        let other = Look {
            holder: None,
            ..first.unwrap()
        };
        let disagreeing = Peer {
            first: Some(other),
            ..peer
        };
        assert!(matches!(
            Observer::new(10).observe(&disagreeing, true),
            Observed::Unknown { why: CHANGED, .. }
        ));
        let second = TcpStream::connect(dialed).unwrap();
        let (_b, client2) = listener.accept().unwrap();
        let peer2 = Peer {
            client: client2,
            dialed,
            first: None,
        };
        assert_eq!(
            o.observe(&peer2, false),
            Observed::Unknown {
                uid: Some(unsafe_uid()),
                why: BUDGET
            }
        );
        let nowhere = Peer {
            client: "127.0.0.1:1".parse().unwrap(),
            dialed,
            first: None,
        };
        assert!(matches!(
            Observer::new(10).observe(&nowhere, false),
            Observed::Unknown {
                uid: None,
                why: OTHER_NETNS
            }
        ));
        drop((client, second));
        let _ = child.kill();
        let _ = child.wait();
    }

    fn unsafe_uid() -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().uid()
    }
}
