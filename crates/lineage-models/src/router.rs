//! [`Models`]: many endpoints behind one `Model`, chosen per request by its endpoint name.

use std::collections::BTreeMap;
use std::sync::Arc;

use lineage_agent::{ChunkStream, Model, ModelError, ModelRequest};

use crate::endpoint::{ConfigError, Endpoint, MODEL_VAR, ModelChoice};
use crate::http::HttpModel;

/// The code of a request that names an endpoint no route serves.
pub const UNKNOWN_ENDPOINT: &str = "UNKNOWN_ENDPOINT";

/// A router: each request goes to the model registered under its `endpoint` name.
#[derive(Clone, Default)]
pub struct Models {
    routes: BTreeMap<String, Arc<dyn Model>>,
}

impl Models {
    /// A router with no routes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Routes requests for `name` to `model`, replacing any earlier route of that name.
    pub fn route(&mut self, name: impl Into<String>, model: Arc<dyn Model>) -> &mut Self {
        self.routes.insert(name.into(), model);
        self
    }

    /// Routes requests for the endpoint's name to an [`HttpModel`] of it.
    pub fn endpoint(&mut self, endpoint: Endpoint) -> Result<&mut Self, ConfigError> {
        let name = endpoint.name.clone();
        Ok(self.route(name, Arc::new(HttpModel::new(endpoint)?)))
    }

    /// The names requests may route by, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.routes.keys().map(String::as_str)
    }

    /// A router for `choice` (`ENDPOINT:MODEL`, or the [`MODEL_VAR`] variable when `None`), its
    /// endpoint configured from the environment as [`Endpoint::from_env`] says (`env` reads one
    /// variable). Returns the router and the parsed choice, for an agent's options.
    pub fn from_env(
        choice: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(Models, ModelChoice), ConfigError> {
        let choice = match choice {
            Some(choice) => choice.to_owned(),
            None => env(MODEL_VAR).ok_or(ConfigError::NoChoice)?,
        };
        let choice = ModelChoice::parse(&choice)?;
        let mut models = Models::new();
        models.endpoint(Endpoint::from_env(&choice.endpoint, env)?)?;
        Ok((models, choice))
    }
}

impl std::fmt::Debug for Models {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Models")
            .field("routes", &self.routes.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Model for Models {
    fn stream(&self, request: ModelRequest) -> ChunkStream {
        match self.routes.get(request.endpoint.as_str()) {
            Some(model) => model.stream(request),
            None => {
                let known: Vec<&str> = self.names().collect();
                let error = ModelError::new(
                    UNKNOWN_ENDPOINT,
                    format!(
                        "no endpoint named {:?} is configured (configured: {})",
                        request.endpoint.as_str(),
                        if known.is_empty() {
                            "none".to_owned()
                        } else {
                            known.join(", ")
                        }
                    ),
                );
                Box::pin(futures_util::stream::iter([Err(error)]))
            }
        }
    }
}
