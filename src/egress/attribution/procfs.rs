//! The process holding a socket, read from `/proc`: which pid has `socket:[inode]` in its
//! file table (and at which descriptor), its executable (resolved by the kernel, not a
//! symlink's text), its ancestors' executables and its cgroup. What cannot be read is left
//! out, never guessed: a process in another PID namespace is not in this `/proc`, one that
//! exited is gone.
//!
//! A process seen before (the same pid, start time and executable) keeps the ancestry and
//! cgroup read the first time: each new connection of a known process then costs the file
//! table search, its `stat`, its executable and one descriptor read again.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use crate::policy::process::Seen;

/// The deepest ancestry read.
const ANCESTORS_MAX: usize = 32;

/// A process as read once: its start time (with its pid, what names it over time) and what
/// was seen.
#[derive(Debug, Clone)]
pub struct Known {
    /// `starttime` from `/proc/PID/stat` (clock ticks since boot).
    pub start: u64,
    /// The file it runs (device, inode): changes with an `execve` of another file.
    pub exe_id: (u64, u64),
    /// What was seen.
    pub seen: Seen,
}

impl Known {
    /// Who it is, to compare with another look.
    pub fn identity(&self) -> super::Identity {
        super::Identity {
            pid: self.seen.pid,
            start: self.start,
            exe: self.exe_id,
        }
    }
}

/// Who `pid` is now (its start time and the file it runs), if it still holds socket `inode`
/// at `fd` after both were read.
pub fn identity(pid: u32, fd: u32, inode: u32) -> Option<super::Identity> {
    let (_, start) = stat(pid)?;
    let exe = exe_id(pid)?;
    still_holds(pid, fd, inode).then_some(super::Identity { pid, start, exe })
}

/// Whether `pid`'s descriptor `fd` is socket `inode`.
pub fn still_holds(pid: u32, fd: u32, inode: u32) -> bool {
    fs::read_link(format!("/proc/{pid}/fd/{fd}"))
        .is_ok_and(|l| l.as_os_str().as_bytes() == format!("socket:[{inode}]").as_bytes())
}

/// The (device, inode) of the file `pid` runs, as the proxy sees it.
fn exe_id(pid: u32) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(format!("/proc/{pid}/exe")).ok()?;
    Some((m.dev(), m.ino()))
}

/// The pid and descriptor of a process whose file table holds socket `inode`, trying
/// `first` (the holders of recent connections) before the whole of `/proc`.
pub fn holder(inode: u32, first: &[u32]) -> Option<(u32, u32)> {
    let link = format!("socket:[{inode}]");
    for pid in first {
        if let Some(fd) = holds(*pid, &link) {
            return Some((*pid, fd));
        }
    }
    others()?
        .filter(|p| !first.contains(p))
        .find_map(|p| holds(p, &link).map(|fd| (p, fd)))
}

/// Every pid in `/proc` but the proxy's own: its table holds every connection it serves, and
/// never a client's end of one (the guard refuses the proxy as a destination).
fn others() -> Option<impl Iterator<Item = u32>> {
    let me = std::process::id();
    let dir = fs::read_dir("/proc").ok()?;
    let pids = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok());
    Some(pids.filter(move |p| *p != me))
}

/// Every (pid, descriptor) holding socket `inode`, searching the whole of `/proc`.
pub fn holders(inode: u32) -> Vec<(u32, u32)> {
    let link = format!("socket:[{inode}]");
    let Some(pids) = others() else {
        return Vec::new();
    };
    pids.filter_map(|p| holds(p, &link).map(|fd| (p, fd)))
        .collect()
}

/// The descriptor of `pid` pointing at `link` (`socket:[inode]`), if one does. Each entry is
/// read relative to the open directory (`readlinkat`): the kernel walks one name, not the
/// whole `/proc/PID/fd/N` path, per descriptor.
fn holds(pid: u32, link: &str) -> Option<u32> {
    let path = format!("/proc/{pid}/fd");
    let dir = fs::File::open(&path).ok()?;
    let fds = fs::read_dir(&path).ok()?;
    fds.filter_map(Result::ok).find_map(|fd| {
        let name = fd.file_name();
        let target = nix::fcntl::readlinkat(&dir, name.as_os_str()).ok()?;
        (target.as_bytes() == link.as_bytes()).then(|| name.to_str()?.parse().ok())?
    })
}

/// What `/proc` says of `pid`, which held socket `inode` (owned by `uid`) at descriptor `fd`;
/// `known`, what an earlier lookup read of the same pid. `None` when it is gone, or no
/// longer holds the socket once read (its pid reused by another process).
pub fn describe(pid: u32, fd: u32, inode: u32, uid: u32, known: Option<&Known>) -> Option<Known> {
    let (ppid, start) = stat(pid)?;
    let exe = executable(pid)?;
    let exe_id = exe_id(pid)?;
    let same = known.filter(|k| k.start == start && k.seen.exe == exe && k.exe_id == exe_id);
    let (ancestors, cgroup) = match same {
        Some(k) => (k.seen.ancestors.clone(), k.seen.cgroup.clone()),
        None => (ancestry(ppid), cgroup_of(pid)),
    };
    // Read after everything else: the pid still holds the socket, so it named one process.
    if !still_holds(pid, fd, inode) {
        return None;
    }
    let seen = Seen {
        pid,
        exe,
        ancestors,
        cgroup,
        uid,
    };
    Some(Known {
        start,
        exe_id,
        seen,
    })
}

fn ancestry(mut at: Option<u32>) -> Vec<Arc<str>> {
    let mut ancestors = Vec::new();
    while let Some(p) = at.filter(|p| *p > 1 && ancestors.len() < ANCESTORS_MAX) {
        ancestors.push(executable(p).unwrap_or_else(|| Arc::from("(unreadable)")));
        at = stat(p).and_then(|(ppid, _)| ppid);
    }
    ancestors
}

fn cgroup_of(pid: u32) -> Option<Arc<str>> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    unified_cgroup(&text).map(Arc::from)
}

/// The executable of `pid` as a path the scopes can match — only when that path, in the
/// proxy's own mount namespace, is the very file the kernel runs. The link's text is the
/// process's view: in its own user and mount namespace a process can bind-mount python over
/// `/usr/bin/curl` and read back `/usr/bin/curl` (security review A04). So the file behind
/// `/proc/PID/exe` (device and inode) is compared with the file at the path here; when they
/// differ (or the path is gone here: a deleted or replaced binary, another root) the
/// executable is `(unverified PATH)`, which no path a scope names matches.
fn executable(pid: u32) -> Option<Arc<str>> {
    let link = format!("/proc/{pid}/exe");
    let path = fs::read_link(&link).ok()?;
    let text = path.to_string_lossy();
    Some(match same_file(&link, &path) {
        true => Arc::from(text.as_ref()),
        false => Arc::from(format!("(unverified {text})")),
    })
}

/// Whether `a` and `b` name one file (device and inode, links followed).
fn same_file(a: &str, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// (parent pid, start time) from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(Option<u32>, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

/// The fields after the command name, which follows the last `)` (a name may hold spaces and
/// parentheses): state, ppid (the 4th field), …, starttime (the 22nd).
fn parse_stat(stat: &str) -> Option<(Option<u32>, u64)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let ppid = fields.get(1)?.parse().ok();
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start))
}

/// The unified hierarchy's path (`0::/path`) of a `/proc/PID/cgroup`.
fn unified_cgroup(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_and_cgroup_are_read_past_awkward_names() {
        let line = "42 (a) b (c)) S 17 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(parse_stat(line), Some((Some(17), 98765)));
        assert_eq!(parse_stat("42 (x"), None);
        assert_eq!(
            unified_cgroup("1:cpu:/x\n0::/user.slice/a\n"),
            Some("/user.slice/a")
        );
    }

    /// This test's own socket is found in this process, with this binary as its executable;
    /// a second description reuses the first's ancestry.
    #[test]
    fn a_socket_of_this_process_is_found_and_described() {
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let fd = listener.as_raw_fd() as u32;
        let link = fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
        let inode: u32 = link.to_str().unwrap()[8..]
            .trim_end_matches(']')
            .parse()
            .unwrap();
        let me = std::process::id();
        assert_eq!(holder(inode, &[me]), Some((me, fd)));
        assert_eq!(
            holder(inode, &[]),
            None,
            "the proxy's own table is never searched"
        );
        let known = describe(me, fd, inode, 0, None).unwrap();
        let exe = fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(&*known.seen.exe, exe.to_str().unwrap());
        let again = describe(me, fd, inode, 0, Some(&known)).unwrap();
        assert_eq!(again.seen, known.seen);
        assert!(describe(me, fd, inode + 1, 0, None).is_none());
        assert_eq!(holder(u32::MAX - 1, &[me]), None);
    }
}
