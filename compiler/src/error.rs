//! The compiler's one error type. `Compile` is the user's program being wrong (a type rule, an
//! invalid schedule, an access that can go out of bounds, a corrupt module file); `Internal`
//! is a bug in rivet (a pass broke an invariant the verifier caught). Runtime errors raised
//! while building or calling pass through as `Runtime`.

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Compile(String),
    #[error(transparent)]
    Runtime(#[from] rivet_runtime::Error),
    #[error("internal compiler error (a bug in rivet, please report it): {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for rivet_runtime::Error {
    fn from(e: Error) -> rivet_runtime::Error {
        match e {
            Error::Compile(m) => rivet_runtime::Error::Compile(m),
            Error::Runtime(r) => r,
            Error::Internal(m) => rivet_runtime::Error::Internal(m),
        }
    }
}
