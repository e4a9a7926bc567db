//! `tessera status`: a task's devices, over plain text or TLS, with the cluster token.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use clap::Args;
use tessera::error::error_chain;
use tessera::proto::worker_service_client::WorkerServiceClient;
use tessera::proto::{DeviceAttributes, GetStatusRequest};
use tessera::security::{ClusterToken, Security, TlsConfig};
use tessera::wire::MAX_MESSAGE_BYTES;

/// How `tessera status` reaches a task that serves TLS or checks the cluster token.
#[derive(Debug, Args)]
pub(crate) struct SecurityArgs {
    /// Connect over TLS, checking the task's certificate against this CA file (PEM).
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// This client's certificate (PEM), for a task that requires client certificates.
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// The key of --cert (PEM).
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Check the task's certificate against this name instead of the target's host.
    #[arg(long, value_name = "NAME")]
    server_name: Option<String>,
    /// Send the cluster token read from this file.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

impl SecurityArgs {
    /// Reads the files named; `tls` says whether the target asked for TLS.
    fn load(&self, tls: bool) -> anyhow::Result<Security> {
        let tls = match (&self.ca, tls) {
            (None, false) => {
                if self.cert.is_some() || self.server_name.is_some() {
                    bail!("--cert and --server-name need TLS: pass --ca with the cluster's CA");
                }
                None
            }
            (None, true) => bail!(
                "a grpcs:// target needs --ca FILE, the CA that signed the task's certificate"
            ),
            (Some(ca), _) => {
                let mut tls = TlsConfig::new(ca)?;
                if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
                    tls = tls.with_identity(cert, key)?;
                }
                if let Some(name) = &self.server_name {
                    tls = tls.server_name(name);
                }
                Some(tls)
            }
        };
        let token = match &self.token_file {
            Some(path) => Some(ClusterToken::from_file(path)?),
            None => None,
        };
        Ok(Security { tls, token })
    }
}

/// `tessera status TARGET`: prints the task's devices as a table.
pub(crate) fn status(
    target: &str,
    timeout: Duration,
    security: &SecurityArgs,
) -> anyhow::Result<()> {
    let (host_port, tls) = match target.split_once("://") {
        Some(("grpc", rest)) => (rest, false),
        Some(("grpcs" | "https", rest)) => (rest, true),
        Some(_) => ("", false),
        None => (target, false),
    };
    if host_port.is_empty() || host_port.contains("://") {
        bail!("bad target `{target}`: expected grpc://HOST:PORT, or grpcs://HOST:PORT for TLS");
    }
    let security = security.load(tls)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot build the client runtime")?;
    let devices = runtime
        .block_on(async {
            tokio::time::timeout(timeout, get_status(host_port, timeout, &security))
                .await
                .map_err(|_| anyhow!("no answer within {timeout:?}"))?
        })
        .with_context(|| format!("task at {target}"))?;
    print!("{}", device_table(&devices));
    Ok(())
}

/// Asks the task for its devices. A connection that fails says what to check about TLS (a
/// plain-text client to a TLS task sees only a broken connection); a status the task sent,
/// such as UNAUTHENTICATED, is shown as it is.
async fn get_status(
    host_port: &str,
    timeout: Duration,
    security: &Security,
) -> anyhow::Result<Vec<DeviceAttributes>> {
    let unreachable = |cause: String| anyhow!("unreachable: {cause}; {}", security.connect_hint());
    let channel = security
        .endpoint(host_port)?
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await
        .map_err(|e| unreachable(error_chain(&e)))?;
    let reply = WorkerServiceClient::new(security.attach(channel))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .get_status(GetStatusRequest {})
        .await
        .map_err(|status| {
            if std::error::Error::source(&status).is_some() {
                unreachable(error_chain(&status))
            } else {
                anyhow::Error::from(tessera::Status::from(status))
            }
        })?;
    Ok(reply.into_inner().device_attributes)
}

/// Formats devices as `NAME TYPE MEMORY INCARNATION` rows, columns padded to fit.
fn device_table(devices: &[DeviceAttributes]) -> String {
    let rows: Vec<[String; 4]> = devices
        .iter()
        .map(|d| {
            [
                d.name.clone(),
                d.device_type.clone(),
                human_bytes(d.memory_limit),
                format!("{:#018x}", d.incarnation),
            ]
        })
        .collect();
    let header = ["NAME", "TYPE", "MEMORY", "INCARNATION"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let line = format!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `268435456` → `256.0 MiB`.
fn human_bytes(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_print_in_binary_units() {
        assert_eq!(human_bytes(268_435_456), "256.0 MiB");
        assert_eq!(human_bytes(85_899_345_920), "80.0 GiB");
        assert_eq!(human_bytes(512), "512 B");
    }

    #[test]
    fn the_table_aligns_columns() {
        let devices = [DeviceAttributes {
            name: "/job:ps/replica:0/task:0/device:CPU:0".into(),
            device_type: "CPU".into(),
            memory_limit: 268_435_456,
            incarnation: 0xab,
            ..Default::default()
        }];
        assert_eq!(
            device_table(&devices),
            "NAME                                   TYPE     MEMORY  INCARNATION\n\
             /job:ps/replica:0/task:0/device:CPU:0  CPU   256.0 MiB  0x00000000000000ab\n"
        );
    }
}
