//! A request body's `Content-Encoding` as the DLP phase reads it ([`super::dlp`]): which
//! coding the headers declare, and the body decoded (bounded) for the scanner.

use std::io::Read;

use super::dlp::DlpError;

/// A request body's `Content-Encoding`, as the DLP reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coding {
    /// None, or `identity`.
    Identity,
    /// `gzip`.
    Gzip,
    /// `deflate`.
    Deflate,
    /// `aws-chunked` alone (SigV4 streaming uploads): framing, not compression; the payload
    /// is scanned as it streams ([`super::aws_chunked`]).
    AwsChunked,
    /// One the proxy cannot undo (`br`, `zstd`, two codings): refused where DLP scans.
    Other(String),
}

impl Coding {
    /// The coding `headers` declare.
    pub fn of(headers: &http::HeaderMap) -> Coding {
        let all: Vec<&[u8]> = headers
            .get_all(http::header::CONTENT_ENCODING)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(|c| c.trim_ascii())
            .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity"))
            .collect();
        match all[..] {
            [] => Coding::Identity,
            [c] if c.eq_ignore_ascii_case(b"gzip") || c.eq_ignore_ascii_case(b"x-gzip") => {
                Coding::Gzip
            }
            [c] if c.eq_ignore_ascii_case(b"deflate") => Coding::Deflate,
            [c] if c.eq_ignore_ascii_case(b"aws-chunked") => Coding::AwsChunked,
            _ => Coding::Other(
                all.iter()
                    .map(|c| String::from_utf8_lossy(c).into_owned())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        }
    }

    /// `body` decoded, at most `max` bytes of it (what the scanner would read anyway); `Err`
    /// when it does not decode.
    pub fn decode(&self, body: &[u8], max: u64) -> Result<Vec<u8>, DlpError> {
        let mut out = Vec::new();
        let read = match self {
            Coding::Identity | Coding::AwsChunked => return Ok(body.to_vec()),
            Coding::Gzip => flate2::read::MultiGzDecoder::new(body)
                .take(max)
                .read_to_end(&mut out),
            Coding::Deflate => flate2::read::ZlibDecoder::new(body)
                .take(max)
                .read_to_end(&mut out),
            Coding::Other(c) => return Err(DlpError::UnknownCoding(c.to_string())),
        };
        read.map(|_| out)
            .map_err(|e| DlpError::Undecodable(crate::policy::cause::of(e)))
    }
}
