//! Files a configuration names besides itself — secrets, a parent proxy's CA — read relative
//! to the configuration's directory unless absolute, with one typed error that names the
//! path (never the contents).

use std::path::{Path, PathBuf};

/// A named file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {}: {source}", path.display())]
pub struct ReadError {
    /// The file.
    pub path: PathBuf,
    /// Why it could not be read.
    #[source]
    pub source: std::io::Error,
}

/// How the parts of a configuration read the files it names (tests pass their own).
pub type ReadFile<'a> = &'a dyn Fn(&str) -> Result<String, ReadError>;

/// `f` relative to `base` unless it is absolute.
pub fn path_in(base: &Path, f: &str) -> PathBuf {
    // A file beside a config given as `x.yaml` is `f`, not `./f` (nor `./../f`).
    if Path::new(f).is_absolute() || base.as_os_str().is_empty() || base == Path::new(".") {
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

/// Why a PEM file an operator names as extra roots holds no usable certificate.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// Not readable as PEM.
    #[error("not readable as PEM: {0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    /// An invalid certificate.
    #[error("an invalid certificate: {0}")]
    Certificate(#[from] rustls::Error),
    /// No certificate in it.
    #[error("no PEM certificate in it")]
    Empty,
}

/// The certificates in `pem` — at least one, each usable as a trust anchor: what an
/// operator's CA file describes. Roots are built from them at run time
/// ([`crate::egress::roots`]).
pub fn certificates(
    pem: &[u8],
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, PemError> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let certs = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>()?;
    if certs.is_empty() {
        return Err(PemError::Empty);
    }
    let mut check = rustls::RootCertStore::empty();
    for c in &certs {
        check.add(c.clone())?;
    }
    Ok(certs)
}

/// Write `bytes` to `path` whole: a temporary file beside it, synced, renamed over it — a
/// crash leaves the previous file or the new one, never half of either (the files kept in
/// `state_dir`).
pub fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)
}
