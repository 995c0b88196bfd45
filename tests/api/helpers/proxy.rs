//! A loopback TCP proxy in front of a test's Redis (`TestProxy`): it accepts clients on a
//! free port and opens a connection to Redis for each, then hands both, split in halves, to
//! the test's own rules of what passes, when and in which order. What the proxies of
//! `layout.rs` (cutting a migration's batch) and `redis_trouble.rs` (reordering connections)
//! share; the rules, which differ, stay in those tests.

use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::task::JoinHandle;

/// One client's connection and the one to Redis opened for it, each split in halves.
pub struct ProxiedConnection {
    /// What the client sends.
    pub client_r: OwnedReadHalf,
    /// Where the client reads Redis's answers.
    pub client_w: OwnedWriteHalf,
    /// Redis's answers.
    pub server_r: OwnedReadHalf,
    /// Where Redis reads what is sent on.
    pub server_w: OwnedWriteHalf,
}

/// The listening side of a proxy; it stops accepting when dropped (connections already
/// accepted live on in the tasks the test spawned for them).
pub struct TestProxy {
    port: u16,
    accepting: JoinHandle<()>,
}

impl TestProxy {
    /// Listens on a free loopback port; for each client accepted, connects to Redis at
    /// `redis_port` and passes both connections to `serve` (which spawns what forwards them).
    /// A client whose connection to Redis fails is dropped.
    pub async fn start(
        redis_port: u16,
        mut serve: impl FnMut(ProxiedConnection) + Send + 'static,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepting = tokio::spawn(async move {
            // Bounded: ends when the proxy is dropped (the task is aborted).
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", redis_port)).await else {
                    continue;
                };
                let (client_r, client_w) = client.into_split();
                let (server_r, server_w) = server.into_split();
                serve(ProxiedConnection {
                    client_r,
                    client_w,
                    server_r,
                    server_w,
                });
            }
        });
        Self { port, accepting }
    }

    /// The URL clients connect to Redis by, through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}
