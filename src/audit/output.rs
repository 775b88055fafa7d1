//! Where audit lines go: stdout, or a file that is appended to, rotated by size
//! (`audit.rotate`: `path` → `path.1` → … → `path.keep`, the oldest deleted), reopened on
//! request (SIGHUP / SIGUSR1, for logrotate's move-then-signal), and forced to disk as
//! `audit.fsync` says. Only the writer thread touches it.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::config::audit::{Fsync, Rotate};

/// `path.N`
pub fn rotated_name(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

/// The audit output.
pub struct Output {
    kind: Kind,
    rotate: Option<Rotate>,
    fsync: Fsync,
    last_sync: Instant,
    /// Bytes written since the last sync.
    unsynced: bool,
}

enum Kind {
    Stdout(BufWriter<std::io::Stdout>),
    File {
        path: PathBuf,
        out: BufWriter<File>,
        size: u64,
    },
    /// Tests: any writer.
    #[cfg(test)]
    Other(BufWriter<Box<dyn Write + Send>>),
}

fn open_append(path: &Path) -> std::io::Result<(BufWriter<File>, u64)> {
    let f = OpenOptions::new().create(true).append(true).open(path)?;
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    Ok((BufWriter::with_capacity(64 * 1024, f), size))
}

impl Output {
    /// Append to `path`, or write to stdout when `None`.
    pub fn open(
        path: Option<&Path>,
        rotate: Option<Rotate>,
        fsync: Fsync,
    ) -> std::io::Result<Self> {
        let kind = match path {
            Some(p) => {
                let (out, size) = open_append(p)?;
                Kind::File {
                    path: p.to_path_buf(),
                    out,
                    size,
                }
            }
            None => Kind::Stdout(BufWriter::with_capacity(64 * 1024, std::io::stdout())),
        };
        Ok(Output {
            kind,
            rotate,
            fsync,
            last_sync: Instant::now(),
            unsynced: false,
        })
    }

    /// Any writer (tests).
    #[cfg(test)]
    pub fn other(w: Box<dyn Write + Send>) -> Self {
        Output {
            kind: Kind::Other(BufWriter::with_capacity(64 * 1024, w)),
            rotate: None,
            fsync: Fsync::Never,
            last_sync: Instant::now(),
            unsynced: false,
        }
    }

    pub fn write_all(&mut self, line: &[u8]) -> std::io::Result<()> {
        self.unsynced = true;
        match &mut self.kind {
            Kind::Stdout(w) => w.write_all(line),
            #[cfg(test)]
            Kind::Other(w) => w.write_all(line),
            Kind::File { out, size, .. } => {
                *size += line.len() as u64;
                out.write_all(line)
            }
        }
    }

    /// Flush, sync if due, and rotate if the file is full. Called after each batch.
    pub fn finish_batch(&mut self) -> std::io::Result<()> {
        match &mut self.kind {
            Kind::Stdout(w) => w.flush()?,
            #[cfg(test)]
            Kind::Other(w) => w.flush()?,
            Kind::File { out, .. } => out.flush()?,
        }
        let due = match self.fsync {
            Fsync::Never => false,
            Fsync::EveryRecord => true,
            Fsync::Interval(d) => self.last_sync.elapsed() >= d,
        };
        if due {
            self.sync()?;
        }
        if let (Some(r), Kind::File { size, .. }) = (self.rotate, &self.kind) {
            if *size >= r.max_bytes {
                self.rotate_now(r)?;
            }
        }
        Ok(())
    }

    /// Force what was written to disk (a file only).
    pub fn sync(&mut self) -> std::io::Result<()> {
        if let Kind::File { out, .. } = &mut self.kind {
            if self.unsynced {
                out.flush()?;
                out.get_ref().sync_data()?;
            }
        }
        self.unsynced = false;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Open the path again (after logrotate moved the file away).
    pub fn reopen(&mut self) -> std::io::Result<()> {
        self.sync()?;
        if let Kind::File { path, out, size } = &mut self.kind {
            let (o, s) = open_append(path)?;
            *out = o;
            *size = s;
        }
        Ok(())
    }

    fn rotate_now(&mut self, r: Rotate) -> std::io::Result<()> {
        self.sync()?;
        let Kind::File { path, out, size } = &mut self.kind else {
            return Ok(());
        };
        let _ = std::fs::remove_file(rotated_name(path, r.keep));
        for n in (1..r.keep).rev() {
            let from = rotated_name(path, n);
            if from.exists() {
                std::fs::rename(&from, rotated_name(path, n + 1))?;
            }
        }
        std::fs::rename(&*path, rotated_name(path, 1))?;
        let (o, s) = open_append(path)?;
        *out = o;
        *size = s;
        Ok(())
    }
}
