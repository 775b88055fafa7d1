//! The data of an `aws-chunked` request body, for the DLP phase (review 97 G4): SigV4
//! streaming uploads (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD`, `STREAMING-UNSIGNED-PAYLOAD-TRAILER`)
//! frame the payload as `size[;chunk-signature=…]\r\n` + data + `\r\n`, ending with a zero-size
//! chunk and, for the trailer variants, trailer lines. The scanner reads the data (and the
//! trailer lines) without the framing, so a key split by a chunk header is still found; the
//! bytes go upstream as they came. Framing that does not read is an error: not scanned, not
//! passed. Streaming: nothing is held but a chunk header line.

/// The longest chunk header or trailer line read.
const MAX_LINE: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a chunk header line.
    Header,
    /// This many data bytes of the current chunk remain.
    Data(u64),
    /// The CRLF after a chunk's data: bytes still to skip.
    DataEnd(u8),
    /// Trailer lines after the final chunk, up to an empty line.
    Trailers,
    Done,
}

/// The de-framer of one body.
#[derive(Debug)]
pub struct AwsChunks {
    state: State,
    line: Vec<u8>,
}

impl Default for AwsChunks {
    fn default() -> Self {
        AwsChunks {
            state: State::Header,
            line: Vec::new(),
        }
    }
}

impl AwsChunks {
    /// Feed bytes of the body; each piece of payload (or trailer line) they held is given to
    /// `scan`. `Err` when the framing does not read.
    pub fn push<E>(
        &mut self,
        mut data: &[u8],
        scan: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<Result<(), E>, &'static str> {
        while !data.is_empty() {
            match self.state {
                State::Done => return Err("bytes after the end of an aws-chunked body"),
                State::Data(left) => {
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(data.len());
                    if let Err(e) = scan(&data[..n]) {
                        return Ok(Err(e));
                    }
                    data = &data[n..];
                    self.state = match left - n as u64 {
                        0 => State::DataEnd(2),
                        rest => State::Data(rest),
                    };
                }
                State::DataEnd(k) => {
                    let want = &b"\r\n"[2 - usize::from(k)..];
                    let n = want.len().min(data.len());
                    if data[..n] != want[..n] {
                        return Err("an aws-chunked chunk does not end where its size says");
                    }
                    data = &data[n..];
                    self.state = match usize::from(k) - n {
                        0 => State::Header,
                        k => State::DataEnd(k as u8),
                    };
                }
                State::Header | State::Trailers => {
                    let Some(end) = data.iter().position(|b| *b == b'\n') else {
                        self.line.extend_from_slice(data);
                        if self.line.len() > MAX_LINE {
                            return Err("an aws-chunked header line is too long");
                        }
                        return Ok(Ok(()));
                    };
                    self.line.extend_from_slice(&data[..=end]);
                    data = &data[end + 1..];
                    let line = std::mem::take(&mut self.line);
                    let Some(line) = line.strip_suffix(b"\r\n") else {
                        return Err("an aws-chunked line does not end in CRLF");
                    };
                    if line.len() > MAX_LINE {
                        return Err("an aws-chunked header line is too long");
                    }
                    if self.state == State::Trailers {
                        if line.is_empty() {
                            self.state = State::Done;
                        } else if let Err(e) = scan(line) {
                            return Ok(Err(e));
                        }
                        continue;
                    }
                    let size = line.split(|b| *b == b';').next().unwrap_or(b"");
                    let size = std::str::from_utf8(size)
                        .ok()
                        .and_then(|s| u64::from_str_radix(s, 16).ok())
                        .ok_or("an aws-chunked chunk size cannot be read")?;
                    self.state = match size {
                        0 => State::Trailers,
                        n => State::Data(n),
                    };
                }
            }
        }
        Ok(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(body: &[u8], piece: usize) -> Result<Vec<u8>, &'static str> {
        let mut d = AwsChunks::default();
        let mut out = Vec::new();
        for p in body.chunks(piece) {
            let _ = d.push(p, &mut |b: &[u8]| {
                out.extend_from_slice(b);
                Ok::<(), ()>(())
            })?;
        }
        Ok(out)
    }

    #[test]
    fn the_payload_is_read_without_its_framing_at_every_split() {
        let sig = "a".repeat(64);
        let body = format!(
            "5;chunk-signature={sig}\r\nAKIAQ\r\n3;chunk-signature={sig}\r\nWER\r\n0;chunk-signature={sig}\r\n\r\n"
        );
        let trailer = "5\r\nAKIAQ\r\n3\r\nWER\r\n0\r\nx-amz-checksum-crc32:AAAA\r\n\r\n";
        for piece in 1..body.len() {
            assert_eq!(
                payload(body.as_bytes(), piece).unwrap(),
                b"AKIAQWER",
                "{piece}"
            );
            assert_eq!(
                payload(trailer.as_bytes(), piece).unwrap(),
                b"AKIAQWERx-amz-checksum-crc32:AAAA",
                "{piece}"
            );
        }
        for bad in [
            &b"zz\r\nab\r\n"[..],
            b"2\r\nabX\r\n",
            b"0\r\n\r\nmore",
            b"2\nab\r\n",
        ] {
            assert!(payload(bad, 100).is_err(), "{bad:?}");
        }
    }
}
