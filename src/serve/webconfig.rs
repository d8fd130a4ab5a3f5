//! `--web-config FILE`: TLS and basic authentication in the format of the
//! Prometheus exporters' web configuration file (exporter-toolkit), so a
//! fleet configures kheap like its other exporters:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt
//!   key_file: server.key
//!   client_auth_type: RequireAndVerifyClientCert   # optional
//!   client_ca_file: ca.crt                         # optional
//!   min_version: TLS12                             # optional
//! basic_auth_users:
//!   prometheus: $2y$10$...                         # bcrypt
//! ```
//!
//! Relative paths are relative to the file's directory. Keys kheap does not
//! implement are refused by name rather than ignored: a setting that
//! silently does nothing is worse than an error.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use yaml_rust2::{Yaml, YamlLoader};

/// The largest web config, certificate or key file read (they are a few
/// KiB; a bound keeps a wrong path such as /dev/zero from eating memory).
const FILE_LIMIT: u64 = 1024 * 1024;

/// Client certificates, as exporter-toolkit names the policies kheap
/// implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    NoClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

/// A loaded web config: what the server applies to each connection.
#[derive(Clone, Default)]
pub struct WebConfig {
    pub tls: Option<Arc<ServerConfig>>,
    client_auth: Option<ClientAuth>,
    /// (user, bcrypt hash)
    users: Vec<(String, String)>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("client_auth", &self.client_auth)
            .field("users", &self.users.len())
            .finish()
    }
}

impl WebConfig {
    /// Whether every request must prove who sends it (a password or a
    /// verified client certificate).
    pub fn authenticates(&self) -> bool {
        !self.users.is_empty() || self.client_auth == Some(ClientAuth::RequireAndVerifyClientCert)
    }

    /// Whether basic authentication is asked for.
    pub fn wants_password(&self) -> bool {
        !self.users.is_empty()
    }

    /// Whether an `Authorization` header's credentials are those of a
    /// configured user (true when no users are configured).
    pub fn password_ok(&self, authorization: Option<&str>) -> bool {
        if self.users.is_empty() {
            return true;
        }
        let Some((user, password)) = authorization.and_then(basic_credentials) else {
            return false;
        };
        match self.users.iter().find(|(u, _)| *u == user) {
            Some((_, hash)) => bcrypt::verify(password.as_bytes(), hash).unwrap_or(false),
            None => {
                // As long as a wrong password takes: a user name cannot be
                // told from the time of the answer.
                let _ = bcrypt::verify(password.as_bytes(), &self.users[0].1);
                false
            }
        }
    }

    /// One line saying what is on: for the start and reload messages.
    pub fn describe(&self) -> String {
        let tls = match (&self.tls, self.client_auth) {
            (None, _) => "plain HTTP".to_string(),
            (Some(_), Some(ClientAuth::RequireAndVerifyClientCert)) => {
                "TLS, client certificates required".to_string()
            }
            (Some(_), Some(ClientAuth::VerifyClientCertIfGiven)) => {
                "TLS, client certificates verified if given".to_string()
            }
            (Some(_), _) => "TLS".to_string(),
        };
        match self.users.len() {
            0 => format!("{tls}, no basic auth"),
            n => format!(
                "{tls}, basic auth ({n} user{})",
                if n == 1 { "" } else { "s" }
            ),
        }
    }

    /// Reads and checks `path` (and the files it names).
    pub fn load(path: &Path) -> Result<WebConfig> {
        let text =
            read_bounded(path).with_context(|| format!("--web-config {}", path.display()))?;
        let text = String::from_utf8(text)
            .map_err(|_| anyhow!("--web-config {}: not UTF-8 text", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        parse(&text, dir).with_context(|| format!("--web-config {}", path.display()))
    }
}

/// (user, password) of a `Basic` authorization header.
fn basic_credentials(header: &str) -> Option<(String, String)> {
    let (scheme, encoded) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    // Never blocks on a FIFO; anything but a regular file is refused.
    let file = crate::input::open_nonblocking(path).context("cannot open it")?;
    let meta = file.metadata().context("cannot read it")?;
    if !meta.is_file() {
        bail!("not a regular file (a directory, named pipe, socket or device): give a file");
    }
    let mut bytes = Vec::new();
    file.take(FILE_LIMIT + 1)
        .read_to_end(&mut bytes)
        .context("cannot read it")?;
    if bytes.len() as u64 > FILE_LIMIT {
        bail!(
            "larger than {} KiB: not a web config, certificate or key",
            FILE_LIMIT / 1024
        );
    }
    Ok(bytes)
}

fn string(v: &Yaml, key: &str) -> Result<String> {
    match v {
        Yaml::String(s) => Ok(s.clone()),
        _ => bail!("{key}: expected a string"),
    }
}

/// The entries of a YAML mapping, with string keys; a null (an empty
/// section) is an empty mapping.
fn mapping<'a>(v: &'a Yaml, what: &str) -> Result<Vec<(String, &'a Yaml)>> {
    match v {
        Yaml::Hash(h) => h.iter().map(|(k, v)| Ok((string(k, what)?, v))).collect(),
        Yaml::Null => Ok(Vec::new()),
        _ => bail!("{what}: expected a mapping"),
    }
}

/// Refuses YAML aliases (`*name`) before the document is loaded: the
/// loader copies the anchored node for each alias, so 600 bytes of nested
/// aliases grew to gigabytes. A web config has no use for them; without
/// them the parsed document is no larger than its (bounded) text.
fn refuse_aliases(text: &str) -> Result<()> {
    use yaml_rust2::parser::{Event, Parser};
    let mut parser = Parser::new_from_str(text);
    loop {
        match parser.next_token() {
            Ok((Event::StreamEnd, _)) => return Ok(()),
            Ok((Event::Alias(_), mark)) => bail!(
                "line {}: YAML aliases (*name) are not accepted in a web config: write the value out",
                mark.line()
            ),
            Ok(_) => {}
            // The loader says it, with the same words as before.
            Err(_) => return Ok(()),
        }
    }
}

/// The bcrypt costs accepted: below 4 bcrypt refuses to hash; above 14 one
/// login takes seconds of a worker's time (2^cost rounds), and a few wrong
/// guesses would stall every worker.
const BCRYPT_COSTS: std::ops::RangeInclusive<u32> = 4..=14;

/// Checks one basic_auth_users hash: a bcrypt hash with a cost in range.
fn check_hash(user: &str, hash: &str) -> Result<()> {
    // $2b$NN$...: the cost is said before the rest is parsed (bcrypt's
    // parser refuses costs past 31 without saying which).
    if let Some(cost) = hash.split('$').nth(2).and_then(|c| c.parse::<u32>().ok()) {
        if !BCRYPT_COSTS.contains(&cost) {
            bail!(
                "basic_auth_users.{user}: bcrypt cost {cost} is outside {}-{}: make the hash with `htpasswd -nBC 10 {user}`",
                BCRYPT_COSTS.start(),
                BCRYPT_COSTS.end()
            );
        }
    }
    hash.parse::<bcrypt::HashParts>().map_err(|e| {
        anyhow!("basic_auth_users.{user}: not a bcrypt hash ({e}); make one with `htpasswd -nBC 10 {user}`")
    })?;
    Ok(())
}

fn parse(text: &str, dir: &Path) -> Result<WebConfig> {
    refuse_aliases(text)?;
    let docs = YamlLoader::load_from_str(text).map_err(|e| anyhow!("not YAML: {e}"))?;
    let mut config = WebConfig::default();
    let Some(root) = docs.first() else {
        // An empty file: plain HTTP, no authentication (as the toolkit).
        return Ok(config);
    };
    if docs.len() > 1 {
        bail!("more than one YAML document");
    }
    for (key, value) in mapping(root, "the file")? {
        match key.as_str() {
            "tls_server_config" => {
                let (tls, auth) = tls_config(value, dir)?;
                config.tls = tls;
                config.client_auth = auth;
            }
            "basic_auth_users" => {
                for (user, hash) in mapping(value, "basic_auth_users")? {
                    let hash = string(hash, &format!("basic_auth_users.{user}"))?;
                    check_hash(&user, &hash)?;
                    config.users.push((user, hash));
                }
            }
            "http_server_config" => {
                if !mapping(value, "http_server_config")?.is_empty() {
                    bail!("http_server_config is not supported by kheap serve (it speaks HTTP/1.1 and sets its own headers): remove it");
                }
            }
            other => bail!(
                "unknown key {other:?}: kheap serve knows tls_server_config and basic_auth_users"
            ),
        }
    }
    Ok(config)
}

type Tls = (Option<Arc<ServerConfig>>, Option<ClientAuth>);

fn tls_config(section: &Yaml, dir: &Path) -> Result<Tls> {
    let entries = mapping(section, "tls_server_config")?;
    if entries.is_empty() {
        return Ok((None, None));
    }
    let (mut cert, mut key, mut ca, mut auth) = (None, None, None, None);
    let (mut min, mut max) = (None, None);
    for (name, value) in entries {
        let at = format!("tls_server_config.{name}");
        let path = |v: &Yaml| -> Result<PathBuf> { Ok(dir.join(string(v, &at)?)) };
        match name.as_str() {
            "cert_file" => cert = Some(path(value)?),
            "key_file" => key = Some(path(value)?),
            "client_ca_file" => ca = Some(path(value)?),
            "client_auth_type" => {
                auth = Some(match string(value, &at)?.as_str() {
                    "NoClientCert" => ClientAuth::NoClientCert,
                    "VerifyClientCertIfGiven" => ClientAuth::VerifyClientCertIfGiven,
                    "RequireAndVerifyClientCert" => ClientAuth::RequireAndVerifyClientCert,
                    t @ ("RequestClientCert" | "RequireAnyClientCert") => bail!(
                        "{at}: {t} accepts certificates nobody verified and is not supported: use VerifyClientCertIfGiven or RequireAndVerifyClientCert"
                    ),
                    t => bail!("{at}: unknown type {t:?}"),
                })
            }
            "min_version" => min = Some(tls_version(&string(value, &at)?, &at)?),
            "max_version" => max = Some(tls_version(&string(value, &at)?, &at)?),
            other => bail!(
                "{at}: not supported by kheap serve (it knows cert_file, key_file, client_ca_file, client_auth_type, min_version, max_version): remove {other}"
            ),
        }
    }
    let (Some(cert), Some(key)) = (cert, key) else {
        bail!("tls_server_config needs both cert_file and key_file");
    };
    let auth = auth.unwrap_or(ClientAuth::NoClientCert);
    match (auth, &ca) {
        (ClientAuth::NoClientCert, Some(_)) => bail!(
            "tls_server_config: client_ca_file is set but client_auth_type is not: set client_auth_type to RequireAndVerifyClientCert or VerifyClientCertIfGiven"
        ),
        (ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert, None) => {
            bail!("tls_server_config: client_auth_type verifies client certificates and needs client_ca_file")
        }
        _ => {}
    }
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = rustls::ALL_VERSIONS
        .iter()
        .copied()
        .filter(|v| {
            let n = version_rank(v.version);
            min.is_none_or(|m| n >= m) && max.is_none_or(|m| n <= m)
        })
        .collect();
    if versions.is_empty() {
        bail!("tls_server_config: min_version is above max_version");
    }

    let certs = CertificateDer::pem_slice_iter(
        &read_bounded(&cert).with_context(|| format!("cert_file {}", cert.display()))?,
    )
    .collect::<Result<Vec<_>, _>>()
    .map_err(|e| anyhow!("cert_file {}: not PEM certificates ({e})", cert.display()))?;
    if certs.is_empty() {
        bail!("cert_file {}: no certificate in it", cert.display());
    }
    let private = PrivateKeyDer::from_pem_slice(
        &read_bounded(&key).with_context(|| format!("key_file {}", key.display()))?,
    )
    .map_err(|e| anyhow!("key_file {}: not a PEM private key ({e})", key.display()))?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .context("tls_server_config")?;
    let builder = match (auth, ca) {
        (ClientAuth::NoClientCert, _) | (_, None) => builder.with_no_client_auth(),
        (auth, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            let pem =
                read_bounded(&ca).with_context(|| format!("client_ca_file {}", ca.display()))?;
            for c in CertificateDer::pem_slice_iter(&pem) {
                let c = c.map_err(|e| {
                    anyhow!(
                        "client_ca_file {}: not PEM certificates ({e})",
                        ca.display()
                    )
                })?;
                roots
                    .add(c)
                    .map_err(|e| anyhow!("client_ca_file {}: {e}", ca.display()))?;
            }
            if roots.is_empty() {
                bail!("client_ca_file {}: no certificate in it", ca.display());
            }
            let mut verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            if auth == ClientAuth::VerifyClientCertIfGiven {
                verifier = verifier.allow_unauthenticated();
            }
            let verifier = verifier
                .build()
                .map_err(|e| anyhow!("client_ca_file {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut server = builder.with_single_cert(certs, private).map_err(|e| {
        anyhow!(
            "cert_file {} and key_file {}: {e}",
            cert.display(),
            key.display()
        )
    })?;
    // HTTP/1.1 only: a client asking for h2 by ALPN falls back to it.
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((Some(Arc::new(server)), Some(auth)))
}

fn version_rank(v: rustls::ProtocolVersion) -> u8 {
    match v {
        rustls::ProtocolVersion::TLSv1_2 => 12,
        rustls::ProtocolVersion::TLSv1_3 => 13,
        _ => 0,
    }
}

fn tls_version(s: &str, at: &str) -> Result<u8> {
    match s {
        "TLS12" => Ok(12),
        "TLS13" => Ok(13),
        "TLS10" | "TLS11" => bail!("{at}: {s} is not supported (kheap speaks TLS 1.2 and 1.3)"),
        _ => bail!("{at}: unknown version {s:?} (TLS12 or TLS13)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_err(text: &str) -> String {
        format!("{:#}", parse(text, Path::new("/nonexistent")).unwrap_err())
    }

    #[test]
    fn basic_auth_users_are_checked_with_bcrypt() {
        let hash = bcrypt::hash("secret", 4).unwrap();
        let c = parse(
            &format!("basic_auth_users:\n  alice: '{hash}'\n"),
            Path::new("."),
        )
        .unwrap();
        assert!(c.authenticates() && c.wants_password() && c.tls.is_none());
        let header = |cred: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(cred)
            )
        };
        assert!(c.password_ok(Some(&header("alice:secret"))));
        assert!(!c.password_ok(Some(&header("alice:wrong"))));
        assert!(!c.password_ok(Some(&header("bob:secret"))));
        assert!(!c.password_ok(Some("Bearer x")));
        assert!(!c.password_ok(None));
        assert_eq!(c.describe(), "plain HTTP, basic auth (1 user)");
    }

    #[test]
    fn an_empty_file_is_plain_http() {
        let c = parse("", Path::new(".")).unwrap();
        assert!(!c.authenticates() && c.tls.is_none() && c.password_ok(None));
        let c = parse("tls_server_config:\nbasic_auth_users:\n", Path::new(".")).unwrap();
        assert!(!c.authenticates());
    }

    #[test]
    fn wrong_settings_are_refused_by_name() {
        for (text, says) in [
            ("basic_auth_users:\n  a: plain\n", "not a bcrypt hash"),
            ("tls_server_config:\n  cert_file: a\n", "needs both cert_file and key_file"),
            ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: c\n", "client_auth_type is not"),
            ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
            ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n", "not supported"),
            ("tls_server_config:\n  cipher_suites: [x]\n", "remove cipher_suites"),
            ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS10\n", "not supported"),
            ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n  max_version: TLS12\n", "above max_version"),
            ("tls_server_config:\n  cert_file: a\n  key_file: b\n", "cannot open it"),
            ("tls_config: {}\n", "unknown key"),
            ("[1, 2]\n", "expected a mapping"),
            ("a: [\n", "not YAML"),
            // An alias bomb: refused before anything is expanded.
            (
                "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n",
                "line 2: YAML aliases (*name) are not accepted",
            ),
            (
                "basic_auth_users:\n  a: $2b$31$abcdefghijklmnopqrstuuYzJNb6ABn6Xz9ifLF6ZoZsFbCOHHpNW\n",
                "bcrypt cost 31 is outside 4-14",
            ),
            (
                "basic_auth_users:\n  a: $2b$99$abcdefghijklmnopqrstuuYzJNb6ABn6Xz9ifLF6ZoZsFbCOHHpNW\n",
                "bcrypt cost 99 is outside 4-14",
            ),
            (
                "basic_auth_users:\n  a: $2b$03$abcdefghijklmnopqrstuuYzJNb6ABn6Xz9ifLF6ZoZsFbCOHHpNW\n",
                "bcrypt cost 3 is outside 4-14",
            ),
        ] {
            let e = parse_err(text);
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
