//! What every page shares (the layout's data), rendering, and how values are written for
//! people: ages, durations, times, JSON.

use std::time::Duration;

use askama::Template;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use workpump_coordinator::Error;

use crate::session::Viewer;
use crate::AppState;

/// The layout's data: title, links, refresh, who is looking, a notice.
#[derive(Clone, Debug)]
pub(crate) struct Page {
    pub(crate) title: String,
    pub(crate) base: String,
    /// The overview's path (see `DashboardConfig::home`).
    pub(crate) home: String,
    /// Seconds between reloads; 0: none.
    pub(crate) refresh: u64,
    pub(crate) viewer: Viewer,
    /// A line at the top (what an action did).
    pub(crate) notice: Option<String>,
}

impl Page {
    pub(crate) fn new(state: &AppState, headers: &HeaderMap, title: &str) -> Page {
        Page {
            title: title.to_owned(),
            base: state.config.base_path.clone(),
            home: state.config.home(),
            refresh: 0,
            viewer: Viewer::of(state, headers),
            notice: None,
        }
    }

    /// A page that reloads itself at the configured interval.
    pub(crate) fn refreshing(state: &AppState, headers: &HeaderMap, title: &str) -> Page {
        Page {
            refresh: state.config.refresh.as_secs().max(
                u64::from(!state.config.refresh.is_zero()), // under 1 s: every second
            ),
            ..Page::new(state, headers, title)
        }
    }

    /// A page with only a title and a message (errors, refusals).
    pub(crate) fn message(state: &AppState, title: &str, message: &str) -> MessagePage {
        MessagePage {
            page: Page::new(state, &HeaderMap::new(), title),
            message: message.to_owned(),
        }
    }

    pub(crate) fn with_notice(mut self, notice: Option<String>) -> Page {
        self.notice = notice.filter(|n| !n.is_empty()).map(|n| truncate(&n, 300));
        self
    }
}

#[derive(Template)]
#[template(path = "message.html")]
pub(crate) struct MessagePage {
    pub(crate) page: Page,
    pub(crate) message: String,
}

/// A template rendered to HTML, or a plain 500 naming the failure.
pub(crate) fn render<T: Template>(template: &T) -> Response {
    match template.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "dashboard: a page failed to render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the page failed to render: {e}"),
            )
                .into_response()
        }
    }
}

/// A store error as a page: not found 404, a refused state 409, a bad argument 400, an
/// unreachable store 503.
pub(crate) fn store_error(state: &AppState, e: Error) -> Response {
    let status = match &e {
        Error::NotFound { .. } | Error::UnknownQueue(_) => StatusCode::NOT_FOUND,
        Error::InvalidState { .. } => StatusCode::CONFLICT,
        Error::InvalidArgument(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    if status == StatusCode::SERVICE_UNAVAILABLE {
        tracing::warn!(error = %e, "dashboard: the store call failed");
    }
    let page = Page::message(state, "Error", &e.to_string());
    (status, render(&page)).into_response()
}

/// A duration for people: `850 ms`, `12.3 s`, `4 min 5 s`, `3 h 20 min`, `2 d 4 h`.
pub(crate) fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    if ms < 1_000 {
        format!("{ms} ms")
    } else if s < 60 {
        format!("{:.1} s", d.as_secs_f64())
    } else if s < 3_600 {
        format!("{} min {} s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{} h {} min", s / 3_600, (s % 3_600) / 60)
    } else {
        format!("{} d {} h", s / 86_400, (s % 86_400) / 3_600)
    }
}

/// How long before `now` `t` was: `12.3 s ago`; `in 5 s` for a future time.
pub(crate) fn ago(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    match (now - t).to_std() {
        Ok(d) => format!("{} ago", duration(d)),
        Err(_) => format!("in {}", duration((t - now).to_std().unwrap_or_default())),
    }
}

/// A time to the second, UTC.
pub(crate) fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A rate per minute: `0`, `0.4`, `12`, `1 234`.
pub(crate) fn rate(per_minute: f64) -> String {
    if per_minute == 0.0 {
        "0".to_owned()
    } else if per_minute < 10.0 {
        format!("{per_minute:.1}")
    } else {
        count(per_minute.round() as u64)
    }
}

/// A count with thin groups of three: `1 234 567`.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// JSON indented for reading.
pub(crate) fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// At most `max` characters, with `…` when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        text.chars().take(max).collect::<String>() + "…"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_counts_and_rates_read_as_people_write_them() {
        assert_eq!(duration(Duration::from_millis(850)), "850 ms");
        assert_eq!(duration(Duration::from_millis(12_345)), "12.3 s");
        assert_eq!(duration(Duration::from_secs(245)), "4 min 5 s");
        assert_eq!(duration(Duration::from_secs(12_000)), "3 h 20 min");
        assert_eq!(duration(Duration::from_secs(187_200)), "2 d 4 h");
        assert_eq!(count(1_234_567), "1 234 567");
        assert_eq!(count(12), "12");
        assert_eq!(rate(0.0), "0");
        assert_eq!(rate(0.42), "0.4");
        assert_eq!(rate(1234.4), "1 234");
        assert_eq!(truncate("abcdef", 3), "abc…");
    }
}
