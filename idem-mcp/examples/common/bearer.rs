//! The example servers' auth layer over HTTP (shared by `payments_mcp` and `mixed_mcp`):
//! `Authorization: Bearer TOKEN` with a token the server knows, else HTTP 401. The token's user
//! is the principal of the request's idem calls, the scope of every key (see `idem_mcp::http`).

use std::collections::HashMap;
use std::sync::Arc;

/// The user a bearer token belongs to, put in the request by [`authenticate`].
#[derive(Clone)]
pub struct User(pub String);

/// The users' tokens, from `token=user,token=user` (an environment variable's value).
pub fn tokens(list: &str) -> Arc<HashMap<String, String>> {
    let pairs = list.split(',').filter_map(|pair| pair.split_once('='));
    Arc::new(pairs.map(|(token, user)| (token.to_owned(), user.to_owned())).collect())
}

/// The principal of a request: the user [`authenticate`] found for it.
pub fn principal(parts: &axum::http::request::Parts) -> Option<String> {
    parts.extensions.get::<User>().map(|u| u.0.clone())
}

/// The app's auth layer: `Authorization: Bearer TOKEN` with a known token, else HTTP 401.
pub async fn authenticate(
    axum::extract::State(tokens): axum::extract::State<Arc<HashMap<String, String>>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    // RFC 7235 §2.1: the scheme's name is case-insensitive.
    let bearer = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match bearer.and_then(|token| tokens.get(token)) {
        Some(user) => {
            request.extensions_mut().insert(User(user.clone()));
            next.run(request).await
        }
        None => {
            let mut response = axum::response::Response::new(axum::body::Body::from(
                "a known bearer token is required",
            ));
            *response.status_mut() = axum::http::StatusCode::UNAUTHORIZED;
            // RFC 6750 §3: a 401 names the scheme the client must use.
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"idem example\""),
            );
            // The body of a request without a known token is not read, so the server closes the
            // connection after this answer; said here, a client that keeps connections (httpx,
            // undici) opens a new one for its next request instead of sending it on this one
            // and hearing "disconnected without a response".
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            response
        }
    }
}
