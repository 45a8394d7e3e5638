//! A loopback TCP proxy with two switches. Freeze: a network partition that stalls a
//! worker's connections without closing them. While frozen it accepts and connects as usual
//! but moves no byte in either direction (what it has read it holds; the kernel buffers fill
//! up), so both ends see a silent peer, not a reset. Thawed, everything held flows on — late
//! writes included. Refuse: new connections are closed as soon as they are accepted, while
//! the open ones carry on (a server that is out of connection slots, or a firewall blip that
//! only hits new flows). Its tasks live in a `JoinSet` that is aborted when the proxy is
//! dropped.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::Result;

pub(crate) struct Proxy {
    port: u16,
    frozen: watch::Sender<bool>,
    refusing: Arc<AtomicBool>,
    /// Connections closed unserved while refusing.
    refused: Arc<AtomicU64>,
    /// The accept loop; it owns the connections' tasks, so aborting it ends them all.
    tasks: JoinSet<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream_port`.
    pub(crate) async fn start(upstream_port: u16) -> Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let port = listener.local_addr()?.port();
        let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port));
        let (frozen, watch) = watch::channel(false);
        let refusing = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicU64::new(0));
        let mut tasks = JoinSet::new();
        tasks.spawn(accept_loop(
            listener,
            upstream,
            watch,
            Arc::clone(&refusing),
            Arc::clone(&refused),
        ));
        Ok(Proxy {
            port,
            frozen,
            refusing,
            refused,
            tasks,
        })
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Stops (true) or resumes (false) forwarding on every connection, present and future.
    pub(crate) fn set_frozen(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    /// Closes (true) every new connection as soon as it is accepted, or serves them again
    /// (false); open connections are not touched either way.
    pub(crate) fn set_refusing(&self, refusing: bool) {
        self.refusing.store(refusing, Ordering::SeqCst);
    }

    /// How many connections were refused so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    frozen: watch::Receiver<bool>,
    refusing: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                if refusing.load(Ordering::SeqCst) {
                    // Closed at once: the client's startup reads end-of-file.
                    refused.fetch_add(1, Ordering::SeqCst);
                    drop(client);
                    continue;
                }
                let frozen = frozen.clone();
                connections.spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else { return };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pump(client_read, server_write, frozen.clone()),
                        pump(server_read, client_write, frozen),
                    );
                });
            }
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Copies `from` to `to`, holding still while frozen: no read starts and nothing read is
/// written until thawed.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut frozen: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            // A freeze that begins during the read: go back and wait.
            _ = frozen.wait_for(|f| *f) => continue,
        };
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
