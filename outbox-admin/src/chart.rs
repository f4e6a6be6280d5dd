//! The overview's figures over time: samples taken as the overview is read (at most one per
//! [`SAMPLE_EVERY`], the last [`KEPT`] kept), drawn as small inline SVG charts.
//!
//! The samples live in memory: the chart covers the time the pages have been watched since
//! the process started, which is what an operator looking at them needs, and it costs the
//! database nothing beyond the overview's own query.

use std::collections::VecDeque;
use std::fmt::Write;
use std::time::{Duration, SystemTime};

/// The shortest time between two samples.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How many samples are kept: with the overview's 10 s refresh, the last 20 minutes.
pub(crate) const KEPT: usize = 120;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    pub at: SystemTime,
    pub pending: u64,
    pub oldest_due_age: Duration,
    /// Messages a worker of this process has settled (succeeded or dead-lettered) so far.
    pub settled: Option<u64>,
}

#[derive(Debug, Default)]
pub(crate) struct Samples(VecDeque<Sample>);

impl Samples {
    /// Keeps `sample` unless the last one is more recent than [`SAMPLE_EVERY`].
    pub fn record(&mut self, sample: Sample) {
        if let Some(last) = self.0.back() {
            let since = sample.at.duration_since(last.at).unwrap_or(Duration::ZERO);
            if since < SAMPLE_EVERY {
                return;
            }
        }
        if self.0.len() == KEPT {
            self.0.pop_front();
        }
        self.0.push_back(sample);
    }

    pub fn all(&self) -> impl Iterator<Item = &Sample> {
        self.0.iter()
    }

    /// Settled per second between each sample and the one before it.
    pub fn rates(&self) -> Vec<Option<f64>> {
        let mut rates = vec![None];
        for (before, after) in self.0.iter().zip(self.0.iter().skip(1)) {
            rates.push(rate(before, after));
        }
        rates.truncate(self.0.len());
        rates
    }

    /// The settled rate over the last two samples.
    pub fn latest_rate(&self) -> Option<f64> {
        self.rates().last().copied().flatten()
    }
}

fn rate(before: &Sample, after: &Sample) -> Option<f64> {
    let seconds = after.at.duration_since(before.at).ok()?.as_secs_f64();
    let settled = after.settled?.checked_sub(before.settled?)?;
    (seconds > 0.0).then(|| settled as f64 / seconds)
}

/// A sparkline of `values` (oldest first) as inline SVG, labelled for screen readers.
pub(crate) fn sparkline(label: &str, values: &[f64]) -> String {
    const WIDTH: f64 = 240.0;
    const HEIGHT: f64 = 48.0;
    let max = values.iter().copied().fold(0.0_f64, f64::max);
    let mut svg = format!(
        "<svg class=\"spark\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" \
         height=\"{HEIGHT}\" role=\"img\" aria-label=\"{label}\">\
         <line x1=\"0\" y1=\"{HEIGHT}\" x2=\"{WIDTH}\" y2=\"{HEIGHT}\" class=\"axis\"/>"
    );
    if values.len() >= 2 {
        let step = WIDTH / (values.len() - 1) as f64;
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let y = if max > 0.0 {
                    HEIGHT - 2.0 - (v / max) * (HEIGHT - 4.0)
                } else {
                    HEIGHT - 2.0
                };
                format!("{:.1},{:.1}", i as f64 * step, y)
            })
            .collect();
        let _ = write!(svg, "<polyline points=\"{}\"/>", points.join(" "));
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_secs: u64, pending: u64, settled: Option<u64>) -> Sample {
        Sample {
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(at_secs),
            pending,
            oldest_due_age: Duration::ZERO,
            settled,
        }
    }

    #[test]
    fn samples_closer_than_the_interval_are_skipped_and_the_oldest_dropped() {
        let mut samples = Samples::default();
        samples.record(sample(100, 1, None));
        samples.record(sample(102, 2, None));
        assert_eq!(samples.all().count(), 1);
        for i in 0..KEPT as u64 + 10 {
            samples.record(sample(105 + i * 5, i, None));
        }
        assert_eq!(samples.all().count(), KEPT);
        assert_eq!(samples.all().next().map(|s| s.pending), Some(10));
    }

    #[test]
    fn the_rate_is_settled_per_second_between_samples() {
        let mut samples = Samples::default();
        samples.record(sample(100, 5, Some(1000)));
        samples.record(sample(110, 5, Some(1500)));
        samples.record(sample(120, 5, None));
        samples.record(sample(130, 5, Some(1600)));
        // A worker restarted: its count went back.
        samples.record(sample(140, 5, Some(10)));
        assert_eq!(
            samples.rates(),
            vec![None, Some(50.0), None, None, None],
            "a sample without a count has no rate, nor the one after it"
        );
        assert_eq!(samples.latest_rate(), None);
        samples.record(sample(150, 5, Some(60)));
        assert_eq!(samples.latest_rate(), Some(5.0));
    }

    #[test]
    fn a_sparkline_scales_to_its_maximum() {
        let svg = sparkline("pending", &[0.0, 5.0, 10.0]);
        assert!(svg.contains("aria-label=\"pending\""), "{svg}");
        assert!(
            svg.contains("points=\"0.0,46.0 120.0,24.0 240.0,2.0\""),
            "{svg}"
        );
        assert!(!sparkline("flat", &[0.0]).contains("polyline"));
        assert!(sparkline("zeros", &[0.0, 0.0]).contains("points=\"0.0,46.0 240.0,46.0\""));
    }
}
