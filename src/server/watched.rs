//! The connection's stream as the watchdog sees it: every write passes through [`Watched`],
//! which tells answer bytes from HTTP/2 control frames ([`Frames`]) and notes the former, so a
//! peer that only provokes PINGs or SETTINGS acknowledgements counts as silent.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::activity::Activity;

/// Which bytes the server writes belong to answers. Over HTTP/1 all of them; over HTTP/2 those
/// of HEADERS, CONTINUATION and DATA frames on a stream, not control frames (SETTINGS, PING,
/// GOAWAY, WINDOW_UPDATE), which a peer can provoke without asking anything.
#[derive(Debug, Default)]
pub(super) struct Frames {
    /// `None` until the first byte written tells: an HTTP/1 answer starts with `H`, an HTTP/2
    /// server starts with a SETTINGS frame, whose first byte (of a 24-bit length) is 0.
    http2: Option<bool>,
    /// The frame header being written, and how much of it.
    header: [u8; 9],
    header_len: usize,
    /// Payload bytes of the current frame still to come.
    payload_left: usize,
    /// Whether the current frame is part of an answer.
    answer: bool,
}

impl Frames {
    /// Follows `bytes` (just written); whether any of them belongs to an answer.
    pub(super) fn written(&mut self, mut bytes: &[u8]) -> bool {
        let Some(&first) = bytes.first() else {
            return false;
        };
        if !*self.http2.get_or_insert(first != b'H') {
            return true;
        }
        let mut answer = false;
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                answer |= self.answer;
                self.payload_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
            self.header_len += n;
            bytes = &bytes[n..];
            if self.header_len == 9 {
                let h = self.header;
                self.header_len = 0;
                self.payload_left =
                    usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                // DATA, HEADERS, CONTINUATION.
                self.answer = stream != 0 && matches!(h[3], 0x0 | 0x1 | 0x9);
                answer |= self.answer;
            }
        }
        answer
    }
}

/// The connection's stream, noting every answer byte written for the idle and stalled-peer
/// rules.
pub(super) struct Watched<S> {
    pub(super) inner: S,
    pub(super) activity: Arc<Activity>,
    pub(super) frames: Frames,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> Watched<S> {
    fn note(&mut self, written: &[u8]) {
        if self.frames.written(written) {
            self.activity.wrote_answer();
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = res {
            self.note(&buf[..n]);
        }
        res
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = res {
            for buf in bufs {
                if n == 0 {
                    break;
                }
                let take = n.min(buf.len());
                self.note(&buf[..take]);
                n -= take;
            }
        }
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HTTP/2 frames as a server writes them: a SETTINGS frame, a PING acknowledgement, then a
    /// HEADERS frame of stream 1, split at awkward places.
    #[test]
    fn only_answer_frames_count_as_answer_bytes() {
        let settings = [0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100];
        let ping_ack = [0, 0, 8, 0x6, 0x1, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let headers = [0, 0, 1, 0x1, 0x4, 0, 0, 0, 1, 0x88];
        let mut frames = Frames::default();
        assert!(!frames.written(&settings));
        assert!(!frames.written(&ping_ack[..5]));
        assert!(!frames.written(&ping_ack[5..]));
        assert!(!frames.written(&[]));
        assert!(!frames.written(&headers[..4]));
        assert!(frames.written(&headers[4..]));
        // A DATA frame's payload written on its own still counts.
        let mut frames = Frames::default();
        assert!(!frames.written(&settings));
        assert!(frames.written(&[0, 0, 4, 0x0, 0, 0, 0, 0, 3]));
        assert!(frames.written(b"body"));
        assert!(!frames.written(&ping_ack));
        // HTTP/1: every byte is an answer's.
        let mut frames = Frames::default();
        assert!(frames.written(b"HTTP/1.1 200 OK\r\n"));
        assert!(frames.written(&[0]));
    }
}
