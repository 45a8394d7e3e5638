//! Who is looking, and whether they may change things: the token login, the session cookie,
//! the CSRF token every change carries, and the cross-site check.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use askama::Template;
use axum::extract::{Form, State};
use axum::http::header::{COOKIE, HOST, ORIGIN, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use rand::RngCore;
use serde::Deserialize;

use crate::view::{render, Page};
use crate::{Access, AppState};

/// The session cookie's name.
const COOKIE_NAME: &str = "workpump_session";
/// The most sessions kept at once: logging in past it ends the oldest.
const MAX_SESSIONS: usize = 1_000;

/// One logged-in browser.
struct Session {
    csrf: String,
    expires: Instant,
}

/// The open sessions, in memory: a restart logs everybody out.
pub(crate) struct Sessions {
    ttl: Duration,
    open: Mutex<HashMap<String, Session>>,
}

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Equal in time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

impl Sessions {
    pub(crate) fn new(ttl: Duration) -> Sessions {
        Sessions {
            ttl,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// A new session: its id (the cookie) and its CSRF token.
    fn open(&self) -> String {
        let id = random_hex();
        let now = Instant::now();
        let mut open = self.open.lock().expect("sessions");
        open.retain(|_, s| s.expires > now);
        if open.len() >= MAX_SESSIONS {
            if let Some(oldest) = open
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
            {
                open.remove(&oldest);
            }
        }
        open.insert(
            id.clone(),
            Session {
                csrf: random_hex(),
                expires: now + self.ttl,
            },
        );
        id
    }

    /// The CSRF token of a live session.
    fn csrf(&self, id: &str) -> Option<String> {
        let open = self.open.lock().expect("sessions");
        open.get(id)
            .filter(|s| s.expires > Instant::now())
            .map(|s| s.csrf.clone())
    }

    fn close(&self, id: &str) {
        self.open.lock().expect("sessions").remove(id);
    }
}

/// The session id the request's cookie names, if any.
fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.to_owned())
}

/// Who is looking: what the page may offer them.
#[derive(Clone, Debug, Default)]
pub(crate) struct Viewer {
    /// Logged in: the forms carry this CSRF token.
    pub(crate) csrf: Option<String>,
    /// The dashboard refuses every change.
    pub(crate) read_only: bool,
}

impl Viewer {
    pub(crate) fn of(state: &AppState, headers: &HeaderMap) -> Viewer {
        let read_only = matches!(state.config.access, Access::ReadOnly);
        let csrf = if read_only {
            None
        } else {
            session_id(headers).and_then(|id| state.sessions.csrf(&id))
        };
        Viewer { csrf, read_only }
    }

    /// Whether the page shows the forms that change things.
    pub(crate) fn may_act(&self) -> bool {
        self.csrf.is_some()
    }
}

/// Why a change was refused before it reached the store.
pub(crate) fn refuse(status: StatusCode, state: &AppState, why: &str) -> Response {
    let page = Page::message(state, "Refused", why);
    (status, render(&page)).into_response()
}

/// Checks a change: not read-only, a live session, the form's CSRF token equal to the
/// session's, and not from another site. `Err` is the response to send (nothing changed).
pub(crate) fn authorize(
    state: &AppState,
    headers: &HeaderMap,
    csrf: &str,
) -> Result<(), Box<Response>> {
    if matches!(state.config.access, Access::ReadOnly) {
        return Err(Box::new(refuse(
            StatusCode::FORBIDDEN,
            state,
            "this dashboard is read-only: nothing was changed",
        )));
    }
    if cross_site(headers) {
        return Err(Box::new(refuse(
            StatusCode::FORBIDDEN,
            state,
            "a change sent from another site was refused: nothing was changed",
        )));
    }
    let Some(expected) = session_id(headers).and_then(|id| state.sessions.csrf(&id)) else {
        return Err(Box::new(refuse(
            StatusCode::UNAUTHORIZED,
            state,
            "log in with the dashboard's token to change things: nothing was changed",
        )));
    };
    if !same(&expected, csrf) {
        return Err(Box::new(refuse(
            StatusCode::FORBIDDEN,
            state,
            "the form's CSRF token does not match this session (reload the page): nothing was changed",
        )));
    }
    Ok(())
}

/// A request that says it comes from another site: `Sec-Fetch-Site: cross-site`, or an
/// `Origin` whose host is not the `Host` it was sent to.
fn cross_site(headers: &HeaderMap) -> bool {
    let header = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    if header("sec-fetch-site") == Some("cross-site") {
        return true;
    }
    match (header(ORIGIN.as_str()), header(HOST.as_str())) {
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => {
            let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            !origin_host.eq_ignore_ascii_case(host)
        }
        (Some(_), None) => true,
        (None, _) => false,
    }
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    page: Page,
    next: String,
    failed: bool,
}

#[derive(Deserialize)]
pub(crate) struct LoginQuery {
    next: Option<String>,
}

/// Where a login may send the browser back to: a path of this dashboard only.
fn safe_next(state: &AppState, next: Option<&str>) -> String {
    let base = &state.config.base_path;
    match next {
        Some(n) if (n.starts_with(&format!("{base}/")) || n == base) && !n.starts_with("//") => {
            n.to_owned()
        }
        _ => state.config.home(),
    }
}

pub(crate) async fn login_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    axum::extract::Query(q): axum::extract::Query<LoginQuery>,
) -> Response {
    let page = LoginPage {
        page: Page::new(&state, &headers, "Log in"),
        next: safe_next(&state, q.next.as_deref()),
        failed: false,
    };
    render(&page).into_response()
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    token: String,
    next: Option<String>,
}

pub(crate) async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let next = safe_next(&state, form.next.as_deref());
    let Access::Token(token) = &state.config.access else {
        return refuse(
            StatusCode::FORBIDDEN,
            &state,
            "this dashboard is read-only: there is nothing to log in to",
        );
    };
    if cross_site(&headers) {
        return refuse(
            StatusCode::FORBIDDEN,
            &state,
            "a login sent from another site was refused",
        );
    }
    if !same(token, &form.token) {
        let page = LoginPage {
            page: Page::new(&state, &headers, "Log in"),
            next,
            failed: true,
        };
        return (StatusCode::UNAUTHORIZED, render(&page)).into_response();
    }
    let id = state.sessions.open();
    let mut cookie = format!(
        "{COOKIE_NAME}={id}; Path={}; HttpOnly; SameSite=Strict; Max-Age={}",
        state.config.home(),
        state.config.session_ttl.as_secs()
    );
    if state.config.secure_cookie {
        cookie.push_str("; Secure");
    }
    let mut response = Redirect::to(&next).into_response();
    response.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("a cookie of hex and the base path"),
    );
    response
}

#[derive(Deserialize)]
pub(crate) struct LogoutForm {
    csrf: String,
}

pub(crate) async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<LogoutForm>,
) -> Response {
    if let Err(refused) = authorize(&state, &headers, &form.csrf) {
        return *refused;
    }
    if let Some(id) = session_id(&headers) {
        state.sessions.close(&id);
    }
    let mut response = Redirect::to(&state.config.home()).into_response();
    let cookie = format!(
        "{COOKIE_NAME}=; Path={}; HttpOnly; SameSite=Strict; Max-Age=0",
        state.config.home()
    );
    response.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("a cookie of the base path"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn a_request_from_another_site_is_told_apart_from_a_same_site_one() {
        assert!(!cross_site(&headers(&[("host", "127.0.0.1:8080")])));
        assert!(!cross_site(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080")
        ])));
        assert!(cross_site(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://evil.example")
        ])));
        assert!(cross_site(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "null")
        ])));
        assert!(cross_site(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("sec-fetch-site", "cross-site")
        ])));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let h = headers(&[("cookie", "a=1; workpump_session=abc; b=2")]);
        assert_eq!(session_id(&h).as_deref(), Some("abc"));
        assert_eq!(session_id(&headers(&[("cookie", "a=1")])), None);
    }

    #[test]
    fn a_session_lives_for_its_ttl_and_is_gone_when_closed() {
        let sessions = Sessions::new(Duration::from_secs(60));
        let id = sessions.open();
        let csrf = sessions.csrf(&id).expect("live");
        assert_eq!(csrf.len(), 64);
        assert_ne!(csrf, id);
        sessions.close(&id);
        assert!(sessions.csrf(&id).is_none());
        let expired = Sessions::new(Duration::ZERO);
        let id = expired.open();
        assert!(expired.csrf(&id).is_none(), "expired at once");
    }
}
