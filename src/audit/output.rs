//! Where audit lines go: a file that is appended to, rotated by size (`audit.rotate`:
//! `path` → `path.1` → … → `path.keep`, the oldest deleted), reopened on request (SIGHUP /
//! SIGUSR1, for logrotate's move-then-signal) and forced to disk as `audit.fsync` says; or
//! stdout (a file, a pipe or a terminal). Only the writer thread touches it.
//!
//! The writer hands it whole batches of complete lines ([`Output::commit`]). A write that
//! fails leaves the output as it was before the batch: a regular file is cut back to its last
//! complete line (a full disk never leaves half a record), and a stream (a pipe, a terminal)
//! says how many bytes went out, so the rest can follow once it writes again. A file whose
//! path no longer names it (deleted, or moved without the reopen signal) is opened again
//! before the next batch, so records never go to a file nobody can find.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::config::audit::{Fsync, Rotate};

/// `path.N`
pub fn rotated_name(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

/// A batch that did not go out whole.
#[derive(Debug)]
pub struct Failed {
    /// Bytes of the batch that are in the output (always 0 for a regular file: it was cut
    /// back to where the batch began).
    pub kept: usize,
    pub error: std::io::Error,
}

/// The audit output.
pub struct Output {
    sink: Box<dyn Write + Send>,
    /// The file behind `sink` when it is one (stdout redirected to a file included).
    file: Option<File>,
    /// Where the output lives on disk, for reopen, rotation and the vanished-file check.
    path: Option<PathBuf>,
    /// The length of the file up to its last complete batch (regular files only).
    committed: u64,
    /// A failed cut left bytes after `committed`: cut again before writing.
    dirty: bool,
    rotate: Option<Rotate>,
    fsync: Fsync,
    last_sync: Instant,
    /// Bytes written since the last sync.
    unsynced: bool,
}

/// A regular file's identity (device, inode), when `file` is one.
fn regular(file: &File) -> Option<(u64, u64)> {
    file.metadata()
        .ok()
        .filter(|m| m.file_type().is_file())
        .map(|m| (m.dev(), m.ino()))
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl Output {
    /// Append to `path`, or write to stdout when `None`.
    pub fn open(
        path: Option<&Path>,
        rotate: Option<Rotate>,
        fsync: Fsync,
    ) -> std::io::Result<Self> {
        let file = match path {
            Some(p) => open_append(p)?,
            None => {
                use std::os::fd::AsFd;
                // A duplicate of descriptor 1: when stdout is a file, it is cut back like one.
                File::from(std::io::stdout().as_fd().try_clone_to_owned()?)
            }
        };
        let mut out = Output {
            sink: Box::new(std::io::sink()),
            file: None,
            path: path.map(Path::to_path_buf),
            committed: 0,
            dirty: false,
            rotate,
            fsync,
            last_sync: Instant::now(),
            unsynced: false,
        };
        out.adopt(file)?;
        Ok(out)
    }

    /// Any writer, as a stream (tests).
    #[cfg(test)]
    pub fn other(w: Box<dyn Write + Send>) -> Self {
        Output {
            sink: w,
            file: None,
            path: None,
            committed: 0,
            dirty: false,
            rotate: None,
            fsync: Fsync::Never,
            last_sync: Instant::now(),
            unsynced: false,
        }
    }

    /// Write into `file` from now on.
    fn adopt(&mut self, mut file: File) -> std::io::Result<()> {
        if regular(&file).is_some() {
            // Lines are only ever added at the end (a redirected stdout too: its offset is
            // moved there), so the file's length is where the next batch begins.
            self.committed = file.seek(SeekFrom::End(0))?;
            self.sink = Box::new(file.try_clone()?);
            self.file = Some(file);
        } else {
            self.sink = Box::new(file);
            self.file = None;
        }
        self.dirty = false;
        Ok(())
    }

    /// Write `batch` (complete lines) and flush it; sync and rotate when due. On failure the
    /// output holds what it held before, plus, for a stream, the first `kept` bytes.
    pub fn commit(&mut self, batch: &[u8]) -> Result<(), Failed> {
        let fail = |kept, error| Failed { kept, error };
        self.repair().map_err(|e| fail(0, e))?;
        self.follow_path().map_err(|e| fail(0, e))?;
        if self.file.is_some() {
            if let Err(e) = self.sink.write_all(batch).and_then(|()| self.sink.flush()) {
                return Err(fail(0, self.cut_back(e)));
            }
            self.committed += batch.len() as u64;
        } else {
            let mut kept = 0;
            while kept < batch.len() {
                match self.sink.write(&batch[kept..]) {
                    Ok(0) => return Err(fail(kept, std::io::ErrorKind::WriteZero.into())),
                    Ok(n) => kept += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(fail(kept, e)),
                }
            }
            self.sink.flush().map_err(|e| fail(kept, e))?;
        }
        self.unsynced = true;
        // What follows can fail too; the lines are in the output by then (kept whole).
        self.after_batch().map_err(|e| fail(batch.len(), e))
    }

    /// Cut a regular file back to its last complete batch.
    fn cut_back(&mut self, error: std::io::Error) -> std::io::Error {
        self.dirty = true;
        if let Err(e) = self.repair() {
            let _ = writeln!(
                std::io::stderr(),
                "audit: cannot cut a partly written batch yet ({e}); it is cut before the next write"
            );
        }
        error
    }

    /// Cut what a failed write left after the last complete batch.
    fn repair(&mut self) -> std::io::Result<()> {
        if !self.dirty {
            return Ok(());
        }
        if let Some(f) = self.file.as_mut() {
            f.set_len(self.committed)?;
            f.seek(SeekFrom::Start(self.committed))?;
        }
        self.dirty = false;
        Ok(())
    }

    /// Open the path again when it no longer names the file written to (deleted, or moved
    /// away without the reopen signal).
    fn follow_path(&mut self) -> std::io::Result<()> {
        let (Some(path), Some(file)) = (&self.path, &self.file) else {
            return Ok(());
        };
        let now = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
        if now.is_some() && now == regular(file) {
            return Ok(());
        }
        self.reopen()
    }

    /// Sync if due, and rotate if the file is full.
    fn after_batch(&mut self) -> std::io::Result<()> {
        let due = match self.fsync {
            Fsync::Never => false,
            Fsync::EveryRecord => true,
            Fsync::Interval(d) => self.last_sync.elapsed() >= d,
        };
        if due {
            self.sync()?;
        }
        if let (Some(r), Some(_)) = (self.rotate, &self.path) {
            if self.committed >= r.max_bytes {
                self.rotate_now(r)?;
            }
        }
        Ok(())
    }

    /// Force what was written to disk (a regular file only; a pipe cannot be synced).
    pub fn sync(&mut self) -> std::io::Result<()> {
        if let Some(f) = &self.file {
            if self.unsynced {
                f.sync_data()?;
            }
        }
        self.unsynced = false;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Open the path again (after logrotate moved the file away).
    pub fn reopen(&mut self) -> std::io::Result<()> {
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        let _ = self.sync();
        self.adopt(open_append(&path)?)
    }

    fn rotate_now(&mut self, r: Rotate) -> std::io::Result<()> {
        self.sync()?;
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        let _ = std::fs::remove_file(rotated_name(&path, r.keep));
        for n in (1..r.keep).rev() {
            let from = rotated_name(&path, n);
            if from.exists() {
                std::fs::rename(&from, rotated_name(&path, n + 1))?;
            }
        }
        std::fs::rename(&path, rotated_name(&path, 1))?;
        self.adopt(open_append(&path)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_file_is_opened_again_before_the_next_batch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        let mut out = Output::open(Some(&path), None, Fsync::Never).unwrap();
        out.commit(b"one\n").unwrap();
        std::fs::remove_file(&path).unwrap();
        out.commit(b"two\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two\n");
    }

    /// A stream that takes `room` bytes, then fails: the batch's written bytes are reported.
    struct Full {
        room: usize,
        got: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    }
    impl Write for Full {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.room == 0 {
                return Err(std::io::Error::from_raw_os_error(28));
            }
            let n = b.len().min(self.room);
            self.room -= n;
            self.got.lock().unwrap().extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stream_says_how_much_of_a_failed_batch_went_out() {
        let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut out = Output::other(Box::new(Full {
            room: 5,
            got: got.clone(),
        }));
        let failed = out.commit(b"abc\ndef\n").unwrap_err();
        assert_eq!(failed.kept, 5);
        assert_eq!(failed.error.raw_os_error(), Some(28));
        assert_eq!(&*got.lock().unwrap(), b"abc\nd");
    }
}
