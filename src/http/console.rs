//! The web console at `/console/`: static files from the top-level `console/` folder,
//! compiled into the binary (`include_bytes!`), so the server needs nothing on disk and the
//! browser fetches nothing from anywhere else. The console is plain ES modules that talk to
//! `/api` on the same origin; there is no build step, so neither the Rust build nor the Docker
//! image needs Node.
//!
//! Every answer carries a strict Content-Security-Policy: scripts, styles and connections
//! from this origin only, no inline script or style, no frames, no forms posting elsewhere,
//! and Trusted Types required for script sinks — so `innerHTML` with a string throws in the
//! browser, and untrusted data can only ever reach the page as text.
//!
//! Not part of the OpenAPI document (like `/docs`): it is not an API.

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use super::AppState;
use super::error::ApiError;
use super::extract::Path;

/// The policy of every console answer (see the module docs).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'; require-trusted-types-for 'script'; \
     trusted-types 'none'";

macro_rules! asset {
    ($path:literal, $mime:literal) => {
        (
            $path,
            $mime,
            include_bytes!(concat!("../../console/", $path)).as_slice(),
        )
    };
}

/// Every file of `console/`: path below `/console/`, media type, contents. A unit test checks
/// that the folder holds exactly these.
const ASSETS: &[(&str, &str, &[u8])] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("js/app.js", "text/javascript; charset=utf-8"),
    asset!("js/api.js", "text/javascript; charset=utf-8"),
    asset!("js/dom.js", "text/javascript; charset=utf-8"),
    asset!("js/chart.js", "text/javascript; charset=utf-8"),
    asset!("js/pages/login.js", "text/javascript; charset=utf-8"),
    asset!("js/pages/executions.js", "text/javascript; charset=utf-8"),
    asset!("js/pages/batch.js", "text/javascript; charset=utf-8"),
    asset!("js/pages/execution.js", "text/javascript; charset=utf-8"),
    asset!("js/pages/dead_letters.js", "text/javascript; charset=utf-8"),
    asset!("js/pages/overview.js", "text/javascript; charset=utf-8"),
    asset!("js/pages/tenants.js", "text/javascript; charset=utf-8"),
    asset!("js/pages/api_keys.js", "text/javascript; charset=utf-8"),
    asset!("js/pages/trends.js", "text/javascript; charset=utf-8"),
    asset!("js/pages/webhook.js", "text/javascript; charset=utf-8"),
];

/// The console's routes (outside `/api`, no authentication: the files are public, the data
/// comes from `/api` with the user's credential; `session.json` says only whether dev auth
/// is on, which every request to a dev-auth server shows anyway).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route("/console/", get(|| async { asset("index.html") }))
        .route("/console/session.json", get(session))
        .route(
            "/console/{*path}",
            get(|Path(path): Path<String>| async move { asset(&path) }),
        )
}

/// What the console needs to know before it asks anything of `/api`: whether this server runs
/// with `--dev-auth` (no login). Without it, a first visit would have to probe `GET /api/me`
/// with no credential and get a 401, which the browser logs as an error; with it, the console
/// shows the login page straight away when it holds no token.
async fn session(State(state): State<AppState>) -> Response {
    let body = serde_json::json!({ "dev_auth": state.auth.dev_auth }).to_string();
    let mut res = with_console_headers((StatusCode::OK, body).into_response(), "application/json");
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// One file with the console's security headers, or a 404 problem document.
fn asset(path: &str) -> Response {
    let Some((_, mime, body)) = ASSETS.iter().find(|(p, _, _)| *p == path) else {
        return ApiError::NotFound {
            code: "route_not_found",
            detail: "no such console file".into(),
        }
        .into_response();
    };
    with_console_headers((StatusCode::OK, *body).into_response(), mime)
}

/// `res` with the console's media type and security headers (see the module docs).
fn with_console_headers(mut res: Response, mime: &'static str) -> Response {
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // The files change with the binary: revalidate each time (they are small).
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}

#[cfg(test)]
mod tests {
    use super::ASSETS;

    #[test]
    fn every_console_file_is_embedded_and_nothing_else() {
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/console"));
        let mut found = Vec::new();
        let mut dirs = vec![root.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    let rel = path.strip_prefix(root).unwrap().to_str().unwrap();
                    found.push(rel.replace('\\', "/"));
                }
            }
        }
        found.sort();
        let mut listed: Vec<String> = ASSETS.iter().map(|(p, _, _)| p.to_string()).collect();
        listed.sort();
        assert_eq!(found, listed);
    }

    #[test]
    fn no_console_file_loads_anything_from_elsewhere_or_inline() {
        // The SVG namespace is a name, not a place: the one URL a file may spell (the icon, and
        // the charts' elements, which `createElementNS` makes in it).
        const SVG_NS: &str = "http://www.w3.org/2000/svg";
        for (path, _, body) in ASSETS {
            let text = std::str::from_utf8(body).unwrap();
            let text = text.replace(SVG_NS, "");
            for banned in [
                "http://",
                "https://",
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
            ] {
                assert!(!text.contains(banned), "{path} contains {banned}");
            }
            if path.ends_with(".html") {
                assert!(!text.contains("<script>"), "{path} has an inline script");
                assert!(!text.contains("style="), "{path} has an inline style");
            }
        }
    }
}
