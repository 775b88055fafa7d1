//! Attribution by observation (DESIGN §4, "Attribution"): where the proxy shares a kernel
//! with the sandbox (the sidecar and the gateway kit), the peer socket of an accepted
//! connection is mapped to the process holding it — `inet_diag` for the socket's inode and
//! owner ([`sock_diag`]), then the process whose file table holds that inode ([`procfs`]).
//!
//! Bounded: a connection looked up again (the requests of a kept connection) is answered from
//! a cache keyed by the socket's inode; the holders of recent connections are tried before
//! the whole of `/proc`; and at most `attribution.lookups_per_second` lookups are made —
//! past that a connection is marked unknown, never guessed. What cannot be seen is said:
//! a socket in another network namespace, a process in another PID namespace or gone.

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

#[derive(Default)]
struct State {
    /// By socket inode: what was observed, and whether every process was searched.
    cache: HashMap<u32, (Observed, bool)>,
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

    /// The process at the other end of a connection accepted from `peer`, which the client
    /// made to `dialed` (the listener's address; in transparent mode the original
    /// destination).
    ///
    /// `exhaustive` (a sandbox with scoped entries or rules): every process is searched, and a
    /// socket more than one process holds (inherited across `fork`, or passed) is unknown — a
    /// process cannot hand its socket to one a scope admits and have it judged as that one's.
    /// Otherwise the search stops at the first holder.
    pub fn observe(&self, peer: SocketAddr, dialed: SocketAddr, exhaustive: bool) -> Observed {
        let found = match self.socket(peer, dialed) {
            Ok(Some(s)) => s,
            Ok(None) => return unknown(None, OTHER_NETNS),
            Err(why) => return unknown(None, why),
        };
        let recent = {
            let Ok(mut st) = self.state.lock() else {
                return unknown(Some(found.uid), DIAG_FAILED);
            };
            if let Some((hit, _)) = st
                .cache
                .get(&found.inode)
                .filter(|(_, e)| *e || !exhaustive)
            {
                return hit.clone();
            }
            let second = self.epoch.elapsed().as_secs();
            if st.spent.0 != second {
                st.spent = (second, 0);
            }
            if st.spent.1 >= self.per_second {
                return unknown(Some(found.uid), BUDGET);
            }
            st.spent.1 += 1;
            st.recent.clone()
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
        let observed = match (&described, shared) {
            (Some(k), _) => Observed::Seen(Arc::new(k.seen.clone())),
            (None, true) => unknown(Some(found.uid), SHARED),
            (None, false) => unknown(Some(found.uid), NO_HOLDER),
        };
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
            st.cache.insert(found.inode, (observed.clone(), exhaustive));
        }
        observed
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
        let (_accepted, peer) = listener.accept().unwrap();
        let o = Observer::new(1);
        let bash = std::fs::read_link(format!("/proc/{}/exe", child.id())).unwrap();
        let me = std::fs::read_link("/proc/self/exe").unwrap();
        match o.observe(peer, dialed, true) {
            Observed::Seen(s) => {
                assert_eq!(&*s.exe, bash.to_str().unwrap());
                assert_eq!(s.pid, child.id());
                assert_eq!(&*s.ancestors[0], me.to_str().unwrap());
            }
            other => panic!("not seen: {other:?}"),
        }
        let client = TcpStream::connect(dialed).unwrap();
        // Cached: the spent budget does not matter for the same socket.
        assert!(matches!(o.observe(peer, dialed, false), Observed::Seen(_)));
        let second = TcpStream::connect(dialed).unwrap();
        let (_b, peer2) = listener.accept().unwrap();
        assert_eq!(
            o.observe(peer2, dialed, false),
            Observed::Unknown {
                uid: Some(unsafe_uid()),
                why: BUDGET
            }
        );
        let nowhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(matches!(
            Observer::new(10).observe(nowhere, dialed, false),
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
