//! Small helpers for the `workpump-worker` processes the demo, the benchmark and the fault
//! suite run: a free port for a worker's metrics, the tail of its log, and a scrape of its
//! Prometheus endpoint.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A port on the loopback that is free now (bound and released at once).
pub(crate) fn free_port() -> std::io::Result<SocketAddr> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()
}

/// The last `n` lines of a log file (empty if it cannot be read).
pub(crate) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A Prometheus text scrape: `name{labels}` → value, and how many metrics were described.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    series: BTreeMap<String, f64>,
    /// `# HELP` lines: metrics described.
    pub(crate) described: usize,
}

impl Metrics {
    /// The sum of every series of `name` whose labels contain all of `labels`
    /// (`key="value"` fragments); 0 when there is none.
    pub(crate) fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.series
            .iter()
            .filter(|(series, _)| {
                let (n, rest) = series.split_once('{').unwrap_or((series.as_str(), ""));
                n == name && labels.iter().all(|l| rest.contains(l))
            })
            // Not `.sum()`: an empty f64 sum is -0.0, which prints as "-0".
            .fold(0.0, |sum, (_, v)| sum + v)
    }
}

/// `GET /metrics` of a worker (plain HTTP/1.0 on the loopback), answered with 200 within
/// `within`. The error says what went wrong, naming the address.
pub(crate) async fn scrape(addr: SocketAddr, within: Duration) -> Result<Metrics, String> {
    let read = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(within, read)
        .await
        .map_err(|_| format!("scraping {addr}: no answer within {within:?}"))?
        .map_err(|e| format!("scraping {addr}: {e}"))?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head.starts_with("HTTP/1.") || !head.contains(" 200") {
        return Err(format!(
            "scraping {addr}: answered {:?}",
            head.lines().next().unwrap_or_default()
        ));
    }
    let mut metrics = Metrics::default();
    for line in body.lines() {
        if line.starts_with("# HELP ") {
            metrics.described += 1;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        if let Some((series, value)) = line.rsplit_once(' ') {
            if let Ok(v) = value.parse::<f64>() {
                metrics.series.insert(series.to_owned(), v);
            }
        }
    }
    Ok(metrics)
}
