//! The stdio transport: one JSON-RPC message per line, every line through [`super::admit`].
//!
//! rmcp's own line codec skips a line it cannot parse without a word, so a client that sent
//! one waits forever for its answer; here every such line is answered (`-32700`, `-32600`,
//! `-32602`), and a line longer than [`CLIENT_MESSAGE_BYTES_MAX`] is discarded as it arrives,
//! never held, then answered the same way. A `tools/call`'s `params.idempotencyKey`, which
//! rmcp's model drops, is lifted into `_meta` first (see [`crate::retry`]). On the way out, the
//! typed stand-ins of results are replaced by their raw JSON (see [`crate::lossless`]) and each
//! result's delivery is reported once its line was written and flushed (see
//! [`crate::delivery`]).

use super::{Admission, admit, oversized};
use crate::limits::CLIENT_MESSAGE_BYTES_MAX;
use rmcp::RoleServer;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use std::io;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc};

/// Messages read ahead of the session; the reader waits beyond this.
const READ_AHEAD_MESSAGES_MAX: usize = 16;

/// One line as read: whole, or too long to keep.
enum Line {
    Whole,
    TooLong,
    End,
}

/// Reads one line into `line` (without its newline), keeping at most
/// [`CLIENT_MESSAGE_BYTES_MAX`] bytes: the rest of a longer line is consumed and dropped.
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> io::Result<Line> {
    line.clear();
    let mut too_long = false;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::End,
                (false, false) => Line::Whole,
            });
        }
        let (chunk, used, done) = match memchr::memchr(b'\n', buf) {
            Some(i) => (&buf[..i], i + 1, true),
            None => (buf, buf.len(), false),
        };
        if !too_long {
            if line.len() + chunk.len() > CLIENT_MESSAGE_BYTES_MAX {
                too_long = true;
                *line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        reader.consume(used);
        if done {
            return Ok(if too_long { Line::TooLong } else { Line::Whole });
        }
    }
}

type Writer = Arc<Mutex<Box<dyn AsyncWrite + Send + Unpin>>>;

async fn write_line(writer: &Writer, mut bytes: Vec<u8>) -> io::Result<()> {
    bytes.push(b'\n');
    let mut w = writer.lock().await;
    w.write_all(&bytes).await?;
    w.flush().await
}

/// The transport over a reader and a writer (stdin and stdout for `ring0 serve`).
pub struct DoorStdio {
    incoming: mpsc::Receiver<RxJsonRpcMessage<RoleServer>>,
    writer: Writer,
    stash: Arc<crate::lossless::RawStash>,
}

impl DoorStdio {
    pub fn new(
        reader: impl AsyncRead + Send + Unpin + 'static,
        writer: impl AsyncWrite + Send + Unpin + 'static,
        stash: Arc<crate::lossless::RawStash>,
    ) -> Self {
        let writer: Writer = Arc::new(Mutex::new(Box::new(writer)));
        let (tx, incoming) = mpsc::channel(READ_AHEAD_MESSAGES_MAX);
        let answers = writer.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(reader);
            let mut line = Vec::new();
            loop {
                let admission = match read_line(&mut reader, &mut line).await {
                    Ok(Line::End) | Err(_) => return,
                    Ok(Line::TooLong) => Admission::Answer(oversized()),
                    Ok(Line::Whole) => match crate::retry::lift_wire_bytes(&line) {
                        Some(lifted) => admit(&lifted),
                        None => admit(&line),
                    },
                };
                match admission {
                    Admission::Message(message) => {
                        if tx.send(*message).await.is_err() {
                            return;
                        }
                    }
                    Admission::Answer(answer) => {
                        let bytes = serde_json::to_vec(&answer).unwrap_or_default();
                        if write_line(&answers, bytes).await.is_err() {
                            return;
                        }
                    }
                    Admission::Dropped => {}
                }
            }
        });
        Self {
            incoming,
            writer,
            stash,
        }
    }
}

impl Transport<RoleServer> for DoorStdio {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), io::Error>> + Send + 'static {
        let writer = self.writer.clone();
        let (item, delivery) = crate::delivery::substitute(&self.stash, item);
        async move {
            let bytes = serde_json::to_vec(&item).map_err(io::Error::other)?;
            write_line(&writer, bytes).await?;
            if let Some(d) = delivery {
                d.delivered();
            }
            Ok(())
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        self.incoming.recv().await
    }

    async fn close(&mut self) -> Result<(), io::Error> {
        self.incoming.close();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_line_past_the_bound_is_dropped_as_it_arrives_and_the_next_is_read() {
        let mut input = vec![b'x'; CLIENT_MESSAGE_BYTES_MAX + 10];
        input.extend_from_slice(b"\n{\"a\":1}\n");
        let mut reader = BufReader::new(&input[..]);
        let mut line = Vec::new();
        assert!(matches!(
            read_line(&mut reader, &mut line).await.unwrap(),
            Line::TooLong
        ));
        assert!(line.capacity() <= CLIENT_MESSAGE_BYTES_MAX);
        assert!(matches!(
            read_line(&mut reader, &mut line).await.unwrap(),
            Line::Whole
        ));
        assert_eq!(line, b"{\"a\":1}");
        assert!(matches!(
            read_line(&mut reader, &mut line).await.unwrap(),
            Line::End
        ));
    }

    #[tokio::test]
    async fn a_bad_line_is_answered_on_the_writer() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (server_read, server_write) = tokio::io::split(server);
        let _transport =
            DoorStdio::new(server_read, server_write, crate::lossless::RawStash::new());
        let (mut client_read, mut client_write) = tokio::io::split(client);
        client_write
            .write_all(b"{\"id\":3,\"jsonrpc\n")
            .await
            .unwrap();
        let mut buf = vec![0; 4096];
        let n = client_read.read(&mut buf).await.unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&buf[..n]).unwrap();
        assert_eq!(answer["error"]["code"], -32700);
        assert_eq!(answer["id"], 3);
    }
}
