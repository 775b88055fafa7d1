//! The parent's reply head to a `CONNECT`, read without taking a byte past it, so what the
//! origin sends first (an SSH or SMTP banner) stays for the relay.

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The largest reply head accepted from the parent.
const MAX_HEAD: usize = 16 * 1024;

/// The parent's reply head up to and including the blank line, never a byte more: peek, and
/// consume only what belongs to the head.
pub(super) async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut head: Vec<u8> = Vec::with_capacity(256);
    let mut buf = [0u8; 2048];
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the parent closed the connection",
            ));
        }
        // Where the blank line ends, counting bytes already consumed (it may straddle).
        let from = head.len().saturating_sub(3);
        let mut joined = head[from..].to_vec();
        joined.extend_from_slice(&buf[..n]);
        let end = joined.windows(4).position(|w| w == b"\r\n\r\n");
        let take = match end {
            Some(pos) => pos + 4 - (head.len() - from),
            None => n,
        };
        let start = head.len();
        head.resize(start + take, 0);
        stream.read_exact(&mut head[start..]).await?;
        if end.is_some() {
            return Ok(String::from_utf8_lossy(&head).into_owned());
        }
        if head.len() > MAX_HEAD {
            return Err(std::io::Error::other(
                "the parent's reply head is too large",
            ));
        }
    }
}

/// [`read_head`] over TLS: byte by byte out of the TLS layer's own buffer (no system call
/// per byte), so nothing past the blank line is taken from what the relay will read.
pub(super) async fn read_head_buffered<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
) -> std::io::Result<String> {
    let mut head: Vec<u8> = Vec::with_capacity(256);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return Err(std::io::Error::other(
                "the parent's reply head is too large",
            ));
        }
        head.push(stream.read_u8().await?);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    /// The head is consumed up to the blank line and no further, even when it arrives in
    /// pieces that split the blank line.
    #[tokio::test]
    async fn the_head_is_read_to_the_blank_line_and_no_further() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            for piece in [
                &b"HTTP/1.1 200 Connection established\r\n\r"[..],
                b"\nSSH-2.0-banner\r\n",
            ] {
                s.write_all(piece).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            s
        });
        let mut client = TcpStream::connect(addr).await.unwrap();
        let head = read_head(&mut client).await.unwrap();
        assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
        let mut rest = [0u8; 16];
        client.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"SSH-2.0-banner\r\n");
        drop(server);
    }
}
