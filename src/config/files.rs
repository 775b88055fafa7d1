//! Files a configuration names besides itself — secrets, a parent proxy's CA — read relative
//! to the configuration's directory unless absolute, with one typed error that names the
//! path (never the contents).

use std::path::{Path, PathBuf};

/// A named file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {}: {source}", path.display())]
pub struct ReadError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// How the parts of a configuration read the files it names (tests pass their own).
pub type ReadFile<'a> = &'a dyn Fn(&str) -> Result<String, ReadError>;

/// `f` relative to `base` unless it is absolute.
pub fn path_in(base: &Path, f: &str) -> PathBuf {
    if Path::new(f).is_absolute() {
        PathBuf::from(f)
    } else {
        base.join(f)
    }
}

/// Read `f` (relative to `base` unless absolute).
pub fn read_in(base: &Path, f: &str) -> Result<String, ReadError> {
    let path = path_in(base, f);
    std::fs::read_to_string(&path).map_err(|source| ReadError { path, source })
}
