//! The query parameters of a `postgres://` URL: which the driver parses, which are
//! TLS, Rails' or libpq's, and which are unknown; splitting them out of the URL the
//! driver is given, and describing a URL without its password.

use std::str::FromStr;

use tokio_postgres::config::Host;

/// The libpq parameters tokio-postgres does not parse (or parses only partly): taken
/// out of a `postgres://` URL's query and handled by [`crate::tls`].
const TLS_PARAMS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// The query parameters tokio-postgres parses itself (connect_timeout,
/// application_name, keepalives…): left in the URL it is given.
const DRIVER_PARAMS: [&str; 18] = [
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslnegotiation",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// Parameters of a Rails `database.yml` / `DATABASE_URL` (ActiveRecord's PostgreSQL
/// adapter and its connection pool) that mean nothing to the gem's own connections:
/// accepted and ignored, with one log line ([`Config::ignored_url_params`]).
const RAILS_IGNORED: [&str; 21] = [
    "adapter",
    "encoding",
    "timeout",
    "reconnect",
    "checkout_timeout",
    "idle_timeout",
    "reaping_frequency",
    "statement_limit",
    "schema_search_path",
    "min_messages",
    "advisory_locks",
    "insert_returning",
    "schema_dump",
    "replica",
    "database_tasks",
    "collation",
    "ctype",
    "template",
    "owner",
    "allow_concurrency",
    "migrations_paths",
];

/// libpq parameters the driver does not implement: accepted and ignored, with one log
/// line (the connection works without them; TLS is set by the four [`TLS_PARAMS`]).
const LIBPQ_IGNORED: [&str; 20] = [
    "client_encoding",
    "fallback_application_name",
    "sslcompression",
    "sslcrl",
    "sslcrldir",
    "sslpassword",
    "sslsni",
    "sslcertmode",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "requiressl",
    "requirepeer",
    "require_auth",
    "gssencmode",
    "gsslib",
    "gssdelegation",
    "krbsrvname",
    "service",
    "passfile",
    "replication",
];

/// What the gem does with one query parameter of a `postgres://` URL.
#[derive(Debug, Clone, PartialEq)]
pub enum UrlParam {
    /// Parsed by the driver (tokio-postgres): `connect_timeout`, `application_name`…
    Driver,
    /// TLS ([`crate::tls`]): `sslmode`, `sslrootcert`, `sslcert`, `sslkey`.
    Tls,
    /// Rails' `pool`: the pool size unless `pool_size` is set.
    Pool,
    /// Rails' `prepared_statements`: `false` selects unnamed statements (PgBouncer).
    PreparedStatements,
    /// Known to Rails or libpq, meaningless to the gem: ignored, logged once.
    Ignored,
    /// Known to nobody: an error naming it.
    Unknown,
}

impl UrlParam {
    /// How the gem treats the parameter `name` (Rails' `variables[…]` session
    /// variables are ignored: the gem sets its own).
    pub fn of(name: &str) -> UrlParam {
        if DRIVER_PARAMS.contains(&name) {
            UrlParam::Driver
        } else if TLS_PARAMS.contains(&name) {
            UrlParam::Tls
        } else if name == "pool" {
            UrlParam::Pool
        } else if name == "prepared_statements" {
            UrlParam::PreparedStatements
        } else if RAILS_IGNORED.contains(&name)
            || LIBPQ_IGNORED.contains(&name)
            || (name.starts_with("variables[") && name.ends_with(']'))
        {
            UrlParam::Ignored
        } else {
            UrlParam::Unknown
        }
    }
}

/// Every name [`UrlParam::of`] knows, for "did you mean".
pub(super) fn known_url_params() -> impl Iterator<Item = &'static str> {
    DRIVER_PARAMS
        .iter()
        .chain(TLS_PARAMS.iter())
        .chain(["pool", "prepared_statements"].iter())
        .chain(RAILS_IGNORED.iter())
        .chain(LIBPQ_IGNORED.iter())
        .copied()
}

/// Splits the parameters the driver does not parse (TLS, Rails', libpq's others,
/// unknown ones) out of a `postgres://` URL's query, keeping every driver parameter
/// byte for byte. Key/value strings are returned as they are.
pub(super) fn split_params(url: &str) -> (String, Vec<(String, String)>) {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let Some((base, query)) = url.split_once('?').filter(|_| is_url) else {
        return (url.to_string(), Vec::new());
    };
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    for segment in query.split('&').filter(|s| !s.is_empty()) {
        match form_urlencoded::parse(segment.as_bytes()).next() {
            Some((key, value)) if UrlParam::of(&key) != UrlParam::Driver => {
                taken.push((key.into_owned(), value.into_owned()))
            }
            _ => kept.push(segment),
        }
    }
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (url, taken)
}

/// The values of the query parameter `name` in a `postgres://` URL, in order (none for
/// a key/value string: the driver's parse and [`Config::pg_config`](super::Config::pg_config)
/// judge those).
pub(super) fn query_values(url: &str, name: &str) -> Vec<String> {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let Some((_, query)) = url.split_once('?').filter(|_| is_url) else {
        return Vec::new();
    };
    form_urlencoded::parse(query.as_bytes())
        .filter(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
        .collect()
}

/// The TLS parameters of a `postgres://` URL's query, in order.
pub(super) fn split_tls_params(url: &str) -> (String, Vec<(String, String)>) {
    let (url, taken) = split_params(url);
    let tls = taken
        .into_iter()
        .filter(|(k, _)| UrlParam::of(k) == UrlParam::Tls)
        .collect();
    (url, tls)
}

/// Describes a database URL without its password or options: user, hosts, ports
/// and database name as tokio-postgres parses them, e.g.
/// `postgres://app@db.internal:5432/app`, or `(unparsable)`. Used wherever a URL is
/// shown (errors, `inspect`), so no password can leak through a quirk of its syntax.
pub fn describe_url(url: &str) -> String {
    let Ok(config) = tokio_postgres::Config::from_str(&split_tls_params(url).0) else {
        return "(unparsable)".to_string();
    };
    let user = config
        .get_user()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|host| match host {
            Host::Tcp(name) => name.clone(),
            Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    let port = if ports.is_empty() {
        String::new()
    } else {
        format!(":{}", ports.join(","))
    };
    let dbname = config.get_dbname().unwrap_or_default();
    format!("postgres://{user}{}{port}/{dbname}", hosts.join(","))
}
