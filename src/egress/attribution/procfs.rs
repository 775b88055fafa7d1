//! The process holding a socket, read from `/proc`: which pid has `socket:[inode]` in its
//! file table, its executable (resolved by the kernel, not a symlink's text), its ancestors'
//! executables and its cgroup. What cannot be read is left out, never guessed: a process in
//! another PID namespace is not in this `/proc`, one that exited is gone.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use crate::policy::process::Seen;

/// The deepest ancestry read.
const ANCESTORS_MAX: usize = 32;

/// The pid of a process whose file table holds socket `inode`, trying `first` (the holders
/// of recent connections) before the whole of `/proc`.
pub fn holder(inode: u32, first: &[u32]) -> Option<u32> {
    let link = format!("socket:[{inode}]");
    if let Some(pid) = first.iter().copied().find(|p| holds(*p, &link)) {
        return Some(pid);
    }
    let dir = fs::read_dir("/proc").ok()?;
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| !first.contains(p))
        .find(|p| holds(*p, &link))
}

/// Whether `pid`'s file table has an entry pointing at `link` (`socket:[inode]`).
fn holds(pid: u32, link: &str) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok)
        .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == link))
}

/// What `/proc` says of `pid`, which held socket `inode` owned by `uid`: `None` when it is
/// gone, or no longer holds the socket once read (its pid reused by another process).
pub fn describe(pid: u32, inode: u32, uid: u32) -> Option<Seen> {
    let exe = executable(pid)?;
    let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()
        .and_then(|text| unified_cgroup(&text).map(Arc::from));
    let mut ancestors = Vec::new();
    let mut at = parent_of(pid);
    while let Some(p) = at.filter(|p| *p > 1 && ancestors.len() < ANCESTORS_MAX) {
        ancestors.push(executable(p).unwrap_or_else(|| Arc::from("(unreadable)")));
        at = parent_of(p);
    }
    // Read after everything else: the pid still holds the socket, so it named one process.
    let seen = Seen {
        pid,
        exe,
        ancestors,
        cgroup,
        uid,
    };
    holds(pid, &format!("socket:[{inode}]")).then_some(seen)
}

fn executable(pid: u32) -> Option<Arc<str>> {
    let path = fs::read_link(Path::new("/proc").join(pid.to_string()).join("exe")).ok()?;
    Some(Arc::from(path.to_string_lossy().as_ref()))
}

/// The parent pid from `/proc/PID/stat` (the field after the state, which follows the last
/// `)`: a command name may hold spaces and parentheses).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_ppid(&stat)
}

fn parse_ppid(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
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
        assert_eq!(parse_ppid("42 (a) b (c)) S 17 42 42 0"), Some(17));
        assert_eq!(parse_ppid("42 (x"), None);
        assert_eq!(
            unified_cgroup("1:cpu:/x\n0::/user.slice/a\n"),
            Some("/user.slice/a")
        );
    }

    /// This test's own socket is found in this process, with this binary as its executable.
    #[test]
    fn a_socket_of_this_process_is_found_and_described() {
        use std::os::unix::fs::MetadataExt;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let fd_path = {
            use std::os::fd::AsRawFd;
            format!("/proc/self/fd/{}", listener.as_raw_fd())
        };
        let link = fs::read_link(&fd_path).unwrap();
        let inode: u32 = link.to_str().unwrap()[8..]
            .trim_end_matches(']')
            .parse()
            .unwrap();
        let me = std::process::id();
        assert_eq!(holder(inode, &[]), Some(me));
        let seen = describe(me, inode, 0).unwrap();
        let exe = fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(&*seen.exe, exe.to_str().unwrap());
        assert!(fs::metadata(&fd_path).unwrap().ino() > 0);
        assert_eq!(holder(u32::MAX - 1, &[me]), None);
    }
}
