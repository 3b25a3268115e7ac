//! Times and previous holders as people read them in text output: RFC 3339
//! with a relative hint (`2026-11-27T17:40:02.5Z (in 4.2 s)`), and "no
//! previous holder" rather than an empty lease id ended at 0. JSON output
//! keeps µs since the epoch, for scripts.

use std::time::SystemTime;

use bagel_proto::Micros;

/// `t` as RFC 3339 with how far it is from now.
pub fn at(t: Micros) -> String {
    let now = Micros::from_system_time(SystemTime::now());
    format!(
        "{t} ({})",
        relative(t.as_micros() as i128 - now.as_micros() as i128)
    )
}

/// A signed distance in µs as "in 4.2 s", "3.0 s ago" or "now".
fn relative(delta_us: i128) -> String {
    let magnitude = delta_us.unsigned_abs();
    if magnitude < 50_000 {
        return "now".into();
    }
    let span = span(magnitude);
    if delta_us > 0 {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

/// A positive span in µs, in the largest unit that keeps it short.
fn span(us: u128) -> String {
    let secs = us as f64 / 1e6;
    match us / 1_000_000 {
        0..60 => format!("{secs:.1} s"),
        60..3600 => format!("{} min {} s", us / 60_000_000, us / 1_000_000 % 60),
        3600..86_400 => format!("{} h {} min", us / 3_600_000_000, us / 60_000_000 % 60),
        _ => format!("{} d {} h", us / 86_400_000_000, us / 3_600_000_000 % 24),
    }
}

/// What a name inherits, as text: "no previous holder" when no lease
/// ever ended on it, else how and when the last one ended and its
/// watermark.
pub fn previous(ended: &str, lease_id: Option<&str>, watermark: Micros, ended_at: Micros) -> String {
    let watermark_text = || {
        if watermark.as_micros() == 0 {
            "no watermark".to_owned()
        } else {
            format!("watermark {watermark}")
        }
    };
    match lease_id.filter(|id| !id.is_empty()) {
        None if watermark.as_micros() == 0 => "no previous holder".into(),
        None => format!("no previous holder on record; {}", watermark_text()),
        Some(id) => format!("lease {id} {ended} {}; {}", at(ended_at), watermark_text()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_read_as_people_say_them() {
        assert_eq!(relative(4_200_000), "in 4.2 s");
        assert_eq!(relative(-3_000_000), "3.0 s ago");
        assert_eq!(relative(10_000), "now");
        assert_eq!(relative(200_000_000), "in 3 min 20 s");
        assert_eq!(relative(-7_500_000_000), "2 h 5 min ago");
        assert_eq!(relative(90_000_000_000), "in 1 d 1 h");
    }

    #[test]
    fn a_name_nobody_held_has_no_previous_holder_not_an_empty_lease_ended_at_zero() {
        assert_eq!(
            previous("none", None, Micros::ZERO, Micros::ZERO),
            "no previous holder"
        );
        assert_eq!(
            previous("none", Some(""), Micros::ZERO, Micros::ZERO),
            "no previous holder"
        );
        let text = previous(
            "released",
            Some("00ab"),
            Micros::from_micros(5),
            Micros::from_micros(7),
        );
        assert!(
            text.starts_with("lease 00ab released 1970-01-01T00:00:00.000007Z ("),
            "{text}"
        );
        assert!(
            text.ends_with("; watermark 1970-01-01T00:00:00.000005Z"),
            "{text}"
        );
    }
}
