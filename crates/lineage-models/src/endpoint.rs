//! An endpoint: a named model service, with its wire format, address, credentials, timeouts and
//! retry policy; in code, or from the environment.

use std::fmt;
use std::time::Duration;

use crate::Wire;

/// An API key. It is sent in the request's authentication header and nowhere else: its `Debug`
/// form is redacted, it has no `Display`, and no error or log line carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key with this secret value.
    pub fn new(secret: impl Into<String>) -> Self {
        ApiKey(secret.into())
    }

    /// The secret, for the authentication header.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// How failed attempts are retried. Only attempts that produced nothing are retried (a refused
/// connection, an error status, a stream that failed before its first chunk), and only for codes
/// that may succeed later ([`crate::failure::is_retryable`]): a half-streamed answer is never
/// replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The most retries after the first attempt (0: never retry).
    pub max_retries: u32,
    /// The wait before the first retry; each further retry waits twice as long, up to `max`.
    pub initial: Duration,
    /// The longest wait. An endpoint's `Retry-After` is honoured up to this; one asking for
    /// longer ends the retries, and the failure (with its `retry_after_ms`) goes to the host.
    pub max: Duration,
}

impl RetryPolicy {
    /// No retries.
    pub const NEVER: RetryPolicy = RetryPolicy {
        max_retries: 0,
        initial: Duration::ZERO,
        max: Duration::ZERO,
    };
}

impl Default for RetryPolicy {
    /// Five retries, from 500 ms doubling to 10 s.
    fn default() -> Self {
        RetryPolicy {
            max_retries: 5,
            initial: Duration::from_millis(500),
            max: Duration::from_secs(10),
        }
    }
}

/// A model service: which wire format it speaks, where, and with which key.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The name requests route by (an agent's `endpoint` option).
    pub name: String,
    /// The wire format it speaks.
    pub wire: Wire,
    /// The base URL, up to and including the API version (`https://api.openai.com/v1`); the
    /// wire format's path is appended to it.
    pub base_url: String,
    /// The key sent with every request, if the service needs one.
    pub api_key: Option<ApiKey>,
    /// Further headers sent with every request (an organization, a beta flag).
    pub headers: Vec<(String, String)>,
    /// How long a connection may take to open.
    pub connect_timeout: Duration,
    /// How long the endpoint may stay silent (no byte of the response head or the stream)
    /// before the attempt fails with `TIMEOUT`. Keep-alive comments count as bytes.
    pub idle_timeout: Duration,
    /// How failed attempts are retried.
    pub retry: RetryPolicy,
    /// The output cap sent when a request sets none and the wire format requires one.
    pub default_max_tokens: u32,
}

/// The endpoints Lineage knows by name: wire format, base URL and the variable holding the key.
const KNOWN: [(&str, Wire, &str, Option<&str>); 5] = [
    (
        "openai",
        Wire::ChatCompletions,
        "https://api.openai.com/v1",
        Some("OPENAI_API_KEY"),
    ),
    (
        "openai-responses",
        Wire::Responses,
        "https://api.openai.com/v1",
        Some("OPENAI_API_KEY"),
    ),
    (
        "anthropic",
        Wire::AnthropicMessages,
        "https://api.anthropic.com/v1",
        Some("ANTHROPIC_API_KEY"),
    ),
    (
        "deepseek",
        Wire::ChatCompletions,
        "https://api.deepseek.com/v1",
        Some("DEEPSEEK_API_KEY"),
    ),
    (
        "ollama",
        Wire::ChatCompletions,
        "http://127.0.0.1:11434/v1",
        None,
    ),
];

/// The variable that names the chosen model, as `ENDPOINT:MODEL`.
pub const MODEL_VAR: &str = "LINEAGE_MODEL";
/// The variable that overrides the endpoint's base URL.
pub const BASE_URL_VAR: &str = "LINEAGE_BASE_URL";
/// The variable that overrides the endpoint's wire format (`chat`, `responses`, `anthropic`).
pub const WIRE_VAR: &str = "LINEAGE_WIRE";
/// The variable that names the variable holding the key.
pub const KEY_VAR_VAR: &str = "LINEAGE_API_KEY_VAR";
/// The variable holding the key of an endpoint Lineage does not know by name.
pub const DEFAULT_KEY_VAR: &str = "LINEAGE_API_KEY";

impl Endpoint {
    /// An endpoint with no key, no extra headers, a 30 s connect timeout, a 300 s idle timeout,
    /// the default retry policy and a default output cap of 8192 tokens.
    pub fn new(name: impl Into<String>, wire: Wire, base_url: impl Into<String>) -> Self {
        Endpoint {
            name: name.into(),
            wire,
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            api_key: None,
            headers: Vec::new(),
            connect_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
            retry: RetryPolicy::default(),
            default_max_tokens: 8192,
        }
    }

    /// This endpoint with `key`.
    pub fn with_api_key(mut self, key: ApiKey) -> Self {
        self.api_key = Some(key);
        self
    }

    /// The names of the endpoints Lineage knows without configuration.
    pub fn known_names() -> impl Iterator<Item = &'static str> {
        KNOWN.iter().map(|k| k.0)
    }

    /// The endpoint named `name` as the environment configures it (`env` reads one variable):
    /// a known endpoint's wire format, base URL and key variable unless [`WIRE_VAR`],
    /// [`BASE_URL_VAR`] or [`KEY_VAR_VAR`] override them; any other name needs the first two.
    /// A known endpoint with a key variable needs the key.
    pub fn from_env(
        name: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Endpoint, ConfigError> {
        let known = KNOWN.iter().find(|k| k.0 == name);
        let wire = match env(WIRE_VAR) {
            Some(wire) => Wire::from_name(&wire).ok_or(ConfigError::UnknownWire {
                variable: WIRE_VAR,
                value: wire,
            })?,
            None => match known {
                Some(k) => k.1,
                None => return Err(ConfigError::UnknownEndpoint { name: name.into() }),
            },
        };
        let base_url = match env(BASE_URL_VAR) {
            Some(url) => url,
            None => match known {
                Some(k) => k.2.to_owned(),
                None => return Err(ConfigError::UnknownEndpoint { name: name.into() }),
            },
        };
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(ConfigError::BadBaseUrl {
                endpoint: name.into(),
                url: base_url,
            });
        }
        let key_var = env(KEY_VAR_VAR)
            .or_else(|| known.and_then(|k| k.3).map(str::to_owned))
            .unwrap_or_else(|| DEFAULT_KEY_VAR.to_owned());
        let api_key = env(&key_var).filter(|k| !k.is_empty()).map(ApiKey::new);
        let needs_key = known.is_some_and(|k| k.3.is_some()) && env(BASE_URL_VAR).is_none();
        if api_key.is_none() && needs_key {
            return Err(ConfigError::MissingKey {
                endpoint: name.into(),
                variable: key_var,
            });
        }
        let mut endpoint = Endpoint::new(name, wire, base_url);
        endpoint.api_key = api_key;
        Ok(endpoint)
    }
}

/// A model choice: the endpoint that serves it and the model's name there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelChoice {
    /// The endpoint's name.
    pub endpoint: String,
    /// The model, as the endpoint names it.
    pub model: String,
}

impl ModelChoice {
    /// Parses `ENDPOINT:MODEL`; the model may itself hold colons (`ollama:qwen3:8b`).
    pub fn parse(choice: &str) -> Result<ModelChoice, ConfigError> {
        match choice.split_once(':') {
            Some((endpoint, model)) if !endpoint.is_empty() && !model.is_empty() => {
                Ok(ModelChoice {
                    endpoint: endpoint.to_owned(),
                    model: model.to_owned(),
                })
            }
            _ => Err(ConfigError::BadChoice {
                choice: choice.to_owned(),
            }),
        }
    }
}

impl fmt::Display for ModelChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.endpoint, self.model)
    }
}

/// Why a model could not be configured. No variant carries a key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The model choice is not `ENDPOINT:MODEL`.
    #[error("model {choice:?} is not ENDPOINT:MODEL (for example openai:gpt-4.1)")]
    BadChoice {
        /// What was given.
        choice: String,
    },
    /// No model was chosen.
    #[error("no model chosen: set {MODEL_VAR}=ENDPOINT:MODEL (for example openai:gpt-4.1)")]
    NoChoice,
    /// The endpoint is not one Lineage knows, and the environment does not say where it is.
    #[error(
        "endpoint {name:?} is not one Lineage knows (openai, openai-responses, anthropic, \
         deepseek, ollama): set {BASE_URL_VAR} and {WIRE_VAR} (chat, responses or anthropic)"
    )]
    UnknownEndpoint {
        /// The endpoint's name.
        name: String,
    },
    /// A wire format name that is not one of `chat`, `responses`, `anthropic`.
    #[error("{variable}={value:?} is not a wire format: use chat, responses or anthropic")]
    UnknownWire {
        /// The variable that held it.
        variable: &'static str,
        /// What it held.
        value: String,
    },
    /// A base URL that is not `http://` or `https://`.
    #[error("endpoint {endpoint:?}: base URL {url:?} is not an http:// or https:// URL")]
    BadBaseUrl {
        /// The endpoint's name.
        endpoint: String,
        /// The URL given.
        url: String,
    },
    /// The endpoint needs a key and its variable is unset or empty.
    #[error("endpoint {endpoint:?} needs an API key: set {variable}")]
    MissingKey {
        /// The endpoint's name.
        endpoint: String,
        /// The variable that should hold the key.
        variable: String,
    },
    /// A header name or value cannot be sent.
    #[error("endpoint {endpoint:?}: header {name:?} cannot be sent: {reason}")]
    BadHeader {
        /// The endpoint's name.
        endpoint: String,
        /// The header's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The HTTP client could not be built (its TLS configuration, usually).
    #[error("endpoint {endpoint:?}: the HTTP client cannot be built: {reason}")]
    Client {
        /// The endpoint's name.
        endpoint: String,
        /// Why.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| vars.get(name).cloned()
    }

    #[test]
    fn a_known_endpoint_needs_only_its_key() {
        let e = Endpoint::from_env("anthropic", env(&[("ANTHROPIC_API_KEY", "sk-ant-1")]))
            .expect("configured");
        assert_eq!(e.wire, Wire::AnthropicMessages);
        assert_eq!(e.base_url, "https://api.anthropic.com/v1");
        assert_eq!(e.api_key, Some(ApiKey::new("sk-ant-1")));
        assert_eq!(
            Endpoint::from_env("openai", env(&[])).unwrap_err(),
            ConfigError::MissingKey {
                endpoint: "openai".into(),
                variable: "OPENAI_API_KEY".into()
            }
        );
    }

    #[test]
    fn the_environment_overrides_address_wire_and_key_variable() {
        let e = Endpoint::from_env(
            "local",
            env(&[
                (BASE_URL_VAR, "http://127.0.0.1:8080/v1/"),
                (WIRE_VAR, "responses"),
                (KEY_VAR_VAR, "MY_KEY"),
                ("MY_KEY", "k"),
            ]),
        )
        .expect("configured");
        assert_eq!(e.wire, Wire::Responses);
        assert_eq!(
            e.base_url, "http://127.0.0.1:8080/v1",
            "one trailing slash dropped"
        );
        assert_eq!(e.api_key, Some(ApiKey::new("k")));
        // A known endpoint pointed elsewhere (a proxy, a local server) may go without a key.
        let proxied = Endpoint::from_env("openai", env(&[(BASE_URL_VAR, "http://127.0.0.1:9")]))
            .expect("configured");
        assert_eq!(proxied.api_key, None);
    }

    #[test]
    fn configuration_errors_name_what_to_set() {
        assert_eq!(
            Endpoint::from_env("mystery", env(&[])).unwrap_err(),
            ConfigError::UnknownEndpoint {
                name: "mystery".into()
            }
        );
        let wire = Endpoint::from_env("openai", env(&[(WIRE_VAR, "grpc")])).unwrap_err();
        assert!(wire.to_string().contains("LINEAGE_WIRE=\"grpc\""), "{wire}");
        let url = Endpoint::from_env("x", env(&[(BASE_URL_VAR, "ftp://h"), (WIRE_VAR, "chat")]))
            .unwrap_err();
        assert!(matches!(url, ConfigError::BadBaseUrl { .. }), "{url}");
    }

    #[test]
    fn a_choice_is_endpoint_colon_model() {
        assert_eq!(
            ModelChoice::parse("ollama:qwen3:8b").unwrap(),
            ModelChoice {
                endpoint: "ollama".into(),
                model: "qwen3:8b".into()
            }
        );
        for bad in ["gpt-4.1", ":m", "e:", ""] {
            assert!(ModelChoice::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_key_never_shows_in_debug() {
        let e = Endpoint::new("e", Wire::ChatCompletions, "http://h")
            .with_api_key(ApiKey::new("s3cret"));
        assert!(!format!("{e:?}").contains("s3cret"));
    }
}
