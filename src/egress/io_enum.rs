//! [`delegate_io!`]: `AsyncRead` and `AsyncWrite` for an enum of streams (the client side,
//! [`crate::relay::client_io::ClientIo`], and the destination side,
//! [`crate::egress::server_io::ServerIo`]), each call passed to the variant it holds.

/// Implement `AsyncRead` and `AsyncWrite` for `$ty`, whose variants (`$var`) each hold one
/// stream (boxed or not) that implements both and is `Unpin`.
macro_rules! delegate_io {
    ($ty:ident { $($var:ident),+ $(,)? }) => {
        impl tokio::io::AsyncRead for $ty {
            fn poll_read(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                match self.get_mut() {
                    $($ty::$var(t) => std::pin::Pin::new(t).poll_read(cx, buf),)+
                }
            }
        }

        impl tokio::io::AsyncWrite for $ty {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                match self.get_mut() {
                    $($ty::$var(t) => std::pin::Pin::new(t).poll_write(cx, buf),)+
                }
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                match self.get_mut() {
                    $($ty::$var(t) => std::pin::Pin::new(t).poll_write_vectored(cx, bufs),)+
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $($ty::$var(t) => t.is_write_vectored(),)+
                }
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                match self.get_mut() {
                    $($ty::$var(t) => std::pin::Pin::new(t).poll_flush(cx),)+
                }
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                match self.get_mut() {
                    $($ty::$var(t) => std::pin::Pin::new(t).poll_shutdown(cx),)+
                }
            }
        }
    };
}

pub(crate) use delegate_io;
